// Constrained decoding with speculative decoding and with the prefix cache (engine_spec.cpp's
// finish_draft, engine.cpp's grammar steps) on a tiny generated qwen35 model with an MTP block:
//   - greedy requests with a JSON-schema grammar (chat::json_schema_to_gbnf) and a GBNF grammar give
//     the same tokens with --spec-type ngram-simple and draft-mtp as without speculation, alone and
//     3 slots at once; seeded sampling too; every output is derived by its grammar; drafts are made;
//   - synthetic acceptance of every draft token (rates 1): drafts are cut where the grammar rejects
//     them, so every drafted token is accepted and the output still derives from the grammar (without
//     the cut, a rejected token would be emitted and the request would fail);
//   - the prefix cache: the same long prompt again, a longer prompt sharing it, and a second turn that
//     holds the first constrained answer are served from the cache (cache_n > 0) and answer exactly
//     what a cold engine answers, with and without speculation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/json_schema.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine_spec_util.h"
#include "../model/model_test_util.h"

using namespace kiln;
using namespace kiln::engine;
using namespace kiln::engine::spec_test;

namespace {

std::unique_ptr<Engine> open(int np, SpecOptions spec, int64_t cache_ram = 0) {
  return open_engine(test::generated_model("kiln-engine-spec-grammar-test", "tiny-qwen35-mtp", gguf::GgmlType::Q8_0, 17),
                     np, std::move(spec), cache_ram);
}

SpecOptions ngram(int n_max = 4) {
  SpecOptions s;
  s.type = SpecType::NgramSimple;
  s.n_max = n_max;
  s.ngram_n = 1;
  return s;
}

SpecOptions mtp(int n_max = 3) {
  SpecOptions s;
  s.type = SpecType::DraftMtp;
  s.n_max = n_max;
  s.p_min = 0;  // a random-weight MTP head is never confident
  return s;
}

SpecOptions spec_of(const std::string& kind) { return kind == "ngram" ? ngram() : mtp(); }

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 24}, "note": {"type": "string", "maxLength": 24},
  "n": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}},
  "required": ["name", "note", "n", "ok"], "additionalProperties": false})";

const char* kGbnf = R"g(root ::= "[" item ("," " "? item){0,5} "]"
item ::= "\"" [^"\\\x00-\x1F]{1,20} "\"" | [0-9]{1,3} | "true" | "false")g";

struct Case {
  std::string name;
  std::shared_ptr<const Grammar> g;
  std::string examples;  // texts in the grammar's language: the prompt holds them (n-gram drafts copy them)
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  auto gbnf = chat::json_schema_to_gbnf(chat::ojson::parse(kSchema), "json_schema");
  EXPECT_TRUE(gbnf.ok());
  auto gs = Grammar::parse(gbnf.value());
  EXPECT_TRUE(gs.ok()) << (gs.ok() ? "" : gs.error().message);
  cs.push_back({"schema", *gs,
                R"({"name": "alpha beta", "note": "one two", "n": 12, "ok": true})"
                R"({"name":"gamma","note":"three four five","n":7,"ok":false})"});
  auto gg = Grammar::parse(kGbnf);
  EXPECT_TRUE(gg.ok()) << (gg.ok() ? "" : gg.error().message);
  cs.push_back({"gbnf", *gg, R"(["alpha beta", 12, true, "one two"] ["gamma",7,false,"three"])"});
  return cs;
}

// A prompt of the case's examples and some ordinary tokens (seeded): n-gram drafts find matches in it.
std::vector<int32_t> prompt(const Engine& e, const Case& c, uint32_t seed, int extra = 8) {
  std::vector<int32_t> p = random_prompt(seed, extra);
  auto ex = e.tokenizer().encode(c.examples);
  p.insert(p.end(), ex.begin(), ex.end());
  auto more = random_prompt(seed + 1000, 4);
  p.insert(p.end(), more.begin(), more.end());
  return p;
}

Request greq(std::vector<int32_t> p, const Case& c, float temp = 0, uint32_t seed = 1) {
  Request r = req(std::move(p), 160, temp, seed);
  r.ignore_eos = false;  // with a grammar the end token is allowed where the grammar is complete
  r.grammar = c.g;
  return r;
}

