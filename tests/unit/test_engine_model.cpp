// Engine tests on tiny generated models (model/gen presets tiny-llama and tiny-qwen35, random
// weights): batching and prefix reuse must not change greedy outputs. Oracle: the same request run
// alone on a fresh single-slot engine with the prefix cache off (cold).
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine_spec_util.h"
#include "../model/model_test_util.h"

using namespace kiln;
using namespace kiln::engine;
using kiln::engine::spec_test::collect;
using kiln::engine::spec_test::Out;

namespace {

std::string model_path(const std::string& preset) {
  return test::generated_model("kiln-engine-test", preset, gguf::GgmlType::Q8_0, 11);
}

class EngineModel : public ::testing::TestWithParam<std::string> {};

std::unique_ptr<Engine> open(const std::string& preset, int np, int64_t cache_ram = -1) {
  EngineOptions eo;
  eo.n_ctx = 1024 * np;
  eo.n_parallel = np;
  eo.n_ubatch = 64;
  eo.n_threads = 2;
  eo.cache_ram_bytes = cache_ram;
  eo.cache_block = 16;
  auto e = Engine::load(model_path(preset), eo);
  KILN_CHECK(e.ok(), "engine: {}", e.ok() ? "" : e.error().message);
  return std::move(*e);
}

Request greedy(std::vector<int32_t> p, int n) {
  Request r;
  r.prompt = std::move(p);
  r.sampling.temperature = 0;
  r.max_tokens = n;
  r.ignore_eos = true;  // random weights: keep lengths fixed
  return r;
}

std::vector<int32_t> cold(const std::string& preset, const std::vector<int32_t>& p, int n) {
  auto e = open(preset, 1, 0);
  auto h = e->submit(greedy(p, n));
  auto o = collect(h);
  EXPECT_EQ(o.t.cache_n, 0);
  return o.tokens;
}

std::vector<int32_t> words(std::mt19937& g, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = 300 + int32_t(g() % 400);  // ordinary (merged) tokens in every tiny vocabulary
  return v;
}

// The pieces one after another (a prompt built from turns).
std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> pieces) {
  std::vector<int32_t> v;
  for (const auto& p : pieces) v.insert(v.end(), p.begin(), p.end());
  return v;
}

// Chat-like framing tokens of the preset's vocabulary.
std::pair<int32_t, int32_t> turn_tokens(const Engine& e) {
  const auto& tok = e.tokenizer();
  int32_t a = tok.find("<|im_start|>"), b = tok.find("<|im_end|>");
  if (a < 0) {
    a = tok.find("<|start_header_id|>");
    b = tok.find("<|eot_id|>");
  }
  KILN_CHECK(a >= 0 && b >= 0, "turn tokens");
  return {a, b};
}

}  // namespace

TEST_P(EngineModel, EightParallelGreedyEqualEachAlone) {
  const std::string preset = GetParam();
  std::mt19937 g(1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(words(g, 4 + int(g() % 60)));
  std::vector<std::vector<int32_t>> alone;
  for (auto& p : prompts) alone.push_back(cold(preset, p, 12));
  auto e = open(preset, 8);
  std::vector<RequestHandle> hs;
  for (auto& p : prompts) hs.push_back(e->submit(greedy(p, 12)));
  for (size_t i = 0; i < hs.size(); ++i) {
    auto o = collect(hs[i]);
    EXPECT_EQ(o.finish, FinishReason::Length);
    EXPECT_EQ(o.tokens, alone[i]) << preset << " request " << i;
  }
}

TEST_P(EngineModel, SecondTurnReusesFirstTurnAndMatchesCold) {
  const std::string preset = GetParam();
  std::mt19937 g(2);
  auto e = open(preset, 2);
  auto [open_tok, close_tok] = turn_tokens(*e);
  const auto p1 = cat({{open_tok}, words(g, 80), {close_tok, open_tok}});
  auto h1 = e->submit(greedy(p1, 16));
  auto o1 = collect(h1);
  ASSERT_EQ(o1.tokens.size(), 16u);
  // Something else uses the engine in between.
  auto hx = e->submit(greedy(words(g, 30), 4));
  collect(hx);
  const auto p2 = cat({p1, o1.tokens, {close_tok, open_tok}, words(g, 10), {close_tok, open_tok}});
  auto h2 = e->submit(greedy(p2, 12));
  auto o2 = collect(h2);
  EXPECT_GE(o2.t.cache_n, int64_t(p1.size()));
  EXPECT_EQ(o2.t.prompt_n + o2.t.cache_n, int64_t(p2.size()));
  EXPECT_LT(o2.t.prompt_n, int64_t(p2.size() - p1.size()));
  EXPECT_EQ(o2.tokens, cold(preset, p2, 12));
}

TEST_P(EngineModel, SharedSystemPromptReusedOnFourSlots) {
  const std::string preset = GetParam();
  std::mt19937 g(3);
  auto e = open(preset, 4);
  auto [open_tok, close_tok] = turn_tokens(*e);
  const auto sys = cat({{open_tok}, words(g, 120), {close_tok}});
  auto prompt = [&](int i) { return cat({sys, {open_tok}, words(g, 6 + i), {close_tok, open_tok}}); };
  auto warm = e->submit(greedy(prompt(0), 4));
  collect(warm);
  std::vector<std::vector<int32_t>> ps;
  std::vector<RequestHandle> hs;
  for (int i = 1; i <= 4; ++i) {
    ps.push_back(prompt(i));
    hs.push_back(e->submit(greedy(ps.back(), 8)));
  }
  std::vector<Out> outs;
  for (auto& h : hs) outs.push_back(collect(h));
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_GE(outs[i].t.cache_n, int64_t(sys.size())) << preset << " request " << i;
    EXPECT_EQ(outs[i].tokens, cold(preset, ps[i], 8)) << preset << " request " << i;
  }
}

TEST_P(EngineModel, SeedDeterminism) {
  const std::string preset = GetParam();
  std::mt19937 g(4);
  auto p = words(g, 20);
  auto e = open(preset, 2);
  auto run = [&](uint64_t seed) {
    Request r = greedy(p, 16);
    r.sampling.temperature = 1.5f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.f;
    r.sampling.min_p = 0.f;
    r.sampling.seed = seed;
    auto h = e->submit(r);
    return collect(h).tokens;
  };
  auto a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(EngineLoad, MissingFileFailsWithItsName) {
  EngineOptions eo;
  auto e = Engine::load_async("/nonexistent/dir/model.gguf", eo);
  Status st = e->wait_ready(std::chrono::milliseconds(30000));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("/nonexistent/dir/model.gguf"), std::string::npos) << st.error().message;
  EXPECT_EQ(e->state(), EngineState::Failed);
  auto h = e->submit(greedy({1, 2, 3}, 4));
  auto ev = h.next(std::chrono::milliseconds(1000));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish, FinishReason::Error);
}

INSTANTIATE_TEST_SUITE_P(Tiny, EngineModel, ::testing::Values("tiny-llama", "tiny-qwen35"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });
