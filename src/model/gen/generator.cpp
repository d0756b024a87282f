// Tensor plan, per-tensor type choice (uniform / llama-quantize-like mixes), weight synthesis and
// streaming through gguf::Writer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/gen/gen.h"
#include "model/gen/synth.h"
#include "tensor/quant.h"

namespace kiln::model::gen {
namespace {

using gguf::GgmlType;

// ---- how a tensor's values are drawn ----
enum class Init { Normal, Norm, SsmA, DtBias };
struct InitSpec {
  Init kind = Init::Normal;
  float sigma = 0;
};

struct TensorDef {
  std::string name;
  std::vector<int64_t> ne;
  InitSpec init;
  GgmlType type = GgmlType::F32;
};

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
bool contains(std::string_view s, std::string_view x) { return s.find(x) != std::string_view::npos; }

// Same exclusions as llama-quantize: 2-D+ tensors named *weight, except norms, ssm_conv1d and
// the MoE router (ffn_gate_inp).
bool quantizable(const TensorDef& t) {
  if (t.ne.size() < 2) return false;
  if (!t.name.ends_with("weight")) return false;
  if (contains(t.name, "_norm.weight")) return false;
  if (contains(t.name, "ssm_conv1d")) return false;
  if (contains(t.name, "ffn_gate_inp.weight")) return false;
  return true;
}

// llama-quantize's fallback when ne[0] is not a multiple of the block size.
GgmlType fallback(GgmlType want, int64_t ne0) {
  auto fits = [&](GgmlType t) { return ne0 % gguf::type_info(t).block_size == 0; };
  if (fits(want)) return want;
  GgmlType f = want;
  switch (want) {
    case GgmlType::IQ4_XS: f = GgmlType::IQ4_NL; break;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K: f = GgmlType::Q4_0; break;
    case GgmlType::Q4_K: f = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: f = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: f = GgmlType::Q8_0; break;
    default: break;
  }
  return fits(f) ? f : GgmlType::F16;
}

int layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  return std::atoi(std::string(name.substr(4)).c_str());
}

// Assigns a type to every tensor (file order matters for the mix counters).
Status assign_types(std::vector<TensorDef>& defs, const GenOptions& o) {
  const ModelSpec& s = o.spec;
  const bool uniform_float = o.mix == Mix::Uniform && is_float(o.type);
  if (o.mix == Mix::Uniform && !uniform_float && !tensor::has_reference(o.type))
    return err("tensor type {} has no quantizer in kiln (see tensor/quant.h)", gguf::type_name(o.type));
  const GgmlType base = o.mix == Mix::IQ4_XS ? GgmlType::IQ4_XS : o.mix == Mix::Q4_K_M ? GgmlType::Q4_K : o.type;
  const int64_t n_layer_all = s.n_layer + s.n_mtp;
  const int64_t n_gqa = s.n_head / s.n_head_kv;
  int64_t n_wv = 0, n_down = 0;
  for (const auto& t : defs) {
    n_wv += contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight");
    n_down += contains(t.name, "ffn_down");
  }
  auto more_bits = [](int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  int64_t i_wv = 0, i_down = 0;
  for (auto& t : defs) {
    if (!quantizable(t)) {
      t.type = GgmlType::F32;
      continue;
    }
    if (o.mix == Mix::Uniform) {
      t.type = uniform_float ? o.type : fallback(o.type, t.ne[0]);
      continue;
    }
    GgmlType ty = base;
    const bool is_output = t.name == "output.weight" || (s.tied_embeddings && t.name == "token_embd.weight");
    if (is_output) {
      ty = t.ne[0] % 256 == 0 ? GgmlType::Q6_K : GgmlType::Q8_0;
    } else if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight")) {
      if (o.mix == Mix::IQ4_XS) {
        if (n_gqa >= 4) ty = GgmlType::Q5_K;
      } else if (more_bits(i_wv, n_wv)) {
        ty = GgmlType::Q6_K;
      }
      ++i_wv;
    } else if (contains(t.name, "ffn_down")) {
      // dense: counter over ffn_down tensors; MoE: the layer index parsed from the name
      const bool moe = s.n_expert > 1;
      const int64_t il = moe ? layer_of(t.name) : i_down;
      const int64_t nl = moe ? n_layer_all : n_down;
      if (o.mix == Mix::Q4_K_M && more_bits(il, nl)) ty = GgmlType::Q6_K;
      if (o.mix == Mix::IQ4_XS && il < nl / 8) ty = GgmlType::Q5_K;
      ++i_down;
    } else if (contains(t.name, "attn_output.weight")) {
      if (s.n_expert == 8) ty = GgmlType::Q5_K;
    }
    t.type = fallback(ty, t.ne[0]);
  }
  for (const auto& t : defs)
    if (!is_float(t.type) && !tensor::has_reference(t.type))
      return err("tensor '{}': type {} has no quantizer in kiln", t.name, gguf::type_name(t.type));
  return {};
}

std::vector<TensorDef> build_defs(const ModelSpec& s) {
  std::vector<TensorDef> d;
  const float inv_e = 1.0f / std::sqrt(float(s.n_embd));
  auto mat = [&](std::string name, std::vector<int64_t> ne, float gain = 1.0f) {
    d.push_back({std::move(name), ne, {Init::Normal, gain / std::sqrt(float(ne[0]))}});
  };
  auto norm = [&](std::string name, int64_t n) { d.push_back({std::move(name), {n}, {Init::Norm, 0.1f}}); };
  const int64_t E = s.n_embd, D = s.head_dim, H = s.n_head, Hkv = s.n_head_kv;
  const bool hybrid = s.arch == "qwen35" || s.arch == "qwen35moe";
  const float out_gain = 0.5f;  // residual-branch outputs: keep the stream from growing too fast

  d.push_back({"token_embd.weight", {E, s.n_vocab}, {Init::Normal, 2.0f * inv_e}});
  norm("output_norm.weight", E);
  if (!s.tied_embeddings) d.push_back({"output.weight", {E, s.n_vocab}, {Init::Normal, 2.0f * inv_e}});

  auto attention = [&](const std::string& p, bool gated_q) {
    mat(p + "attn_q.weight", {E, (gated_q ? 2 : 1) * D * H});
    mat(p + "attn_k.weight", {E, D * Hkv});
    mat(p + "attn_v.weight", {E, D * Hkv});
    mat(p + "attn_output.weight", {D * H, E}, out_gain);
  };
  auto ffn = [&](const std::string& p) {
    if (s.arch == "qwen35moe") {
      mat(p + "ffn_gate_inp.weight", {E, s.n_expert});
      mat(p + "ffn_gate_exps.weight", {E, s.n_ff_exp, s.n_expert});
      mat(p + "ffn_up_exps.weight", {E, s.n_ff_exp, s.n_expert});
      mat(p + "ffn_down_exps.weight", {s.n_ff_exp, E, s.n_expert}, out_gain);
      d.push_back({p + "ffn_gate_inp_shexp.weight", {E}, {Init::Normal, inv_e}});
      mat(p + "ffn_gate_shexp.weight", {E, s.n_ff_shexp});
      mat(p + "ffn_up_shexp.weight", {E, s.n_ff_shexp});
      mat(p + "ffn_down_shexp.weight", {s.n_ff_shexp, E}, out_gain);
    } else {
      mat(p + "ffn_gate.weight", {E, s.n_ff});
      mat(p + "ffn_up.weight", {E, s.n_ff});
      mat(p + "ffn_down.weight", {s.n_ff, E}, out_gain);
    }
  };

  for (int64_t il = 0; il < s.n_layer + s.n_mtp; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const bool mtp = il >= s.n_layer;
    if (!hybrid) {
      norm(p + "attn_norm.weight", E);
      attention(p, false);
      if (s.arch == "qwen3") {
        norm(p + "attn_q_norm.weight", D);
        norm(p + "attn_k_norm.weight", D);
      }
      norm(p + "ffn_norm.weight", E);
      ffn(p);
      continue;
    }
    norm(p + "attn_norm.weight", E);
    norm(p + "post_attention_norm.weight", E);
    const bool full = mtp || (il + 1) % s.full_attention_interval == 0;
    if (full) {
      attention(p, true);
      norm(p + "attn_q_norm.weight", D);
      norm(p + "attn_k_norm.weight", D);
    } else {
      const int64_t S = s.ssm_d_state, Hk = s.ssm_n_group, Hv = s.ssm_dt_rank;
      const int64_t key_dim = S * Hk, value_dim = S * Hv, conv_dim = 2 * key_dim + value_dim;
      mat(p + "attn_qkv.weight", {E, conv_dim});
      mat(p + "attn_gate.weight", {E, value_dim});
      d.push_back({p + "ssm_conv1d.weight", {s.ssm_d_conv, conv_dim}, {Init::Normal, 0.3f}});
      d.push_back({p + "ssm_dt.bias", {Hv}, {Init::DtBias, 0.1f}});
      d.push_back({p + "ssm_a", {Hv}, {Init::SsmA, 0}});
      mat(p + "ssm_beta.weight", {E, Hv});
      mat(p + "ssm_alpha.weight", {E, Hv});
      norm(p + "ssm_norm.weight", S);
      mat(p + "ssm_out.weight", {value_dim, E}, out_gain);
    }
    ffn(p);
    if (mtp) {
      mat(p + "nextn.eh_proj.weight", {2 * E, E});
      norm(p + "nextn.enorm.weight", E);
      norm(p + "nextn.hnorm.weight", E);
      norm(p + "nextn.shared_head_norm.weight", E);
    }
  }
  return d;
}

void fill_values(const InitSpec& init, Rng& rng, float* x, int64_t n) {
  switch (init.kind) {
    case Init::Normal:
      for (int64_t i = 0; i < n; ++i) x[i] = init.sigma * rng.normal();
      break;
    case Init::Norm:  // RMSNorm weights, stored with the +1 already applied where the arch uses it
      for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + init.sigma * rng.normal();
      break;
    // -exp(A_log), A_log ~ U(log 0.01, log 0.5): slow, trained-model-like decays. (HF init range
    // A in [1, 16] forgets the state within a token or two; o = S^T q is then often tiny and the
    // gated RMSNorm amplifies rounding noise, making logits hypersensitive to weight quantization.)
    case Init::SsmA:
      for (int64_t i = 0; i < n; ++i) x[i] = -std::exp(std::log(0.01f) + rng.uniform() * std::log(50.0f));
      break;
    case Init::DtBias:
      for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + init.sigma * rng.normal();
      break;
  }
}

Result<std::vector<TensorDef>> make_defs(const GenOptions& o) {
  KILN_TRY(validate(o.spec));
  auto defs = build_defs(o.spec);
  KILN_TRY(assign_types(defs, o));
  return defs;
}

}  // namespace

