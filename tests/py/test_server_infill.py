"""llama-server's `POST /infill` (fill-in-the-middle) on a generated qwen35 model whose vocabulary
carries Qwen's FIM tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|repo_name|>,
<|file_sep|>; found by their text, as llama.cpp does), and the 501 of a model without them
(tiny-llama).

Oracle for the prompt: the layout built here from /tokenize pieces (llama-server's repo-level FIM
pattern) run through /completion as token ids must give the same prompt, the same token count and,
greedy, the same text as /infill; streaming equals non-streaming.
"""
import pytest
import requests

from server_harness import AGAINST, KilnServer, gen_model, sse_events

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="needs kiln's generated models")

GREEDY = {"temperature": 0, "cache_prompt": False, "n_predict": 8}


@pytest.fixture(scope="module")
def url(kiln_bin, work_dir):
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    with KilnServer(kiln_bin, model, ["-c", "4096", "-b", "512"]) as s:
        yield s.url


def tok(url, text, special=False):
    r = requests.post(url + "/tokenize", json={"content": text, "add_special": False, "parse_special": special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def one(url, text):
    ids = tok(url, text, special=True)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def expected_ids(url, prefix, suffix, extra, prompt):
    rep, sep = one(url, "<|repo_name|>"), one(url, "<|file_sep|>")
    pre, suf, mid = one(url, "<|fim_prefix|>"), one(url, "<|fim_suffix|>"), one(url, "<|fim_middle|>")
    ids = [rep] + tok(url, "myproject\n")
    for c in extra:
        ids += [sep] + tok(url, c.get("filename", "tmp") + "\n") + tok(url, c["text"])
    ids += [sep] + tok(url, "filename\n")
    ids += [pre] + tok(url, prefix) + tok(url, prompt, special=True) + [suf] + tok(url, suffix) + [mid]
    return ids


CASE = {
    "input_prefix": "def fib(n):\n    ",
    "input_suffix": "\n    return a\n",
    "input_extra": [{"filename": "util.py", "text": "import math\n"}, {"text": "X = 3\n"}],
    "prompt": "a, b",
}


def test_infill_prompt_and_text_equal_completion_oracle(url):
    r = requests.post(url + "/infill", json={**GREEDY, **CASE}, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    want = expected_ids(url, CASE["input_prefix"], CASE["input_suffix"], CASE["input_extra"], CASE["prompt"])
    assert out["tokens_evaluated"] == len(want)
    detok = requests.post(url + "/detokenize", json={"tokens": want}).json()["content"]
    assert out["prompt"] == detok
    assert out["stop"] is True and out["tokens_predicted"] >= 1
    ref = requests.post(url + "/completion", json={**GREEDY, "prompt": want}, timeout=120).json()
    assert out["content"] == ref["content"]
    assert out["tokens_predicted"] == ref["tokens_predicted"]


def test_infill_stream_equals_non_stream(url):
    whole = requests.post(url + "/infill", json={**GREEDY, **CASE}).json()
    r = requests.post(url + "/infill", json={**GREEDY, **CASE, "stream": True}, stream=True)
    assert r.status_code == 200
    r.encoding = "utf-8"  # text/event-stream without a charset: requests would guess latin-1
    events, _ = sse_events(r)
    *parts, last = events
    assert all(p["stop"] is False for p in parts)
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert last["stop"] is True and last["tokens_predicted"] == whole["tokens_predicted"]


def test_infill_mixed_ids_and_without_extra(url):
    ids = tok(url, "x = ")
    r = requests.post(url + "/infill", json={**GREEDY, "input_prefix": ids, "input_suffix": ["\n", 10]})
    assert r.status_code == 200, r.text
    pre, suf, mid = one(url, "<|fim_prefix|>"), one(url, "<|fim_suffix|>"), one(url, "<|fim_middle|>")
    want = [one(url, "<|repo_name|>")] + tok(url, "myproject\n") + [one(url, "<|file_sep|>")] + tok(url, "filename\n")
    want += [pre] + ids + [suf] + tok(url, "\n") + [10, mid]
    assert r.json()["tokens_evaluated"] == len(want)
    assert r.json()["prompt"] == requests.post(url + "/detokenize", json={"tokens": want}).json()["content"]


@pytest.mark.parametrize("body,field", [
    ({"input_suffix": ""}, "input_prefix"),
    ({"input_prefix": ""}, "input_suffix"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, "input_extra[0].text"),
    ({"input_prefix": "", "input_suffix": "", "prompt": 5}, "prompt"),
    ({"input_prefix": "", "input_suffix": "", "n": 2}, "n"),
])
def test_infill_errors_name_the_field(url, body, field):
    r = requests.post(url + "/infill", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_model_without_fim_tokens_is_501(kiln_bin, work_dir):
    model = gen_model(kiln_bin, work_dir, "tiny-llama")
    with KilnServer(kiln_bin, model, ["-c", "1024"]) as s:
        r = requests.post(s.url + "/infill", json={"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 501, r.text
        err = r.json()["error"]
        assert err["type"] == "not_supported_error"
        for key in ("fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id"):
            assert key in err["message"], err["message"]
