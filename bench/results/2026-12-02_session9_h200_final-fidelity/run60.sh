#!/usr/bin/env bash
# Device run 60 (session 9): image encode time on the H200, kiln vs llama-server, same files (#17). A
# projector of Qwen3.5-9B's size (`kiln gguf gen --mmproj --preset qwen35-9b`, F16, 27 blocks of 1152,
# out 4096) beside a 1-layer 9B-shape text model; images 1024x768 and 448x448 (generated; encode time
# does not depend on the pixels). kiln: `kiln image-embd --repeat 6` (kiln serve's encode path, GPU) and
# on the CPU; llama-server -ngl 99 --mmproj: /completion requests with the image, its log's encode times.
R=$PWD; S=$(date +%s); I=.gpu-run/i
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && cat $I/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
O=/tmp/o60; mkdir -p $O
t0=$(date +%s)
$B/kiln gguf gen --mmproj --preset qwen35-9b -t 16 -o $P/m/mm9b.gguf > $O/gen.log 2>&1 &
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 4 --n-vocab 4096 -q -t 16 -o $P/m/t9b.gguf >> $O/gen.log 2>&1 &
wait; echo "gen $(( $(date +%s) - t0 )) s"; ls -la $P/m
timeout 120 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $I/img-1024x768.png --image $I/img-448x448.png --repeat 6 > $O/kiln-gpu.txt 2>&1; echo "kiln gpu rc=$?"
timeout 200 $B/test_cuda_matmul --gtest_brief=1 > $O/test_cuda_matmul.log 2>&1; echo "test_cuda_matmul rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED)" -A3 $O/test_cuda_matmul.log
cat $O/kiln-gpu.txt | grep -v "^I " | tail -8
LD_LIBRARY_PATH=$LL $LL/llama-server -m $P/m/t9b.gguf --mmproj $P/m/mm9b.gguf -ngl 99 -fa on -c 8192 --port 8091 > $O/llama-server.log 2>&1 &
LS=$!
for i in $(seq 60); do curl -sf localhost:8091/health > /dev/null && break; sleep 1; done
python3 - $I $O <<'PY'
import base64, json, sys, time, urllib.request
I, O = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request("http://localhost:8091" + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), time.time() - t
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:300], time.time() - t
out = []
for img in ["img-1024x768.png", "img-448x448.png"]:
    b64 = base64.b64encode(open(f"{I}/{img}", "rb").read()).decode()
    for i in range(4):
        st, js, dt = post("/completion", {"prompt": {"prompt_string": "<__media__>\nDescribe the image.", "multimodal_data": [b64]},
                                         "n_predict": 1, "cache_prompt": False})
        tm = js.get("timings", {}) if isinstance(js, dict) else {}
        line = f"{img} /completion #{i}: status {st}, wall {dt*1000:.1f} ms, prompt_n {tm.get('prompt_n')}, prompt_ms {tm.get('prompt_ms')}"
        if st != 200: line += f" body {js}"
        print(line); out.append(line)
open(f"{O}/client.txt", "w").write("\n".join(out) + "\n")
PY
kill $LS; sleep 1
grep -iE "encoded in|decoded in|image|slice" $O/llama-server.log | grep -v "^$" | tail -24
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run60.tar.xz
