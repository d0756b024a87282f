// Grammar engine tests: GBNF parsing and its errors, the compiled grammar (Grammar::matches, a
// direct stack simulation) against hand-written expectations, the lazily built automaton against
// Grammar::matches, token masks against a brute-force check of every token, and the engine running
// requests with grammars over the fake model (every output is derived by its grammar).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/grammar_matcher.h"
#include "engine_fake.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

std::shared_ptr<const Grammar> G(std::string_view text) {
  auto g = Grammar::parse(text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return g.ok() ? *g : nullptr;
}

std::string parse_error(std::string_view text) {
  auto g = Grammar::parse(text);
  return g.ok() ? std::string("(parsed)") : g.error().message;
}

// A JSON grammar written the way llama.cpp's json.gbnf is (our own text).
const char* kJson = R"g(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,4})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)g";

}  // namespace

TEST(Grammar, ParseErrorsNameTheLineAndTheProblem) {
  EXPECT_EQ(parse_error("root ::= \"a\"\nitem = \"b\"\n"), "grammar: line 2, column 6: expected '::=' after rule name 'item'");
  EXPECT_EQ(parse_error("root ::= item\n"), "grammar: rule 'item' (used on line 1) is not defined");
  EXPECT_EQ(parse_error("item ::= \"x\"\n"), "grammar: there is no 'root' rule (the start symbol)");
  EXPECT_EQ(parse_error("root ::= \"abc\n"), "grammar: line 1, column 14: unterminated literal (end of the line)");
  EXPECT_EQ(parse_error("root ::= [a-z\n"), "grammar: line 1, column 14: unterminated character class (end of the line)");
  EXPECT_EQ(parse_error("root ::= \"\\q\"\n"), "grammar: line 1, column 12: unknown escape \\q");
  EXPECT_EQ(parse_error("root ::= \"\\x4\"\n"), "grammar: line 1, column 14: escape \\x needs 2 hex digits");
  EXPECT_EQ(parse_error("root ::= [z-a]\n"), "grammar: line 1, column 14: character range U+7A-U+61 is reversed");
  EXPECT_EQ(parse_error("root ::= * \"a\"\n"), "grammar: line 1, column 10: repetition operator '*' without a preceding item");
  EXPECT_EQ(parse_error("root ::= (\"a\" \"b\"\n"), "grammar: line 2, column 1: expected ')', got the end of the grammar");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,1}\n"), "grammar: line 1, column 17: repetition {3,1}: the maximum is below the minimum");
  EXPECT_EQ(parse_error("root ::= \"a\"{2000}\n"), "grammar: line 1, column 17: repetition count above 1000 is not supported");
  EXPECT_EQ(parse_error("root ::= \"a\" $\n"), "grammar: line 1, column 14: unexpected '$'");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\"\n"), "grammar: line 2, column 10: rule 'root' is defined twice (first on line 1)");
  EXPECT_EQ(parse_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n"),
            "grammar: rule 'expr' is left-recursive (it can derive itself without consuming input); rewrite it with repetition");
  // Left recursion through a nullable prefix is found too.
  EXPECT_NE(parse_error("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\"?\n").find("left-recursive"), std::string::npos);
  // A rule definition must start its own line.
  EXPECT_EQ(parse_error("root ::= \"a\" b ::= \"c\"\n"), "grammar: line 1, column 15: rule 'b' must start on a new line");
}

