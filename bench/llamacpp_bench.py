#!/usr/bin/env python3
"""llama.cpp's side of the comparison: llama-bench's pp/tg tests timed through llama-cpp-python's
C API (its wheel ships libllama but not the llama-bench binary). Same semantics as llama-bench
and `kiln bench`:

  pp N : N random tokens decoded with llama_batch_get_one in chunks of n_batch (n_ubatch is the
         physical batch inside llama_decode), then llama_synchronize.
  tg N : N single-token llama_decode calls from an empty sequence.
  pg P,N: both in one timing.

A warm-up run (the prompt once, one generated token) precedes the timed repetitions; the sequence
memory is cleared (llama_memory_clear) before each. n_ctx = P + N like llama-bench.
Output: the same JSON objects as `kiln bench -o json` (avg_ts, stddev_ts, samples_ts, ...), or a
markdown table.

    bench/llamacpp_bench.py -m FILE [-p 512] [-n 128] [-pg 512,128] [-r 5] [-t 2] [-b 2048]
                            [-ub 512] [-ctk f16] [-ctv f16] [-fa auto|0|1] [-o json|jsonl|md]
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import random
import statistics
import sys
import time

import llama_cpp as L

CACHE_TYPES = {"f32": L.GGML_TYPE_F32, "f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0}
FA = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "0": L.LLAMA_FLASH_ATTN_TYPE_DISABLED, "1": L.LLAMA_FLASH_ATTN_TYPE_ENABLED}

_log_cb = None


def quiet_logs() -> None:
    global _log_cb

    @L.llama_log_callback
    def cb(level, text, user_data):  # noqa: ARG001
        pass

    _log_cb = cb  # keep a reference: llama.cpp calls it later
    L.llama_log_set(_log_cb, ctypes.c_void_p(0))


class Bench:
    def __init__(self, path: str):
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.path = path
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, buf, len(buf))
        self.desc = buf.value.decode()
        self.size = L.llama_model_size(self.model)
        self.n_params = L.llama_model_n_params(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.rng = random.Random(1234)

    def context(self, n_ctx, n_batch, n_ubatch, threads, ctk, ctv, fa):
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_seq_max = 1
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.type_k = CACHE_TYPES[ctk]
        cp.type_v = CACHE_TYPES[ctv]
        cp.flash_attn_type = FA[fa]
        cp.no_perf = True
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise SystemExit(f"llama.cpp could not create a context for {self.path}")
        return ctx

    def tokens(self, n):
        return (L.llama_token * n)(*[self.rng.randrange(self.n_vocab) for _ in range(n)])

    def prompt(self, ctx, n, n_batch):
        for i in range(0, n, n_batch):
            nb = min(n_batch, n - i)
            toks = self.tokens(nb)
            if L.llama_decode(ctx, L.llama_batch_get_one(toks, nb)) != 0:
                raise SystemExit("llama_decode failed (prompt)")
        L.llama_synchronize(ctx)

    def gen(self, ctx, n):
        for _ in range(n):
            tok = self.tokens(1)
            if L.llama_decode(ctx, L.llama_batch_get_one(tok, 1)) != 0:
                raise SystemExit("llama_decode failed (gen)")
            L.llama_synchronize(ctx)


def test_name(p, n):
    if p and not n:
        return f"pp{p}"
    if n and not p:
        return f"tg{n}"
    return f"pp{p}+tg{n}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", default="512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("-pg", action="append", default=[])
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512)
    ap.add_argument("-ctk", "--cache-type-k", default="f16", choices=sorted(CACHE_TYPES))
    ap.add_argument("-ctv", "--cache-type-v", default="f16", choices=sorted(CACHE_TYPES))
    ap.add_argument("-fa", "--flash-attn", default="auto", choices=sorted(FA))
    ap.add_argument("-o", "--output", default="md", choices=["md", "json", "jsonl"])
    ap.add_argument("--no-warmup", action="store_true")
    a = ap.parse_args(argv)
    import os
    threads = a.threads or os.cpu_count() or 1

    quiet_logs()
    b = Bench(a.model)
    shapes = [(int(p), 0) for p in a.n_prompt.split(",") if int(p) > 0]
    shapes += [(0, int(n)) for n in a.n_gen.split(",") if int(n) > 0]
    for s in a.pg:
        p, n = (int(x) for x in s.split(","))
        shapes.append((p, n))
    rows = []
    if a.output == "md":
        print("| model | size | params | backend | threads | test | t/s |")
        print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for p, n in shapes:
        ctx = b.context(p + n, a.batch_size, a.ubatch_size, threads, a.cache_type_k, a.cache_type_v, a.flash_attn)
        mem = L.llama_get_memory(ctx)
        if not a.no_warmup:
            L.llama_memory_clear(mem, True)
            if p:
                b.prompt(ctx, p, a.batch_size)
            if n:
                b.gen(ctx, 1)
        samples = []
        for _ in range(a.repetitions):
            L.llama_memory_clear(mem, True)
            t0 = time.perf_counter_ns()
            if p:
                b.prompt(ctx, p, a.batch_size)
            if n:
                b.gen(ctx, n)
            samples.append(time.perf_counter_ns() - t0)
        L.llama_free(ctx)
        ts = [(p + n) * 1e9 / s for s in samples]
        row = {"model_filename": a.model, "model_type": b.desc, "model_size": b.size, "model_n_params": b.n_params,
               "backend": "CPU (llama-cpp-python " + L.__version__ + ")", "n_threads": threads,
               "n_batch": a.batch_size, "n_ubatch": a.ubatch_size, "type_k": a.cache_type_k, "type_v": a.cache_type_v,
               "flash_attn": a.flash_attn, "n_prompt": p, "n_gen": n, "test": test_name(p, n),
               "test_time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "avg_ns": int(statistics.mean(samples)),
               "stddev_ns": int(statistics.stdev(samples)) if len(samples) > 1 else 0,
               "avg_ts": statistics.mean(ts), "stddev_ts": statistics.stdev(ts) if len(ts) > 1 else 0.0,
               "samples_ns": samples, "samples_ts": ts}
        rows.append(row)
        if a.output == "md":
            print(f"| {b.desc} | {b.size / 2**20:.2f} MiB | {b.n_params / 1e6:.2f} M | CPU | {threads} | "
                  f"{row['test']} | {row['avg_ts']:.2f} ± {row['stddev_ts']:.2f} |", flush=True)
        elif a.output == "jsonl":
            print(json.dumps(row), flush=True)
    if a.output == "json":
        print(json.dumps(rows, indent=2))
    L.llama_model_free(b.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
