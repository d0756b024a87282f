#!/usr/bin/env bash
# Device run 57 (session 9), call 1 of 2: sm_90a build with the grouped expert mat-mul (mmq_id) and
# code_sm. Every GPU test binary; the whole fidelity table (qwen35moe rows now take the grouped path
# for Q8_0 / q4_k_m / iq4_xs); the 35B-A3B-shape qwen35moe Q4_K_M (8 of 40 layers): kiln pp512/pp2048/tg128
# before and after llama-bench, kiln with KILN_CUDA_MMQ=0 (the per-slot mat-vec path of before), and a
# per-op profile of pp512; the 9B-shape 8-layer IQ4_XS file generated and benched for call 2 (sm_86 code).
R=$PWD; S=$(date +%s)
P=/tmp/p; mkdir -p $P $P/m
tar xJf .gpu-run/g/bins.tar.xz -C $P && xz -dc .gpu-run/g/pride.txt.xz > $P/pride.txt
cat .gpu-run/g/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-run/g/gguf*.whl && export PYTHONPATH=/tmp/site
O=/tmp/o57; mkdir -p $O
( t0=$(date +%s)
  $B/kiln gguf gen --preset qwen35moe-35b-a3b --mix q4_k_m --n-layer 8 -q -t 6 -o $P/m/moe8.gguf &
  $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -t 6 -o $P/m/9b8.gguf &
  wait; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
( for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_mtp test_cuda_spec; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
timeout 300 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1; echo "fidelity rc=$?"
rm -f $O/fid/*.gguf $O/fid/*.kld
wait $T; cat $O/tests.txt
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -30; grep "grouped\|batch-invariant" $O/test_cuda_*.log
grep -E "^\| qwen35moe|NO|outside" $O/fidelity.md
wait $G; cat $O/gen.txt
kb() { local n=$1 f=$2; shift 2; timeout 120 $B/kiln bench -m $P/m/$f.gguf -ngl all -fa on -r 2 "$@" > $O/$n.md 2>&1; }
kb kiln-moe-1 moe8 -p 512,2048 -n 128
KILN_CUDA_MMQ=0 kb kiln-moe-mmq0 moe8 -p 512,2048 -n 0
LD_LIBRARY_PATH=$LL timeout 150 $LL/llama-bench -m $P/m/moe8.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 2 > $O/llama-moe.md 2> $O/llama-moe.err
kb kiln-moe-2 moe8 -p 512,2048 -n 128
KILN_CUDA_PROFILE=1 kb kiln-moe-prof moe8 -p 512 -n 0 -r 1
kb kiln-9b-90a 9b8 -p 512 -n 128
for f in kiln-moe-1 kiln-moe-mmq0 llama-moe kiln-moe-2 kiln-9b-90a; do echo "$f: $(grep -E '\| +(pp512|pp2048|tg128) +\|' $O/$f.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"; done
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run57.tar.xz
