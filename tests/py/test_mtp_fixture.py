"""draft-mtp on a TRAINED MTP block (issue 16's "real acceptance"): tests/fixtures/mtp-kjv/model.gguf is
a small qwen35 model (Gated-DeltaNet + gated full attention) trained with its MTP block on the King
James Bible by scripts/train_mtp_fixture.py (meta.json: config, training log, losses).

Checks:
- the file has the layout of llama.cpp's converter / `kiln gguf gen --mtp`: block_count = n_layer + 1,
  qwen35.nextn_predict_layers = 1, the MTP block's tensors (names and shapes) as in a generated
  tiny-qwen35-mtp file;
- kiln computes the trained file as torch did: `kiln logits` (trunk) and `kiln logits --mtp` (the MTP
  block's rows) against ref_logits.npz (torch, float32, with the weights the GGUF holds);
- llama.cpp (llama-cpp-python's MTP context) gives the same MTP logits (skipped without it);
- greedy completions of prompts from the training text with `--spec-type draft-mtp` (n-max 3,
  p-min 0) are the plain server's, one request at a time and four at once, and the drafts are
  accepted at a real rate (printed; the floor is well below what was measured: docs/engine.md).
"""
import concurrent.futures as cf
import json
import subprocess

import numpy as np
import pytest
import requests
from conftest import NGL_ARGS

from server_harness import AGAINST, KilnServer, gen_model

PROMPTS = [
    "In the beginning God created the heaven and the earth.\nAnd the earth was",
    "And God said, Let there be light:",
    "The LORD is my shepherd; I shall not",
    "And the LORD spake unto Moses, saying,",
    "For God so loved the world, that he gave",
    "Blessed are the poor in spirit: for theirs is",
    "And it came to pass, when the king heard",
    "Praise ye the LORD. O give thanks unto the LORD; for he is good:",
]
N_PREDICT = 64
ACCEPT_FLOOR = 0.25  # measured rate: see the printed line and docs/engine.md


@pytest.fixture(scope="module")
def fixture_dir(root):
    d = root / "tests" / "fixtures" / "mtp-kjv"
    assert (d / "model.gguf").exists(), d
    return d


@pytest.fixture(scope="module")
def meta(fixture_dir):
    return json.loads((fixture_dir / "meta.json").read_text())


def read_gguf(path):
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(path))
    kv = {}
    for f in r.fields.values():
        if len(f.types) == 1 and f.types[0] != gguf.GGUFValueType.STRING:
            kv[f.name] = f.parts[f.data[0]].tolist()[0]
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    return kv, shapes


def test_layout_is_llamacpp_mtp(kiln_bin, work_dir, fixture_dir, meta):
    kv, shapes = read_gguf(fixture_dir / "model.gguf")
    n_layer = meta["config"]["num_hidden_layers"]
    E = meta["config"]["hidden_size"]
    assert kv["qwen35.block_count"] == n_layer + 1
    assert kv["qwen35.nextn_predict_layers"] == 1
    mtp = {k[len(f"blk.{n_layer}."):]: v for k, v in shapes.items() if k.startswith(f"blk.{n_layer}.")}
    assert mtp["nextn.eh_proj.weight"] == (2 * E, E)
    for n in ("enorm", "hnorm", "shared_head_norm"):
        assert mtp[f"nextn.{n}.weight"] == (E,)
    assert not any(k.startswith(f"blk.{n_layer + 1}.") for k in shapes)
    # the same tensor names (and shapes relative to E) as kiln's generated MTP block
    gen = gen_model(kiln_bin, work_dir, "tiny-qwen35-mtp")
    gkv, gshapes = read_gguf(gen)
    gl = gkv["qwen35.block_count"] - 1
    gmtp = {k[len(f"blk.{gl}."):] for k in gshapes if k.startswith(f"blk.{gl}.")}
    assert set(mtp) == gmtp, set(mtp) ^ gmtp
    # the MTP block's attention / FFN have the trunk's full-attention layers' shapes
    full = [i for i, t in enumerate(meta["config"]["layer_types"]) if t == "full_attention"]
    trunk = {k[len(f"blk.{full[0]}."):]: v for k, v in shapes.items() if k.startswith(f"blk.{full[0]}.")}
    for k, v in mtp.items():
        if not k.startswith("nextn."):
            assert trunk[k] == v, k


