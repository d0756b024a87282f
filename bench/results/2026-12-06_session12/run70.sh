#!/usr/bin/env bash
# Device run 70 (session 12), diagnostics at HEAD's CUDA code (the run-67 binaries):
# (1) a bare CUDA context's device memory and the local-memory reservation (ctx.cu);
# (2) kiln serve at the 8 GiB cap (9B + MTP + projector, 64K q8_0): device memory idle, after an image, after a 64K prompt;
# (3) the cost of an m-token step (m = 1..8, the verify step's shape) and its per-op profile at m = 1 and 4;
# (4) spec-bench: plain vs draft-mtp synth-len 4, and the latter's per-op profile.
R=$PWD; S=$(date +%s); I=.gpu-run/r70
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
O=/tmp/o70; mkdir -p $O
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1); echo "nvidia-smi used before: $base MiB" | tee $O/ctx.txt
nvcc -O2 -arch=sm_90a -o $P/ctx $I/ctx.cu && { $P/ctx; CUDA_MODULE_LOADING=EAGER $P/ctx | head -1 | sed 's/^/EAGER: /'; } 2>&1 | tee -a $O/ctx.txt
cuobjdump --dump-resource-usage $B/kiln 2>/dev/null | grep -E "Function|STACK" | paste - - | sed -E 's/.*Function ([^ :]+).*STACK:([0-9]+).*LOCAL:([0-9]+).*/\2 \3 \1/' | sort -n -r | head -15 > $O/stack.txt; head -5 $O/stack.txt | cut -c1-160
t0=$(date +%s)
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b-mtp.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 4 -o $P/m/mm9b.gguf &
wait; echo "gen $(( $(date +%s) - t0 )) s"
# (2) memory at the 8 GiB cap
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 100 > $O/mem.csv & MP=$!
for ml in LAZY EAGER; do
  CUDA_MODULE_LOADING=$ml timeout 200 $B/kiln serve -m $P/m/9b-mtp.gguf --mmproj $P/m/mm9b.gguf -c 65536 -ctk q8_0 -ctv q8_0 --spec-type draft-mtp \
    --device-memory 8GiB --port 8092 > $O/kiln-8g-$ml.log 2>&1 &
  KS=$!
  for i in $(seq 120); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.5; done
  sleep 1; echo "$ml idle: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout 100 python3 $I/img_client.py 8092 >> $O/stages.txt 2>&1
  sleep 0.5; echo "$ml after image: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout 100 python3 - >> $O/stages.txt 2>&1 <<'PY'
import json, random, time, urllib.request
random.seed(7)
toks = [random.randrange(1000, 150000) for _ in range(64000)]
body = json.dumps({"prompt": toks, "n_predict": 32, "temperature": 0, "cache_prompt": False, "ignore_eos": True}).encode()
t = time.time()
with urllib.request.urlopen(urllib.request.Request("http://localhost:8092/completion", body, {"Content-Type": "application/json"}), timeout=95) as r:
    js = json.loads(r.read())
print(round(time.time() - t, 2), json.dumps(js.get("timings")))
PY
  sleep 0.5; echo "$ml after 64K prompt: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  kill $KS; wait $KS 2>/dev/null; sleep 1
done
kill $MP
echo "peak used $(cut -d, -f2 $O/mem.csv | sort -n | tail -1) MiB (baseline $base)" >> $O/stages.txt
# (3) m-token steps
row() { grep -E '\| +(pp[0-9]+|tg[0-9]+)' $1 | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}'; }
K9="$B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on"
timeout 120 $K9 -p 1,2,3,4,5,8,16 -n 128 -r 5 > $O/msteps.md 2> $O/msteps.err; echo "steps: $(row $O/msteps.md)" > $O/summary.txt
for m in 1 4 8 16; do KILN_CUDA_PROFILE=1 timeout 60 $K9 -p $m -n 0 -r 3 > $O/prof-p$m.md 2> $O/prof-p$m.err; done
# (4) spec-bench
SB="$B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 3"
timeout 60 $SB > $O/sb-plain.md 2>&1
timeout 60 $SB --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4 > $O/sb-s4.md 2>&1
timeout 60 $SB --spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0 > $O/sb-p0.md 2>&1
KILN_CUDA_PROFILE=1 timeout 90 $SB --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4 -r 1 > $O/sb-s4-prof.md 2>&1
# (5) the tensor-core small-batch mat-mul below 9 columns (KILN_CUDA_MMQ_MIN_M), against the mat-vec
for mm in 9 1 2 4; do
  KILN_CUDA_MMQ_MIN_M=$mm timeout 120 $K9 -p 1,2,4,8 -n 128 -r 3 > $O/mmq$mm.md 2> $O/mmq$mm.err; echo "mmq_min $mm: $(row $O/mmq$mm.md)" >> $O/summary.txt
done
KILN_CUDA_MMQ_MIN_M=1 KILN_CUDA_PROFILE=1 timeout 60 $K9 -p 1 -n 0 -r 3 > $O/prof-mmq-p1.md 2> $O/prof-mmq-p1.err
KILN_CUDA_MMQ_MIN_M=2 KILN_CUDA_PROFILE=1 timeout 60 $K9 -p 4 -n 0 -r 3 > $O/prof-mmq-p4.md 2> $O/prof-mmq-p4.err
KILN_CUDA_MMQ_MIN_M=2 timeout 60 $SB --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4 > $O/sb-s4-mmq2.md 2>&1
KILN_CUDA_MMQ_MIN_M=2 timeout 60 $SB --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 3 > $O/sb-s3-mmq2.md 2>&1
timeout 60 $SB --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 3 > $O/sb-s3.md 2>&1
echo "total $(( $(date +%s) - S )) s" >> $O/summary.txt
tar cf - -C $O . | xz -T8 > $OUT/run70.tar.xz
cat $O/ctx.txt $O/stages.txt $O/summary.txt; grep -h "|" $O/sb-*.md | grep -v -- "---" | head -12
