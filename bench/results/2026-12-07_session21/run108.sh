#!/usr/bin/env bash
# Device run 108 (session 21): the chunked delta rule with the CUDA-core kernel set removed: test_cuda_seq (and its
# gated_delta timings), test_cuda_model.
S=$(date +%s); P=/tmp/p; O=/tmp/o108; R=.gpu-run/r108; mkdir -p $O $P/K
tar xJf $R/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
nvidia-smi --query-gpu=name --format=csv,noheader > $O/t.txt
for t in test_cuda_seq test_cuda_model; do
  s0=$(date +%s); timeout 60 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
KILN_CUDA_BENCH=1 timeout 40 $K/test_cuda_seq --gtest_filter='*BenchTimings*' 2>&1 | grep -E 'gated_delta' >> $O/t.txt
cp $O/t.txt $OUT/; cat $O/t.txt; echo "total $(( $(date +%s) - S )) s"