// The output ended by itself (the grammar is complete) and its text derives from the grammar; a
// schema's output parses as JSON with the schema's fields.
void expect_derived(const Out& o, const Case& c, const std::string& what) {
  EXPECT_EQ(o.finish, FinishReason::Stop) << what << ": " << o.error << " | " << o.text;
  EXPECT_TRUE(c.g->matches(o.text)) << what << ": '" << o.text << "'";
  if (c.name == "schema" && o.finish == FinishReason::Stop) {
    auto j = nlohmann::json::parse(o.text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << what << ": " << o.text;
    EXPECT_EQ(j.size(), 4u) << o.text;
    EXPECT_TRUE(j["name"].is_string() && j["note"].is_string() && j["ok"].is_boolean()) << o.text;
    EXPECT_TRUE(j["n"].is_number_integer() && j["n"].get<int>() >= 0 && j["n"].get<int>() <= 999) << o.text;
    EXPECT_LE(j["name"].get<std::string>().size(), 24u * 4);
  }
}

class EngineSpecGrammar : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineSpecGrammar, GreedyEqualsPlainAloneAndBatched) {
  const auto cs = cases();
  auto plain = open(1, {});
  auto spec = open(1, spec_of(GetParam()));
  auto batched = open(3, spec_of(GetParam()));
  for (const Case& c : cs) {
    std::vector<std::vector<int32_t>> base;
    std::vector<std::vector<int32_t>> prompts;
    int64_t drafted = 0, accepted = 0;
    for (uint32_t s = 0; s < 3; ++s) {
      prompts.push_back(prompt(*plain, c, s));
      auto hp = plain->submit(greq(prompts.back(), c));
      const Out op = collect(hp);
      expect_derived(op, c, c.name + " plain " + std::to_string(s));
      base.push_back(op.tokens);
      auto hs = spec->submit(greq(prompts.back(), c));
      const Out os = collect(hs);
      EXPECT_EQ(os.tokens, op.tokens) << c.name << " prompt " << s;
      expect_derived(os, c, c.name + " spec " + std::to_string(s));
      drafted += os.t.draft_n;
      accepted += os.t.draft_n_accepted;
    }
    std::printf("[%s/%s] alone: %lld drafted, %lld accepted\n", GetParam().c_str(), c.name.c_str(), (long long)drafted,
                (long long)accepted);
    EXPECT_GT(drafted, 0) << c.name << ": no draft was verified, the test does not exercise speculation";
    // The three at once: their drafts are verified in the same steps, each against its own matcher.
    std::vector<RequestHandle> hs;
    for (auto& p : prompts) hs.push_back(batched->submit(greq(p, c)));
    int64_t bd = 0;
    for (size_t s = 0; s < hs.size(); ++s) {
      const Out o = collect(hs[s]);
      EXPECT_EQ(o.tokens, base[s]) << c.name << " batched prompt " << s;
      expect_derived(o, c, c.name + " batched " + std::to_string(s));
      bd += o.t.draft_n;
    }
    EXPECT_GT(bd, 0) << c.name;
  }
}

TEST_P(EngineSpecGrammar, SeededSamplingEqualsPlain) {
  const auto cs = cases();
  auto plain = open(1, {});
  auto spec = open(1, spec_of(GetParam()));
  for (const Case& c : cs) {
    int64_t drafted = 0;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      const auto p = prompt(*plain, c, 20 + seed);
      auto a = plain->submit(greq(p, c, 1.0f, seed));
      auto b = spec->submit(greq(p, c, 1.0f, seed));
      const Out oa = collect(a), ob = collect(b);
      EXPECT_EQ(oa.tokens, ob.tokens) << c.name << " seed " << seed;
      expect_derived(ob, c, c.name + " seed " + std::to_string(seed));
      drafted += ob.t.draft_n;
    }
    EXPECT_GT(drafted, 0) << c.name;
  }
}

