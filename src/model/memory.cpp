#include "model/memory.h"

#include <algorithm>
#include <cstring>

#include "core/overflow.h"
#include "tensor/quant.h"

namespace kiln::model {

Result<std::unique_ptr<Memory>> Memory::create(const ModelConfig& cfg, const MemoryOptions& opt) {
  auto m = std::unique_ptr<Memory>(new Memory());
  m->opt_ = opt;
  if (opt.n_ctx <= 0 || opt.n_ctx > (int64_t(1) << 24)) return err("context size {} out of range", opt.n_ctx);
  if (opt.n_seq <= 0 || opt.n_seq > 4096) return err("sequence count {} out of range", opt.n_seq);
  for (auto [t, what] : {std::pair{opt.type_k, "-ctk/--cache-type-k"}, std::pair{opt.type_v, "-ctv/--cache-type-v"}}) {
    if (t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::Q8_0 && t != GgmlType::Q4_0)
      return err("{} {}: supported KV cache types are f32, f16, q8_0, q4_0", what, gguf::type_name(t));
    if (cfg.head_dim % gguf::type_info(t).block_size != 0)
      return err("{} {}: head size {} is not a multiple of the block size {}", what, gguf::type_name(t), cfg.head_dim,
                 gguf::type_info(t).block_size);
  }
  m->n_head_kv_ = cfg.n_head_kv;
  m->k_row_ = tensor::row_size(opt.type_k, cfg.head_dim);
  m->v_row_ = tensor::row_size(opt.type_v, cfg.head_dim);
  m->attn_index_.assign(size_t(cfg.n_layer), -1);
  m->rec_index_.assign(size_t(cfg.n_layer), -1);
  for (int64_t il = 0; il < cfg.n_layer; ++il) {
    if (cfg.is_recurrent(il)) {
      m->rec_index_[size_t(il)] = int64_t(m->rec_layers_.size());
      m->rec_layers_.push_back(il);
    } else {
      m->attn_index_[size_t(il)] = int64_t(m->attn_layers_.size());
      m->attn_layers_.push_back(il);
    }
  }
  m->kv_layer_seq_bytes_ = size_t(opt.n_ctx) * (m->k_pos_stride() + m->v_pos_stride());
  m->conv_floats_ = size_t(std::max<int64_t>(0, cfg.ssm_d_conv - 1) * cfg.ssm_conv_dim());
  m->ssm_floats_ = size_t(cfg.ssm_d_state * cfg.ssm_d_state * cfg.ssm_dt_rank);
  size_t kv_total = 0;
  if (!checked_mul(m->kv_layer_seq_bytes_, m->attn_layers_.size() * size_t(opt.n_seq), &kv_total))
    return err("KV cache size overflows (context {}, {} sequences)", opt.n_ctx, opt.n_seq);
  m->kv_.resize(kv_total);
  m->rec_.assign(m->rec_layers_.size() * size_t(opt.n_seq) * (m->conv_floats_ + m->ssm_floats_), 0.f);
  m->pos_.assign(size_t(opt.n_seq), 0);
  return m;
}

int64_t Memory::seq_pos(int seq) const {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  return pos_[size_t(seq)];
}

uint8_t* Memory::k_data(int64_t il, int seq) {
  const int64_t a = attn_index_[size_t(il)];
  KILN_CHECK(a >= 0 && seq >= 0 && seq < opt_.n_seq, "k_data({}, {})", il, seq);
  return kv_.data() + (size_t(seq) * attn_layers_.size() + size_t(a)) * kv_layer_seq_bytes_;
}
uint8_t* Memory::v_data(int64_t il, int seq) { return k_data(il, seq) + size_t(opt_.n_ctx) * k_pos_stride(); }

float* Memory::conv_state(int64_t il, int seq) {
  const int64_t r = rec_index_[size_t(il)];
  KILN_CHECK(r >= 0 && seq >= 0 && seq < opt_.n_seq, "conv_state({}, {})", il, seq);
  return rec_.data() + (size_t(seq) * rec_layers_.size() + size_t(r)) * (conv_floats_ + ssm_floats_);
}
float* Memory::ssm_state(int64_t il, int seq) { return conv_state(il, seq) + conv_floats_; }

float* Memory::rec_data(int seq) {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  return rec_.data() + size_t(seq) * rec_floats();
}

void Memory::seq_clear(int seq) {
  KILN_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence {} out of range", seq);
  pos_[size_t(seq)] = 0;
  std::fill_n(rec_data(seq), rec_floats(), 0.f);
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
  return {};
}

void Memory::seq_copy(int src, int dst) {
  if (src == dst) return;
  const int64_t n = seq_pos(src);
  (void)seq_pos(dst);
  for (int64_t il : attn_layers_) {
    std::memcpy(k_data(il, dst), k_data(il, src), size_t(n) * k_pos_stride());
    std::memcpy(v_data(il, dst), v_data(il, src), size_t(n) * v_pos_stride());
  }
  std::copy_n(rec_data(src), rec_floats(), rec_data(dst));
  pos_[size_t(dst)] = n;
}

Snapshot Memory::snapshot(int seq) const {
  Snapshot s;
  s.n_pos = seq_pos(seq);
  auto* self = const_cast<Memory*>(this);
  const size_t kb = size_t(s.n_pos) * k_pos_stride(), vb = size_t(s.n_pos) * v_pos_stride();
  s.kv.resize(attn_layers_.size() * (kb + vb));
  uint8_t* o = s.kv.data();
  for (int64_t il : attn_layers_) {
    std::memcpy(o, self->k_data(il, seq), kb);
    std::memcpy(o + kb, self->v_data(il, seq), vb);
    o += kb + vb;
  }
  s.rec.assign(self->rec_data(seq), self->rec_data(seq) + rec_floats());
  return s;
}

Status Memory::restore(int seq, const Snapshot& s) {
  (void)seq_pos(seq);
  const size_t kb = size_t(s.n_pos) * k_pos_stride(), vb = size_t(s.n_pos) * v_pos_stride();
  if (s.n_pos < 0 || s.n_pos > opt_.n_ctx || s.kv.size() != attn_layers_.size() * (kb + vb) ||
      s.rec.size() != rec_floats())
    return err("restore: snapshot of {} positions does not match this memory's layout", s.n_pos);
  const uint8_t* in = s.kv.data();
  for (int64_t il : attn_layers_) {
    std::memcpy(k_data(il, seq), in, kb);
    std::memcpy(v_data(il, seq), in + kb, vb);
    in += kb + vb;
  }
  std::copy(s.rec.begin(), s.rec.end(), rec_data(seq));
  pos_[size_t(seq)] = s.n_pos;
  return {};
}

}  // namespace kiln::model
