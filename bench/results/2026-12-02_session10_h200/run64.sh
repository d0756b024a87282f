#!/usr/bin/env bash
# Device run 64 (session 10), sm_90a: the vision encoder with chunked q|k|v / MLP and the exact arena
# (after run 62/63): test_cuda_model (CudaVision: a 2-chunk image added); image encode times (kiln
# image-embd) and the scratch measured: device memory polled while encoding a 64x64 and a 2048x2048
# (4096-token) image, the difference against the plan's image batch; kiln serve vs llama-server on one
# 1024x768 image (run 63's method); a per-op decode profile of the full 9B-shape IQ4_XS (#14 planning).
R=$PWD; S=$(date +%s); I=.gpu-run/m
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
cat $I/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
O=/tmp/o64; mkdir -p $O
( s0=$(date +%s); timeout 200 $B/test_cuda_model --gtest_brief=1 > $O/test_cuda_model.log 2>&1
  echo "test_cuda_model rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/test_cuda_model.log | tr '\n' ' ')" > $O/tests.txt ) &
T=$!
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 6 -o $P/m/mm9b.gguf &
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 4 --vocab $P/vocab.gguf --fast -q -t 4 -o $P/m/t9b.gguf &
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --fast -q -t 6 -o $P/m/9b.gguf &
python3 - $P <<'PY'
import numpy as np, struct, sys, zlib
for W, H in [(1024, 768), (448, 448), (2048, 2048), (64, 64)]:
    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:H, 0:W]
    rgb = np.clip(np.stack([x * 255 // (W - 1), y * 255 // (H - 1), (x * 7 + y * 3) % 256], -1) + rng.integers(-30, 30, (H, W, 3)), 0, 255).astype(np.uint8)
    raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(H))
    ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    open(f"{sys.argv[1]}/img-{W}x{H}.png", "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + ch(b"IDAT", zlib.compress(raw, 6)) + ch(b"IEND", b""))
PY
wait $(jobs -p | grep -v "^$T$") 2>/dev/null
wait $T; cat $O/tests.txt; grep -B2 -A6 "Failure" $O/test_cuda_model.log | head -20; grep "\[cuda-vision\]" $O/test_cuda_model.log
timeout 60 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $P/img-1024x768.png --image $P/img-448x448.png --image $P/img-2048x2048.png --repeat 5 --image-max-tokens 4096 > $O/kiln-gpu.txt 2>&1; echo "kiln gpu rc=$?"
grep -v "^I " $O/kiln-gpu.txt | tail -3
for img in 64x64 2048x2048; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > $O/mem-$img.csv & MP=$!
  timeout 60 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $P/img-$img.png --image-max-tokens 4096 > $O/mem-$img.txt 2>&1
  kill $MP; echo "image $img: peak used $(sort -n $O/mem-$img.csv | tail -1) MiB"
done
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
timeout 40 python3 $P/img.py 8092 $P/img-1024x768.png | tee $O/img-kiln.txt
kill $KS; wait $KS 2>/dev/null
LD_LIBRARY_PATH=$LL timeout 60 $LL/llama-server -m $P/m/t9b.gguf --mmproj $P/m/mm9b.gguf -ngl 99 -fa on -c 8192 --port 8093 > $O/llama-img.log 2>&1 &
LS=$!
for i in $(seq 120); do curl -sf localhost:8093/health > /dev/null && break; sleep 0.5; done
timeout 40 python3 $P/img.py 8093 $P/img-1024x768.png | tee $O/img-llama.txt
kill $LS; wait $LS 2>/dev/null
grep "encoded in" $O/kiln-img.log | tail -3
KILN_CUDA_PROFILE=1 timeout 90 $B/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 0 -n 64 -r 1 > $O/kiln-9b-tg-prof.md 2>&1
grep -E "tg64" $O/kiln-9b-tg-prof.md | head -3
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run64.tar.xz
