"""Chat layer oracle tests: the context kiln builds for a chat template, rendered by Python jinja2
(configured like HF transformers), must give exactly the prompt kiln renders; the context itself
must follow llama-server's semantics (reasoning preserve, developer role, images, kwargs); and the
streamed deltas of `kiln chat parse`, accumulated by the official openai SDK, must equal kiln's
complete message."""
import json
import subprocess
from datetime import datetime

import pytest
from hf_jinja import hf_environment

NOW = "2026-03-14"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Web search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.",
     "tool_calls": [{"id": "call_a", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "21°C and sunny.", "reasoning_content": "Report it."},
    {"role": "user", "content": "And Oslo? Also search for ferries."},
    {"role": "assistant", "content": None, "reasoning_content": "Two calls.",
     "tool_calls": [
         {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
         {"id": "call_c", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"ferries Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_b", "content": "cold"},
    {"role": "tool", "tool_call_id": "call_c", "content": "3 results"},
]


def hf_render(source: str, context: dict) -> str:
    """Renders like transformers' apply_chat_template (ImmutableSandboxedEnvironment)."""
    return hf_environment(datetime.strptime(NOW, "%Y-%m-%d")).from_string(source).render(**context)


def kiln_chat(kiln_bin, work_dir, action, template, request, *extra):
    req = work_dir / f"req_{abs(hash(json.dumps(request, sort_keys=True)))}.json"
    req.write_text(json.dumps(request))
    cmd = [str(kiln_bin), "chat", action, "--template", str(template), "--request", str(req),
           "--now", NOW, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return r


def render(kiln_bin, work_dir, template, request, *extra):
    r = kiln_chat(kiln_bin, work_dir, "render", template, request, *extra)
    assert r.returncode == 0, r.stderr + r.stdout
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def templates(shared_data):
    return shared_data / "chat-templates"


def test_qwen35_tools_reasoning_preserve_on(kiln_bin, work_dir, templates):
    tpl = templates / "Qwen3.5-4B.jinja"
    out = render(kiln_bin, work_dir, tpl, {"messages": CONVERSATION, "tools": TOOLS})
    ctx = out["context"]
    assert out["prompt"] == hf_render(tpl.read_text(), ctx)
    # Context semantics: every assistant turn keeps its reasoning, arguments are objects.
    assistants = [m for m in ctx["messages"] if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in assistants] == ["Need the weather tool.", "Report it.", "Two calls."]
    assert assistants[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "days": 2}
    assert assistants[2]["content"] == ""
    assert ctx["tools"] == TOOLS and ctx["add_generation_prompt"] is True and ctx["enable_thinking"] is True
    # The current turn's reasoning is rendered (after the last user query), calls in XML form.
    assert "<think>\nTwo calls.\n</think>" in out["prompt"]
    assert "<function=search>\n<parameter=query>\nferries Oslo\n</parameter>" in out["prompt"]
    assert out["prompt"].endswith("<|im_start|>assistant\n<think>\n")
    assert out["starts_in_reasoning"] is True
    assert out["caps"]["tool_format"] == "qwen-xml" and out["caps"]["supports_tools"]
    assert out["parser"]["parse_tool_calls"] is True and out["parser"]["starts_in_reasoning"] is True


def test_qwen35_reasoning_preserve_off(kiln_bin, work_dir, templates):
    tpl = templates / "Qwen3.5-4B.jinja"
    out = render(kiln_bin, work_dir, tpl, {"messages": CONVERSATION, "tools": TOOLS}, "--no-reasoning-preserve")
    ctx = out["context"]
    assert out["prompt"] == hf_render(tpl.read_text(), ctx)
    assistants = [m for m in ctx["messages"] if m["role"] == "assistant"]
    # Earlier turns (before the last user message) lose their reasoning; the current one keeps it.
    assert [m.get("reasoning_content") for m in assistants] == [None, None, "Two calls."]


def test_qwen35_thinking_off_developer_and_images(kiln_bin, work_dir, templates):
    tpl = templates / "Qwen3.5-4B.jinja"
    req = {"messages": [
        {"role": "developer", "content": "Be kind."},
        {"role": "user", "content": [{"type": "text", "text": "What is in"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
                                     {"type": "text", "text": "this?"}]}],
        "chat_template_kwargs": {"enable_thinking": False}}
    out = render(kiln_bin, work_dir, tpl, req)
    ctx = out["context"]
    assert out["prompt"] == hf_render(tpl.read_text(), ctx)
    assert ctx["messages"][0]["role"] == "system"
    assert ctx["enable_thinking"] is False
    assert out["image_urls"] == ["data:image/png;base64,AAA"]
    assert out["prompt"].count("<__media__>") == 1
    assert out["prompt"].endswith("<think>\n\n</think>\n\n")
    assert out["starts_in_reasoning"] is False


@pytest.mark.parametrize("name", [
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen3-Coder.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
])
def test_other_templates_match_jinja2(kiln_bin, work_dir, templates, name):
    tpl = templates / name
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "a1b2c3d4e", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "Thanks!"}]
    out = render(kiln_bin, work_dir, tpl, {"messages": messages, "tools": TOOLS}, "--bos", "<s>", "--eos", "</s>")
    assert out["prompt"] == hf_render(tpl.read_text(), out["context"])


def test_template_error_is_reported(kiln_bin, work_dir, templates):
    # Qwen3.5 raises for a system message that is not first: an error, not a crash.
    tpl = templates / "Qwen3.5-4B.jinja"
    r = kiln_chat(kiln_bin, work_dir, "render", tpl,
                  {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]})
    assert r.returncode == 1
    assert "System message must be at the beginning" in r.stderr


def test_request_error_names_field(kiln_bin, work_dir, templates):
    r = kiln_chat(kiln_bin, work_dir, "render", templates / "Qwen3.5-4B.jinja",
                  {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]})
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert err == {"field": "messages[1].role", "message": "unknown role 'robot'"}


GENERATED = ("The user wants two things.\nI'll call both tools.\n</think>\n\nChecking now.\n\n"
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
             "<tool_call>\n<function=search>\n<parameter=query>\nferries <Oslo> & \"Bergen\"\n</parameter>\n"
             "</function>\n</tool_call>")


@pytest.mark.parametrize("max_chunk,seed", [(1, 0), (5, 1), (17, 2), (1000, 3)])
def test_stream_deltas_accumulate_in_openai_sdk(kiln_bin, work_dir, templates, tmp_path, max_chunk, seed):
    import openai.lib.streaming.chat as openai_streaming  # in scripts/requirements.txt
    from openai.types.chat import ChatCompletionChunk

    gen = tmp_path / "gen.txt"
    gen.write_text(GENERATED)
    req = {"messages": [{"role": "user", "content": "Oslo weather and ferries?"}], "tools": TOOLS, "stream": True}
    r = kiln_chat(kiln_bin, work_dir, "parse", templates / "Qwen3.5-4B.jinja", req,
                  "--output", str(gen), "--max-chunk", str(max_chunk), "--seed", str(seed))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    msg = out["message"]
    assert out["finish_reason"] == "tool_calls"
    assert msg["reasoning_content"] == "The user wants two things.\nI'll call both tools."
    assert msg["content"] == "Checking now."
    calls = msg["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "search"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 3}
    assert json.loads(calls[1]["function"]["arguments"]) == {"query": "ferries <Oslo> & \"Bergen\""}
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)

    # Feed the deltas, as OpenAI chunks, to the SDK's own stream accumulator.
    state = openai_streaming.ChatCompletionStreamState()
    chunks = [{"role": "assistant"}] + out["chunks"]
    for i, delta in enumerate(chunks):
        last = i == len(chunks) - 1
        state.handle_chunk(ChatCompletionChunk.model_validate({
            "id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": out["finish_reason"] if last else None}]}))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert final.message.content == msg["content"]
    got = [(c.id, c.function.name, c.function.arguments) for c in final.message.tool_calls]
    want = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    assert got == want
    # reasoning_content is not an OpenAI field; the SDK keeps it as an extra on each delta.
    streamed_reasoning = "".join(d.get("reasoning_content", "") for d in out["chunks"])
    assert streamed_reasoning == msg["reasoning_content"]
