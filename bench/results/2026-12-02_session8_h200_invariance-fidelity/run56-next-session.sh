#!/usr/bin/env bash
# Prepared in session 8, not run (no device time left): the first call of the next session, on the final CUDA code (d54b53e = 5009e6c for src/kernels and src/backend): every GPU test
# binary, and at the same time scripts/gpu_fidelity.sh (every generated architecture x weight x cache,
# partial offload) against llama.cpp's CUDA build.
R=$PWD; S=$(date +%s)
P=/tmp/p; mkdir -p $P
tar xJf .gpu-run/f/bins.tar.xz -C $P && xz -dc .gpu-run/f/pride.txt.xz > $P/pride.txt
cat .gpu-run/f/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-run/f/gguf*.whl && export PYTHONPATH=/tmp/site
O=/tmp/o56; mkdir -p $O
( for t in test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_matmul test_cuda_mtp test_cuda_spec test_cuda_model; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
timeout 300 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1; echo "fidelity rc=$?"
rm -f $O/fid/*.gguf $O/fid/*.kld
wait $T; cat $O/tests.txt
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -20; grep "batch-invariant" $O/test_cuda_model.log
grep -E "NO|outside" $O/fidelity.md
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run56.tar.xz