uint32_t file_type_id(GgmlType t, Mix mix) {
  if (mix == Mix::IQ4_XS) return 30;
  if (mix == Mix::Q4_K_M) return 15;
  switch (t) {  // llama_ftype values (gguf-py LlamaFileType)
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q2_K: return 10;
    case GgmlType::Q3_K: return 11;  // Q3_K_S
    case GgmlType::Q4_K: return 14;  // Q4_K_S
    case GgmlType::Q5_K: return 16;  // Q5_K_S
    case GgmlType::Q6_K: return 18;
    case GgmlType::IQ4_NL: return 25;
    case GgmlType::IQ4_XS: return 30;
    case GgmlType::BF16: return 32;
    default: return 1;
  }
}

Result<std::vector<PlannedTensor>> plan(const GenOptions& opt) {
  auto defs = make_defs(opt);
  if (!defs.ok()) return defs.error();
  return planned_tensors(*defs);
}

namespace {

void write_vocabulary(const Vocabulary& v, gguf::Writer& w) {
  w.set_string("tokenizer.ggml.model", v.model);
  w.set_string("tokenizer.ggml.pre", v.pre);
  w.set("tokenizer.ggml.tokens", gguf::make_string_array(v.tokens));
  w.set("tokenizer.ggml.token_type", gguf::make_i32_array(v.token_type));
  w.set("tokenizer.ggml.merges", gguf::make_string_array(v.merges));
  w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos));
  w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos));
  if (v.eot >= 0) w.set_u32("tokenizer.ggml.eot_token_id", uint32_t(v.eot));
  w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(v.pad));
  w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_string("tokenizer.chat_template", v.chat_template);
}

