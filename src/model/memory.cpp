#include "model/memory.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/copy_wide.h"
#include "core/overflow.h"
#include "model/model.h"
#include "tensor/quant.h"

namespace kiln::model {

using backend::Tensor;

Memory::~Memory() = default;

Result<std::unique_ptr<Memory>> Memory::create(const ModelConfig& cfg, const MemoryOptions& opt) {
  return create(cfg, opt, std::vector<backend::Device*>(size_t(cfg.n_layer + 1), nullptr));
}

Result<std::unique_ptr<Memory>> Memory::create(const Model& m, const MemoryOptions& opt) {
  std::vector<backend::Device*> devs(size_t(m.config().n_layer + 1), nullptr);
  for (int64_t il = 0; il < m.config().n_layer; ++il) {
    backend::Device& d = m.layer_device(il);
    if (d.type() != backend::DeviceType::Cpu) devs[size_t(il)] = &d;
  }
  // The MTP block's KV and hidden states where it runs (Model::mtp_device).
  if (m.mtp_device().type() != backend::DeviceType::Cpu) devs.back() = &m.mtp_device();
  return create(m.config(), opt, devs);
}

Result<MemoryLayout> Memory::layout(const ModelConfig& cfg, const MemoryOptions& opt) {
  if (opt.n_ctx <= 0 || opt.n_ctx > (int64_t(1) << 24)) return err("context size {} out of range", opt.n_ctx);
  if (opt.n_seq <= 0 || opt.n_seq > 4096) return err("sequence count {} out of range", opt.n_seq);
  if (opt.n_spec < 0 || opt.n_spec > 64) return err("--spec-draft-n-max {}: speculative keep slots out of range [0, 64]", opt.n_spec);
  for (auto [t, what] : {std::pair{opt.type_k, "-ctk/--cache-type-k"}, std::pair{opt.type_v, "-ctv/--cache-type-v"}}) {
    if (t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::Q8_0 && t != GgmlType::Q4_0)
      return err("{} {}: supported KV cache types are f32, f16, q8_0, q4_0", what, gguf::type_name(t));
    if (cfg.head_dim % gguf::type_info(t).block_size != 0)
      return err("{} {}: head size {} is not a multiple of the block size {}", what, gguf::type_name(t), cfg.head_dim,
                 gguf::type_info(t).block_size);
  }
  if (opt.mtp && (cfg.n_nextn < 1 || cfg.n_recurrent_layers() == 0))
    return err("--spec-type draft-mtp: the model has no MTP block ('{}.nextn_predict_layers' is 0 or missing, or "
               "the architecture is not qwen35/qwen35moe)", cfg.arch_str);
  MemoryLayout l;
  l.k_row = tensor::row_size(opt.type_k, cfg.head_dim);
  l.v_row = tensor::row_size(opt.type_v, cfg.head_dim);
  const int64_t dc = std::max<int64_t>(0, cfg.ssm_d_conv - 1), C = cfg.ssm_conv_dim(), S = cfg.ssm_d_state,
                Hv = cfg.ssm_dt_rank, Hkv = cfg.n_head_kv;
  l.conv_floats = size_t(dc * C);
  l.ssm_floats = size_t(S * S * Hv);
  size_t kv_layer = 0;
  if (!checked_mul((l.k_row + l.v_row) * size_t(Hkv), size_t(opt.n_ctx) * size_t(opt.n_seq), &kv_layer))
    return err("KV cache size overflows (context {}, {} sequences)", opt.n_ctx, opt.n_seq);
  auto at = [](size_t off) { return (off + 255) / 256 * 256; };
  // As create() lays a layer out: a, then b at the next 256-byte boundary.
  const size_t k_bytes = l.k_row * size_t(Hkv) * size_t(opt.n_ctx) * size_t(opt.n_seq);
  const size_t v_bytes = l.v_row * size_t(Hkv) * size_t(opt.n_ctx) * size_t(opt.n_seq);
  l.attn_layer_bytes = at(k_bytes) + v_bytes;
  const bool rec = cfg.n_recurrent_layers() > 0;
  const size_t rec_slots = size_t(opt.n_seq) * size_t(1 + (rec ? opt.n_spec : 0)) + size_t(rec ? opt.n_rec_cache : 0);
  l.rec_layer_bytes = at(l.conv_floats * rec_slots * sizeof(float)) + l.ssm_floats * rec_slots * sizeof(float);
  for (int64_t il = 0; il < cfg.n_layer; ++il) ++(cfg.is_recurrent(il) ? l.n_rec : l.n_attn);
  if (opt.mtp) {
    ++l.n_attn;
    l.mtp_h_bytes = size_t(cfg.n_embd) * (rec_slots + 1 + size_t(opt.n_seq) * kMtpRing) * sizeof(float);
  }
  l.kv_bytes_per_pos = size_t(l.n_attn) * (l.k_row + l.v_row) * size_t(Hkv);
  return l;
}

// devs[il]: the device of layer il's state; nullptr: the host.
Result<std::unique_ptr<Memory>> Memory::create(const ModelConfig& cfg, const MemoryOptions& opt,
                                               const std::vector<backend::Device*>& devs) {
  auto lay = layout(cfg, opt);
  KILN_TRY(lay);
  static std::atomic<uint64_t> next_id{1};
  auto m = std::unique_ptr<Memory>(new Memory());
  m->id_ = next_id.fetch_add(1);
  m->opt_ = opt;
  m->n_head_kv_ = cfg.n_head_kv;
  m->k_row_ = lay->k_row;
  m->v_row_ = lay->v_row;
  const int64_t dc = std::max<int64_t>(0, cfg.ssm_d_conv - 1), C = cfg.ssm_conv_dim(), S = cfg.ssm_d_state,
                Hv = cfg.ssm_dt_rank, D = cfg.head_dim, Hkv = cfg.n_head_kv, N = opt.n_seq;
  const int64_t per_seq = 1 + (cfg.n_recurrent_layers() > 0 ? opt.n_spec : 0);
  const int64_t NR = N * per_seq + (cfg.n_recurrent_layers() > 0 ? opt.n_rec_cache : 0);  // spare slots last
  m->conv_floats_ = lay->conv_floats;
  m->ssm_floats_ = lay->ssm_floats;
  m->rec_floats_ = lay->state_floats(opt.mtp, cfg.n_embd);
  m->n_embd_ = cfg.n_embd;
  const int64_t n_layers = cfg.n_layer + (opt.mtp ? 1 : 0);
  m->layers_.resize(size_t(n_layers));
  auto stream_of = [&](backend::Device* d) {
    for (auto& [dev, st] : m->streams_)
      if (dev == d) return st.get();
    m->streams_.emplace_back(d, d->create_stream());
    return m->streams_.back().second.get();
  };
  auto at = [](size_t off) { return (off + 255) / 256 * 256; };
  for (int64_t il = 0; il < n_layers; ++il) {
    Layer& L = m->layers_[size_t(il)];
    L.dev = devs[size_t(il)];
    if (!L.dev) {
      if (!m->host_) m->host_ = backend::make_cpu_device(1);
      L.dev = m->host_.get();
    }
    L.st = stream_of(L.dev);
    Tensor a, b;
    if (cfg.is_recurrent(il)) {
      m->rec_layers_.push_back(il);
      a = Tensor::make(nullptr, 0, GgmlType::F32, {dc, C, 1, NR});
      b = Tensor::make(nullptr, 0, GgmlType::F32, {S, S, Hv, NR});
    } else {
      m->attn_layers_.push_back(il);
      a = Tensor::make(nullptr, 0, opt.type_k, {D, Hkv, opt.n_ctx, N});
      b = Tensor::make(nullptr, 0, opt.type_v, {D, Hkv, opt.n_ctx, N});
    }
    const size_t b_off = at(a.n_bytes());
    KILN_CHECK(b_off + b.n_bytes() == (cfg.is_recurrent(il) ? lay->rec_layer_bytes : lay->attn_layer_bytes),
               "Memory::layout disagrees with create() for layer {}", il);
    L.buf = L.dev->alloc(b_off + b.n_bytes());
    L.a = Tensor::make(L.buf.get(), 0, a.type, a.ne);
    L.b = Tensor::make(L.buf.get(), b_off, b.type, b.ne);
    m->total_bytes_ += a.n_bytes() + b.n_bytes();
    L.st->fill_zero(L.a);
    L.st->fill_zero(L.b);
  }
  if (opt.mtp) {
    const Layer& L = m->layers_[size_t(cfg.n_layer)];
    m->mtp_buf_ = L.dev->alloc(lay->mtp_h_bytes);
    m->mtp_h_ = Tensor::make(m->mtp_buf_.get(), 0, GgmlType::F32, {cfg.n_embd, NR + 1 + N * kMtpRing, 1, 1});
    m->mtp_scratch_ = int(NR);
    m->total_bytes_ += lay->mtp_h_bytes;
    L.st->fill_zero(m->mtp_h_);
  }
  for (int64_t il : m->rec_layers_)
    if (m->layers_[size_t(il)].dev->type() != backend::DeviceType::Cpu) {
      m->rec_stage_dev_ = m->layers_[size_t(il)].dev;  // rec_stage() allocates from it on first use
      break;
    }
  m->sync();
  m->pos_.assign(size_t(opt.n_seq), 0);
  m->mtp_done_.assign(size_t(opt.n_seq), 0);
  m->rec_phys_.resize(size_t(N));
  for (int64_t s = 0; s < N; ++s)
    for (int64_t i = 0; i < per_seq; ++i) m->rec_phys_[size_t(s)].push_back(int(s * per_seq + i));
  return m;
}

size_t Memory::allocated_bytes(const backend::Device* dev) const {
  size_t n = 0;
  for (const Layer& L : layers_)
    if (L.buf && (dev ? L.dev == dev : L.dev == host_.get())) n += L.buf->size();
  if (mtp_buf_) {
    const Layer& L = layers_.back();
    if (dev ? L.dev == dev : L.dev == host_.get()) n += mtp_buf_->size();
  }
  return n;
}

void Memory::sync() const {
  for (auto& [dev, st] : streams_) st->synchronize();
}

int64_t Memory::seq_pos(int seq) const {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  return pos_[size_t(seq)];
}

const Tensor& Memory::k_cache(int64_t il) const { return layers_[size_t(il)].a; }
const Tensor& Memory::v_cache(int64_t il) const { return layers_[size_t(il)].b; }
const Tensor& Memory::conv_state(int64_t il) const { return layers_[size_t(il)].a; }
const Tensor& Memory::ssm_state(int64_t il) const { return layers_[size_t(il)].b; }
backend::Device& Memory::layer_device(int64_t il) const { return *layers_[size_t(il)].dev; }

Tensor Memory::kv_rows(const Tensor& cache, int seq, int64_t p0, int64_t n) {
  return Tensor::make(cache.buf, cache.offset + size_t(seq) * cache.nb[3] + size_t(p0) * cache.nb[2], cache.type,
                      {cache.ne[0], cache.ne[1], n, 1});
}
Tensor Memory::mtp_ring(int seq) const {
  return Tensor::make(mtp_h_.buf, mtp_h_.offset + size_t(mtp_ring_col(seq, 0)) * mtp_h_.nb[1], GgmlType::F32,
                      {mtp_h_.ne[0], kMtpRing, 1, 1});
}
void Memory::set_seq_pos(int seq, int64_t n) {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  pos_[size_t(seq)] = n;
  mtp_done_[size_t(seq)] = n;
  if (opt_.mtp && n > 0) {  // a later flush pairs position n with the hidden state of n - 1
    layers_.back().st->copy(mtp_col(mtp_ring_col(seq, n - 1)), mtp_col(rec_slot(seq)));
    sync();
  }
}
Tensor Memory::mtp_col(int slot) const {
  return Tensor::make(mtp_h_.buf, mtp_h_.offset + size_t(slot) * mtp_h_.nb[1], GgmlType::F32, {mtp_h_.ne[0], 1, 1, 1});
}
Tensor Memory::slot(const Tensor& state, int seq) {
  return Tensor::make(state.buf, state.offset + size_t(seq) * state.nb[3], state.type,
                      {state.ne[0], state.ne[1], state.ne[2], 1});
}

int Memory::rec_slot(int seq) const {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  return rec_phys_[size_t(seq)][0];
}

int Memory::rec_keep_slot(int seq, int i) const {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  const auto& ph = rec_phys_[size_t(seq)];
  KILN_CHECK(i >= 0 && size_t(i) + 1 < ph.size(), "keep slot {} of sequence {}: the memory has {} (n_spec)", i, seq,
             ph.size() - 1);
  return ph[size_t(i) + 1];
}

Status Memory::seq_accept(int seq, int64_t n_pos, int kept) {
  const int64_t cur = seq_pos(seq);
  if (n_pos < 1 || n_pos > cur) return err("seq_accept: position {} outside [1, {}]", n_pos, cur);
  if (kept >= 0 && has_recurrent()) {
    auto& ph = rec_phys_[size_t(seq)];
    if (size_t(kept) + 1 >= ph.size())
      return err("seq_accept: keep slot {} but the memory has {} per sequence (n_spec)", kept, ph.size() - 1);
    std::swap(ph[0], ph[size_t(kept) + 1]);
  }
  pos_[size_t(seq)] = n_pos;
  mtp_done_[size_t(seq)] = std::min(mtp_done_[size_t(seq)], n_pos);
  return {};
}

void Memory::seq_clear(int seq) {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  pos_[size_t(seq)] = 0;
  mtp_done_[size_t(seq)] = 0;
  for (int64_t il : rec_layers_) {
    const Layer& L = layers_[size_t(il)];
    L.st->fill_zero(slot(L.a, rec_slot(seq)));
    L.st->fill_zero(slot(L.b, rec_slot(seq)));
  }
  if (opt_.mtp) layers_.back().st->fill_zero(mtp_col(rec_slot(seq)));
  sync();
}

Status Memory::seq_keep(int seq, int64_t n_pos) {
  const int64_t cur = seq_pos(seq);
  if (n_pos < 0 || n_pos > cur) return err("seq_keep: position {} outside [0, {}]", n_pos, cur);
  if (n_pos == 0) {
    seq_clear(seq);
    return {};
  }
  if (n_pos != cur && has_recurrent())
    return err("seq_keep: a recurrent state cannot be rolled back from {} to {} positions (restore a snapshot)", cur,
               n_pos);
  pos_[size_t(seq)] = n_pos;
  mtp_done_[size_t(seq)] = std::min(mtp_done_[size_t(seq)], n_pos);
  return {};
}

void Memory::seq_copy(int src, int dst) {
  if (src == dst) return;
  const int64_t n = seq_pos(src);
  (void)seq_pos(dst);
  for (int64_t il : attn_layers_) {
    const Layer& L = layers_[size_t(il)];
    if (n == 0) break;
    L.st->copy(kv_rows(L.a, dst, 0, n), kv_rows(L.a, src, 0, n));
    L.st->copy(kv_rows(L.b, dst, 0, n), kv_rows(L.b, src, 0, n));
  }
  for (int64_t il : rec_layers_) {
    const Layer& L = layers_[size_t(il)];
    L.st->copy(slot(L.a, rec_slot(dst)), slot(L.a, rec_slot(src)));
    L.st->copy(slot(L.b, rec_slot(dst)), slot(L.b, rec_slot(src)));
  }
  if (opt_.mtp) {
    backend::Stream& st = *layers_.back().st;
    st.copy(mtp_col(rec_slot(dst)), mtp_col(rec_slot(src)));
    st.copy(mtp_ring(dst), mtp_ring(src));  // the rows src has not caught up yet are dst's to catch up
  }
  sync();
  pos_[size_t(dst)] = n;
  mtp_done_[size_t(dst)] = mtp_done_[size_t(src)];
}

void Memory::read_kv(int seq, int64_t pos0, int64_t n, uint8_t* out) const {
  (void)seq_pos(seq);
  KILN_CHECK(pos0 >= 0 && n >= 0 && pos0 + n <= opt_.n_ctx, "read_kv positions [{}, +{})", pos0, n);
  const size_t kb = size_t(n) * k_pos_stride(), vb = size_t(n) * v_pos_stride();
  if (n > 0)
    for (int64_t il : attn_layers_) {
      const Layer& L = layers_[size_t(il)];
      L.st->download(out, kv_rows(L.a, seq, pos0, n), kb);
      L.st->download(out + kb, kv_rows(L.b, seq, pos0, n), vb);
      out += kb + vb;
    }
  sync();
}

void Memory::write_kv(int seq, int64_t pos0, const uint8_t* in, int64_t rows, int64_t r0, int64_t r1) {
  (void)seq_pos(seq);
  KILN_CHECK(0 <= r0 && r0 <= r1 && r1 <= rows && pos0 >= 0 && pos0 + r1 <= opt_.n_ctx, "write_kv rows [{}, {}) of {}",
             r0, r1, rows);
  const size_t ks = k_pos_stride(), vs = v_pos_stride();
  if (r1 > r0)
    for (int64_t il : attn_layers_) {
      const Layer& L = layers_[size_t(il)];
      L.st->upload(kv_rows(L.a, seq, pos0 + r0, r1 - r0), in + size_t(r0) * ks, size_t(r1 - r0) * ks);
      in += size_t(rows) * ks;
      L.st->upload(kv_rows(L.b, seq, pos0 + r0, r1 - r0), in + size_t(r0) * vs, size_t(r1 - r0) * vs);
      in += size_t(rows) * vs;
    }
  sync();
}

void Memory::read_rec(int seq, float* out) const {
  (void)seq_pos(seq);
  read_rec_phys(rec_slot(seq), out);
}

// A state's copies to and from the host (the prefix cache's RAM tier, slot saves) go through one page-locked
// buffer where recurrent layers live on a GPU: pageable copies of a 9B's 53 MB state ran at ~2 GB/s through
// the driver's staging, and a busy server stores a state at every prompt end and finish. Allocated on the
// first copy (a server without the prefix cache may never make one); nullptr with every layer on the CPU.
float* Memory::rec_stage() const {
  if (!rec_stage_dev_) return nullptr;
  if (!rec_stage_) rec_stage_ = rec_stage_dev_->alloc_host(rec_floats() * sizeof(float));
  return static_cast<float*>(rec_stage_->host_ptr());
}

void Memory::read_rec_phys(int phys, float* out) const {
  float* const dst = out;
  float* const stage = rec_stage();
  if (stage) out = stage;
  for (int64_t il : rec_layers_) {
    const Layer& L = layers_[size_t(il)];
    L.st->download(out, slot(L.a, phys), conv_floats_ * sizeof(float));
    L.st->download(out + conv_floats_, slot(L.b, phys), ssm_floats_ * sizeof(float));
    out += conv_floats_ + ssm_floats_;
  }
  if (opt_.mtp) layers_.back().st->download(out, mtp_col(phys), size_t(n_embd_) * sizeof(float));
  sync();
  if (stage) copy_wide(dst, stage, rec_floats() * sizeof(float));
}

int Memory::cache_slot(int i) const {
  KILN_CHECK(i >= 0 && i < n_rec_cache(), "spare recurrent state slot {} of {}", i, n_rec_cache());
  return int(size_t(opt_.n_seq) * rec_phys_[0].size()) + i;
}

void Memory::copy_rec(int dst, int src) {
  for (int64_t il : rec_layers_) {
    const Layer& L = layers_[size_t(il)];
    L.st->copy(slot(L.a, dst), slot(L.a, src));
    L.st->copy(slot(L.b, dst), slot(L.b, src));
  }
  if (opt_.mtp) layers_.back().st->copy(mtp_col(dst), mtp_col(src));
  sync();
}

void Memory::rec_save(int seq, int i) { copy_rec(cache_slot(i), rec_slot(seq)); }
void Memory::rec_load(int i, int seq) { copy_rec(rec_slot(seq), cache_slot(i)); }
void Memory::read_rec_cache(int i, float* out) const { read_rec_phys(cache_slot(i), out); }

void Memory::write_rec(int seq, const float* in) {
  (void)seq_pos(seq);
  if (float* stage = rec_stage()) {
    copy_wide(stage, in, rec_floats() * sizeof(float));
    in = stage;
  }
  for (int64_t il : rec_layers_) {
    const Layer& L = layers_[size_t(il)];
    L.st->upload(slot(L.a, rec_slot(seq)), in, conv_floats_ * sizeof(float));
    L.st->upload(slot(L.b, rec_slot(seq)), in + conv_floats_, ssm_floats_ * sizeof(float));
    in += conv_floats_ + ssm_floats_;
  }
  if (opt_.mtp) layers_.back().st->upload(mtp_col(rec_slot(seq)), in, size_t(n_embd_) * sizeof(float));
  sync();
}

Snapshot Memory::snapshot(int seq) const {
  KILN_CHECK(!opt_.mtp || mtp_done(seq) == seq_pos(seq), "snapshot of sequence {}: MTP rows [{}, {}) not caught up "
             "(Context::mtp_flush first)", seq, mtp_done(seq), seq_pos(seq));
  Snapshot s;
  s.n_pos = seq_pos(seq);
  s.kv.resize(size_t(s.n_pos) * kv_bytes_per_pos());
  read_kv(seq, 0, s.n_pos, s.kv.data());
  s.rec.resize(rec_floats());
  read_rec(seq, s.rec.data());
  return s;
}

Status Memory::restore(int seq, const Snapshot& s) {
  (void)seq_pos(seq);
  if (s.n_pos < 0 || s.n_pos > opt_.n_ctx || s.kv.size() != size_t(s.n_pos) * kv_bytes_per_pos() ||
      s.rec.size() != rec_floats())
    return err("restore: snapshot of {} positions does not match this memory's layout", s.n_pos);
  write_kv(seq, 0, s.kv.data(), s.n_pos, 0, s.n_pos);
  write_rec(seq, s.rec.data());
  set_seq_pos(seq, s.n_pos);
  return {};
}

}  // namespace kiln::model
