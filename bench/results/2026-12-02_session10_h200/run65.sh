#!/usr/bin/env bash
# Device run 65 (session 10), sm_90a, kiln at 7f6e40a: the 24 GiB cap (#15), the second user's setup:
# 27B-shape Q4_K_M with its MTP block and the real tokenizer (`--fast` weights), the projector of
# Qwen3.5-27B's size, q4_0 cache at 262,144 positions, draft-mtp; an image (768 tokens) and a
# 261,000-token prompt + 64 greedy tokens; device memory polled every 100 ms against the startup plan.
# Then llama-server on the same files fitted to the same 24 GiB (-fitt = free - 23552 MiB), same requests,
# for the time left.
R=$PWD; S=$(date +%s); I=.gpu-run/n
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
cat $I/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
O=/tmp/o65; mkdir -p $O
t0=$(date +%s)
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/27b-mtp.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-27b -q -t 8 -o $P/m/mm27b.gguf &
python3 - $P <<'PY'
import numpy as np, struct, sys, zlib
W, H = 1024, 768
rng = np.random.default_rng(1)
y, x = np.mgrid[0:H, 0:W]
rgb = np.clip(np.stack([x * 255 // (W - 1), y * 255 // (H - 1), (x * 7 + y * 3) % 256], -1) + rng.integers(-30, 30, (H, W, 3)), 0, 255).astype(np.uint8)
raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(H))
ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
open(f"{sys.argv[1]}/img.png", "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + ch(b"IDAT", zlib.compress(raw, 6)) + ch(b"IEND", b""))
PY
wait; echo "gen $(( $(date +%s) - t0 )) s"
cat > $P/client.py <<'PY'
import base64, json, random, sys, time, urllib.request
port, img, out, budget = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def post(path, body, timeout):
    req = urllib.request.Request(f"http://localhost:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.time() - t
    except Exception as e:
        return getattr(e, "code", -1), str(e)[:300], time.time() - t
res = []
t0 = time.time()
b64 = base64.b64encode(open(img, "rb").read()).decode()
st, js, dt = post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}, {"type": "text", "text": "Describe the image."}]}], "max_tokens": 16, "temperature": 0}, 60)
res.append(("image", st, round(dt, 2), js.get("usage") if isinstance(js, dict) else js)); print(res[-1], flush=True)
random.seed(7)
toks = [random.randrange(1000, 150000) for _ in range(261000)]
st, js, dt = post("/completion", {"prompt": toks, "n_predict": 64, "temperature": 0, "cache_prompt": False}, budget - (time.time() - t0))
res.append(("261000 + 64", st, round(dt, 2), js.get("timings") if isinstance(js, dict) else js)); print(res[-1], flush=True)
json.dump(res, open(out, "w"), indent=1, default=str)
PY
mem_poll() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $1 & echo $!; }
MP=$(mem_poll $O/mem-kiln.csv)
timeout 320 $B/kiln serve -m $P/m/27b-mtp.gguf --mmproj $P/m/mm27b.gguf -c 262144 -ctk q4_0 -ctv q4_0 --spec-type draft-mtp \
  --device-memory 24GiB --port 8090 > $O/kiln-serve.log 2>&1 &
KS=$!
for i in $(seq 120); do curl -sf localhost:8090/health > /dev/null && break; sleep 0.5; done
timeout 300 python3 $P/client.py 8090 $P/img.png $O/kiln-client.json 290
kill $KS; wait $KS 2>/dev/null; kill $MP
echo "kiln peak used $(sort -n $O/mem-kiln.csv | tail -1) MiB"
grep -E "total|usable|encoded in|prompt eval|eval time|draft" $O/kiln-serve.log | head -12
left=$(( 560 - ($(date +%s) - S) )); echo "left for llama-server: $left s"
if [ $left -gt 60 ]; then
  free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  MP=$(mem_poll $O/mem-llama.csv)
  LD_LIBRARY_PATH=$LL timeout $left $LL/llama-server -m $P/m/27b-mtp.gguf --mmproj $P/m/mm27b.gguf -c 262144 -ctk q4_0 -ctv q4_0 -fa on \
    --spec-type draft-mtp -fit on -fitt $(( free - 23552 )) --port 8091 > $O/llama-server.log 2>&1 &
  LS=$!
  for i in $(seq 120); do curl -sf localhost:8091/health > /dev/null && break; sleep 0.5; done
  timeout $(( left - 20 )) python3 $P/client.py 8091 $P/img.png $O/llama-client.json $(( left - 25 ))
  kill $LS; wait $LS 2>/dev/null; kill $MP
  echo "llama peak used $(sort -n $O/mem-llama.csv | tail -1) MiB"
  grep -E "prompt eval|eval time|draft acceptance" $O/llama-server.log | tail -4
  grep -E "prompt processing" $O/llama-server.log | tail -1
fi
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run65.tar.xz
