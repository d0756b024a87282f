#include "engine/runner.h"

#include <algorithm>
#include <cstring>

namespace kiln::engine {

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const model::Model& m, const ModelRunnerOptions& opt) {
  auto r = std::unique_ptr<ModelRunner>(new ModelRunner());
  r->model_ = &m;
  const auto& c = m.config();
  model::MemoryOptions mo;
  mo.n_ctx = opt.n_ctx_slot;
  mo.n_seq = opt.n_slots;
  mo.type_k = opt.type_k;
  mo.type_v = opt.type_v;
  auto mem = model::Memory::create(c, mo);
  KILN_TRY(mem);
  r->mem_ = std::move(*mem);
  if (opt.n_batch <= 0) return err("batch size {} must be positive", opt.n_batch);
  model::ContextOptions co;
  co.n_batch = opt.n_batch;
  co.n_threads = opt.n_threads;
  co.delta_chunk_min = opt.delta_chunk_min;
  co.flash_attn = opt.flash_attn;
  r->ctx_ = std::make_unique<model::Context>(m, co);
  return r;
}

size_t ModelRunner::kv_bytes_per_pos() const {
  return mem_->attn_layers().size() * (mem_->k_pos_stride() + mem_->v_pos_stride());
}

// Payload of n rows: for each attention layer, K rows [n, k_pos_stride] then V rows [n, v_pos_stride].
void ModelRunner::read_kv(int slot, int64_t pos0, int64_t n, uint8_t* out) const {
  const size_t ks = mem_->k_pos_stride(), vs = mem_->v_pos_stride();
  for (int64_t il : mem_->attn_layers()) {
    std::memcpy(out, mem_->k_data(il, slot) + size_t(pos0) * ks, size_t(n) * ks);
    out += size_t(n) * ks;
    std::memcpy(out, mem_->v_data(il, slot) + size_t(pos0) * vs, size_t(n) * vs);
    out += size_t(n) * vs;
  }
}

void ModelRunner::write_kv(int slot, int64_t pos0, const uint8_t* in, int64_t rows, int64_t r0, int64_t r1) {
  KILN_CHECK(0 <= r0 && r0 <= r1 && r1 <= rows && pos0 + r1 <= mem_->n_ctx(), "write_kv rows [{}, {}) of {}", r0, r1,
             rows);
  const size_t ks = mem_->k_pos_stride(), vs = mem_->v_pos_stride();
  for (int64_t il : mem_->attn_layers()) {
    std::memcpy(mem_->k_data(il, slot) + size_t(pos0 + r0) * ks, in + size_t(r0) * ks, size_t(r1 - r0) * ks);
    in += size_t(rows) * ks;
    std::memcpy(mem_->v_data(il, slot) + size_t(pos0 + r0) * vs, in + size_t(r0) * vs, size_t(r1 - r0) * vs);
    in += size_t(rows) * vs;
  }
}

void ModelRunner::read_rec(int slot, float* out) const { std::copy_n(mem_->rec_data(slot), rec_floats(), out); }

void ModelRunner::write_rec(int slot, const float* in) { std::copy_n(in, rec_floats(), mem_->rec_data(slot)); }

}  // namespace kiln::engine