TEST(Grammar, LiteralsClassesAndRepetitions) {
  auto g = G(R"g(root ::= "ab" [0-9]+ ("x" | "yz")? [^a-c]{2,3} "!")g");
  ASSERT_TRUE(g);
  for (const char* s : {"ab1dd!", "ab123xdef!", "ab9yzZZ!", "ab0  !"}) EXPECT_TRUE(g->matches(s)) << s;
  for (const char* s : {"ab", "abdd!", "ab1a!!", "ab1ddddd!", "ab1xyzdd!", "Ab1dd!", "ab1dd"}) EXPECT_FALSE(g->matches(s)) << s;

  auto rep = G(R"g(root ::= "a"{2} "b"{1,} "c"{0,2} ("de"){3})g");
  ASSERT_TRUE(rep);
  EXPECT_TRUE(rep->matches("aabdedede"));
  EXPECT_TRUE(rep->matches("aabbbccdedede"));
  EXPECT_FALSE(rep->matches("abdedede"));
  EXPECT_FALSE(rep->matches("aabcccdedede"));
  EXPECT_FALSE(rep->matches("aabdede"));
  // Repetition applies to the whole preceding literal.
  auto lit = G(R"g(root ::= "ab"*)g");
  EXPECT_TRUE(lit->matches(""));
  EXPECT_TRUE(lit->matches("abab"));
  EXPECT_FALSE(lit->matches("aba"));
}

TEST(Grammar, EscapesUnicodeAndAnyChar) {
  auto g = G(R"g(root ::= "\x41\u00e9\U0001F600\n\t\"\\" [\u0100-\u017F] . "é")g");
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->matches("Aé😀\n\t\"\\Ā€é"));
  EXPECT_TRUE(g->matches("Aé😀\n\t\"\\ſxé"));
  EXPECT_FALSE(g->matches("Aé😀\n\t\"\\a€é"));    // 'a' is outside [Ā-ſ]
  EXPECT_FALSE(g->matches("Aé😀\n\t\"\\Ā\xC3é"));  // a lone lead byte is not a character
  // Negated classes match every codepoint outside them, in 1 to 4 UTF-8 bytes, never surrogates.
  auto neg = G(R"g(root ::= [^a]+)g");
  for (const char* s : {"b", "é", "€", "😀", "\x7F", "zé€😀"}) EXPECT_TRUE(neg->matches(s)) << s;
  for (const char* s : {"a", "ba", "\xED\xA0\x80", "\xC0\x80", "\xF4\x90\x80\x80", "\x80"}) EXPECT_FALSE(neg->matches(s)) << s;
  // Every codepoint boundary of the UTF-8 lengths, inside and outside a range that spans them.
  auto span = G(R"g(root ::= [\u007F-\U00010000])g");
  for (uint32_t cp : {0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFu, 0x1000u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u}) {
    std::string s;
    if (cp < 0x80) s += char(cp);
    else if (cp < 0x800) s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000) s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    else s += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    EXPECT_TRUE(span->matches(s)) << std::hex << cp;
  }
  EXPECT_FALSE(span->matches("~"));                  // U+7E
  EXPECT_FALSE(span->matches("\xF0\x90\x80\x81"));  // U+10001
}

TEST(Grammar, CommentsNewlinesAndContinuationLines) {
  auto g = G("# a comment\nroot ::= a # trailing\n  | b\n\na ::= \"x\" (\n  \"y\"\n  | \"z\"\n)\nb ::= \"w\"\n");
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->matches("xy"));
  EXPECT_TRUE(g->matches("xz"));
  EXPECT_TRUE(g->matches("w"));
  EXPECT_FALSE(g->matches("x"));
}

TEST(Grammar, JsonGrammar) {
  auto g = G(kJson);
  ASSERT_TRUE(g);
  for (const char* s : {"{}", "{ }", R"g({"a": 1})g", R"g({"a":[1,2,{"b":null}],"c":"\u00e9\n"})g", R"g({"x": -0.5e10})g",
                        R"g({"k": "é😀"})g", "{\n  \"a\": true\n}"})
    EXPECT_TRUE(g->matches(s)) << s;
  for (const char* s : {"", "[]", "{", R"g({"a"})g", R"g({"a": 01})g", R"g({"a": "\x"})g", R"g({'a': 1})g", R"g({"a": 1,})g"})
    EXPECT_FALSE(g->matches(s)) << s;
}

