"""`kiln gguf gen` files checked by independent oracles.

- llama.cpp itself (the `llama_cpp` module of llama-cpp-python) loads every generated tiny model
  (llama, qwen3, qwen35, qwen35moe; F32/F16/BF16, quant types, the iq4_xs / q4_k_m mixes, MTP) and
  produces finite, non-degenerate logits; quantized files give logits close to the F32 file's.
- The `gguf` PyPI package reads the files (keys, tensor names/types/shapes, value conventions).
- jinja2 renders the embedded chat template; llama.cpp's tokenizer round-trips text with the
  embedded BPE vocabulary.
"""
import hashlib
import json
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")
jinja2 = pytest.importorskip("jinja2")

PROMPT = b"The kiln is hot and the potter looks at every bowl. What is 6 times 7?"


def gen(kiln_bin, out, *args):
    cmd = [str(kiln_bin), "gguf", "gen", "-q", "-o", str(out), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{cmd}: {r.stderr}"
    return out


@pytest.fixture(scope="module")
def models(kiln_bin, work_dir):
    """Generates every file once: name -> path."""
    specs = {
        "llama-f16": ["--preset", "tiny-llama"],
        "llama-f32": ["--preset", "tiny-llama", "--type", "F32"],
        "llama-q4km": ["--preset", "tiny-llama", "--mix", "q4_k_m"],
        "qwen3-f16": ["--preset", "tiny-qwen3"],
        "qwen3-f32": ["--preset", "tiny-qwen3", "--type", "F32"],
        "qwen3-q8": ["--preset", "tiny-qwen3", "--type", "Q8_0"],
        "qwen35-f16": ["--preset", "tiny-qwen35"],
        "qwen35-f32": ["--preset", "tiny-qwen35", "--type", "F32"],
        "qwen35-bf16": ["--preset", "tiny-qwen35", "--type", "BF16"],
        "qwen35-q8": ["--preset", "tiny-qwen35", "--type", "Q8_0"],
        "qwen35-q4k": ["--preset", "tiny-qwen35", "--type", "Q4_K"],
        "qwen35-iq4xs-mix": ["--preset", "tiny-qwen35", "--mix", "iq4_xs"],
        "qwen35-q4km-mtp": ["--preset", "tiny-qwen35", "--mix", "q4_k_m", "--mtp"],
        "qwen35-f32-mtp": ["--preset", "tiny-qwen35", "--type", "F32", "--mtp"],
        "moe-f16": ["--preset", "tiny-qwen35moe"],
        "moe-f32": ["--preset", "tiny-qwen35moe", "--type", "F32"],
        "moe-iq4xs-mix": ["--preset", "tiny-qwen35moe", "--mix", "iq4_xs"],
    }
    return {k: gen(kiln_bin, work_dir / f"{k}.gguf", *v) for k, v in specs.items()}


_logits_cache = {}


def llama_logits(path):
    """All-position logits from llama.cpp for PROMPT: [n_tokens, n_vocab]."""
    if path in _logits_cache:
        return _logits_cache[path]
    m = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=64, logits_all=True, verbose=False,
                        n_threads=2, seed=0)
    toks = m.tokenize(PROMPT, add_bos=True, special=False)
    m.reset()
    m.eval(toks)
    lg = np.array(m.scores[: len(toks)], dtype=np.float64)
    assert lg.shape == (len(toks), m.n_vocab())
    _logits_cache[path] = lg
    return lg


def assert_healthy(lg):
    assert np.isfinite(lg).all()
    std = lg.std(axis=1)
    assert std.min() > 0.5, f"logits too flat: std {std}"
    assert std.max() < 50, f"logits exploded: std {std}"
    top1 = lg.argmax(axis=1)
    assert len(set(top1.tolist())) >= len(top1) // 3, f"top-1 barely varies: {top1}"
    # positions differ from each other (the model is not ignoring its input)
    assert np.abs(np.diff(lg, axis=0)).max() > 0.5


