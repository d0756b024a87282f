#!/usr/bin/env python3
"""Tokenization speed: kiln vs llama.cpp (llama-cpp-python) on Pride and Prejudice.

Usage: .venv/bin/python bench/tokenizer_speed.py [--kiln build/bin/kiln] [--iters 5]
Needs r-cran-janeaustenr (Rscript) and ../shared/data/vocab. Prints a Markdown table; both
sides are timed in-process (kiln: `kiln tokenize --bench`, best of N; llama.cpp: best of N
calls of Llama.tokenize). Token counts are printed so equal work can be checked.
"""
import argparse
import pathlib
import re
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def austen() -> pathlib.Path:
    p = ROOT / ".cache" / "tokenizer-oracle" / "prideprejudice.txt"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["Rscript", "-e", f'library(janeaustenr); writeLines(prideprejudice, "{p}")'], check=True)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=str(ROOT / "build" / "bin" / "kiln"))
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    import llama_cpp

    text_path = austen()
    data = text_path.read_bytes()
    vocabs = ["qwen35", "llama-bpe", "llama-spm"]
    print(f"text: {text_path.name}, {len(data)} bytes; best of {args.iters}\n")
    print("| vocab | tokens | kiln s | kiln tok/s | llama.cpp s | llama.cpp tok/s | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for v in vocabs:
        g = ROOT.parent / "shared" / "data" / "vocab" / f"ggml-vocab-{v}.gguf"
        r = subprocess.run([args.kiln, "tokenize", "-m", str(g), "-f", str(text_path), "--bench", "--bench-iters",
                            str(args.iters), "--add-bos", "off"], capture_output=True, text=True, check=True)
        m = re.search(r"-> (\d+) tokens, best of \d+: ([0-9.]+) s", r.stderr)
        k_tok, k_s = int(m.group(1)), float(m.group(2))
        llm = llama_cpp.Llama(model_path=str(g), vocab_only=True, verbose=False)
        best = 1e9
        for _ in range(args.iters):
            t0 = time.perf_counter()
            ids = llm.tokenize(data, add_bos=False, special=True)
            best = min(best, time.perf_counter() - t0)
        assert len(ids) == k_tok, (v, len(ids), k_tok)
        print(f"| {v} | {k_tok} | {k_s:.3f} | {k_tok / k_s:,.0f} | {best:.3f} | {len(ids) / best:,.0f} | {best / k_s:.1f}x |")


if __name__ == "__main__":
    main()
