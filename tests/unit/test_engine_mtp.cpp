// --spec-type draft-mtp in the engine (engine_spec.cpp's batched MTP drafts over model/mtp.cpp) on
// tiny generated qwen35 / qwen35moe models with one MTP block: the output equals plain decoding's
// (greedy alone; 4 slots drafting in the same steps next to a long prefill; a second turn served from
// the prefix cache; seeded sampling at temperature 1), drafts are made and verified (p_min 0: a
// random-weight MTP is never confident) and, once drafting pauses, steps defer the MTP catch-up and
// batched passes catch up; a model without an MTP block is refused by name.
#include <gtest/gtest.h>


#include "engine/engine.h"
#include "engine_spec_util.h"
#include "../model/model_test_util.h"

using namespace kiln;
using namespace kiln::engine;
using namespace kiln::engine::spec_test;

namespace {

std::unique_ptr<Engine> open(const std::string& preset, int np, SpecOptions spec, int64_t cache_ram = 0) {
  return open_engine(test::generated_model("kiln-engine-mtp-test", preset, gguf::GgmlType::Q8_0, 13), np, std::move(spec), cache_ram);
}

SpecOptions mtp(int n_max = 3) {
  SpecOptions s;
  s.type = SpecType::DraftMtp;
  s.n_max = n_max;
  s.p_min = 0;
  return s;
}

class EngineMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineMtp, GreedyEqualsPlainAloneAndBatched) {
  const std::string preset = "tiny-" + GetParam() + "-mtp";
  const PromptFn p = [](uint32_t s) { return random_prompt(s); };
  const auto plain = greedy_outputs(*open(preset, 1, {}), 4, 32, p);
  auto alone = open(preset, 1, mtp());
  const auto [drafted, accepted] = expect_alone_equal(*alone, plain, 32, p);
  EXPECT_GT(drafted, 0) << "no MTP draft was verified";
  // A random MTP block is rejected: drafting pauses, the paused steps defer the catch-up (batched
  // passes before the probes), and the output is still plain decoding's.
  const Metrics mt = alone->metrics();
  EXPECT_GT(mt.mtp_deferred_steps, 0u);
  EXPECT_GT(mt.mtp_flushes, 0u);
  std::printf("[%s] draft-mtp alone: %lld drafted, %lld accepted\n", preset.c_str(), (long long)drafted,
              (long long)accepted);
  // 4 slots drafting in the same steps, a long prompt prefilling next to them
  EXPECT_GT(expect_batched_equal(*open(preset, 5, mtp(4)), plain, 32, p, random_prompt(99, 300)), 0);
}

TEST_P(EngineMtp, PrefixCacheHitEqualsPlain) {
  const std::string preset = "tiny-" + GetParam() + "-mtp";
  const auto [base1, base2, p2] = two_turns([&] { return open(preset, 1, {}); }, random_prompt(7), random_prompt(8), 20);
  auto e = open(preset, 2, mtp(), int64_t(64) << 20);
  auto h1 = e->submit(req(random_prompt(7), 20));
  EXPECT_EQ(collect(h1).tokens, base1);
  auto h2 = e->submit(req(p2, 20));
  const Out o = collect(h2);
  EXPECT_GT(o.t.cache_n, 0);
  EXPECT_GT(o.t.draft_n, 0);
  EXPECT_EQ(o.tokens, base2);
}

TEST_P(EngineMtp, SeededSamplingEqualsPlain) {
  const std::string preset = "tiny-" + GetParam() + "-mtp";
  auto plain = open(preset, 1, {});
  auto spec = open(preset, 1, mtp());
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

INSTANTIATE_TEST_SUITE_P(Tiny, EngineMtp, ::testing::Values("qwen35", "qwen35moe"));

TEST(EngineMtpLoad, ModelWithoutMtpBlockIsRefused) {
  EngineOptions eo;
  eo.n_ctx = 512;
  eo.n_threads = 2;
  eo.spec = mtp();
  auto e = Engine::load(test::generated_model("kiln-engine-mtp-test", "tiny-qwen35", gguf::GgmlType::Q8_0, 13), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("draft-mtp"), std::string::npos) << e.error().message;
}

}  // namespace
