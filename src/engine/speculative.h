// engine/speculative.h — speculative decoding's options and the engine-independent pieces: the
//   spec types as llama-server names them (--spec-type), the synthetic acceptance curve
//   (--spec-synth-len / --spec-synth-rates, llama.cpp's definitions), the n-gram drafter
//   (ngram-simple) and the per-request adaptive draft length.
// Owns: SpecOptions, parsing of the type names, synth_probs(), ngram_draft(), SpecState.
// Must not: decode, sample or touch slots (the engine's scheduler, engine_spec.cpp, does).
// Threading: plain values and pure functions; a SpecState belongs to one request (engine thread).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace kiln::engine {

// --spec-type: none; ngram-simple (the last n-gram of the history found earlier in it: the tokens
// that followed are the draft); draft-mtp (the model's own MTP block, blk.<n_layer>.nextn.*);
// draft-simple (a separate draft model, -md).
enum class SpecType { None, NgramSimple, DraftMtp, DraftSimple };
std::optional<SpecType> spec_type_from_name(std::string_view name);
const char* spec_type_name(SpecType t);

struct SpecOptions {
  SpecType type = SpecType::None;
  int n_max = 3;         // --spec-draft-n-max: most draft tokens per step (llama-server's default 3)
  int n_min = 0;         // --spec-draft-n-min: shorter drafts are not verified
  float p_min = 0.75f;   // --spec-draft-p-min: a model drafter stops at a token of lower probability
  int ngram_n = 3;       // ngram-simple: the n-gram length matched (--spec-ngram-size-n)
  // --spec-draft-vocab N (kiln's own): draft-mtp drafts among the first N token ids only (the head's
  // first N rows: a smaller mat-vec per draft position); the target still verifies every token, so
  // the output is unchanged, only drafts of later ids are lost. 0: the whole vocabulary.
  int64_t draft_vocab = 0;
  // Benchmarking only (the output is not the model's): accept draft tokens at random instead of
  // checking them. synth_len L: mean accepted length including the target's token, 1 <= L <= n_max + 1;
  // synth_rates: the unconditional per-position rates P0 >= P1 >= ... (n_max values). At most one.
  double synth_len = -1;
  std::vector<double> synth_rates;
  std::string model_draft;  // -md/--model-draft (draft-simple)
  int n_gpu_layers_draft = -1;  // -ngld
  std::string type_k_draft, type_v_draft;  // -ctkd / -ctvd ("" = the target's)
  bool synthetic() const { return synth_len >= 0 || !synth_rates.empty(); }
  bool on() const { return type != SpecType::None; }
  // Keep slots per sequence (model::MemoryOptions::n_spec): the longest draft when speculating.
  int n_keep() const { return on() ? n_max : 0; }
};

// The conditional acceptance probability of each draft position under the synthetic curve (as
// llama.cpp resolves it): synth_len L gives the constant p with p + p^2 + ... + p^n = L - 1 and rates
// p^(i+1); rates P give P0, P1/P0, P2/P1, ... (0 after a zero). Errors name the flag.
Result<std::vector<double>> synth_probs(const SpecOptions& o);

// ngram-simple: the last n tokens of `history` searched for earlier in it (the most recent match
// first); the up to n_max tokens that followed that match. Empty when there is none.
std::vector<int32_t> ngram_draft(std::span<const int32_t> history, int n, int n_max);

// One request's draft length under the adaptive back-off: start at n_max; every fully accepted
// draft lengthens it by one (up to n_max), a draft rejected at its first token halves it; three
// such misses in a row stop drafting for a pause that doubles each time (2, 4, ... 64 steps), after
// which drafting resumes at length 1. So a request whose drafts keep failing decodes plainly
// (a verify of one token costs little more than a decode step) and a good one drafts n_max. A model
// drafter that ran and proposed nothing (every first token below p_min) counts as such a miss: its
// forward pass was paid for nothing, so a drafter that is never confident backs off too.
struct SpecState {
  int k = 0;              // current draft length
  int misses = 0;         // first-token rejections in a row
  int pause = 0;          // steps left without drafting
  int next_pause = 2;
  int64_t draft_n = 0, draft_n_accepted = 0;  // llama-server's timings fields
  int64_t draft_runs = 0;                     // model drafter passes this request took part in
  double draft_ms = 0;                        // their wall time, shared equally by the rows of a pass
  std::mt19937 rng;       // synthetic acceptance draws
  void start(int n_max, uint32_t seed) { k = n_max, misses = 0, pause = 0, next_pause = 2, rng.seed(seed); }
  // After a verify of `drafted` tokens of which `accepted` were accepted (the counters are the
  // caller's, kept as tokens are accepted).
  void update(int drafted, int accepted, int n_max, bool adaptive);
  // After a model drafter's pass that left this request no draft.
  void empty_draft(bool adaptive);

 private:
  void miss();  // a first-token rejection (or an empty model draft): shorter drafts, then a pause
};

}  // namespace kiln::engine
