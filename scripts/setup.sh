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
# llama-cpp-python: a CPU build of llama.cpp for this machine's vector ISA, named flag by flag from
# /proc/cpuinfo rather than GGML_NATIVE: a native build on an AMX host compiles llama.cpp's AMX kernels,
# which die with SIGILL where the kernel does not grant AMX tiles (seen on this project's CI-class
# hosts). The flags are part of the stamp, so a .venv built otherwise is rebuilt once.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
ggml_isa="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c)"
ggml_isa+=" -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512_vbmi) -DGGML_AVX512_VNNI=$(has avx512_vnni)"
ggml_isa+=" -DGGML_AVX512_BF16=$(has avx512_bf16) -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_BMI2=$(has bmi2)"
ggml_isa+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
llama_args="${CMAKE_ARGS:-$ggml_isa -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
stamp=.venv/.kiln-requirements.sha
want=$( (cat scripts/requirements.txt; echo "$llama_args") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python test tools into .venv (llama-cpp-python builds llama.cpp from source, several minutes on 2 cores)"
  .venv/bin/pip install -q --upgrade pip
  export CMAKE_ARGS="$llama_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
  # No wheel cache: pip keys llama-cpp-python's built wheel by version only, not by CMAKE_ARGS.
  .venv/bin/pip install -q --no-cache-dir -r scripts/requirements.txt
  if [ -f "$stamp" ]; then  # built before with other flags (or requirements): llama.cpp again
    .venv/bin/pip install -q --force-reinstall --no-deps --no-cache-dir \
      "$(grep -io '^llama-cpp-python==[^ ]*' scripts/requirements.txt)"
  fi
  echo "$want" > "$stamp"
fi
