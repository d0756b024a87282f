// tests/unit/engine_spec_util.h — what the engine tests over generated models share
// (test_engine_model.cpp and the speculative-decoding tests test_engine_spec/mtp/draft.cpp): a
// request's whole output collected from its event channel, the request the comparisons with plain
// decoding use, and the two-turn baseline of the prefix-cache comparisons.
// Threading: test threads only.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace kiln::engine::spec_test {

struct Out {
  std::vector<int32_t> tokens;
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
    if (e->final()) {
      o.t = e->timings;
      o.finish = e->finish;
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
