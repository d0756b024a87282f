"""Constrained decoding end to end: `response_format` (json_object, json_schema strict), llama-server's
`json_schema` and `grammar` fields on /v1/chat/completions, /v1/completions and /completion.

Oracle: the `jsonschema` package. Every output of many sampled generations (temperature 1, several
seeds, concurrent so that slots share batches) from SmolLM2-135M and from a generated tiny qwen35
model must parse as JSON and validate against its schema; GBNF outputs are checked against the
language the grammar describes (written out in Python). Schemas are bounded (maxLength, maxItems,
enums, integer ranges) so that even a random model finishes within max_tokens.
"""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import requests

from server_harness import AGAINST, KilnServer, gen_model, sdk_client, smollm2_path, sse_events

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="starts kiln with its own flags")

NAME = {"type": "string", "maxLength": 12}
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                       "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"}},
        "required": ["name", "age"], "additionalProperties": False},
    "empty_object": {"type": "object", "properties": {}, "additionalProperties": False},
    "deep": {"$defs": {"n": {"type": "object", "properties": {"k": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/m"}}},
                             "required": ["k"], "additionalProperties": False},
                       "m": {"type": "object", "properties": {"v": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2,
                             "items": {"type": "object", "properties": {"x": {"enum": [1, 2, 3]}}, "required": ["x"],
                                       "additionalProperties": False}}}}, "required": ["v"], "additionalProperties": False}},
             "type": "object", "properties": {"root": {"$ref": "#/$defs/n"}}, "required": ["root"], "additionalProperties": False},
    "unicode": {"type": "object", "properties": {
        "greek": {"type": "string", "pattern": "^[α-ω]{1,5}$"},
        "pick": {"enum": ["é", "a\"b", "\u0001\\", "😀", "日本"]},
        "free": {"type": "string", "maxLength": 6}}, "required": ["greek", "pick", "free"], "additionalProperties": False},
    "numbers": {"type": "object", "properties": {
        "big": {"type": "integer", "minimum": -1000000000000000, "maximum": 1000000000000000},
        "neg": {"type": "integer", "exclusiveMaximum": 0, "minimum": -99},
        "f": {"type": "number"}, "tuple": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": False}},
        "required": ["big", "neg", "f", "tuple"], "additionalProperties": False},
    "choice": {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
                          "required": ["kind", "n"], "additionalProperties": False},
                         {"type": "array", "items": {"type": "string", "format": "date"}, "minItems": 1, "maxItems": 2},
                         {"type": ["null", "boolean"]}]},
}
SEEDS = [1, 2, 3]
MSG = [{"role": "user", "content": "Reply with a JSON value."}]


def validate(text, schema):
    value = json.loads(text)  # must parse
    jsonschema.validate(value, schema)
    return value


def post(url, path, body):
    r = requests.post(url + path, json=body, timeout=180)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def smol(kiln_bin):
    with KilnServer(kiln_bin, smollm2_path(), ["-np", "4", "-c", "8192"]) as s:
        yield s.url


@pytest.fixture(scope="module")
def tiny(kiln_bin, work_dir, shared_data):
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    tmpl = shared_data / "chat-templates" / "Qwen3.5-4B.jinja"
    with KilnServer(kiln_bin, model, ["-np", "4", "-c", "8192", "--chat-template-file", tmpl]) as s:
        yield s.url


def sample_all(url, make_body, path="/v1/chat/completions"):
    jobs = [(name, seed) for name in SCHEMAS for seed in SEEDS]
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda j: (j, post(url, path, make_body(SCHEMAS[j[0]], j[1]))), jobs))
    return outs


def chat_body(schema, seed, **extra):
    return {"messages": MSG, "temperature": 1.0, "seed": seed, "max_tokens": 600,
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}, **extra}


@pytest.mark.parametrize("model", ["smol", "tiny"])
def test_chat_json_schema_outputs_validate(request, model):
    url = request.getfixturevalue(model)
    extra = {"chat_template_kwargs": {"enable_thinking": False}} if model == "tiny" else {}
    outs = sample_all(url, lambda s, seed: chat_body(s, seed, **extra))
    for (name, seed), r in outs:
        ch = r["choices"][0]
        assert ch["finish_reason"] == "stop", (name, seed, ch)
        validate(ch["message"]["content"], SCHEMAS[name])


@pytest.mark.parametrize("model", ["smol", "tiny"])
def test_completions_and_native_json_schema(request, model):
    url = request.getfixturevalue(model)
    outs = sample_all(url, lambda s, seed: {"prompt": "JSON:", "temperature": 1.0, "seed": seed, "max_tokens": 600,
                                            "response_format": {"type": "json_schema", "json_schema": {"schema": s}}},
                      path="/v1/completions")
    for (name, _), r in outs:
        assert r["choices"][0]["finish_reason"] == "stop"
        validate(r["choices"][0]["text"], SCHEMAS[name])
    outs = sample_all(url, lambda s, seed: {"prompt": "JSON:", "temperature": 1.0, "seed": seed, "n_predict": 600, "json_schema": s},
                      path="/completion")
    for (name, _), r in outs:
        assert r["stop_type"] == "eos", r
        validate(r["content"], SCHEMAS[name])


