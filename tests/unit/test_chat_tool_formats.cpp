// The block tool-call formats (chat/tool_formats.h) on the real templates of ../shared/data:
// detection from the template source; a round trip — the template renders an assistant turn with
// two tool calls, and OutputParser reads that rendered turn back as the same calls (whole, byte by
// byte and in random chunkings); the forced-call grammar (tool_choice required) compiles for each
// template's format, derives each format's canonical call text (read back as the same calls) and
// refuses a missing required argument or a closing marker inside a value.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "chat/output_parser.h"
#include "chat/tool_formats.h"
#include "chat/tool_grammar.h"
#include "engine/grammar.h"

using namespace kiln;
using kiln::chat::ojson;
using chat::ToolCallFormat;

namespace {

std::string template_path(const std::string& name) {
  const char* e = std::getenv("KILN_SOURCE_DIR");
  return std::string(e ? e : KILN_SOURCE_DIR) + "/../shared/data/chat-templates/" + name;
}

std::optional<std::string> read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const ojson kTools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object",
     "properties":{"city":{"type":"string","description":"the city"},"days":{"type":"integer","description":"days"}},
     "required":["city"]}}},
  {"type":"function","function":{"name":"search","description":"Web search","parameters":{"type":"object",
     "properties":{"query":{"type":"string","description":"the query"}},"required":["query"]}}}
])");

const std::vector<std::pair<std::string, ojson>> kCalls = {
    {"get_weather", {{"city", "Paris"}, {"days", 3}}},
    {"search", {{"query", "kiln tool calls"}}},
};

chat::ChatRequest make_request(bool with_calls, bool add_generation_prompt) {
  ojson msgs = ojson::array({{{"role", "user"}, {"content", "Weather in Paris, and search for kiln."}}});
  if (with_calls) {
    ojson calls = ojson::array();
    int i = 0;
    for (const auto& [name, args] : kCalls)
      calls.push_back({{"id", "call_" + std::to_string(i++)}, {"type", "function"},
                       {"function", {{"name", name}, {"arguments", args.dump()}}}});
    msgs.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}});
  }
  ojson body = {{"messages", msgs}, {"tools", kTools}, {"add_generation_prompt", add_generation_prompt}};
  auto r = chat::parse_chat_request(body);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return *r;
}

struct Case {
  std::string file;
  ToolCallFormat format;
  std::string trailer;  // what the template writes after the calls (end-of-turn markers): content
  // The assistant turn is the text after the generation prompt; a template whose generation prompt
  // is not a prefix of the next turn (Command R+ appends an instruction after the last user turn)
  // gives the turn as the text between `after` (its first occurrence after the user's message) and
  // the next `before`.
  std::string after = {}, before = {};
  // The trailer is an end-of-generation token that never reaches the parser (the engine stops on
  // it): cut from the turn before parsing (calls that run to the end of the output).
  bool cut_trailer = false;
};

const std::vector<Case> kCases = {
    {"deepseek-ai-DeepSeek-V3.1.jinja", ToolCallFormat::DeepseekV31, "<｜end▁of▁sentence｜>"},
    {"deepseek-ai-DeepSeek-V3.2.jinja", ToolCallFormat::DeepseekDsml, "<｜end▁of▁sentence｜>"},
    {"moonshotai-Kimi-K2.jinja", ToolCallFormat::KimiK2, "<|im_end|>"},
    {"Kimi-K2-Instruct.jinja", ToolCallFormat::KimiK2, "<|im_end|>"},
    {"GLM-4.7-Flash.jinja", ToolCallFormat::ArgKeyXml, "", "<|assistant|>", "<|user|>"},
    {"MiniMax-M1.jinja", ToolCallFormat::MiniMaxJson, "<end_of_sentence>"},
    {"meetkai-functionary-medium-v3.1.jinja", ToolCallFormat::FunctionaryV31, "<|eom_id|>"},
    {"meetkai-functionary-medium-v3.2.jinja", ToolCallFormat::FunctionaryV32, "<|eot_id|>", "", "", true},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", ToolCallFormat::CommandR7b,
     "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ToolCallFormat::CommandRPlus, "", "<|CHATBOT_TOKEN|>",
     "<|START_OF_TURN_TOKEN|>"},
};

std::vector<std::pair<std::string, ojson>> calls_of(const chat::ParsedMessage& m) {
  std::vector<std::pair<std::string, ojson>> out;
  for (const auto& c : m.tool_calls) out.emplace_back(c.name, ojson::parse(c.arguments));
  return out;
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, std::min(s.find_first_not_of(ws), s.size()));
  s.erase(s.find_last_not_of(ws) + 1);
  return s;
}

