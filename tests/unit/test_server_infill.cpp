// tests/unit/test_server_infill.cpp — POST /infill's fields and FIM prompt layout (server/infill.h)
// on llama.cpp's Qwen3.5 vocabulary (../shared/data/vocab/ggml-vocab-qwen35.gguf) with Qwen's FIM
// tokens added, found by their text (no tokenizer.ggml.fim_*_token_id keys).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "gguf/reader.h"
#include "model/vocab_loader.h"
#include "server/infill.h"

using namespace kiln;
using namespace kiln::server;
using tokenizer::Tokenizer;
using tokenizer::Vocab;

namespace {

std::string vocab_path() {
  const char* e = std::getenv("KILN_SOURCE_DIR");
  return std::string(e ? e : KILN_SOURCE_DIR) + "/../shared/data/vocab/ggml-vocab-qwen35.gguf";
}

// llama.cpp's vocabulary-only qwen35 file holds the base tokens only; Qwen's FIM tokens (added
// tokens of the real models, as `kiln gguf gen` writes them) are appended by text, without
// tokenizer.ggml.fim_*_token_id keys, so that the tokenizer must find them as llama.cpp does.
Vocab qwen35_vocab() {
  auto file = gguf::File::open(vocab_path());
  if (!file.ok()) return {};
  auto v = model::load_vocab(**file);
  if (!v.ok()) return {};
  for (const char* t : {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}) {
    v->tokens.push_back(t);
    if (!v->types.empty()) v->types.push_back(tokenizer::TokenType::UserDefined);
    if (!v->scores.empty()) v->scores.push_back(0.0f);
  }
  return std::move(*v);
}

std::unique_ptr<Tokenizer> make(Vocab v) {
  auto t = Tokenizer::create(std::move(v));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> enc(const Tokenizer& t, const std::string& s, bool special = false) {
  tokenizer::EncodeOptions eo;
  eo.add_special = false;
  eo.parse_special = special;
  return t.encode(s, eo);
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

InfillParams parse_ok(const json& body) {
  InfillParams p;
  auto e = parse_infill_params(body, 300000, p);
  EXPECT_FALSE(e) << (e ? e->message : "");
  return p;
}

class Infill : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(vocab_path()).good()) GTEST_SKIP() << "shared vocab missing: " << vocab_path();
    tok = make(qwen35_vocab());
    ASSERT_TRUE(tok);
    const Vocab& v = tok->vocab();
    ASSERT_EQ(v.fim_pre, tok->find("<|fim_prefix|>"));
    ASSERT_EQ(v.fim_suf, tok->find("<|fim_suffix|>"));
    ASSERT_EQ(v.fim_mid, tok->find("<|fim_middle|>"));
    ASSERT_EQ(v.fim_rep, tok->find("<|repo_name|>"));
    ASSERT_EQ(v.fim_sep, tok->find("<|file_sep|>"));
    ASSERT_NE(v.fim_pre, tokenizer::kNoToken);
  }
  std::unique_ptr<Tokenizer> tok;
};

}  // namespace

TEST_F(Infill, RepoLevelLayout) {
  const Vocab& v = tok->vocab();
  InfillParams p = parse_ok({{"input_prefix", "def add(a, b):\n    "},
                             {"input_suffix", "\n\nprint(add(1, 2))\n"},
                             {"input_extra", {{{"filename", "util.py"}, {"text", "X = 1\n"}}, {{"text", "Y = 2\n"}}}},
                             {"prompt", "return"}});
  InfillLimits lim;
  lim.n_batch = 2048;
  lim.n_ctx = 8192;
  lim.n_predict = 16;
  const auto ids = infill_prompt_ids(p, *tok, lim);
  const auto want = cat({{v.fim_rep}, enc(*tok, "myproject\n"), {v.fim_sep}, enc(*tok, "util.py\n"), enc(*tok, "X = 1\n"),
                         {v.fim_sep}, enc(*tok, "tmp\n"), enc(*tok, "Y = 2\n"), {v.fim_sep}, enc(*tok, "filename\n"),
                         {v.fim_pre}, enc(*tok, "def add(a, b):\n    "), enc(*tok, "return", true), {v.fim_suf},
                         enc(*tok, "\n\nprint(add(1, 2))\n"), {v.fim_mid}});
  EXPECT_EQ(ids, want);

  lim.spm = true;  // --spm-infill: the suffix part first
  const auto spm = infill_prompt_ids(p, *tok, lim);
  const auto want_spm = cat({{v.fim_rep}, enc(*tok, "myproject\n"), {v.fim_sep}, enc(*tok, "util.py\n"), enc(*tok, "X = 1\n"),
                             {v.fim_sep}, enc(*tok, "tmp\n"), enc(*tok, "Y = 2\n"), {v.fim_sep}, enc(*tok, "filename\n"),
                             {v.fim_suf}, enc(*tok, "\n\nprint(add(1, 2))\n"), {v.fim_pre},
                             enc(*tok, "def add(a, b):\n    "), enc(*tok, "return", true), {v.fim_mid}});
  EXPECT_EQ(spm, want_spm);
}

TEST_F(Infill, SpecialTextInPrefixIsNotParsed) {
  // input_prefix / input_suffix are text (llama-server tokenizes them without special tokens);
  // the prompt is parsed for special tokens.
  InfillParams p = parse_ok({{"input_prefix", "<|fim_middle|>"}, {"input_suffix", ""}, {"prompt", "<|im_end|>"}});
  const auto ids = infill_prompt_ids(p, *tok, {2048, 8192, 16, false});
  const Vocab& v = tok->vocab();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), v.fim_mid), 1);  // only the closing one
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->find("<|im_end|>")), 1);
}

