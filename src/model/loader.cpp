// load_model: open the GGUF, read the config, bind + validate every tensor the architecture needs
// (name, type, shape), and place the layers (host: Tensors over Device::wrap of the mapping; GPU:
// one buffer per layer, filled through page-locked staging: model/staged_upload.h). Tensor names follow gguf-py constants.py TENSOR_NAMES.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "core/log.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/staged_upload.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace kiln::model {
namespace {

enum class Kind {
  Matrix,  // used by matmul in place: any kernels::matmul_supported type
  Table,   // token_embd: any type get_rows can dequantize
  Vector,  // small tensor read as F32 (converted when stored as F16/BF16/...)
};

class Binder {
 public:
  Binder(const gguf::File& f, std::vector<std::unique_ptr<float[]>>& owned, backend::Device& host,
         std::vector<std::unique_ptr<backend::Buffer>>& bufs, std::string arch)
      : f_(f), owned_(owned), host_(host), bufs_(bufs), arch_(std::move(arch)) {}

  // Binds `name` with expected shape `ne` (ne[0] first). Missing + required -> error.
  Status bind(Weight& w, const std::string& name, std::vector<int64_t> ne, Kind kind, bool required = true) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (required) return err("{}: tensor '{}' is missing (needed by {})", f_.path(), name, arch_);
      return {};
    }
    used_.insert(name);
    std::array<int64_t, 4> want = {1, 1, 1, 1};
    for (size_t i = 0; i < ne.size(); ++i) want[i] = ne[i];
    if (want != t->ne)
      return err("{}: tensor '{}' has shape [{}, {}, {}, {}], expected [{}, {}, {}, {}]", f_.path(), name, t->ne[0],
                 t->ne[1], t->ne[2], t->ne[3], want[0], want[1], want[2], want[3]);
    const auto& ti = gguf::type_info(t->type);
    if (t->ne[0] % ti.block_size != 0)
      return err("{}: tensor '{}' row length {} is not a multiple of the {} block size {}", f_.path(), name, t->ne[0],
                 ti.name, ti.block_size);
    w.type = t->type;
    w.data = f_.tensor_data(*t);
    w.ne = t->ne;
    w.row_bytes = size_t(t->ne[0] / ti.block_size) * ti.type_size;
    switch (kind) {
      case Kind::Matrix:
        if (!kernels::matmul_supported(t->type))
          return err("{}: tensor '{}' has type {}, which kiln cannot multiply (supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 "
                     "Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS)",
                     f_.path(), name, ti.name);
        break;
      case Kind::Table:
        if (!tensor::dtype_traits(t->type) || !tensor::dtype_traits(t->type)->dequantize_row)
          return err("{}: tensor '{}' has type {}, which kiln cannot dequantize", f_.path(), name, ti.name);
        break;
      case Kind::Vector: {
        if (t->type == GgmlType::F32) break;
        const auto* tr = tensor::dtype_traits(t->type);
        if (!tr || !tr->dequantize_row)
          return err("{}: tensor '{}' has type {}, expected F32/F16/BF16", f_.path(), name, ti.name);
        const int64_t n = t->n_elements();
        auto buf = std::make_unique<float[]>(size_t(n));
        const int64_t rows = n / t->ne[0];
        for (int64_t r = 0; r < rows; ++r)
          tensor::dequantize_row(t->type, w.data + size_t(r) * w.row_bytes, buf.get() + r * t->ne[0], t->ne[0]);
        w.type = GgmlType::F32;
        w.data = reinterpret_cast<const uint8_t*>(buf.get());
        w.row_bytes = size_t(t->ne[0]) * sizeof(float);
        owned_.push_back(std::move(buf));
        break;
      }
    }
    // The host Tensor: a wrap of the bytes in place (the mapping or the F32 copy).
    const size_t n_bytes = backend::Tensor::make(nullptr, 0, w.type, w.ne).n_bytes();
    bufs_.push_back(host_.wrap(w.data, n_bytes));
    w.t = backend::Tensor::make(bufs_.back().get(), 0, w.type, w.ne);
    bytes_ += t->n_bytes;
    return {};
  }

  const std::unordered_set<std::string>& used() const { return used_; }
  uint64_t bytes() const { return bytes_; }

 private:
  const gguf::File& f_;
  std::vector<std::unique_ptr<float[]>>& owned_;
  backend::Device& host_;
  std::vector<std::unique_ptr<backend::Buffer>>& bufs_;
  std::unordered_set<std::string> used_;
  std::string arch_;
  uint64_t bytes_ = 0;
};