def kiln_logits(kiln_bin, path, tokens, out, mtp):
    cmd = [str(kiln_bin), "logits", "-m", str(path), "--tokens", ",".join(map(str, tokens)), "-o", str(out),
           "-t", "2", *NGL_ARGS] + (["--mtp"] if mtp else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(out).astype(np.float64)


@pytest.mark.parametrize("which", ["trunk", "mtp"])
def test_logits_match_torch(kiln_bin, work_dir, fixture_dir, which):
    ref = np.load(fixture_dir / "ref_logits.npz")
    toks = ref["tokens"].tolist()
    want = ref[which].astype(np.float64)
    got = kiln_logits(kiln_bin, fixture_dir / "model.gguf", toks, work_dir / f"fx-{which}.npy", which == "mtp")
    assert got.shape == want.shape
    d = np.abs(got - want).max()
    top1 = float((got.argmax(1) == want.argmax(1)).mean())
    print(f"{which}: kiln vs torch max |dlogit| {d:.2e} (logit range {np.abs(want).max():.1f}), top-1 {top1:.3f}")
    assert d <= 1e-2 and top1 >= 0.98


def test_mtp_logits_match_llamacpp(kiln_bin, work_dir, fixture_dir):
    pytest.importorskip("llama_cpp")
    from test_mtp_llamacpp import llama_mtp_logits, log_softmax

    toks = np.load(fixture_dir / "ref_logits.npz")["tokens"].tolist()
    ref = llama_mtp_logits(fixture_dir / "model.gguf", toks)
    got = kiln_logits(kiln_bin, fixture_dir / "model.gguf", toks, work_dir / "fx-mtp-ll.npy", True)
    p, q = log_softmax(ref), log_softmax(got)
    kl = float((np.exp(p) * (p - q)).sum(axis=1).mean())
    top1 = float((ref.argmax(1) == got.argmax(1)).mean())
    print(f"mtp kiln vs llama.cpp: top-1 {top1:.3f}, mean KL {kl:.2e}, max |diff| {np.abs(ref - got).max():.2e}")
    assert top1 >= 0.97 and kl <= 1e-3


def complete(url, prompt):
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    r = requests.post(url + "/completion", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.skipif(bool(AGAINST), reason="spawns kiln with its own flags")
def test_draft_mtp_equals_plain_and_accepts(kiln_bin, fixture_dir):
    model = fixture_dir / "model.gguf"
    with KilnServer(kiln_bin, model, ["-c", "2048", "-np", "4"]) as s:
        plain = [complete(s.url, p)["content"] for p in PROMPTS]
    args = ["-c", "2048", "-np", "4", "--spec-type", "draft-mtp", "--spec-draft-n-max", "3",
            "--spec-draft-p-min", "0"]
    with KilnServer(kiln_bin, model, args) as s:
        alone = [complete(s.url, p) for p in PROMPTS]
        with cf.ThreadPoolExecutor(4) as ex:
            batched = list(ex.map(lambda p: complete(s.url, p), PROMPTS))
        assert "speculative decoding: draft-mtp" in s.log_text()
    for p, want, a, b in zip(PROMPTS, plain, alone, batched):
        assert a["content"] == want, p
        assert b["content"] == want, p
    n = sum(r["timings"]["draft_n"] for r in alone)
    acc = sum(r["timings"]["draft_n_accepted"] for r in alone)
    nb = sum(r["timings"]["draft_n"] for r in batched)
    accb = sum(r["timings"]["draft_n_accepted"] for r in batched)
    print(f"draft-mtp on the trained fixture: {acc}/{n} drafted tokens accepted ({acc / max(n, 1):.3f}) alone, "
          f"{accb}/{nb} ({accb / max(nb, 1):.3f}) four at once; {len(PROMPTS) * N_PREDICT} tokens per run")
    for p, c in zip(PROMPTS[:2], plain):
        print(f"  {p!r} -> {c!r}")
    assert n > 0 and acc / n >= ACCEPT_FLOOR
    assert nb > 0 and accb / nb >= ACCEPT_FLOOR


@pytest.mark.skipif(bool(AGAINST), reason="spawns kiln with its own flags")
def test_draft_vocab_keeps_the_output(kiln_bin, fixture_dir):
    """--spec-draft-vocab N: the drafts come from the head's first N rows; the target verifies as before,
    so the text is the plain server's; the acceptance it costs is printed (docs/engine.md)."""
    model = fixture_dir / "model.gguf"
    with KilnServer(kiln_bin, model, ["-c", "2048", "-np", "1"]) as s:
        plain = [complete(s.url, p)["content"] for p in PROMPTS]
    rates = []
    for vocab in (0, 512, 256):
        args = ["-c", "2048", "-np", "1", "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0",
                "--spec-draft-vocab", str(vocab)]
        with KilnServer(kiln_bin, model, args) as s:
            got = [complete(s.url, p) for p in PROMPTS]
        for p, want, r in zip(PROMPTS, plain, got):
            assert r["content"] == want, (vocab, p)
        n = sum(r["timings"]["draft_n"] for r in got)
        acc = sum(r["timings"]["draft_n_accepted"] for r in got)
        assert n > 0
        rates.append(f"{vocab or 1024}: {acc}/{n} ({acc / n:.3f})")
    print("draft vocabulary of the 1024-token fixture -> accepted/drafted: " + ", ".join(rates))