def test_json_object_and_stream_equals_non_stream(smol):
    for seed in SEEDS:
        body = {"messages": MSG, "temperature": 1.0, "seed": seed, "max_tokens": 300, "response_format": {"type": "json_object"}}
        r = post(smol, "/v1/chat/completions", body)
        text = r["choices"][0]["message"]["content"]
        if r["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        s = requests.post(smol + "/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=180)
        events, _ = sse_events(s)
        streamed = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e != "[DONE]" and e["choices"])
        assert streamed == text


def test_gbnf_grammar_field(smol):
    g = 'root ::= ("yes" | "no") "!" [0-9]{1,3} ws\nws ::= | " "'
    pat = re.compile(r"(yes|no)![0-9]{1,3} ?")
    for seed in SEEDS:
        r = post(smol, "/completion", {"prompt": "Answer:", "grammar": g, "temperature": 1.0, "seed": seed, "n_predict": 50})
        assert pat.fullmatch(r["content"]), r["content"]
        r = post(smol, "/v1/chat/completions", {"messages": MSG, "grammar": g, "temperature": 1.0, "seed": seed})
        assert pat.fullmatch(r["choices"][0]["message"]["content"])


def test_reasoning_is_free_and_the_answer_constrained(tiny):
    """Qwen3.5's template opens <think>: the grammar applies after </think>. The bias makes the random
    model close its thinking at once (the bias stays on, but the grammar never allows </think>)."""
    ids = requests.post(tiny + "/tokenize", json={"content": "</think>"}).json()["tokens"]
    assert len(ids) == 1
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    for seed in SEEDS:
        r = post(tiny, "/v1/chat/completions", {**chat_body(schema, seed), "logit_bias": {str(ids[0]): 100}, "logprobs": True})
        validate(r["choices"][0]["message"]["content"], schema)
        # </think> was generated (a grammar applied from the start would have banned it), then JSON.
        toks = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
        assert toks[0] == "</think>" and "</think>" not in toks[1:], toks


BAD = [
    ("/completion", {"prompt": "x", "grammar": "root ::= \"a"}, "grammar", "line 1, column 12: unterminated literal"),
    ("/completion", {"prompt": "x", "grammar": "root ::= item"}, "grammar", "rule 'item' (used on line 1) is not defined"),
    ("/completion", {"prompt": "x", "grammar": "start ::= \"a\""}, "grammar", "no 'root' rule"),
    ("/completion", {"prompt": "x", "grammar": "root ::= root \"a\""}, "grammar", "left-recursive"),
    ("/completion", {"prompt": "x", "grammar": 5}, "grammar", "expected GBNF text"),
    ("/completion", {"prompt": "x", "json_schema": {"type": "array", "uniqueItems": True}}, "json_schema.uniqueItems", "'uniqueItems' is not supported"),
    ("/v1/completions", {"prompt": "x", "json_schema": {"type": "number", "maximum": 3}}, "json_schema.maximum", "'maximum' on type 'number'"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
        {"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}}}},
     "response_format.json_schema.schema.properties.a.format", "format 'email' is not supported"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "is required"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "yaml"}}, "response_format.type", "'yaml' is not supported"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar",
     "only one of"),
    ("/v1/chat/completions", {"messages": MSG, "json_schema": {"$ref": "#/$defs/nope"}}, "json_schema.$ref", "points to nothing"),
]


@pytest.mark.parametrize("path,body,param,needle", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_malformed_constraints_are_400_naming_the_field(smol, path, body, param, needle):
    r = requests.post(smol + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param, e
    assert e["message"].startswith(param + ": ") and needle in e["message"], e


def test_openai_sdk_parse_with_pydantic(smol):
    """The official SDK's structured-output client: `chat.completions.parse` with a pydantic model (the
    SDK sends its strict JSON schema and parses the reply into the model), blocking and streamed."""
    from typing import Literal

    import pydantic

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        age: int = pydantic.Field(ge=0, le=130)
        tags: list[Literal["a", "b", "c"]] = pydantic.Field(max_length=3)

    c = sdk_client(smol, timeout=180)
    for seed in (1, 2, 3):
        r = c.chat.completions.parse(model="kiln", messages=MSG, response_format=Person, temperature=1.0, seed=seed,
                                     max_tokens=400)
        p = r.choices[0].message.parsed
        assert isinstance(p, Person), r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), Person.model_json_schema())
    with c.chat.completions.stream(model="kiln", messages=MSG, response_format=Person, temperature=1.0, seed=4,
                                   max_tokens=400) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person), final.choices[0].message.content
