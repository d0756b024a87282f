"""Constrained decoding with speculative decoding and with the prefix cache through `kiln serve`, on a
generated qwen35 model with an MTP block (tiny-qwen35-mtp).

- `json_schema` and `grammar` (GBNF) requests with `--spec-type ngram-simple` and `--spec-type
  draft-mtp` answer exactly what a server without speculation answers (greedy, and seeded sampling),
  drafts are verified (timings.draft_n > 0: the comparison is not vacuous), and every output validates
  (the `jsonschema` package; the GBNF language written out as a regular expression).
- Synthetic acceptance of every draft (`--spec-synth-rates 1,1,1`) emits the drafts without sampling
  them: drafts are cut where the grammar rejects them, so every drafted token is accepted and the
  output still validates.
- The prefix cache: a constrained request whose prompt extends an earlier one's, and a chat second turn
  holding the first constrained answer, are served from the cache (timings.cache_n > 0) and answer
  what the same request answers with `cache_prompt: false` (a cold run)."""
import json
import re

import jsonschema
import pytest
import requests

from server_harness import AGAINST, KilnServer, gen_model

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="spawns kiln with its own flags")

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "note": {"type": "string", "maxLength": 24},
    "n": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}},
    "required": ["name", "note", "n", "ok"], "additionalProperties": False}
GBNF = 'root ::= "[" item ("," " "? item){0,5} "]"\nitem ::= "\\"" [^"\\\\\\x00-\\x1F]{1,20} "\\"" | [0-9]{1,3} | "true" | "false"'
GBNF_RE = re.compile(r'\[(?:"[^"\\\x00-\x1f]{1,20}"|[0-9]{1,3}|true|false)(?:, ?(?:"[^"\\\x00-\x1f]{1,20}"|[0-9]{1,3}|true|false)){0,5}\]')
EXAMPLES = {
    "schema": '{"name": "alpha beta", "note": "one two", "n": 12, "ok": true} {"name":"gamma","note":"three four","n":7,"ok":false}',
    "gbnf": '["alpha beta", 12, true, "one two"] ["gamma",7,false,"three"]',
}
PROMPTS = ["Examples: {ex} Now yours: ", "Records {ex} and one more ", "Data: {ex}\nNext: "]


def check(kind, text):
    if kind == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert GBNF_RE.fullmatch(text), text


