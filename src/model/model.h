// model/model.h — a loaded model: config, validated weights (views into the GGUF mapping, or
//   device copies for the layers placed on a GPU), their placement, and the entry point load_model().
// Owns: the gguf::File (and so the mapping) for the model's lifetime; small F32 copies of 1-D
//   tensors (norms, biases, ssm_a, ...) and of ssm_conv1d when they are stored in another type; a
//   host device whose Buffers wrap the mapping (Device::wrap, no copy); the device Buffers of the
//   GPU layers (uploaded once in load_model()).
// Placement (LoadOptions::n_gpu_layers, llama.cpp's -ngl): the last n_gpu_layers trunk layers run
//   on the GPU, the output norm and matrix too when n_gpu_layers > n_layer; token_embd (get_rows on
//   the token ids) stays on the host; the MTP blocks go where the output does with LoadOptions::mtp
//   (nextn.embed_tokens stays on the host), else they stay on the host.
// Must not: hold per-sequence state (model/memory.h) or scratch (model/context.h); see requests.
// Loading: every tensor the architecture needs is checked for name, type and shape; errors name
//   the file and the tensor. An MTP block (qwen35*) is bound into `mtp`, not run. Tensors the
//   architecture does not know are reported once in LoadInfo::unused and logged, never fatal.
// Threading: immutable after load_model(); read from any number of Contexts concurrently.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/mmap.h"
#include "core/result.h"
#include "gguf/reader.h"
#include "model/config.h"
#include "model/placement.h"

namespace kiln::model {

using gguf::GgmlType;

// A weight used in place: ne[0] contiguous; row r of matrix slice e at data + (e*ne[1] + r)*row_bytes
// (host memory: the mapping or the F32 copy). `t` is the same weight as a backend Tensor on the device
// its layer runs on: a view of a Device::wrap of `data` on the host, the uploaded copy on a GPU.
struct Weight {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};
  size_t row_bytes = 0;  // bytes of one ne[0] row
  backend::Tensor t;
  bool present() const { return data != nullptr; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }  // only for F32 weights
};

struct LayerWeights {
  Weight attn_norm;            // [E]
  // attention (llama/qwen2/qwen3 and the full-attention layers of qwen35)
  Weight attn_q;               // [E, D*Hq] (qwen35: [E, 2*D*Hq], per head q then gate)
  Weight attn_k, attn_v;       // [E, D*Hkv]
  Weight attn_output;          // [D*Hq, E]
  Weight attn_q_bias, attn_k_bias, attn_v_bias, attn_output_bias;  // optional (qwen2: q/k/v)
  Weight attn_q_norm, attn_k_norm;  // [D] (qwen3, qwen35)
  // delta-net (qwen35 recurrent layers)
  Weight ssm_qkv;              // attn_qkv [E, conv_dim]
  Weight ssm_gate;             // attn_gate [E, value_dim] (z)
  Weight ssm_conv1d;           // [d_conv, conv_dim], F32
  Weight ssm_dt;               // ssm_dt.bias [Hv]
  Weight ssm_a;                // [Hv] = -exp(A_log)
  Weight ssm_beta, ssm_alpha;  // [E, Hv]
  Weight ssm_norm;             // [S]
  Weight ssm_out;              // [value_dim, E]
  // FFN
  Weight ffn_norm;             // [E] (qwen35: post_attention_norm)
  Weight ffn_gate, ffn_up;     // [E, n_ff]
  Weight ffn_down;             // [n_ff, E]
  Weight ffn_gate_inp;         // [E, n_expert] router
  Weight ffn_gate_exps, ffn_up_exps;  // [E, n_ff_exp, n_expert]
  Weight ffn_down_exps;        // [n_ff_exp, E, n_expert]
  Weight ffn_gate_inp_shexp;   // [E], F32
  Weight ffn_gate_shexp, ffn_up_shexp;  // [E, n_ff_shexp]
  Weight ffn_down_shexp;       // [n_ff_shexp, E]
  // MTP / nextn block only (qwen35*; loaded for speculative decoding, not run by the trunk)
  Weight nextn_eh_proj;        // [2E, E]
  Weight nextn_enorm, nextn_hnorm;  // [E]
  Weight nextn_shared_head_norm;    // [E] (optional: output_norm when absent)
  Weight nextn_embed_tokens;        // [E, V] (optional: token_embd)
  Weight nextn_shared_head_head;    // [E, V] (optional: output)
};

// -ngl values besides a layer count (llama-server's): every layer and the output on the GPU, or
// as many as the device holds (until the memory planner exists: all when a GPU is usable).
inline constexpr int kGpuLayersAll = -1, kGpuLayersAuto = -2;

