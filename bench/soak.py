#!/usr/bin/env python3
"""Soak test (issue #14's proof): N concurrent streaming clients for a fixed time against one server,
recording errors, tokens/s, the server's host memory and the GPU's used memory over time.

    bench/soak.py --url http://127.0.0.1:8080 --pid SERVER_PID [--clients 32] [--minutes 10]
                  [--max-tokens 128] [--every 10] [--warmup 60] [--json out.json]

Each client thread sends streaming POST /v1/completions requests one after another until the time is
up, alternating the two prompt kinds of serve_load.py (a shared long prefix: prefix-cache hits; a
unique text), every prompt different. The first --warmup seconds (the prefix cache filling to its
--cache-ram bound, the step shapes being recorded) are run but not sampled. Every --every seconds a sample: completion tokens finished in
that window / its length, requests and errors so far, the server's resident set (VmRSS of --pid) and
the device's used memory (nvidia-smi; absent without it). At the end: the table, the first and last
thirds' mean memory (flat = the last third no higher than the first by more than --slack MiB) and
the error count; exit status 1 on any error or growth.

Only the Python standard library (and serve_load.py beside it) is used.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_load import Client, prompt_set, wait_ready  # noqa: E402


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def gpu_used_mib() -> float:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return float(out[0]) if out else float("nan")
    except (OSError, subprocess.SubprocessError, ValueError):
        return float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (its VmRSS is sampled)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds of load before the first sample")
    ap.add_argument("--slack", type=float, default=64.0, help="MiB of growth still called flat")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request socket timeout (s)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    cl = Client(a.url, None, a.timeout)
    wait_ready(cl, 120.0)
    prompts = {k: prompt_set(k, 4096, seed=31 + (k == "shared")) for k in ("shared", "unique")}
    lock = threading.Lock()
    done_tokens: list[tuple[float, int]] = []  # (finish time, completion tokens)
    errors: list[str] = []
    n_req = [0]
    stop = time.perf_counter() + 60.0 * a.minutes + a.warmup

    def worker(i: int):
        j = 0
        while time.perf_counter() < stop:
            kind = "shared" if (i + j) % 2 == 0 else "unique"
            p = prompts[kind][(i * 131 + j) % 4096]
            j += 1
            try:
                r = cl.stream("", p, a.max_tokens)
                with lock:
                    done_tokens.append((r["end"], r["tokens"]))
                    n_req[0] += 1
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.clients)]
    for t in threads:
        t.start()
    time.sleep(min(a.warmup, max(0.0, stop - time.perf_counter())))
    samples = []
    last = time.perf_counter()
    while time.perf_counter() < stop:
        time.sleep(max(0.0, min(a.every, stop - time.perf_counter())))
        now = time.perf_counter()
        with lock:
            toks = sum(n for (e, n) in done_tokens if last < e <= now)
            s = {"t_s": round(now - t0, 1), "tokens_per_s": toks / (now - last) if now > last else 0.0,
                 "requests": n_req[0], "errors": len(errors)}
        s["rss_mib"], s["gpu_mib"] = rss_mib(a.pid), gpu_used_mib()
        samples.append(s)
        print(f"{s['t_s']:7.1f} s  {s['tokens_per_s']:8.1f} tok/s  requests {s['requests']:6d}  errors {s['errors']}  "
              f"RSS {s['rss_mib']:8.1f} MiB  GPU {s['gpu_mib']:8.1f} MiB", flush=True)
        last = now
    for t in threads:
        t.join(timeout=a.timeout)

    third = max(1, len(samples) // 3)

    def mean(key, part):
        xs = [x[key] for x in part if x[key] == x[key]]
        return sum(xs) / len(xs) if xs else float("nan")

    growth = {k: mean(k, samples[-third:]) - mean(k, samples[:third]) for k in ("rss_mib", "gpu_mib")}
    flat = all(not (g > a.slack) for g in growth.values())  # nan (not measured) counts as flat
    total_tokens = sum(n for _, n in done_tokens)
    wall = time.perf_counter() - t0
    result = {"clients": a.clients, "minutes": a.minutes, "max_tokens": a.max_tokens, "requests": n_req[0],
              "errors": len(errors), "error_sample": errors[:5], "completion_tokens": total_tokens,
              "tokens_per_s": total_tokens / wall, "growth_mib": growth, "flat": flat, "samples": samples}
    print(f"\n{a.clients} clients, {wall:.0f} s: {n_req[0]} requests, {len(errors)} errors, "
          f"{total_tokens / wall:.1f} tokens/s; memory last third - first third: RSS {growth['rss_mib']:+.1f} MiB, "
          f"GPU {growth['gpu_mib']:+.1f} MiB ({'flat' if flat else 'GROWING'})")
    for e in errors[:5]:
        print("  error:", e)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if not errors and flat else 1


if __name__ == "__main__":
    sys.exit(main())