def constrained(url, kind, prompt, temperature=0.0, seed=1, cache_prompt=False):
    body = {"prompt": prompt, "n_predict": 160, "temperature": temperature, "seed": seed, "cache_prompt": cache_prompt}
    body.update({"json_schema": SCHEMA} if kind == "schema" else {"grammar": GBNF})
    r = requests.post(url + "/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["stop_type"] == "eos", out
    check(kind, out["content"])
    return out


@pytest.fixture(scope="module")
def model(kiln_bin, work_dir):
    return gen_model(kiln_bin, work_dir, "tiny-qwen35-mtp")


@pytest.fixture(scope="module")
def plain(kiln_bin, model):
    """Greedy and seeded outputs of a server without speculation, by (kind, prompt index, seed)."""
    out = {}
    with KilnServer(kiln_bin, model, ["-c", "4096"]) as s:
        for kind, ex in EXAMPLES.items():
            for i, p in enumerate(PROMPTS):
                for temp, seed in [(0.0, 1), (1.0, 5 + i)]:
                    out[kind, i, seed] = constrained(s.url, kind, p.format(ex=ex), temp, seed)["content"]
    return out


SPEC = {"ngram-simple": ["--spec-type", "ngram-simple", "--spec-draft-n-max", "3", "--spec-ngram-size-n", "1"],
        "draft-mtp": ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0"]}


@pytest.mark.parametrize("spec", list(SPEC))
def test_speculation_equals_plain_and_validates(kiln_bin, model, plain, spec):
    with KilnServer(kiln_bin, model, ["-np", "2", "-c", "8192", *SPEC[spec]]) as s:
        for kind, ex in EXAMPLES.items():
            drafted = 0
            for i, p in enumerate(PROMPTS):
                for temp, seed in [(0.0, 1), (1.0, 5 + i)]:
                    out = constrained(s.url, kind, p.format(ex=ex), temp, seed)
                    assert out["content"] == plain[kind, i, seed], (kind, i, seed)
                    drafted += out["timings"]["draft_n"]
            assert drafted > 0, f"{spec}/{kind}: no draft was verified"


@pytest.mark.parametrize("spec", list(SPEC))
def test_synthetic_acceptance_keeps_the_output_valid(kiln_bin, model, spec):
    with KilnServer(kiln_bin, model, ["-c", "4096", *SPEC[spec], "--spec-synth-rates", "1,1,1"]) as s:
        for kind, ex in EXAMPLES.items():
            drafted = 0
            for i, p in enumerate(PROMPTS):
                for seed in (1, 2):
                    out = constrained(s.url, kind, p.format(ex=ex), 1.0, seed)
                    t = out["timings"]
                    assert t["draft_n_accepted"] == t["draft_n"], t
                    drafted += t["draft_n"]
            assert drafted > 0, f"{spec}/{kind}: no draft was made"


@pytest.mark.parametrize("spec", ["none", "ngram-simple"])
def test_prefix_cache_hit_answers_as_a_cold_run(kiln_bin, model, spec):
    args = ["-np", "2", "-c", "8192", *(SPEC[spec] if spec != "none" else [])]
    with KilnServer(kiln_bin, model, args) as s:
        for kind, ex in EXAMPLES.items():
            long = " ".join(p.format(ex=ex) for p in PROMPTS) * 3
            first = constrained(s.url, kind, long, cache_prompt=True)
            longer = long + " and again: "
            warm = constrained(s.url, kind, longer, cache_prompt=True)
            assert warm["timings"]["cache_n"] > warm["timings"]["prompt_n"], warm["timings"]
            cold = constrained(s.url, kind, longer, cache_prompt=False)
            assert cold["timings"]["cache_n"] == 0
            assert warm["content"] == cold["content"], kind
            # The first answer (constrained) is part of the next prompt: served from the cache, and the
            # new request's grammar starts at its own output.
            turn2 = long + first["content"] + " next: "
            warm2 = constrained(s.url, kind, turn2, cache_prompt=True)
            assert warm2["timings"]["cache_n"] > warm2["timings"]["prompt_n"], warm2["timings"]
            assert warm2["content"] == constrained(s.url, kind, turn2, cache_prompt=False)["content"]


def test_chat_second_turn_with_response_format_hits_the_cache(kiln_bin, model, shared_data):
    tmpl = shared_data / "chat-templates" / "Qwen3.5-4B.jinja"
    rf = {"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA, "strict": True}}
    sys_msg = {"role": "system", "content": "You write records like " + EXAMPLES["schema"] * 8}
    with KilnServer(kiln_bin, model, ["-np", "2", "-c", "8192", "--chat-template-file", tmpl]) as s:
        def chat(msgs, cache_prompt):
            body = {"messages": msgs, "temperature": 0, "max_tokens": 200, "response_format": rf, "cache_prompt": cache_prompt,
                    "chat_template_kwargs": {"enable_thinking": False}}
            r = requests.post(s.url + "/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["choices"][0]["finish_reason"] == "stop", out
            jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)
            return out

        msgs = [sys_msg, {"role": "user", "content": "One record, please."}]
        a = chat(msgs, True)
        msgs2 = msgs + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "Another one."}]
        b = chat(msgs2, True)
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] >= a["usage"]["prompt_tokens"] // 2, b["usage"]
        assert b["choices"][0]["message"]["content"] == chat(msgs2, False)["choices"][0]["message"]["content"]
