// GGUF keys -> ModelConfig. Key strings follow gguf-py constants.py / llama-arch.cpp.
#include "model/config.h"

#include <cmath>

namespace kiln::model {

std::string_view arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Qwen35: return "qwen35";
    case Arch::Qwen35Moe: return "qwen35moe";
  }
  return "?";
}

std::optional<Arch> arch_from_name(std::string_view n) {
  for (Arch a : {Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Qwen35, Arch::Qwen35Moe})
    if (arch_name(a) == n) return a;
  return std::nullopt;
}

int64_t ModelConfig::n_attn_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < n_layer; ++i) n += !is_recurrent(i);
  return n;
}
int64_t ModelConfig::n_recurrent_layers() const { return n_layer - n_attn_layers(); }

namespace {

Result<int64_t> positive(const gguf::File& f, const std::string& key) {
  auto v = f.get_int(key);
  KILN_TRY(v);
  if (*v <= 0) return err("{}: key '{}' must be positive, got {}", f.path(), key, *v);
  return *v;
}

Result<int64_t> positive_or(const gguf::File& f, const std::string& key, int64_t dflt) {
  if (!f.has(key)) return dflt;
  return positive(f, key);
}

}  // namespace

Result<ModelConfig> load_config(const gguf::File& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  KILN_TRY(arch);
  c.arch_str = *arch;
  auto a = arch_from_name(*arch);
  if (!a)
    return err("{}: general.architecture '{}' is not supported (kiln runs llama, qwen2, qwen3, qwen35, qwen35moe)",
               f.path(), *arch);
  c.arch = *a;
  if (f.has("general.name")) {
    auto n = f.get_string("general.name");
    KILN_TRY(n);
    c.name = *n;
  }
  const std::string p = c.arch_str + ".";
#define KILN_GET(dst, expr) \
  do {                      \
    auto r_ = (expr);       \
    KILN_TRY(r_);           \
    dst = *r_;              \
  } while (0)

  KILN_GET(c.n_embd, positive(f, p + "embedding_length"));
  KILN_GET(c.n_layer_all, positive(f, p + "block_count"));
  KILN_GET(c.n_ctx_train, positive_or(f, p + "context_length", 4096));
  {
    auto pt = f.get_int_or(p + "pooling_type", -1);
    KILN_TRY(pt);
    if (*pt < -1 || *pt > 4) return err("{}: key '{}' = {} out of range (0..4)", f.path(), p + "pooling_type", *pt);
    c.pooling_type = int(*pt);
  }
  KILN_GET(c.n_head, positive(f, p + "attention.head_count"));
  KILN_GET(c.n_head_kv, positive_or(f, p + "attention.head_count_kv", c.n_head));
  if (c.n_embd % c.n_head != 0 && !f.has(p + "attention.key_length"))
    return err("{}: embedding_length {} is not a multiple of head_count {} and key_length is missing", f.path(),
               c.n_embd, c.n_head);
  KILN_GET(c.head_dim, positive_or(f, p + "attention.key_length", c.n_embd / c.n_head));
  KILN_GET(c.head_dim_v, positive_or(f, p + "attention.value_length", c.head_dim));
  if (c.head_dim_v != c.head_dim)
    return err("{}: attention.value_length {} != key_length {} is not supported", f.path(), c.head_dim_v, c.head_dim);
  if (c.head_dim > 512) return err("{}: attention.key_length {} > 512 is not supported", f.path(), c.head_dim);
  if (c.n_head % c.n_head_kv != 0)
    return err("{}: attention.head_count {} is not a multiple of head_count_kv {}", f.path(), c.n_head, c.n_head_kv);
  {
    double eps;
    KILN_GET(eps, f.get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5));
    if (!(eps > 0 && eps < 1)) return err("{}: key '{}' = {} out of range", f.path(), p + "attention.layer_norm_rms_epsilon", eps);
    c.rms_eps = float(eps);
  }
  {
    double s;
    KILN_GET(s, f.get_float_or(p + "attention.scale", 0.0));
    c.attn_scale = float(s);
  }
  {
    int64_t nr;
    KILN_GET(nr, positive_or(f, p + "rope.dimension_count", c.head_dim));
    if (nr > c.head_dim || nr % 2 != 0)
      return err("{}: rope.dimension_count {} must be even and <= key_length {}", f.path(), nr, c.head_dim);
    c.n_rot = int(nr);
    double base;
    KILN_GET(base, f.get_float_or(p + "rope.freq_base", 10000.0));
    if (!(base > 1)) return err("{}: key '{}' = {} out of range", f.path(), p + "rope.freq_base", base);
    c.rope_freq_base = float(base);
    std::string type = "none";
    if (f.has(p + "rope.scaling.type")) KILN_GET(type, f.get_string(p + "rope.scaling.type"));
    double factor = 0;
    if (f.has(p + "rope.scaling.factor")) KILN_GET(factor, f.get_float(p + "rope.scaling.factor"));
    else if (f.has(p + "rope.scale_linear")) KILN_GET(factor, f.get_float(p + "rope.scale_linear"));
    if (type != "none" && type != "linear")
      return err("{}: rope.scaling.type '{}' is not supported (none, linear)", f.path(), type);
    if (factor < 0) return err("{}: rope scaling factor {} is negative", f.path(), factor);
    c.rope_freq_scale = factor == 0 ? 1.f : float(1.0 / factor);
    c.rope_neox = c.arch != Arch::Llama;
  }
  if (f.has(p + "vocab_size")) KILN_GET(c.n_vocab, positive(f, p + "vocab_size"));

  c.n_nextn = 0;
  if (arch_is_hybrid(c.arch)) {
    int64_t nn;
    KILN_GET(nn, f.get_int_or(p + "nextn_predict_layers", 0));
    if (nn < 0 || nn >= c.n_layer_all)
      return err("{}: nextn_predict_layers {} out of range (block_count {})", f.path(), nn, c.n_layer_all);
    c.n_nextn = nn;
  }
  c.n_layer = c.n_layer_all - c.n_nextn;

  if (c.arch == Arch::Qwen35Moe) {
    KILN_GET(c.n_expert, positive(f, p + "expert_count"));
    KILN_GET(c.n_expert_used, positive(f, p + "expert_used_count"));
    if (c.n_expert_used > c.n_expert)
      return err("{}: expert_used_count {} > expert_count {}", f.path(), c.n_expert_used, c.n_expert);
    int64_t ff;
    KILN_GET(ff, f.get_int_or(p + "feed_forward_length", 0));
    c.n_ff = ff;
    KILN_GET(c.n_ff_exp, positive_or(f, p + "expert_feed_forward_length", ff > 0 ? ff / c.n_expert_used : 0));
    KILN_GET(c.n_ff_shexp, positive_or(f, p + "expert_shared_feed_forward_length", ff));
    if (c.n_ff_exp <= 0 || c.n_ff_shexp <= 0)
      return err("{}: expert_feed_forward_length / expert_shared_feed_forward_length missing", f.path());
    double sc;
    KILN_GET(sc, f.get_float_or(p + "expert_weights_scale", 0.0));
    c.expert_weights_scale = sc == 0 ? 1.f : float(sc);
    KILN_GET(c.expert_weights_norm, f.get_bool_or(p + "expert_weights_norm", true));
  } else {
    KILN_GET(c.n_ff, positive(f, p + "feed_forward_length"));
  }

  if (arch_is_hybrid(c.arch)) {
    KILN_GET(c.ssm_d_conv, positive(f, p + "ssm.conv_kernel"));
    KILN_GET(c.ssm_d_inner, positive(f, p + "ssm.inner_size"));
    KILN_GET(c.ssm_d_state, positive(f, p + "ssm.state_size"));
    KILN_GET(c.ssm_n_group, positive(f, p + "ssm.group_count"));
    KILN_GET(c.ssm_dt_rank, positive(f, p + "ssm.time_step_rank"));
    if (c.ssm_d_inner != c.ssm_d_state * c.ssm_dt_rank)
      return err("{}: ssm.inner_size {} != ssm.state_size {} * ssm.time_step_rank {}", f.path(), c.ssm_d_inner,
                 c.ssm_d_state, c.ssm_dt_rank);
    if (c.ssm_dt_rank % c.ssm_n_group != 0)
      return err("{}: ssm.time_step_rank {} is not a multiple of ssm.group_count {}", f.path(), c.ssm_dt_rank,
                 c.ssm_n_group);
    if (c.ssm_d_conv < 2 || c.ssm_d_conv > 16)
      return err("{}: ssm.conv_kernel {} out of range [2, 16]", f.path(), c.ssm_d_conv);
    if (f.has(p + "rope.dimension_sections")) {
      std::vector<int64_t> s;
      KILN_GET(s, f.get_int_array(p + "rope.dimension_sections"));
      if (s.size() > 4) return err("{}: rope.dimension_sections has {} entries (max 4)", f.path(), s.size());
      for (size_t i = 0; i < s.size(); ++i) c.rope_sections[i] = int32_t(s[i]);
    }
    c.recurrent.assign(size_t(c.n_layer), false);
    if (f.has(p + "attention.recurrent_layers")) {
      const gguf::Value* v = f.find(p + "attention.recurrent_layers");
      if (v->type != gguf::ValueType::ARRAY || v->elem_type != gguf::ValueType::BOOL ||
          int64_t(v->arr.size()) < c.n_layer)
        return err("{}: key '{}' must be a bool array of length block_count", f.path(),
                   p + "attention.recurrent_layers");
      for (int64_t i = 0; i < c.n_layer; ++i) c.recurrent[size_t(i)] = v->arr[size_t(i)].b;
    } else {
      KILN_GET(c.full_attention_interval, positive_or(f, p + "full_attention_interval", 4));
      for (int64_t i = 0; i < c.n_layer; ++i) c.recurrent[size_t(i)] = (i + 1) % c.full_attention_interval != 0;
    }
  }
#undef KILN_GET
  return c;
}

}  // namespace kiln::model
