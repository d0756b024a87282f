#include "engine/runner.h"

#include <algorithm>
#include <cstdlib>

namespace kiln::engine {

int runner_top_logits(bool embeddings) {
  if (embeddings) return 0;
  const char* e = std::getenv("KILN_TOP_LOGITS");
  return e && *e ? std::clamp(std::atoi(e), 0, 128) : 64;
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const model::Model& m, const ModelRunnerOptions& opt) {
  auto r = std::unique_ptr<ModelRunner>(new ModelRunner());
  r->model_ = &m;
  model::MemoryOptions mo;
  mo.n_ctx = opt.n_ctx_slot;
  mo.n_seq = opt.n_slots;
  mo.type_k = opt.type_k;
  mo.type_v = opt.type_v;
  mo.n_spec = opt.n_spec;
  mo.mtp = opt.mtp;
  mo.n_rec_cache = opt.n_state_slots;
  auto mem = model::Memory::create(m, mo);
  KILN_TRY(mem);
  r->mem_ = std::move(*mem);
  if (opt.n_batch <= 0) return err("batch size {} must be positive", opt.n_batch);
  model::ContextOptions co;
  co.n_batch = opt.n_batch;
  co.n_threads = opt.n_threads;
  co.delta_chunk_min = opt.delta_chunk_min;
  co.flash_attn = opt.flash_attn;
  co.batch_invariant = opt.batch_invariant;
  co.embeddings = opt.embeddings;
  co.mtp = opt.mtp;
  co.mtp_draft_vocab = opt.mtp_draft_vocab;
  co.n_top = opt.n_top;
  co.n_outputs_max = runner_outputs_max(opt.n_slots, opt.embeddings, opt.n_spec);
  r->ctx_ = std::make_unique<model::Context>(m, co);
  return r;
}

size_t ModelRunner::kv_bytes_per_pos() const { return mem_->kv_bytes_per_pos(); }

// Payload of n rows: for each attention layer, K rows [n, k_pos_stride] then V rows [n, v_pos_stride]
// (model::Memory moves them through the layer's device stream).
void ModelRunner::read_kv(int slot, int64_t pos0, int64_t n, uint8_t* out) const { mem_->read_kv(slot, pos0, n, out); }

void ModelRunner::write_kv(int slot, int64_t pos0, const uint8_t* in, int64_t rows, int64_t r0, int64_t r1) {
  mem_->write_kv(slot, pos0, in, rows, r0, r1);
}

void ModelRunner::read_rec(int slot, float* out) const { mem_->read_rec(slot, out); }

void ModelRunner::write_rec(int slot, const float* in) { mem_->write_rec(slot, in); }

}  // namespace kiln::engine
