// Token masks through precomputed windows (GrammarAutomaton, window_depth > 0) against the
// reference, one walk of the whole vocabulary trie per state (mask_by_trie_walk, the former scheme):
// bit for bit, on every state of random generations over real vocabularies (llama.cpp's
// ggml-vocab-*.gguf in ../shared/data, skipped when absent), for JSON-schema grammars
// (chat/json_schema.h), the generic JSON grammar and GBNF with nested and recursive rules,
// repetitions, character classes and Unicode; window depths 1 (most tokens context-dependent)
// to 6, windows met lazily or precomputed, a window cache small enough to be dropped over and over. Plus small hand-checked cases and GrammarCache::prepare.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "chat/json_schema.h"
#include "engine/grammar.h"
#include "engine/grammar_matcher.h"
#include "gguf/reader.h"
#include "model/vocab_loader.h"
#include "tokenizer/tokenizer.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

std::string vocab_path(const std::string& name) {
  const char* e = std::getenv("KILN_SOURCE_DIR");
  return std::string(e ? e : KILN_SOURCE_DIR) + "/../shared/data/vocab/ggml-vocab-" + name + ".gguf";
}

// The vocabulary's trie, as the engine builds it (GrammarCache: token_to_piece of every id, EOG ids).
std::shared_ptr<const TokenTrie> vocab_trie(const std::string& name) {
  auto file = gguf::File::open(vocab_path(name));
  if (!file.ok()) return nullptr;
  auto v = model::load_vocab(**file);
  EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.error().message);
  if (!v.ok()) return nullptr;
  auto t = tokenizer::Tokenizer::create(std::move(*v));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  if (!t.ok()) return nullptr;
  return TokenTrie::build(**t, (*t)->eog_ids(), (*t)->n_tokens());
}

std::shared_ptr<const Grammar> G(std::string_view text) {
  auto g = Grammar::parse(text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return g.ok() ? *g : nullptr;
}

std::string schema_gbnf(const char* json) {
  auto g = chat::json_schema_to_gbnf(chat::ojson::parse(json), "schema");
  EXPECT_TRUE(g.ok()) << json;
  return g.ok() ? *g : std::string();
}

const char* kPerson = R"j({"type": "object",
 "properties": {
   "name": {"type": "string", "maxLength": 40},
   "age": {"type": "integer", "minimum": 0, "maximum": 130},
   "emails": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 3},
   "address": {"type": "object",
               "properties": {"street": {"type": "string", "maxLength": 60},
                              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
               "required": ["street", "zip"], "additionalProperties": false}},
 "required": ["name", "age", "address"], "additionalProperties": false})j";

const char* kMixed = R"j({"type": "object",
 "properties": {
   "kind": {"enum": ["red", "green", "rouge", 7, null]},
   "tag": {"const": "v1"},
   "score": {"type": "number"},
   "items": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string", "minLength": 2}]},
             "minItems": 1, "maxItems": 4},
   "meta": {"type": "object", "additionalProperties": {"type": "boolean"}},
   "any": {}},
 "required": ["kind", "items"]})j";

// Nested rules, recursion (a stack that deepens), repetitions, classes, Unicode.
const char* kExpr = R"g(
root ::= stmt ("; " stmt){0,3} "."
stmt ::= name " = " expr | "print(" expr ")"
expr ::= term ([-+*/] term)*
term ::= num | name | "(" expr ")" | "-" term
num  ::= [0-9]{1,4} ("." [0-9]+)?
name ::= [a-zA-Z_é] [a-zA-Z0-9_]{0,6}
)g";

const char* kUnicode = R"g(
root  ::= (greet | cjk | emoji | other){1,5}
greet ::= ("héllo" | "hello" | "Hallo" | "こんにちは") " "?
cjk   ::= [一-龥ぁ-んァ-ン]+ "。"
emoji ::= "😀" | "😀😀" | [\U0001F300-\U0001F5FF]
other ::= [^\x00-\x40\u00e9]{2,3} "\n"
)g";

