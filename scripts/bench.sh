#!/usr/bin/env bash
# Runs every Google Benchmark executable in <build>/bench (bench/*_bench.cpp), printing the load
# average first: on a shared machine, numbers taken under load are not comparable.
#   scripts/bench.sh [build-dir] [extra benchmark flags...]
#   KILN_CPU=scalar|avx2|avx512 and KILN_THREADS apply to the kernel benchmarks.
#   BENCH_FILTER=regex limits the benchmarks; BENCH_OUT=dir writes one JSON file per executable.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
shift || true
shopt -s nullglob
exes=("$B"/bench/*_bench)
if [ ${#exes[@]} -eq 0 ]; then
  echo "no benchmarks in $B/bench (build with -DKILN_BENCH=ON)"
  exit 1
fi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)  nproc: $(nproc)"
for exe in "${exes[@]}"; do
  name=$(basename "$exe")
  echo "== $name"
  args=()
  [ -n "${BENCH_FILTER:-}" ] && args+=("--benchmark_filter=$BENCH_FILTER")
  if [ -n "${BENCH_OUT:-}" ]; then
    mkdir -p "$BENCH_OUT"
    args+=("--benchmark_out=$BENCH_OUT/$name.json" "--benchmark_out_format=json")
  fi
  "$exe" "${args[@]}" "$@"
done
