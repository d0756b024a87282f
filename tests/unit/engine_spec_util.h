// tests/unit/engine_spec_util.h — what the engine tests over generated models share
// (test_engine_model.cpp and the speculative-decoding tests test_engine_spec/mtp/draft.cpp): a
// request's whole output collected from its event channel, the request the comparisons with plain
// decoding use, random prompts, the greedy-equals-plain checks (alone and batched) and the two-turn
// baseline of the prefix-cache comparisons.
// Threading: test threads only.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace kiln::engine::spec_test {

struct Out {
  std::vector<int32_t> tokens;
  std::string text;   // the events' text (what a client sees)
  std::string error;  // FinishReason::Error: why
  Timings t;
  FinishReason finish = FinishReason::None;
};

// Every token of the request until its final event (a failure after 120 s).
inline Out collect(RequestHandle& h) {
  Out o;
  for (int i = 0; i < 1200; ++i) {
    auto e = h.next(std::chrono::milliseconds(100));
    if (!e) continue;
    for (auto& t : e->tokens) o.tokens.push_back(t.id);
    o.text += e->text;
    if (e->final()) {
      o.t = e->timings;
      o.finish = e->finish;
      o.error = e->error;
      return o;
    }
  }
  ADD_FAILURE() << "request did not finish";
  return o;
}

// n tokens after prompt p at temperature temp (0: greedy) with the given seed, every candidate in play.
inline Request req(std::vector<int32_t> p, int n, float temp = 0, uint32_t seed = 1) {
  Request r;
  r.prompt = std::move(p);
  r.sampling.temperature = temp;
  r.sampling.seed = seed;
  r.sampling.min_p = 0;  // the tiny models' logits are peaked: keep every top-k candidate in play
  r.sampling.top_p = 1;
  r.max_tokens = n;
  r.ignore_eos = true;
  return r;
}

// An engine on a model file with np slots of 512 positions, 64-token steps, 2 threads, the prefix
// cache at cache_ram bytes in 16-token blocks, and the given speculation.
inline std::unique_ptr<Engine> open_engine(const std::string& path, int np, SpecOptions spec, int64_t cache_ram = 0) {
  EngineOptions eo;
  eo.n_ctx = 512 * np;
  eo.n_parallel = np;
  eo.n_ubatch = 64;
  eo.n_threads = 2;
  eo.cache_ram_bytes = cache_ram;
  eo.cache_block = 16;
  eo.spec = std::move(spec);
  auto e = Engine::load(path, eo);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) std::abort();
  return std::move(*e);
}

// n tokens drawn (seeded) from the tiny models' middle vocabulary, 300..699.
inline std::vector<int32_t> random_prompt(uint32_t seed, int n = 24) {
  std::mt19937 g(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = 300 + int32_t(g() % 400);
  return p;
}

using PromptFn = std::function<std::vector<int32_t>(uint32_t)>;

// The n greedy tokens after prompts 0..count-1, one request at a time on e.
inline std::vector<std::vector<int32_t>> greedy_outputs(Engine& e, int count, int n, const PromptFn& prompt) {
  std::vector<std::vector<int32_t>> out;
  for (uint32_t s = 0; s < uint32_t(count); ++s) {
    auto h = e.submit(req(prompt(s), n));
    out.push_back(collect(h).tokens);
  }
  return out;
}

// On a speculating engine, one request at a time: each output equals plain[s]. Returns the drafted
// and accepted tokens over all of them.
struct Drafts {
  int64_t drafted = 0, accepted = 0;
};
inline Drafts expect_alone_equal(Engine& e, const std::vector<std::vector<int32_t>>& plain, int n,
                                 const PromptFn& prompt) {
  Drafts d;
  for (uint32_t s = 0; s < uint32_t(plain.size()); ++s) {
    auto h = e.submit(req(prompt(s), n));
    const Out o = collect(h);
    EXPECT_EQ(o.tokens, plain[s]) << "prompt " << s;
    d.drafted += o.t.draft_n;
    d.accepted += o.t.draft_n_accepted;
  }
  return d;
}

// The same prompts in slots speculating in the same steps while a long prompt prefills beside them:
// each output equals plain[s]. Returns the tokens drafted for them.
inline int64_t expect_batched_equal(Engine& e, const std::vector<std::vector<int32_t>>& plain, int n,
                                    const PromptFn& prompt, const std::vector<int32_t>& long_prompt) {
  std::vector<RequestHandle> hs;
  for (uint32_t s = 0; s < uint32_t(plain.size()); ++s) hs.push_back(e.submit(req(prompt(s), n)));
  auto hl = e.submit(req(long_prompt, 8));
  int64_t d = 0;
  for (uint32_t s = 0; s < uint32_t(plain.size()); ++s) {
    const Out o = collect(hs[s]);
    EXPECT_EQ(o.tokens, plain[s]) << "batched prompt " << s;
    d += o.t.draft_n;
  }
  collect(hl);
  return d;
}

// Turn 1 (prompt p1, n tokens), then turn 2 = p1 + turn 1's answer + more, on one plain engine
// (open_plain()), and turn 2 again on a cold plain engine, which must answer the same: the baseline a
// speculative engine's two turns (the second served from the prefix cache) are compared with.
struct TwoTurns {
  std::vector<int32_t> base1, base2, p2;
};
template <class Open>
TwoTurns two_turns(Open&& open_plain, const std::vector<int32_t>& p1, const std::vector<int32_t>& more, int n) {
  TwoTurns r;
  {
    auto e = open_plain();
    auto h = e->submit(req(p1, n));
    r.base1 = collect(h).tokens;
    r.p2 = p1;
    r.p2.insert(r.p2.end(), r.base1.begin(), r.base1.end());
    r.p2.insert(r.p2.end(), more.begin(), more.end());
    auto h2 = e->submit(req(r.p2, n));
    r.base2 = collect(h2).tokens;
  }
  auto e = open_plain();  // the oracle for turn 2: a cold engine
  auto h = e->submit(req(r.p2, n));
  EXPECT_EQ(collect(h).tokens, r.base2);
  return r;
}

}  // namespace kiln::engine::spec_test
