#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace kiln::engine {

Sampler::Sampler(const SamplingParams& params, int64_t n_vocab) : p_(params), n_vocab_(n_vocab) {
  KILN_CHECK(n_vocab > 0, "Sampler: n_vocab {}", n_vocab);
  seed_ = p_.has_seed() ? p_.seed : (uint64_t(std::random_device{}()) << 32 | std::random_device{}()) & 0xFFFFFFFFu;
  rng_.seed(uint32_t(seed_));
  work_.resize(size_t(n_vocab));
  cand_.reserve(size_t(n_vocab));
}

void Sampler::accept(int32_t token) {
  if (p_.penalty_last_n == 0) return;
  window_.push_back(token);
  if (p_.penalty_last_n > 0)
    while (int64_t(window_.size()) > p_.penalty_last_n) window_.pop_front();
}

// llama.cpp's penalties: for every token seen c > 0 times in the window,
//   logit = logit > 0 ? logit / repeat : logit * repeat;  logit -= c * frequency + presence.
void Sampler::apply_penalties(std::vector<float>& l) const {
  if (!penalties_on() || window_.empty()) return;
  std::unordered_map<int32_t, int> count;
  for (int32_t t : window_) ++count[t];
  for (auto [t, c] : count) {
    if (t < 0 || t >= n_vocab_) continue;
    float& x = l[size_t(t)];
    x = x > 0 ? x / p_.repeat_penalty : x * p_.repeat_penalty;
    x -= float(c) * p_.frequency_penalty + p_.presence_penalty;
  }
}

int32_t Sampler::sample(const float* logits, const uint64_t* allow) {
  std::copy(logits, logits + n_vocab_, work_.begin());
  apply_penalties(work_);
  for (auto [t, b] : p_.logit_bias)
    if (t >= 0 && t < n_vocab_) work_[size_t(t)] += b;
  // With a grammar mask only its set bits are candidates (iterated word by word: a mask is usually
  // sparse, so this is cheaper than banning the rest).
  auto for_each = [&](auto&& f) {
    if (!allow) {
      for (int64_t i = 0; i < n_vocab_; ++i) f(i);
      return;
    }
    for (int64_t w = 0; w * 64 < n_vocab_; ++w)
      for (uint64_t m = allow[w]; m; m &= m - 1) {
        const int64_t i = w * 64 + __builtin_ctzll(m);
        if (i < n_vocab_) f(i);
      }
  };

  if (p_.temperature <= 0) {  // greedy: first maximum
    int32_t best = -1;
    for_each([&](int64_t i) {
      if (best < 0 || work_[size_t(i)] > work_[size_t(best)]) best = int32_t(i);
    });
    return std::max(best, 0);
  }

  cand_.clear();
  for_each([&](int64_t i) {
    if (work_[size_t(i)] != -std::numeric_limits<float>::infinity()) cand_.push_back({int32_t(i), work_[size_t(i)], 0});
  });
  if (cand_.empty()) {
    // Everything banned (e.g. logit_bias false on every allowed token): the first allowed token, so
    // that a grammar still holds; unconstrained, token 0 (llama.cpp returns an arbitrary token too).
    int32_t first = -1;
    for_each([&](int64_t i) {
      if (first < 0) first = int32_t(i);
    });
    return std::max(first, 0);
  }
  auto desc = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };

  // top_k
  if (p_.top_k > 0 && size_t(p_.top_k) < cand_.size()) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), desc);
    cand_.resize(size_t(p_.top_k));
  } else {
    std::sort(cand_.begin(), cand_.end(), desc);
  }
  return draw();
}

bool Sampler::can_sample_top(int n) const {
  return n > 0 && !penalties_on() && p_.logit_bias.empty() && (p_.temperature <= 0 || (p_.top_k > 0 && p_.top_k <= n));
}

int32_t Sampler::sample_top(const int32_t* ids, const float* logits, int n) {
  KILN_CHECK(can_sample_top(n), "Sampler::sample_top: the chain needs the whole row");
  if (p_.temperature <= 0) return ids[0];  // the first maximum
  // sample()'s candidates after top_k: the finite ones among the first top_k, in the same order.
  cand_.clear();
  for (int i = 0; i < p_.top_k; ++i)
    if (logits[i] != -std::numeric_limits<float>::infinity()) cand_.push_back({ids[i], logits[i], 0});
  if (cand_.empty()) return 0;  // everything banned: sample()'s first token
  return draw();
}

int32_t Sampler::draw() {
  auto softmax = [&] {
    const float mx = cand_.front().logit;
    double sum = 0;
    for (auto& c : cand_) sum += (c.p = std::exp(c.logit - mx));
    for (auto& c : cand_) c.p = float(c.p / sum);
  };
  // top_p: smallest prefix with cumulative probability >= top_p (at least one token).
  if (p_.top_p < 1.0f) {
    softmax();
    double cum = 0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].p;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(std::max<size_t>(keep, 1));
  }
  // min_p: keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
  if (p_.min_p > 0.0f) {
    const float thr = cand_.front().logit + std::log(p_.min_p);
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].logit >= thr) ++keep;
    cand_.resize(keep);
  }
  // temperature, then draw.
  for (auto& c : cand_) c.logit /= p_.temperature;
  softmax();
  const double u = double(rng_()) / 4294967296.0;  // [0, 1), from one 32-bit mt19937 draw
  double cum = 0;
  for (const auto& c : cand_) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return cand_.back().id;
}

TokenLogprob Sampler::logprob_of(const float* logits, int64_t n_vocab, int32_t token, int n_top,
                                 std::vector<TokenLogprob>* top) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const float lse = mx + float(std::log(sum));
  TokenLogprob r{token, token >= 0 && token < n_vocab ? logits[token] - lse : -std::numeric_limits<float>::infinity()};
  if (top) {
    top->clear();
    const int k = int(std::min<int64_t>(std::max(n_top, 0), n_vocab));
    if (k > 0) {
      std::vector<int32_t> idx(static_cast<size_t>(n_vocab));
      for (int64_t i = 0; i < n_vocab; ++i) idx[size_t(i)] = int32_t(i);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      for (int i = 0; i < k; ++i) top->push_back({idx[size_t(i)], logits[idx[size_t(i)]] - lse});
    }
  }
  return r;
}

}  // namespace kiln::engine
