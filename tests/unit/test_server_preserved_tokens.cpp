// tests/unit/test_server_preserved_tokens.cpp — tool-call markers that the vocabulary has as
// control tokens (llama-server's preserved tokens): found by the server (server/constraint.h),
// allowed by the tool_choice grammar as the one token the model writes them with (and still as
// text), and detokenized as their text. Vocabulary: llama.cpp's Qwen3.5 file
// (../shared/data/vocab/ggml-vocab-qwen35.gguf) with Mistral's markers added as control tokens.
#include <gtest/gtest.h>

#include <cstdlib>

#include "chat/tool_grammar.h"
#include "engine/grammar.h"
#include "engine/grammar_matcher.h"
#include "gguf/reader.h"
#include "model/vocab_loader.h"
#include "server/constraint.h"
#include "tokenizer/tokenizer.h"

using namespace kiln;
using tokenizer::Tokenizer;

namespace {

std::unique_ptr<Tokenizer> mistral_marked_qwen35() {
  const char* e = std::getenv("KILN_SOURCE_DIR");
  auto file = gguf::File::open(std::string(e ? e : KILN_SOURCE_DIR) + "/../shared/data/vocab/ggml-vocab-qwen35.gguf");
  if (!file.ok()) return nullptr;
  auto v = model::load_vocab(**file);
  if (!v.ok()) return nullptr;
  for (const char* t : {"[TOOL_CALLS]", "[ARGS]"}) {
    v->tokens.push_back(t);
    if (!v->types.empty()) v->types.push_back(tokenizer::TokenType::Control);
    if (!v->scores.empty()) v->scores.push_back(0.0f);
  }
  auto t = Tokenizer::create(std::move(*v));
  return t.ok() ? std::move(*t) : nullptr;
}

bool allowed(const uint64_t* mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

std::shared_ptr<const engine::Grammar> tool_grammar(bool mistral_args) {
  auto req = chat::parse_chat_request(chat::ojson::parse(R"({
      "messages": [{"role": "user", "content": "Weather?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                 "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}],
      "tool_choice": "required", "parallel_tool_calls": false})"));
  EXPECT_TRUE(req.ok());
  chat::ToolGrammarOptions o;
  o.format = chat::ToolCallFormat::MistralToolCalls;
  o.mistral_args = mistral_args;
  o.parallel = false;
  auto text = chat::tool_call_gbnf(*req, o);
  EXPECT_TRUE(text.ok());
  auto g = engine::Grammar::parse(*text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return *g;
}

TEST(PreservedTokens, MarkersThatAreControlTokens) {
  auto tok = mistral_marked_qwen35();
  if (!tok) GTEST_SKIP() << "needs ../shared/data/vocab/ggml-vocab-qwen35.gguf";
  const int32_t tc = tok->find("[TOOL_CALLS]"), args = tok->find("[ARGS]");
  ASSERT_GE(tc, 0);
  ASSERT_TRUE(tok->is_control(tc));
  EXPECT_EQ(server::preserved_marker_tokens(*tok, chat::ToolCallFormat::MistralToolCalls), (std::vector<int32_t>{tc, args}));
  // Kimi's markers are not in this vocabulary; Qwen's <tool_call> is text here (not control).
  EXPECT_TRUE(server::preserved_marker_tokens(*tok, chat::ToolCallFormat::KimiK2).empty());
  for (int32_t id : server::preserved_marker_tokens(*tok, chat::ToolCallFormat::HermesJson)) EXPECT_TRUE(tok->is_control(id));
}

TEST(PreservedTokens, TheGrammarTakesTheMarkerToken) {
  auto tok = mistral_marked_qwen35();
  if (!tok) GTEST_SKIP() << "needs ../shared/data/vocab/ggml-vocab-qwen35.gguf";
  const int32_t tc = tok->find("[TOOL_CALLS]"), args = tok->find("[ARGS]");
  const std::vector<int32_t> preserved = server::preserved_marker_tokens(*tok, chat::ToolCallFormat::MistralToolCalls);
  engine::GrammarCache cache(tok.get(), {}, tok->n_tokens());
  // Nemo's JSON array form: the first token may be the control token [TOOL_CALLS].
  {
    engine::GrammarMatcher m(cache.get(tool_grammar(false), preserved));
    EXPECT_TRUE(allowed(m.mask(), tc));
    EXPECT_FALSE(allowed(m.mask(), args));  // not where the grammar is
    ASSERT_TRUE(m.accept_token(tc));
    EXPECT_TRUE(m.accept_bytes(R"([{"name": "get_weather", "arguments": {"city": "Paris"}}])"));
    EXPECT_TRUE(m.can_end());
    // Still as text, too.
    engine::GrammarMatcher t(cache.get(tool_grammar(false), preserved));
    EXPECT_TRUE(t.accept_bytes("[TOOL_CALLS]"));
  }
  // Without preserving, the control token is never allowed (the old behaviour: spelled out only).
  {
    engine::GrammarMatcher m(cache.get(tool_grammar(false)));
    EXPECT_FALSE(allowed(m.mask(), tc));
    EXPECT_FALSE(m.accept_token(tc));
    EXPECT_TRUE(m.accept_bytes("[TOOL_CALLS]"));
  }
  // NAME[ARGS]{…}: both markers as their tokens.
  {
    engine::GrammarMatcher m(cache.get(tool_grammar(true), preserved));
    ASSERT_TRUE(m.accept_token(tc));
    ASSERT_TRUE(m.accept_bytes("get_weather"));
    EXPECT_TRUE(allowed(m.mask(), args));
    ASSERT_TRUE(m.accept_token(args));
    EXPECT_TRUE(m.accept_bytes(R"({"city": "Oslo"})"));
    EXPECT_TRUE(m.can_end());
  }
}

TEST(PreservedTokens, DetokenizedAsText) {
  auto tok = mistral_marked_qwen35();
  if (!tok) GTEST_SKIP() << "needs ../shared/data/vocab/ggml-vocab-qwen35.gguf";
  const int32_t tc = tok->find("[TOOL_CALLS]");
  tokenizer::StreamDecoder plain(*tok), kept(*tok, false, {tc});
  EXPECT_EQ(plain.push(tc), "");
  EXPECT_EQ(kept.push(tc), "[TOOL_CALLS]");
}

}  // namespace
