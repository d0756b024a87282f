"""kiln's Jinja engine vs Python jinja2 configured exactly like HF transformers.

For every real chat template in ../shared/data/chat-templates and every conversation below,
render with jinja2 (SandboxedEnvironment — list/dict mutators allowed, as llama-server and kiln's
default — with trim_blocks, lstrip_blocks, loopcontrols, HF's tojson / raise_exception /
strftime_now, {% generation %}) and with `kiln template render --batch` (one process per
template). Outputs must be byte-identical; when jinja2 raises for a conversation, kiln must fail
too. The templates that mutate are also checked in HF's ImmutableSandboxedEnvironment against
`kiln template render --immutable`.
"""
import copy
import json
import re
import subprocess
from datetime import datetime

import pytest

pytest.importorskip("jinja2")  # in scripts/requirements.txt: never skipped by `make test`
from hf_jinja import hf_environment  # noqa: E402

NOW = datetime(2026, 11, 30)
NOW_ARG = "2026-11-30"


# ---- conversations ------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the user's current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web <fast> & cheap",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "number", "nullable": True}},
            "required": ["query"],
        },
    },
}


def _call(cid, name, args, as_string):
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args},
    }


def conversations():
    sys_msg = {"role": "system", "content": "You are a helpful assistant.\nAnswer briefly."}
    u1 = {"role": "user", "content": "Hello! What's 2+2?"}
    a1 = {"role": "assistant", "content": "2+2 = 4."}
    u2 = {"role": "user", "content": "And in Zürich, is it cold? 🌨️ <b>tags</b> & \"quotes\""}
    convs = {}

    def add(name, messages, **extra):
        convs[name] = dict(messages=messages, **extra)

    add("single_user", [u1])
    add("system_user", [sys_msg, u1])
    add("multi_turn", [u1, a1, u2])
    add("system_multi_turn", [sys_msg, u1, a1, u2])
    add("assistant_last", [sys_msg, u1, a1])
    add("empty_system", [{"role": "system", "content": ""}, u1])
    add("whitespace_content", [{"role": "user", "content": "  padded \n\n"}, {"role": "assistant", "content": "\n ok \n"}, u2])
    add("user_parts", [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": " this."}]}])
    add("system_parts", [{"role": "system", "content": [{"type": "text", "text": "Be terse."}]}, u1])
    add("assistant_parts", [u1, {"role": "assistant", "content": [{"type": "text", "text": "Four."}]}, u2])
    add("reasoning_history", [u1, dict(a1, reasoning_content="The user wants 2+2.\nThat is 4."), u2])
    add("reasoning_last", [sys_msg, u1, dict(a1, reasoning_content="Simple arithmetic.")])
    add("think_tags_in_content", [u1, {"role": "assistant", "content": "<think>\nadd numbers\n</think>\n\n4"}, u2])
    for as_string in (False, True):
        tag = "str" if as_string else "dict"
        call = _call("call_1", "get_weather", {"city": "Zürich", "days": 2, "tags": ["a", "b"]}, as_string)
        call2 = _call("call_2", "search", {"query": "snow \"today\"", "top_k": 3.5}, as_string)
        tool_res = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": -3, \"sky\": \"snow\"}"}
        tool_res2 = {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "No results."}
        add(f"tools_defined_{tag}", [sys_msg, u2], tools=[WEATHER, SEARCH])
        add(f"tools_no_system_{tag}", [u2], tools=[WEATHER])
        add(f"tool_call_{tag}", [sys_msg, u2, {"role": "assistant", "content": "", "tool_calls": [call]}], tools=[WEATHER])
        add(f"tool_call_none_content_{tag}", [u2, {"role": "assistant", "content": None, "tool_calls": [call]}], tools=[WEATHER])
        add(f"tool_roundtrip_{tag}", [sys_msg, u2, {"role": "assistant", "content": "", "tool_calls": [call]}, tool_res], tools=[WEATHER, SEARCH])
        add(f"tool_roundtrip_answer_{tag}",
            [u2, {"role": "assistant", "content": "Let me check.", "tool_calls": [call]}, tool_res,
             {"role": "assistant", "content": "It is -3°C and snowing."}, {"role": "user", "content": "Thanks"}],
            tools=[WEATHER])
        add(f"parallel_calls_{tag}",
            [sys_msg, u2, {"role": "assistant", "content": "", "tool_calls": [call, call2]}, tool_res, tool_res2], tools=[WEATHER, SEARCH])
        add(f"tool_call_reasoning_{tag}",
            [u2, {"role": "assistant", "content": "", "reasoning_content": "Need weather data.", "tool_calls": [call]}, tool_res],
            tools=[WEATHER])
    add("no_messages_tools_none", [u1], tools=None)
    add("long_history", [sys_msg] + [m for k in range(4) for m in (
        {"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": f"answer {k}"})] + [u2])
    add("unicode_control", [{"role": "user", "content": "tab\there\x01 nul? é ñ 中文 \u2028 end"}])
    add("two_users", [u1, {"role": "user", "content": "again?"}])
    return convs


VARIANTS = [
    dict(add_generation_prompt=True),
    dict(add_generation_prompt=False),
    dict(add_generation_prompt=True, enable_thinking=False),
    dict(add_generation_prompt=True, enable_thinking=True),
]


def all_cases():
    cases = []
    for name, conv in conversations().items():
        for k, v in enumerate(VARIANTS):
            # Every conversation with add_generation_prompt both ways; thinking variants for a subset.
            if k >= 2 and not any(t in name for t in ("reasoning", "system_multi_turn", "tool_roundtrip", "single_user")):
                continue
            ctx = copy.deepcopy(conv)
            if ctx.get("tools", 1) is None:
                del ctx["tools"]
            ctx.update(v)
            ctx.update(bos_token="<s>", eos_token="</s>")
            cases.append((f"{name}/{k}", ctx))
    return cases


CASES = all_cases()


def _templates(shared_data):
    return sorted((shared_data / "chat-templates").glob("*.jinja"))


def test_case_count():
    assert len(CASES) >= 30


def test_all_templates_match_jinja2(kiln_bin, shared_data, work_dir, capsys):
    _compare_all(kiln_bin, work_dir, capsys, hf_environment(NOW, immutable=False), _templates(shared_data), [])


MUTATORS = re.compile(r"\.(append|extend|insert|pop|remove|reverse|sort|clear|update|popitem|setdefault)\(")


def test_mutating_templates_match_immutable_hf(kiln_bin, shared_data, work_dir, capsys):
    """HF transformers' ImmutableSandboxedEnvironment vs `kiln template render --immutable`, on the
    templates that call list/dict mutators (Kimi-K2: its tool-call cases fail in both)."""
    templates = [p for p in _templates(shared_data) if MUTATORS.search(p.read_text(encoding="utf-8"))]
    assert templates, "expected at least one shared template that mutates a list (Kimi-K2)"
    _compare_all(kiln_bin, work_dir, capsys, hf_environment(NOW), templates, ["--immutable"], min_templates=1)


def _compare_all(kiln_bin, work_dir, capsys, env, templates, extra_args, min_templates=60):
    assert len(templates) >= min_templates, "expected the 65 shared chat templates"
    batch = work_dir / "jinja_cases.json"
    batch.write_text(json.dumps([c for _, c in CASES], ensure_ascii=False), encoding="utf-8")
    report, failures = [], []
    total = dict(cases=0, identical=0, both_error=0, mismatch=0)
    for path in templates:
        src = path.read_text(encoding="utf-8")
        try:
            tmpl, compile_err = env.from_string(src), None
        except Exception as e:  # template does not even compile in jinja2
            tmpl, compile_err = None, e
        proc = subprocess.run([str(kiln_bin), "template", "render", "--template", str(path), "--batch", str(batch),
                               "--now", NOW_ARG, *extra_args], capture_output=True, timeout=120)
        assert proc.returncode == 0, f"{path.name}: kiln exited {proc.returncode}: {proc.stderr.decode()[-2000:]}"
        ours = json.loads(proc.stdout.decode("utf-8"))
        assert len(ours) == len(CASES)
        stats = dict(cases=0, identical=0, both_error=0, mismatch=0)
        for (cname, ctx), got in zip(CASES, ours):
            stats["cases"] += 1
            try:
                if compile_err:
                    raise compile_err
                want, want_err = tmpl.render(**copy.deepcopy(ctx)), None
            except Exception as e:
                want, want_err = None, f"{type(e).__name__}: {e}"
            if want_err is not None and not got["ok"]:
                stats["both_error"] += 1
            elif want_err is None and got["ok"] and got["text"] == want:
                stats["identical"] += 1
            else:
                stats["mismatch"] += 1
                if stats["mismatch"] <= 3 and len(failures) < 60:
                    failures.append(f"{path.name} [{cname}]: jinja2={'ERR ' + want_err if want_err else repr(want)[:600]}\n"
                                    f"    kiln={repr(got.get('text'))[:600] if got['ok'] else 'ERR ' + got['error']}")
        for k in total:
            total[k] += stats[k]
        report.append(f"{path.name:55s} cases={stats['cases']} identical={stats['identical']} "
                      f"both_error={stats['both_error']} mismatch={stats['mismatch']}")
    with capsys.disabled():
        print("\n" + "\n".join(report))
        print(f"TOTAL templates={len(templates)} " + " ".join(f"{k}={v}" for k, v in total.items()))
    assert total["identical"] > total["cases"] // 2, "most cases must render successfully"
    assert not failures, "kiln differs from jinja2:\n" + "\n".join(failures)


def test_unit_fixture_matches_jinja2(root):
    """tests/unit/jinja_cases.json (used by the C++ unit test) must equal jinja2's output (with list/dict
    mutators allowed, as in kiln's default)."""
    cases = json.loads((root / "tests" / "unit" / "jinja_cases.json").read_text(encoding="utf-8"))
    ctx = {"d": {"a": 1, "b": [1, 2]}, "l": [3, 1, 2], "s": "Hello World", "n": None,
           "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    env = hf_environment(NOW, immutable=False)
    assert len(cases) >= 20
    for src, want in cases:
        assert env.from_string(src).render(**copy.deepcopy(ctx)) == want, src
