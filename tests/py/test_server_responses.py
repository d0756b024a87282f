"""OpenAI Responses API (`POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`) with the official
`openai` SDK as the client.

Servers: SmolLM2-135M with the Qwen3 template (function tools in the Hermes `<tool_call>` format) and a
generated tiny qwen35 with the Qwen3.5 template (reasoning items). Oracles: greedy text equals
/v1/chat/completions' answer to the same conversation; the SDK's stream helper assembles the same
Response as the non-streamed one; forced function calls validate with `jsonschema`; a conversation
continued with previous_response_id has exactly the prompt of the same conversation sent as explicit
items; events carry increasing sequence numbers in the documented order; errors are OpenAI's shape.
"""
import json
import re

import jsonschema
import openai
import pytest
import requests

from server_harness import AGAINST, sdk_client
from dialect_fixtures import WEATHER, smol, tiny  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="starts kiln with its own flags")

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": WEATHER}]



def client(url):
    return sdk_client(url)


def test_plain_equals_chat_completions(smol):
    r = client(smol).responses.create(model="smol", input="Name a color.", instructions="You are terse.", max_output_tokens=40,
                                      temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    chat = requests.post(smol + "/v1/chat/completions", json={
        "max_tokens": 40, "temperature": 0, "messages": [{"role": "system", "content": "You are terse."},
                                                         {"role": "user", "content": "Name a color."}]}).json()
    assert r.output_text == chat["choices"][0]["message"]["content"]
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"] and r.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert (r.status == "incomplete") == (chat["choices"][0]["finish_reason"] == "length")
    assert r.instructions == "You are terse." and r.max_output_tokens == 40
    # Items input with typed parts gives the same prompt.
    r2 = client(smol).responses.create(model="smol", instructions="You are terse.", max_output_tokens=40, temperature=0,
                                       input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}])
    assert r2.output_text == r.output_text


