// Vision projector (mmproj) generator: presets of the real Qwen3.5 towers, the converter's tensor
// layout and type rules, weight synthesis and streaming through gguf::Writer (see mmproj.h).
//
// Layout source: llama.cpp's converter (conversion/qwen3vl.py, Qwen3VLVisionModel, registered for
// Qwen3_5ForConditionalGeneration; MmprojModel in conversion/base.py) and the file it wrote for the
// tiny HF model of scripts/hf_vision_fixtures.py (tests/fixtures/hf/vision/mmproj.gguf: the same key
// set, key order, tensor names, shapes and order as the "tiny" preset here; tests/model/test_mmproj_gen.cpp
// compares them).
//   patch_embed.proj.weight [E, 3, 2, P, P]  -> v.patch_embd.weight, v.patch_embd.weight.1 (the two time
//                                               slices) ne [P, P, 3, E]; proj.bias -> v.patch_embd.bias
//   pos_embed.weight [n_pos, E]              -> v.position_embd.weight ne [E, n_pos]
//   blocks.N.{norm1,norm2}                   -> v.blk.N.{ln1,ln2}.{weight,bias}
//   blocks.N.attn.{qkv,proj}                 -> v.blk.N.{attn_qkv [E, 3E], attn_out [E, E]}.{weight,bias}
//   blocks.N.mlp.{linear_fc1,linear_fc2}     -> v.blk.N.{ffn_up [E, F], ffn_down [F, E]}.{weight,bias}
//   merger.norm                              -> v.post_ln.{weight,bias}
//   merger.linear_fc1 / linear_fc2           -> mm.0 [4E, 4E] / mm.2 [4E, n_out] (.weight, .bias)
//   deepstack_merger_list.k.{norm,linear_fc1,linear_fc2}
//                                            -> v.deepstack.<deepstack[k]>.{norm [4E], fc1 [4E, 4E], fc2 [4E, n_out]}
// Tensor order is the HF names' sorted order (blocks, deepstack_merger_list, merger, patch_embed,
// pos_embed; bias before weight; block numbers as strings). Types follow the converter's rules
// (MmprojOptions::type).
#include "model/gen/mmproj.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/thread_pool.h"
#include "gguf/writer.h"
#include "model/gen/synth.h"
#include "tensor/quant.h"

