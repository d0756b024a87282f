#!/usr/bin/env python3
"""HF transformers oracle fixtures: tiny random-weight HF models, their logits, and GGUF files.

For each architecture (llama, qwen3, qwen35, qwen35moe) this script
  1. builds the HF model from a small config (LlamaForCausalLM, Qwen3ForCausalLM, Qwen3_5ForCausalLM,
     Qwen3_5MoeForCausalLM) and re-initialises every weight from a seeded generator so activations
     have realistic scales (norm weights, A_log, dt_bias and conv kernels randomised too);
  2. runs fixed token sequences through it (float32, CPU, eager attention, no cache) and saves the
     logits of every position;
  3. converts the HF state dict to GGUF (F32) with our own converter (`convert`, numpy only), which
     follows llama.cpp's convert_hf_to_gguf.py conventions (facts re-checked against its source):
       - llama: q/k rows permuted from HF's rotate-half pairing to ggml's adjacent-pair RoPE;
       - qwen35/qwen35moe: +1 on every `*norm.weight` except `linear_attn.norm.weight` (HF computes
         x*(1+w) there; the gated ssm_norm computes x*w), A_log -> ssm_a = -exp(A_log),
         dt_bias -> ssm_dt.bias, conv1d [C,1,K] squeezed to [C,K], V heads reordered grouped ->
         tiled when linear_num_key_heads != linear_num_value_heads (V rows of in_proj_qkv, in_proj_z,
         in_proj_a/b, A_log, dt_bias, V channels of conv1d, input columns of out_proj),
         attn_q kept as HF stores it (per head [q | gate]), rope.dimension_sections from
         mrope_section padded to 4, full_attention_interval and attention.recurrent_layers,
         ssm.* keys; fused experts gate_up_proj split into ffn_gate_exps / ffn_up_exps;
       - qwen35/qwen35moe MTP (a state dict with mtp.*, as Qwen3.5 checkpoints hold it; llama.cpp's
         _Qwen35MtpMixin): mtp.fc / pre_fc_norm_embedding / pre_fc_norm_hidden / norm ->
         blk.<n_layer>.nextn.eh_proj / enorm / hnorm / shared_head_norm (+1 on the three norms),
         mtp.layers.0.* -> blk.<n_layer>.*, block_count = n_layer + 1, <arch>.nextn_predict_layers = 1,
         recurrent_layers false for the MTP block (used by scripts/train_mtp_fixture.py).
     `convert(..., ftype="f16")` writes matrices as F16 (llama.cpp's --outtype f16 choice).

Output, per architecture: OUT/<arch>/{model.gguf, tokens.json, logits.npy, config.json, weights.npz}
(weights.npz is the HF state dict, so `--convert-only` can re-make model.gguf without torch).

  python3 scripts/hf_fixtures.py --out tests/fixtures/hf           # needs torch + transformers 5.x
  python3 scripts/hf_fixtures.py --convert-only tests/fixtures/hf  # numpy + gguf only
  python3 scripts/hf_fixtures.py --selftest /tmp/x                 # converter on fake weights

Consumed by tests/py/test_model_hf.py.
"""
import argparse
import json
import pathlib
import sys

import numpy as np

ARCHS = ["llama", "qwen3", "qwen35", "qwen35moe"]
N_VOCAB = 512
SEQ_LENS = [8, 37, 64]

ROPE_QWEN35 = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
               "mrope_section": [11, 11, 10], "mrope_interleaved": True}
LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4)  # Hk != Hv: exercises the V-head reorder

