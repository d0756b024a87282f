// Sampler tests (no model). Oracles: direct computations of the chain's definitions in this file
// (argmax, softmax, nucleus / min-p sets, llama.cpp's penalty formula) and empirical frequencies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/sampling.h"

using namespace kiln::engine;

namespace {

std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> l(static_cast<size_t>(n));
  for (auto& x : l) x = d(g);
  return l;
}

int argmax(const std::vector<float>& l) { return int(std::max_element(l.begin(), l.end()) - l.begin()); }

std::vector<double> softmax(const std::vector<float>& l, double temp = 1.0) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp((l[i] - mx) / temp));
  for (auto& x : p) x /= s;
  return p;
}

SamplingParams plain(float temp) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.f;
  p.min_p = 0.f;
  p.seed = 7;
  return p;
}

}  // namespace

TEST(EngineSampling, GreedyIsArgmax) {
  for (uint32_t s = 0; s < 20; ++s) {
    auto l = random_logits(500, s);
    Sampler smp(plain(0.f), 500);
    EXPECT_EQ(smp.sample(l.data()), argmax(l));
  }
}

TEST(EngineSampling, TopKOneIsArgmaxAtAnyTemperature) {
  auto p = plain(1.5f);
  p.top_k = 1;
  for (uint32_t s = 0; s < 20; ++s) {
    auto l = random_logits(300, 100 + s);
    Sampler smp(p, 300);
    EXPECT_EQ(smp.sample(l.data()), argmax(l));
  }
}

TEST(EngineSampling, SeedDeterminismAndSeedsDiffer) {
  auto l = random_logits(200, 5, 1.f);
  auto p = plain(1.f);
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler smp(p, 200);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(smp.sample(l.data()));
    return out;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_EQ(run(12345), run(12345));
  EXPECT_NE(run(1), run(2));
}

TEST(EngineSampling, FrequenciesFollowSoftmaxWithTemperature) {
  const int V = 8;
  auto l = random_logits(V, 11, 1.f);
  for (float temp : {0.5f, 1.0f, 2.0f}) {
    auto p = plain(temp);
    Sampler smp(p, V);
    const int N = 40000;
    std::vector<int> cnt(V, 0);
    for (int i = 0; i < N; ++i) cnt[size_t(smp.sample(l.data()))]++;
    auto q = softmax(l, temp);
    for (int v = 0; v < V; ++v) {
      const double f = double(cnt[size_t(v)]) / N, sd = std::sqrt(q[size_t(v)] * (1 - q[size_t(v)]) / N);
      EXPECT_NEAR(f, q[size_t(v)], 5 * sd + 1e-4) << "temp " << temp << " token " << v;
    }
  }
}

TEST(EngineSampling, TopPKeepsTheNucleusOnly) {
  const int V = 50;
  auto l = random_logits(V, 21, 1.5f);
  auto p = plain(1.f);
  p.top_p = 0.7f;
  // Oracle: sort by probability, the smallest prefix reaching 0.7.
  auto q = softmax(l);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return q[size_t(a)] > q[size_t(b)]; });
  std::set<int> nucleus;
  double cum = 0;
  for (int id : order) {
    nucleus.insert(id);
    cum += q[size_t(id)];
    if (cum >= 0.7) break;
  }
  Sampler smp(p, V);
  std::set<int> seen;
  for (int i = 0; i < 5000; ++i) seen.insert(smp.sample(l.data()));
  for (int id : seen) EXPECT_TRUE(nucleus.count(id)) << id;
  EXPECT_EQ(seen, nucleus);  // 5000 draws hit every member (each has p >= ~1/50 renormalised)
}

TEST(EngineSampling, MinPKeepsTokensAboveFractionOfMax) {
  const int V = 40;
  auto l = random_logits(V, 31, 1.0f);
  auto p = plain(1.f);
  p.min_p = 0.3f;
  auto q = softmax(l);
  const double pmax = *std::max_element(q.begin(), q.end());
  std::set<int> allowed;
  for (int v = 0; v < V; ++v)
    if (q[size_t(v)] >= 0.3 * pmax) allowed.insert(v);
  Sampler smp(p, V);
  std::set<int> seen;
  for (int i = 0; i < 5000; ++i) seen.insert(smp.sample(l.data()));
  EXPECT_EQ(seen, allowed);
}

TEST(EngineSampling, LogitBiasBansAndForces) {
  auto l = random_logits(100, 41);
  const int top = argmax(l);
  auto p = plain(0.f);
  p.logit_bias[top] = -INFINITY;
  Sampler smp(p, 100);
  auto l2 = l;
  l2[size_t(top)] = -INFINITY;
  EXPECT_EQ(smp.sample(l.data()), argmax(l2));
  auto p2 = plain(1.f);
  p2.logit_bias[17] = 1000.f;
  Sampler smp2(p2, 100);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(smp2.sample(l.data()), 17);
}