// The automaton agrees with the direct simulation on random strings: dead exactly when no
// continuation exists, accepting exactly when the string is in the language.
TEST(GrammarAutomaton, AgreesWithTheDirectSimulation) {
  const char* grammars[] = {
      kJson,
      R"g(root ::= ("a" | "ab" | b)* "c"?
b ::= "b" b? "a")g",
      R"g(root ::= [a-c]{1,3} ("," [a-c]{1,3})*)g",
      R"g(root ::= x
x ::= "(" x ")" x | "")g",
  };
  std::mt19937 rng(7);
  for (const char* text : grammars) {
    auto g = G(text);
    ASSERT_TRUE(g);
    auto trie = TokenTrie::build(std::vector<std::string>{"a"}, {});
    GrammarAutomaton a(g, trie);
    const std::string alphabet = text == grammars[0] ? std::string("{}[]\":,1-. aetrunl\\") : std::string("abc,()");
    int accepted = 0;
    for (int it = 0; it < 3000; ++it) {
      std::string s;
      const int n = int(rng() % 9);
      for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
      const uint32_t st = a.advance(a.start(), s);
      const bool in = g->matches(s);
      ASSERT_EQ(st != GrammarAutomaton::kDead && a.accepting(st), in) << text << " | " << s;
      accepted += in;
      // A live state can always be completed: some extension of s is in the language.
      if (st != GrammarAutomaton::kDead && !a.accepting(st)) {
        bool found = false;
        for (int tries = 0; tries < 200 && !found; ++tries) {
          std::string t = s;
          uint32_t q = st;
          for (int k = 0; k < 12 && q != GrammarAutomaton::kDead && !a.accepting(q); ++k) {
            std::vector<char> ok;
            for (char c : alphabet)
              if (a.next(q, uint8_t(c)) != GrammarAutomaton::kDead) ok.push_back(c);
            if (ok.empty()) break;
            const char c = ok[rng() % ok.size()];
            t += c;
            q = a.next(q, uint8_t(c));
          }
          found = q != GrammarAutomaton::kDead && a.accepting(q) && g->matches(t);
        }
        if (text != grammars[0]) {
          EXPECT_TRUE(found) << "no completion of '" << s << "' found in " << text;
        }
      }
    }
    EXPECT_GT(accepted, 0) << text;
  }
}

// Masks: bit t set exactly when the token's bytes continue the grammar (brute force over every
// token), EOG exactly when the grammar is complete; tokens with empty text never.
TEST(GrammarAutomaton, MasksEqualBruteForce) {
  std::vector<std::string> pieces = {"{", "}", "{\"", "\"", "\":", ":", " ", "\n", ",", "a", "ab", "abc", "\"a", "\"ab\"",
                                     "1", "12", "-", ".", "e", "true", "tr", "null", "[", "]", "[]", "{}", "é", "\xC3",
                                     "\xA9", "😀", "\xF0\x9F", "\x98\x80", "\\", "\\u", "00e9", "\"}", "\"]", "", "<eos>"};
  const int32_t eos = int32_t(pieces.size() - 1);
  auto trie = TokenTrie::build(pieces, {eos});
  auto g = G(kJson);
  GrammarAutomaton a(g, trie);
  std::mt19937 rng(3);
  int checked_states = 0;
  for (int run = 0; run < 40; ++run) {
    uint32_t s = a.start();
    std::string text;
    for (int step = 0; step < 30; ++step) {
      const uint64_t* m = a.mask(s);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < int32_t(pieces.size()); ++t) {
        const bool bit = (m[t >> 6] >> (t & 63)) & 1;
        bool expect;
        if (t == eos) expect = a.accepting(s) && g->matches(text);
        else expect = !pieces[size_t(t)].empty() && a.advance(s, pieces[size_t(t)]) != GrammarAutomaton::kDead;
        ASSERT_EQ(bit, expect) << "token '" << pieces[size_t(t)] << "' after '" << text << "'";
        if (bit) allowed.push_back(t);
      }
      ++checked_states;
      if (allowed.empty()) break;
      const int32_t t = allowed[rng() % allowed.size()];
      if (t == eos) break;
      s = a.next_token(s, t);
      text += pieces[size_t(t)];
      ASSERT_NE(s, GrammarAutomaton::kDead);
    }
  }
  EXPECT_GT(checked_states, 200);
  // The mask of a state is cached: asking again computes nothing.
  const size_t before = a.masks_computed();
  a.mask(a.start());
  EXPECT_EQ(a.masks_computed(), before);
}

