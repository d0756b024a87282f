#!/usr/bin/env bash
# Device run 77 (session 13): which part of run 76's mat-vec change costs? KILN_CUDA_MV_VARIANT (bulk, one
# column): 0 = the old loop, 1 = two half-steps per slot, 2 = next copy before the wait + x before the wait,
# 3 = both; the 4-lane copy issue restored. A/B against the session's starting binary (kiln-old), 2 rounds.
S=$(date +%s); P=/tmp/p; O=/tmp/o77; mkdir -p $O $P/m; I=.gpu-run/r77
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
xz -dc $I/kiln-old.xz > $B/kiln-old && chmod +x $B/kiln-old
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $O/gpu.txt
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b.gguf &
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/27b.gguf &
( for v in 3 0; do KILN_CUDA_MV_VARIANT=$v timeout 100 $B/test_cuda_matmul --gtest_brief=1 > $O/mm$v.log 2>&1
    echo "test_cuda_matmul V$v rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $O/mm$v.log | tr '\n' ' ')"; done > $O/tests.txt )
wait; echo "gen+tests $(( $(date +%s) - S )) s"
for r in 1 2; do for v in old 0 1 2 3; do
  bin=kiln; [ $v = old ] && bin=kiln-old
  for m in 9b 27b; do
    echo "$v $m r$r $(KILN_CUDA_MV_VARIANT=$v timeout 60 $B/$bin bench -m $P/m/$m.gguf -ngl all -fa on -p 0 -n 128 -r 2 2>/dev/null | grep CUDA | awk -F'|' '{print $(NF-1)}')"
  done
done; done > $O/tg.txt
cat $O/gpu.txt $O/tests.txt; grep -B2 -A8 "Failure" $O/mm*.log | head -20
sort -k2,2 -k1,1 $O/tg.txt
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run77.tar.xz
