#!/bin/bash
# kernels_bench mat-vec rows, KILN_DYNAMIC_ROWS=1 / 0 alternating per round, load logged per run.
# usage (repo root): R=OUTDIR kernels_ab.sh PREFIX "ROUNDS" "THREADS"   e.g. kernels "1 2 3" "1 2"
cd "$(git rev-parse --show-toplevel)"
R=${R:-bench/results/2026-12-06_cpu-sched}
mkdir -p "$R"
F='BM_Matvec/(1|4)/4096/|BM_MatvecVocab/(1|4)/|BM_MatvecL2/(1|4)/'
P=$1
for r in $2; do
  for T in $3; do
    if [ $((r % 2)) -eq 1 ]; then order="1 0"; else order="0 1"; fi
    for d in $order; do
      echo "$P dyn=$d T=$T round=$r $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/$P-load.txt
      KILN_DYNAMIC_ROWS=$d KILN_THREADS=$T build/bench/kernels_bench --benchmark_filter="$F" --benchmark_format=json > $R/$P-dyn$d-t$T-r$r.json 2>/dev/null
    done
  done
done
