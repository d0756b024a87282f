// Engine tests on a fake model (tests/unit/engine_fake.h): continuous batching, prefix reuse across
// slots and turns (attention-only and "recurrent" fakes), stop strings, cancellation, queueing.
// Oracle: the same requests run alone on an engine with the prefix cache off (cold), and the
// tokenizer's own whole-sequence decode for texts.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine_fake.h"

using namespace kiln;
using namespace kiln::engine;
using kiln::engine::testing::FakeRunner;
using kiln::engine::testing::make_test_tokenizer;

namespace {

struct Out {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::None;
  std::string stop_word, error;
  Timings t;
  std::vector<TokenOut> outs;
};

Out collect(RequestHandle& h, int timeout_ms = 30000) {
  Out o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    auto e = h.next(std::chrono::milliseconds(100));
    if (!e) continue;
    for (auto& t : e->tokens) {
      o.tokens.push_back(t.id);
      o.outs.push_back(t);
    }
    o.text += e->text;
    if (e->final()) {
      o.finish = e->finish;
      o.stop_word = e->stop_word;
      o.error = e->error;
      o.t = e->timings;
      return o;
    }
  }
  ADD_FAILURE() << "request " << h.id() << " did not finish";
  return o;
}

struct Setup {
  std::unique_ptr<Engine> eng;
  FakeRunner* fake = nullptr;
};

Setup make(bool recurrent, int slots, int64_t ubatch = 64, int64_t cache_ram = -1, int sleep_ms = 0,
           std::function<int32_t(const std::vector<int32_t>&)> script = {}) {
  auto tok = make_test_tokenizer();
  FakeRunner::Opts fo;
  fo.n_vocab = tok->n_tokens();
  fo.n_ctx = 512;
  fo.slots = slots;
  fo.n_batch = ubatch;
  fo.recurrent = recurrent;
  fo.state_slots = recurrent ? 3 : 0;  // the prefix cache's first tier: few, so states also move to RAM
  fo.suppressed = tok->eog_ids();
  fo.decode_sleep_ms = sleep_ms;
  fo.script = std::move(script);
  auto fake = std::make_unique<FakeRunner>(fo);
  Setup s;
  s.fake = fake.get();
  ModelInfo mi;
  mi.arch = recurrent ? "fake-hybrid" : "fake";
  mi.n_vocab = fo.n_vocab;
  mi.eog_ids = tok->eog_ids();
  EngineOptions eo;
  eo.n_parallel = slots;
  eo.n_ubatch = ubatch;
  eo.cache_ram_bytes = cache_ram;
  eo.cache_block = 16;
  eo.cache_snapshot_interval = 64;
  auto e = Engine::create(std::move(fake), std::move(tok), mi, eo);
  KILN_CHECK(e.ok(), "engine: {}", e.ok() ? "" : e.error().message);
  s.eng = std::move(*e);
  return s;
}

std::vector<int32_t> random_tokens(std::mt19937& g, int n, int32_t lo = 300, int32_t hi = 900) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = lo + int32_t(g() % uint32_t(hi - lo));
  return v;
}

Request greedy(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

// Each prompt run alone on a fresh single-slot engine without prefix cache.
std::vector<std::vector<int32_t>> cold_outputs(bool recurrent, const std::vector<std::vector<int32_t>>& prompts,
                                               int max_tokens) {
  std::vector<std::vector<int32_t>> outs;
  for (const auto& p : prompts) {
    auto s = make(recurrent, 1, 64, 0);
    auto h = s.eng->submit(greedy(p, max_tokens));
    auto o = collect(h);
    EXPECT_EQ(o.t.cache_n, 0);
    outs.push_back(o.tokens);
  }
  return outs;
}

class EngineFake : public ::testing::TestWithParam<bool> {};  // param: recurrent

}  // namespace

TEST_P(EngineFake, ParallelGreedyEqualsAlone) {
  const bool rec = GetParam();
  std::mt19937 g(1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_tokens(g, 3 + int(g() % 90)));
  auto cold = cold_outputs(rec, prompts, 24);
  auto s = make(rec, 8, 64);
  std::vector<RequestHandle> hs;
  for (auto& p : prompts) hs.push_back(s.eng->submit(greedy(p, 24)));
  for (size_t i = 0; i < hs.size(); ++i) {
    auto o = collect(hs[i]);
    EXPECT_EQ(o.finish, FinishReason::Length);
    EXPECT_EQ(o.tokens, cold[i]) << "request " << i;
    EXPECT_EQ(o.t.predicted_n, 24);
    EXPECT_EQ(o.t.prompt_n + o.t.cache_n, int64_t(prompts[i].size()));
  }
  // Batches mixed several sequences and never exceeded the step budget.
  size_t max_runs = 0;
  for (auto& b : s.fake->history()) {
    int64_t n = 0;
    for (auto& r : b) n += r.n;
    EXPECT_LE(n, 64);
    max_runs = std::max(max_runs, b.size());
  }
  EXPECT_GE(max_runs, 4u);
}

