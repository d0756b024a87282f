// model/gen/mmproj.h — random-weight vision projector generator (`kiln gguf gen --mmproj`).
// Owns: the file llama.cpp's converter (convert_hf_to_gguf.py --mmproj, conversion/qwen3vl.py)
//   writes for a Qwen3.5 / Qwen3-VL vision tower — `clip.projector_type` qwen3vl_merger: the clip.*
//   keys, the v.* / mm.* tensor names, shapes, types and order — named presets of the real towers,
//   and the seeded weights (model/gen/synth.h), scaled so the encoder's activations stay finite.
// Must not: depend on kiln's projector loader (model/vision.h): the files must load in llama.cpp's
//   mtmd; tests check kiln's loader against them and against a converter-written file.
// Determinism: the output is a pure function of (spec, type, seed), byte-identical for any thread count.
// Threading: generate_mmproj() uses the given thread count for weight synthesis; otherwise re-entrant.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/types.h"
#include "model/gen/gen.h"

namespace kiln::model::gen {

// One vision tower, in HF vision_config terms (the converter's key in brackets).
struct VisionSpec {
  std::string name;           // general.name
  int64_t n_layer = 0;        // depth [clip.vision.block_count]
  int64_t n_embd = 0;         // hidden_size E [clip.vision.embedding_length]
  int64_t n_head = 0;         // num_heads [clip.vision.attention.head_count]
  int64_t n_ff = 0;           // intermediate_size [clip.vision.feed_forward_length]
  int64_t n_out = 0;          // out_hidden_size = the text model's n_embd [clip.vision.projection_dim; rows of mm.2]
  int64_t patch = 16;         // patch_size [clip.vision.patch_size]
  int64_t merge = 2;          // spatial_merge_size [clip.vision.spatial_merge_size]
  int64_t n_pos = 2304;       // num_position_embeddings, a square grid [rows of v.position_embd; image_size]
  double eps = 1e-6;          // the text config's rms_norm_eps [clip.vision.attention.layer_norm_epsilon]
  float mean[3] = {0.5f, 0.5f, 0.5f};  // preprocessor_config image_mean [clip.vision.image_mean]
  float std[3] = {0.5f, 0.5f, 0.5f};   // image_std [clip.vision.image_std]
  std::vector<int64_t> deepstack;      // deepstack_visual_indexes [clip.vision.is_deepstack_layers]
};

struct VisionPreset {
  std::string_view name;
  std::string_view description;
  VisionSpec spec;
};
const std::vector<VisionPreset>& vision_presets();
const VisionPreset* find_vision_preset(std::string_view name);
// Checks the tower is one the converter writes and llama.cpp's qwen3vl graph runs (temporal patch 2,
// merge 2, a square position grid, head size a multiple of 4 for the 2-D rope, deepstack indices in
// range and unique). Errors name the field.
Status validate(const VisionSpec& s);

struct MmprojOptions {
  VisionSpec spec;
  // The converter's --outtype: F32, F16 (mmproj-F16.gguf, the usual download), BF16 or Q8_0. As the
  // converter: vectors and v.position_embd F32; v.patch_embd.weight(.1) F16 in an F16 file, else F32;
  // Q8_0 matrices whose row length is not a multiple of 32 (ffn_down: 4304) fall back to F16.
  gguf::GgmlType type = gguf::GgmlType::F16;
  uint64_t seed = 42;
  int n_threads = 0;        // 0: all cores
  bool meta_only = false;   // header only (metadata + tensor table): for `kiln fit`
};

// The tensors in file order (the converter's: HF names sorted, so blocks 0, 1, 10, 11, ..., 2, 20, ...).
Result<std::vector<PlannedTensor>> plan_mmproj(const MmprojOptions& opt);
// Writes the projector to `path`; progress (optional) gets (tensors done, total).
Status generate_mmproj(const MmprojOptions& opt, const std::string& path,
                       const std::function<void(size_t, size_t)>& progress = {});

// gguf-py's size label ("244K", "456M"): the parameter count with at least two significant digits.
std::string size_label(uint64_t n_params);

}  // namespace kiln::model::gen
