#!/usr/bin/env bash
# Runs the whole suite: C++ tests (CTest/GoogleTest) then Python oracle tests (pytest in .venv).
# Prints one closing line: "N passed, N failed, N skipped". KILN_ONLY=cpp|py runs one half.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
export KILN_BIN="$PWD/$B/bin/kiln" KILN_BUILD="$PWD/$B" KILN_SOURCE_DIR="$PWD"
mkdir -p "$B/test-artifacts"
pass=0 fail=0 skip=0

if [ "${KILN_ONLY:-cpp}" != py ] || [ -z "${KILN_ONLY:-}" ]; then
  log="$B/test-artifacts/ctest.log"
  ctest --test-dir "$B" -j "$(nproc)" --output-on-failure --timeout 600 2>&1 | tee "$log"
  # GoogleTest skips show as "Skipped" in CTest's summary.
  total=$(grep -Eo 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | grep -Eo '[0-9]+$' || echo 0)
  failed=$(grep -Eo '[0-9]+ tests failed out of' "$log" | grep -Eo '^[0-9]+' || echo 0)
  skipped=$(grep -c '\*\*\*Skipped' "$log" || true)
  pass=$((pass + total - failed - skipped)); fail=$((fail + failed)); skip=$((skip + skipped))
fi

if [ "${KILN_ONLY:-py}" != cpp ] || [ -z "${KILN_ONLY:-}" ]; then
  log="$B/test-artifacts/pytest.log"
  .venv/bin/python -m pytest -q -rs tests/py 2>&1 | tee "$log"
  last=$(tail -n 1 "$log")
  p=$(echo "$last" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+' || echo 0)
  f=$(echo "$last" | grep -Eo '[0-9]+ (failed|error|errors)' | awk '{s+=$1} END {print s+0}')
  s=$(echo "$last" | grep -Eo '[0-9]+ skipped' | grep -Eo '[0-9]+' || echo 0)
  [ -n "$f" ] || f=0
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
  if [ "$p" = 0 ] && [ "$f" = 0 ]; then echo "pytest ran no test"; fail=$((fail + 1)); fi
fi

echo
echo "kiln: $pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
