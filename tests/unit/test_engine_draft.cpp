// --spec-type draft-simple in the engine (engine/draft_model.cpp) on tiny generated models: the output
// equals plain decoding's (greedy alone; 4 slots drafting in the same steps next to a long prefill; a
// second turn served from the prefix cache; seeded sampling at temperature 1) with two draft models
// per target: the target's own file (its greedy drafts are accepted: the rollback after acceptance,
// in the target and in the draft model's memory, is exercised) and a differently seeded file of the
// same vocabulary (mostly rejected), for qwen35 (hybrid draft: keep slots), qwen35moe and llama
// (attention-only draft: truncation); a missing -md and a draft of another vocabulary are refused.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine_spec_util.h"
#include "../model/model_test_util.h"

using namespace kiln;
using namespace kiln::engine;
using namespace kiln::engine::spec_test;

namespace {

std::string file(const std::string& preset, uint64_t seed = 13) {
  return test::generated_model("kiln-engine-draft-test", preset, gguf::GgmlType::Q8_0, seed);
}

std::unique_ptr<Engine> open(const std::string& preset, int np, SpecOptions spec, int64_t cache_ram = 0) {
  EngineOptions eo;
  eo.n_ctx = 512 * np;
  eo.n_parallel = np;
  eo.n_ubatch = 64;
  eo.n_threads = 2;
  eo.cache_ram_bytes = cache_ram;
  eo.cache_block = 16;
  eo.spec = spec;
  auto e = Engine::load(file(preset), eo);
  KILN_CHECK(e.ok(), "engine: {}", e.ok() ? "" : e.error().message);
  return std::move(*e);
}

// The draft model: the target's own file (self = true) or the same preset with another seed.
SpecOptions simple(const std::string& preset, bool self, int n_max = 3) {
  SpecOptions s;
  s.type = SpecType::DraftSimple;
  s.n_max = n_max;
  s.p_min = 0;
  s.model_draft = self ? file(preset) : file(preset, 99);
  return s;
}

std::vector<int32_t> prompt(uint32_t seed, int n = 24) {
  std::mt19937 g(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = 300 + int32_t(g() % 400);
  return p;
}

class EngineDraft : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

std::string preset_of(const auto& p) { return "tiny-" + std::get<0>(p); }

TEST_P(EngineDraft, GreedyEqualsPlainAloneAndBatched) {
  const std::string preset = preset_of(GetParam());
  const bool self = std::get<1>(GetParam());
  std::vector<std::vector<int32_t>> plain;
  {
    auto e = open(preset, 1, {});
    for (uint32_t s = 0; s < 4; ++s) {
      auto h = e->submit(req(prompt(s), 32));
      plain.push_back(collect(h).tokens);
    }
  }
  int64_t drafted = 0, accepted = 0;
  {  // alone
    auto e = open(preset, 1, simple(preset, self));
    for (uint32_t s = 0; s < 4; ++s) {
      auto h = e->submit(req(prompt(s), 32));
      const Out o = collect(h);
      EXPECT_EQ(o.tokens, plain[s]) << "prompt " << s;
      drafted += o.t.draft_n;
      accepted += o.t.draft_n_accepted;
    }
  }
  EXPECT_GT(drafted, 0) << "no draft was verified";
  if (self) EXPECT_GT(accepted, drafted / 2) << "the target's own drafts should mostly be accepted";
  std::printf("[%s, %s draft] draft-simple alone: %lld drafted, %lld accepted\n", preset.c_str(),
              self ? "its own" : "another", (long long)drafted, (long long)accepted);
  {  // 4 slots drafting in the same steps, a long prompt prefilling next to them
    auto e = open(preset, 5, simple(preset, self, 4));
    std::vector<RequestHandle> hs;
    for (uint32_t s = 0; s < 4; ++s) hs.push_back(e->submit(req(prompt(s), 32)));
    auto hl = e->submit(req(prompt(99, 300), 8));
    int64_t d = 0;
    for (uint32_t s = 0; s < 4; ++s) {
      const Out o = collect(hs[s]);
      EXPECT_EQ(o.tokens, plain[s]) << "batched prompt " << s;
      d += o.t.draft_n;
    }
    EXPECT_GT(d, 0);
    collect(hl);
  }
}

TEST_P(EngineDraft, PrefixCacheHitEqualsPlain) {
  const std::string preset = preset_of(GetParam());
  const bool self = std::get<1>(GetParam());
  const auto [base1, base2, p2] = two_turns([&] { return open(preset, 1, {}); }, prompt(7), prompt(8), 20);
  auto e = open(preset, 2, simple(preset, self), int64_t(64) << 20);
  auto h1 = e->submit(req(prompt(7), 20));
  EXPECT_EQ(collect(h1).tokens, base1);
  auto h2 = e->submit(req(p2, 20));
  const Out o = collect(h2);
  EXPECT_GT(o.t.cache_n, 0);
  EXPECT_GT(o.t.draft_n, 0);
  EXPECT_EQ(o.tokens, base2);
}

TEST_P(EngineDraft, SeededSamplingEqualsPlain) {
  const std::string preset = preset_of(GetParam());
  const bool self = std::get<1>(GetParam());
  auto plain = open(preset, 1, {});
  auto spec = open(preset, 1, simple(preset, self));
  int64_t drafted = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    auto a = plain->submit(req(prompt(3), 12, 1.0f, seed));
    auto b = spec->submit(req(prompt(3), 12, 1.0f, seed));
    const Out oa = collect(a), ob = collect(b);
    EXPECT_EQ(oa.tokens, ob.tokens) << "seed " << seed;
    drafted += ob.t.draft_n;
  }
  EXPECT_GT(drafted, 0);
}

INSTANTIATE_TEST_SUITE_P(Tiny, EngineDraft,
                         ::testing::Combine(::testing::Values("qwen35", "qwen35moe", "llama"), ::testing::Bool()),
                         [](const auto& i) {
                           return std::get<0>(i.param) + (std::get<1>(i.param) ? "_self" : "_other");
                         });

TEST(EngineDraftLoad, MissingOrForeignDraftModelIsRefused) {
  EngineOptions eo;
  eo.n_ctx = 512;
  eo.n_threads = 2;
  eo.spec.type = SpecType::DraftSimple;
  auto e = Engine::load(file("tiny-qwen35"), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("-md"), std::string::npos) << e.error().message;
  eo.spec.model_draft = file("tiny-llama");  // another vocabulary
  e = Engine::load(file("tiny-qwen35"), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("-md/--model-draft"), std::string::npos) << e.error().message;
}

}  // namespace
