#!/usr/bin/env bash
# Device run 121 (prepared in session 24): A = main 02ac4ef (run 119's package), T = branch mmq-tiny (925018c: mmq
# matrices of < 8 row tiles split down to one step per CTA). (1) T's GPU tests (matmul, model, fused, spec); (2) 8-layer
# and full-size 9B batched-bench 8/16/32, A/T alternating; (3) op-by-op profile at 32 streams, T; (4) #16: spec-bench
# plain vs synth-len 3 and the drafter's op-by-op profile (T's spec-bench prints KILN_CUDA_PROFILE tables).
# Carry .gpu-run/r119, .gpu-run/r121 and .gpu-run/r101/vocab-qwen35.gguf.xz (aside.sh out all). ~420 s.
S=$(date +%s); P=/tmp/p; O=/tmp/o121; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r119/AS.tar.xz | tar x -C $P/K; xz -dc .gpu-run/r121/T.tar.xz | tar x -C $P/K
A=$P/K/A/bin; T=$P/K/T; cp $A/lib*.so* $T/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
F8=$P/m/9b8.gguf F=$P/m/9b.gguf
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --n-layer 8 --mix iq4_xs --fast -t 14 -o $F8 > $O/gen8.log 2>&1
LD_LIBRARY_PATH=$A nice $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $F > $O/gen.log 2>&1 &
G=$!
for t in test_cuda_matmul test_cuda_model test_cuda_fused test_cuda_spec; do
  s0=$(date +%s); LD_LIBRARY_PATH=$T timeout 120 $T/$t --gtest_brief=1 > $O/T-$t.log 2>&1
  echo "T $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/T-$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
bb() {  # label dir file
  echo "$1 $(LD_LIBRARY_PATH=$2 timeout 45 $2/kiln batched-bench -m $3 -ngl all -fa on -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}') $(el)s" >> $O/t.txt
  cp $O/t.txt $OUT/
}
for r in 1 2 3; do bb "8L A" $A $F8; bb "8L T" $T $F8; done
LD_LIBRARY_PATH=$T KILN_CUDA_PROFILE=1 timeout 25 $T/kiln batched-bench -m $F8 -ngl all -fa on -npp 128 -ntg 32 -npl 32 > $O/prof-T-npl32.txt 2>&1
wait $G; echo "gen done $(el) s" >> $O/t.txt
for r in 1 2; do bb "9B A" $A $F; bb "9B T" $T $F; done
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
export LD_LIBRARY_PATH=$T
timeout 40 $T/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 > $O/sb-plain.txt 2>&1; echo "plain $(grep -E '^\| none' $O/sb-plain.txt)" >> $O/t.txt
timeout 40 $T/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 $M > $O/sb-s3.txt 2>&1; echo "synth3 $(grep -E '^\| draft' $O/sb-s3.txt) $(el)s" >> $O/t.txt
[ $(el) -lt 520 ] && KILN_CUDA_PROFILE=1 timeout 40 $T/kiln spec-bench -m $F -npp 64 -ntg 64 -r 1 $M > $O/prof-sb-s3.txt 2>&1
tar cf - -C $O . | xz -T8 > $OUT/run121.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