def test_tools_and_previous_response_id(smol):
    c = client(smol)
    first = c.responses.create(model="smol", input="What is the weather in Paris for 3 days?", tools=TOOLS, tool_choice="required",
                               parallel_tool_calls=False, temperature=1.0, max_output_tokens=300)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    out = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21C"}
    follow = c.responses.create(model="smol", previous_response_id=first.id, input=[out], tools=TOOLS, temperature=0,
                                max_output_tokens=30)
    assert follow.previous_response_id == first.id
    # The same conversation as explicit items: the same prompt (token for token) and the same answer.
    explicit = c.responses.create(model="smol", tools=TOOLS, temperature=0, max_output_tokens=30, store=False, input=[
        {"role": "user", "content": "What is the weather in Paris for 3 days?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        out])
    assert follow.usage.input_tokens == explicit.usage.input_tokens
    assert follow.output_text == explicit.output_text
    # The follow-up's prompt starts with the first one: the prefix cache reuses it.
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    # Named function choice, several seeds at temperature 1: valid arguments.
    for seed in (1, 2, 3):
        r = c.responses.create(model="smol", input="Weather?", tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                               parallel_tool_calls=False, temperature=1.0, max_output_tokens=300, extra_body={"seed": seed})
        assert r.status == "completed" and [o.type for o in r.output] == ["function_call"], r.output
        jsonschema.validate(json.loads(r.output[0].arguments), WEATHER)


def test_store_retrieve_delete(smol):
    c = client(smol)
    r = c.responses.create(model="smol", input="Hi", max_output_tokens=5, temperature=0)
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    assert requests.delete(smol + f"/v1/responses/{r.id}").json() == {"id": r.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="smol", input="again", previous_response_id=r.id, max_output_tokens=5)
    assert e.value.body["param"] == "previous_response_id"
    unstored = c.responses.create(model="smol", input="Hi", max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def stream(c, **kw):
    """The SDK's stream helper: (text deltas joined, the final Response, event types). Its
    get_final_response() needs response.completed; an incomplete one comes with response.incomplete."""
    deltas, kinds, last = "", [], None
    with c.responses.stream(**kw) as s:
        for e in s:
            kinds.append(e.type)
            if e.type == "response.output_text.delta":
                deltas += e.delta
            if e.type in ("response.completed", "response.incomplete"):
                last = e.response
        if last.status == "completed":
            assert s.get_final_response().output_text == last.output_text
    return deltas, last, kinds


def test_stream_equals_non_stream(smol):
    c = client(smol)
    for kw in (dict(input="Count to five.", max_output_tokens=40, temperature=0),
               dict(input="Say OK.", max_output_tokens=400, temperature=0),
               dict(input="Weather in Rome for 2 days?", tools=TOOLS, tool_choice="required", max_output_tokens=300, temperature=0)):
        whole = c.responses.create(model="smol", **kw)
        deltas, final, _ = stream(c, model="smol", **kw)
        assert final.output_text == whole.output_text == deltas
        if kw["input"] == "Say OK.":
            assert final.status == "completed"  # the helper's get_final_response() path ran
        assert [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in final.output] == \
            [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in whole.output]
        assert final.status == whole.status and final.usage.output_tokens == whole.usage.output_tokens


def test_raw_event_order(smol):
    r = requests.post(smol + "/v1/responses", json={"input": "Hi", "max_output_tokens": 8, "temperature": 0, "stream": True}, stream=True)
    events = []
    for block in r.text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        payload = json.loads(data[len("data: "):])
        assert name == "event: " + payload["type"]
        events.append(payload)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = "".join(e["type"] + " " for e in events)
    assert re.fullmatch(r"response\.created response\.in_progress response\.output_item\.added response\.content_part\.added "
                        r"(response\.output_text\.delta )+response\.output_text\.done response\.content_part\.done "
                        r"response\.output_item\.done response\.(completed|incomplete) ", kinds), kinds
    done = events[-1]["response"]
    assert done["output"][0]["content"][0]["text"] == "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def test_function_call_arguments_stream_in_pieces(smol):
    """A forced call streams its arguments as function_call_arguments.delta events while the model writes
    them; they add up to the .done event's arguments, the finished item's and the non-streamed answer's."""
    body = {"input": "Weather in Rome for 2 days?", "tools": TOOLS, "tool_choice": "required", "max_output_tokens": 300,
            "temperature": 0}
    whole = client(smol).responses.create(model="smol", **body)
    r = requests.post(smol + "/v1/responses", json=dict(body, stream=True), stream=True)
    events = [json.loads(b.split("\n", 1)[1][len("data: "):]) for b in r.text.strip().split("\n\n")]
    calls = {}
    for e in events:
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call":
            calls[e["item"]["id"]] = {"deltas": [], "done": None, "item": None}
        elif e["type"] == "response.function_call_arguments.delta":
            calls[e["item_id"]]["deltas"].append(e["delta"])
        elif e["type"] == "response.function_call_arguments.done":
            calls[e["item_id"]]["done"] = e["arguments"]
        elif e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call":
            calls[e["item"]["id"]]["item"] = e["item"]
    assert calls
    for c in calls.values():
        assert len(c["deltas"]) > 1, c
        assert "".join(c["deltas"]) == c["done"] == c["item"]["arguments"]
    assert [c["done"] for c in calls.values()] == [o.arguments for o in whole.output if o.type == "function_call"]


def test_reasoning_items(tiny):
    """Qwen3.5 thinks first: a reasoning item carries the thinking (streamed as reasoning_text events);
    reasoning.effort "none" turns it off; a reasoning input item reaches the prompt."""
    c = client(tiny)
    r = c.responses.create(model="t", input="Hi", max_output_tokens=12, temperature=0)
    assert r.status == "incomplete" and r.output[0].type == "reasoning" and r.output[0].content[0].text
    _, final, kinds = stream(c, model="t", input="Hi", max_output_tokens=12, temperature=0)
    assert "response.reasoning_text.delta" in kinds and final.output[0].content[0].text == r.output[0].content[0].text
    off = c.responses.create(model="t", input="Hi", max_output_tokens=12, temperature=0, reasoning={"effort": "none"})
    assert all(o.type != "reasoning" for o in off.output)
    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "The user greets me. " * 5}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 1}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "Snow"}]
    n_with = c.responses.create(model="t", input=items, tools=TOOLS, max_output_tokens=1, store=False).usage.input_tokens
    n_without = c.responses.create(model="t", input=[items[0]] + items[2:], tools=TOOLS, max_output_tokens=1, store=False).usage.input_tokens
    assert n_with > n_without + 20


def test_error_shapes(smol):
    cases = [
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "temperature": -1}, "temperature"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.function.name"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "string", "format": "email"}}}},
         "text.format.schema.format"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}, "messages"),
    ]
    for body, param in cases:
        r = requests.post(smol + "/v1/responses", json=body)
        assert r.status_code == 400, (body, r.text)
        e = r.json()["error"]
        assert e["type"] == "invalid_request_error" and e["param"] == param and e["message"].startswith(param + ":"), (param, e)
    r = requests.get(smol + "/v1/responses/resp_missing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as ex:
        client(smol).responses.create(model="m", input=[{"type": "item_reference", "id": "x"}])
    assert ex.value.body["param"] == "input[0].type"