Result<const gguf::Value*> find_tokens(const gguf::File& f) {
  for (const gguf::KV& kv : f.metadata())
    if (kv.key == "tokenizer.ggml.tokens" && kv.value.type == gguf::ValueType::ARRAY) return &kv.value;
  return err("{}: no tokenizer.ggml.tokens array", f.path());
}

// The tokenizer.* metadata of `path`, its tokens (and token types) padded to n_vocab.
Status copy_vocabulary(const std::string& path, int64_t n_vocab, gguf::Writer& w) {
  auto f = gguf::File::open(path);
  if (!f.ok()) return f.error();
  auto tokens = find_tokens(**f);
  if (!tokens.ok()) return tokens.error();
  const int64_t n = int64_t((*tokens)->arr.size());
  if (n > n_vocab) return err("{}: {} tokens, more than the model's n_vocab {}", path, n, n_vocab);
  for (const gguf::KV& kv : (*f)->metadata()) {
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    gguf::Value v = kv.value;
    if (kv.key == "tokenizer.ggml.tokens") {
      for (int64_t i = n; i < n_vocab; ++i) {
        gguf::Value t;
        t.type = gguf::ValueType::STRING;
        t.str = "[PAD" + std::to_string(i) + "]";
        v.arr.push_back(std::move(t));
      }
    } else if (kv.key == "tokenizer.ggml.token_type" || kv.key == "tokenizer.ggml.scores") {
      gguf::Value pad = v.arr.empty() ? gguf::Value{} : v.arr.back();
      if (kv.key == "tokenizer.ggml.token_type") pad.i = 5, pad.u = 5;  // UNUSED
      else pad.f = 0;
      v.arr.resize(size_t(n_vocab), pad);
    }
    w.set(kv.key, std::move(v));
  }
  return {};
}

}  // namespace