TEST_P(EngineFake, LongPromptNeverStallsDecoding) {
  const bool rec = GetParam();
  std::mt19937 g(2);
  auto s = make(rec, 2, 32, -1, 1);
  auto ha = s.eng->submit(greedy(random_tokens(g, 10), 200));
  auto first = ha.next(std::chrono::milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  int slot_a = -1;
  for (auto& si : s.eng->slots())
    if (si.request_id == ha.id()) slot_a = si.id;
  ASSERT_GE(slot_a, 0);
  auto hb = s.eng->submit(greedy(random_tokens(g, 400), 5));
  auto ob = collect(hb);
  auto oa = collect(ha);
  EXPECT_EQ(ob.finish, FinishReason::Length);
  EXPECT_EQ(oa.finish, FinishReason::Length);
  int prefill_steps = 0;
  for (auto& b : s.fake->history()) {
    bool b_prefill = false, a_decode = false;
    int64_t n = 0;
    for (auto& r : b) {
      n += r.n;
      if (r.slot != slot_a && r.n > 1) b_prefill = true;
      if (r.slot == slot_a && r.n == 1) a_decode = true;
    }
    EXPECT_LE(n, 32);
    if (b_prefill) {
      ++prefill_steps;
      EXPECT_TRUE(a_decode) << "a prefill chunk of the long prompt ran without the other stream's decode token";
    }
  }
  EXPECT_GE(prefill_steps, 400 / 32);
}

TEST_P(EngineFake, SharedSystemPromptReusedOnEverySlot) {
  const bool rec = GetParam();
  std::mt19937 g(3);
  auto tok = make_test_tokenizer();
  const int32_t im_start = tok->find("<|im_start|>"), im_end = tok->find("<|im_end|>");
  ASSERT_GE(im_start, 0);
  ASSERT_GE(im_end, 0);
  std::vector<int32_t> sys = {im_start};
  for (int32_t t : random_tokens(g, 150)) sys.push_back(t);
  sys.push_back(im_end);
  auto user = [&](int i) {
    auto p = sys;
    p.push_back(im_start);
    for (int32_t t : random_tokens(g, 5 + i)) p.push_back(t);
    p.push_back(im_end);
    p.push_back(im_start);
    return p;
  };
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(user(i));
  auto cold = cold_outputs(rec, prompts, 8);
  auto s = make(rec, 4, 64);
  auto h0 = s.eng->submit(greedy(prompts[0], 8));
  EXPECT_EQ(collect(h0).tokens, cold[0]);
  std::vector<RequestHandle> hs;
  for (int i = 1; i < 5; ++i) hs.push_back(s.eng->submit(greedy(prompts[size_t(i)], 8)));
  for (int i = 1; i < 5; ++i) {
    auto o = collect(hs[size_t(i - 1)]);
    EXPECT_GE(o.t.cache_n, int64_t(sys.size())) << "request " << i;
    EXPECT_EQ(o.tokens, cold[size_t(i)]) << "request " << i;
  }
  // All four ran at once, so at least three of them were restored into other slots from the cache.
  auto m = s.eng->metrics();
  EXPECT_GE(m.cache_requests_hit, 4u);
  EXPECT_GE(m.cache_tokens_reused, 4 * sys.size());
}

TEST_P(EngineFake, NextTurnReusesPromptAndAnswer) {
  const bool rec = GetParam();
  std::mt19937 g(4);
  auto tok = make_test_tokenizer();
  const int32_t im_start = tok->find("<|im_start|>"), im_end = tok->find("<|im_end|>");
  std::vector<int32_t> p1 = {im_start};
  for (int32_t t : random_tokens(g, 70)) p1.push_back(t);
  p1.push_back(im_end);
  p1.push_back(im_start);
  // np = 1 and an unrelated request between the turns: turn 2 must come from the prefix cache.
  auto s = make(rec, 1, 64);
  auto h1 = s.eng->submit(greedy(p1, 20));
  auto o1 = collect(h1);
  ASSERT_EQ(o1.tokens.size(), 20u);
  auto hx = s.eng->submit(greedy(random_tokens(g, 40), 4));
  collect(hx);
  auto p2 = p1;
  p2.insert(p2.end(), o1.tokens.begin(), o1.tokens.end());
  p2.push_back(im_end);
  p2.push_back(im_start);
  for (int32_t t : random_tokens(g, 12)) p2.push_back(t);
  auto h2 = s.eng->submit(greedy(p2, 10));
  auto o2 = collect(h2);
  // The answer's last token was sampled but never fed: the state covers p1 + 19 tokens.
  EXPECT_GE(o2.t.cache_n, int64_t(p1.size()) + 19);
  EXPECT_EQ(o2.t.prompt_n, int64_t(p2.size()) - o2.t.cache_n);
  auto cold = cold_outputs(rec, {p2}, 10);
  EXPECT_EQ(o2.tokens, cold[0]);
  // Regenerate (same prompt): reused up to the last snapshot <= P-1, same output.
  auto h3 = s.eng->submit(greedy(p2, 10));
  auto o3 = collect(h3);
  EXPECT_EQ(o3.tokens, cold[0]);
  EXPECT_GT(o3.t.cache_n, int64_t(p1.size()));
}

TEST_P(EngineFake, StopStringSplitAcrossTokensIsNeverEmitted) {
  const bool rec = GetParam();
  auto tok = make_test_tokenizer();
  const std::string text = "The kiln is hot and the clay is ready. A potter shapes the bowl on the wheel.";
  auto forced = tok->encode(text, {.add_special = false, .parse_special = false});
  ASSERT_GT(forced.size(), 6u);
  // A stop string made of the end of one token's piece and the start of the next one.
  size_t k = 0;
  std::string stop;
  for (k = 2; k + 1 < forced.size(); ++k) {
    auto a = tok->token_to_piece(forced[k]), b = tok->token_to_piece(forced[k + 1]);
    if (a.size() >= 2 && b.size() >= 2) {
      stop = a.substr(a.size() - 2) + b.substr(0, 2);
      break;
    }
  }
  ASSERT_FALSE(stop.empty());
  const std::string full = tok->decode(forced);
  const size_t at = full.find(stop);
  ASSERT_NE(at, std::string::npos);
  std::mt19937 g(5);
  auto prompt = random_tokens(g, 12);
  const size_t P = prompt.size();
  auto script = [forced, P](const std::vector<int32_t>& toks) -> int32_t {
    const size_t i = toks.size() - P;
    return i < forced.size() ? forced[i] : -1;
  };
  auto s = make(rec, 2, 64, -1, 0, script);
  Request r = greedy(prompt, 100);
  r.stop = {"never appears at all", stop};
  auto h = s.eng->submit(r);
  auto o = collect(h);
  EXPECT_EQ(o.finish, FinishReason::Stop);
  EXPECT_EQ(o.stop_word, stop);
  EXPECT_EQ(o.text, full.substr(0, at));
  EXPECT_EQ(o.text.find(stop), std::string::npos);
  // A stop string that begins to match but never completes: nothing is lost.
  Request r2 = greedy(prompt, int32_t(forced.size()));
  r2.stop = {"the clay is cold"};
  auto h2 = s.eng->submit(r2);
  auto o2 = collect(h2);
  EXPECT_EQ(o2.finish, FinishReason::Length);
  EXPECT_EQ(o2.text, full);
  // Each event's text arrives as held-back text is released: every prefix is a prefix of the full text.
  EXPECT_EQ(o2.tokens, forced);
}

TEST_P(EngineFake, EndOfGenerationAndStopTokens) {
  const bool rec = GetParam();
  auto tok = make_test_tokenizer();
  const int32_t eog = tok->eog_ids().front();
  const std::string text = "Thank you for your help!";
  auto forced = tok->encode(text, {.add_special = false, .parse_special = false});
  std::mt19937 g(6);
  auto prompt = random_tokens(g, 8);
  const size_t P = prompt.size(), F = forced.size();
  auto script = [forced, eog, P, F](const std::vector<int32_t>& toks) -> int32_t {
    const size_t i = toks.size() - P;
    return i < F ? forced[i] : i == F ? eog : (i == F + 3 ? 777 : -1);
  };
  auto s = make(rec, 1, 64, -1, 0, script);
  auto h = s.eng->submit(greedy(prompt, 50));
  auto o = collect(h);
  EXPECT_EQ(o.finish, FinishReason::Stop);
  ASSERT_EQ(o.tokens.size(), F + 1);
  EXPECT_EQ(o.tokens.back(), eog);
  EXPECT_EQ(o.text, text);  // the end-of-generation token adds no text
  Request r = greedy(prompt, 50);
  r.ignore_eos = true;
  r.stop_tokens = {777};
  auto h2 = s.eng->submit(r);
  auto o2 = collect(h2);
  EXPECT_EQ(o2.finish, FinishReason::Stop);
  ASSERT_EQ(o2.tokens.size(), F + 4);
  EXPECT_EQ(o2.tokens[F], eog);
  EXPECT_EQ(o2.tokens[F + 3], 777);
}

TEST_P(EngineFake, CancellationFreesTheSlot) {
  const bool rec = GetParam();
  std::mt19937 g(7);
  auto s = make(rec, 1, 64, -1, 2);
  auto ha = s.eng->submit(greedy(random_tokens(g, 10), -1));
  ASSERT_TRUE(ha.next(std::chrono::milliseconds(10000)).has_value());
  auto hq = s.eng->submit(greedy(random_tokens(g, 10), 3));  // queued behind a
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(s.eng->metrics().queue_length, 1);
  const auto t0 = std::chrono::steady_clock::now();
  ha.cancel();
  auto oa = collect(ha);
  EXPECT_EQ(oa.finish, FinishReason::Cancelled);
  auto oq = collect(hq);
  EXPECT_EQ(oq.finish, FinishReason::Length);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // Dropping a handle cancels too.
  {
    auto hd = s.eng->submit(greedy(random_tokens(g, 10), -1));
    ASSERT_TRUE(hd.next(std::chrono::milliseconds(10000)).has_value());
  }
  auto he = s.eng->submit(greedy(random_tokens(g, 10), 3));
  EXPECT_EQ(collect(he).finish, FinishReason::Length);
  auto m = s.eng->metrics();
  EXPECT_EQ(m.requests_cancelled, 2u);
  EXPECT_EQ(m.busy_slots, 0);
}

TEST_P(EngineFake, QueueIsFifoWhenSlotsAreBusy) {
  const bool rec = GetParam();
  std::mt19937 g(8);
  auto s = make(rec, 2, 64, -1, 1);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 6; ++i) hs.push_back(s.eng->submit(greedy(random_tokens(g, 5), 6)));
  std::vector<double> queue_ms;
  for (auto& h : hs) {
    auto o = collect(h);
    EXPECT_EQ(o.finish, FinishReason::Length);
    queue_ms.push_back(o.t.queue_ms);
  }
  // Admission in submission order: later requests waited at least as long (pairs of two slots).
  EXPECT_LT(queue_ms[1], queue_ms[2]);
  EXPECT_LT(queue_ms[3], queue_ms[4]);
  EXPECT_EQ(s.eng->metrics().requests_finished, 6u);
}