// Every weight of a block (absent ones included: callers test present()).
template <class F>
void for_each_weight(LayerWeights& L, F&& f) {
  for (Weight* w : {&L.attn_norm, &L.attn_q, &L.attn_k, &L.attn_v, &L.attn_output, &L.attn_q_bias, &L.attn_k_bias,
                    &L.attn_v_bias, &L.attn_output_bias, &L.attn_q_norm, &L.attn_k_norm, &L.ssm_qkv, &L.ssm_gate,
                    &L.ssm_conv1d, &L.ssm_dt, &L.ssm_a, &L.ssm_beta, &L.ssm_alpha, &L.ssm_norm, &L.ssm_out, &L.ffn_norm,
                    &L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.ffn_gate_inp, &L.ffn_gate_exps, &L.ffn_up_exps,
                    &L.ffn_down_exps, &L.ffn_gate_inp_shexp, &L.ffn_gate_shexp, &L.ffn_up_shexp, &L.ffn_down_shexp,
                    &L.nextn_eh_proj, &L.nextn_enorm, &L.nextn_hnorm, &L.nextn_shared_head_norm,
                    &L.nextn_embed_tokens, &L.nextn_shared_head_head})
    f(*w);
}

// Copies the weights onto `dev` in one Buffer (each tensor 256-byte aligned) through the staged
// uploader; their Tensors then point there (the bytes are there after up.finish()). Returns the
// bytes uploaded.
uint64_t upload_weights(backend::Device& dev, StagedUpload& up, const std::vector<Weight*>& ws,
                        std::vector<std::unique_ptr<backend::Buffer>>& bufs) {
  std::vector<uint64_t> sizes;
  for (const Weight* w : ws) sizes.push_back(w->t.n_bytes());
  const size_t total = size_t(packed_weight_bytes(sizes));
  if (total == 0) return 0;
  bufs.push_back(dev.alloc(total));
  backend::Buffer* b = bufs.back().get();
  size_t off = 0;
  for (Weight* w : ws) {
    off = (off + 255) / 256 * 256;
    const size_t n = w->t.n_bytes();
    w->t = backend::Tensor::make(b, off, w->type, w->ne);
    up.add(w->t, w->data, n);
    off += n;
  }
  return total;
}

}  // namespace

uint64_t bound_weight_bytes(const gguf::TensorInfo& t) {
  const bool vector = (t.ne[1] == 1 && t.ne[2] == 1 && t.ne[3] == 1) ||
                      (t.name.size() >= 17 && t.name.compare(t.name.size() - 17, 17, "ssm_conv1d.weight") == 0);
  return vector && t.type != GgmlType::F32 ? uint64_t(t.n_elements()) * 4 : t.n_bytes;
}

