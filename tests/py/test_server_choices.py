"""OpenAI's `n` > 1 on /v1/chat/completions and /v1/completions (SmolLM2-135M-Instruct, 4 slots).

Oracles: each choice i is the request alone with seed + i (kiln's CPU arithmetic is batch-invariant
and a cached prompt gives the cold run's numbers, so choices run side by side, with the prompt reused
from the prefix cache, equal lone runs); greedy choices are identical; streamed choices, gathered by
index, equal the non-streamed ones. The first choice processes the prompt alone and the others reuse
it (the prefix-cache hit counter rises by n - 1). Usage counts the prompt once and every choice's
tokens. Errors: n outside [1, 16], n > 1 on /completion: 400 naming `n`.
"""

import pytest
import requests

from server_harness import KilnServer, smollm2_path, sse_events

MSGS = [{"role": "user", "content": "Name a fruit and say why you like it."}]


@pytest.fixture(scope="module")
def url(kiln_bin):
    with KilnServer(kiln_bin, smollm2_path(), ["-np", "4", "-c", "8192", "--metrics"]) as s:
        yield s.url


def post(url, path, body, stream=False):
    r = requests.post(url + path, json={**body, "stream": stream}, timeout=300, stream=stream)
    assert r.status_code == 200, r.text
    return sse_events(r)[0] if stream else r.json()


def cache_hits(url):
    for line in requests.get(url + "/metrics").text.splitlines():
        if line.startswith("kiln:prefix_cache_hits_total"):
            return float(line.split()[-1])
    raise AssertionError("kiln:prefix_cache_hits_total missing")


@pytest.mark.parametrize("chat", [True, False])
def test_choices_equal_lone_runs_with_seed_plus_i(url, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = {"max_tokens": 16, "temperature": 1.0, "seed": 41}
    base.update({"messages": MSGS} if chat else {"prompt": "Once upon a time, in a small village,"})
    hits = cache_hits(url)
    out = post(url, path, {**base, "n": 3})
    assert cache_hits(url) - hits >= 2  # choices 1 and 2 reused the prompt
    texts = [c["message"]["content"] if chat else c["text"] for c in out["choices"]]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    lone = [post(url, path, {**base, "seed": 41 + i}) for i in range(3)]
    lone_texts = [r["choices"][0]["message"]["content"] if chat else r["choices"][0]["text"] for r in lone]
    assert texts == lone_texts
    assert len(set(texts)) > 1  # different seeds, different samples
    assert out["usage"]["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in lone)
    assert out["usage"]["prompt_tokens"] == lone[0]["usage"]["prompt_tokens"]
    for c, r in zip(out["choices"], lone):
        assert c["finish_reason"] == r["choices"][0]["finish_reason"]


def test_greedy_choices_are_identical(url):
    out = post(url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 12, "temperature": 0, "n": 2})
    assert out["choices"][0]["message"] == out["choices"][1]["message"]


@pytest.mark.parametrize("chat", [True, False])
def test_stream_equals_non_stream(url, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": 14, "temperature": 0.9, "seed": 5, "n": 3, "stream_options": {"include_usage": True}}
    body.update({"messages": MSGS} if chat else {"prompt": "The three best things about autumn are"})
    whole = post(url, path, {k: v for k, v in body.items() if k != "stream_options"})
    events = post(url, path, body, stream=True)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    got, finish = {}, {}
    for c in chunks:
        for ch in c["choices"]:
            i = ch["index"]
            piece = (ch["delta"].get("content") or "") if chat else ch["text"]
            got[i] = got.get(i, "") + piece
            if ch["finish_reason"]:
                finish[i] = ch["finish_reason"]
    want = {c["index"]: (c["message"]["content"] if chat else c["text"]) for c in whole["choices"]}
    assert got == want
    assert finish == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    usage = [c for c in chunks if c["choices"] == []]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": MSGS, "n": 0}),
    ("/v1/chat/completions", {"messages": MSGS, "n": 17}),
    ("/v1/completions", {"prompt": "x", "n": "2"}),
    ("/completion", {"prompt": "x", "n": 2}),
])
def test_bad_n(url, path, body):
    r = requests.post(url + path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n"
