#!/usr/bin/env bash
# Device run 85 (session 15), one call: #15's 24 GiB cap filled to the end — 27B Q4_K_M + MTP + the 27B-size
# projector, -c 262144 q4_0, draft-mtp: an image, then a 262,104-token prompt to its end (+32 generated); peak device
# memory (nvidia-smi every 100 ms) against the plan. Uses /tmp/p/m from run 83 if this call lands on that machine.
S=$(date +%s); P=/tmp/p; O=/tmp/o85; mkdir -p $O $P/m $P/k; I=.gpu-run/r85
tar xJf $I/kiln.tar.xz -C $P/k && B=$P/k/.gpu/bin; export LD_LIBRARY_PATH=$B
cp $I/*.py /tmp/; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/gpu.txt
if [ ! -s $P/m/27b-mtp.gguf ] || [ ! -s $P/m/mm27b.gguf ]; then
  xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
  $B/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-27b --mix q4_k_m --mtp --fast -t 15 -o $P/m/27b-mtp.gguf &
  $B/kiln gguf gen --mmproj --preset qwen35-27b -q -t 1 -o $P/m/mm27b.gguf &
  wait; echo "files written in $(( $(date +%s) - S )) s" >> $O/stages.txt
fi
tag=24g; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/mem-$tag.csv & MP=$!
$B/kiln serve -m $P/m/27b-mtp.gguf --mmproj $P/m/mm27b.gguf -c 262144 -ctk q4_0 -ctv q4_0 --spec-type draft-mtp \
  --device-memory 24GiB --metrics --port 8092 > $O/kiln-$tag.log 2>&1 &
KS=$!
for i in $(seq 480); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.25; done
echo "$tag ready at $(( $(date +%s) - S )) s: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) MiB" >> $O/stages.txt
timeout 60 python3 /tmp/img_client.py 8092 >> $O/stages.txt 2>&1
echo "$tag after image: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
left=$(( 585 - ($(date +%s) - S) ))
timeout $left python3 /tmp/long_client.py 8092 0 $left >> $O/stages.txt 2>&1
echo "$tag after prompt ($(( $(date +%s) - S )) s): $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
curl -s localhost:8092/metrics | grep -E "draft|accepted|prompt_tokens" >> $O/stages.txt
kill $KS; wait $KS 2>/dev/null; kill $MP; sleep 0.5
echo "$tag: baseline $base MiB, peak $(sort -n $O/mem-$tag.csv | tail -1) MiB" >> $O/stages.txt
grep -E "the plan|plan needs|total|layers|prompt eval|eval time|draft:" $O/kiln-$tag.log | head -14 >> $O/stages.txt
cat $O/gpu.txt $O/stages.txt; echo "total $(( $(date +%s) - S )) s"
cp $O/stages.txt $O/kiln-$tag.log $O/gpu.txt $OUT/; xz -c $O/mem-$tag.csv > $OUT/mem-$tag.csv.xz
