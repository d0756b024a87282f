// model/vision.cpp — loading the qwen3vl_merger projector and running its encoder (see vision.h).
#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/log.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace kiln::model {

using backend::Binary;
using backend::Tensor;
using backend::Unary;

namespace {

// Binds GGUF tensors of the projector: matrices in place (any type kiln multiplies), vectors as F32.
struct Bind {
  const gguf::File& f;
  std::vector<std::unique_ptr<float[]>>& owned;
  uint64_t bytes = 0;
  size_t n_used = 0;

  Status operator()(Weight& w, const std::string& name, std::vector<int64_t> ne, bool vector, bool required = true) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) return required ? err("{}: --mmproj: tensor '{}' is missing (needed by qwen3vl_merger)", f.path(), name) : Status{};
    std::array<int64_t, 4> want = {1, 1, 1, 1};
    for (size_t i = 0; i < ne.size(); ++i) want[i] = ne[i];
    if (want != t->ne)
      return err("{}: --mmproj: tensor '{}' has shape [{}, {}, {}, {}], expected [{}, {}, {}, {}]", f.path(), name,
                 t->ne[0], t->ne[1], t->ne[2], t->ne[3], want[0], want[1], want[2], want[3]);
    ++n_used;
    bytes += t->n_bytes;
    const auto& ti = gguf::type_info(t->type);
    w.type = t->type;
    w.ne = t->ne;
    w.data = f.tensor_data(*t);
    w.row_bytes = size_t(t->ne[0] / ti.block_size) * ti.type_size;
    if (!vector) {
      if (!kernels::matmul_supported(t->type))
        return err("{}: --mmproj: tensor '{}' has type {}, which kiln cannot multiply", f.path(), name, ti.name);
      return {};
    }
    return to_f32(w, name);
  }
  // An F32 copy of w (any type with a dequantizer).
  Status to_f32(Weight& w, const std::string& name) {
    if (w.type == GgmlType::F32) return {};
    const auto* tr = tensor::dtype_traits(w.type);
    if (!tr || !tr->dequantize_row)
      return err("{}: --mmproj: tensor '{}' has type {}, expected F32/F16/BF16", f.path(), name, gguf::type_name(w.type));
    const int64_t n = w.ne[0] * w.ne[1] * w.ne[2] * w.ne[3], rows = n / w.ne[0];
    auto buf = std::make_unique<float[]>(size_t(n));
    for (int64_t r = 0; r < rows; ++r)
      tensor::dequantize_row(w.type, w.data + size_t(r) * w.row_bytes, buf.get() + r * w.ne[0], w.ne[0]);
    w.type = GgmlType::F32;
    w.data = reinterpret_cast<const uint8_t*>(buf.get());
    w.row_bytes = size_t(w.ne[0]) * 4;
    owned.push_back(std::move(buf));
    return {};
  }
};

Weight owned_f32(std::vector<std::unique_ptr<float[]>>& owned, std::unique_ptr<float[]> buf, std::array<int64_t, 4> ne) {
  Weight w;
  w.type = GgmlType::F32;
  w.ne = ne;
  w.row_bytes = size_t(ne[0]) * 4;
  w.data = reinterpret_cast<const uint8_t*>(buf.get());
  owned.push_back(std::move(buf));
  return w;
}

}  // namespace

