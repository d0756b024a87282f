import json, glob, statistics, re, sys
d = sys.argv[1] if len(sys.argv) > 1 else '/tmp/avx2bench'
res = {}
for f in glob.glob(d + '/pp-*.jsonl'):
    m = re.search(r'pp-(\w+)-(\d+)-(\d+)\.jsonl', f)
    ty, tm, r = m.group(1), int(m.group(2)), int(m.group(3))
    for line in open(f):
        if not line.strip(): continue
        j = json.loads(line)
        res.setdefault((ty, tm), []).extend(j['samples_ts'])
for (ty, tm), v in sorted(res.items()):
    print(f"{ty} tile={'on' if tm else 'off'} n={len(v)} min={min(v):.1f} median={statistics.median(v):.1f} max={max(v):.1f}")
for ty in sorted({k[0] for k in res}):
    if (ty, 0) in res and (ty, 8) in res:
        print(ty, 'median ratio on/off', round(statistics.median(res[(ty, 8)]) / statistics.median(res[(ty, 0)]), 2))