# HF config kwargs per architecture (class names resolved in build_hf).
CONFIGS = {
    "llama": dict(vocab_size=N_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                  max_position_embeddings=256, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "qwen3": dict(vocab_size=N_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                  max_position_embeddings=256, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "qwen35": dict(vocab_size=N_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                   max_position_embeddings=256, tie_word_embeddings=False,
                   layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                   rope_parameters=dict(ROPE_QWEN35), **LINEAR),
    "qwen35moe": dict(vocab_size=N_VOCAB, hidden_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48,
                      rope_parameters=dict(ROPE_QWEN35), **LINEAR),
}
HF_CLASSES = {  # (config class candidates, model class candidates)
    "llama": (["LlamaConfig"], ["LlamaForCausalLM"]),
    "qwen3": (["Qwen3Config"], ["Qwen3ForCausalLM"]),
    "qwen35": (["Qwen3_5TextConfig"], ["Qwen3_5ForCausalLM"]),
    "qwen35moe": (["Qwen3_5MoeTextConfig"], ["Qwen3_5MoeForCausalLM"]),
}
GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen35": "qwen35", "qwen35moe": "qwen35moe"}


# ---------------------------------------------------------------------------------------------
# vocabulary: byte-level BPE (GPT-2 byte <-> unicode map), 256 bytes + merges + 3 control tokens
# ---------------------------------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_vocab(n_vocab: int):
    b2u = bytes_to_unicode()
    tokens = [b2u[i] for i in range(256)]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = []
    letters = "etaoinshrdlucmfwypvbgk"
    pairs = [(a, b) for a in letters for b in letters] + [(b2u[ord(" ")], a) for a in letters]
    for a, b in pairs:
        if len(tokens) >= n_vocab - len(specials):
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    tokens += specials
    types = [1] * (n_vocab - len(specials)) + [3] * len(specials)  # 1 NORMAL, 3 CONTROL
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    return tokens, types, merges


# ---------------------------------------------------------------------------------------------
# converter: HF state dict (numpy) -> GGUF, llama.cpp conventions
# ---------------------------------------------------------------------------------------------
def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half pairs (i, i+d/2) -> ggml normal RoPE pairs (2i, 2i+1), per head (rows)."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def reorder_v_heads(t: np.ndarray, axis: int, n_k: int, n_v_per_k: int, head_dim: int) -> np.ndarray:
    """V heads grouped by K head [K0v0..K0v(r-1), K1v0, ...] -> tiled [K0v0, K1v0, ..., K0v1, ...]."""
    axis = axis % t.ndim
    shape = list(t.shape)
    assert shape[axis] == n_k * n_v_per_k * head_dim, (shape, axis, n_k, n_v_per_k, head_dim)
    t = t.reshape(shape[:axis] + [n_k, n_v_per_k, head_dim] + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(t, axis, axis + 1)).reshape(shape)


MTP_NEXTN = {  # HF MTP tensors -> blk.<n_layer>.nextn.* (llama.cpp's _Qwen35MtpMixin)
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
}


def is_zero_centered_norm(arch: str, hf_name: str) -> bool:
    """HF RMSNorms that compute x*(1+w): every Qwen3.5 *norm.weight except the gated linear_attn.norm,
    and the MTP block's pre_fc_norm_embedding / pre_fc_norm_hidden (llama.cpp adds 1 to them too)."""
    return arch in ("qwen35", "qwen35moe") and (hf_name.endswith("norm.weight") or hf_name in MTP_NEXTN and
                                                "norm" in hf_name) and \
        not hf_name.endswith("linear_attn.norm.weight")


def n_mtp_layers(sd) -> int:
    """1 when the state dict carries a Qwen3.5 MTP block (mtp.*), else 0 (llama.cpp supports one)."""
    return int(any(k.startswith("mtp.") for k in sd))


def f16_in_gguf(gguf_name: str, arr) -> bool:
    """llama.cpp's converter with --outtype f16 (and kiln gguf gen's quantizable()): matrices F16;
    1-D tensors, *_norm.weight, ssm_conv1d and ffn_gate_inp stay F32."""
    return np.ndim(arr) >= 2 and gguf_name.endswith("weight") and "_norm.weight" not in gguf_name and \
        "ssm_conv1d" not in gguf_name and "ffn_gate_inp.weight" not in gguf_name


def map_tensors(arch: str, cfg: dict, sd: dict) -> dict:
    """HF name -> transformed GGUF tensors. Returns {gguf_name: float32 array (numpy order)}.
    numpy shape [a, b] is ggml ne {b, a}."""
    hybrid = arch in ("qwen35", "qwen35moe")
    out = {}
    used = set()
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tied = bool(cfg.get("tie_word_embeddings", False))

    def put(name, arr):
        assert name not in out, name
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)

    if hybrid:
        n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        r = n_v // n_k
        reorder = n_k != n_v

    n_layer = cfg["num_hidden_layers"]
    for hf, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        used.add(hf)
        if is_zero_centered_norm(arch, hf):
            w = w + 1.0
        if hf.startswith("mtp."):  # the MTP block is block n_layer (llama.cpp: mtp.layers.0.* -> blk.<n_layer>.*)
            if not hybrid:
                raise ValueError(f"unexpected HF tensor {hf}")
            if hf in MTP_NEXTN:
                put(f"blk.{n_layer}.{MTP_NEXTN[hf]}", w)
                continue
            if not hf.startswith("mtp.layers.0."):
                raise ValueError(f"unexpected HF tensor {hf} (one MTP layer only)")
            hf = f"model.layers.{n_layer}." + hf[len("mtp.layers.0."):]
        if hf == "model.embed_tokens.weight":
            put("token_embd.weight", w)
            continue
        if hf == "model.norm.weight":
            put("output_norm.weight", w)
            continue
        if hf == "lm_head.weight":
            if not tied:
                put("output.weight", w)
            continue
        parts = hf.split(".")
        if len(parts) < 4 or parts[0] != "model" or parts[1] != "layers":
            raise ValueError(f"unexpected HF tensor {hf}")
        bid = int(parts[2])
        rest = ".".join(parts[3:])
        p = f"blk.{bid}."
        simple = {
            "input_layernorm.weight": "attn_norm.weight",
            "post_attention_layernorm.weight": "post_attention_norm.weight" if hybrid else "ffn_norm.weight",
            "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.o_proj.weight": "attn_output.weight",
            "self_attn.q_norm.weight": "attn_q_norm.weight",
            "self_attn.k_norm.weight": "attn_k_norm.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight",
            "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight",
            "mlp.gate.weight": "ffn_gate_inp.weight",
            "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
            "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
            "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
            "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",  # [1, E] as in llama.cpp (no squeeze)
            "mlp.experts.down_proj": "ffn_down_exps.weight",  # [n_expert, E, n_ff] -> ne {n_ff, E, n_expert}
            "linear_attn.norm.weight": "ssm_norm.weight",
        }
        if rest in simple:
            put(p + simple[rest], w)
        elif rest == "self_attn.q_proj.weight":
            # llama: rotate-half -> adjacent pairs. qwen3 (NEOX rope in llama.cpp): unchanged.
            # qwen35: rows are per head [q(D) | gate(D)], which is llama.cpp's attn_q layout: unchanged.
            put(p + "attn_q.weight", permute_rope_rows(w, n_head) if arch == "llama" else w)
        elif rest == "self_attn.k_proj.weight":
            put(p + "attn_k.weight", permute_rope_rows(w, n_kv) if arch == "llama" else w)
        elif rest == "mlp.experts.gate_up_proj":  # [n_expert, 2*n_ff, E]: gate rows first, then up
            n_ff = w.shape[1] // 2
            put(p + "ffn_gate_exps.weight", w[:, :n_ff, :])
            put(p + "ffn_up_exps.weight", w[:, n_ff:, :])
        elif hybrid and rest.startswith("linear_attn."):
            la = rest[len("linear_attn."):]
            if la == "in_proj_qkv.weight":
                if reorder:
                    q, k, v = w[:dk * n_k], w[dk * n_k:2 * dk * n_k], w[2 * dk * n_k:]
                    w = np.concatenate([q, k, reorder_v_heads(v, 0, n_k, r, dv)], axis=0)
                put(p + "attn_qkv.weight", w)
            elif la == "in_proj_z.weight":
                put(p + "attn_gate.weight", reorder_v_heads(w, 0, n_k, r, dv) if reorder else w)
            elif la in ("in_proj_a.weight", "in_proj_b.weight"):
                if reorder:
                    w = reorder_v_heads(w, 0, n_k, r, 1)
                put(p + ("ssm_alpha.weight" if la == "in_proj_a.weight" else "ssm_beta.weight"), w)
            elif la == "A_log":
                if reorder:
                    w = reorder_v_heads(w, 0, n_k, r, 1)
                put(p + "ssm_a", -np.exp(w.astype(np.float64)).astype(np.float32))
            elif la == "dt_bias":
                if reorder:
                    w = reorder_v_heads(w, 0, n_k, r, 1)
                put(p + "ssm_dt.bias", w)
            elif la == "conv1d.weight":  # [C, 1, K] -> [C, K] (ne {K, C})
                w = w.reshape(w.shape[0], w.shape[-1])
                if reorder:
                    qk = 2 * dk * n_k
                    w = np.concatenate([w[:qk], reorder_v_heads(w[qk:], 0, n_k, r, dv)], axis=0)
                put(p + "ssm_conv1d.weight", w)
            elif la == "out_proj.weight":  # [E, value_dim]: reorder input columns
                put(p + "ssm_out.weight", reorder_v_heads(w, 1, n_k, r, dv) if reorder else w)
            else:
                raise ValueError(f"unexpected HF tensor {hf}")
        else:
            raise ValueError(f"unexpected HF tensor {hf}")
    return out


def convert(arch: str, cfg: dict, sd: dict, path, vocab=None, ftype: str = "f32", name: str | None = None) -> dict:
    """Writes a GGUF at `path` (ftype "f32": every tensor F32; "f16": matrices F16 as f16_in_gguf says);
    returns the tensors written (float32). vocab: (tokens, token types, merges), default make_vocab's.
    A state dict with mtp.* tensors (qwen35/qwen35moe) gets its MTP block as blk.<n_layer>.* with
    block_count = n_layer + 1 and <arch>.nextn_predict_layers = 1 (llama.cpp's _Qwen35MtpMixin)."""
    import gguf

    a = GGUF_ARCH[arch]
    tensors = map_tensors(arch, cfg, sd)
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(name or f"kiln hf oracle tiny {arch}")
    hybrid = arch in ("qwen35", "qwen35moe")
    n_layer = cfg["num_hidden_layers"]
    n_mtp = n_mtp_layers(sd)
    w.add_block_count(n_layer + n_mtp)
    if n_mtp:
        w.add_uint32(f"{a}.nextn_predict_layers", n_mtp)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = dict(cfg.get("rope_parameters") or {})
    for k in ("rope_theta", "partial_rotary_factor"):
        if k not in rope and k in cfg:
            rope[k] = cfg[k]
    if "mrope_section" in rope:
        sec = list(rope["mrope_section"])
        sec += [0] * (4 - len(sec))
        w.add_rope_dimension_sections(sec[:4])
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    if "num_experts" in cfg:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg.get("head_dim") is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    assert ftype in ("f32", "f16"), ftype
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    if arch == "llama":
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(head_dim)
    if arch == "qwen35moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if hybrid:
        w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        lt = cfg["layer_types"]
        assert len(lt) == n_layer
        # length block_count: the MTP layers are not recurrent
        w.add_array(f"{a}.attention.recurrent_layers", [t == "linear_attention" for t in lt] + [False] * n_mtp)
        w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
        w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))

    tokens, types, merges = vocab or make_vocab(cfg["vocab_size"])
    assert len(tokens) == len(types) == cfg["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe" if arch == "llama" else "qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 3)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(arch == "llama")

    for tn in sorted(tensors, key=tensor_order):
        t = tensors[tn]
        w.add_tensor(tn, t.astype(np.float16) if ftype == "f16" and f16_in_gguf(tn, t) else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def tensor_order(name: str):
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0 if name == "token_embd.weight" else 2, 0, name)


# ---------------------------------------------------------------------------------------------
# HF side (torch + transformers): build, randomise, run
# ---------------------------------------------------------------------------------------------
def find_class(module, names):
    for n in names:
        if hasattr(module, n):
            return getattr(module, n)
    raise RuntimeError(f"transformers has none of {names}")


def build_hf(arch: str, seed: int):
    import torch
    import transformers

    cfg_cls = find_class(transformers, HF_CLASSES[arch][0])
    model_cls = find_class(transformers, HF_CLASSES[arch][1])
    print(f"[{arch}] {cfg_cls.__module__}.{cfg_cls.__name__} / {model_cls.__module__}.{model_cls.__name__}",
          flush=True)
    config = cfg_cls(**CONFIGS[arch])
    torch.manual_seed(seed)
    model = model_cls(config).eval().float()
    try:
        model.set_attn_implementation("eager")
    except Exception as e:  # sdpa in float32 on CPU is as good an oracle
        print(f"[{arch}] could not select eager attention: {e}", flush=True)
    print(f"[{arch}] attention implementation: {model.config._attn_implementation}", flush=True)
    if hasattr(config, "num_experts"):
        try:  # the plain per-expert loop of the modeling file (also runs in float64)
            model.set_experts_implementation("eager")
        except Exception as e:
            print(f"[{arch}] could not select eager experts: {e}", flush=True)
        print(f"[{arch}] experts implementation: {getattr(model.config, '_experts_implementation', '?')}", flush=True)

    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    H = config.hidden_size
    centered = []
    with torch.no_grad():
        for name, prm in model.named_parameters():
            shape = tuple(prm.shape)
            if name.endswith("norm.weight"):
                # zero-centered (x*(1+w)) norms are constructed as zeros, plain ones as ones
                if bool((prm == 0).all()):
                    centered.append(name)
                    val = normal(shape, 0.15)
                else:
                    val = 1.0 + normal(shape, 0.15)
            elif name.endswith("A_log"):
                val = uniform(shape, float(np.log(0.05)), float(np.log(4.0)))  # A = exp(A_log) in [0.05, 4]
            elif name.endswith("dt_bias"):
                val = normal(shape, 0.7)
            elif name.endswith("conv1d.weight"):
                val = normal(shape, 0.5)
            elif name == "model.embed_tokens.weight":
                val = normal(shape, 1.0)
            elif name == "lm_head.weight":
                if config.tie_word_embeddings:
                    continue
                val = normal(shape, 3.0 / np.sqrt(H))
            elif name.endswith("experts.gate_up_proj"):
                val = normal(shape, 1.0 / np.sqrt(shape[-1]))
            elif name.endswith("experts.down_proj"):
                val = normal(shape, 0.7 / np.sqrt(shape[-1]))
            elif name.endswith("mlp.gate.weight"):  # router: spread-out expert choices
                val = normal(shape, 2.0 / np.sqrt(shape[-1]))
            elif prm.ndim == 2:  # nn.Linear [out, in]
                scale = 0.7 if any(name.endswith(s) for s in ("o_proj.weight", "down_proj.weight", "out_proj.weight")) \
                    else 1.0
                val = normal(shape, scale / np.sqrt(shape[1]))
            else:
                raise RuntimeError(f"no init rule for {name} {shape}")
            prm.copy_(val)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "tied lm_head"
    return model, config, centered


def hf_forward(model, seqs):
    import torch

    rows = []
    with torch.no_grad():
        for s in seqs:
            out = model(input_ids=torch.tensor([s], dtype=torch.long), use_cache=False)
            rows.append(out.logits[0].float().cpu().numpy())
    return np.concatenate(rows, axis=0)


def sequences(arch: str, n_vocab: int):
    rng = np.random.default_rng(1000 + ARCHS.index(arch))
    return [rng.integers(0, n_vocab, n).tolist() for n in SEQ_LENS]


def generate(out: pathlib.Path, archs):
    import torch
    import transformers

    torch.set_num_threads(4)
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    for arch in archs:
        d = out / arch
        d.mkdir(parents=True, exist_ok=True)
        model, config, centered = build_hf(arch, seed=ARCHS.index(arch) + 1)
        seqs = sequences(arch, config.vocab_size)
        logits = hf_forward(model, seqs)
        # float64 run of the same model: size of HF's own float32 rounding (printed only)
        try:
            import copy
            l64 = hf_forward(copy.deepcopy(model).double(), seqs)
            d64 = f"{np.abs(logits - l64).max():.2e}"
        except Exception as e:  # e.g. grouped_mm experts have no float64 kernel
            d64 = f"n/a ({type(e).__name__})"
        print(f"[{arch}] logits {logits.shape} std {logits.std():.3f} absmax {np.abs(logits).max():.2f}; "
              f"|fp32 - fp64| max {d64}", flush=True)
        print(f"[{arch}] zero-centered norms in HF: {len(centered)}: {sorted(set(n.split('.')[-2] for n in centered))}",
              flush=True)
        sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        print(f"[{arch}] state dict: " + ", ".join(f"{k}{list(v.shape)}" for k, v in sd.items() if ".layers." not in k
                                                     or ".layers.0." in k or ".layers.1." in k), flush=True)
        mismatch = [k for k in sd if k.endswith("norm.weight") and (k in centered) != is_zero_centered_norm(arch, k)]
        if mismatch:
            print(f"[{arch}] WARNING converter +1 rule disagrees with HF norms: {mismatch}", flush=True)
        cfg = config.to_dict()
        (d / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True, default=str))
        (d / "tokens.json").write_text(json.dumps(seqs))
        np.save(d / "logits.npy", logits.astype(np.float32))
        np.savez_compressed(d / "weights.npz", **sd)
        try:
            convert(arch, cfg, sd, d / "model.gguf")
            print(f"[{arch}] wrote {d / 'model.gguf'} ({(d / 'model.gguf').stat().st_size} bytes)", flush=True)
        except Exception as e:  # conversion can be redone with --convert-only
            print(f"[{arch}] GGUF conversion failed: {type(e).__name__}: {e}", flush=True)


