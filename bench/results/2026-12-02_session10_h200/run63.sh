#!/usr/bin/env bash
# Device run 63 (session 10), sm_90a build (the same binaries as run 62):
# (1) full-size rows (#14): 9B-shape IQ4_XS and 27B-shape Q4_K_M, written with `kiln gguf gen --fast`
#     (full size at disk speed), kiln bench vs llama-bench, pp512 / pp2048 / tg128, + copy bandwidth;
# (2) the capped 8 GiB run (#15): 9B-shape IQ4_XS with its MTP block and the real Qwen3.5 tokenizer,
#     the projector of Qwen3.5-9B's size, 64K context (q8_0 cache: the plan's all-GPU choice), an image,
#     a 64,000-token prompt and 256 greedy tokens drafted with MTP; device memory polled every 100 ms
#     (nvidia-smi memory.used, the driver's count) against the startup plan; then llama-server on the same
#     files fitted to the same 8 GiB (-fitt = free memory - 7168 MiB) with the same requests.
R=$PWD; S=$(date +%s); I=.gpu-run/l
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
cat $I/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
O=/tmp/o63; mkdir -p $O
( for t in test_cuda_seq test_cuda_model; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
t0=$(date +%s)
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --fast -q -t 8 -o $P/m/9b.gguf &
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --fast -q -t 8 -o $P/m/27b.gguf &
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b-mtp.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 8 -o $P/m/mm9b.gguf &
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 4 --vocab $P/vocab.gguf --fast -q -t 4 -o $P/m/t9b.gguf &
wait $(jobs -p | grep -v "^$T$") 2>/dev/null; echo "gen $(( $(date +%s) - t0 )) s"; ls -la $P/m > $O/files.txt
wait $T; cat $O/tests.txt
grep -B2 -A6 "Failure" $O/test_cuda_*.log | head -30
grep -h "\[attn-enc\]\|\[cuda-vision\]\|D=72" $O/test_cuda_seq.log $O/test_cuda_model.log | head -30
python3 - <<'PY' > $O/bandwidth.txt 2>&1
import torch
n = 1 << 30
a = torch.empty(n, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print(f"{2 * 4 * n * 10 / (s.elapsed_time(e) / 1e3) / 1e9:.0f} GB/s copy (read + write)")
PY
cat $O/bandwidth.txt
for m in 9b 27b; do
  timeout 100 $B/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 512,2048 -n 128 -r 2 > $O/kiln-$m.md 2> $O/kiln-$m.err
  LD_LIBRARY_PATH=$LL timeout 120 $LL/llama-bench -m $P/m/$m.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 2 > $O/llama-$m.md 2> $O/llama-$m.err
  for f in kiln-$m llama-$m; do echo "$f: $(grep -E '\| +(pp512|pp2048|tg128) +\|' $O/$f.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"; done
done
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
cat > $P/client.py <<'PY'
import base64, json, sys, time, urllib.request
port, img, out = sys.argv[1], sys.argv[2], sys.argv[3]
def post(path, body, timeout=300):
    req = urllib.request.Request(f"http://localhost:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.time() - t
    except Exception as e:
        body = getattr(e, "read", lambda: b"")()
        return getattr(e, "code", -1), (str(e) + " " + body[:400].decode(errors="replace")), time.time() - t
res = []
b64 = base64.b64encode(open(img, "rb").read()).decode()
st, js, dt = post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}, {"type": "text", "text": "Describe the image."}]}], "max_tokens": 32, "temperature": 0})
res.append(("image", st, round(dt, 2), js.get("usage") if isinstance(js, dict) else js))
import random
random.seed(7)
toks = [random.randrange(1000, 150000) for _ in range(64000)]
st, js, dt = post("/completion", {"prompt": toks, "n_predict": 256, "temperature": 0, "cache_prompt": False, "ignore_eos": True})
tm = js.get("timings") if isinstance(js, dict) else js
res.append(("64000 + 256", st, round(dt, 2), tm))
for r in res: print(r)
json.dump(res, open(out, "w"), indent=1, default=str)
PY
mem_poll() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 100 > $1 & echo $!; }
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
MP=$(mem_poll $O/mem-kiln.csv)
timeout 200 $B/kiln serve -m $P/m/9b-mtp.gguf --mmproj $P/m/mm9b.gguf -c 65536 -ctk q8_0 -ctv q8_0 --spec-type draft-mtp \
  --device-memory 8GiB --port 8090 > $O/kiln-serve.log 2>&1 &
