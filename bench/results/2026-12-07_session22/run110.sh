#!/usr/bin/env bash
# Device run 110 (session 22): A = main 1119aa4 (all GPU tests; the fidelity table unless B passes), B = gdn-next
# (the CUDA-core chunked kernels removed + the pass kernel on 8 warps): test_cuda_seq / test_cuda_model, the
# gated_delta timings of both, the fidelity table with B when its tests pass, pp2048 / pp8192 at -ub 2048 A/B;
# then per-op profiles of batched decode (8 / 32 streams) and the mmq bench at 9-32 columns.
# Carry .gpu-run/r110, .gpu-run/fid, .gpu-run/r101/vocab-qwen35.gguf.xz; aside.sh out all.
S=$(date +%s); P=/tmp/p; O=/tmp/o110; R=.gpu-run/r110; I=.gpu-run/fid; mkdir -p $O $P/m
el() { echo $(( $(date +%s) - S )); }
xz -dc $R/AB.tar.xz | tar x -C $P; A=$P/A/.gpu/bin; B=$P/B2/.gpu/bin; cp $A/lib*.so* $B/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
echo "unpacked $(el) s" >> $O/t.txt
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
( xz -dc $I/pride.txt.xz > $P/pride.txt; cat $I/llama-*.part-0* | xz -d | tar x -C $P
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $I/gguf*.whl ) > $O/llama-unpack.log 2>&1 &
LLU=$!
tst() {  # variant name
  local D=${!1} t=$2; s0=$(date +%s); LD_LIBRARY_PATH=$D timeout 120 $D/$t --gtest_brief=1 > $O/$1-$t.log 2>&1
  echo "$1 $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$1-$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
}
tst B test_cuda_seq; tst B test_cuda_model
for t in test_cuda_seq test_cuda_model test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend; do tst A $t; done
grep -h -B2 -A6 "Failure" $O/*test_cuda_*.log | head -30 >> $O/t.txt
for v in A B A B; do D=${!v}
  LD_LIBRARY_PATH=$D KILN_CUDA_BENCH=1 timeout 40 $D/test_cuda_seq --gtest_filter='*BenchTimings*' 2>&1 | grep -E 'gated_delta' | sed "s/^/$v /" >> $O/t.txt
done; cp $O/t.txt $OUT/
FV=A; grep -q "B test_cuda_seq rc=0" $O/t.txt && grep -q "B test_cuda_model rc=0" $O/t.txt && FV=B
wait $LLU; export PYTHONPATH=/tmp/site; LL=$P/llama-cuda-sm90a; K=${!FV}
echo "fidelity with $FV, start $(el) s" >> $O/t.txt
ARCHS="llama qwen35 qwen35moe" WEIGHTS="q4_k_m iq4_xs" KVS="f16 q8_0" timeout 200 env LD_LIBRARY_PATH=$K:$LL scripts/gpu_fidelity.sh $K/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1
echo "fidelity rc=$? $(el) s" >> $O/t.txt; tail -22 $O/fidelity.md >> $O/t.txt
rm -f $O/fid/*.gguf $O/fid/*.kld; cp $O/t.txt $OUT/
wait $GEN
for r in 1 2; do for v in A B; do D=${!v}; [ $(el) -lt 420 ] || break
  echo "$v r$r $(LD_LIBRARY_PATH=$D timeout 50 $D/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048,8192 -n 0 -ub 2048 -r 2 2>/dev/null | grep -E '^\| qwen' | awk -F'|' '{print $7 $8}' | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done; done
for n in 8 32; do [ $(el) -lt 470 ] || break
  LD_LIBRARY_PATH=$A KILN_CUDA_PROFILE=1 timeout 40 $A/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 128 -ntg 32 -npl $n > $O/prof-npl$n.txt 2>&1
  echo "profile npl $n rc=$? $(el) s" >> $O/t.txt
done
[ $(el) -lt 500 ] && LD_LIBRARY_PATH=$A KILN_CUDA_BENCH=1 timeout 80 $A/test_cuda_matmul --gtest_filter='*Bench*' > $O/mm-bench.txt 2>&1
tar cf - -C $O . | xz -T8 > $OUT/run110.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
