// Named model shapes for `kiln gguf gen --preset`, and spec validation.
//
// Real shapes (HF config.json "text_config" numbers; cross-checked against llama.cpp's qwen35 loader
// size labels: 24 layers & n_embd 1024 = 0.8B, 32 layers = 9B, 64 layers = 27B):
//  - Qwen/Qwen3.5-0.8B: hidden 1024, 24 layers, 8 heads, 2 KV heads, head_dim 256, intermediate 3584,
//    linear_num_key_heads 16, linear_num_value_heads 16, linear_key/value_head_dim 128, conv kernel 4,
//    vocab 248320, rope_theta 1e7, partial_rotary_factor 0.25, full_attention_interval 4,
//    mrope_section [11,11,10], tie_word_embeddings true, mtp_num_hidden_layers 1, rms_norm_eps 1e-6.
//  - Qwen/Qwen3.5-9B: hidden 4096, 32 layers, 16 heads, 4 KV heads, head_dim 256, intermediate 12288,
//    linear key heads 16, value heads 32 (head dims 128), untied embeddings; rest as 0.8B.
//    (the linear head counts were recalled, not re-read from the HF file)
//  - Qwen/Qwen3.5-27B: hidden 5120, 64 layers, 24 heads, 4 KV heads, head_dim 256, intermediate 17408,
//    linear key heads 16, value heads 48 (head dims 128), untied embeddings; rest as 0.8B.
//  - Qwen/Qwen3.5-35B-A3B (qwen35moe): hidden 2048, 40 layers, 16 heads, 2 KV heads, head_dim 256,
//    256 experts, 8 used, moe_intermediate_size 512, shared_expert_intermediate_size 512,
//    linear key heads 16, value heads 32 (dims 128), untied.
//  - meta-llama/Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64,
//    intermediate 8192, vocab 128256, rope_theta 500000, rms_norm_eps 1e-5, tied embeddings
//    (the llama3 rope-scaling factors / rope_freqs tensor are not generated).
#include <numeric>

#include "model/gen/gen.h"