const char* kLines = R"g(root ::= [^\n]+ "\n" ([^\n]* "\n")?)g";

const char* kJson = R"g(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,4})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)g";

struct Counts {
  int states = 0;
  size_t context_checks = 0;
};

// Random generations; at every step the windowed mask must equal the whole-trie walk of the same
// state. Tokens: uniform among the allowed ones half of the time, otherwise the shortest of 8
// uniform draws (short tokens close strings and structures, so the walks get around the grammar).
struct Config {
  int depth;
  bool precompute;
  size_t window_cache_bytes;
};

Counts compare(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenTrie>& trie, Config cfg,
               int gens, int steps, uint32_t seed) {
  const int depth = cfg.depth;
  const bool precompute = cfg.precompute;
  GrammarAutomaton::Options o;
  o.window_depth = depth;
  o.window_cache_bytes = cfg.window_cache_bytes;
  o.mask_cache_bytes = 0;  // every mask computed anew
  GrammarAutomaton a(g, trie, o);
  if (precompute) a.precompute();
  const size_t w = trie->words();
  std::vector<uint64_t> got(w), want(w);
  std::vector<int32_t> allowed;
  std::mt19937 rng(seed);
  Counts c;
  for (int gi = 0; gi < gens; ++gi) {
    uint32_t s = a.start();
    for (int k = 0; k < steps; ++k) {
      const uint64_t* m = a.mask(s);
      got.assign(m, m + w);
      a.mask_by_trie_walk(s, want.data());
      ++c.states;
      for (size_t i = 0; i < w; ++i)
        if (got[i] != want[i]) {
          const uint64_t diff = got[i] ^ want[i];
          const int32_t t = int32_t(i * 64 + size_t(__builtin_ctzll(diff)));
          ADD_FAILURE() << "window depth " << depth << (precompute ? " (precomputed)" : "") << ": token " << t << " '"
                        << trie->piece(t) << "' is " << ((got[i] >> (t & 63)) & 1 ? "allowed" : "refused")
                        << " by the windows, not by the trie walk; generation " << gi << " step " << k;
          return c;
        }
      allowed.clear();
      for (size_t i = 0; i < w; ++i)
        for (uint64_t b = got[i]; b; b &= b - 1) {
          const int32_t t = int32_t(i * 64 + size_t(__builtin_ctzll(b)));
          if (!trie->is_eog(t)) allowed.push_back(t);
        }
      if (allowed.empty() || a.only_end(s)) break;
      int32_t t = allowed[rng() % allowed.size()];
      if (rng() & 1)
        for (int r = 0; r < 8; ++r) {
          const int32_t u = allowed[rng() % allowed.size()];
          if (trie->piece(u).size() < trie->piece(t).size()) t = u;
        }
      s = a.next_token(s, t);
      if (s == GrammarAutomaton::kDead) {
        ADD_FAILURE() << "an allowed token was rejected by next_token";
        return c;
      }
    }
  }
  c.context_checks = a.context_checks();
  return c;
}

void compare_all(const char* vocab, int gens, int steps) {
  auto trie = vocab_trie(vocab);
  if (!trie) GTEST_SKIP() << "vocabulary not found at " << vocab_path(vocab) << " (shared data missing)";
  const std::string person = schema_gbnf(kPerson), mixed = schema_gbnf(kMixed), object = chat::json_object_gbnf();
  const std::pair<const char*, std::string> grammars[] = {
      {"person schema", person}, {"mixed schema", mixed}, {"json_object", object}, {"JSON", kJson},
      {"expressions", kExpr},    {"unicode", kUnicode},   {"lines", kLines},
  };
  uint32_t seed = 11;
  for (const auto& [name, text] : grammars) {
    SCOPED_TRACE(name);
    auto g = G(text);
    ASSERT_TRUE(g);
    size_t checks_shallow = 0;
    // Depth 2 with a window cache of 64 KiB: windows are dropped and reclassified all the time.
    for (const Config cfg : {Config{1, true, size_t(256) << 20}, Config{2, false, size_t(64) << 10},
                             Config{3, true, size_t(256) << 20}, Config{6, false, size_t(256) << 20}}) {
      SCOPED_TRACE("window depth " + std::to_string(cfg.depth));
      const Counts c = compare(g, trie, cfg, gens, steps, ++seed);
      if (::testing::Test::HasFailure()) return;
      EXPECT_GE(c.states, gens);
      if (cfg.depth == 1) checks_shallow = c.context_checks;
    }
    // One-position windows end inside almost every token: the context-dependent path is exercised.
    EXPECT_GT(checks_shallow, 0u);
  }
}

