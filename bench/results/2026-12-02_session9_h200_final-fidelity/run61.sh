#!/usr/bin/env bash
# Device run 61 (session 9): image encode time, kiln vs llama-server, same files (#17): the projector of
# Qwen3.5-9B's size (kiln gguf gen --mmproj --preset qwen35-9b, F16) and a 4-layer 9B-shape text model with
# the real Qwen3.5 tokenizer (llama-server's mtmd must tokenize its image markers); a 1024x768 image
# (generated here; encode time does not depend on the pixels) and a 448x448 one.
R=$PWD; S=$(date +%s); I=.gpu-run/j
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && cat $I/llama-*.part-0* | xz -d | tar x -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
O=/tmp/o61; mkdir -p $O
python3 - $P <<'PY'
import numpy as np, struct, sys, zlib
W, H = 1024, 768
rng = np.random.default_rng(1)
y, x = np.mgrid[0:H, 0:W]
rgb = np.clip(np.stack([x * 255 // (W - 1), y * 255 // (H - 1), (x * 7 + y * 3) % 256], -1) + rng.integers(-30, 30, (H, W, 3)), 0, 255).astype(np.uint8)
raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(H))
ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
open(sys.argv[1] + "/img-1024x768.png", "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + ch(b"IDAT", zlib.compress(raw, 6)) + ch(b"IEND", b""))
PY
cp $I/img-448x448.png $P/
$B/kiln gguf gen --mmproj --preset qwen35-9b -t 16 -o $P/m/mm9b.gguf > $O/gen.log 2>&1 &
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 4 --vocab $P/vocab.gguf -q -t 16 -o $P/m/t9b.gguf >> $O/gen.log 2>&1 &
wait
timeout 120 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $P/img-1024x768.png --image $P/img-448x448.png --repeat 6 > $O/kiln-gpu.txt 2>&1; echo "kiln gpu rc=$?"
grep -v "^I " $O/kiln-gpu.txt | tail -3
LD_LIBRARY_PATH=$LL $LL/llama-server -m $P/m/t9b.gguf --mmproj $P/m/mm9b.gguf -ngl 99 -fa on -c 8192 --port 8091 --chat-template chatml > $O/llama-server.log 2>&1 &
LS=$!
for i in $(seq 90); do curl -sf localhost:8091/health > /dev/null && break; sleep 1; done
python3 - $P $O <<'PY'
import base64, json, sys, time, urllib.request
P, O = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request("http://localhost:8091" + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), time.time() - t
    except Exception as e:
        return getattr(e, "code", -1), str(getattr(e, "read", lambda: b"")()[:300]), time.time() - t
out = []
for img in ["img-1024x768.png", "img-448x448.png"]:
    b64 = base64.b64encode(open(f"{P}/{img}", "rb").read()).decode()
    for i in range(4):
        st, js, dt = post("/completion", {"prompt": {"prompt_string": "<__media__>\nDescribe the image.", "multimodal_data": [b64]}, "n_predict": 1, "cache_prompt": False})
        if st != 200:
            st, js, dt = post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}, {"type": "text", "text": "Describe."}]}], "max_tokens": 1, "cache_prompt": False})
        tm = js.get("timings", {}) if isinstance(js, dict) else {}
        line = f"{img} #{i}: status {st}, wall {dt*1000:.1f} ms, prompt_n {tm.get('prompt_n')}, prompt_ms {tm.get('prompt_ms')}" + ("" if st == 200 else f" body {js}")
        print(line); out.append(line)
open(f"{O}/client.txt", "w").write("\n".join(out) + "\n")
PY
kill $LS; sleep 1
grep -iE "encoded in|decoded in|image_tokens|n_tokens" $O/llama-server.log | tail -20
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run61.tar.xz