Result<VisionConfig> VisionConfig::from_file(const gguf::File& f) {
  VisionConfig c;
  const std::string& path = f.path();
  auto pt = f.get_string("clip.projector_type");
  if (!pt.ok()) {
    auto vpt = f.get_string("clip.vision.projector_type");
    if (!vpt.ok()) return err("{}: --mmproj: key 'clip.projector_type' is missing (is this a projector file?)", path);
    pt = std::move(vpt);
  }
  c.projector_type = *pt;
  if (c.projector_type != "qwen3vl_merger")
    return err("{}: --mmproj: clip.projector_type '{}' is not supported (kiln runs qwen3vl_merger: Qwen3-VL / Qwen3.5)",
               path, c.projector_type);
  if (auto hv = f.get_bool_or("clip.has_vision_encoder", true); !hv.ok() || !*hv)
    return err("{}: --mmproj: the file has no vision encoder (clip.has_vision_encoder)", path);
  auto geti = [&](const char* key, int64_t& out, bool required) -> Status {
    auto v = required ? f.get_int(key) : f.get_int_or(key, out);
    if (!v.ok()) return err("--mmproj {}", v.error().message);
    out = *v;
    return {};
  };
  KILN_TRY(geti("clip.vision.embedding_length", c.n_embd, true));
  KILN_TRY(geti("clip.vision.feed_forward_length", c.n_ff, true));
  KILN_TRY(geti("clip.vision.attention.head_count", c.n_head, true));
  KILN_TRY(geti("clip.vision.block_count", c.n_layer, true));
  KILN_TRY(geti("clip.vision.patch_size", c.patch, false));
  KILN_TRY(geti("clip.vision.spatial_merge_size", c.merge, false));
  auto eps = f.get_float_or("clip.vision.attention.layer_norm_epsilon", 1e-6);
  if (!eps.ok()) return err("--mmproj {}", eps.error().message);
  c.eps = float(*eps);
  for (const char* key : {"clip.vision.image_mean", "clip.vision.image_std"}) {
    if (!f.has(key)) continue;
    auto v = f.get_float_array(key);
    if (!v.ok() || v->size() != 3) return err("{}: --mmproj: key '{}' must be 3 floats", path, key);
    float* dst = std::strcmp(key, "clip.vision.image_mean") == 0 ? c.mean : c.std;
    for (int i = 0; i < 3; ++i) dst[i] = float((*v)[size_t(i)]);
  }
  for (int i = 0; i < 3; ++i)
    if (!(c.std[i] > 0)) return err("{}: --mmproj: clip.vision.image_std[{}] = {} must be positive", path, i, c.std[i]);
  if (const gguf::Value* ds = f.find("clip.vision.is_deepstack_layers")) {
    if (ds->type != gguf::ValueType::ARRAY || (ds->elem_type != gguf::ValueType::BOOL && !ds->arr.empty() && !ds->arr[0].is_integer()))
      return err("{}: --mmproj: key 'clip.vision.is_deepstack_layers' must be an array of bools", path);
    for (size_t i = 0; i < ds->arr.size(); ++i)
      if (ds->elem_type == gguf::ValueType::BOOL ? ds->arr[i].b : (ds->arr[i].u | uint64_t(ds->arr[i].i)) != 0)
        c.deepstack.push_back(int64_t(i));
  }
  if (c.n_embd <= 0 || c.n_head <= 0 || c.n_embd % c.n_head != 0 || c.n_layer <= 0 || c.n_ff <= 0)
    return err("{}: --mmproj: embedding_length {} / head_count {} / block_count {} / feed_forward_length {} are not a "
               "valid ViT", path, c.n_embd, c.n_head, c.n_layer, c.n_ff);
  if (c.merge != 2) return err("{}: --mmproj: clip.vision.spatial_merge_size {} (qwen3vl_merger needs 2)", path, c.merge);
  if (c.patch <= 0 || c.patch > 64) return err("{}: --mmproj: clip.vision.patch_size {} is not valid", path, c.patch);
  if (c.head_dim() % 4 != 0 || c.head_dim() > 512)
    return err("{}: --mmproj: head_dim {} must be a multiple of 4 and at most 512", path, c.head_dim());
  for (int64_t il : c.deepstack)
    if (il >= c.n_layer) return err("{}: --mmproj: DeepStack layer {} of {} blocks", path, il, c.n_layer);
  // The widths the keys do not give: the merger's (mm.0 rows; mm.2 rows = the output width) and the
  // widest DeepStack fc1 (the loader checks every tensor's full shape against these).
  const gguf::TensorInfo* mm0 = f.find_tensor("mm.0.weight");
  const gguf::TensorInfo* mm2 = f.find_tensor("mm.2.weight");
  if (!mm0 || !mm2) return err("{}: --mmproj: tensor '{}' is missing (needed by qwen3vl_merger)", path, mm0 ? "mm.2.weight" : "mm.0.weight");
  c.n_merger_ff = mm0->ne[1];
  c.n_out = mm2->ne[1];
  for (int64_t il : c.deepstack) {
    const std::string name = "v.deepstack." + std::to_string(il) + ".fc1.weight";
    const gguf::TensorInfo* fc1 = f.find_tensor(name);
    if (!fc1) return err("{}: --mmproj: tensor '{}' is missing (DeepStack layer {})", path, name, il);
    c.n_ds_ff = std::max(c.n_ds_ff, fc1->ne[1]);
  }
  return c;
}

