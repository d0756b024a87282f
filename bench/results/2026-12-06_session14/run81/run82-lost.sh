#!/usr/bin/env bash
# Device run 81, second call (same warm machine): wait for the detached soak to finish and bring it back; then the
# 8 GiB cap (#15): 9B IQ4_XS + MTP + the 9B-size projector, -c 65536 q8_0 cache, draft-mtp, the plan's own choice
# (default --fit-target): an image, then a 65,496-token prompt filled to its end with drafting on; peak device
# memory (nvidia-smi every 100 ms) against the plan.
S=$(date +%s); P=/tmp/p; O=/tmp/o81; B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
while [ ! -f $O/done ] && [ $(( $(date +%s) - S )) -lt 300 ]; do sleep 2; done
echo "soak wait $(( $(date +%s) - S )) s" >> $O/soak.txt
xz -T8 -c $O/server.log > $OUT/soak-server.log.xz; cp $O/soak.txt $O/soak.json $O/metrics.txt $O/soak.out $OUT/ 2>/dev/null
capped() {  # tag model mmproj cap ctx ctype n_prompt timeout
  local tag=$1; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/mem-$tag.csv & local MP=$!
  timeout $(( $8 + 90 )) $B/kiln serve -m $2 --mmproj $3 -c $5 -ctk $6 -ctv $6 --spec-type draft-mtp --device-memory $4 --port 8092 > $O/kiln-$tag.log 2>&1 &
  local KS=$!
  for i in $(seq 240); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.5; done
  echo "$tag idle: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout 100 python3 /tmp/img_client.py 8092 >> $O/stages.txt 2>&1
  echo "$tag after image: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout $(( $8 + 5 )) python3 /tmp/long_client.py 8092 $7 $8 >> $O/stages.txt 2>&1
  echo "$tag after prompt: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  curl -s localhost:8092/metrics | grep -E "draft|accepted" >> $O/stages.txt
  kill $KS; wait $KS 2>/dev/null; kill $MP; sleep 1
  echo "$tag: baseline $base MiB, peak $(sort -n $O/mem-$tag.csv | tail -1) MiB" >> $O/stages.txt
  grep -E "the plan|plan needs|total|layers|prompt eval|eval time|draft:" $O/kiln-$tag.log | head -12 >> $O/stages.txt
}
capped 8g $P/m/9b-mtp.gguf $P/m/mm9b.gguf 8GiB 65536 q8_0 0 $(( 560 - ($(date +%s) - S) - 60 ))
echo "total $(( $(date +%s) - S )) s" >> $O/stages.txt
cp $O/stages.txt $O/kiln-8g.log $OUT/; xz -c $O/mem-8g.csv > $OUT/mem-8g.csv.xz
tail -22 $O/soak.txt; cat $O/metrics.txt | tail -25; cat $O/stages.txt
