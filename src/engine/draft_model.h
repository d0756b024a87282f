// engine/draft_model.h — the draft model of --spec-type draft-simple (-md FILE): a second, smaller
//   model of the target's vocabulary with its own Memory (one sequence per target slot) and Context,
//   drafting greedily for every generating slot in one batched pass per draft position.
// Each slot's draft memory mirrors the target's committed tokens (the slot's history + the token just
//   sampled): a draft pass first feeds what the draft memory lacks (the prompt once, then each step's
//   accepted tokens), keeping the recurrent state after the committed tokens (hybrid draft models:
//   Batch::keep, MemoryOptions::n_spec), then feeds its own drafts one position at a time and rolls
//   back to the committed tokens at the end (Memory::seq_accept, or seq_keep for attention-only
//   models). A slot whose history no longer extends what its draft memory holds (a new request) is
//   truncated to the common prefix (attention-only) or cleared (hybrid).
// Owns: the draft Model, its Context and Memory, per-slot mirrors of the tokens the memory holds.
// Must not: sample with a request's sampler or touch the target's memory.
// Threading: the engine thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/context.h"
#include "model/memory.h"
#include "model/model.h"

namespace kiln::engine {

struct DraftModelOptions {
  int n_slots = 1;
  int64_t n_ctx_slot = 4096;
  int64_t n_batch = 512;     // the draft Context's step (at least n_slots * (n_max + 2))
  int n_max = 3;             // most draft tokens per pass (--spec-draft-n-max)
  int n_threads = 0;
  model::GgmlType type_k = model::GgmlType::F16, type_v = model::GgmlType::F16;  // -ctkd / -ctvd
};

class DraftModel {
 public:
  // `m` (the draft model) must outlive this. Errors name the option.
  static Result<std::unique_ptr<DraftModel>> create(const model::Model& m, const DraftModelOptions& o);

  struct Row {
    int slot = 0;
    std::span<const int32_t> history;  // the target slot's committed tokens (its memory's)
    int32_t next = 0;                  // the token sampled after them (fed next)
    int n_max = 0;
  };
  // Greedy drafts (argmax of the draft model, a row stopping at a token of probability < p_min or
  // outside [0, n_vocab_target)); out[i] for rows[i].
  Status draft(std::span<const Row> rows, float p_min, int64_t n_vocab_target, std::vector<std::vector<int32_t>>& out);

  const model::Model& model() const { return m_; }

 private:
  DraftModel(const model::Model& m) : m_(m) {}
  Status decode(const model::Batch& b);
  const model::Model& m_;
  DraftModelOptions o_;
  std::unique_ptr<model::Context> cx_;
  std::unique_ptr<model::Memory> mem_;
  std::vector<std::vector<int32_t>> held_;  // per slot: the tokens its draft memory holds
  model::Batch batch_;
};

}  // namespace kiln::engine
