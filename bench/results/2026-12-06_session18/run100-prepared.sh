#!/usr/bin/env bash
# Device run 100 (prepared in session 18; carry .gpu-run/r100 with tests/fixtures and bench/results moved aside):
# binaries of main at 3b6553a (the chunked gated delta rule with asynchronous staging, not yet run on a GPU).
# (1) test_cuda_seq (the chunked path's correctness) and its gated_delta timings, recurrent vs chunked at 512 /
# 2048 tokens; (2) pp512 / pp2048 on the 9B and 27B with --delta-chunk 0 / 64; (3) every other GPU test binary;
# (4) the M4 switch (KILN_CUDA_MV_M4_CTAS5=1): test_cuda_matmul / mtp / spec, batched-bench -npl 4 and spec-bench
# synth-len 3 alternating.
S=$(date +%s); P=/tmp/p; O=/tmp/o100; mkdir -p $O $P/m $P/K3
el() { echo $(( $(date +%s) - S )); }
tar xJf .gpu-run/r100/bins.tar.xz -C $P/K3; K=$P/K3/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r100/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( [ -s $P/m/9b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $P/m/9b.gguf
  [ -s $P/m/27b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-27b --mix q4_k_m --fast -t 8 -o $P/m/27b.gguf ) > $O/gen.log 2>&1 &
GEN=$!
tst() {  # name [env…]
  local t=$1; shift; s0=$(date +%s); env "$@" timeout 150 $K/$t --gtest_brief=1 > $O/$t$SUF.log 2>&1
  echo "$t$SUF rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t$SUF.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $O/$t$SUF.log $OUT/
}
SUF= tst test_cuda_seq
grep -E '^\[gdn' $O/test_cuda_seq.log > $O/gdn.txt
KILN_CUDA_BENCH=1 timeout 120 $K/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/seq-bench.log 2>&1
grep -E 'gated_delta' $O/seq-bench.log >> $O/t.txt; cp $O/seq-bench.log $O/t.txt $O/gdn.txt $OUT/
wait $GEN; echo "files ready $(el) s" >> $O/t.txt
for m in 9b 27b; do
  timeout 120 $K/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 512,2048 -n 0 -r 3 --delta-chunk 0,64 > $O/pp-$m.log 2>&1
  echo "$m pp rc=$? $(el) s" >> $O/t.txt; grep -E '^\| qwen' $O/pp-$m.log | head -4 >> $O/t.txt; cp $O/t.txt $O/pp-$m.log $OUT/
done
for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model; do SUF= tst $t; done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
for t in test_cuda_matmul test_cuda_mtp test_cuda_spec; do [ $(el) -lt 420 ] || break; SUF=-m4c5 tst $t KILN_CUDA_MV_M4_CTAS5=1; done
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
for v in 0 1 0 1; do [ $(el) -lt 520 ] || break
  echo "m4c5=$v npl4 $(KILN_CUDA_MV_M4_CTAS5=$v timeout 30 $K/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 128 -ntg 128 -npl 4 2>/dev/null | grep -E '^\|' | tail -1)" >> $O/t.txt
  echo "m4c5=$v spec $(KILN_CUDA_MV_M4_CTAS5=$v timeout 30 $K/kiln spec-bench -m $P/m/9b.gguf -npp 64 -ntg 128 -r 8 $M 2>/dev/null | grep -E '^\| draft')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
cat $O/t.txt; echo "total $(el) s"
