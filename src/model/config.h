// model/config.h — architectures kiln runs and their hyper-parameters, read from GGUF keys.
// Owns: the Arch enum (names exactly as `general.architecture`), ModelConfig (a plain struct, every
//   field from a GGUF key or a documented llama.cpp default) and load_config().
// Must not: read tensors (model/loader.cpp does), know about sequences or requests.
// Threading: plain values; load_config is a pure function of an immutable gguf::File.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/reader.h"

namespace kiln::model {

enum class Arch {
  Llama,      // "llama": SmolLM2, Llama 2/3 (RoPE pairs (2i, 2i+1), optional biases, tied output)
  Qwen2,      // "qwen2": llama + QKV bias, NeoX RoPE
  Qwen3,      // "qwen3": llama + per-head q/k RMSNorm, NeoX RoPE
  Qwen35,     // "qwen35": hybrid Gated-DeltaNet + gated full attention, dense FFN
  Qwen35Moe,  // "qwen35moe": qwen35 with routed experts + a shared expert
};
std::string_view arch_name(Arch a);
std::optional<Arch> arch_from_name(std::string_view name);
inline bool arch_is_hybrid(Arch a) { return a == Arch::Qwen35 || a == Arch::Qwen35Moe; }

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_str;        // general.architecture
  std::string name;            // general.name (may be empty)

  // ---- trunk shape ----
  int64_t n_vocab = 0;         // rows of token_embd.weight (<a>.vocab_size when present must agree)
  int64_t n_embd = 0;          // <a>.embedding_length (E)
  int64_t n_layer = 0;         // trunk layers = block_count - n_nextn
  int64_t n_layer_all = 0;     // <a>.block_count (includes MTP/nextn blocks)
  int64_t n_nextn = 0;         // <a>.nextn_predict_layers (MTP blocks; loaded, not run)
  int64_t n_ctx_train = 0;     // <a>.context_length
  int pooling_type = -1;       // <a>.pooling_type (llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank); -1 absent
  int64_t n_ff = 0;            // <a>.feed_forward_length (dense FFN width)

  // ---- attention ----
  int64_t n_head = 0;          // <a>.attention.head_count (Hq)
  int64_t n_head_kv = 0;       // <a>.attention.head_count_kv (default n_head)
  int64_t head_dim = 0;        // <a>.attention.key_length (default E / Hq)
  int64_t head_dim_v = 0;      // <a>.attention.value_length (default head_dim); must equal head_dim
  float rms_eps = 1e-5f;       // <a>.attention.layer_norm_rms_epsilon (also the L2-norm floor)
  float attn_scale = 0;        // <a>.attention.scale; 0 = 1/sqrt(head_dim)

  // ---- rope ----
  int n_rot = 0;               // <a>.rope.dimension_count (default head_dim)
  bool rope_neox = true;       // pairs (i, i+n_rot/2); false for llama: (2i, 2i+1) (llama.cpp rope type)
  float rope_freq_base = 10000.f;  // <a>.rope.freq_base
  float rope_freq_scale = 1.f;     // 1 / <a>.rope.scaling.factor for "linear" (or rope.scale_linear)
  std::array<int32_t, 4> rope_sections = {0, 0, 0, 0};  // <a>.rope.dimension_sections (IMROPE; text
                                                          // tokens use one position for every section)

  bool tied_embeddings = false;  // no output.weight: token_embd.weight is the output matrix

  // ---- hybrid (qwen35 / qwen35moe) ----
  std::vector<bool> recurrent;   // per trunk layer: true = delta-net, false = attention
                                 // (<a>.attention.recurrent_layers, else (i+1) % full_attention_interval)
  int64_t full_attention_interval = 4;  // <a>.full_attention_interval (default 4)
  int64_t ssm_d_conv = 0;      // <a>.ssm.conv_kernel
  int64_t ssm_d_inner = 0;     // <a>.ssm.inner_size = S * Hv
  int64_t ssm_d_state = 0;     // <a>.ssm.state_size (S: key and value head dim)
  int64_t ssm_n_group = 0;     // <a>.ssm.group_count (Hk)
  int64_t ssm_dt_rank = 0;     // <a>.ssm.time_step_rank (Hv)

  // ---- MoE (qwen35moe) ----
  int64_t n_expert = 0;        // <a>.expert_count
  int64_t n_expert_used = 0;   // <a>.expert_used_count
  int64_t n_ff_exp = 0;        // <a>.expert_feed_forward_length (fallback n_ff / n_expert_used)
  int64_t n_ff_shexp = 0;      // <a>.expert_shared_feed_forward_length (fallback n_ff)
  float expert_weights_scale = 1.f;  // <a>.expert_weights_scale (0 or missing = 1)
  bool expert_weights_norm = true;   // <a>.expert_weights_norm (qwen35moe renormalises top-k)

  // Derived sizes (hybrid): key_dim = S*Hk, value_dim = S*Hv, conv_dim = 2*key_dim + value_dim.
  int64_t ssm_key_dim() const { return ssm_d_state * ssm_n_group; }
  int64_t ssm_value_dim() const { return ssm_d_state * ssm_dt_rank; }
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  bool is_recurrent(int64_t il) const { return il < int64_t(recurrent.size()) && recurrent[size_t(il)]; }
  int64_t n_attn_layers() const;
  int64_t n_recurrent_layers() const;
};

// Reads and checks every key above. Errors name the file and the key.
Result<ModelConfig> load_config(const gguf::File& f);

}  // namespace kiln::model