TEST_P(EngineFake, SeedDeterminism) {
  const bool rec = GetParam();
  std::mt19937 g(9);
  auto prompt = random_tokens(g, 20);
  auto s = make(rec, 2, 64);
  auto run = [&](uint64_t seed) {
    Request r;
    r.prompt = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0;
    r.sampling.seed = seed;
    r.max_tokens = 30;
    auto h = s.eng->submit(r);
    return collect(h).tokens;
  };
  auto a = run(42), b = run(42), c = run(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_P(EngineFake, LogprobsOfGreedyTokens) {
  const bool rec = GetParam();
  std::mt19937 g(10);
  auto s = make(rec, 1, 64);
  Request r = greedy(random_tokens(g, 10), 5);
  r.n_probs = 3;
  auto h = s.eng->submit(r);
  auto o = collect(h);
  ASSERT_EQ(o.outs.size(), 5u);
  for (auto& t : o.outs) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].id, t.id);
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob.logprob);
    EXPECT_LE(t.logprob.logprob, 0.f);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
  }
}

TEST_P(EngineFake, BadRequestsGetAnErrorEvent) {
  const bool rec = GetParam();
  auto s = make(rec, 1, 64);
  auto h1 = s.eng->submit(greedy({}, 5));
  auto o1 = collect(h1);
  EXPECT_EQ(o1.finish, FinishReason::Error);
  EXPECT_NE(o1.error.find("prompt"), std::string::npos);
  auto h2 = s.eng->submit(greedy(std::vector<int32_t>(600, 400), 5));
  EXPECT_EQ(collect(h2).finish, FinishReason::Error);
  auto h3 = s.eng->submit(greedy({1, 2, 99999}, 5));
  auto o3 = collect(h3);
  EXPECT_EQ(o3.finish, FinishReason::Error);
  EXPECT_NE(o3.error.find("99999"), std::string::npos);
  // A request that hits the context end finishes with length.
  std::mt19937 g(11);
  auto h4 = s.eng->submit(greedy(random_tokens(g, 500), -1));
  auto o4 = collect(h4);
  EXPECT_EQ(o4.finish, FinishReason::Length);
  EXPECT_EQ(int64_t(o4.tokens.size()), 512 - 500 + 1);
}

