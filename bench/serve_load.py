#!/usr/bin/env python3
"""Serving load test for any OpenAI-compatible server (kiln serve, llama.cpp's llama-server,
llama-cpp-python's server): N concurrent streaming clients over a fixed prompt set.

    bench/serve_load.py --url http://127.0.0.1:8080 [--clients 1,4,16,32] [--requests 2]
                        [--max-tokens 64] [--kind shared,unique] [--json out.json]

For every N in --clients and every prompt kind, N client threads each send --requests streaming
POST /v1/completions requests one after another (temperature 0, ignore_eos, max_tokens fixed), so N
requests are in flight at once. Prompt kinds:
  shared  a long common prefix (~1.5k characters) + a short unique suffix (exercises prefix caching)
  unique  a distinct text per request (no reuse possible)
Per (N, kind) it reports: time to first token (TTFT) p50/p99, inter-token latency (ITL, gaps
between streamed content chunks) p50/p99, completion tokens / wall time (total tokens/s),
requests and errors. Completion tokens come from the final `usage` when the server sends one
(stream_options.include_usage), otherwise from the number of content chunks (one token each).

Only the Python standard library is used, so it runs anywhere the server is reachable.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("river stone lantern orchard copper meadow signal harbor violet engine winter quartz "
         "falcon thread summit canyon ember glacier mosaic pepper saddle timber velvet walnut "
         "anchor beacon cinder dune fable garnet hollow island jasper kettle ledger marble").split()

SHARED_PREFIX = (
    "You are a careful assistant working for a small museum of industrial history. The museum "
    "keeps records of steam engines, looms, printing presses and early electrical equipment. "
    "Answer visitors' questions briefly and accurately; when you do not know, say so. Use plain "
    "language, avoid jargon, and prefer concrete examples from the collection: the 1852 beam "
    "engine from the river mill, the Jacquard loom with its punched cards, the Columbian hand "
    "press, the Gramme dynamo and the arc lamps from the old harbor. Visitors range from school "
    "children to retired engineers, so adjust the depth of the answer to the question. Opening "
    "hours are nine to five, Tuesday to Sunday; the workshop demonstrations run at eleven and "
    "three. The cafe is on the ground floor and the library on the second floor, next to the "
    "archive of photographs and drawings. Photography without flash is allowed everywhere except "
    "in the archive. Groups larger than twelve people should book in advance. ") * 2


def prompt_set(kind: str, n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(40))
        if kind == "shared":
            out.append(f"{SHARED_PREFIX}\nVisitor {i}: tell me about the {words[:60]}.\nAssistant:")
        else:
            out.append(f"Request {i}. Continue this list of words with more of the same kind: {words}")
    return out


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Client:
    def __init__(self, url: str, api_key: str | None, timeout: float):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.base = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def stream(self, model: str, prompt: str, max_tokens: int) -> dict:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        c = self.conn()
        t0 = time.perf_counter()
        c.request("POST", self.base + "/v1/completions", body=json.dumps(body), headers=headers)
        r = c.getresponse()
        if r.status != 200:
            msg = r.read()[:300].decode("utf-8", "replace")
            c.close()
            raise RuntimeError(f"HTTP {r.status}: {msg}")
        stamps: list[float] = []
        usage_tokens = None
        buf = b""
        done = False
        while not done:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            now = time.perf_counter()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    usage_tokens = ev["usage"].get("completion_tokens")
                for ch in ev.get("choices") or []:
                    if ch.get("text"):
                        stamps.append(now)
        c.close()
        if not stamps:
            raise RuntimeError("stream ended without any content")
        return {"t0": t0, "stamps": stamps, "tokens": usage_tokens if usage_tokens else len(stamps),
                "end": time.perf_counter()}


def run_level(cl: Client, model: str, kind: str, n_clients: int, per_client: int, max_tokens: int) -> dict:
    prompts = prompt_set(kind, n_clients * per_client, seed=1000 * n_clients + (kind == "shared"))
    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(n_clients)

    def worker(i: int):
        start.wait()
        for j in range(per_client):
            try:
                res = cl.stream(model, prompts[i * per_client + j], max_tokens)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r["stamps"][0] - r["t0"] for r in results]
    itl = [b - a for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    tokens = sum(r["tokens"] for r in results)
    return {"clients": n_clients, "kind": kind, "requests": len(results), "errors": len(errors),
            "error_sample": errors[:3], "wall_s": wall, "completion_tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99)}


def wait_ready(cl: Client, timeout: float) -> None:
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        try:
            # llama-server and kiln: /health (503 while loading); llama-cpp-python's server has
            # no /health, so a 404 there falls back to /v1/models.
            for path in ("/health", "/v1/models"):
                c = cl.conn()
                c.request("GET", cl.base + path)
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return
                last = f"GET {path}: HTTP {r.status}"
                if r.status != 404:
                    break
        except OSError as e:
            last = str(e)
        time.sleep(0.5)
    raise SystemExit(f"server at {cl.host}:{cl.port} not ready after {timeout:.0f} s ({last})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", default="", help="model name sent in requests (optional)")
    ap.add_argument("--clients", default="1,4,16,32", help="comma list of concurrency levels")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kind", default="shared,unique", help="prompt kinds: shared, unique")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request socket timeout (s)")
    ap.add_argument("--wait", type=float, default=120.0, help="wait this long for GET /health (or /v1/models) to be 200")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--label", default="", help="engine name printed in the table")
    a = ap.parse_args(argv)

    cl = Client(a.url, a.api_key, a.timeout)
    wait_ready(cl, a.wait)
    kinds = [k for k in a.kind.split(",") if k]
    for k in kinds:
        if k not in ("shared", "unique"):
            ap.error(f"--kind {k}: expected shared or unique")
    levels = [int(x) for x in a.clients.split(",") if x]
    # One untimed request so model load / first-touch effects stay out of the numbers.
    try:
        cl.stream(a.model, "warm-up", 4)
    except Exception as e:  # noqa: BLE001
        print(f"warm-up request failed: {e}", file=sys.stderr)
        return 1
    rows = []
    label = a.label or a.url
    print(f"| engine | clients | prompts | requests | errors | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tokens/s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in levels:
        for k in kinds:
            r = run_level(cl, a.model, k, n, a.requests, a.max_tokens)
            r["engine"] = label
            rows.append(r)
            print(f"| {label} | {n} | {k} | {r['requests']} | {r['errors']} | {r['ttft_p50_ms']:.1f} | "
                  f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} | {r['tokens_per_s']:.2f} |",
                  flush=True)
            for e in r["error_sample"]:
                print(f"  error: {e}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
