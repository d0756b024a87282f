"""`kiln perplexity --kl-divergence-base / --kl-divergence`: llama-perplexity's KL-divergence file.

Oracles: an independent numpy decoder of the file format (header, tokens, 16-bit log-probs) checked
against `kiln logits` of the same chunks (log-softmax within the format's quantization step); the
self-comparison of a file (KLD ~ 0, same top-1 100 %); a quantized copy of the model scores a
positive KLD. The same files are read and written by llama.cpp's llama-perplexity (docs/fidelity.md
uses both directions on the GPU machine).
"""
import re
import subprocess

import numpy as np
import pytest

from conftest import NGL_ARGS

CTX = 64
CHUNKS = 3


@pytest.fixture(scope="module")
def models(kiln_bin, work_dir):
    out = {}
    for t in ("F32", "Q8_0"):
        p = work_dir / f"kld-tiny-qwen35-{t}.gguf"
        subprocess.run([str(kiln_bin), "gguf", "gen", "--preset", "tiny-qwen35", "--type", t, "-q", "-o", str(p)],
                       check=True, timeout=120)
        out[t] = p
    return out


@pytest.fixture(scope="module")
def text(work_dir):
    rng = np.random.default_rng(7)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "tea", "in", "Bath"]
    p = work_dir / "kld-text.txt"
    p.write_text(" ".join(rng.choice(words, 2000)))
    return p


def perplexity(kiln_bin, *args):
    r = subprocess.run([str(kiln_bin), "perplexity", "-t", "2", *NGL_ARGS, *map(str, args)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def read_kld(path):
    b = path.read_bytes()
    assert b[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = np.frombuffer(b, np.int32, 3, 8)
    toks = np.frombuffer(b, np.int32, n_chunk * n_ctx, 20).reshape(n_chunk, n_ctx)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    n_pos = n_ctx - 1 - n_ctx // 2
    words = np.frombuffer(b, np.uint16, offset=20 + 4 * n_chunk * n_ctx).reshape(n_chunk, n_pos, nv)
    head = words[:, :, :4].copy().view(np.float32)  # scale, min_log_prob
    logp = head[:, :, :1] * words[:, :, 4:4 + n_vocab].astype(np.float32) + head[:, :, 1:2]
    return int(n_ctx), int(n_vocab), toks, logp, head[:, :, 0]


def test_base_file_matches_logits(kiln_bin, models, text, work_dir):
    base = work_dir / "kld-base.bin"
    out = perplexity(kiln_bin, "-m", models["F32"], "-f", text, "-c", CTX, "--chunks", CHUNKS, "--kl-divergence-base", base)
    assert "Final estimate" in out
    n_ctx, n_vocab, toks, logp, scale = read_kld(base)
    assert (n_ctx, toks.shape[0]) == (CTX, CHUNKS)
    # The same chunks through `kiln logits`: chunk starts with BOS when the vocabulary adds one;
    # the tiny generated vocabulary does not, so the tokens go in unchanged.
    seqs = ";".join(",".join(map(str, t)) for t in toks)
    npy = work_dir / "kld-logits.npy"
    r = subprocess.run([str(kiln_bin), "logits", "-m", str(models["F32"]), "--tokens", seqs, "-o", str(npy),
                        "-c", str(CTX), "-t", "2", *NGL_ARGS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lg = np.load(npy).astype(np.float64).reshape(CHUNKS, CTX, n_vocab)[:, CTX // 2:CTX - 1]
    ref = lg - lg.max(-1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    # Entries within 16 nats of the maximum are stored to a step of `scale`; the rest as the floor.
    kept = ref > (ref.max(-1, keepdims=True) - 16 + 1e-3)
    err = np.abs(logp - ref)[kept]
    assert err.max() <= scale.max() * 0.51 + 1e-4, err.max()
    assert (logp.argmax(-1) == ref.argmax(-1)).all()


def test_self_and_quantized(kiln_bin, models, text, work_dir):
    base = work_dir / "kld-base2.bin"
    perplexity(kiln_bin, "-m", models["F32"], "-f", text, "-c", CTX, "--chunks", CHUNKS, "--kl-divergence-base", base)
    same = perplexity(kiln_bin, "-m", models["F32"], "--kl-divergence-base", base, "--kl-divergence")
    kld = float(re.search(r"Mean    KLD:\s+(-?[0-9.]+)", same).group(1))
    top = float(re.search(r"Same top p:\s+([0-9.]+)", same).group(1))
    assert abs(kld) < 1e-4 and top == 100.0, same
    q8 = perplexity(kiln_bin, "-m", models["Q8_0"], "--kl-divergence-base", base, "--kl-divergence")
    kld8 = float(re.search(r"Mean    KLD:\s+(-?[0-9.]+)", q8).group(1))
    assert 1e-6 < kld8 < 0.05, q8
    assert f"Positions  : {CHUNKS * (CTX - 1 - CTX // 2)}" in q8


def test_errors(kiln_bin, models, work_dir):
    bad = work_dir / "kld-bad.bin"
    bad.write_bytes(b"not a logits file")
    r = subprocess.run([str(kiln_bin), "perplexity", "-m", str(models["F32"]), "--kl-divergence-base", str(bad),
                        "--kl-divergence", *NGL_ARGS], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not a KL-divergence base file" in r.stderr
    r = subprocess.run([str(kiln_bin), "perplexity", "-m", str(models["F32"]), "--kl-divergence", *NGL_ARGS],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--kl-divergence needs --kl-divergence-base" in r.stderr