@pytest.mark.parametrize("name", ["llama-f16", "qwen3-f16", "qwen35-f16", "qwen35-bf16", "moe-f16",
                                  "qwen35-f32-mtp"])
def test_llamacpp_runs_float_models(models, name):
    lg = llama_logits(models[name])
    assert_healthy(lg)
    print(f"{name}: logit std {lg.std(axis=1).mean():.3f}, top-1 {lg.argmax(axis=1).tolist()}")


@pytest.mark.parametrize("name,ref,min_corr", [
    ("llama-f16", "llama-f32", 0.999),
    ("qwen35-f16", "qwen35-f32", 0.999),
    ("moe-f16", "moe-f32", 0.999),
    ("qwen3-q8", "qwen3-f32", 0.99),
    ("qwen35-q8", "qwen35-f32", 0.99),
    # 4-bit weights (~7% relative error each) perturb these random networks a lot; the bounds only
    # catch broken blocks (garbage data decorrelates to ~0). MoE routing flips experts: lower bound.
    ("qwen35-q4k", "qwen35-f32", 0.7),
    ("qwen35-iq4xs-mix", "qwen35-f32", 0.7),
    ("qwen35-q4km-mtp", "qwen35-f32", 0.7),
    ("llama-q4km", "llama-f32", 0.9),
    ("moe-iq4xs-mix", "moe-f32", 0.4),
])
def test_quantized_logits_track_f32(models, name, ref, min_corr):
    """Same seed, different storage type: llama.cpp's logits must stay close to the F32 file's."""
    lg, lr = llama_logits(models[name]), llama_logits(models[ref])
    assert_healthy(lg)
    corr = np.corrcoef(lg.ravel(), lr.ravel())[0, 1]
    print(f"{name} vs {ref}: correlation {corr:.4f}")
    assert corr > min_corr


def read(path):
    return gguf.GGUFReader(str(path))


def field(r, key):
    f = r.fields[key]
    return f.contents()


def tensors(r):
    return {t.name: t for t in r.tensors}


@pytest.mark.parametrize("name,arch", [("llama-f16", "llama"), ("qwen3-f16", "qwen3"),
                                       ("qwen35-f16", "qwen35"), ("moe-f16", "qwen35moe")])
