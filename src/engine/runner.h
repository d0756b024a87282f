// engine/runner.h — what the engine needs from a model: decode a Batch into per-slot memory, read
//   logits, and move KV rows / recurrent state of a slot in and out (for the prefix cache).
//   ModelRunner implements it over model::Model + Context + Memory; tests implement fakes.
// Owns (ModelRunner): the Context (scratch, thread pool) and the Memory (n_parallel slots).
// Must not: schedule, sample or know about requests.
// Threading: used by the engine thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "model/context.h"
#include "model/memory.h"
#include "model/model.h"

namespace kiln::engine {

class Runner {
 public:
  virtual ~Runner() = default;
  virtual int64_t n_vocab() const = 0;
  virtual int64_t n_ctx() const = 0;     // positions per slot
  virtual int n_slots() const = 0;
  virtual int64_t n_batch() const = 0;   // most tokens one decode() takes
  virtual bool has_recurrent() const = 0;

  // Runs one batch (model::Batch rules: runs of one sequence per slot, continuing seq_pos).
  virtual Status decode(const model::Batch& b) = 0;
  virtual const float* logits(int64_t i) const = 0;  // output row i of the last decode
  // Output row i's largest logits, descending (ties: lower id first), where the runner selects them
  // (ModelRunnerOptions::n_top); false when it does not (the engine then reads logits(i)).
  virtual bool top_logits(int64_t i, model::Context::TopLogits& out) const { return false; }
  // The normed hidden state (n_embd floats) of output row i, where the runner keeps them
  // (ModelRunnerOptions::embeddings); nullptr otherwise.
  virtual const float* embedding(int64_t i) const { return nullptr; }

  virtual int64_t seq_pos(int slot) const = 0;
  virtual void seq_clear(int slot) = 0;
  // Attention-only: drop positions >= n (n <= seq_pos).
  virtual Status seq_keep(int slot, int64_t n) = 0;
  virtual void set_seq_pos(int slot, int64_t n) = 0;
  // After a speculative verify run: keep positions [0, n) and the recurrent state kept after the
  // run's token `kept` (-1: the run's final state); model::Memory::seq_accept.
  virtual Status seq_accept(int slot, int64_t n, int kept) { return err("speculative decoding: unsupported runner"); }
  // The model's MTP drafter (--spec-type draft-mtp; model::Context::mtp_draft): whether the runner
  // runs it, and greedy drafts for rows (slot, the token sampled after its memory, most tokens).
  virtual bool has_mtp() const { return false; }
  virtual Status draft_mtp(std::span<const model::Context::MtpRow> rows, float p_min,
                           std::vector<std::vector<int32_t>>& out) {
    return err("--spec-type draft-mtp: the runner has no MTP drafter");
  }
  // The MTP rows deferred decodes (model::Batch::mtp_defer) left a slot (0: none; at most
  // model::Memory::kMtpRing - 1), and their catch-up for slots whose tokens (at least seq_pos) are given
  // (model::Context::mtp_flush).
  virtual int64_t mtp_pending(int slot) const { return 0; }
  virtual Status mtp_flush(std::span<const int32_t> slots, std::span<const std::span<const int32_t>> tokens) {
    return err("--spec-type draft-mtp: the runner has no MTP drafter");
  }