namespace kiln::model::gen {
namespace {

using gguf::GgmlType;

// ---- presets ---------------------------------------------------------------------------------
//
// Real towers: HF config.json "vision_config" of the Qwen3.5 releases (Qwen3_5VisionConfig: the
// Qwen3-VL tower without DeepStack), as quoted verbatim in public code that pins the official
// checkpoints (e.g. a "Ground truth recovered from the checkpoint itself" Qwen3.5-9B fixture and
// "OFFICIAL_VISION_CONTRACTS" tables):
//  - Qwen/Qwen3.5-9B and Qwen/Qwen3.5-27B: depth 27, hidden_size 1152, num_heads 16 (head 72),
//    intermediate_size 4304, patch_size 16, temporal_patch_size 2, spatial_merge_size 2,
//    num_position_embeddings 2304 (48 x 48: image_size 768), hidden_act gelu_pytorch_tanh,
//    deepstack_visual_indexes [], out_hidden_size 4096 (9B) / 5120 (27B) = text hidden_size.
//    456 M / 461 M parameters: mmproj-F16.gguf of ~0.85 / ~0.86 GiB.
//  - Qwen/Qwen3.5-0.8B: depth 12, hidden_size 768, num_heads 12 (head 64), intermediate_size 3072,
//    out_hidden_size 1024; the rest as above.
// eps = text_config rms_norm_eps 1e-6 (what the converter writes). image_mean / image_std 0.5: the
// Qwen3-VL / Qwen3.5 preprocessor_config (patch 16) values — recalled, not re-read from the HF file;
// they only change the pixel normalisation, never a shape.
// "tiny" is the vision half of scripts/hf_vision_fixtures.py (depth 2, E 64, 4 heads, FFN 96, 8 x 8
// positions, out 64, OpenAI CLIP mean / std) so its file can be compared with the converter's.

VisionSpec qwen35_tower(std::string name, int64_t depth, int64_t e, int64_t heads, int64_t ff, int64_t out) {
  VisionSpec s;
  s.name = std::move(name);
  s.n_layer = depth;
  s.n_embd = e;
  s.n_head = heads;
  s.n_ff = ff;
  s.n_out = out;
  return s;
}

std::vector<VisionPreset> make_presets() {
  std::vector<VisionPreset> p;
  {
    VisionSpec s = qwen35_tower("kiln tiny qwen3vl_merger", 2, 64, 4, 96, 64);
    s.n_pos = 64;
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, sd[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    std::copy(mean, mean + 3, s.mean);
    std::copy(sd, sd + 3, s.std);
    p.push_back({"tiny", "2 blocks, E=64, 4 heads, FFN 96, 8x8 positions, out 64 (the HF fixture's tower)", s});
  }
  p.push_back({"qwen35-0.8b", "Qwen3.5-0.8B tower: 12 blocks, E=768, 12 heads, FFN 3072, out 1024",
               qwen35_tower("kiln qwen35 0.8B vision", 12, 768, 12, 3072, 1024)});
  p.push_back({"qwen35-9b", "Qwen3.5-9B tower: 27 blocks, E=1152, 16 heads, FFN 4304, out 4096",
               qwen35_tower("kiln qwen35 9B vision", 27, 1152, 16, 4304, 4096)});
  p.push_back({"qwen35-27b", "Qwen3.5-27B tower: 27 blocks, E=1152, 16 heads, FFN 4304, out 5120",
               qwen35_tower("kiln qwen35 27B vision", 27, 1152, 16, 4304, 5120)});
  return p;
}

// ---- tensor plan -----------------------------------------------------------------------------

enum class Init { Normal, Norm };  // N(0, sigma²); 1 + sigma·N (LayerNorm scales)
struct Def {
  std::string name;
  std::vector<int64_t> ne;
  Init init = Init::Normal;
  float sigma = 0;
  GgmlType type = GgmlType::F32;
};

constexpr float kBiasSigma = 0.02f;
constexpr float kOutGain = 0.5f;  // residual-branch outputs (attn_out, ffn_down): the stream grows slowly

std::vector<Def> build_defs(const VisionSpec& s) {
  std::vector<Def> d;
  const int64_t E = s.n_embd, F = s.n_ff, M = s.merge * s.merge * E, P = s.patch;
  // Linear layer: weight ne [n_in, n_out] with sigma gain/sqrt(n_in) (unit-variance outputs), bias [n_out].
  auto linear = [&](const std::string& p, int64_t n_in, int64_t n_out, float gain) {
    d.push_back({p + ".bias", {n_out}, Init::Normal, kBiasSigma});
    d.push_back({p + ".weight", {n_in, n_out}, Init::Normal, gain / std::sqrt(float(n_in))});
  };
  auto layer_norm = [&](const std::string& p, int64_t n) {
    d.push_back({p + ".bias", {n}, Init::Normal, kBiasSigma});
    d.push_back({p + ".weight", {n}, Init::Norm, 0.1f});
  };
  auto by_string = [](int64_t a, int64_t b) { return std::to_string(a) < std::to_string(b); };

  std::vector<int64_t> blocks(size_t(s.n_layer));
  for (int64_t i = 0; i < s.n_layer; ++i) blocks[size_t(i)] = i;
  std::sort(blocks.begin(), blocks.end(), by_string);
  for (int64_t il : blocks) {
    const std::string p = "v.blk." + std::to_string(il) + ".";
    linear(p + "attn_out", E, E, kOutGain);
    linear(p + "attn_qkv", E, 3 * E, 1.0f);
    linear(p + "ffn_up", E, F, 1.0f);
    linear(p + "ffn_down", F, E, kOutGain);
    layer_norm(p + "ln1", E);
    layer_norm(p + "ln2", E);
  }
  std::vector<int64_t> ds(s.deepstack.size());  // HF list positions k, sorted as strings
  for (size_t k = 0; k < ds.size(); ++k) ds[k] = int64_t(k);
  std::sort(ds.begin(), ds.end(), by_string);
  for (int64_t k : ds) {
    const std::string p = "v.deepstack." + std::to_string(s.deepstack[size_t(k)]) + ".";
    linear(p + "fc1", M, M, 1.0f);
    linear(p + "fc2", M, s.n_out, 1.0f);
    layer_norm(p + "norm", M);
  }
  linear("mm.0", M, M, 1.0f);
  linear("mm.2", M, s.n_out, 1.0f);
  layer_norm("v.post_ln", E);
  // The Conv3D's two time slices are summed for a still image: each gets half the variance.
  const float patch_sigma = 1.0f / std::sqrt(float(2 * 3 * P * P));
  d.push_back({"v.patch_embd.bias", {E}, Init::Normal, kBiasSigma});
  d.push_back({"v.patch_embd.weight", {P, P, 3, E}, Init::Normal, patch_sigma});
  d.push_back({"v.patch_embd.weight.1", {P, P, 3, E}, Init::Normal, patch_sigma});
  d.push_back({"v.position_embd.weight", {E, s.n_pos}, Init::Normal, 0.5f});
  return d;
}

// The converter's type for a tensor of an `ft` file (MmprojOptions::type).
GgmlType converter_type(const Def& t, GgmlType ft) {
  if (t.ne.size() <= 1) return GgmlType::F32;                      // biases and norms
  if (t.name == "v.position_embd.weight") return GgmlType::F32;    // V_ENC_EMBD_POS: always F32
  if (t.name.starts_with("v.patch_embd.weight"))                   // MmprojModel.tensor_force_quant
    return ft == GgmlType::F16 ? GgmlType::F16 : GgmlType::F32;
  if (ft == GgmlType::Q8_0 && t.ne[0] % gguf::type_info(ft).block_size != 0) return GgmlType::F16;
  return ft;
}

Result<std::vector<Def>> make_defs(const MmprojOptions& o) {
  KILN_TRY(validate(o.spec));
  if (o.type != GgmlType::F32 && o.type != GgmlType::F16 && o.type != GgmlType::BF16 && o.type != GgmlType::Q8_0)
    return err("projector type {} is not one llama.cpp's converter writes for a projector (F32, F16, BF16, Q8_0)",
               gguf::type_name(o.type));
  auto defs = build_defs(o.spec);
  for (auto& t : defs) t.type = converter_type(t, o.type);
  return defs;
}

void fill_values(const Def& t, Rng& rng, float* x, int64_t n) {
  if (t.init == Init::Norm)
    for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + t.sigma * rng.normal();
  else
    for (int64_t i = 0; i < n; ++i) x[i] = t.sigma * rng.normal();
}

}  // namespace

const std::vector<VisionPreset>& vision_presets() {
  static const std::vector<VisionPreset> p = make_presets();
  return p;
}

const VisionPreset* find_vision_preset(std::string_view name) {
  for (const auto& p : vision_presets())
    if (p.name == name) return &p;
  return nullptr;
}

Status validate(const VisionSpec& s) {
  auto pos = [](int64_t v, const char* field) -> Status {
    if (v < 1) return err("projector: {} must be >= 1 (got {})", field, v);
    if (v > (int64_t(1) << 20)) return err("projector: {} is too large (got {})", field, v);
    return {};
  };
  KILN_TRY(pos(s.n_layer, "n_layer (depth)"));
  KILN_TRY(pos(s.n_embd, "n_embd (hidden_size)"));
  KILN_TRY(pos(s.n_head, "n_head (num_heads)"));
  KILN_TRY(pos(s.n_ff, "n_ff (intermediate_size)"));
  KILN_TRY(pos(s.n_out, "n_out (out_hidden_size)"));
  KILN_TRY(pos(s.patch, "patch (patch_size)"));
  KILN_TRY(pos(s.n_pos, "n_pos (num_position_embeddings)"));
  if (s.n_embd % s.n_head != 0) return err("projector: n_embd {} is not a multiple of n_head {}", s.n_embd, s.n_head);
  if ((s.n_embd / s.n_head) % 4 != 0)
    return err("projector: head size {} (n_embd / n_head) must be a multiple of 4 (2-D vision rope)", s.n_embd / s.n_head);
  if (s.merge != 2) return err("projector: spatial merge {} (qwen3vl_merger is 2)", s.merge);
  if (s.patch > 64) return err("projector: patch {} is above 64", s.patch);
  const auto side = int64_t(std::llround(std::sqrt(double(s.n_pos))));
  if (side * side != s.n_pos) return err("projector: n_pos {} is not a square grid", s.n_pos);
  if (!(s.eps > 0)) return err("projector: eps must be > 0");
  for (int i = 0; i < 3; ++i)
    if (!(s.std[i] > 0)) return err("projector: image_std[{}] must be > 0", i);
  for (size_t k = 0; k < s.deepstack.size(); ++k) {
    if (s.deepstack[k] < 0 || s.deepstack[k] >= s.n_layer)
      return err("projector: deepstack layer {} is not one of the {} blocks", s.deepstack[k], s.n_layer);
    if (k > 0 && s.deepstack[k] <= s.deepstack[k - 1])
      return err("projector: deepstack layers must be increasing (got {} after {})", s.deepstack[k], s.deepstack[k - 1]);
  }
  return {};
}

std::string size_label(uint64_t n) {
  const double x = double(n);
  double scaled;
  char suffix;
  if (x > 1e12) scaled = x * 1e-12, suffix = 'T';
  else if (x > 1e9) scaled = x * 1e-9, suffix = 'B';
  else if (x > 1e6) scaled = x * 1e-6, suffix = 'M';
  else scaled = x * 1e-3, suffix = 'K';
  // Python: max(2 - len(str(round(scaled)).lstrip('0')), 0) decimals; round() is half-to-even like nearbyint.
  const auto r = uint64_t(std::nearbyint(scaled));
  const int digits = r == 0 ? 0 : int(std::to_string(r).size());
  return fmt::format("{:.{}f}{}", scaled, std::max(2 - digits, 0), suffix);
}

Result<std::vector<PlannedTensor>> plan_mmproj(const MmprojOptions& opt) {
  auto defs = make_defs(opt);
  if (!defs.ok()) return defs.error();
  return planned_tensors(*defs);
}

Status generate_mmproj(const MmprojOptions& opt, const std::string& path,
                       const std::function<void(size_t, size_t)>& progress) {
  auto defs_r = make_defs(opt);
  if (!defs_r.ok()) return defs_r.error();
  auto defs = std::make_shared<std::vector<Def>>(std::move(defs_r).value());
  const VisionSpec& s = opt.spec;
  uint64_t n_params = 0;
  for (const auto& d : *defs) {
    uint64_t n = 1;
    for (auto v : d.ne) n *= uint64_t(v);
    n_params += n;
  }

  // Keys in the converter's order (MmprojModel.set_gguf_parameters, then Qwen3VLVisionModel's).
  gguf::Writer w;
  w.set_string("general.architecture", "clip");
  w.set_string("general.type", "mmproj");
  w.set_string("general.name", s.name.empty() ? "kiln random qwen3vl_merger" : s.name);
  w.set_string("general.size_label", size_label(n_params));
  w.set_u32("general.file_type", file_type_id(opt.type, Mix::Uniform));
  w.set_bool("clip.has_vision_encoder", true);
  w.set_u32("clip.vision.projection_dim", uint32_t(s.n_out));
  const auto side = int64_t(std::llround(std::sqrt(double(s.n_pos))));
  w.set_u32("clip.vision.image_size", uint32_t(side * s.patch));
  w.set_u32("clip.vision.patch_size", uint32_t(s.patch));
  w.set_u32("clip.vision.embedding_length", uint32_t(s.n_embd));
  w.set_u32("clip.vision.feed_forward_length", uint32_t(s.n_ff));
  w.set_u32("clip.vision.block_count", uint32_t(s.n_layer));
  w.set_u32("clip.vision.attention.head_count", uint32_t(s.n_head));
  w.set("clip.vision.image_mean", gguf::make_f32_array({s.mean[0], s.mean[1], s.mean[2]}));
  w.set("clip.vision.image_std", gguf::make_f32_array({s.std[0], s.std[1], s.std[2]}));
  w.set_string("clip.projector_type", "qwen3vl_merger");
  w.set_bool("clip.use_gelu", true);
  w.set_u32("clip.vision.spatial_merge_size", uint32_t(s.merge));
  w.set_f32("clip.vision.attention.layer_norm_epsilon", float(s.eps));
  std::vector<bool> is_ds(size_t(s.n_layer), false);
  for (int64_t il : s.deepstack) is_ds[size_t(il)] = true;
  w.set("clip.vision.is_deepstack_layers", gguf::make_bool_array(is_ds));
  w.set_u32("general.quantization_version", 2);

  KILN_TRY(add_random_tensors<Def>(w, defs, opt.seed, opt.n_threads,
                                        [](const Def& t, Rng& rng, float* buf, int64_t n) { fill_values(t, rng, buf, n); }));
  return w.write(path, progress, opt.meta_only);
}

}  // namespace kiln::model::gen