TEST_F(Infill, TruncatesLikeLlamaServer) {
  const Vocab& v = tok->vocab();
  std::string prefix, suffix;
  for (int i = 0; i < 400; ++i) prefix += " p" + std::to_string(i);
  for (int i = 0; i < 400; ++i) suffix += " s" + std::to_string(i);
  InfillParams p = parse_ok({{"input_prefix", prefix},
                             {"input_suffix", suffix},
                             {"input_extra", {{{"filename", "a.py"}, {"text", prefix}}}},
                             {"prompt", "xy"}});
  InfillLimits lim{64, 200, 20, false};  // prefix ≤ 48 tokens, suffix ≤ 16 - (2 + prompt), extra ≤ 200-64-40
  const auto ids = infill_prompt_ids(p, *tok, lim);
  const auto pre = enc(*tok, prefix), suf = enc(*tok, suffix), prompt = enc(*tok, "xy", true);
  const auto pre_at = std::find(ids.begin(), ids.end(), v.fim_pre);
  const auto suf_at = std::find(ids.begin(), ids.end(), v.fim_suf);
  ASSERT_NE(pre_at, ids.end());
  ASSERT_NE(suf_at, ids.end());
  EXPECT_EQ(size_t(pre_at - ids.begin()), size_t(200 - 64 - 40));  // the extra context's last tokens
  const std::vector<int32_t> kept_pre(pre_at + 1, suf_at);
  EXPECT_EQ(kept_pre, cat({std::vector<int32_t>(pre.end() - 48, pre.end()), prompt}));
  const std::vector<int32_t> kept_suf(suf_at + 1, ids.end() - 1);
  const size_t n_suf = 16 - (2 + prompt.size());
  EXPECT_EQ(kept_suf, std::vector<int32_t>(suf.begin(), suf.begin() + n_suf));
  // No room for extra context at all: none.
  const auto tight = infill_prompt_ids(p, *tok, {64, 64, 20, false});
  EXPECT_EQ(tight.front(), v.fim_pre);
}

TEST_F(Infill, SnippetSeparatorWithoutFileSepToken) {
  Vocab v = qwen35_vocab();
  // Hide the repo / file-separator tokens' texts so that neither key nor fallback finds them.
  v.tokens[size_t(tok->find("<|repo_name|>"))] = "<|repo_name_x|>";
  v.tokens[size_t(tok->find("<|file_sep|>"))] = "<|file_sep_x|>";
  auto t = make(std::move(v));
  ASSERT_TRUE(t);
  ASSERT_EQ(t->vocab().fim_sep, tokenizer::kNoToken);
  InfillParams p = parse_ok({{"input_prefix", "a"}, {"input_suffix", "b"}, {"input_extra", {{{"text", "CTX"}}}}});
  const auto ids = infill_prompt_ids(p, *t, {2048, 8192, 16, false});
  const auto want = cat({enc(*t, "\n\n--- snippet ---\n\n"), enc(*t, "CTX"), {t->vocab().fim_pre}, enc(*t, "a"),
                         {t->vocab().fim_suf}, enc(*t, "b"), {t->vocab().fim_mid}});
  EXPECT_EQ(ids, want);
}

TEST_F(Infill, SupportErrorNamesMissingTokens) {
  EXPECT_FALSE(infill_support_error(tok->vocab()));
  Vocab v = tok->vocab();
  v.fim_suf = tokenizer::kNoToken;
  v.fim_mid = tokenizer::kNoToken;
  auto e = infill_support_error(v);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 501);
  EXPECT_EQ(e->type, "not_supported_error");
  EXPECT_NE(e->message.find("suffix token (tokenizer.ggml.fim_suf_token_id)"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("middle token (tokenizer.ggml.fim_mid_token_id)"), std::string::npos) << e->message;
  EXPECT_EQ(e->message.find("prefix token"), std::string::npos) << e->message;
}

TEST(InfillParams, ErrorsNameTheField) {
  struct Case {
    json body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {{{"input_suffix", ""}}, "input_prefix"},
      {{{"input_prefix", ""}}, "input_suffix"},
      {{{"input_prefix", 3}, {"input_suffix", ""}}, "input_prefix"},
      {{{"input_prefix", {1, true}}, {"input_suffix", ""}}, "input_prefix[1]"},
      {{{"input_prefix", {1, 999999}}, {"input_suffix", ""}}, "input_prefix[1]"},
      {{{"input_prefix", ""}, {"input_suffix", ""}, {"input_extra", "x"}}, "input_extra"},
      {{{"input_prefix", ""}, {"input_suffix", ""}, {"input_extra", {{{"filename", "a"}}}}}, "input_extra[0].text"},
      {{{"input_prefix", ""}, {"input_suffix", ""}, {"input_extra", {{{"text", "a"}, {"filename", 1}}}}},
       "input_extra[0].filename"},
      {{{"input_prefix", ""}, {"input_suffix", ""}, {"prompt", {1, 2}}}, "prompt"},
  };
  for (const auto& c : cases) {
    InfillParams p;
    auto e = parse_infill_params(c.body, 1000, p);
    ASSERT_TRUE(e) << c.body.dump();
    EXPECT_EQ(e->param, c.field) << c.body.dump() << " → " << e->message;
    EXPECT_EQ(e->status, 400);
  }
  InfillParams p;
  EXPECT_FALSE(parse_infill_params({{"input_prefix", {"x", 5, 6, "y"}}, {"input_suffix", ""}}, 1000, p));
  ASSERT_EQ(p.input_prefix.size(), 3u);
  EXPECT_EQ(p.input_prefix[1].ids, (std::vector<int32_t>{5, 6}));
}