// Random traffic: prompts sharing random prefixes (conversations, shared system prompts), submitted
// in waves onto 3 slots with a prefix cache far smaller than the traffic (constant eviction), some
// requests cancelled mid-way. Every completed output must equal its cold run.
TEST_P(EngineFake, RandomTrafficUnderEvictionMatchesCold) {
  const bool rec = GetParam();
  std::mt19937 g(13);
  auto tok = make_test_tokenizer();
  const int32_t im_start = tok->find("<|im_start|>");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 18; ++i) {
    std::vector<int32_t> p;
    if (!prompts.empty() && g() % 4 != 0) {
      const auto& base = prompts[g() % prompts.size()];
      p.assign(base.begin(), base.begin() + std::ptrdiff_t(g() % base.size()));
    }
    const int extra = 1 + int(g() % 40);
    for (int k = 0; k < extra; ++k) p.push_back(g() % 8 == 0 ? im_start : 300 + int32_t(g() % 600));
    if (p.size() > 300) p.resize(300);
    prompts.push_back(p);
  }
  auto cold = cold_outputs(rec, prompts, 6);
  const int64_t ram = 6000;  // a few blocks and states at most
  auto s = make(rec, 3, 32, ram);
  for (size_t w = 0; w < prompts.size(); w += 6) {
    std::vector<RequestHandle> hs;
    std::vector<size_t> idx;
    for (size_t i = w; i < std::min(prompts.size(), w + 6); ++i) {
      hs.push_back(s.eng->submit(greedy(prompts[i], 6)));
      idx.push_back(i);
    }
    if (w == 6) hs[1].cancel();
    for (size_t j = 0; j < hs.size(); ++j) {
      auto o = collect(hs[j]);
      if (o.finish == FinishReason::Cancelled) continue;
      EXPECT_EQ(o.tokens, cold[idx[j]]) << "prompt " << idx[j] << " (cache_n " << o.t.cache_n << ")";
    }
    EXPECT_LE(s.eng->metrics().cache_bytes, uint64_t(ram));
  }
  auto m = s.eng->metrics();
  EXPECT_GT(m.cache_evictions, 0u);
  EXPECT_GT(m.cache_requests_hit, 0u);
}

