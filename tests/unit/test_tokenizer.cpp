// Tokenizer tests: llama.cpp's vocab test vectors (oracle: llama.cpp's own tokenizer output in
// ../shared/data/vocab/*.out), streaming UTF-8 detokenization, special tokens, malformed vocabs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/read_file.h"
#include "gguf/reader.h"
#include "model/vocab_loader.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace kiln::tokenizer;
using kiln::read_file;

namespace {

std::string source_dir() {
  const char* e = std::getenv("KILN_SOURCE_DIR");
  return e ? e : KILN_SOURCE_DIR;
}
std::string vocab_dir() { return source_dir() + "/../shared/data/vocab"; }


std::unique_ptr<Tokenizer> load(const std::string& path) {
  auto file = kiln::gguf::File::open(path);
  EXPECT_TRUE(file.ok()) << (file.ok() ? "" : file.error().message);
  if (!file.ok()) return nullptr;
  auto v = kiln::model::load_vocab(**file);
  EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.error().message);
  if (!v.ok()) return nullptr;
  auto t = Tokenizer::create(std::move(*v));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  if (!t.ok()) return nullptr;
  return std::move(*t);
}

// Runs every string of <name>.inp and compares with <name>.out (no BOS, specials as text).
void check_vectors(const std::string& name, size_t expected_cases) {
  std::string base = vocab_dir() + "/ggml-vocab-" + name + ".gguf";
  std::string inp, outp;
  if (!read_file(base + ".inp", inp) || !read_file(base + ".out", outp))
    GTEST_SKIP() << "test vectors not found at " << base << " (shared data missing)";
  auto tok = load(base);
  ASSERT_TRUE(tok);

  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (true) {
    size_t k = inp.find(sep, pos);
    if (k == std::string::npos) break;
    texts.push_back(inp.substr(pos, k - pos));
    pos = k + sep.size();
  }
  std::vector<std::vector<TokenId>> expected;
  std::istringstream ls(outp);
  std::string line;
  while (std::getline(ls, line)) {
    std::istringstream is(line);
    std::vector<TokenId> ids;
    long x;
    while (is >> x) ids.push_back(TokenId(x));
    expected.push_back(ids);
  }
  ASSERT_EQ(texts.size(), expected.size()) << name;
  ASSERT_EQ(texts.size(), expected_cases) << name;
  size_t n_tokens = 0, n_ok = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto got = tok->encode(texts[i], {.add_special = false, .parse_special = false});
    n_tokens += expected[i].size();
    if (got == expected[i]) ++n_ok;
    EXPECT_EQ(got, expected[i]) << name << " case " << i << ": '" << texts[i] << "'";
    // round trip: detokenizing gives the text back (SPM drops the leading space it added)
    std::string back = tok->decode(got);
    if (tok->vocab().kind == ModelKind::Bpe && !tok->vocab().clean_spaces) {
      EXPECT_EQ(back, texts[i]) << name << " case " << i;
    }
  }
  std::printf("[vocab %s] %zu/%zu strings match, %zu expected tokens\n", name.c_str(), n_ok, texts.size(), n_tokens);
}

}  // namespace

TEST(TokenizerVectors, Qwen35) { check_vectors("qwen35", 50); }
TEST(TokenizerVectors, Qwen2) { check_vectors("qwen2", 46); }
TEST(TokenizerVectors, LlamaBpe) { check_vectors("llama-bpe", 46); }
TEST(TokenizerVectors, LlamaSpm) { check_vectors("llama-spm", 46); }

// ---------------------------------------------------------------------------------------------
// Synthetic vocabularies (small, hand-built; expected results follow from the definitions).

namespace {
// A tiny byte-level BPE vocab: all 256 byte characters + a few merges + specials.
Vocab tiny_bpe() {
  Vocab v;
  v.source = "tiny-bpe";
  v.kind = ModelKind::Bpe;
  v.model_name = "gpt2";
  v.pre = "qwen2";
  // byte-level characters: printable bytes are themselves; "Ġ" (U+0120) is the space byte
  // build the byte alphabet the same way a converter does
  int n = 0;
  std::vector<std::string> alpha(256);
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    alpha[size_t(b)] = utf8_encode(printable ? uint32_t(b) : uint32_t(256 + n++));
  }
  for (auto& a : alpha) v.tokens.push_back(a);
  v.tokens.push_back("he");       // 256
  v.tokens.push_back("ll");       // 257
  v.tokens.push_back("hell");     // 258
  v.tokens.push_back("hello");    // 259
  v.tokens.push_back("<|im_start|>");  // 260 control
  v.tokens.push_back("<|im_end|>");    // 261 control
  v.tokens.push_back("<tool>");        // 262 user-defined
  v.merges = {"h e", "l l", "he ll", "hell o"};
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.types[260] = TokenType::Control;
  v.types[261] = TokenType::Control;
  v.types[262] = TokenType::UserDefined;
  v.eos = 261;
  return v;
}

