#!/usr/bin/env bash
# Side by side on a CUDA machine: `kiln bench -ngl all` and llama.cpp's llama-bench (-ngl 99 -fa 1)
# on the same `kiln gguf gen` files, plus the device's measured copy bandwidth (torch, when present)
# for the decode roofline. Raw JSON of both engines into OUTDIR (bench/results/ names them by date,
# commit and machine); prints one markdown table.
#
#   scripts/gpu_bench.sh KILN LLAMA_DIR OUTDIR [SPEC...]     SPEC = preset:mix|type, e.g. qwen35-9b:iq4_xs
# env: REPS (3), PP (512,2048), TG (128), MODELS_DIR (where generated files are kept; default OUTDIR),
#      GEN_FLAGS (extra `kiln gguf gen` flags, e.g. --fast for full-size files at disk speed)
set -uo pipefail
KILN=$1 LLAMA=$2 OUT=$3
shift 3
SPECS=("$@")
[ ${#SPECS[@]} -gt 0 ] || SPECS=(qwen35-9b:iq4_xs)
REPS=${REPS:-3} PP=${PP:-512,2048} TG=${TG:-128}
MD=${MODELS_DIR:-$OUT}
mkdir -p "$OUT" "$MD"

bw=$(python3 - <<'PY' 2>/dev/null
import torch
n = 1 << 30  # 1 Gi floats (4 GiB) per buffer
a = torch.empty(n, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print(f"{2 * 4 * n * 10 / (s.elapsed_time(e) / 1e3) / 1e9:.0f}")  # GB/s, bytes read + written
PY
)
echo "device copy bandwidth: ${bw:-unknown} GB/s (read + write)" | tee "$OUT/bandwidth.txt"

for spec in "${SPECS[@]}"; do
  preset=${spec%%:*} q=${spec#*:}
  f=$MD/$preset-$q.gguf
  if [ ! -f "$f" ]; then
    t0=$(date +%s)
    case $q in
      q4_k_m|iq4_xs) "$KILN" gguf gen --preset "$preset" --mix "$q" ${GEN_FLAGS:-} -q -o "$f" ;;
      *) "$KILN" gguf gen --preset "$preset" --type "$q" ${GEN_FLAGS:-} -q -o "$f" ;;
    esac
    echo "generated $f in $(( $(date +%s) - t0 )) s"
  fi
  "$KILN" bench -m "$f" -ngl all -fa on -p "$PP" -n "$TG" -r "$REPS" -o json > "$OUT/kiln-$preset-$q.json" \
    2> "$OUT/kiln-$preset-$q.err" || echo "kiln bench failed on $f (see kiln-$preset-$q.err)"
  "$LLAMA/llama-bench" -m "$f" -ngl 99 -fa 1 -p "$PP" -n "$TG" -r "$REPS" -o json > "$OUT/llama-$preset-$q.json" \
    2> "$OUT/llama-$preset-$q.err" || echo "llama-bench failed on $f"
done

python3 - "$OUT" "${bw:-0}" <<'PY'
import glob, json, os, sys
out, bw = sys.argv[1], float(sys.argv[2])
print("| model | test | kiln t/s | llama.cpp t/s | ratio | kiln % of copy roofline |")
print("| --- | --- | --- | --- | --- | --- |")
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return []
for kp in sorted(glob.glob(os.path.join(out, "kiln-*.json"))):
    stem = os.path.basename(kp)[5:-5]
    k, l = load(kp), load(os.path.join(out, f"llama-{stem}.json"))
    lt = {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in l}
    for r in k:
        key = (r["n_prompt"], r["n_gen"])
        name = f"pp{key[0]}" if key[1] == 0 else f"tg{key[1]}"
        ref = lt.get(key)
        roof = ""
        if key[0] == 0 and bw > 0 and r.get("decode_weight_read_bytes"):
            # Roofline: the decode weights read once per token at the copy's measured traffic rate.
            roof = f"{100 * r['avg_ts'] * r['decode_weight_read_bytes'] / (bw * 1e9):.0f} %"
        print(f"| {stem} | {name} | {r['avg_ts']:.1f} | {ref:.1f} | {r['avg_ts'] / ref:.2f}x | {roof} |" if ref else
              f"| {stem} | {name} | {r['avg_ts']:.1f} | – | – | {roof} |")
PY