  // KV payload of n positions: kv_bytes_per_pos() * n bytes, layout private to the runner
  // (for ModelRunner: per attention layer, K rows then V rows). 0 when there are no attention layers.
  virtual size_t kv_bytes_per_pos() const = 0;
  virtual void read_kv(int slot, int64_t pos0, int64_t n, uint8_t* out) const = 0;
  // Writes rows [r0, r1) of a payload of `rows` positions that starts at position pos0.
  virtual void write_kv(int slot, int64_t pos0, const uint8_t* payload, int64_t rows, int64_t r0, int64_t r1) = 0;
  // Recurrent state of a slot (all recurrent layers): rec_floats() floats; 0 without recurrent layers.
  virtual size_t rec_floats() const = 0;
  virtual void read_rec(int slot, float* out) const = 0;
  virtual void write_rec(int slot, const float* in) = 0;
  // Spare recurrent state slots where the layers run (the prefix cache's first tier; 0: none):
  // slot's state into spare i, spare i into slot (positions unchanged), spare i to the host.
  virtual int n_state_slots() const { return 0; }
  virtual void save_rec(int slot, int i) {}
  virtual void load_rec(int i, int slot) {}
  virtual void read_state_slot(int i, float* out) const {}
};

// Logits rows a ModelRunner's Context keeps: a step gives each slot at most one (its decode token or
// its prompt's last token), so n_slots (a 248k vocabulary x 512 rows would be 485 MiB), and 1 + n_spec
// each with speculative decoding (a verify run's rows); embedding requests take every prompt token
// as an output row, so with embeddings 0 (= n_batch).
inline int64_t runner_outputs_max(int n_slots, bool embeddings, int n_spec = 0) {
  return embeddings ? 0 : int64_t(n_slots) * (1 + n_spec);
}

// Top logits a ModelRunner selects per output row (model::ContextOptions::n_top) so that requests
// whose sampling needs no more take only those (the GPU downloads k values per row, not 248k):
// 64 (llama-server's top_k default is 40), 0 with embeddings (every prompt token is a row); the
// environment's KILN_TOP_LOGITS overrides it (0: off, for comparisons).
int runner_top_logits(bool embeddings);

struct ModelRunnerOptions {
  int64_t n_ctx_slot = 4096;
  int n_slots = 1;
  int64_t n_batch = 512;
  int n_threads = 0;
  model::GgmlType type_k = model::GgmlType::F16;
  model::GgmlType type_v = model::GgmlType::F16;
  int delta_chunk_min = 0;  // model::ContextOptions::delta_chunk_min
  bool flash_attn = true;   // model::ContextOptions::flash_attn
  bool batch_invariant = false;  // model::ContextOptions::batch_invariant
  bool embeddings = false;  // model::ContextOptions::embeddings
  int n_spec = 0;           // speculative decoding: draft tokens per verify run (model::MemoryOptions::n_spec)
  bool mtp = false;         // --spec-type draft-mtp: run the MTP block (Memory/ContextOptions::mtp)
  int64_t mtp_draft_vocab = 0;  // --spec-draft-vocab (model::ContextOptions::mtp_draft_vocab)
  int n_top = 0;            // model::ContextOptions::n_top (runner_top_logits)
  int n_state_slots = 0;    // model::MemoryOptions::n_rec_cache (recurrent models; Runner::n_state_slots)
};

class ModelRunner final : public Runner {
 public:
  // The model must outlive the runner. Errors (cache types, sizes) name the option.
  static Result<std::unique_ptr<ModelRunner>> create(const model::Model& m, const ModelRunnerOptions& opt);

  int64_t n_vocab() const override { return model_->config().n_vocab; }
  int64_t n_ctx() const override { return mem_->n_ctx(); }
  int n_slots() const override { return mem_->n_seq(); }
  int64_t n_batch() const override { return ctx_->n_batch(); }
  bool has_recurrent() const override { return mem_->has_recurrent(); }
  Status decode(const model::Batch& b) override { return ctx_->decode(b, *mem_); }
  const float* logits(int64_t i) const override { return ctx_->logits(i); }
  bool top_logits(int64_t i, model::Context::TopLogits& out) const override { return ctx_->top_logits(i, out); }
  const float* embedding(int64_t i) const override { return ctx_->has_embeddings() ? ctx_->embedding(i) : nullptr; }
  int64_t seq_pos(int slot) const override { return mem_->seq_pos(slot); }
  void seq_clear(int slot) override { mem_->seq_clear(slot); }
  Status seq_keep(int slot, int64_t n) override { return mem_->seq_keep(slot, n); }
  void set_seq_pos(int slot, int64_t n) override { mem_->set_seq_pos(slot, n); }
  Status seq_accept(int slot, int64_t n, int kept) override { return mem_->seq_accept(slot, n, kept); }
  bool has_mtp() const override { return mem_->has_mtp(); }
  Status draft_mtp(std::span<const model::Context::MtpRow> rows, float p_min,
                   std::vector<std::vector<int32_t>>& out) override {
    return ctx_->mtp_draft(rows, p_min, *mem_, out);
  }
  int64_t mtp_pending(int slot) const override {
    return mem_->has_mtp() ? mem_->seq_pos(slot) - mem_->mtp_done(slot) : 0;
  }
  Status mtp_flush(std::span<const int32_t> slots, std::span<const std::span<const int32_t>> tokens) override {
    return ctx_->mtp_flush(slots, tokens, *mem_);
  }
  size_t kv_bytes_per_pos() const override;
  void read_kv(int slot, int64_t pos0, int64_t n, uint8_t* out) const override;
  void write_kv(int slot, int64_t pos0, const uint8_t* payload, int64_t rows, int64_t r0, int64_t r1) override;
  size_t rec_floats() const override { return mem_->rec_floats(); }
  void read_rec(int slot, float* out) const override;
  void write_rec(int slot, const float* in) override;
  int n_state_slots() const override { return mem_->n_rec_cache(); }
  void save_rec(int slot, int i) override { mem_->rec_save(slot, i); }
  void load_rec(int i, int slot) override { mem_->rec_load(i, slot); }
  void read_state_slot(int i, float* out) const override { mem_->read_rec_cache(i, out); }

  size_t memory_bytes() const { return mem_->total_bytes(); }

 private:
  ModelRunner() = default;
  const model::Model* model_ = nullptr;
  std::unique_ptr<model::Context> ctx_;
  std::unique_ptr<model::Memory> mem_;
};

}  // namespace kiln::engine