TEST(GrammarAutomaton, StringCharactersReturnToTheSameState) {
  auto g = G(kJson);
  auto trie = TokenTrie::build(std::vector<std::string>{"x"}, {});
  GrammarAutomaton a(g, trie);
  const uint32_t s = a.advance(a.start(), "{\"ab");
  ASSERT_NE(s, GrammarAutomaton::kDead);
  EXPECT_EQ(a.advance(s, "cdefé😀"), s);  // tail calls keep the stacks flat: one state for the loop
  EXPECT_EQ(a.advance(s, "\\n"), s);
}

TEST(GrammarMatcher, AcceptRejectAndEnd) {
  std::vector<std::string> pieces = {"yes", "no", "y", "es", "n", "o", "!", "", "<eos>"};
  auto trie = TokenTrie::build(pieces, {8});
  GrammarCache cache(trie);
  auto g = G(R"g(root ::= ("yes" | "no") "!"?)g");
  GrammarMatcher m(cache.get(g));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_token(6));  // "!" first: rejected, position unchanged
  EXPECT_FALSE(m.accept_token(7));  // empty text: never
  EXPECT_FALSE(m.accept_token(8));  // EOG before the grammar is complete
  EXPECT_TRUE(m.accept_token(2));   // "y"
  EXPECT_TRUE(m.accept_token(3));   // "es"
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.done());
  const uint64_t* mk = m.mask();
  EXPECT_EQ(mk[0], (uint64_t(1) << 6) | (uint64_t(1) << 8));  // "!" or the end
  EXPECT_TRUE(m.accept_token(6));
  EXPECT_TRUE(m.done());
  // The same grammar text gives the same automaton.
  EXPECT_EQ(&cache.get(G(R"g(root ::= ("yes" | "no") "!"?)g"))->grammar(), &cache.get(g)->grammar());
}

TEST(SamplerMask, OnlyAllowedTokensAreDrawn) {
  const int n = 1000;
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(static_cast<size_t>(n));
  for (auto& x : logits) x = nd(g);
  std::vector<uint64_t> mask((n + 63) / 64, 0);
  std::set<int> allowed;
  for (int i = 0; i < n; ++i)
    if (g() % 10 == 0) {
      mask[size_t(i) >> 6] |= uint64_t(1) << (i & 63);
      allowed.insert(i);
    }
  int best = *allowed.begin();
  for (int i : allowed)
    if (logits[size_t(i)] > logits[size_t(best)]) best = i;
  SamplingParams gp;
  gp.temperature = 0;
  EXPECT_EQ(Sampler(gp, n).sample(logits.data(), mask.data()), best);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.seed = 9;
  Sampler s(sp, n);
  std::map<int, int> seen;
  for (int k = 0; k < 3000; ++k) {
    const int t = s.sample(logits.data(), mask.data());
    ASSERT_TRUE(allowed.count(t)) << t;
    ++seen[t];
  }
  // The most likely allowed token is drawn most often (its renormalised probability is the largest).
  int most = seen.begin()->first;
  for (auto [t, c] : seen)
    if (c > seen[most]) most = t;
  EXPECT_EQ(most, best);
}

// ------------------------------------------------------------------------------------------------
// The engine with grammars (fake model: its logits are hashes, so without the mask the output
// would be arbitrary tokens).

