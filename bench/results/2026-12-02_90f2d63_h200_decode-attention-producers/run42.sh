#!/usr/bin/env bash
# Device run 42 (session 7): the attention kernels sharing attention_common.cuh (AttnIO, cache_arg,
# the tensor-core kernel's quantized rows through fetch16 / convert16) and the producers' shared
# helpers: the tests that cover them, then the decode speed check.
R=$PWD
S=$(date +%s)
tar xJf .gpu-run/bins.tar.xz
B=$R/.gpu/bin
export LD_LIBRARY_PATH=$B
O=/tmp/o42; mkdir -p $O
for t in test_cuda_seq test_cuda_fused test_cuda_model test_cuda_backend; do
  s0=$(date +%s); timeout 60 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -20
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run42.tar.xz
