#!/usr/bin/env bash
# Device run 87 (session 15): the GPU tests only, at 2404c7f (the draft graph's logits view after bind); results to
# $OUT as each test ends (little device time was left).
S=$(date +%s); P=/tmp/p; mkdir -p $P; I=.gpu-run/r87
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/gpu.txt
for t in test_cuda_mtp test_cuda_spec test_cuda_fused test_cuda_backend test_cuda_seq test_cuda_model test_cuda_matmul; do
  s0=$(date +%s); timeout 120 $B/$t --gtest_brief=1 > $OUT/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $OUT/$t.log | tr '\n' ' ')" >> $OUT/tests.txt
done
cat $OUT/gpu.txt $OUT/tests.txt; grep -B2 -A8 "Failure" $OUT/test_cuda_*.log | head -30; echo "total $(( $(date +%s) - S )) s"