Result<int64_t> vocab_size(const std::string& path) {
  auto f = gguf::File::open(path);
  if (!f.ok()) return f.error();
  auto tokens = find_tokens(**f);
  if (!tokens.ok()) return tokens.error();
  return int64_t((*tokens)->arr.size());
}

Status generate(const GenOptions& opt, const std::string& path, const std::function<void(size_t, size_t)>& progress) {
  auto defs_r = make_defs(opt);
  if (!defs_r.ok()) return defs_r.error();
  auto defs = std::make_shared<std::vector<TensorDef>>(std::move(defs_r).value());
  const ModelSpec& s = opt.spec;
  auto vocab_r = build_vocabulary(s.arch, s.n_vocab);
  if (!vocab_r.ok()) return vocab_r.error();
  const Vocabulary& v = *vocab_r;

  gguf::Writer w;
  const std::string a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.type", "model");
  w.set_string("general.name", s.name.empty() ? "kiln random " + a : s.name);
  w.set_u32("general.file_type", file_type_id(opt.type, opt.mix));
  bool any_quant = false;
  for (const auto& d : *defs) any_quant |= !is_float(d.type);
  if (any_quant) w.set_u32("general.quantization_version", 2);
  w.set_u32(a + ".vocab_size", uint32_t(s.n_vocab));
  w.set_u32(a + ".context_length", uint32_t(s.n_ctx));
  w.set_u32(a + ".embedding_length", uint32_t(s.n_embd));
  w.set_u32(a + ".block_count", uint32_t(s.n_layer + s.n_mtp));
  w.set_u32(a + ".feed_forward_length", uint32_t(a == "qwen35moe" ? s.n_ff_exp : s.n_ff));
  w.set_u32(a + ".attention.head_count", uint32_t(s.n_head));
  w.set_u32(a + ".attention.head_count_kv", uint32_t(s.n_head_kv));
  w.set_u32(a + ".attention.key_length", uint32_t(s.head_dim));
  w.set_u32(a + ".attention.value_length", uint32_t(s.head_dim));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", float(s.rms_eps));
  w.set_f32(a + ".rope.freq_base", float(s.rope_theta));
  w.set_u32(a + ".rope.dimension_count", uint32_t(s.n_rot));
  if (a == "qwen35" || a == "qwen35moe") {
    w.set(a + ".rope.dimension_sections", gguf::make_i32_array(s.rope_sections));
    w.set_u32(a + ".full_attention_interval", uint32_t(s.full_attention_interval));
    w.set_u32(a + ".ssm.conv_kernel", uint32_t(s.ssm_d_conv));
    w.set_u32(a + ".ssm.state_size", uint32_t(s.ssm_d_state));
    w.set_u32(a + ".ssm.group_count", uint32_t(s.ssm_n_group));
    w.set_u32(a + ".ssm.time_step_rank", uint32_t(s.ssm_dt_rank));
    w.set_u32(a + ".ssm.inner_size", uint32_t(s.ssm_d_state * s.ssm_dt_rank));
    if (s.n_mtp > 0) w.set_u32(a + ".nextn_predict_layers", uint32_t(s.n_mtp));
  }
  if (a == "qwen35moe") {
    w.set_u32(a + ".expert_count", uint32_t(s.n_expert));
    w.set_u32(a + ".expert_used_count", uint32_t(s.n_expert_used));
    w.set_u32(a + ".expert_feed_forward_length", uint32_t(s.n_ff_exp));
    w.set_u32(a + ".expert_shared_feed_forward_length", uint32_t(s.n_ff_shexp));
  }
  if (!opt.vocab_from.empty()) {
    KILN_TRY(copy_vocabulary(opt.vocab_from, s.n_vocab, w));
  } else {
    write_vocabulary(v, w);
  }

  KILN_TRY(add_random_tensors<TensorDef>(w, defs, opt.seed, opt.n_threads,
                                        [](const TensorDef& t, Rng& rng, float* buf, int64_t n) { fill_values(t.init, rng, buf, n); },
                                        opt.fast ? kFastPoolRows : 0));
  return w.write(path, progress, opt.meta_only);
}

}  // namespace kiln::model::gen
