#!/usr/bin/env bash
# Device run 117 (session 23): SK = main + the stream-K mmq re-applied (a33c382: `git revert cb9ce92`, with the PDL
# trigger at each CTA's last unit), A = main's kiln (aa3c62c). Every GPU test with SK; batched-bench 8/16/32 streams
# A / SK / SK with KILN_CUDA_MMQ_PDL_EARLY=1 (run 111's trigger at the start) / SK with
# KILN_CUDA_PDL_ALL=0 (no PDL for the kernels launched through pdl::launch), A and SK twice; per-op profiles at 32 streams.
# Carry .gpu-run/r117, .gpu-run/r101/vocab-qwen35.gguf.xz; aside.sh out all.
S=$(date +%s); P=/tmp/p; O=/tmp/o117; mkdir -p $O $P/m
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r117/SK.tar.xz | tar x -C $P; K=$P/SK/bin; A=$P/A; cp $K/lib*.so* $A/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
[ -f $P/m/9b.gguf ] || { LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 & }
GEN=$!
for t in test_cuda_matmul test_cuda_fused test_cuda_model test_cuda_seq test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); LD_LIBRARY_PATH=$K timeout 120 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "SK $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $GEN; echo "gen done $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
bb() {  # label dir [env]
  echo "$1 $(LD_LIBRARY_PATH=$2 env $3 timeout 45 $2/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
  cp $O/t.txt $OUT/
}
bb "A r1" $A; bb "SK r1" $K; bb "SK-early r1" $K KILN_CUDA_MMQ_PDL_EARLY=1; bb "SK-nopdl r1" $K KILN_CUDA_PDL_ALL=0
[ $(el) -lt 420 ] && { bb "A r2" $A; bb "SK r2" $K; }
for v in A K; do [ $(el) -lt 520 ] || break; D=${!v}
  LD_LIBRARY_PATH=$D KILN_CUDA_PROFILE=1 timeout 35 $D/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 128 -ntg 32 -npl 32 > $O/prof-$v-npl32.txt 2>&1
  echo "profile $v rc=$? $(el) s" >> $O/t.txt
done
tar cf - -C $O . | xz -T8 > $OUT/run117.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
