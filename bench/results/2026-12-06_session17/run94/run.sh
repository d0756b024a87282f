#!/usr/bin/env bash
# Device run 94 (session 17; carry .gpu-run/r94 with tests/fixtures and bench/results aside): where prefill goes.
# 9B-shape IQ4_XS: a per-op profile of pp512; pp512 / pp2048 with the F16 W chunk of the cuBLAS path at 64 (the
# default) / 24 / 16 MiB (KILN_CUDA_W16_MIB, measurement only); pp2048 at -ub 2048 (the per-ubatch dequantization
# paid once per 2048 tokens instead of four times); tg128 with KILN_CUDA_MV_OCC7=0/1 (7 CTAs per SM for the one-column
# tensor-map mat-vec; measurement only) alternating, and test_cuda_matmul with it; test_cuda_matmul at 8 MiB chunks;
# ncu per-kernel times of pp512.
S=$(date +%s); P=/tmp/p; O=/tmp/o94; mkdir -p $O $P/m $P/K
tar xJf .gpu-run/r94/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r94/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
[ -s $P/m/9b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 12 -o $P/m/9b.gguf
echo "file ready $(( $(date +%s) - S )) s" >> $O/t.txt
B="$K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -n 0"
T="$K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 0 -n 128 -r 3"
for r in 1 2; do for v in 0 1; do
  echo "tg128 occ7=$v r$r $(KILN_CUDA_MV_OCC7=$v timeout 40 $T 2>/dev/null | grep -E '\| *tg' | awk -F'|' '{print $8}')" >> $O/t.txt
done; done
cp $O/* $OUT/
for cap in 64 24 16; do
  echo "cap $cap $(KILN_CUDA_W16_MIB=$cap timeout 40 $B -p 512,2048 -r 2 2>/dev/null | grep -E '\| *pp' | awk -F'|' '{print $7 $8}' | tr '\n' ' ')" >> $O/t.txt
done
KILN_CUDA_PROFILE=1 timeout 40 $B -p 512 -r 1 > $O/prof512.txt 2>&1
echo "ub 2048 $(timeout 40 $B -p 2048 -ub 2048 -b 2048 -r 2 2>/dev/null | grep -E '\| *pp' | awk -F'|' '{print $7 $8}' | tr '\n' ' ')" >> $O/t.txt
cp $O/* $OUT/
s0=$(date +%s); KILN_CUDA_MV_OCC7=1 timeout 60 $K/test_cuda_matmul --gtest_brief=1 > $O/matmul-occ7.log 2>&1
echo "test_cuda_matmul (OCC7) rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/matmul-occ7.log | tr '\n' ' ')" >> $O/t.txt
cp $O/* $OUT/
[ $(( $(date +%s) - S )) -lt 170 ] && { s0=$(date +%s); KILN_CUDA_W16_MIB=8 timeout 60 $K/test_cuda_matmul --gtest_brief=1 > $O/matmul-w16-8.log 2>&1; echo "test_cuda_matmul (W16 chunk 8 MiB) rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/matmul-w16-8.log | tr '\n' ' ')" >> $O/t.txt; }
cp $O/* $OUT/
[ $(( $(date +%s) - S )) -lt 200 ] && timeout 80 ncu --clock-control none --print-units base --print-kernel-base function --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --log-file $O/ncu-pp512.csv $B -p 512 -r 1 > /dev/null 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s" >> $O/t.txt
python3 - $O/ncu-pp512.csv > $O/ncu-sum.txt <<'PY'
import csv, sys, collections
t = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ik = h.index("Kernel Name"); im = h.index("Metric Name"); iv = h.index("Metric Value"); iid = h.index("ID")
seen = set()
for r in rows[1:]:
    k = r[ik][:90]; v = float(r[iv].replace(",", "") or 0)
    e = t[k]
    if (r[iid], k) not in seen: seen.add((r[iid], k)); e[0] += 1
    if r[im] == "gpu__time_duration.sum": e[1] += v
    elif r[im] == "dram__bytes_read.sum": e[2] += v
    elif r[im] == "dram__bytes_write.sum": e[3] += v
tot = sum(e[1] for e in t.values())
print(f"total {tot/1e6:.2f} ms over {sum(e[0] for e in t.values())} kernels (pp512 runs: warm-up + timed)")
for k, e in sorted(t.items(), key=lambda x: -x[1][1])[:30]:
    print(f"{e[1]/1e6:8.2f} ms {100*e[1]/tot:5.1f}% n={e[0]:5d} rd {e[2]/1e9:7.2f} GB wr {e[3]/1e9:7.2f} GB  {k}")
PY
cp $O/* $OUT/; cat $O/t.txt; echo; cat $O/ncu-sum.txt; grep -E "^\|" $O/prof512.txt | head -30; echo "total $(( $(date +%s) - S )) s"
