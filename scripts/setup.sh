#!/usr/bin/env bash
# Installs what kiln needs to build and test, idempotently:
#   - Debian -dev packages (apt-get), only those missing;
#   - Python test tools into the project-local virtual environment .venv (pip),
#     only when scripts/requirements.txt changed since the last successful install.
# Usage: scripts/setup.sh [--no-python]
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PKGS=(
  build-essential cmake pkg-config git
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev
  libstb-dev libwebp-dev libexif-dev  # images in (src/media): stb_image, WebP, EXIF orientation
  clang libclang-rt-14-dev python3-venv
  r-cran-janeaustenr fortunes-zh  # tokenizer oracle corpus: English prose (via Rscript), Chinese text
  libjs-markdown-it libjs-highlight.js libjs-katex  # web UI libraries, embedded at build time (webui/)
  chromium  # headless browser for the web UI tests (tests/py/test_webui.py)
)

missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "${1:-}" = "--no-python" ] && exit 0

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.kiln-requirements.sha
want=$(sha256sum scripts/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python test tools into .venv (llama-cpp-python builds llama.cpp from source once; pip caches the wheel)"
  .venv/bin/pip install -q --upgrade pip
  # llama-cpp-python: CPU build of llama.cpp, native ISA of this machine.
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    .venv/bin/pip install -q -r scripts/requirements.txt
  echo "$want" > "$stamp"
fi
