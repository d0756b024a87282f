// model/gen/gen.h — random-weight GGUF model generator (`kiln gguf gen`).
// Owns: architecture knowledge needed to WRITE a llama.cpp-compatible file for `llama`, `qwen3`,
//       `qwen35`, `qwen35moe` (keys, tensor names, shapes, converter conventions), named presets,
//       per-tensor quant mixes, a working byte-level BPE vocabulary and a chat template. Vision
//       projectors (mmproj) are model/gen/mmproj.h; both draw their weights through model/gen/synth.h.
// Must not: run models or depend on how kiln's own loader works (files must load in llama.cpp).
// Determinism: the output is a pure function of (spec, type/mix, seed): same inputs -> byte-identical
//       file, independent of the thread count.
// Threading: generate() uses the given thread count for weight synthesis/quantization; the
//       functions here are otherwise plain and re-entrant.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/types.h"

namespace kiln::model::gen {

// Shape and hyper-parameters of one model. Fields that do not apply to an arch are ignored.
struct ModelSpec {
  std::string arch;        // "llama", "qwen3", "qwen35", "qwen35moe"
  std::string name;        // general.name
  int64_t n_vocab = 0;     // rows of token_embd (= number of tokens in the vocabulary)
  int64_t n_embd = 0;      // hidden size E
  int64_t n_layer = 0;     // trunk layers (MTP blocks come on top, see n_mtp)
  int64_t n_head = 0;      // attention query heads
  int64_t n_head_kv = 0;   // attention KV heads
  int64_t head_dim = 0;    // key_length = value_length
  int64_t n_ff = 0;        // dense FFN width
  int64_t n_ctx = 0;       // context_length
  double rope_theta = 10000.0;
  int64_t n_rot = 0;       // rope.dimension_count (qwen35: head_dim * partial_rotary_factor)
  double rms_eps = 1e-6;
  bool tied_embeddings = false;  // no output.weight; token_embd is reused
  // qwen35 / qwen35moe (Gated DeltaNet)
  int64_t full_attention_interval = 4;
  int64_t ssm_d_conv = 4;        // linear_conv_kernel_dim
  int64_t ssm_d_state = 128;     // linear_key_head_dim = linear_value_head_dim
  int64_t ssm_n_group = 0;       // linear_num_key_heads (Hk)
  int64_t ssm_dt_rank = 0;       // linear_num_value_heads (Hv)
  std::vector<int32_t> rope_sections = {11, 11, 10, 0};
  int64_t n_mtp = 0;             // MTP (nextn) blocks appended after the trunk
  // MoE (qwen35moe)
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;
};

struct Preset {
  std::string_view name;
  std::string_view description;
  ModelSpec spec;
};
const std::vector<Preset>& presets();
const Preset* find_preset(std::string_view name);
// Default spec for an arch (a small but realistic shape); nullopt for an unknown arch.
std::optional<ModelSpec> default_spec(std::string_view arch);
// Checks the spec is consistent (divisibility, positive sizes, vocab large enough for the
// tokenizer). Errors name the field.
Status validate(const ModelSpec& s);

// What tensor types to write.
enum class Mix {
  Uniform,  // every quantizable matrix gets `type` (falls back where the row length does not fit)
  IQ4_XS,   // approximates llama-quantize's IQ4_XS ftype choices
  Q4_K_M,   // approximates llama-quantize's Q4_K_M ftype choices
};

inline constexpr int64_t kFastPoolRows = 64;

struct GenOptions {
  ModelSpec spec;
  gguf::GgmlType type = gguf::GgmlType::F16;  // Mix::Uniform
  Mix mix = Mix::Uniform;
  uint64_t seed = 42;
  int n_threads = 0;  // 0: all cores
  bool meta_only = false;  // write the header only (metadata + tensor table, no data): for `kiln fit`
  // Fast weights (`--fast`): each tensor's first kFastPoolRows rows are synthesised, every other row is
  // made of their whole quantization blocks (synth.h add_random_tensors): a full-size file at disk speed
  // for memory, load and speed runs, whose rows are not independent draws.
  bool fast = false;
  // A GGUF (e.g. llama.cpp's ggml-vocab-qwen35.gguf) whose tokenizer.* metadata the file carries
  // instead of the generated vocabulary, its token list padded with unused "[PAD<i>]" tokens up to
  // spec.n_vocab (which must be at least its token count: vocab_size gives it).
  std::string vocab_from;
};
// The token count of a GGUF's tokenizer.ggml.tokens (for GenOptions::vocab_from). Errors name the file.
Result<int64_t> vocab_size(const std::string& path);

// One planned tensor (name, type, shape), in file order. Exposed for tests and `--dry-run`.
struct PlannedTensor {
  std::string name;
  gguf::GgmlType type;
  std::vector<int64_t> ne;  // ne[0] first
  uint64_t n_bytes;
};
Result<std::vector<PlannedTensor>> plan(const GenOptions& opt);

// Writes the model to `path`. progress (optional) gets (tensors done, total).
Status generate(const GenOptions& opt, const std::string& path,
                const std::function<void(size_t, size_t)>& progress = {});

// ---- tokenizer pieces (also used by tests) ----
struct Vocabulary {
  std::string model;                 // tokenizer.ggml.model ("gpt2")
  std::string pre;                   // tokenizer.ggml.pre
  std::vector<std::string> tokens;   // size n_vocab
  std::vector<int32_t> token_type;   // 1 normal, 3 control, 4 user-defined, 5 unused
  std::vector<std::string> merges;   // "a b", in priority order
  int32_t bos = -1, eos = -1, pad = -1, eot = -1;
  bool add_bos = false;
  std::string chat_template;
};
// n_vocab: total tokens (byte symbols + learned merges + specials + [PAD] filler).
Result<Vocabulary> build_vocabulary(std::string_view arch, int64_t n_vocab);
// Smallest vocabulary size the tokenizer needs for an arch (256 bytes + specials + some merges).
int64_t min_vocab(std::string_view arch);

// ftype id written as general.file_type for a uniform type / mix.
uint32_t file_type_id(gguf::GgmlType uniform_type, Mix mix);

}  // namespace kiln::model::gen
