#!/usr/bin/env bash
# Device run 122 (session 25): A = main 02ac4ef (run 119's package), R = branch ring (main + the decode attention's
# shared-memory ring + mmq-tiny). R with KILN_CUDA_ATTN_RING=0 (R0) is R without the ring. (1) R's GPU tests; (2) the
# attention decode microbench (test_cuda_seq BenchTimings) R vs R0; (3) 8-layer batched-bench A / R0 / R (mmq-tiny:
# A vs R0; ring at short context: R0 vs R); (4) full 9B tg128 @ d32768 F16 and q4_0, R0 vs R; (5) full 9B batched A vs
# R; (6) #16 spec-bench plain vs synth-len 3 with the op profile. Carry .gpu-run/r119, .gpu-run/r122,
# .gpu-run/r101/vocab-qwen35.gguf.xz (aside.sh out all). ~350 s.
S=$(date +%s); P=/tmp/p; O=/tmp/o122; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
log() { echo "$*" >> $O/t.txt; cp $O/t.txt $OUT/; }
[ -d $P/K/A ] || xz -dc .gpu-run/r119/AS.tar.xz | tar x -C $P/K
rm -rf $P/K/R; xz -dc .gpu-run/r122/R.tar.xz | tar x -C $P/K
A=$P/K/A/bin; R=$P/K/R; cp -n $A/lib*.so* $R/
[ -f $P/vocab.gguf ] || xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
F8=$P/m/9b8.gguf F=$P/m/9b.gguf
[ -f $F8 ] || LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --n-layer 8 --mix iq4_xs --fast -t 14 -o $F8 > $O/gen8.log 2>&1
G=
if [ ! -f $F ]; then
  LD_LIBRARY_PATH=$A nice $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $F.tmp > $O/gen.log 2>&1 && mv $F.tmp $F &
  G=$!
fi
for t in test_cuda_seq test_cuda_matmul test_cuda_model test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); LD_LIBRARY_PATH=$R timeout 120 $R/$t --gtest_brief=1 > $O/R-$t.log 2>&1
  log "R $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/R-$t.log | tr '\n' ' ')"
done
grep -h -B2 -A8 "Failure" $O/R-*.log | head -30 >> $O/t.txt
for r in 1; do for v in R0 R; do
  [ $v = R0 ] && export KILN_CUDA_ATTN_RING=0 || unset KILN_CUDA_ATTN_RING
  LD_LIBRARY_PATH=$R KILN_CUDA_BENCH=1 timeout 60 $R/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/mb-$v-$r.txt 2>&1
  log "$v r$r $(grep 'attention decode' $O/mb-$v-$r.txt | sed -E 's/.*decode (\w+) .*n_kv= *([0-9]+): *([0-9.]+) us.*/\1@\2 \3us/' | tr '\n' ' ')"
done; done
unset KILN_CUDA_ATTN_RING
bb() {  # label dir file [env]
  log "$1 $(env LD_LIBRARY_PATH=$2 $4 timeout 45 $2/kiln batched-bench -m $3 -ngl all -fa on -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}') $(el)s"
}
for r in 1 2 3; do bb "8L A" $A $F8; bb "8L R0" $R $F8 KILN_CUDA_ATTN_RING=0; bb "8L R" $R $F8; done
# Multi-sequence prefill (run 120: the in-projection's matmul_n at m512 took 1.4-2.2 ms in batched-bench's prefill of
# 4 x 128 tokens against 0.2-0.65 ms in a one-sequence pp512): both op by op on the 8-layer file.
LD_LIBRARY_PATH=$R KILN_CUDA_PROFILE=1 timeout 25 $R/kiln bench -m $F8 -ngl all -fa on -p 512 -n 0 -r 3 > $O/prof-pp512.txt 2>&1
LD_LIBRARY_PATH=$R KILN_CUDA_PROFILE=1 timeout 25 $R/kiln batched-bench -m $F8 -ngl all -fa on -npp 128 -ntg 1 -npl 4 > $O/prof-bpp4.txt 2>&1
log "prefill profiles $(el) s"
[ -n "$G" ] && wait $G; log "gen done $(el) s"
for c in f16 q4_0; do for v in R0 R; do
  E=; [ $v = R0 ] && E=KILN_CUDA_ATTN_RING=0; D=$R; [ $v = A ] && D=$A
  env LD_LIBRARY_PATH=$D $E timeout 60 $D/kiln bench -m $F -ngl all -fa on -p 0 -n 128 -d 32768 -r 2 -ctk $c -ctv $c > $O/d32k-$v-$c.txt 2>&1
  log "d32768 $c $v $(grep -E 'tg128' $O/d32k-$v-$c.txt | head -1 | awk -F'|' '{print $(NF-1)}') $(el)s"
done; done
for r in 1 2; do bb "9B A" $A $F; bb "9B R" $R $F; done
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
export LD_LIBRARY_PATH=$R
timeout 40 $R/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 > $O/sb-plain.txt 2>&1; log "plain $(grep -E '^\| none' $O/sb-plain.txt)"
timeout 40 $R/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 $M > $O/sb-s3.txt 2>&1; log "synth3 $(grep -E '^\| draft' $O/sb-s3.txt) $(el)s"
[ $(el) -lt 520 ] && KILN_CUDA_PROFILE=1 timeout 40 $R/kiln spec-bench -m $F -npp 64 -ntg 64 -r 1 $M > $O/prof-sb-s3.txt 2>&1
# Where a round's time goes beyond the draft pass (run 120: ~4.5 ms a round outside the drafts against a 2.6 ms plain
# step): GPU kernel time vs wall time under nsys (if the machine has it).
NS=$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
[ -n "$NS" ] && [ $(el) -lt 500 ] && timeout 60 $NS profile --trace=cuda --stats=true -o $O/sb-nsys $R/kiln spec-bench -m $F -npp 64 -ntg 128 -r 2 $M > $O/sb-nsys.txt 2>&1
rm -f $O/sb-nsys.nsys-rep $O/sb-nsys.sqlite
[ $(el) -lt 540 ] && KILN_CUDA_PROFILE=1 timeout 30 $R/kiln bench -m $F -ngl all -fa on -p 0 -n 32 -d 32768 -r 1 -ctk q4_0 -ctv q4_0 > $O/prof-d32k-q4.txt 2>&1
tar cf - -C $O . | xz -T8 > $OUT/run122.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
