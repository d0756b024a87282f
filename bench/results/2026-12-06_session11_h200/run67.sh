#!/usr/bin/env bash
# Device run 67 (session 11), kiln's side (llama.cpp's in run 68 on the same warm machine, files kept in /tmp/p/m):
# (1) GPU tests after the MTP block moved to the last layer's device, the recorded-graph drafts and the tensor-core
#     attention's key ranges (test_cuda_mtp, test_cuda_spec, test_cuda_seq, test_cuda_model, test_cuda_backend);
# (2) draft-mtp at full size through kiln serve (9B-shape IQ4_XS and 27B-shape Q4_K_M with an MTP block and the
#     real tokenizer; plain, synthetic acceptance 2/3/4 with n-max 3, real random drafts = zero acceptance);
# (3) the 8 GiB cap again (9B + MTP + projector, 64K q8_0): a 64,000-token prompt with the MTP block on the GPU;
# (4) long-context prefill with and without the key ranges (KILN_CUDA_ATTN_SPLIT=0).
R=$PWD; S=$(date +%s); I=.gpu-run/r67
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
O=/tmp/o67; mkdir -p $O
( for t in test_cuda_mtp test_cuda_spec test_cuda_seq test_cuda_model test_cuda_backend; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
t0=$(date +%s)
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 4 -o $P/m/9b-mtp.gguf &
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --mtp --vocab $P/vocab.gguf --fast -q -t 4 -o $P/m/27b-mtp.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 4 -o $P/m/mm9b.gguf &
wait $(jobs -p | grep -v "^$T$") 2>/dev/null; echo "gen $(( $(date +%s) - t0 )) s"; ls -la $P/m > $O/files.txt
sed -i "s#/tmp/o/server#$O/server#; s#/tmp/o67/server#$O/server#" $I/spec_client.py
C="python3 $I/spec_client.py"
for m in 9b 27b; do
  K="$B/kiln serve -m $P/m/$m-mtp.gguf -ngl all -fa on -c 4096 -np 1 --no-warmup"
  run() { echo "$m $1 | kiln: $(timeout 90 $C 8090 2 128 -- $K --port 8090 $2)"; }
  {
  run "plain        " ""
  run "mtp synth 2  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 2"
  run "mtp synth 3  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 3"
  run "mtp synth 4  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4"
  run "mtp real p0  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0"
  } 2>&1 | tee -a $O/spec.txt
done
grep -h "draft" $O/server-8090-*.log | grep -v "^$" | head -16 > $O/draft-lines.txt
wait $T; cat $O/tests.txt
grep -B2 -A6 "Failure" $O/test_cuda_*.log | head -30
grep -h "\[attn\].*batch 2" $O/test_cuda_seq.log | head -6
# (3) 8 GiB: a 64,000-token prompt + 64 tokens, drafts on.
mem_poll() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 100 > $1 & echo $!; }
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
MP=$(mem_poll $O/mem-kiln.csv)
timeout 150 $B/kiln serve -m $P/m/9b-mtp.gguf --mmproj $P/m/mm9b.gguf -c 65536 -ctk q8_0 -ctv q8_0 --spec-type draft-mtp \
  --device-memory 8GiB --port 8092 > $O/kiln-8g.log 2>&1 &
KS=$!
for i in $(seq 120); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.5; done
timeout 100 python3 - > $O/kiln-8g-client.txt 2>&1 <<'PY'
import json, random, time, urllib.request
random.seed(7)
toks = [random.randrange(1000, 150000) for _ in range(64000)]
body = json.dumps({"prompt": toks, "n_predict": 64, "temperature": 0, "cache_prompt": False, "ignore_eos": True}).encode()
t = time.time()
with urllib.request.urlopen(urllib.request.Request("http://localhost:8092/completion", body, {"Content-Type": "application/json"}), timeout=95) as r:
    js = json.loads(r.read())
print(round(time.time() - t, 2), json.dumps(js.get("timings")))
PY
cat $O/kiln-8g-client.txt
kill $KS; wait $KS 2>/dev/null; kill $MP
echo "baseline used $base MiB; kiln peak used $(cut -d, -f1 $O/mem-kiln.csv | sort -n | tail -1) MiB"
grep -A20 "memory plan" $O/kiln-8g.log | tail -4
grep -E "layers|prompt eval|eval time|draft" $O/kiln-8g.log | head
# (4) long-context prefill, key ranges on / off.
row() { grep -E '\| +(pp[0-9]+|tg[0-9]+)' $1 | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}'; }
kb() { local tag=$1; shift; timeout 120 env "$@" > $O/$tag.md 2> $O/$tag.err; echo "$tag: $(row $O/$tag.md)"; }
{
for sp in 0 1; do
  kb k9-f16-s$sp KILN_CUDA_ATTN_SPLIT=$sp $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on -p 512 -n 0 -d 32768 -r 2
  kb k9-q4-s$sp KILN_CUDA_ATTN_SPLIT=$sp $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on -p 512 -n 0 -d 32768 -r 2 -ctk q4_0 -ctv q4_0
done
kb k27-q4-s0 KILN_CUDA_ATTN_SPLIT=0 $B/kiln bench -m $P/m/27b-mtp.gguf -ngl all -fa on -p 512 -n 0 -d 32768 -r 2 -ctk q4_0 -ctv q4_0
kb k27-q4-s1 KILN_CUDA_ATTN_SPLIT=1 $B/kiln bench -m $P/m/27b-mtp.gguf -ngl all -fa on -p 512 -n 0 -d 32768 -r 2 -ctk q4_0 -ctv q4_0
kb k9-long-s1 KILN_CUDA_ATTN_SPLIT=1 $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -fa on -p 8192,32768 -n 0 -r 1
} 2>&1 | tee $O/bench.txt
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run67.tar.xz