struct LoadOptions {
  LoadMode load_mode = LoadMode::Mmap;  // mmap (default), mlock, or read into memory ("none")
  // llama.cpp's -ngl: trunk layer il runs on the GPU when il >= n_layer - n_gpu_layers; the output
  // norm and matrix when n_gpu_layers > n_layer. kGpuLayersAll: all (layers and output); 0: CPU only;
  // kGpuLayersAuto: all when a CUDA device is usable, else 0. Without a usable CUDA device the model
  // loads on the CPU (one log line says why, unless auto).
  int n_gpu_layers = 0;
  int main_gpu = 0;  // the CUDA device (ordinal) of the GPU layers
  // The MTP block will run (--spec-type draft-mtp): on the device of the last trunk layer (the GPU
  // whenever n_gpu_layers >= 1), its head matrix with the output (model/mtp.cpp).
  bool mtp = false;
  // --cpu-moe / --n-cpu-moe / -ot: expert tensors of GPU blocks kept in host memory (model/placement.h).
  PlacementOptions placement;
  // Called with (tensors checked, total) while validating; optional.
  std::function<void(size_t, size_t)> progress;
};

struct LoadInfo {
  double load_ms = 0;                // wall time of load_model()
  uint64_t file_bytes = 0;
  uint64_t weight_bytes = 0;         // bytes of the tensors used
  std::vector<std::string> unused;   // tensors present in the file but not run (e.g. nextn.*)
  int64_t n_gpu_layers = 0;          // trunk layers placed on the GPU (after clamping / CPU fallback)
  bool output_on_gpu = false;
  uint64_t gpu_bytes = 0;            // weight bytes uploaded to the GPU
  int64_t n_expert_host = 0;         // GPU blocks (trunk and MTP) whose expert tensors stay on the host
};

class Model {
 public:
  const ModelConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *file_; }
  const LoadInfo& info() const { return info_; }

  Weight token_embd;   // [E, V]
  Weight output_norm;  // [E]
  Weight output;       // [E, V] (= token_embd when tied)
  std::vector<LayerWeights> layers;  // n_layer trunk layers
  std::vector<LayerWeights> mtp;     // n_nextn MTP blocks (blk.<n_layer + i>), gated attention + FFN + nextn.*
  // output_norm where the MTP blocks run (the trunk's hidden states they read are normed with it):
  // output_norm itself, or its copy on the GPU when the output stays on the host.
  Weight mtp_output_norm;  // [E]

  // Placement: the device trunk layer il runs on (its weights' device), the output's, and the host
  // device (the wrapped mapping, token_embd).
  backend::Device& layer_device(int64_t il) const { return *layer_dev_[size_t(il)]; }
  backend::Device& output_device() const { return *out_dev_; }
  // Where the MTP blocks run (LoadOptions::mtp): with the last trunk layer; their head matrix
  // (nextn.shared_head_head or the output) is on output_device().
  backend::Device& mtp_device() const { return *mtp_dev_; }
  // Where the expert tensors of block il (trunk layers, then the MTP blocks) are: the block's device,
  // or the host when the placement keeps them there (the Context runs those experts on the host).
  backend::Device& expert_device(int64_t il) const { return *expert_dev_[size_t(il)]; }
  backend::Device& host_device() const { return *host_; }

 private:
  friend Result<std::unique_ptr<Model>> load_model(const std::string&, const LoadOptions&);
  friend Result<std::unique_ptr<Model>> load_model(std::unique_ptr<gguf::File>, const LoadOptions&);
  friend Status place_model(Model&, const LoadOptions&);
  ModelConfig cfg_;
  std::unique_ptr<gguf::File> file_;
  LoadInfo info_;
  std::vector<std::unique_ptr<float[]>> owned_;  // F32 copies of small tensors
  std::unique_ptr<backend::Device> host_;        // wraps the mapping (and owned_)
  std::vector<backend::Device*> layer_dev_;      // [n_layer]: host_ or a CUDA device
  backend::Device* out_dev_ = nullptr;
  backend::Device* mtp_dev_ = nullptr;
  std::vector<backend::Device*> expert_dev_;     // [n_layer + n_nextn]
  std::vector<std::unique_ptr<backend::Buffer>> bufs_;  // wraps and GPU uploads (destroyed before host_)
};

// Bytes of one device Buffer holding weights of these sizes, each at a 256-byte boundary (the
// loader's upload packing; the memory planner counts with it).
inline uint64_t packed_weight_bytes(const std::vector<uint64_t>& sizes) {
  uint64_t total = 0;
  for (uint64_t n : sizes) total += (n + 255) / 256 * 256;
  return total;
}
// The bytes a weight takes once bound: vectors (norms, biases, ssm_a, ...: tensors whose ne[1..3]
// are 1) and ssm_conv1d are converted to F32; matrices keep their GGUF type.
uint64_t bound_weight_bytes(const gguf::TensorInfo& t);

Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& opt = {});
Result<std::unique_ptr<Model>> load_model(std::unique_ptr<gguf::File> file, const LoadOptions& opt = {});

}  // namespace kiln::model