namespace {

struct Out {
  std::string text;
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  std::string error;
};

Out run(Engine& e, Request r) {
  auto h = e.submit(std::move(r));
  Out o;
  for (;;) {
    auto ev = h.next(std::chrono::milliseconds(20000));
    if (!ev) break;
    o.text += ev->text;
    for (auto& t : ev->tokens) o.tokens.push_back(t.id);
    if (ev->final()) {
      o.finish = ev->finish;
      o.error = ev->error;
      break;
    }
  }
  return o;
}

std::unique_ptr<Engine> fake_engine(int slots) {
  auto tok = kiln::engine::testing::make_test_tokenizer(1024);
  kiln::engine::testing::FakeRunner::Opts fo;
  fo.n_vocab = tok->n_tokens();
  fo.n_ctx = 512;
  fo.slots = slots;
  fo.n_batch = 64;
  ModelInfo mi;
  mi.arch = "fake";
  mi.n_vocab = fo.n_vocab;
  mi.eog_ids = tok->eog_ids();
  EngineOptions eo;
  eo.n_parallel = slots;
  eo.n_ubatch = 64;
  auto e = Engine::create(std::make_unique<kiln::engine::testing::FakeRunner>(fo), std::move(tok), mi, eo);
  KILN_CHECK(e.ok(), "engine");
  return std::move(*e);
}

}  // namespace

