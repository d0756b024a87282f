#!/usr/bin/env bash
# Device run 100, minimal (session 19, last 254 s of budget): the GPU test binaries at 6c577f7 — test_cuda_seq with
# the tensor-core chunked delta rule first, its gated_delta timings, then KILN_GDN_PASS=1 (CUDA-core kernels)
# and the other test binaries as time allows.
S=$(date +%s); P=/tmp/p; O=/tmp/o100; mkdir -p $O $P/K3
el() { echo $(( $(date +%s) - S )); }
tar xJf .gpu-run/r100/bins.tar.xz -C $P/K3; K=$P/K3/.gpu/bin; export LD_LIBRARY_PATH=$K
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
tst() {  # name [env…]
  local t=$1; shift; s0=$(date +%s); env "$@" timeout 60 $K/$t --gtest_brief=1 > $O/$t$SUF.log 2>&1
  echo "$t$SUF rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t$SUF.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $O/$t$SUF.log $OUT/
}
SUF= tst test_cuda_seq
grep -E '^\[gdn' $O/test_cuda_seq.log > $O/gdn.txt; cp $O/gdn.txt $OUT/
KILN_CUDA_BENCH=1 timeout 40 $K/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/seq-bench0.log 2>&1
grep -E 'gated_delta' $O/seq-bench0.log >> $O/t.txt; cp $O/seq-bench0.log $O/t.txt $OUT/
KILN_GDN_PASS=1 KILN_CUDA_BENCH=1 timeout 40 $K/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/seq-bench1.log 2>&1
echo "pass1:" >> $O/t.txt; grep -E 'gated_delta' $O/seq-bench1.log >> $O/t.txt; cp $O/seq-bench1.log $O/t.txt $OUT/
for t in test_cuda_backend test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_model test_cuda_matmul; do [ $(el) -lt 140 ] || break; SUF= tst $t; done
[ $(el) -lt 150 ] && SUF=-pass1 tst test_cuda_seq KILN_GDN_PASS=1
cat $O/t.txt; echo "total $(el) s"