def test_gguf_package_reads_metadata(models, name, arch):
    r = read(models[name])
    assert field(r, "general.architecture") == arch
    ts = tensors(r)
    toks = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    emb = ts["token_embd.weight"]
    assert len(toks) == len(types) == int(emb.shape[1]) == field(r, f"{arch}.vocab_size")
    assert int(emb.shape[0]) == field(r, f"{arch}.embedding_length")
    assert len(set(toks)) == len(toks), "token strings must be unique"
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    merges = field(r, "tokenizer.ggml.merges")
    assert len(merges) > 100 and all(len(m.split(" ")) == 2 for m in merges)
    n_layer = field(r, f"{arch}.block_count")
    assert f"blk.{n_layer - 1}.attn_norm.weight" in ts and f"blk.{n_layer}.attn_norm.weight" not in ts
    for t in r.tensors:  # F16 file: 1-D tensors F32, matrices F16 except the never-quantized ones
        if len(t.shape) == 1 or "ssm_conv1d" in t.name or "ffn_gate_inp.weight" in t.name:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F16, t.name
        assert np.isfinite(np.asarray(t.data, dtype=np.float32)).all(), t.name
    if arch.startswith("qwen"):
        assert field(r, "tokenizer.ggml.pre") == "qwen2"
        assert field(r, "tokenizer.ggml.add_bos_token") is False
        ctrl = {toks[i] for i in range(len(toks)) if types[i] == 3}
        user = {toks[i] for i in range(len(toks)) if types[i] == 4}
        assert {"<|endoftext|>", "<|im_start|>", "<|im_end|>"} <= ctrl
        assert {"<think>", "</think>", "<tool_call>", "</tool_call>"} <= user
        assert toks[field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    else:
        assert field(r, "tokenizer.ggml.pre") == "llama-bpe"
        assert toks[field(r, "tokenizer.ggml.bos_token_id")] == "<|begin_of_text|>"
        assert "output.weight" not in ts  # tiny-llama has tied embeddings
    if arch == "qwen3":
        assert "blk.0.attn_q_norm.weight" in ts and "blk.0.attn_k_norm.weight" in ts


def test_qwen35_conventions(models):
    r = read(models["qwen35-f32-mtp"])
    ts = tensors(r)
    hk, hv = field(r, "qwen35.ssm.group_count"), field(r, "qwen35.ssm.time_step_rank")
    assert hk != hv and hv % hk == 0
    n_all, n_mtp = field(r, "qwen35.block_count"), field(r, "qwen35.nextn_predict_layers")
    assert n_mtp == 1
    interval = field(r, "qwen35.full_attention_interval")
    n_layer = n_all - n_mtp
    full = [i for i in range(n_layer) if (i + 1) % interval == 0]
    delta = [i for i in range(n_layer) if (i + 1) % interval != 0]
    assert len(full) >= 1 and len(delta) >= 2
    for i in full + [n_layer]:  # the MTP block is full attention too
        assert f"blk.{i}.attn_q.weight" in ts and f"blk.{i}.attn_qkv.weight" not in ts
    for i in delta:
        a = np.asarray(ts[f"blk.{i}.ssm_a"].data)
        assert (a <= -0.01).all() and (a >= -0.5).all()  # -exp(A_log), A_log in [log 0.01, log 0.5]
        assert f"blk.{i}.ssm_a.weight" not in ts
        assert ts[f"blk.{i}.ssm_conv1d.weight"].tensor_type == gguf.GGMLQuantizationType.F32
        dt = np.asarray(ts[f"blk.{i}.ssm_dt.bias"].data)
        assert 0.5 < dt.mean() < 1.5
    for name in ["nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight"]:
        assert f"blk.{n_layer}.{name}" in ts
    assert [int(x) for x in ts[f"blk.{n_layer}.nextn.eh_proj.weight"].shape] == [
        2 * field(r, "qwen35.embedding_length"), field(r, "qwen35.embedding_length")]
    norm = np.asarray(ts["blk.0.attn_norm.weight"].data)
    assert 0.8 < norm.mean() < 1.2  # +1 already applied
    assert len(field(r, "qwen35.rope.dimension_sections")) == 4


def test_mixes_choose_types_like_llama_quantize(models):
    Q = gguf.GGMLQuantizationType
    ts = tensors(read(models["qwen35-iq4xs-mix"]))
    assert ts["output.weight"].tensor_type == Q.Q6_K
    assert ts["blk.3.ffn_up.weight"].tensor_type == Q.IQ4_XS
    # ssm_out rows are 128 long: IQ4_XS (256-blocks) falls back to IQ4_NL
    assert ts["blk.0.ssm_out.weight"].tensor_type == Q.IQ4_NL
    assert ts["blk.0.ssm_conv1d.weight"].tensor_type == Q.F32
    ts = tensors(read(models["llama-q4km"]))
    assert ts["token_embd.weight"].tensor_type == Q.Q6_K  # tied: quantized like the output
    # llama.cpp's use_more_bits(i, n) for n = 2 layers: layer 1 gets more bits, layer 0 not
    assert ts["blk.0.attn_v.weight"].tensor_type == Q.Q4_K
    assert ts["blk.1.attn_v.weight"].tensor_type == Q.Q6_K
    assert ts["blk.1.ffn_down.weight"].tensor_type == Q.Q6_K
    assert ts["blk.0.ffn_up.weight"].tensor_type == Q.Q4_K
    ts = tensors(read(models["moe-iq4xs-mix"]))
    assert ts["blk.0.ffn_gate_inp.weight"].tensor_type == Q.F32
    assert ts["blk.0.ffn_gate_exps.weight"].tensor_type == Q.IQ4_XS
    assert [int(x) for x in ts["blk.0.ffn_down_exps.weight"].shape] == [256, 256, 4]


def test_tokenizer_round_trips_in_llamacpp(models):
    m = llama_cpp.Llama(model_path=str(models["qwen35-f16"]), n_ctx=64, verbose=False, vocab_only=True)
    text = "The kiln is hot. Please call the weather tool for Berlin: 42 times!\n\tdone ünïcode ✓"
    toks = m.tokenize(text.encode(), add_bos=False, special=False)
    assert m.detokenize(toks).decode() == text
    assert len(toks) < len(text.encode()) * 0.7, "merges should compress common English"
    special = m.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    vocab = read(models["qwen35-f16"])
    toks_list = field(vocab, "tokenizer.ggml.tokens")
    assert toks_list[special[0]] == "<|im_start|>" and toks_list[special[-1]] == "<|im_end|>"


def render(path, **kw):
    tmpl = field(read(path), "tokenizer.chat_template")
    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env.from_string(tmpl).render(**kw)


def test_chat_template_chatml_tools_thinking(models):
    p = models["qwen35-f16"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = render(p, messages=msgs, add_generation_prompt=True)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n")
    out = render(p, messages=msgs[1:], add_generation_prompt=True, enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    conv = [
        {"role": "user", "content": "Weather in Berlin?"},
        {"role": "assistant", "content": "", "reasoning_content": "need the tool",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Berlin"}}}]},
        {"role": "tool", "content": "12 C"},
        {"role": "tool", "content": "rain"},
    ]
    out = render(p, messages=conv, tools=tools, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\n")
    assert json.dumps(tools[0]) in out
    assert "<think>\nneed the tool\n</think>" in out
    call = out.split("<tool_call>\n")[2].split("\n</tool_call>")[0]  # [1] is the format example
    assert json.loads(call) == {"name": "get_weather", "arguments": {"city": "Berlin"}}
    # consecutive tool results share one user turn
    assert out.count("<|im_start|>user\n<tool_response>") == 1
    assert "<tool_response>\n12 C\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>" in out
    assert out.endswith("<|im_start|>assistant\n")
    assert out.count("<|im_start|>") == out.count("<|im_end|>") + 1


def test_llama_chat_template(models):
    out = render(models["llama-f16"], messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                 bos_token="<|begin_of_text|>")
    assert out == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_deterministic_and_thread_independent(kiln_bin, work_dir):
    a = gen(kiln_bin, work_dir / "det-a.gguf", "--preset", "tiny-qwen35moe", "--type", "Q4_K", "-t", "1")
    b = gen(kiln_bin, work_dir / "det-b.gguf", "--preset", "tiny-qwen35moe", "--type", "Q4_K", "-t", "2")
    c = gen(kiln_bin, work_dir / "det-c.gguf", "--preset", "tiny-qwen35moe", "--type", "Q4_K", "--seed", "7")
    assert sha(a) == sha(b)
    assert sha(a) != sha(c)


def test_overrides_and_errors(kiln_bin, work_dir):
    p = gen(kiln_bin, work_dir / "ovr.gguf", "--arch", "qwen35", "--n-layer", "8", "--n-embd", "128",
            "--ssm-groups", "1", "--ssm-v-heads", "3", "--n-vocab", "600", "--untied")
    r = read(p)
    assert field(r, "qwen35.block_count") == 8 and field(r, "qwen35.embedding_length") == 128
    assert int(tensors(r)["token_embd.weight"].shape[1]) == 600
    assert_healthy(llama_logits(p))

    def fails(*args):
        r = subprocess.run([str(kiln_bin), "gguf", "gen", "-o", str(work_dir / "bad.gguf"), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert not (work_dir / "bad.gguf").exists()
        return r.stderr

    assert "n_head_kv" in fails("--preset", "tiny-llama", "--n-head-kv", "3")
    assert "n_vocab" in fails("--preset", "tiny-qwen3", "--n-vocab", "100")
    assert "ssm_dt_rank" in fails("--arch", "qwen35", "--ssm-groups", "3")
    assert "preset" in fails("--preset", "nope")
    assert "mix" in fails("--preset", "tiny-llama", "--mix", "q9")
    assert "MTP" in fails("--preset", "tiny-llama", "--mtp")


def test_help_and_presets(kiln_bin):
    r = subprocess.run([str(kiln_bin), "gguf", "gen", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for opt in ["--arch", "--preset", "--type", "--mix", "--seed", "--mtp", "--list-presets", "--n-layer", "-o"]:
        assert opt in r.stdout
    r = subprocess.run([str(kiln_bin), "gguf", "gen", "--list-presets"], capture_output=True, text=True)
    for p in ["tiny-llama", "tiny-qwen3", "tiny-qwen35", "tiny-qwen35moe", "qwen35-0.8b", "qwen35-9b",
              "qwen35-27b", "llama-1b"]:
        assert p in r.stdout


def test_real_preset_sizes(kiln_bin):
    """Plans only (nothing written): a 9B IQ4_XS-mix file is about 5 GB."""
    r = subprocess.run([str(kiln_bin), "gguf", "gen", "--preset", "qwen35-9b", "--mix", "iq4_xs", "--mtp",
                        "--dry-run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    gib = float(last.split(",")[2].split()[0])
    params = float(last.split(",")[1].split()[0])
    assert 4.5 < gib < 6.0 and 8.5 < params < 10.5, last
    assert "blk.32.nextn.eh_proj.weight" in r.stdout


def test_vocab_from_a_llamacpp_vocab_file(kiln_bin, work_dir, shared_data):
    """--vocab: the file carries the vocab GGUF's tokenizer, padded with unused tokens to n_vocab;
    llama.cpp and kiln tokenize text with it as llama.cpp does with the vocab file itself."""
    src = shared_data / "vocab" / "ggml-vocab-qwen35.gguf"
    if not src.exists():
        pytest.skip(f"{src} not found")
    out = gen(kiln_bin, work_dir / "qwen35-realvocab.gguf", "--preset", "tiny-qwen35", "--type", "Q8_0",
              "--n-vocab", "160000", "--vocab", str(src))
    r, v = read(out), read(src)
    n_src = len(field(v, "tokenizer.ggml.tokens"))
    toks = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    assert len(toks) == len(types) == 160000
    assert toks[:n_src] == field(v, "tokenizer.ggml.tokens") and toks[n_src] == f"[PAD{n_src}]"
    assert all(int(t) == 5 for t in types[n_src:])
    assert field(r, "tokenizer.ggml.pre") == field(v, "tokenizer.ggml.pre")
    assert field(r, "tokenizer.chat_template") == field(v, "tokenizer.chat_template")
    emb = [t for t in r.tensors if t.name == "token_embd.weight"][0]
    assert int(emb.shape[1]) == 160000
    text = b"The kiln is hot. Please call the weather tool for Berlin: 42 times!"
    ref = llama_cpp.Llama(model_path=str(src), n_ctx=64, verbose=False, vocab_only=True).tokenize(text, add_bos=False)
    got = llama_cpp.Llama(model_path=str(out), n_ctx=64, verbose=False, vocab_only=True).tokenize(text, add_bos=False)
    assert got == ref
    k = subprocess.run([str(kiln_bin), "tokenize", "-m", str(out), "-p", text.decode()], capture_output=True,
                       text=True, timeout=60)
    assert k.returncode == 0, k.stderr
    assert [int(x) for x in k.stdout.split()] == ref
    # Fewer tokens than the vocab file has: a clear error.
    bad = subprocess.run([str(kiln_bin), "gguf", "gen", "-q", "-o", str(work_dir / "bad.gguf"), "--preset",
                          "tiny-qwen35", "--n-vocab", "1000", "--vocab", str(src)], capture_output=True, text=True)
    assert bad.returncode == 2 and "below the" in bad.stderr and "--vocab" in bad.stderr
