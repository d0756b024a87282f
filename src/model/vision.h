// model/vision.h — the vision projector (--mmproj): a Qwen3-VL / Qwen3.5 ViT + merger
//   (`clip.projector_type` qwen3vl_merger, the file llama.cpp's converter writes) loaded from its
//   GGUF, and VisionEncoder, which turns one preprocessed image into the text model's input
//   embeddings.
// Owns: VisionConfig (clip.* keys), the projector's weights (bound and checked like the model
//   loader: every tensor's name, type and shape; errors name the file and the tensor), their
//   placement (host, or one CUDA device with --mmproj-offload and a usable GPU), and the encoder's
//   scratch (grown to the largest image seen, never during an image).
// The graph (llama.cpp's clip_graph_qwen3vl, HF's Qwen3VLVisionModel): patches in 2x2 merge order;
//   the two Conv3D time slices summed into one patch matrix; + bias + the learned position table
//   bilinearly resized (align corners) to the patch grid; per block LayerNorm, fused QKV, 2-D
//   vision RoPE (rows, then columns: rope_multi Vision), full attention over the image, output
//   projection, LayerNorm, GELU (tanh) MLP; DeepStack mergers after the blocks that have them;
//   the final LayerNorm, 4 patches concatenated, merger MLP with exact (erf) GELU as HF.
//   Only backend::Stream ops (LayerNorm = a mean by mat-mul with a 1/n vector, its subtraction,
//   rms_norm, the bias add; full attention = one non-causal attention run over the image's keys).
//   The q|k|v projection and the MLP run kVisionChunk patches at a time, so the scratch holds three
//   [n_embd, patches] rows, the K/V cache and one chunk's wider rows (vision_arena; the memory
//   planner's image batch is the same function).
// Must not: decode images (media/), see requests or tokens, or touch the text model.
// Threading: VisionModel is immutable after load; a VisionEncoder is used by one thread at a time.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/mmap.h"
#include "core/result.h"
#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "model/model.h"

namespace kiln::model {

// What the encoder's scratch depends on (VisionConfig::dims(), or the memory planner's reading of a
// projector's keys and tensor table: model/fit.h ProjectorShape).
struct VisionDims {
  int64_t n_embd = 0, n_ff = 0, n_head = 1, patch = 16;
  int64_t n_mff = 0;        // the widest merger MLP row (mm.0, DeepStack fc1)
  int64_t n_out_total = 0;  // floats per image token
  int64_t patch_len() const { return 3 * patch * patch; }
};

struct VisionConfig {
  std::string projector_type;  // clip.projector_type (qwen3vl_merger)
  int64_t n_embd = 0;          // clip.vision.embedding_length
  int64_t n_ff = 0;            // clip.vision.feed_forward_length
  int64_t n_head = 0;          // clip.vision.attention.head_count
  int64_t n_layer = 0;         // clip.vision.block_count
  int64_t patch = 16;          // clip.vision.patch_size
  int64_t merge = 2;           // clip.vision.spatial_merge_size
  int64_t n_pos_side = 0;      // sqrt(rows of v.position_embd.weight)
  int64_t n_out = 0;           // merger output width (= the text model's n_embd): rows of mm.2.weight
  int64_t n_merger_ff = 0;     // mm.0.weight rows
  int64_t n_ds_ff = 0;         // the widest DeepStack fc1 (0: none)
  // (n_out, n_merger_ff, n_ds_ff: from the tensor table, read by from_file with the keys)
  float eps = 1e-6f;           // clip.vision.attention.layer_norm_epsilon
  float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.5f, 0.5f, 0.5f};  // clip.vision.image_mean / image_std
  std::vector<int64_t> deepstack;  // block indices with a DeepStack merger (clip.vision.is_deepstack_layers)
  int64_t head_dim() const { return n_embd / n_head; }
  // Width of one image token's output: the merger's, then one more per DeepStack layer (llama.cpp's concat).
  int64_t n_out_total() const { return n_out * int64_t(1 + deepstack.size()); }
  VisionDims dims() const;
  // The clip.* keys and the merger / DeepStack widths of a projector file, checked (the loader's and
  // the memory planner's reading).
  static Result<VisionConfig> from_file(const gguf::File& f);
};

// Patches per chunk of the q|k|v projection and the MLP.
inline constexpr int64_t kVisionChunk = 1024;

// The encoder's scratch buffers (offsets in one backend::Arena) for images of up to N patches.
struct VisionArena {
  size_t h, cur, q, kc, vc, qkv, ff, mean, vpos, seq, kpos, mff, out;
};
// Plans them into A (K/V rows of type kv: F32 on the CPU, F16 on a GPU); returns the bytes.
size_t vision_arena(const VisionDims& d, int64_t N, gguf::GgmlType kv, backend::Arena& A, VisionArena& o);

struct VisionLoadOptions {
  LoadMode load_mode = LoadMode::Mmap;
  bool offload = true;  // --mmproj-offload: weights and encoding on the GPU when one is usable
  int main_gpu = 0;
};

struct VisionLayer {
  Weight ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b;
  // DeepStack merger (present() when this block has one): norm over 4*n_embd, fc1, GELU, fc2.
  Weight ds_norm_w, ds_norm_b, ds_fc1_w, ds_fc1_b, ds_fc2_w, ds_fc2_b;
};

class VisionModel {
 public:
  static Result<std::unique_ptr<VisionModel>> load(const std::string& path, const VisionLoadOptions& opt = {});
  const VisionConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *file_; }
  backend::Device& device() const { return *dev_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  Weight patch_w;    // [3*P*P, n_embd] F32: v.patch_embd.weight + v.patch_embd.weight.1
  Weight patch_b;    // [n_embd]
  std::vector<float> pos_embd;  // [n_embd, n_pos_side^2] F32 (host: resized per image)
  std::vector<VisionLayer> layers;
  Weight post_ln_w, post_ln_b;  // v.post_ln (the merger's norm)
  Weight mm0_w, mm0_b, mm2_w, mm2_b;
  Weight inv_n;      // [n_embd, 1] F32 of 1/n_embd (LayerNorm's mean as a mat-mul)
  Weight inv_n4;     // [4*n_embd, 1] F32 of 1/(4*n_embd) (DeepStack norms)

 private:
  VisionConfig cfg_;
  std::unique_ptr<gguf::File> file_;
  std::vector<std::unique_ptr<float[]>> owned_;
  std::unique_ptr<backend::Device> host_;
  backend::Device* dev_ = nullptr;
  std::vector<std::unique_ptr<backend::Buffer>> bufs_;
  uint64_t weight_bytes_ = 0;
  friend struct VisionLoader;
};

// The image's token grid: nx * ny tokens of n_out_total() floats, in row-major order (y, x).
struct ImageEmbedding {
  int nx = 0, ny = 0;
  std::vector<float> data;  // [n_out_total, nx * ny]
};

class VisionEncoder {
 public:
  // Runs on the model's device; the host work (and a CPU device's ops) on `pool`.
  VisionEncoder(const VisionModel& m, ThreadPool& pool);
  ~VisionEncoder();
  // pixels: planar [3][h][w] normalised (media::preprocess), w and h multiples of patch * merge.
  Result<ImageEmbedding> encode(const float* chw, int w, int h);
  // Scratch + stream workspace bytes an image of n_patches needs on a device of this type (the memory
  // planner's image batch; the stream's fixed cuBLAS workspace not included).
  static uint64_t scratch_bytes(const VisionDims& d, int64_t n_patches, backend::DeviceType type);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::model