std::unique_ptr<Tokenizer> make(Vocab v) {
  auto t = Tokenizer::create(std::move(v));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t.ok() ? std::move(*t) : nullptr;
}
}  // namespace

TEST(TokenizerBpe, MergesByRank) {
  auto t = make(tiny_bpe());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello"), (std::vector<TokenId>{259}));
  EXPECT_EQ(t->encode("hell"), (std::vector<TokenId>{258}));
  // "hel": h+e → he (rank 0), then "he"+"l" has no merge
  EXPECT_EQ(t->encode("hel"), (std::vector<TokenId>{256, TokenId('l')}));
}

TEST(TokenizerSpecial, ParsedOrText) {
  auto t = make(tiny_bpe());
  ASSERT_TRUE(t);
  auto a = t->encode("<|im_start|>hello<|im_end|>");
  EXPECT_EQ(a, (std::vector<TokenId>{260, 259, 261}));
  auto b = t->encode("<|im_start|>hello", {.add_special = false, .parse_special = false});
  ASSERT_GT(b.size(), 2u);
  EXPECT_NE(b[0], 260);  // treated as text
  EXPECT_EQ(t->decode(b), "<|im_start|>hello");
  // user-defined tokens are matched even when specials are not parsed (llama.cpp behaviour)
  auto c = t->encode("<tool>hello", {.add_special = false, .parse_special = false});
  EXPECT_EQ(c, (std::vector<TokenId>{262, 259}));
  // detokenize: control tokens render only when asked
  EXPECT_EQ(t->token_to_piece(261, true), "<|im_end|>");
  EXPECT_EQ(t->token_to_piece(261, false), "");
  EXPECT_TRUE(t->is_eog(261));
  EXPECT_FALSE(t->is_eog(259));
}

TEST(TokenizerSpecial, LongestFirstAndOverlap) {
  Vocab v = tiny_bpe();
  v.tokens.push_back("<|im");  // 263, shorter control token overlapping <|im_start|>
  v.types.push_back(TokenType::Control);
  auto t = make(v);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("<|im<|im_start|>"), (std::vector<TokenId>{263, 260}));
}

TEST(TokenizerBpe, LongWordIsNotQuadratic) {
  auto t = make(tiny_bpe());
  ASSERT_TRUE(t);
  std::string s(200000, 'l');  // one pre-token of 200k bytes: "ll" merges only
  auto ids = t->encode(s, {.add_special = false});
  ASSERT_EQ(ids.size(), 100000u);
  for (TokenId id : ids) ASSERT_EQ(id, 257);
}

TEST(TokenizerBpe, InvalidUtf8InputDoesNotCrash) {
  auto t = make(tiny_bpe());
  ASSERT_TRUE(t);
  std::string bad = "he\xC3\x28ll\xFF\xE2\x82";
  auto ids = t->encode(bad);
  // every invalid byte becomes U+FFFD (EF BF BD), as llama.cpp does
  EXPECT_EQ(t->decode(ids), "he\xEF\xBF\xBD(ll\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------
TEST(Utf8, CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xE4"), 1u);          // 3-byte lead, nothing after
  EXPECT_EQ(utf8_complete_prefix("a\xE4\xB8"), 1u);      // 3-byte lead + 1 continuation
  EXPECT_EQ(utf8_complete_prefix("a\xE4\xB8\xAD"), 4u);  // complete 中
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98"), 1u);  // emoji missing last byte
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);          // stray continuation: emit (as U+FFFD)
}

TEST(StreamDecoder, NeverSplitsACharacter) {
  auto t = make(tiny_bpe());
  ASSERT_TRUE(t);
  // "中😀" as single byte tokens, pushed one at a time
  std::string text = "\xE4\xB8\xAD\xF0\x9F\x98\x80!";
  auto ids = t->encode(text, {.add_special = false});
  ASSERT_EQ(ids.size(), text.size());  // no merges for these bytes in the tiny vocab
  StreamDecoder sd(*t);
  std::vector<std::string> chunks;
  std::string all;
  for (TokenId id : ids) {
    std::string c = sd.push(id);
    // every chunk is valid UTF-8 on its own
    EXPECT_EQ(utf8_sanitize(c), c);
    if (!c.empty()) chunks.push_back(c);
    all += c;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0], "\xE4\xB8\xAD");
  EXPECT_EQ(chunks[1], "\xF0\x9F\x98\x80");
}

