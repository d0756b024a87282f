#!/usr/bin/env bash
# Device run 115 (session 22; the last 250 s of device time): N3 = fffa07c (mmq stream-K with its PDL trigger at each
# CTA's last unit): test_cuda_fused / test_cuda_matmul, then batched-bench 16 / 32 streams default vs
# KILN_CUDA_MMQ_PDL_EARLY=1 (run 111's trigger). Carry .gpu-run/r115, .gpu-run/r101/vocab-qwen35.gguf.xz.
S=$(date +%s); P=/tmp/p; O=/tmp/o115; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r115/N3.tar.xz | tar x -C $P/K; K=$P/K/.gpu/bin
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name --format=csv,noheader > $O/t.txt
LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_fused test_cuda_matmul; do
  s0=$(date +%s); LD_LIBRARY_PATH=$K timeout 100 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/test_cuda_*.log | head -20 >> $O/t.txt; cp $O/t.txt $OUT/
wait $GEN
for v in "" 1; do
  echo "early=$v $(LD_LIBRARY_PATH=$K KILN_CUDA_MMQ_PDL_EARLY=$v timeout 40 $K/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
cat $O/t.txt; echo "total $(el) s"
