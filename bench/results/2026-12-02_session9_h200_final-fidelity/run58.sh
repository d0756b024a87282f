#!/usr/bin/env bash
# Device run 58 (session 9), call 2 of 2 (a fresh machine: llama.cpp carried, the 9B file regenerated): the
# build for 86 (sm_86 SASS + compute_86 PTX, what CI and a build box without a GPU make) on the H200:
# the driver JIT-compiles the compute_86 PTX, so this runs the RTX 30/40 cards' code (cp.async rings, no
# bulk copies, no clusters, no PDL) — every GPU test binary, the whole fidelity table, and the 9B-shape
# decode / prefill next to run 57's sm_90a numbers.
R=$PWD; S=$(date +%s)
P=/tmp/p; P8=/tmp/p86; mkdir -p $P8
mkdir -p $P/m; [ -d $P/llama-cuda-sm90a ] || cat .gpu-run/h/llama-*.part-0* | xz -d | tar x -C $P
tar xJf .gpu-run/h/bins.tar.xz -C $P8 && xz -dc .gpu-run/h/pride.txt.xz > $P8/pride.txt
B=$P8/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-run/h/gguf*.whl && export PYTHONPATH=/tmp/site
export CUDA_CACHE_PATH=/tmp/nvcache CUDA_CACHE_MAXSIZE=4294967296
O=/tmp/o58; mkdir -p $O
( t0=$(date +%s); [ -f $P/m/9b8.gguf ] || $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -t 8 -o $P/m/9b8.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
t0=$(date +%s); timeout 300 $B/test_cuda_fused --gtest_brief=1 > $O/jit-first.log 2>&1; echo "first process (JIT) $(( $(date +%s) - t0 )) s rc=$?"
( for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_mtp test_cuda_spec; do
    s0=$(date +%s); timeout 250 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
timeout 400 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P8/pride.txt $O/fid > $O/fidelity.md 2>&1; echo "fidelity rc=$?"
rm -f $O/fid/*.gguf $O/fid/*.kld
wait $T; cat $O/tests.txt
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -30; grep "grouped\|batch-invariant" $O/test_cuda_*.log
grep -E "NO|outside" $O/fidelity.md
grep -h "running sm_" $O/fid/*.log | head -2
wait $G; cat $O/gen.txt
if [ -f $P/m/9b8.gguf ]; then
  timeout 120 $B/kiln bench -m $P/m/9b8.gguf -ngl all -fa on -r 2 -p 512 -n 128 > $O/kiln-9b-86.md 2>&1
  echo "kiln-9b-86: $(grep -E '\| +(pp512|tg128) +\|' $O/kiln-9b-86.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"
fi
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run58.tar.xz