TEST(StreamDecoder, FlushReplacesUnfinished) {
  auto t = make(tiny_bpe());
  ASSERT_TRUE(t);
  auto ids = t->encode("\xE4\xB8\xAD", {.add_special = false});
  StreamDecoder sd(*t);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(StreamDecoder, SpmByteTokensAndSpaces) {
  std::string path = vocab_dir() + "/ggml-vocab-llama-spm.gguf";
  if (!std::ifstream(path)) GTEST_SKIP() << "shared vocab data missing: " << path;
  auto t = load(path);
  ASSERT_TRUE(t);
  std::string text = "Hello 🦙 world, 中文 text";
  auto ids = t->encode(text, {.add_special = true});
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);  // BOS
  StreamDecoder sd(*t);
  std::string all;
  for (size_t i = 1; i < ids.size(); ++i) {
    std::string c = sd.push(ids[i]);
    EXPECT_EQ(utf8_sanitize(c), c);
    all += c;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);  // the leading ▁ added by add_space_prefix is dropped
  EXPECT_EQ(t->decode(std::vector<TokenId>(ids.begin() + 1, ids.end())), text);
}

// ---------------------------------------------------------------------------------------------
// Malformed vocabularies: clear errors, never a crash or a negative index.
TEST(TokenizerMalformed, BadByteToken) {
  Vocab v;
  v.source = "bad.gguf";
  v.kind = ModelKind::Spm;
  v.tokens = {"<unk>", "<0x-1>", "a"};
  v.types = {TokenType::Unknown, TokenType::Byte, TokenType::Normal};
  v.scores = {0, 0, 0};
  auto t = Tokenizer::create(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("<0x-1>"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("bad.gguf"), std::string::npos);
}

TEST(TokenizerMalformed, BadMergeAndSizes) {
  Vocab v = tiny_bpe();
  v.merges.push_back("nospace");
  auto t = Tokenizer::create(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("tokenizer.ggml.merges"), std::string::npos) << t.error().message;

  Vocab w = tiny_bpe();
  w.scores = {1.0f};  // wrong length
  auto t2 = Tokenizer::create(w);
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.error().message.find("tokenizer.ggml.scores"), std::string::npos);

  Vocab x = tiny_bpe();
  x.tokens[5] = x.tokens[6];  // duplicate
  auto t3 = Tokenizer::create(x);
  ASSERT_FALSE(t3.ok());
  EXPECT_NE(t3.error().message.find("duplicate"), std::string::npos);

  Vocab y = tiny_bpe();
  y.pre = "no-such-pre";
  auto t4 = Tokenizer::create(y);
  ASSERT_FALSE(t4.ok());
  EXPECT_NE(t4.error().message.find("no-such-pre"), std::string::npos);

  Vocab z = tiny_bpe();
  z.add_bos = true;  // no BOS id
  EXPECT_FALSE(Tokenizer::create(z).ok());

  Vocab u = tiny_bpe();
  u.types[3] = TokenType(42);
  EXPECT_FALSE(Tokenizer::create(u).ok());

  Vocab e = tiny_bpe();
  e.tokens.clear();
  e.types.clear();
  EXPECT_FALSE(Tokenizer::create(e).ok());
}

TEST(TokenizerMalformed, MergeWithUnknownPartsIsIgnored) {
  Vocab v = tiny_bpe();
  v.merges.push_back("zz qq");  // parts not in the vocabulary: skipped with a warning
  auto t = make(v);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello"), (std::vector<TokenId>{259}));
}

TEST(TokenizerMalformed, OutOfRangeSpecialIdsAreDropped) {
  Vocab v = tiny_bpe();
  v.eos = 1 << 20;
  v.bos = -7;
  auto t = make(v);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab().bos, kNoToken);
  EXPECT_FALSE(t->is_eog(1 << 20));
  EXPECT_EQ(t->token_to_piece(-3), "");
  EXPECT_EQ(t->token_to_piece(1 << 20), "");
}

TEST(StreamDecoder, ByteLevelVocabMatchesDecode) {
  std::string path = vocab_dir() + "/ggml-vocab-qwen35.gguf";
  if (!std::ifstream(path)) GTEST_SKIP() << "shared vocab data missing: " << path;
  auto t = load(path);
  ASSERT_TRUE(t);
  // rare CJK characters and emoji are split over several byte-level tokens
  std::string text = "龘靐齉 𠀀𪚥 🦙🧑‍🚀 naïve café <|im_start|>user\n中文\n\n  end";
  auto ids = t->encode(text);
  StreamDecoder sd(*t, /*special=*/true);
  std::string all;
  size_t held = 0;
  for (TokenId id : ids) {
    std::string c = sd.push(id);
    EXPECT_EQ(utf8_sanitize(c), c);
    if (c.empty()) ++held;
    all += c;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_GT(held, 0u);  // some characters really were split across tokens
  // without special rendering the control token disappears
  StreamDecoder plain(*t);
  std::string p;
  for (TokenId id : ids) p += plain.push(id);
  p += plain.flush();
  EXPECT_EQ(p.find("<|im_start|>"), std::string::npos);
}