class RealTemplate : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(RealTemplate, RoundTripAndGrammar) {
  const Case& c = GetParam();
  auto src = read(template_path(c.file));
  if (!src) GTEST_SKIP() << "template missing: " << template_path(c.file);
  chat::TemplateConfig cfg;
  cfg.name = c.file;
  cfg.bos_token = "<s>";
  cfg.eos_token = "</s>";
  auto t = chat::ChatTemplate::create(*src, cfg);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->caps().tool_format, c.format) << chat::tool_call_format_name(t->caps().tool_format);

  // The generation prompt, then the same conversation with the assistant's calls.
  auto p1 = t->apply(make_request(false, true));
  ASSERT_TRUE(p1.ok()) << p1.error().message;
  auto p2 = t->apply(make_request(true, false));
  ASSERT_TRUE(p2.ok()) << p2.error().message;
  std::string turn;
  if (c.after.empty()) {
    ASSERT_EQ(p2->text.substr(0, p1->text.size()), p1->text) << "the calls' turn does not continue the generation prompt:\n"
                                                             << p1->text << "\n----\n" << p2->text;
    turn = p2->text.substr(p1->text.size());
  } else {
    const size_t user = p2->text.find("Weather in Paris");
    const size_t a = p2->text.find(c.after, user);
    ASSERT_NE(a, std::string::npos);
    const size_t b = p2->text.find(c.before, a);
    turn = p2->text.substr(a + c.after.size(), b == std::string::npos ? std::string::npos : b - a - c.after.size());
  }
  SCOPED_TRACE("rendered turn: " + turn);
  if (c.cut_trailer) {
    ASSERT_EQ(turn.substr(turn.size() - c.trailer.size()), c.trailer);
    turn.resize(turn.size() - c.trailer.size());
  }

  // The parser as the server configures it for this prompt (reasoning opened by the prompt, …).
  const chat::ChatRequest req = make_request(false, true);
  const chat::ParserConfig pc = p1->parser;
  ASSERT_TRUE(pc.parse_tool_calls);
  const auto whole = chat::parse_output(turn, pc);
  EXPECT_EQ(calls_of(whole), kCalls);
  EXPECT_EQ(trim(whole.content), c.cut_trailer ? "" : c.trailer);
  EXPECT_EQ(whole.finish_reason("stop"), "tool_calls");

  // Streamed: byte by byte and random chunkings give the same message.
  std::mt19937 rng(7);
  for (int round = 0; round < 12; ++round) {
    chat::OutputParser p(pc);
    chat::Delta all;
    for (size_t i = 0; i < turn.size();) {
      size_t n = round == 0 ? 1 : 1 + rng() % 9;
      all.append(p.feed(std::string_view(turn).substr(i, n)));
      i += n;
    }
    all.append(p.finish());
    ASSERT_EQ(p.message().tool_calls.size(), kCalls.size());
    EXPECT_EQ(calls_of(p.message()), kCalls);
    EXPECT_EQ(all.content, whole.content);
    ASSERT_EQ(all.tool_calls.size(), kCalls.size());
  }

  // tool_choice "required": the grammar for this template's format compiles.
  chat::ChatRequest forced = req;
  forced.tool_choice.mode = chat::ToolChoice::Mode::Required;
  chat::ToolGrammarOptions o;
  o.format = t->caps().tool_format;
  auto gbnf = chat::tool_call_gbnf(forced, o);
  ASSERT_TRUE(gbnf.ok()) << gbnf.error().to_string();
  auto g = engine::Grammar::parse(*gbnf);
  ASSERT_TRUE(g.ok()) << g.error().message << "\n" << *gbnf;
}

INSTANTIATE_TEST_SUITE_P(Templates, RealTemplate, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string n = info.param.file.substr(0, info.param.file.find(".jinja"));
  for (char& ch : n)
    if (!isalnum(uint8_t(ch))) ch = '_';
  return n;
});

namespace {

// Texts the forced-call grammar of `f` must derive, each read back as `calls`.
struct GrammarCase {
  ToolCallFormat format;
  std::string text;
  std::vector<std::pair<std::string, ojson>> calls;  // empty: the grammar must refuse the text
};

}  // namespace