Result<std::unique_ptr<VisionModel>> VisionModel::load(const std::string& path, const VisionLoadOptions& opt) {
  gguf::OpenOptions oo;
  oo.load_mode = opt.load_mode;
  auto fr = gguf::File::open(path, oo);
  if (!fr.ok()) return err("--mmproj {}", fr.error().message);
  auto m = std::unique_ptr<VisionModel>(new VisionModel());
  m->file_ = std::move(*fr);
  const gguf::File& f = *m->file_;
  auto cr = VisionConfig::from_file(f);
  KILN_TRY(cr);
  m->cfg_ = std::move(*cr);
  VisionConfig& c = m->cfg_;

  const int64_t E = c.n_embd, P = c.patch, F = c.n_ff;
  Bind b{f, m->owned_};
  // Patch embedding: the Conv3D's two time slices summed (a still image is its own second frame).
  Weight w0, w1;
  KILN_TRY(b(w0, "v.patch_embd.weight", {P, P, 3, E}, true));
  KILN_TRY(b(w1, "v.patch_embd.weight.1", {P, P, 3, E}, true));
  {
    const size_t n = size_t(3 * P * P * E);
    auto buf = std::make_unique<float[]>(n);
    for (size_t i = 0; i < n; ++i) buf[i] = w0.f32()[i] + w1.f32()[i];
    m->patch_w = owned_f32(m->owned_, std::move(buf), {3 * P * P, E, 1, 1});
  }
  KILN_TRY(b(m->patch_b, "v.patch_embd.bias", {E}, true));
  const gguf::TensorInfo* pe = f.find_tensor("v.position_embd.weight");
  if (!pe) return err("{}: --mmproj: tensor 'v.position_embd.weight' is missing (needed by qwen3vl_merger)", path);
  c.n_pos_side = int64_t(std::lround(std::sqrt(double(pe->ne[1]))));
  if (c.n_pos_side * c.n_pos_side != pe->ne[1])
    return err("{}: --mmproj: tensor 'v.position_embd.weight' has {} rows, not a square grid", path, pe->ne[1]);
  {
    Weight pw;
    KILN_TRY(b(pw, "v.position_embd.weight", {E, pe->ne[1]}, true));
    m->pos_embd.assign(pw.f32(), pw.f32() + E * pe->ne[1]);
  }
  m->layers.resize(size_t(c.n_layer));
  for (int64_t il = 0; il < c.n_layer; ++il) {
    VisionLayer& L = m->layers[size_t(il)];
    const std::string p = "v.blk." + std::to_string(il) + ".";
    KILN_TRY(b(L.ln1_w, p + "ln1.weight", {E}, true));
    KILN_TRY(b(L.ln1_b, p + "ln1.bias", {E}, true));
    KILN_TRY(b(L.qkv_w, p + "attn_qkv.weight", {E, 3 * E}, false));
    KILN_TRY(b(L.qkv_b, p + "attn_qkv.bias", {3 * E}, true));
    KILN_TRY(b(L.o_w, p + "attn_out.weight", {E, E}, false));
    KILN_TRY(b(L.o_b, p + "attn_out.bias", {E}, true));
    KILN_TRY(b(L.ln2_w, p + "ln2.weight", {E}, true));
    KILN_TRY(b(L.ln2_b, p + "ln2.bias", {E}, true));
    KILN_TRY(b(L.up_w, p + "ffn_up.weight", {E, F}, false));
    KILN_TRY(b(L.up_b, p + "ffn_up.bias", {F}, true));
    KILN_TRY(b(L.down_w, p + "ffn_down.weight", {F, E}, false));
    KILN_TRY(b(L.down_b, p + "ffn_down.bias", {E}, true));
  }
  KILN_TRY(b(m->post_ln_w, "v.post_ln.weight", {E}, true));
  KILN_TRY(b(m->post_ln_b, "v.post_ln.bias", {E}, true));
  KILN_TRY(b(m->mm0_w, "mm.0.weight", {4 * E, c.n_merger_ff}, false));
  KILN_TRY(b(m->mm0_b, "mm.0.bias", {c.n_merger_ff}, true));
  KILN_TRY(b(m->mm2_w, "mm.2.weight", {c.n_merger_ff, c.n_out}, false));
  KILN_TRY(b(m->mm2_b, "mm.2.bias", {c.n_out}, true));
  for (int64_t il : c.deepstack) {
    VisionLayer& L = m->layers[size_t(il)];
    const std::string p = "v.deepstack." + std::to_string(il) + ".";
    const gguf::TensorInfo* fc1 = f.find_tensor(p + "fc1.weight");  // present: VisionConfig::from_file
    KILN_TRY(b(L.ds_norm_w, p + "norm.weight", {4 * E}, true));
    KILN_TRY(b(L.ds_norm_b, p + "norm.bias", {4 * E}, true));
    KILN_TRY(b(L.ds_fc1_w, p + "fc1.weight", {4 * E, fc1->ne[1]}, false));
    KILN_TRY(b(L.ds_fc1_b, p + "fc1.bias", {fc1->ne[1]}, true));
    KILN_TRY(b(L.ds_fc2_w, p + "fc2.weight", {fc1->ne[1], c.n_out}, false));
    KILN_TRY(b(L.ds_fc2_b, p + "fc2.bias", {c.n_out}, true));
  }
  if (b.n_used != f.tensors().size())
    KILN_LOG_WARN("{}: {} projector tensor(s) not used by kiln", path, f.tensors().size() - b.n_used);
  for (auto [w, n] : {std::pair{&m->inv_n, E}, std::pair{&m->inv_n4, 4 * E}}) {
    auto buf = std::make_unique<float[]>(size_t(n));
    std::fill(buf.get(), buf.get() + n, 1.0f / float(n));
    *w = owned_f32(m->owned_, std::move(buf), {n, 1, 1, 1});
  }
  m->weight_bytes_ = b.bytes;

  // Placement: every weight wrapped on the host, or uploaded to one GPU.
  m->host_ = backend::make_cpu_device(1);
  std::vector<Weight*> all = {&m->patch_w, &m->patch_b, &m->post_ln_w, &m->post_ln_b, &m->mm0_w, &m->mm0_b,
                              &m->mm2_w, &m->mm2_b, &m->inv_n, &m->inv_n4};
  for (VisionLayer& L : m->layers)
    for (Weight* w : {&L.ln1_w, &L.ln1_b, &L.qkv_w, &L.qkv_b, &L.o_w, &L.o_b, &L.ln2_w, &L.ln2_b, &L.up_w, &L.up_b,
                      &L.down_w, &L.down_b, &L.ds_norm_w, &L.ds_norm_b, &L.ds_fc1_w, &L.ds_fc1_b, &L.ds_fc2_w, &L.ds_fc2_b})
      if (w->present()) all.push_back(w);
  const bool gpu = opt.offload && backend::cuda_device_count() > opt.main_gpu && opt.main_gpu >= 0;
  if (!gpu) {
    m->dev_ = m->host_.get();
    for (Weight* w : all) {
      const size_t n = Tensor::make(nullptr, 0, w->type, w->ne).n_bytes();
      m->bufs_.push_back(m->host_->wrap(w->data, n));
      w->t = Tensor::make(m->bufs_.back().get(), 0, w->type, w->ne);
    }
  } else {
    backend::Device& d = backend::cuda_device(opt.main_gpu);
    m->dev_ = &d;
    std::vector<uint64_t> sizes;
    for (const Weight* w : all) sizes.push_back(Tensor::make(nullptr, 0, w->type, w->ne).n_bytes());
    m->bufs_.push_back(d.alloc(size_t(packed_weight_bytes(sizes))));
    auto st = d.create_stream();
    size_t off = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      off = (off + 255) / 256 * 256;
      all[i]->t = Tensor::make(m->bufs_.back().get(), off, all[i]->type, all[i]->ne);
      st->upload(all[i]->t, all[i]->data, size_t(sizes[i]));
      off += size_t(sizes[i]);
    }
    st->synchronize();
  }
  KILN_LOG_INFO("{}: vision projector {} ({} blocks, n_embd {}, patch {}, DeepStack {}) on {}", path, c.projector_type,
                c.n_layer, c.n_embd, c.patch, c.deepstack.size(), m->dev_->name());
  return m;
}

}  // namespace kiln::model
