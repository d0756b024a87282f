# Best / range table of kernels_ab.sh's JSON: kernels_summary.py DIR PREFIX
import json,glob,collections,re,sys
R=sys.argv[1]
d=collections.defaultdict(list)
for p in glob.glob(R+'/'+sys.argv[2]+'-dyn*-t*-r*.json'):
    m=re.search(r'dyn(\d)-t(\d)-r(\d)',p); dyn,T,r=m.groups()
    for b in json.load(open(p))['benchmarks']:
        d[(b['name'],T,dyn)].append((b['real_time'],b['bytes_per_second']/1e9))
names={'BM_Matvec/1/4096/real_time':'Q4_K DRAM 4096×4096','BM_Matvec/4/4096/real_time':'IQ4_XS DRAM 4096×4096',
'BM_MatvecVocab/1/real_time':'Q4_K vocab 1024×248320','BM_MatvecVocab/4/real_time':'IQ4_XS vocab 1024×248320',
'BM_MatvecL2/1/real_time':'Q4_K L2 512×4096','BM_MatvecL2/4/real_time':'IQ4_XS L2 512×4096'}
print('| weights, shape | threads | static best µs (GB/s) | dynamic best µs (GB/s) | dynamic/static speed (best) | static range µs | dynamic range µs |')
print('| --- | ---: | ---: | ---: | ---: | ---: | ---: |')
for n,lab in names.items():
  for T in '12':
    s=d[(n,T,'0')]; y=d[(n,T,'1')]
    if not s or not y: continue
    bs=min(s); by=min(y)
    print(f'| {lab} | {T} | {bs[0]:.0f} ({bs[1]:.1f}) | {by[0]:.0f} ({by[1]:.1f}) | {bs[0]/by[0]:.2f}× | {min(x[0] for x in s):.0f}–{max(x[0] for x in s):.0f} | {min(x[0] for x in y):.0f}–{max(x[0] for x in y):.0f} |')
bw=collections.defaultdict(list)
for p in glob.glob(R+'/membw-r*.json'):
    for b in json.load(open(p))['benchmarks']: bw[b['name']].append(b['bytes_per_second']/1e9)
for k,v in sorted(bw.items()): print(f'{k}: {min(v):.2f}–{max(v):.2f} GB/s')
