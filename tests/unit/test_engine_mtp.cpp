// --spec-type draft-mtp in the engine (engine_spec.cpp's batched MTP drafts over model/mtp.cpp) on
// tiny generated qwen35 / qwen35moe models with one MTP block: the output equals plain decoding's
// (greedy alone; 4 slots drafting in the same steps next to a long prefill; a second turn served from
// the prefix cache; seeded sampling at temperature 1), drafts are made and verified (p_min 0: a
// random-weight MTP is never confident), and a model without an MTP block is refused by name.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine_spec_util.h"
#include "../model/model_test_util.h"

using namespace kiln;
using namespace kiln::engine;
using namespace kiln::engine::spec_test;

namespace {

std::unique_ptr<Engine> open(const std::string& preset, int np, SpecOptions spec, int64_t cache_ram = 0) {
  EngineOptions eo;
  eo.n_ctx = 512 * np;
  eo.n_parallel = np;
  eo.n_ubatch = 64;
  eo.n_threads = 2;
  eo.cache_ram_bytes = cache_ram;
  eo.cache_block = 16;
  eo.spec = spec;
  auto e = Engine::load(test::generated_model("kiln-engine-mtp-test", preset, gguf::GgmlType::Q8_0, 13), eo);
  KILN_CHECK(e.ok(), "engine: {}", e.ok() ? "" : e.error().message);
  return std::move(*e);
}

SpecOptions mtp(int n_max = 3) {
  SpecOptions s;
  s.type = SpecType::DraftMtp;
  s.n_max = n_max;
  s.p_min = 0;
  return s;
}

std::vector<int32_t> prompt(uint32_t seed, int n = 24) {
  std::mt19937 g(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = 300 + int32_t(g() % 400);
  return p;
}

class EngineMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineMtp, GreedyEqualsPlainAloneAndBatched) {
  const std::string preset = "tiny-" + GetParam() + "-mtp";
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
    auto e = open(preset, 1, mtp());
    for (uint32_t s = 0; s < 4; ++s) {
      auto h = e->submit(req(prompt(s), 32));
      const Out o = collect(h);
      EXPECT_EQ(o.tokens, plain[s]) << "prompt " << s;
      drafted += o.t.draft_n;
      accepted += o.t.draft_n_accepted;
    }
  }
  EXPECT_GT(drafted, 0) << "no MTP draft was verified";
  std::printf("[%s] draft-mtp alone: %lld drafted, %lld accepted\n", preset.c_str(), (long long)drafted,
              (long long)accepted);
  {  // 4 slots drafting in the same steps, a long prompt prefilling next to them
    auto e = open(preset, 5, mtp(4));
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

TEST_P(EngineMtp, PrefixCacheHitEqualsPlain) {
  const std::string preset = "tiny-" + GetParam() + "-mtp";
  const auto [base1, base2, p2] = two_turns([&] { return open(preset, 1, {}); }, prompt(7), prompt(8), 20);
  auto e = open(preset, 2, mtp(), int64_t(64) << 20);
  auto h1 = e->submit(req(prompt(7), 20));
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
    auto a = plain->submit(req(prompt(3), 12, 1.0f, seed));
    auto b = spec->submit(req(prompt(3), 12, 1.0f, seed));
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