// Placement (LoadOptions::n_gpu_layers): the GPU layers' weights (and the output's when all are
// placed) are uploaded once, one buffer per block; everything else keeps its host Tensor, and so do
// the expert tensors of GPU blocks that LoadOptions::placement keeps on the host (model/placement.h).
Status place_model(Model& m, const LoadOptions& opt) {
  const ModelConfig& c = m.cfg_;
  const bool have_gpu = backend::cuda_device_count() > 0;
  int64_t ngl = opt.n_gpu_layers == kGpuLayersAuto ? (have_gpu ? c.n_layer + 1 : 0)
                : opt.n_gpu_layers < 0           ? c.n_layer + 1
                                                 : opt.n_gpu_layers;
  if (ngl != 0 && !have_gpu) {
    KILN_LOG_WARN("n_gpu_layers {}: {}; running on the CPU", opt.n_gpu_layers, backend::cuda_unavailable_reason());
    ngl = 0;
  }
  ngl = std::min<int64_t>(ngl, c.n_layer + 1);
  m.layer_dev_.assign(size_t(c.n_layer), m.host_.get());
  m.expert_dev_.assign(size_t(c.n_layer + c.n_nextn), m.host_.get());
  m.out_dev_ = m.mtp_dev_ = m.host_.get();
  m.mtp_output_norm = m.output_norm;
  const BlockDevices bd = BlockDevices::of(c, int(ngl), opt.mtp, opt.main_gpu);
  auto experts = place_experts(m.file(), c, bd, opt.placement);  // also checks the rules when all is on the CPU
  KILN_TRY(experts);
  if (ngl == 0) return {};
  if (opt.main_gpu < 0 || opt.main_gpu >= backend::cuda_device_count())
    return err("main_gpu {}: there are {} CUDA device(s)", opt.main_gpu, backend::cuda_device_count());
  backend::Device& gpu = backend::cuda_device(opt.main_gpu);
  StagedUpload up(gpu);
  // One block's weights onto the GPU, its experts too unless they stay on the host.
  auto upload_block = [&](LayerWeights& L, int64_t il, std::initializer_list<const Weight*> keep_on_host) {
    const bool host_experts = experts->on_host(il);
    std::vector<Weight*> ws;
    for_each_weight(L, [&](Weight& w) {
      const bool expert = &w == &L.ffn_gate_exps || &w == &L.ffn_up_exps || &w == &L.ffn_down_exps;
      const bool keep = std::find(keep_on_host.begin(), keep_on_host.end(), &w) != keep_on_host.end();
      if (w.present() && !keep && !(expert && host_experts)) ws.push_back(&w);
    });
    m.info_.gpu_bytes += upload_weights(gpu, up, ws, m.bufs_);
    m.expert_dev_[size_t(il)] = host_experts ? m.host_.get() : &gpu;
    m.info_.n_expert_host += host_experts ? 1 : 0;
  };
  const int64_t first = std::max<int64_t>(0, c.n_layer - ngl);
  for (int64_t il = first; il < c.n_layer; ++il) {
    upload_block(m.layers[size_t(il)], il, {});
    m.layer_dev_[size_t(il)] = &gpu;
  }
  m.info_.n_gpu_layers = c.n_layer - first;
  if (ngl > c.n_layer) {
    // A tied output keeps token_embd's host Tensor for get_rows; the output gets its own copy.
    m.info_.gpu_bytes += upload_weights(gpu, up, {&m.output_norm, &m.output}, m.bufs_);
    m.out_dev_ = &gpu;
    m.info_.output_on_gpu = true;
  }
  if (bd.mtp_on_gpu) {
    // The MTP blocks run with the last trunk layer (model/mtp.cpp): their embeddings are gathered on
    // the host, their head matrix multiplies with the output (on the host when the output is there),
    // and they read the trunk's hidden states through output_norm (a copy here when the output is
    // on the host).
    const bool out_host = !m.info_.output_on_gpu;
    for (size_t i = 0; i < m.mtp.size(); ++i)
      upload_block(m.mtp[i], c.n_layer + int64_t(i),
                   {&m.mtp[i].nextn_embed_tokens, out_host ? &m.mtp[i].nextn_shared_head_head : nullptr});
    m.mtp_output_norm = m.output_norm;
    if (out_host) m.info_.gpu_bytes += upload_weights(gpu, up, {&m.mtp_output_norm}, m.bufs_);
    m.mtp_dev_ = &gpu;
  }
  up.finish();
  KILN_LOG_INFO("{}: {} of {} layers{} on {} ({:.1f} MiB){}", m.file().path(), m.info_.n_gpu_layers, c.n_layer,
                m.info_.output_on_gpu && bd.mtp_on_gpu ? ", the output and the MTP block"
                : m.info_.output_on_gpu               ? " and the output"
                : bd.mtp_on_gpu                       ? " and the MTP block"
                                                      : "",
                gpu.name(), double(m.info_.gpu_bytes) / (1 << 20),
                m.info_.n_expert_host > 0
                    ? fmt::format("; the expert tensors of {} of them on the host", m.info_.n_expert_host)
                    : std::string());
  return {};
}

Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  gguf::OpenOptions oo;
  oo.load_mode = opt.load_mode;
  auto f = gguf::File::open(path, oo);
  KILN_TRY(f);
  auto m = load_model(std::move(*f), opt);
  KILN_TRY(m);
  (*m)->info_.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

