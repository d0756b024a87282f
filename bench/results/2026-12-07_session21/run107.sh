#!/usr/bin/env bash
# Device run 107 (session 21): every GPU test binary at the session's last commit (the M4 switch removed, -ub auto's
# MoE rule), then kiln bench tg128 / pp2048 on the 9B as a check of the final binary.
S=$(date +%s); P=/tmp/p; O=/tmp/o107; R=.gpu-run/r107; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
tar xJf $R/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
$K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); timeout 100 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -20 >> $O/t.txt
wait $GEN
[ $(el) -lt 170 ] && timeout 40 $K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048 -n 128 -r 2 2>/dev/null | grep -E '^\| qwen' >> $O/t.txt
tar cf - -C $O . | xz -T8 > $OUT/run107.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
