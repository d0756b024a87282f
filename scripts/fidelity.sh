#!/usr/bin/env bash
# Reruns the llama.cpp oracle tests of the model forward passes and prints the markdown tables of
# docs/fidelity.md ("llama.cpp oracle" and "Real weights"). Usage: scripts/fidelity.sh [build-dir]
#   tests/py/test_model_llamacpp.py  every arch x weight type x KV type on `kiln gguf gen` files
#   tests/py/test_model_smollm2.py   SmolLM2-135M-Instruct Q4_1: greedy, perplexity, logits
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
export KILN_BIN="$PWD/$B/bin/kiln" KILN_BUILD="$PWD/$B"
log=$(mktemp)
out=$(mktemp)
trap 'rm -f "$log" "$out"' EXIT
KILN_FIDELITY_LOG="$log" .venv/bin/python -m pytest -q -s tests/py/test_model_llamacpp.py \
  tests/py/test_model_smollm2.py >"$out" 2>&1
status=$?
tail -n 1 "$out" >&2
.venv/bin/python - "$log" "$out" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
noise = any("noise_kl" in r for r in rows)  # relative limits (hosts without AVX-512) only
print("| arch | weights | KV | positions | bit-identical | top-1 | mean KL | max abs Δ |"
      + (" llama.cpp self-noise (KL / top-1) |" if noise else "") + " limits (KL / top-1) |")
print("| --- " * (10 if noise else 9) + "|")
for r in rows:
    w = r["weights"] + (f" (chunked Δ-rule {r['delta_chunk']})" if r.get("delta_chunk") else "")
    nz = (f" {r['noise_kl']:.2e} / {100 * r['noise_top1']:.1f}% |" if "noise_kl" in r else " – |") if noise else ""
    print(f"| {r['arch']} | {w} | {r['kv']} | {r['positions']} | {100 * r['identical']:.0f}% | {100 * r['top1']:.1f}% | "
          f"{r['kl']:.2e} | {r['max_abs']:.3g} |{nz} {r['kl_limit']:.2e} / {100 * r['top1_limit']:.1f}% |")
text = open(sys.argv[2]).read()
print()
for pat in (r"FIDELITY_PPL .*", r"FIDELITY_SMOL\S* .*"):
    for m in re.findall(pat, text):
        print("- " + m.split(" ", 1)[1])
for m in re.findall(r"(test_greedy\S+) (PASSED|FAILED|XFAIL|XPASS)", text):
    print(f"- {m[0]}: {m[1]}")
PY
exit $status