TEST(EngineGrammar, EveryOutputIsDerivedByItsGrammar) {
  auto e = fake_engine(4);
  auto json = G(kJson);
  auto small = G(R"g(root ::= "{\"n\": " [1-9] [0-9]{0,3} ", \"ok\": " ("true" | "false") "}")g");
  int complete = 0;
  std::vector<std::thread> th;
  std::mutex mu;
  for (int i = 0; i < 16; ++i) {
    th.emplace_back([&, i] {
      Request r;
      r.prompt = {300, 301, int32_t(302 + i)};
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 0;
      r.sampling.top_p = 1.0f;
      r.sampling.min_p = 0.0f;
      r.sampling.seed = uint64_t(i);
      r.max_tokens = 200;
      r.grammar = i % 2 ? json : small;
      Out o = run(*e, r);
      std::lock_guard<std::mutex> lk(mu);
      EXPECT_NE(o.finish, FinishReason::Error) << o.error;
      if (i % 2 == 0) {
        // Finite grammar: always completes, and stops by itself once complete.
        EXPECT_EQ(o.finish, FinishReason::Stop);
        EXPECT_TRUE(small->matches(o.text)) << o.text;
      } else if (o.finish == FinishReason::Stop) {
        EXPECT_TRUE(json->matches(o.text)) << o.text;
      } else {
        // Cut by max_tokens: a prefix of a derivation (the automaton is still alive).
        auto trie = TokenTrie::build(std::vector<std::string>{"x"}, {});
        GrammarAutomaton a(json, trie);
        EXPECT_NE(a.advance(a.start(), o.text), GrammarAutomaton::kDead) << o.text;
      }
      complete += o.finish == FinishReason::Stop;
    });
  }
  for (auto& t : th) t.join();
  EXPECT_GE(complete, 8);
}

TEST(EngineGrammar, GreedyAndSeededRunsAreReproducible) {
  auto e = fake_engine(2);
  Request r;
  r.prompt = {400, 401};
  r.sampling.seed = 42;
  r.sampling.temperature = 1.0f;
  r.max_tokens = 60;
  r.grammar = G(kJson);
  Out a = run(*e, r), b = run(*e, r);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_FALSE(a.tokens.empty());
}

TEST(EngineGrammar, TriggerLeavesTheTextBeforeItFree) {
  auto tok = kiln::engine::testing::make_test_tokenizer(1024);
  // The trigger is one token's text; the fake model is scripted to emit that token as the 7th
  // generated one. Before it the output is free, after it the grammar holds.
  int32_t trig_id = -1;
  for (int32_t t = 300; t < tok->n_tokens() && trig_id < 0; ++t) {
    const std::string p = tok->token_to_piece(t, true);
    if (p.size() >= 3 && p.find_first_of("[]0123456789") == std::string::npos) trig_id = t;
  }
  ASSERT_GE(trig_id, 0);
  const std::string trig = tok->token_to_piece(trig_id, true);
  kiln::engine::testing::FakeRunner::Opts fo;
  fo.n_vocab = tok->n_tokens();
  fo.n_ctx = 512;
  fo.slots = 1;
  fo.n_batch = 64;
  fo.suppressed = tok->eog_ids();
  fo.script = [&](const std::vector<int32_t>& toks) { return toks.size() == 8 ? trig_id : -1; };
  ModelInfo mi;
  mi.arch = "fake";
  mi.n_vocab = fo.n_vocab;
  mi.eog_ids = tok->eog_ids();
  EngineOptions eo;
  auto tok2 = kiln::engine::testing::make_test_tokenizer(1024);
  auto e = Engine::create(std::make_unique<kiln::engine::testing::FakeRunner>(fo), std::move(tok2), mi, eo);
  ASSERT_TRUE(e.ok());
  auto g = G(R"g(root ::= "[" [0-9]{1,3} "]")g");
  for (int seed = 0; seed < 6; ++seed) {
    Request r;
    r.prompt = {500, 501};
    r.sampling.seed = uint64_t(seed);
    r.sampling.temperature = 1.0f;
    r.max_tokens = 120;
    r.grammar = g;
    r.grammar_trigger = trig;
    Out o = run(**e, r);
    ASSERT_EQ(o.finish, FinishReason::Stop) << o.error;
    ASSERT_GE(o.tokens.size(), 8u);
    std::string raw;
    for (int32_t t : o.tokens) raw += tok->token_to_piece(t, true);
    const size_t p = raw.find(trig);
    ASSERT_NE(p, std::string::npos);
    EXPECT_TRUE(g->matches(raw.substr(p + trig.size()))) << "after the trigger: '" << raw.substr(p + trig.size()) << "'";
    // The free part is the fake model's own choice: not derived by the grammar.
    EXPECT_FALSE(g->matches(raw.substr(0, p)));
  }
}

TEST(GrammarMatcher, NothingAllowedWhenNoTokenSpellsTheNextByte) {
  auto trie = TokenTrie::build(std::vector<std::string>{"a", "b", "<eos>"}, {2});
  GrammarCache cache(trie);
  GrammarMatcher m(cache.get(G(R"g(root ::= "a" "c")g")));
  EXPECT_TRUE(m.any_allowed());
  EXPECT_TRUE(m.accept_token(0));
  EXPECT_FALSE(m.any_allowed());  // the engine ends such a request with an error
}

TEST(GrammarCache, PreparedAutomatonIsAdoptedWithItsFirstMask) {
  // Engine::submit prepares a grammar's automaton on the submitting thread: the start state's mask is
  // computed there, and the engine's cache adopts the automaton so that its first step is a lookup.
  auto trie = TokenTrie::build(std::vector<std::string>{"a", "b", "ab", "<eos>"}, {3});
  GrammarCache cache(trie);
  auto g = G(R"g(root ::= "a" "b"*)g");
  auto p = cache.prepare(g, {});
  EXPECT_EQ(p->masks_computed(), 1u);
  GrammarAutomaton* raw = p.get();
  auto a = cache.get(g, {}, std::move(p));
  EXPECT_EQ(a.get(), raw);
  const uint64_t* m = a->mask(a->start());
  EXPECT_EQ(a->masks_computed(), 1u);  // cached: no second walk
  EXPECT_EQ(m[0] & 0xF, 0b0101u);      // "a" and "ab"
  // Once cached, another prepared automaton is not used (the cached one keeps its masks).
  auto q = cache.prepare(g, {});
  EXPECT_EQ(cache.get(g, {}, q).get(), raw);
  // An automaton prepared for another grammar is never adopted.
  GrammarCache other(trie);
  auto h = G(R"g(root ::= "b")g");
  auto wrong = other.prepare(h, {});
  EXPECT_NE(other.get(g, {}, wrong).get(), wrong.get());
}
