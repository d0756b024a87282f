// --spec-type draft-simple in the engine (engine/draft_model.cpp) on tiny generated models: the output
// equals plain decoding's (greedy alone; 4 slots drafting in the same steps next to a long prefill; a
// second turn served from the prefix cache; seeded sampling at temperature 1) with two draft models
// per target: the target's own file (its greedy drafts are accepted: the rollback after acceptance,
// in the target and in the draft model's memory, is exercised) and a differently seeded file of the
// same vocabulary (mostly rejected), for qwen35 (hybrid draft: keep slots), qwen35moe and llama
// (attention-only draft: truncation); a missing -md and a draft of another vocabulary are refused.
#include <gtest/gtest.h>


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
  return open_engine(file(preset), np, std::move(spec), cache_ram);
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

class EngineDraft : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

std::string preset_of(const auto& p) { return "tiny-" + std::get<0>(p); }

TEST_P(EngineDraft, GreedyEqualsPlainAloneAndBatched) {
  const std::string preset = preset_of(GetParam());
  const bool self = std::get<1>(GetParam());
  const PromptFn p = [](uint32_t s) { return random_prompt(s); };
  const auto plain = greedy_outputs(*open(preset, 1, {}), 4, 32, p);
  const auto [drafted, accepted] = expect_alone_equal(*open(preset, 1, simple(preset, self)), plain, 32, p);
  EXPECT_GT(drafted, 0) << "no draft was verified";
  if (self) {
    EXPECT_GT(accepted, drafted / 2) << "the target's own drafts should mostly be accepted";
  }
  std::printf("[%s, %s draft] draft-simple alone: %lld drafted, %lld accepted\n", preset.c_str(),
              self ? "its own" : "another", (long long)drafted, (long long)accepted);
  // 4 slots drafting in the same steps, a long prompt prefilling next to them
  EXPECT_GT(expect_batched_equal(*open(preset, 5, simple(preset, self, 4)), plain, 32, p, random_prompt(99, 300)), 0);
}

TEST_P(EngineDraft, PrefixCacheHitEqualsPlain) {
  const std::string preset = preset_of(GetParam());
  const bool self = std::get<1>(GetParam());
  const auto [base1, base2, p2] = two_turns([&] { return open(preset, 1, {}); }, random_prompt(7), random_prompt(8), 20);
  auto e = open(preset, 2, simple(preset, self), int64_t(64) << 20);
  auto h1 = e->submit(req(random_prompt(7), 20));
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
    auto a = plain->submit(req(random_prompt(3), 12, 1.0f, seed));
    auto b = spec->submit(req(random_prompt(3), 12, 1.0f, seed));
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