KS=$!
for i in $(seq 120); do curl -sf localhost:8090/health > /dev/null && break; sleep 0.5; done
timeout 150 python3 $P/client.py 8090 $P/img.png $O/kiln-client.json
curl -s localhost:8090/metrics > $O/kiln-metrics.txt
kill $KS; wait $KS 2>/dev/null; kill $MP
free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
MP=$(mem_poll $O/mem-llama.csv)
LD_LIBRARY_PATH=$LL timeout 200 $LL/llama-server -m $P/m/9b-mtp.gguf --mmproj $P/m/mm9b.gguf -c 65536 -ctk q8_0 -ctv q8_0 -fa on \
  --spec-type draft-mtp -fit on -fitt $(( free - 7168 )) --port 8091 > $O/llama-server.log 2>&1 &
LS=$!
for i in $(seq 120); do curl -sf localhost:8091/health > /dev/null && break; sleep 0.5; done
timeout 150 python3 $P/client.py 8091 $P/img.png $O/llama-client.json
kill $LS; wait $LS 2>/dev/null; kill $MP
# Image encode side by side (#17): the 4-layer text model and the same projector, 4 chat requests with a
# 1024x768 image each; both engines' timings.prompt_ms (image encode + 790 prompt tokens of 4 layers).
cat > $P/img.py <<'PY'
import base64, json, sys, time, urllib.request
port, img = sys.argv[1], sys.argv[2]
b64 = base64.b64encode(open(img, "rb").read()).decode()
for i in range(4):
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}, {"type": "text", "text": "Describe."}]}], "max_tokens": 1, "cache_prompt": False}
    req = urllib.request.Request(f"http://localhost:{port}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            js = json.loads(r.read()); st = r.status
    except Exception as e:
        js, st = {}, str(e)[:200]
    tm = js.get("timings", {})
    print(f"port {port} #{i}: status {st}, wall {(time.time() - t) * 1000:.1f} ms, prompt_n {tm.get('prompt_n')}, prompt_ms {tm.get('prompt_ms')}")
PY
timeout 60 $B/kiln serve -m $P/m/t9b.gguf --mmproj $P/m/mm9b.gguf -ngl all -c 8192 --port 8092 > $O/kiln-img.log 2>&1 &
KS=$!
for i in $(seq 120); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.5; done
timeout 40 python3 $P/img.py 8092 $P/img.png | tee $O/img-kiln.txt
kill $KS; wait $KS 2>/dev/null
LD_LIBRARY_PATH=$LL timeout 60 $LL/llama-server -m $P/m/t9b.gguf --mmproj $P/m/mm9b.gguf -ngl 99 -fa on -c 8192 --port 8093 > $O/llama-img.log 2>&1 &
LS=$!
for i in $(seq 120); do curl -sf localhost:8093/health > /dev/null && break; sleep 0.5; done
timeout 40 python3 $P/img.py 8093 $P/img.png | tee $O/img-llama.txt
kill $LS; wait $LS 2>/dev/null
echo "baseline used $base MiB, free before llama-server $free MiB"
for e in kiln llama; do echo "$e peak used $(cut -d, -f1 $O/mem-$e.csv | sort -n | tail -1) MiB (- baseline $base)"; done
grep -A20 "memory plan" $O/kiln-serve.log | head -24
grep -iE "fit|offload|layers|error|draft" $O/llama-server.log | head -20
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run63.tar.xz
