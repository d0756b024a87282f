#!/usr/bin/env python3
"""Summarises a bench/compare.sh results directory into the markdown rows of bench/RESULTS.md.

    bench/compare_report.py RESULTS_DIR

RESULTS_DIR holds <engine>-<file stem>-<round>.jsonl files (engine kiln, llamacpp, or kilnb: kiln
under compare.sh's KILN_B environment) (one JSON object per test, the
`kiln bench -o jsonl` / bench/llamacpp_bench.py format), load.txt (load average per run) and
optionally membw*.json (Google Benchmark BM_MemRead output). For every file and test it reports
the median over rounds of each engine's mean t/s, the spread (min-max of the round means), the
kiln/llama.cpp ratio of the medians and, for tg, the fraction of the measured read bandwidth
that kiln's weight streaming reaches (decode_weight_read_bytes x t/s / bandwidth).
"""
from __future__ import annotations

import collections
import json
import pathlib
import re
import statistics
import sys


def main() -> int:
    d = pathlib.Path(sys.argv[1])
    runs = collections.defaultdict(list)  # (stem, test, engine) -> [avg_ts per round]
    extra = {}  # (stem, test) -> kiln row (bytes etc.)
    for p in sorted(d.glob("*.jsonl")):
        m = re.match(r"(kilnb|kiln|llamacpp)-(.+)-(\d+)\.jsonl$", p.name)
        if not m:
            continue
        eng, stem = m.group(1), m.group(2)
        for line in p.read_text().splitlines():
            if not line.strip().startswith("{"):
                continue
            r = json.loads(line)
            runs[(stem, r["test"], eng)].append(r["avg_ts"])
            if eng == "kiln":
                extra[(stem, r["test"])] = r
    bw = None
    for mb in sorted(d.glob("membw*.json")):
        try:
            j = json.loads(mb.read_text())
        except ValueError:
            continue
        rates = [b["bytes_per_second"] for b in j.get("benchmarks", [])
                 if "bytes_per_second" in b and b.get("run_type", "iteration") == "iteration"]
        if rates:
            bw = max(rates + ([bw] if bw else []))
    has_b = any(e == "kilnb" for (_, _, e) in runs)  # compare.sh KILN_B: the same binary under another env
    print("| file | test | kiln t/s (median, range) |" + (" kiln B t/s (median, range) | kiln/B |" if has_b else "")
          + " llama.cpp t/s (median, range) | kiln/llama.cpp | kiln weight GB/s | % of mem BW |")
    print("| --- | --- | ---: |" + (" ---: | ---: |" if has_b else "") + " ---: | ---: | ---: | ---: |")
    keys = sorted({(s, t) for (s, t, _) in runs}, key=lambda k: (k[0], not k[1].startswith("pp"), k[1]))
    for stem, test in keys:
        k = runs.get((stem, test, "kiln"), [])
        l = runs.get((stem, test, "llamacpp"), [])
        km = statistics.median(k) if k else None
        lm = statistics.median(l) if l else None
        fmt = lambda xs, med: f"{med:.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "n/a"  # noqa: E731
        ratio = f"{km / lm:.2f}" if km and lm else "n/a"
        gbps = pct = ""
        e = extra.get((stem, test))
        if e and test.startswith("tg") and km:
            g = e["decode_weight_read_bytes"] * km / 1e9
            gbps = f"{g:.2f}"
            if bw:
                pct = f"{100.0 * g * 1e9 / bw:.0f}%"
        bcols = ""
        if has_b:
            b = runs.get((stem, test, "kilnb"), [])
            bm = statistics.median(b) if b else None
            bcols = f" {fmt(b, bm)} | {f'{km / bm:.2f}' if km and bm else 'n/a'} |"
        print(f"| {stem} | {test} | {fmt(k, km)} |{bcols} {fmt(l, lm)} | {ratio} | {gbps} | {pct} |")
    if bw:
        print(f"\nmeasured read bandwidth (kernels_bench BM_MemRead, best): {bw / 1e9:.2f} GB/s")
    lt = d / "load.txt"
    if lt.exists():
        loads = [float(x.split()[1]) for x in lt.read_text().splitlines() if len(x.split()) > 1]
        if loads:
            print(f"load average (1 min) at the runs: min {min(loads):.2f}, max {max(loads):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
