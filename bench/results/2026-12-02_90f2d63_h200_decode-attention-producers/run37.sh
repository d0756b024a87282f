#!/usr/bin/env bash
# Device run 37 (session 7): F16-specialised tensor-core attention (tests + kernel timings + pp rows vs
# llama-bench); ncu probe; per-kernel durations of the 9B-shape decode step (ncu, graph nodes) and the
# stall profile of the int8 mat-vec at the step's shapes.
R=$PWD
S=$(date +%s)
tar xJf .gpu-run/bins.tar.xz && tar xJf .gpu-run/llama-all.tar.xz
B=$R/.gpu/bin LL=$R/llama-cuda-sm90a
export LD_LIBRARY_PATH=$B
O=/tmp/o; mkdir -p $O; M=/tmp/m; mkdir -p $M
( t0=$(date +%s); $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -o $M/9b8.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
for t in test_cuda_seq test_cuda_model test_cuda_backend; do
  s0=$(date +%s); timeout 120 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -20
KILN_CUDA_BENCH=1 timeout 60 $B/test_cuda_seq --gtest_filter='*Bench*' > $O/bench-seq.log 2>&1
grep -i "prefill" $O/bench-seq.log | cut -c1-120
which ncu; ncu --version | tail -1
wait $G; cat $O/gen.txt
NCU="ncu --clock-control none"
timeout 120 $NCU --graph-profiling node --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size --csv --log-file $O/ncu-tg.csv \
  $B/kiln bench -m $M/9b8.gguf -ngl all -fa on -p 0 -n 3 -r 1 > $O/ncu-tg.out 2>&1
echo "ncu tg rc=$? lines $(wc -l < $O/ncu-tg.csv)"
timeout 100 $NCU --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  -k regex:matvec_q8 --launch-skip 40 --launch-count 6 --log-file $O/ncu-mv.txt \
  $B/kiln bench -m $M/9b8.gguf -ngl all -fa on -p 0 -n 4 -r 1 > $O/ncu-mv.out 2>&1
echo "ncu mv rc=$?"
timeout 60 $B/kiln bench -m $M/9b8.gguf -ngl all -fa on -p 2048,8192 -n 128 -r 2 > $O/kiln-bench.md 2> $O/kiln-bench.err
LD_LIBRARY_PATH=$LL timeout 90 $LL/llama-bench -m $M/9b8.gguf -ngl 99 -fa 1 -p 2048,8192 -n 128 -r 2 > $O/llama-bench.md 2> $O/llama-bench.err
echo kiln; grep CUDA $O/kiln-bench.md | awk -F'|' '{print $7, $8}'; echo llama; grep -E "pp|tg" $O/llama-bench.md | awk -F'|' '{print $(NF-2), $(NF-1)}'
python3 - $O/ncu-tg.csv <<'PY' 2>&1 | tail -45
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; ix = {n: i for i, n in enumerate(h)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[ix["ID"]], r[ix["Kernel Name"]][:70])
    k.setdefault(key, {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
tot = 0.0
for (i, n), m in k.items():
    t = float(m.get("gpu__time_duration.sum", "0").replace(",", "")); b = float(m.get("dram__bytes_read.sum", "0").replace(",", ""))
    a = agg[n]; a[0] += 1; a[1] += t; a[2] += b; a[3] += float(m.get("smsp__issue_active.avg.pct_of_peak_sustained_active", "0").replace(",", ""))
    tot += t
print(f"kernels {len(k)} total {tot/1e3:.1f} us (unit of duration in csv assumed ns)")
for n, a in sorted(agg.items(), key=lambda x: -x[1][1])[:30]:
    print(f"{a[1]/1e3:9.1f} us {a[0]:5d}x {a[1]/a[0]/1e3:7.2f} us/call {a[2]/max(a[1],1):7.1f} GB/s issue {a[3]/a[0]:5.1f}% {n}")
PY
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run37.tar.xz
