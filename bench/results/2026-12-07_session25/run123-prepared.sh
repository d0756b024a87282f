#!/usr/bin/env bash
# Device run 123 (session 25), a follow-up on run 122's warm machine (needs its /tmp/p: R, the 9B file): #14's long-
# context rows with both engines in the same run — 9B IQ4_XS tg128 @ d32768 with F16 and q4_0 caches, kiln R
# (ring) vs llama.cpp (../shared/tools/llama-cuda-sm90a), then both at d0 for the record. Carry
# .gpu-run/fid/llama-cuda-sm90a.tar.xz.part-0{0,1,2} (aside.sh out all). ~200 s.
S=$(date +%s); P=/tmp/p; O=/tmp/o123; mkdir -p $O
el() { echo $(( $(date +%s) - S )); }
log() { echo "$*" >> $O/t.txt; cp $O/t.txt $OUT/; }
R=$P/K/R F=$P/m/9b.gguf
nvidia-smi --query-gpu=name --format=csv,noheader > $O/t.txt
[ -x $R/kiln ] && [ -f $F ] || { log "not warm: no $R/kiln or $F"; exit 0; }
cat .gpu-run/fid/llama-cuda-sm90a.tar.xz.part-* | xz -dc | tar x -C $P; LL=$P/llama-cuda-sm90a
for c in f16 q4_0; do
  LD_LIBRARY_PATH=$R timeout 80 $R/kiln bench -m $F -ngl all -fa on -p 0 -n 128 -d 32768 -r 3 -ctk $c -ctv $c > $O/kiln-d32k-$c.txt 2>&1
  log "kiln d32768 $c $(grep -E 'tg128' $O/kiln-d32k-$c.txt | head -1 | awk -F'|' '{print $(NF-1)}') $(el)s"
  LD_LIBRARY_PATH=$LL timeout 100 $LL/llama-bench -m $F -ngl 99 -fa 1 -p 0 -n 128 -d 32768 -r 3 -ctk $c -ctv $c > $O/llama-d32k-$c.txt 2>&1
  log "llama d32768 $c $(grep -E 'tg128' $O/llama-d32k-$c.txt | head -1 | awk -F'|' '{print $(NF-1)}') $(el)s"
done
LD_LIBRARY_PATH=$R timeout 60 $R/kiln bench -m $F -ngl all -fa on -p 2048 -n 128 -r 3 > $O/kiln-d0.txt 2>&1
log "kiln d0 $(grep -E 'pp2048|tg128' $O/kiln-d0.txt | awk -F'|' '{print $(NF-2) $(NF-1)}' | tr '\n' ' ') $(el)s"
LD_LIBRARY_PATH=$LL timeout 60 $LL/llama-bench -m $F -ngl 99 -fa 1 -p 2048 -n 128 -r 3 > $O/llama-d0.txt 2>&1
log "llama d0 $(grep -E 'pp2048|tg128' $O/llama-d0.txt | awk -F'|' '{print $(NF-2) $(NF-1)}' | tr '\n' ' ') $(el)s"
tar cf - -C $O . | xz -T8 > $OUT/run123.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