def convert_only(out: pathlib.Path, archs):
    for arch in archs:
        d = out / arch
        cfg = json.loads((d / "config.json").read_text())
        with np.load(d / "weights.npz") as z:
            sd = {k: z[k] for k in z.files}
        convert(arch, cfg, sd, d / "model.gguf")
        print(f"[{arch}] wrote {d / 'model.gguf'} ({(d / 'model.gguf').stat().st_size} bytes)")


# ---------------------------------------------------------------------------------------------
# self-test without torch: fake HF state dicts with the names/shapes of transformers 5.x
# ---------------------------------------------------------------------------------------------
def fake_state_dict(arch: str, cfg: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    D = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    sd = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    hybrid = arch in ("qwen35", "qwen35moe")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = (H,)
        sd[p + "post_attention_layernorm.weight"] = (H,)
        lt = cfg["layer_types"][i] if hybrid else "full_attention"
        if lt == "full_attention":
            sd[p + "self_attn.q_proj.weight"] = ((2 if hybrid else 1) * Hq * D, H)
            sd[p + "self_attn.k_proj.weight"] = (Hkv * D, H)
            sd[p + "self_attn.v_proj.weight"] = (Hkv * D, H)
            sd[p + "self_attn.o_proj.weight"] = (H, Hq * D)
            if arch != "llama":
                sd[p + "self_attn.q_norm.weight"] = (D,)
                sd[p + "self_attn.k_norm.weight"] = (D,)
        else:
            kd = cfg["linear_key_head_dim"] * cfg["linear_num_key_heads"]
            vd = cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"]
            nv = cfg["linear_num_value_heads"]
            sd[p + "linear_attn.in_proj_qkv.weight"] = (2 * kd + vd, H)
            sd[p + "linear_attn.in_proj_z.weight"] = (vd, H)
            sd[p + "linear_attn.in_proj_a.weight"] = (nv, H)
            sd[p + "linear_attn.in_proj_b.weight"] = (nv, H)
            sd[p + "linear_attn.A_log"] = (nv,)
            sd[p + "linear_attn.dt_bias"] = (nv,)
            sd[p + "linear_attn.conv1d.weight"] = (2 * kd + vd, 1, cfg["linear_conv_kernel_dim"])
            sd[p + "linear_attn.norm.weight"] = (cfg["linear_value_head_dim"],)
            sd[p + "linear_attn.out_proj.weight"] = (H, vd)
        if arch == "qwen35moe":
            E, F, FS = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            sd[p + "mlp.gate.weight"] = (E, H)
            sd[p + "mlp.experts.gate_up_proj"] = (E, 2 * F, H)
            sd[p + "mlp.experts.down_proj"] = (E, H, F)
            sd[p + "mlp.shared_expert.gate_proj.weight"] = (FS, H)
            sd[p + "mlp.shared_expert.up_proj.weight"] = (FS, H)
            sd[p + "mlp.shared_expert.down_proj.weight"] = (H, FS)
            sd[p + "mlp.shared_expert_gate.weight"] = (1, H)
        else:
            F = cfg["intermediate_size"]
            sd[p + "mlp.gate_proj.weight"] = (F, H)
            sd[p + "mlp.up_proj.weight"] = (F, H)
            sd[p + "mlp.down_proj.weight"] = (H, F)
    out = {}
    for k, shp in sd.items():
        if k.endswith("norm.weight"):
            out[k] = (0.0 if is_zero_centered_norm(arch, k) else 1.0) + 0.1 * rng.standard_normal(shp)
        elif k.endswith("A_log"):
            out[k] = np.log(rng.uniform(0.05, 4.0, shp))
        else:
            out[k] = rng.standard_normal(shp) / np.sqrt(shp[-1])
        out[k] = out[k].astype(np.float32)
    if cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def selftest(out: pathlib.Path, archs):
    import gguf

    for arch in archs:
        cfg = dict(CONFIGS[arch])
        cfg.setdefault("layer_types", None)
        d = out / arch
        d.mkdir(parents=True, exist_ok=True)
        sd = fake_state_dict(arch, cfg, seed=ARCHS.index(arch))
        tensors = convert(arch, cfg, sd, d / "model.gguf")
        # names must agree with gguf-py's own HF -> GGUF table (except our synthesized splits)
        tmap = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, GGUF_ARCH[arch].upper()), cfg["num_hidden_layers"])
        for hf in sd:
            if hf.endswith("experts.gate_up_proj") or (hf == "lm_head.weight" and cfg.get("tie_word_embeddings")):
                continue
            base, suffix = (hf[:-len(".weight")], ".weight") if hf.endswith(".weight") else (hf, "")
            if base.endswith(".dt_bias"):
                base, suffix = base[:-len(".dt_bias")] + ".dt_proj", ".bias"
            mapped = tmap.get_name(base)
            assert mapped is not None, f"gguf-py has no mapping for {hf}"
            assert (mapped + suffix) in tensors or (not suffix and mapped + ".weight" in tensors), \
                f"{hf}: gguf-py says {mapped + suffix}, not among ours"
        r = gguf.GGUFReader(str(d / "model.gguf"))
        print(f"[{arch}] selftest: {len(r.tensors)} tensors, {len(r.fields)} keys, "
              f"{(d / 'model.gguf').stat().st_size} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=pathlib.Path, help="generate everything (needs torch + transformers)")
    g.add_argument("--convert-only", type=pathlib.Path, help="re-make model.gguf from weights.npz + config.json")
    g.add_argument("--selftest", type=pathlib.Path, help="convert fake weights (no torch)")
    ap.add_argument("--arch", action="append", choices=ARCHS, help="default: all")
    args = ap.parse_args()
    archs = args.arch or ARCHS
    if args.out:
        generate(args.out, archs)
    elif args.convert_only:
        convert_only(args.convert_only, archs)
    else:
        selftest(args.selftest, archs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
