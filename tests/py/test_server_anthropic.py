"""Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) with the official `anthropic`
SDK as the client.

Servers: SmolLM2-135M with the Qwen3 template (tools in the Hermes `<tool_call>` format) and a generated
tiny qwen35 with the Qwen3.5 template (a reasoning model: thinking blocks). Oracles: the same conversation
as an OpenAI chat body gives the same prompt (`/apply-template` tokenized == count_tokens), greedy
answers equal /v1/chat/completions' text, the SDK's stream accumulator equals the non-streamed message,
forced tool_use inputs validate with `jsonschema`, raw SSE follows Anthropic's event grammar, errors
have Anthropic's shape {"type": "error", "error": {"type", "message"}}.
"""
import json
import re

import anthropic
import jsonschema
import pytest
import requests

from server_harness import AGAINST, KilnServer, smollm2_path
from dialect_fixtures import WEATHER, smol, tiny  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="starts kiln with its own flags")

TOOLS = [{"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER}]



def client(url, key="unused"):
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=300)


def n_tokens(url, chat_body):
    """Prompt tokens of an OpenAI chat body, through /apply-template and /tokenize."""
    prompt = requests.post(url + "/apply-template", json=chat_body).json()["prompt"]
    return len(requests.post(url + "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])


def test_plain_and_system_equal_chat_completions(smol):
    msg = client(smol).messages.create(model="smol", max_tokens=40, extra_body={"temperature": 0}, system="You are terse.",
                                       messages=[{"role": "user", "content": "Name a color."}])
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.content[0].type == "text"
    chat = requests.post(smol + "/v1/chat/completions", json={
        "max_tokens": 40, "temperature": 0, "messages": [{"role": "system", "content": "You are terse."},
                                                         {"role": "user", "content": "Name a color."}]}).json()
    assert msg.content[0].text == chat["choices"][0]["message"]["content"]
    assert msg.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]
    assert (msg.stop_reason == "max_tokens") == (chat["choices"][0]["finish_reason"] == "length")


def test_multi_turn_blocks_and_count_tokens(smol):
    """Content blocks, tool_use / tool_result history and system blocks become the same prompt as the
    equivalent OpenAI chat conversation."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "days": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Snow, -3C"}]},
                                     {"type": "text", "text": "And tomorrow?"}]},
    ]
    system = [{"type": "text", "text": "Be helpful."}, {"type": "text", "text": "Be short."}]
    chat = {"messages": [
        {"role": "system", "content": "Be helpful.\nBe short."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo", "days": 2})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Snow, -3C"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": WEATHER}}]}
    c = client(smol)
    count = c.messages.count_tokens(model="smol", system=system, messages=messages, tools=TOOLS)
    assert count.input_tokens == n_tokens(smol, chat)
    msg = c.messages.create(model="smol", max_tokens=20, extra_body={"temperature": 0}, system=system, messages=messages, tools=TOOLS)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == count.input_tokens


def test_forced_tool_use_validates(smol):
    c = client(smol)
    for temp, seed in ((0.0, 0), (1.0, 1), (1.0, 2)):
        for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}):
            msg = c.messages.create(model="smol", max_tokens=300, extra_body={"temperature": temp, "seed": seed}, tools=TOOLS,
                                    tool_choice=choice, messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}])
            # Parallel calls run until the model stops them; max_tokens may cut the last one.
            assert msg.stop_reason == "tool_use" or (msg.stop_reason == "max_tokens" and "disable_parallel_tool_use" not in choice), msg
            uses = [b for b in msg.content if b.type == "tool_use"]
            assert uses and all(u.id.startswith("toolu_") and u.name == "get_weather" for u in uses)
            if choice.get("disable_parallel_tool_use"):
                assert len(uses) == 1
            for u in uses:
                jsonschema.validate(u.input, WEATHER)
    # The answer after a tool_result: a text turn.
    msg = c.messages.create(model="smol", max_tokens=30, extra_body={"temperature": 0}, tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather", "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21C"}]}])
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_stream_accumulates_to_the_message(smol):
    c = client(smol)
    kw = dict(model="smol", max_tokens=40, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Count to five."}])
    whole = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # Tools streamed: the tool_use block's input arrives through input_json_delta.
    kw = dict(model="smol", max_tokens=300, extra_body={"temperature": 0}, tools=TOOLS, tool_choice={"type": "any"},
              messages=[{"role": "user", "content": "Weather in Rome for 2 days?"}])
    whole = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == \
        [(b.name, b.input) for b in whole.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use"


def test_output_config_json_schema(smol):
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "blue"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["color", "n"], "additionalProperties": False}
    for t in (0.0, 1.0):
        msg = client(smol).messages.create(model="smol", max_tokens=100, messages=[{"role": "user", "content": "A color?"}],
                                           output_config={"format": {"type": "json_schema", "schema": schema}},
                                           extra_body={"temperature": t})
        assert msg.stop_reason == "end_turn"
        jsonschema.validate(json.loads(msg.content[0].text), schema)


def test_raw_event_sequence(smol):
    r = requests.post(smol + "/v1/messages", json={"model": "smol", "max_tokens": 300, "temperature": 0, "stream": True,
                                                   "tools": TOOLS, "tool_choice": {"type": "any"},
                                                   "messages": [{"role": "user", "content": "Weather in Rome?"}]}, stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in r.text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]
        events.append(payload)
    kinds = "".join(e["type"] + " " for e in events)
    assert re.fullmatch(r"message_start (ping )?(content_block_start (content_block_delta )*content_block_stop )+message_delta message_stop ",
                        kinds), kinds
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == list(range(len(starts)))
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    # Each tool_use input came piece by piece (input_json_delta as the model wrote the arguments), and the
    # pieces add up to the blocking answer's inputs.
    pieces = {}
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            pieces.setdefault(e["index"], []).append(e["delta"]["partial_json"])
    assert pieces and all(len(p) > 1 for p in pieces.values()), pieces
    whole = client(smol).messages.create(model="smol", max_tokens=300, extra_body={"temperature": 0}, tools=TOOLS,
                                         tool_choice={"type": "any"}, messages=[{"role": "user", "content": "Weather in Rome?"}])
    assert [json.loads("".join(p)) for _, p in sorted(pieces.items())] == [b.input for b in whole.content if b.type == "tool_use"]


def test_stop_sequences(smol):
    c = client(smol)
    kw = dict(model="smol", max_tokens=40, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Tell me about cats."}])
    full = c.messages.create(**kw).content[0].text
    word = full.split()[3]
    msg = c.messages.create(**kw, stop_sequences=[word])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == word
    assert msg.content[0].text == full[:full.index(word)]


def test_thinking_blocks(tiny):
    """Qwen3.5's template opens <think>: the random model thinks until max_tokens → one thinking block;
    thinking disabled → no thinking block; a thinking block in history reaches the prompt."""
    c = client(tiny)
    greedy = {"temperature": 0}  # this SDK has no temperature argument; the server reads the body's
    msg = c.messages.create(model="t", max_tokens=12, messages=[{"role": "user", "content": "Hi"}],
                            thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=greedy)
    assert msg.content[0].type == "thinking" and msg.content[0].thinking and msg.stop_reason == "max_tokens"
    with c.messages.stream(model="t", max_tokens=12, messages=[{"role": "user", "content": "Hi"}],
                           thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=greedy) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == msg.content[0].thinking
    off = c.messages.create(model="t", max_tokens=12, messages=[{"role": "user", "content": "Hi"}], thinking={"type": "disabled"})
    assert all(b.type != "thinking" for b in off.content)
    hist = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "The user greets me. " * 5, "signature": ""},
                                              {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo", "days": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "Snow"}]}]
    without = [hist[0], {"role": "assistant", "content": hist[1]["content"][1:]}, hist[2]]
    n_with = c.messages.count_tokens(model="t", messages=hist, tools=TOOLS).input_tokens
    n_without = c.messages.count_tokens(model="t", messages=without, tools=TOOLS).input_tokens
    assert n_with > n_without + 20


def test_error_shapes(smol, kiln_bin):
    U = [{"role": "user", "content": "x"}]
    cases = [
        ({"messages": U}, 400, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, 400, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, 400, "messages[0].content[0].type"),
        ({"max_tokens": 5, "messages": U, "temperature": 7}, 400, "temperature"),
        ({"max_tokens": 5, "messages": U, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools[0].type"),
        ({"max_tokens": 5, "messages": U, "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {
            "a": {"type": "array", "uniqueItems": True}}}}], "tool_choice": {"type": "any"}}, 400, "tools[0].input_schema.properties.a.uniqueItems"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, 400, "messages"),  # no --mmproj here
        ({"max_tokens": 5, "messages": U + [{"role": "assistant", "content": "Sure"}]}, 400, "messages[1].role"),
        ({"max_tokens": 5, "messages": U, "output_config": {"format": {"type": "json_schema", "schema": {"type": "number", "maximum": 1}}}},
         400, "output_config.format.schema.maximum"),
    ]
    for body, status, field in cases:
        r = requests.post(smol + "/v1/messages", json={"model": "m", **body})
        assert r.status_code == status, (body, r.text)
        j = r.json()
        assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error", j
        assert j["error"]["message"].startswith(field + ":"), (field, j)
    r = requests.post(smol + "/v1/messages", data="{not json")
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = requests.post(smol + "/v1/messages/nothing", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client(smol).messages.create(model="m", max_tokens=5, messages=[])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with KilnServer(kiln_bin, smollm2_path(), ["-c", "2048", "--api-key", "sekret"]) as s:
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(s.url, key="wrong").messages.create(model="m", max_tokens=5, messages=U)
        assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "Invalid API Key"}}
        assert client(s.url, key="sekret").messages.create(model="m", max_tokens=2, messages=U).usage.output_tokens >= 1