// llama.cpp penalties applied by hand, then greedy, over many random cases.
TEST(EngineSampling, PenaltiesMatchFormula) {
  std::mt19937 g(3);
  for (int c = 0; c < 200; ++c) {
    const int V = 30;
    auto l = random_logits(V, 1000 + uint32_t(c), 1.f);
    auto p = plain(0.f);
    p.repeat_penalty = 1.0f + float(g() % 100) / 50.f;
    p.frequency_penalty = float(g() % 100) / 100.f;
    p.presence_penalty = float(g() % 100) / 100.f;
    p.penalty_last_n = 1 + int(g() % 10);
    std::vector<int32_t> hist;
    for (int i = 0; i < 15; ++i) hist.push_back(int32_t(g() % V));
    Sampler smp(p, V);
    smp.accept(hist);
    std::map<int, int> cnt;
    for (size_t i = hist.size() - size_t(p.penalty_last_n); i < hist.size(); ++i) cnt[hist[i]]++;
    auto e = l;
    for (auto [t, k] : cnt) {
      float& x = e[size_t(t)];
      x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
      x -= float(k) * p.frequency_penalty + p.presence_penalty;
    }
    EXPECT_EQ(smp.sample(l.data()), argmax(e)) << "case " << c;
  }
}

TEST(EngineSampling, LogprobsAreLogSoftmax) {
  const int V = 300;
  auto l = random_logits(V, 51);
  auto q = softmax(l);
  std::vector<TokenLogprob> top;
  auto r = Sampler::logprob_of(l.data(), V, 123, 5, &top);
  EXPECT_NEAR(r.logprob, std::log(q[123]), 1e-4);
  ASSERT_EQ(top.size(), 5u);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(top[size_t(i)].id, order[size_t(i)]);
    EXPECT_NEAR(top[size_t(i)].logprob, std::log(q[size_t(order[size_t(i)])]), 1e-4);
  }
}

// sample_top over a row's largest logits (what the GPU downloads) draws what sample() draws over the
// whole row, draw for draw, wherever can_sample_top says so; the oracle's top list is a stable sort.
TEST(EngineSampling, SampleTopEqualsSampleOnTheWholeRow) {
  const int V = 3000, n_top = 64;
  struct Case {
    float temp;
    int top_k;
    float top_p, min_p;
  };
  const Case cases[] = {{0.f, 0, 1.f, 0.f},      {0.f, 40, 0.95f, 0.05f}, {0.8f, 40, 0.95f, 0.05f},
                        {1.0f, 64, 1.f, 0.f},    {1.5f, 10, 0.5f, 0.f},   {0.7f, 1, 1.f, 0.f},
                        {2.0f, 64, 0.99f, 0.2f}};
  for (const Case& c : cases)
    for (uint32_t s = 0; s < 6; ++s) {
      auto l = random_logits(V, 100 + s, s % 2 ? 1.f : 4.f);
      if (s == 5) std::fill(l.begin() + 20, l.begin() + 2990, -INFINITY);  // 30 finite: fewer than most top_k
      l[size_t(17)] = l[size_t(2995)] = 9.f;  // a tie at the top: the lower id first
      std::vector<int32_t> idx(static_cast<size_t>(V));
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
      std::vector<float> vals(static_cast<size_t>(n_top));
      for (int i = 0; i < n_top; ++i) vals[size_t(i)] = l[size_t(idx[size_t(i)])];
      SamplingParams p = plain(c.temp);
      p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p, p.seed = 1234 + s;
      Sampler full(p, V), top(p, V);
      ASSERT_TRUE(top.can_sample_top(n_top)) << c.temp << " " << c.top_k;
      for (int d = 0; d < 50; ++d)
        ASSERT_EQ(top.sample_top(idx.data(), vals.data(), n_top), full.sample(l.data()))
            << "temp " << c.temp << " top_k " << c.top_k << " seed " << s << " draw " << d;
    }
}

TEST(EngineSampling, SampleTopRefusesChainsThatNeedTheWholeRow) {
  SamplingParams p = plain(0.8f);
  p.top_k = 40;
  EXPECT_TRUE(Sampler(p, 100).can_sample_top(64));
  EXPECT_FALSE(Sampler(p, 100).can_sample_top(39));  // top_k beyond the list
  p.top_k = 0;
  EXPECT_FALSE(Sampler(p, 100).can_sample_top(64));  // the whole vocabulary is a candidate
  p.top_k = 40;
  p.logit_bias[5] = 3.f;
  EXPECT_FALSE(Sampler(p, 100).can_sample_top(64));  // a bias may lift a token from outside the list
  p.logit_bias.clear();
  p.repeat_penalty = 1.1f;
  EXPECT_FALSE(Sampler(p, 100).can_sample_top(64));
  p.repeat_penalty = 1.f;
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler(p, 100).can_sample_top(64));
  SamplingParams g = plain(0.f);
  g.top_k = 0;
  EXPECT_TRUE(Sampler(g, 100).can_sample_top(1));  // greedy needs only the first
}
