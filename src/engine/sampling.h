// engine/sampling.h — token sampling: the llama.cpp chain
//   penalties → logit_bias → top_k → top_p → min_p → temperature → draw (seeded mt19937),
//   with temperature <= 0 meaning greedy argmax (after penalties and bias), plus log-probabilities;
//   an optional grammar mask (engine/grammar_matcher.h) bans tokens before the truncations.
// Owns: SamplingParams (typed request parameters; the server maps JSON onto them) and Sampler
//   (per-request state: RNG, penalty window, scratch).
// Must not: see JSON, text or the model; allocate per call beyond its reusable scratch.
// Threading: a Sampler belongs to one request and is used by the engine thread only.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::engine {

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp repeat_penalty / "repetition_penalty")
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;  // window over prompt + generated tokens; 0: off, -1: whole context
  std::unordered_map<int32_t, float> logit_bias;  // added to the logit; -inf bans a token
  uint64_t seed = 0xFFFFFFFFu;  // llama.cpp LLAMA_DEFAULT_SEED (0xFFFFFFFF) = random
  bool has_seed() const { return seed != 0xFFFFFFFFu; }
};

// One token's log-probability, and the top alternatives at that step.
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
};

class Sampler {
 public:
  // n_vocab: logits row length. A params.seed of 0xFFFFFFFF draws a seed from std::random_device.
  Sampler(const SamplingParams& params, int64_t n_vocab);

  const SamplingParams& params() const { return p_; }
  uint64_t seed() const { return seed_; }

  // Feeds tokens into the penalty window (prompt tokens at start, then each sampled token).
  void accept(int32_t token);
  void accept(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) accept(t);
  }

  // Runs the chain on a copy of `logits` (n_vocab floats) and returns the chosen token.
  // `allow` (optional, n_vocab bits, bit i of word i/64): a grammar's token mask; tokens outside it
  // get -inf after penalties and logit_bias, before top_k/top_p/min_p/temperature and the draw.
  int32_t sample(const float* logits, const uint64_t* allow = nullptr);

  // Whether sample_top over a row's n largest logits draws exactly the token sample() would draw
  // over the whole row (the same arithmetic, the same RNG draws): greedy, or 0 < top_k <= n, with
  // no penalties and no logit_bias (which could lift a token from outside the n).
  bool can_sample_top(int n) const;
  // The chain over a row's n largest logits (ids[i], logits[i]: descending, ties lower id first,
  // as model::Context::top_logits gives them). Only where can_sample_top(n).
  int32_t sample_top(const int32_t* ids, const float* logits, int n);

  // log-softmax of the raw logits (the model's distribution, before penalties and temperature):
  // the logprob of `token` and the n_top most likely tokens (descending). n_top may be 0.
  static TokenLogprob logprob_of(const float* logits, int64_t n_vocab, int32_t token, int n_top,
                                 std::vector<TokenLogprob>* top);

 private:
  struct Cand {
    int32_t id;
    float logit;
    float p;
  };
  void apply_penalties(std::vector<float>& l) const;
  bool penalties_on() const {
    return p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  }
  // top_p, min_p, temperature and the draw over cand_ (sorted descending, truncated to top_k).
  int32_t draw();

  SamplingParams p_;
  int64_t n_vocab_;
  uint64_t seed_;
  std::mt19937 rng_;
  std::deque<int32_t> window_;  // last penalty_last_n accepted tokens
  std::vector<float> work_;     // [n_vocab]
  std::vector<Cand> cand_;      // [n_vocab]
};

}  // namespace kiln::engine
