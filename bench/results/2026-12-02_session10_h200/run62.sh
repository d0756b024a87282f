#!/usr/bin/env bash
# Device run 62 (session 10), sm_90a build: (1) every GPU test binary at HEAD (after 7de825a's dense
# k%32 route and this session's non-causal attention / head-72 tensor-core tiles / one-run vision
# attention) and the whole fidelity table; (2) image encode time, kiln vs llama-server, same files
# (run 61's method: projector of Qwen3.5-9B's size F16, a 4-layer 9B-shape text model with the real
# Qwen3.5 tokenizer; 1024x768 and 448x448 images), plus a per-op profile of kiln's encode.
R=$PWD; S=$(date +%s); I=.gpu-run/k
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/pride.txt.xz > $P/pride.txt && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
cat $I/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $I/gguf*.whl && export PYTHONPATH=/tmp/site
O=/tmp/o62; mkdir -p $O
python3 - $P <<'PY'
import numpy as np, struct, sys, zlib
for W, H in [(1024, 768), (448, 448)]:
    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:H, 0:W]
    rgb = np.clip(np.stack([x * 255 // (W - 1), y * 255 // (H - 1), (x * 7 + y * 3) % 256], -1) + rng.integers(-30, 30, (H, W, 3)), 0, 255).astype(np.uint8)
    raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(H))
    ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    open(f"{sys.argv[1]}/img-{W}x{H}.png", "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + ch(b"IDAT", zlib.compress(raw, 6)) + ch(b"IEND", b""))
PY
( $B/kiln gguf gen --mmproj --preset qwen35-9b -t 6 -o $P/m/mm9b.gguf > $O/gen.log 2>&1 &
  $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 4 --vocab $P/vocab.gguf -q -t 6 -o $P/m/t9b.gguf >> $O/gen.log 2>&1 &
  wait ) &
G=$!
( for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_mtp test_cuda_spec; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
timeout 300 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1; echo "fidelity rc=$?"
rm -f $O/fid/*.gguf $O/fid/*.kld
wait $T; cat $O/tests.txt
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -40
grep -h "\[attn-enc\]\|\[cuda-vision\]\| D=72" $O/test_cuda_seq.log $O/test_cuda_model.log | head -30
grep -E "NO|outside" $O/fidelity.md
wait $G
timeout 100 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $P/img-1024x768.png --image $P/img-448x448.png --repeat 6 > $O/kiln-gpu.txt 2>&1; echo "kiln gpu rc=$?"
grep -v "^I " $O/kiln-gpu.txt | tail -3
KILN_CUDA_PROFILE=1 timeout 60 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $P/img-1024x768.png --repeat 2 > $O/kiln-prof.txt 2>&1
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
        return getattr(e, "code", -1), str(e)[:300], time.time() - t
out = []
for img in ["img-1024x768.png", "img-448x448.png"]:
    b64 = base64.b64encode(open(f"{P}/{img}", "rb").read()).decode()
    for i in range(4):
        st, js, dt = post("/completion", {"prompt": {"prompt_string": "<__media__>\nDescribe the image.", "multimodal_data": [b64]}, "n_predict": 1, "cache_prompt": False})
        tm = js.get("timings", {}) if isinstance(js, dict) else {}
        line = f"{img} #{i}: status {st}, wall {dt*1000:.1f} ms, prompt_n {tm.get('prompt_n')}, prompt_ms {tm.get('prompt_ms')}"
        print(line); out.append(line)
open(f"{O}/client.txt", "w").write("\n".join(out) + "\n")
PY
kill $LS; sleep 1
grep -iE "encoded in|decoded in" $O/llama-server.log | tail -10
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run62.tar.xz
