#!/usr/bin/env bash
# Device run 75 (session 13): (1) GPU tests of main + the KV-only MTP catch-up; (2) spec-bench plain / zero
# acceptance / synth-len 3 (9B); (3) ncu stall reasons of the decode mat-vecs (9B IQ4_XS, Q6_K head);
# (4) kiln bench tg128 / pp512 baseline.
S=$(date +%s); P=/tmp/p; O=/tmp/o75; mkdir -p $O $P/m; I=.gpu-run/r75
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $O/gpu.txt
( for t in test_cuda_mtp test_cuda_spec test_cuda_model test_cuda_backend test_cuda_seq; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b-mtp.gguf
echo "gen $(( $(date +%s) - S )) s"
wait $T
SB9="$B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 3"; M="--spec-type draft-mtp --spec-draft-n-max 3"
for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3" "$M --spec-synth-len 4"; do
  echo "9b $a | $(timeout 40 $SB9 $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
done > $O/spec.txt 2>&1
timeout 60 $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on -p 512 -n 128 -r 3 > $O/bench.md 2> $O/bench.err
NCU="ncu --clock-control none"
timeout 150 $NCU --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters --section InstructionStats \
  -k regex:matvec_q8 --launch-skip 60 --launch-count 10 --log-file $O/ncu-mv.txt \
  $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on -p 0 -n 4 -r 1 > $O/ncu-mv.out 2>&1
echo "ncu rc=$?"
timeout 90 $NCU --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,smsp__inst_executed.sum \
  --csv --log-file $O/ncu-tg.csv $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on -p 0 -n 2 -r 1 > $O/ncu-tg.out 2>&1
echo "ncu tg rc=$?"
cat $O/gpu.txt $O/tests.txt $O/spec.txt; grep -B2 -A8 "Failure" $O/test_cuda_*.log | head -30
grep CUDA $O/bench.md | awk -F'|' '{print $(NF-2), $(NF-1)}'
grep -E "matvec_q8_kernel<|Duration|DRAM Throughput|Issued Warp|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Registers Per|Executed Ipc A" $O/ncu-mv.txt | head -120
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run75.tar.xz
