// tests/unit/engine_spec_util.h — what the speculative-decoding engine tests share
// (test_engine_spec.cpp, test_engine_mtp.cpp, test_engine_draft.cpp): a request's whole output
// collected from its event channel, and the request the comparisons with plain decoding use.
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

}  // namespace kiln::engine::spec_test