Result<std::unique_ptr<Model>> load_model(std::unique_ptr<gguf::File> file, const LoadOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::unique_ptr<Model>(new Model());
  m->file_ = std::move(file);
  const gguf::File& f = *m->file_;
  auto cfg = load_config(f);
  KILN_TRY(cfg);
  m->cfg_ = std::move(*cfg);
  ModelConfig& c = m->cfg_;

  m->host_ = backend::make_cpu_device(1);
  Binder b(f, m->owned_, *m->host_, m->bufs_, c.arch_str);
  // Vocabulary size comes from token_embd.
  const gguf::TensorInfo* te = f.find_tensor("token_embd.weight");
  if (!te) return err("{}: tensor 'token_embd.weight' is missing", f.path());
  if (c.n_vocab == 0) c.n_vocab = te->ne[1];
  const int64_t E = c.n_embd, V = c.n_vocab, D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv;
  KILN_TRY(b.bind(m->token_embd, "token_embd.weight", {E, V}, Kind::Table));
  KILN_TRY(b.bind(m->output_norm, "output_norm.weight", {E}, Kind::Vector));
  KILN_TRY(b.bind(m->output, "output.weight", {E, V}, Kind::Matrix, /*required=*/false));
  if (!m->output.present()) {
    c.tied_embeddings = true;
    m->output = m->token_embd;
    if (!kernels::matmul_supported(m->output.type))
      return err("{}: tied output uses 'token_embd.weight' of type {}, which kiln cannot multiply", f.path(),
                 gguf::type_name(m->output.type));
  }
  if (f.find_tensor("rope_freqs.weight"))
    return err("{}: tensor 'rope_freqs.weight' (llama3 rope frequency factors) is not supported yet", f.path());

  const bool hybrid = arch_is_hybrid(c.arch);
  const size_t n_total = size_t(c.n_layer);
  m->layers.resize(size_t(c.n_layer));
  // One block of the trunk or an MTP layer: attn_norm, the mixer (attention, or delta-net for a
  // recurrent trunk layer), the FFN norm and the FFN (dense, or routed experts + shared expert).
  auto bind_block = [&](LayerWeights& L, const std::string& p, bool attn) -> Status {
    KILN_TRY(b.bind(L.attn_norm, p + "attn_norm.weight", {E}, Kind::Vector));
    if (attn) {
      KILN_TRY(b.bind(L.attn_q, p + "attn_q.weight", {E, (hybrid ? 2 : 1) * D * Hq}, Kind::Matrix));
      KILN_TRY(b.bind(L.attn_k, p + "attn_k.weight", {E, D * Hkv}, Kind::Matrix));
      KILN_TRY(b.bind(L.attn_v, p + "attn_v.weight", {E, D * Hkv}, Kind::Matrix));
      KILN_TRY(b.bind(L.attn_output, p + "attn_output.weight", {D * Hq, E}, Kind::Matrix));
      const bool need_bias = c.arch == Arch::Qwen2;
      if (!hybrid) {
        KILN_TRY(b.bind(L.attn_q_bias, p + "attn_q.bias", {D * Hq}, Kind::Vector, need_bias));
        KILN_TRY(b.bind(L.attn_k_bias, p + "attn_k.bias", {D * Hkv}, Kind::Vector, need_bias));
        KILN_TRY(b.bind(L.attn_v_bias, p + "attn_v.bias", {D * Hkv}, Kind::Vector, need_bias));
        KILN_TRY(b.bind(L.attn_output_bias, p + "attn_output.bias", {E}, Kind::Vector, false));
      }
      if (c.arch == Arch::Qwen3 || hybrid) {
        KILN_TRY(b.bind(L.attn_q_norm, p + "attn_q_norm.weight", {D}, Kind::Vector));
        KILN_TRY(b.bind(L.attn_k_norm, p + "attn_k_norm.weight", {D}, Kind::Vector));
      }
    } else {
      const int64_t S = c.ssm_d_state, Hv = c.ssm_dt_rank, conv = c.ssm_conv_dim(), vd = c.ssm_value_dim();
      KILN_TRY(b.bind(L.ssm_qkv, p + "attn_qkv.weight", {E, conv}, Kind::Matrix));
      KILN_TRY(b.bind(L.ssm_gate, p + "attn_gate.weight", {E, vd}, Kind::Matrix));
      KILN_TRY(b.bind(L.ssm_conv1d, p + "ssm_conv1d.weight", {c.ssm_d_conv, conv}, Kind::Vector));
      KILN_TRY(b.bind(L.ssm_dt, p + "ssm_dt.bias", {Hv}, Kind::Vector));
      KILN_TRY(b.bind(L.ssm_a, p + "ssm_a", {Hv}, Kind::Vector));
      KILN_TRY(b.bind(L.ssm_beta, p + "ssm_beta.weight", {E, Hv}, Kind::Matrix));
      KILN_TRY(b.bind(L.ssm_alpha, p + "ssm_alpha.weight", {E, Hv}, Kind::Matrix));
      KILN_TRY(b.bind(L.ssm_norm, p + "ssm_norm.weight", {S}, Kind::Vector));
      KILN_TRY(b.bind(L.ssm_out, p + "ssm_out.weight", {vd, E}, Kind::Matrix));
    }
    KILN_TRY(b.bind(L.ffn_norm, p + (hybrid ? "post_attention_norm.weight" : "ffn_norm.weight"), {E}, Kind::Vector));
    if (c.arch == Arch::Qwen35Moe) {
      const int64_t X = c.n_expert, F = c.n_ff_exp, Fs = c.n_ff_shexp;
      KILN_TRY(b.bind(L.ffn_gate_inp, p + "ffn_gate_inp.weight", {E, X}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_gate_exps, p + "ffn_gate_exps.weight", {E, F, X}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_up_exps, p + "ffn_up_exps.weight", {E, F, X}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_down_exps, p + "ffn_down_exps.weight", {F, E, X}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_gate_inp_shexp, p + "ffn_gate_inp_shexp.weight", {E}, Kind::Vector));
      KILN_TRY(b.bind(L.ffn_gate_shexp, p + "ffn_gate_shexp.weight", {E, Fs}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_up_shexp, p + "ffn_up_shexp.weight", {E, Fs}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_down_shexp, p + "ffn_down_shexp.weight", {Fs, E}, Kind::Matrix));
    } else {
      KILN_TRY(b.bind(L.ffn_gate, p + "ffn_gate.weight", {E, c.n_ff}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_up, p + "ffn_up.weight", {E, c.n_ff}, Kind::Matrix));
      KILN_TRY(b.bind(L.ffn_down, p + "ffn_down.weight", {c.n_ff, E}, Kind::Matrix));
    }
    return {};
  };
  for (int64_t il = 0; il < c.n_layer; ++il) {
    KILN_TRY(bind_block(m->layers[size_t(il)], "blk." + std::to_string(il) + ".", !c.is_recurrent(il)));
    if (opt.progress) opt.progress(size_t(il + 1), n_total);
  }
  // MTP blocks (qwen35* only): a gated-attention block + nextn.* (bound and validated; not run by the trunk).
  m->mtp.resize(size_t(c.n_nextn));
  for (int64_t i = 0; i < c.n_nextn; ++i) {
    LayerWeights& L = m->mtp[size_t(i)];
    const std::string p = "blk." + std::to_string(c.n_layer + i) + ".";
    KILN_TRY(bind_block(L, p, /*attn=*/true));
    KILN_TRY(b.bind(L.nextn_eh_proj, p + "nextn.eh_proj.weight", {2 * E, E}, Kind::Matrix));
    KILN_TRY(b.bind(L.nextn_enorm, p + "nextn.enorm.weight", {E}, Kind::Vector));
    KILN_TRY(b.bind(L.nextn_hnorm, p + "nextn.hnorm.weight", {E}, Kind::Vector));
    KILN_TRY(b.bind(L.nextn_shared_head_norm, p + "nextn.shared_head_norm.weight", {E}, Kind::Vector, false));
    KILN_TRY(b.bind(L.nextn_embed_tokens, p + "nextn.embed_tokens.weight", {E, V}, Kind::Table, false));
    KILN_TRY(b.bind(L.nextn_shared_head_head, p + "nextn.shared_head_head.weight", {E, V}, Kind::Matrix, false));
  }
  KILN_TRY(place_model(*m, opt));
  for (const auto& t : f.tensors())
    if (!b.used().count(t.name)) m->info_.unused.push_back(t.name);
  if (!m->info_.unused.empty()) {
    std::string list;
    for (size_t i = 0; i < m->info_.unused.size() && i < 4; ++i) list += (i ? ", " : "") + m->info_.unused[i];
    if (m->info_.unused.size() > 4) list += ", ...";
    KILN_LOG_WARN("{}: {} tensor(s) not used by kiln's {} model: {}", f.path(),
                  m->info_.unused.size(), c.arch_str, list);
  }
  m->info_.file_bytes = f.file_size();
  m->info_.weight_bytes = b.bytes();
  m->info_.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

}  // namespace kiln::model