namespace kiln::model::gen {
namespace {

ModelSpec llama_spec(std::string name, int64_t vocab, int64_t e, int64_t l, int64_t h, int64_t hkv, int64_t d,
                     int64_t ff, int64_t ctx, double theta, double eps, bool tied) {
  ModelSpec s;
  s.arch = "llama";
  s.name = std::move(name);
  s.n_vocab = vocab;
  s.n_embd = e;
  s.n_layer = l;
  s.n_head = h;
  s.n_head_kv = hkv;
  s.head_dim = d;
  s.n_ff = ff;
  s.n_ctx = ctx;
  s.rope_theta = theta;
  s.n_rot = d;
  s.rms_eps = eps;
  s.tied_embeddings = tied;
  return s;
}

ModelSpec qwen35_spec(std::string name, int64_t vocab, int64_t e, int64_t l, int64_t h, int64_t hkv, int64_t d,
                      int64_t ff, int64_t hk, int64_t hv, int64_t s_state, bool tied) {
  ModelSpec s = llama_spec(std::move(name), vocab, e, l, h, hkv, d, ff, 262144, 1e7, 1e-6, tied);
  s.arch = "qwen35";
  s.n_rot = d / 4;  // partial_rotary_factor 0.25
  s.full_attention_interval = 4;
  s.ssm_d_conv = 4;
  s.ssm_d_state = s_state;
  s.ssm_n_group = hk;
  s.ssm_dt_rank = hv;
  const int32_t half = static_cast<int32_t>(s.n_rot / 2);
  const int32_t a = (half + 2) / 3;
  s.rope_sections = {a, a, half - 2 * a, 0};  // [11,11,10,0] for n_rot 64
  return s;
}

// A qwen35 spec made qwen35moe: n_expert experts (n_used per token) of width ff_exp + a shared one.
ModelSpec qwen35moe_spec(ModelSpec s, int64_t n_expert, int64_t n_used, int64_t ff_exp, int64_t ff_shexp) {
  s.arch = "qwen35moe";
  s.n_expert = n_expert;
  s.n_expert_used = n_used;
  s.n_ff_exp = ff_exp;
  s.n_ff_shexp = ff_shexp;
  return s;
}

std::vector<Preset> make_presets() {
  std::vector<Preset> p;
  p.push_back({"tiny-llama", "2-layer llama, E=256, 4 heads (2 KV), vocab 768, tied embeddings",
               llama_spec("kiln tiny llama", 768, 256, 2, 4, 2, 64, 512, 4096, 500000.0, 1e-5, true)});
  {
    ModelSpec s = llama_spec("kiln tiny qwen3", 1024, 256, 2, 4, 2, 64, 512, 8192, 1e6, 1e-6, false);
    s.arch = "qwen3";
    p.push_back({"tiny-qwen3", "2-layer qwen3 (q/k norms), E=256, 4 heads (2 KV), vocab 1024", s});
  }
  {
    ModelSpec s = qwen35_spec("kiln tiny qwen35", 1024, 256, 4, 4, 2, 64, 512, 2, 4, 32, false);
    s.n_ctx = 8192;
    p.push_back({"tiny-qwen35",
                 "4-layer qwen35 (3 delta-net + 1 attention), E=256, Hk=2 != Hv=4, S=32, vocab 1024", s});
  }
  {
    ModelSpec s = qwen35moe_spec(qwen35_spec("kiln tiny qwen35moe", 1024, 256, 4, 4, 2, 64, 256, 2, 4, 32, false),
                                 4, 2, 256, 256);
    s.n_ctx = 8192;
    p.push_back({"tiny-qwen35moe", "4-layer qwen35moe, 4 experts (2 used) + shared expert, E=256, vocab 1024", s});
  }
  {  // the same two with one MTP block (blk.4.nextn.*: --spec-type draft-mtp tests)
    const size_t q = p.size() - 2, qm = p.size() - 1;
    Preset a = p[q], b = p[qm];
    a.name = "tiny-qwen35-mtp";
    a.description = "tiny-qwen35 with one MTP block";
    a.spec.n_mtp = 1;
    b.name = "tiny-qwen35moe-mtp";
    b.description = "tiny-qwen35moe with one MTP block";
    b.spec.n_mtp = 1;
    p.push_back(a);
    p.push_back(b);
  }
  p.push_back({"qwen35-0.8b", "Qwen3.5-0.8B shapes (24 layers, E=1024, tied)",
               qwen35_spec("kiln qwen35 0.8B", 248320, 1024, 24, 8, 2, 256, 3584, 16, 16, 128, true)});
  p.push_back({"qwen35-9b", "Qwen3.5-9B shapes (32 layers, E=4096)",
               qwen35_spec("kiln qwen35 9B", 248320, 4096, 32, 16, 4, 256, 12288, 16, 32, 128, false)});
  p.push_back({"qwen35-27b", "Qwen3.5-27B shapes (64 layers, E=5120)",
               qwen35_spec("kiln qwen35 27B", 248320, 5120, 64, 24, 4, 256, 17408, 16, 48, 128, false)});
  p.push_back({"qwen35moe-35b-a3b", "Qwen3.5-35B-A3B shapes (40 layers, 256 experts)",
               qwen35moe_spec(
                   qwen35_spec("kiln qwen35moe 35B-A3B", 248320, 2048, 40, 16, 2, 256, 512, 16, 32, 128, false), 256,
                   8, 512, 512)});
  p.push_back({"llama-1b", "Llama-3.2-1B-like shapes (16 layers, E=2048, tied)",
               llama_spec("kiln llama 1B", 128256, 2048, 16, 32, 8, 64, 8192, 131072, 500000.0, 1e-5, true)});
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = make_presets();
  return p;
}

const Preset* find_preset(std::string_view name) {
  for (const auto& p : presets())
    if (p.name == name) return &p;
  return nullptr;
}

std::optional<ModelSpec> default_spec(std::string_view arch) {
  const char* name = arch == "llama"       ? "tiny-llama"
                     : arch == "qwen3"     ? "tiny-qwen3"
                     : arch == "qwen35"    ? "tiny-qwen35"
                     : arch == "qwen35moe" ? "tiny-qwen35moe"
                                           : nullptr;
  if (!name) return std::nullopt;
  return find_preset(name)->spec;
}

Status validate(const ModelSpec& s) {
  const bool hybrid = s.arch == "qwen35" || s.arch == "qwen35moe";
  if (s.arch != "llama" && s.arch != "qwen3" && !hybrid)
    return err("unknown arch '{}' (llama, qwen3, qwen35, qwen35moe)", s.arch);
  auto pos = [](int64_t v, const char* field) -> Status {
    if (v < 1) return err("{} must be >= 1 (got {})", field, v);
    if (v > (int64_t(1) << 31)) return err("{} is too large (got {})", field, v);
    return {};
  };
  KILN_TRY(pos(s.n_embd, "n_embd"));
  KILN_TRY(pos(s.n_layer, "n_layer"));
  KILN_TRY(pos(s.n_head, "n_head"));
  KILN_TRY(pos(s.n_head_kv, "n_head_kv"));
  KILN_TRY(pos(s.head_dim, "head_dim"));
  KILN_TRY(pos(s.n_ctx, "n_ctx"));
  KILN_TRY(pos(s.n_vocab, "n_vocab"));
  if (s.n_head % s.n_head_kv != 0) return err("n_head {} is not a multiple of n_head_kv {}", s.n_head, s.n_head_kv);
  if (s.n_vocab < min_vocab(s.arch))
    return err("n_vocab {} is below the {} tokens the tokenizer needs", s.n_vocab, min_vocab(s.arch));
  if (s.n_rot < 2 || s.n_rot > s.head_dim || s.n_rot % 2 != 0)
    return err("rope dimension count {} must be even and in [2, head_dim {}]", s.n_rot, s.head_dim);
  if (s.rms_eps <= 0) return err("rms_eps must be > 0");
  if (s.n_mtp < 0 || (s.n_mtp > 0 && !hybrid)) return err("MTP blocks are only supported for qwen35/qwen35moe");
  if (s.arch == "qwen35moe") {
    KILN_TRY(pos(s.n_expert, "n_expert"));
    KILN_TRY(pos(s.n_expert_used, "n_expert_used"));
    KILN_TRY(pos(s.n_ff_exp, "n_ff_exp"));
    KILN_TRY(pos(s.n_ff_shexp, "n_ff_shexp"));
    if (s.n_expert_used > s.n_expert) return err("n_expert_used {} > n_expert {}", s.n_expert_used, s.n_expert);
  } else {
    KILN_TRY(pos(s.n_ff, "n_ff"));
  }
  if (hybrid) {
    KILN_TRY(pos(s.ssm_d_conv, "ssm_d_conv"));
    KILN_TRY(pos(s.ssm_d_state, "ssm_d_state"));
    KILN_TRY(pos(s.ssm_n_group, "ssm_n_group"));
    KILN_TRY(pos(s.ssm_dt_rank, "ssm_dt_rank"));
    KILN_TRY(pos(s.full_attention_interval, "full_attention_interval"));
    if (s.ssm_dt_rank % s.ssm_n_group != 0)
      return err("ssm_dt_rank (V heads) {} is not a multiple of ssm_n_group (K heads) {}", s.ssm_dt_rank,
                 s.ssm_n_group);
    if (s.rope_sections.size() != 4) return err("rope_sections needs 4 entries");
    int64_t sum = 0;
    for (auto v : s.rope_sections) {
      if (v < 0) return err("rope_sections entries must be >= 0");
      sum += v;
    }
    if (sum * 2 > s.n_rot) return err("rope_sections sum {} exceeds n_rot/2 = {}", sum, s.n_rot / 2);
  }
  return {};
}

}  // namespace kiln::model::gen
