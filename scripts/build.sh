#!/usr/bin/env bash
# Configure (once) and build kiln in Release into the given build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
if [ ! -f "$B/CMakeCache.txt" ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release ${KILN_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$B" -j "$(nproc)"
