#!/usr/bin/env bash
# Device run 106 (session 21): #16 — the 3-4-column bulk mat-vec at 5 CTAs per SM (KILN_CUDA_MV_M4_CTAS5=1, measurement
# switch since session 17, never run): GPU tests with it, then spec-bench (plain and draft-mtp synth-len 3) on the 9B
# IQ4_XS with its MTP head, alternating 0 / 1 over three rounds on one machine.
S=$(date +%s); P=/tmp/p; O=/tmp/o106; R=.gpu-run/r106; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
tar xJf $R/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
$K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 12 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_matmul test_cuda_mtp test_cuda_spec; do
  s0=$(date +%s); KILN_CUDA_MV_M4_CTAS5=1 timeout 100 $K/$t --gtest_brief=1 > $O/$t-m4c5.log 2>&1
  echo "$t (M4 CTAS5) rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t-m4c5.log | tr '\n' ' ')" >> $O/t.txt
done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -20 >> $O/t.txt; cp $O/t.txt $OUT/
wait $GEN; echo "file ready $(el) s" >> $O/t.txt
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
for r in 1 2 3; do [ $(el) -lt 230 ] || break
  timeout 60 $K/kiln spec-bench -m $P/m/9b.gguf -npp 64 -ntg 128 -r 6 > $O/sb-plain-$r.txt 2>$O/sb-plain-$r.err
  echo "plain r$r $(grep -E '^\| none' $O/sb-plain-$r.txt)" >> $O/t.txt
  for v in 0 1; do
    KILN_CUDA_MV_M4_CTAS5=$v timeout 60 $K/kiln spec-bench -m $P/m/9b.gguf -npp 64 -ntg 128 -r 6 $M > $O/sb-$v-$r.txt 2>$O/sb-$v-$r.err
    echo "m4c5=$v r$r $(grep -E '^\| draft' $O/sb-$v-$r.txt)" >> $O/t.txt; cp $O/t.txt $OUT/
  done
done
tar cf - -C $O . | xz -T8 > $OUT/run106.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