TEST(BlockFormats, GrammarDerivesWhatTheParserReads) {
  const std::vector<GrammarCase> cases = {
      {ToolCallFormat::DeepseekV31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 3}<｜tool▁call▁end｜>"
       "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": \"kiln tool calls\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       kCalls},
      {ToolCallFormat::DeepseekV31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"days\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       {}},  // city is required
      {ToolCallFormat::DeepseekDsml,
       "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris"
       "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
       "<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"query\" string=\"true\">kiln tool calls</｜DSML｜parameter>\n"
       "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
       kCalls},
      {ToolCallFormat::KimiK2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
       "{\"city\": \"Paris\", \"days\": 3}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>"
       "{\"query\": \"kiln tool calls\"}<|tool_call_end|><|tool_calls_section_end|>",
       kCalls},
      {ToolCallFormat::MiniMaxXml,
       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
       "<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"search\">\n<parameter name=\"query\">kiln tool calls"
       "</parameter>\n</invoke>\n</minimax:tool_call>",
       kCalls},
      {ToolCallFormat::MiniMaxXml,
       "<minimax:tool_call>\n<invoke name=\"search\">\n<parameter name=\"query\">a</parameter>b</parameter>\n</invoke>\n"
       "</minimax:tool_call>",
       {}},  // the closing marker inside a value
      {ToolCallFormat::MiniMaxJson,
       "<tool_calls>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n"
       "{\"name\": \"search\", \"arguments\": {\"query\": \"kiln tool calls\"}}\n</tool_calls>",
       kCalls},
      {ToolCallFormat::FunctionaryV31,
       "<function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function><function=search>{\"query\": \"kiln tool calls\"}"
       "</function>",
       kCalls},
      {ToolCallFormat::FunctionaryV32,
       "get_weather\n{\"city\": \"Paris\", \"days\": 3}>>>search\n{\"query\": \"kiln tool calls\"}", kCalls},
      {ToolCallFormat::CommandR7b,
       "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", "
       "\"days\": 3}}, {\"tool_call_id\": \"1\", \"tool_name\": \"search\", \"parameters\": {\"query\": \"kiln tool calls\"}}]"
       "<|END_ACTION|>",
       kCalls},
      {ToolCallFormat::CommandRPlus,
       "Action:\n```json\n[{\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}},\n"
       "{\"tool_name\": \"search\", \"parameters\": {\"query\": \"kiln tool calls\"}}]\n```",
       kCalls},
      {ToolCallFormat::Harmony,
       "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"query\": \"kiln tool calls\"}",
       {{"search", {{"query", "kiln tool calls"}}}}},
  };
  const chat::ChatRequest base = make_request(false, true);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(chat::tool_call_format_name(c.format)) + ": " + c.text);
    chat::ChatRequest req = base;
    req.tool_choice.mode = chat::ToolChoice::Mode::Required;
    chat::ToolGrammarOptions o;
    o.format = c.format;
    auto gbnf = chat::tool_call_gbnf(req, o);
    ASSERT_TRUE(gbnf.ok()) << gbnf.error().to_string();
    auto g = engine::Grammar::parse(*gbnf);
    ASSERT_TRUE(g.ok()) << g.error().message << "\n" << *gbnf;
    if (c.calls.empty()) {
      EXPECT_FALSE((*g)->matches(c.text));
      continue;
    }
    EXPECT_TRUE((*g)->matches(c.text)) << *gbnf;
    chat::ParserConfig pc;
    pc.parse_tool_calls = true;
    pc.tool_format = c.format;
    pc.tools = base.tools;
    pc.reasoning_format = chat::ReasoningFormat::None;
    auto m = chat::parse_output(c.text, pc);
    EXPECT_EQ(calls_of(m), c.calls);
    EXPECT_EQ(m.content, "");
  }
}

TEST(BlockFormats, MalformedBlocksStayContentAndIdsAreKept) {
  chat::ParserConfig pc;
  pc.parse_tool_calls = true;
  pc.tools = make_request(false, true).tools;
  pc.reasoning_format = chat::ReasoningFormat::None;
  pc.tool_format = ToolCallFormat::KimiK2;
  const std::string bad = "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>"
                          "{not json}<|tool_call_end|><|tool_calls_section_end|> Done.";
  auto m = chat::parse_output(bad, pc);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, bad);
  auto ok = chat::parse_output(
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"query\":\"x\"}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      pc);
  ASSERT_EQ(ok.tool_calls.size(), 1u);
  EXPECT_EQ(ok.tool_calls[0].id, "functions.search:0");  // Kimi's template renders this id back
  // A block cut by end-of-generation before its closing marker is still read.
  pc.tool_format = ToolCallFormat::DeepseekV31;
  auto cut = chat::parse_output("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\":\"x\"}<｜tool▁call▁end｜>", pc);
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].name, "search");
  // Command R7B's response markers are layout, dropped from content; its thinking is reasoning.
  pc.tool_format = ToolCallFormat::CommandR7b;
  pc.reasoning_format = chat::ReasoningFormat::Auto;
  pc.reasoning_start = "<|START_THINKING|>";
  pc.reasoning_end = "<|END_THINKING|>";
  auto r = chat::parse_output("<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Hello!<|END_RESPONSE|>", pc);
  EXPECT_EQ(r.reasoning_content, "plan");
  EXPECT_EQ(r.content, "Hello!");
  // Functionary v3.2's "all" recipient opens text.
  pc.tool_format = ToolCallFormat::FunctionaryV32;
  pc.reasoning_format = chat::ReasoningFormat::None;
  auto f = chat::parse_output("all\nLet me look.>>>search\n{\"query\": \"x\"}", pc);
  EXPECT_EQ(f.content, "Let me look.");
  ASSERT_EQ(f.tool_calls.size(), 1u);
  EXPECT_EQ(f.tool_calls[0].arguments, "{\"query\": \"x\"}");
}