// Synthetic acceptance emits draft tokens without sampling them: accepting every one (rates 1) puts
// exactly the cut drafts into the output. Every drafted token must be accepted and the output must
// still derive from the grammar.
TEST_P(EngineSpecGrammar, SyntheticAcceptanceKeepsTheOutputInTheGrammar) {
  const auto cs = cases();
  SpecOptions so = spec_of(GetParam());
  so.synth_rates.assign(size_t(so.n_max), 1.0);
  auto e = open(2, so);
  for (const Case& c : cs) {
    int64_t drafted = 0;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      auto h = e->submit(greq(prompt(*e, c, 40 + seed), c, seed % 2 ? 0.0f : 1.0f, seed));
      const Out o = collect(h);
      expect_derived(o, c, c.name + " synthetic " + std::to_string(seed));
      EXPECT_EQ(o.t.draft_n_accepted, o.t.draft_n) << c.name;
      drafted += o.t.draft_n;
    }
    std::printf("[%s/%s] synthetic: %lld drafted\n", GetParam().c_str(), c.name.c_str(), (long long)drafted);
    EXPECT_GT(drafted, 0) << c.name;
  }
}

// The prefix cache under constrained requests: a long prompt, the same prompt again, a longer prompt
// sharing it, and a second turn holding the first constrained answer. Each answer equals a cold
// engine's; the repeated ones are served from the cache. The grammar of each request starts at its
// own output (the cached tokens, the earlier answer included, are prompt).
class EngineGrammarCache : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineGrammarCache, PrefixCacheHitsAnswerAsColdRuns) {
  const auto cs = cases();
  for (const Case& c : cs) {
    auto warm = open(2, GetParam() == "none" ? SpecOptions{} : spec_of(GetParam()), int64_t(64) << 20);
    std::vector<int32_t> p1;
    for (uint32_t s = 0; s < 3; ++s) {
      auto q = prompt(*warm, c, 60 + s);
      p1.insert(p1.end(), q.begin(), q.end());
    }
    auto cold = [&](const std::vector<int32_t>& p) {
      auto e = open(1, {});
      auto h = e->submit(greq(p, c));
      const Out o = collect(h);
      EXPECT_EQ(o.t.cache_n, 0);
      return o;
    };
    const Out c1 = cold(p1);
    expect_derived(c1, c, c.name + " cold 1");
    auto h1 = warm->submit(greq(p1, c));
    const Out w1 = collect(h1);
    EXPECT_EQ(w1.tokens, c1.tokens) << c.name;
    // The same prompt again answers the same (a hybrid model reuses a recurrent state only at a cached
    // position before the prompt's end, so this one need not hit the cache).
    auto h1b = warm->submit(greq(p1, c));
    const Out w1b = collect(h1b);
    EXPECT_EQ(w1b.tokens, c1.tokens) << c.name;
    expect_derived(w1b, c, c.name + " warm 1 again");
    // A longer prompt sharing the first: served from the cache, answered as a cold engine answers it.
    std::vector<int32_t> p2 = p1;
    auto tail = random_prompt(77, 10);
    p2.insert(p2.end(), tail.begin(), tail.end());
    // The second turn: the first answer (constrained) is now prompt, then more.
    std::vector<int32_t> p3 = p1;
    p3.insert(p3.end(), c1.tokens.begin(), c1.tokens.end() - (c1.tokens.empty() ? 0 : 1));  // without the end token
    p3.insert(p3.end(), tail.begin(), tail.end());
    for (const auto* p : {&p2, &p3}) {
      const Out co = cold(*p);
      auto h = warm->submit(greq(*p, c));
      const Out wo = collect(h);
      EXPECT_GT(wo.t.cache_n, int64_t(p1.size()) / 2) << c.name << ": not served from the cache";
      EXPECT_EQ(wo.tokens, co.tokens) << c.name << (p == &p2 ? " longer prompt" : " second turn");
      expect_derived(wo, c, c.name + (p == &p2 ? " longer prompt" : " second turn"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, EngineSpecGrammar, ::testing::Values("ngram", "mtp"));
INSTANTIATE_TEST_SUITE_P(Tiny, EngineGrammarCache, ::testing::Values("none", "ngram", "mtp"));

}  // namespace
