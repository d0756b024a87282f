"""kiln's forward passes checked against llama.cpp (llama-cpp-python) on the same GGUF files.

Every architecture (llama, qwen3, qwen35, qwen35moe) x weight types (F32, F16, BF16, Q8_0, Q4_0, Q4_K,
the IQ4_XS mix) x KV-cache types (F16, Q8_0, Q4_0; llama.cpp with flash attention) on random-weight
files from `kiln gguf gen`, >= 1000 positions per configuration (4 sequences of 256 random tokens,
decoded by kiln as one multi-sequence batch stream in prefill chunks of 64).

Criteria (the issue's bounds: top-1 agreement >= 99.5% and mean KL(llama.cpp || kiln) <= 1e-3):
- kiln's kernels follow the arithmetic of llama.cpp 0.3.36's CPU backend on AVX-512 hosts
  (docs/fidelity.md): activation rounding, dot and mat-mul orders, flash attention, the Hadamard
  rotation of quantized caches. Every configuration is held to the issue's bounds there (all are
  bit-identical but kiln's own chunked delta-rule prefill, which is at float noise).
- F32 weights with an F16 cache hold them on every host (neither engine rounds activations).
- On hosts without AVX-512 (other ggml code paths, not reproduced) the rest keep limits relative to llama.cpp's own
  rounding noise: these tiny random models amplify any 1-ulp difference through the 8-bit
  activation roundings (llama.cpp's own Q4_K file vs its F32 file: top-1 15-90%). The noise scale is
  llama.cpp(this file/KV) vs llama.cpp(F32 file, F16 KV): (noise_kl, noise_top1); kiln must satisfy
  KL <= max(1e-3, 2.5 * noise_kl) and top-1 >= min(99.5%, 1 - 2.5 * (1 - noise_top1)).
The measured numbers are printed (and collected by scripts/fidelity.sh into docs/fidelity.md).
"""
import json
import os
import subprocess

import numpy as np
import pytest
from ggml_host import avx512_host
from conftest import NGL_ARGS

llama_cpp = pytest.importorskip("llama_cpp")

N_SEQ, SEQ_LEN = 4, 256
KV_IDS = {"f16": 1, "q8_0": 8, "q4_0": 2}

ARCHS = ["llama", "qwen3", "qwen35", "qwen35moe"]
WEIGHTS = {  # name -> kiln gguf gen args
    "F32": ["--type", "F32"],
    "F16": ["--type", "F16"],
    "BF16": ["--type", "BF16"],
    "Q8_0": ["--type", "Q8_0"],
    "Q4_K": ["--type", "Q4_K"],
    "Q4_0": ["--type", "Q4_0"],
    "IQ4_XS-mix": ["--mix", "iq4_xs"],
}
# (arch, weights, kv, delta_chunk): delta_chunk > 0 runs kiln's chunked gated-delta prefill.
CONFIGS = [(a, w, "f16", 0) for a in ARCHS for w in WEIGHTS] + \
          [(a, "F32", "f16", 16) for a in ("qwen35", "qwen35moe")] + \
          [(a, "F32", kv, 0) for a in ARCHS for kv in ("q8_0", "q4_0")] + \
          [(a, "Q4_K", "q8_0", 0) for a in ARCHS]



def log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def compare(ref, got):
    p, q = log_softmax(ref), log_softmax(got)
    kl = (np.exp(p) * (p - q)).sum(axis=1)
    return float((ref.argmax(1) == got.argmax(1)).mean()), float(kl.mean()), float(np.abs(ref - got).max())


@pytest.fixture(scope="module")
def files(kiln_bin, work_dir):
    cache = {}

    def get(arch, wt):
        key = (arch, wt)
        if key not in cache:
            out = work_dir / f"{arch}-{wt}.gguf"
            cmd = [str(kiln_bin), "gguf", "gen", "-q", "--preset", f"tiny-{arch}", "-o", str(out), *WEIGHTS[wt]]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            cache[key] = out
        return cache[key]
    return get


def sequences(n_vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, SEQ_LEN).tolist() for _ in range(N_SEQ)]


_ref_cache = {}


def llama_logits(path, seqs, kv):
    key = (str(path), kv)
    if key not in _ref_cache:
        m = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=SEQ_LEN, n_batch=SEQ_LEN, n_threads=2,
                            verbose=False, flash_attn=True, type_k=KV_IDS[kv], type_v=KV_IDS[kv])
        rows = []
        for s in seqs:
            m.reset()
            m.eval(s)
            rows.append(np.array(m.scores[:len(s)], dtype=np.float64))
        _ref_cache[key] = np.concatenate(rows)
        del m
    return _ref_cache[key]


def kiln_logits(kiln_bin, path, seqs, kv, out, extra=()):
    toks = ";".join(",".join(map(str, s)) for s in seqs)
    cmd = [str(kiln_bin), "logits", "-m", str(path), "--tokens", toks, "-o", str(out), "-c", str(SEQ_LEN),
           "-ctk", kv, "-ctv", kv, "--chunk", "64", "-t", "2", *NGL_ARGS, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(out).astype(np.float64)


def n_vocab_of(path):
    m = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return m.n_vocab()


@pytest.mark.parametrize("arch,wt,kv,dchunk", CONFIGS,
                         ids=[f"{a}-{w}-kv{k}" + (f"-chunk{d}" if d else "") for a, w, k, d in CONFIGS])
def test_logits_match_llamacpp(kiln_bin, files, work_dir, arch, wt, kv, dchunk):
    path = files(arch, wt)
    seqs = sequences(n_vocab_of(path), seed=ARCHS.index(arch))
    ref = llama_logits(path, seqs, kv)
    got = kiln_logits(kiln_bin, path, seqs, kv, work_dir / f"{arch}-{wt}-{kv}-{dchunk}.npy",
                      ["--delta-chunk", str(dchunk)])
    assert got.shape == ref.shape and ref.shape[0] >= 1000
    top1, kl, maxd = compare(ref, got)
    identical = float((np.abs(ref - got).max(1) == 0).mean())
    rec = {"arch": arch, "weights": wt, "kv": kv, "delta_chunk": dchunk, "positions": ref.shape[0], "top1": top1, "kl": kl,
           "max_abs": maxd, "identical": identical}
    if (wt == "F32" and kv == "f16") or avx512_host():
        rec.update(kl_limit=1e-3, top1_limit=0.995)
    else:
        base = llama_logits(files(arch, "F32"), seqs, "f16")
        n_top1, n_kl, _ = compare(base, ref)
        rec.update(noise_top1=n_top1, noise_kl=n_kl, kl_limit=max(1e-3, 2.5 * n_kl),
                   top1_limit=min(0.995, 1 - 2.5 * (1 - n_top1)))
    print("FIDELITY " + json.dumps(rec))
    log = os.environ.get("KILN_FIDELITY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(rec) + "\n")
    assert kl <= rec["kl_limit"], rec
    assert top1 >= rec["top1_limit"], rec