// The server can ask for snapshots where it knows prompts will diverge (no control tokens here).
TEST(EngineFakeRecurrent, SnapshotAtServerPositions) {
  std::mt19937 g(14);
  auto shared = random_tokens(g, 50);
  auto mk = [&](int n) {
    auto p = shared;
    for (int32_t t : random_tokens(g, n)) p.push_back(t);
    return p;
  };
  auto pa = mk(7), pb = mk(9), pc = mk(5);
  auto s = make(true, 2, 64);
  Request a = greedy(pa, 3);
  a.snapshot_at = {50};
  auto ha = s.eng->submit(a);
  collect(ha);
  auto hb = s.eng->submit(greedy(pb, 3));
  auto ob = collect(hb);
  EXPECT_EQ(ob.t.cache_n, 50);
  EXPECT_EQ(ob.tokens, cold_outputs(true, {pb}, 3)[0]);
  // Without a snapshot there, a recurrent model can only reuse block-interval states (64 > 50): none.
  auto s2 = make(true, 2, 64);
  auto ha2 = s2.eng->submit(greedy(pa, 3));
  collect(ha2);
  auto hc = s2.eng->submit(greedy(pc, 3));
  EXPECT_EQ(collect(hc).t.cache_n, 0);
}

// The server tokenizes and detokenizes on HTTP threads while the engine runs.
TEST(EngineFakeThreads, TokenizerIsUsableFromManyThreadsDuringGeneration) {
  auto s = make(false, 2, 64, -1, 1);
  std::mt19937 g(12);
  auto h = s.eng->submit(greedy(random_tokens(g, 10), 200));
  const auto& tok = s.eng->tokenizer();
  std::vector<std::string> texts;
  for (int i = 0; i < 16; ++i)
    texts.push_back("The potter " + std::to_string(i * 7919) + " shapes <|im_start|>the bowl, and the kiln is hot!");
  std::vector<std::vector<int32_t>> want;
  for (auto& t : texts) want.push_back(tok.encode(t));
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = tok.encode(texts[i]);
          if (ids != want[i] || tok.decode(ids) != tok.decode(want[i])) ++bad;
        }
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(collect(h).finish, FinishReason::Length);
}

INSTANTIATE_TEST_SUITE_P(AttentionAndRecurrent, EngineFake, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "recurrent" : "attention"; });