TEST(GrammarWindows, MasksEqualTheTrieWalkQwen35) { compare_all("qwen35", 6, 30); }
TEST(GrammarWindows, MasksEqualTheTrieWalkLlamaSpm) { compare_all("llama-spm", 6, 30); }
TEST(GrammarWindows, MasksEqualTheTrieWalkLlamaBpe) { compare_all("llama-bpe", 3, 30); }

// A token that runs past its window depends on what lies below: "a)" after "(" but not after "[".
TEST(GrammarWindows, ContextDecidesTokensThatLeaveTheWindow) {
  const std::vector<std::string> pieces = {"(", "[", "a", "aa", "a)", "a]", ")", "]", "aa)", ")a", "<eos>"};
  auto trie = TokenTrie::build(pieces, {10});
  auto g = G(R"g(root ::= "(" x ")" | "[" x "]"
x ::= "a" x | "")g");
  for (int depth : {1, 2}) {
    GrammarAutomaton::Options o;
    o.window_depth = depth;
    GrammarAutomaton a(g, trie, o);
    auto bits = [&](const char* text) {
      const uint64_t* m = a.mask(a.advance(a.start(), text));
      std::string out;
      for (int t = 0; t < int(pieces.size()); ++t)
        if ((m[0] >> t) & 1) out += pieces[size_t(t)] + ' ';
      return out;
    };
    EXPECT_EQ(bits(""), "( [ ");
    EXPECT_EQ(bits("("), "a aa a) ) aa) ");
    EXPECT_EQ(bits("[a"), "a aa a] ] ");
    EXPECT_EQ(bits("(a)"), "<eos> ");
    // Depth 1: x's window ends where ")" or "]" comes, below it. Depth 2 holds the whole stack: exact.
    if (depth == 1) EXPECT_GT(a.context_checks(), 0u);
    else EXPECT_EQ(a.context_checks(), 0u);
  }
}

// prepare() precomputes the windows of the reachable stacks: the states met afterwards classify no
// new window; once the cache holds the grammar, prepare() does nothing (returns nullptr).
TEST(GrammarWindows, PrepareClassifiesTheWindowsOnce) {
  std::vector<std::string> pieces;
  for (const char* p : {"{", "}", "\"", "\":", ",", " ", "a", "ab", "b\"", "1", "12", "\"a", "\"}", "true", "null"})
    pieces.push_back(p);
  pieces.push_back("<eos>");
  auto trie = TokenTrie::build(pieces, {int32_t(pieces.size() - 1)});
  GrammarCache cache(trie);
  auto g = G(kJson);
  auto p = cache.prepare(g, {});
  ASSERT_TRUE(p);
  const size_t windows = p->n_windows();
  EXPECT_GT(windows, 10u);
  auto a = cache.get(g, {}, std::move(p));
  GrammarMatcher m(a);
  for (int32_t t : {0, 11, 7, 3, 5, 11, 8, 1, 5}) {  // {"aab": "ab"} and a space
    const uint64_t* mask = m.mask();
    EXPECT_TRUE((mask[0] >> t) & 1) << pieces[size_t(t)];
    ASSERT_TRUE(m.accept_token(t)) << pieces[size_t(t)];
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(a->n_windows(), windows);
  EXPECT_EQ(cache.prepare(g, {}), nullptr);
  // The precompute stops at its budget of trie nodes: here after the first window.
  GrammarAutomaton b(g, trie);
  b.precompute(32768, 1);
  EXPECT_EQ(b.n_windows(), 1u);
}

}  // namespace
