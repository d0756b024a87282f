// Forced tool calls (chat/tool_grammar.h): for every tool-call format, the grammar derives the calls
// the template would write, and OutputParser reads each derived text back as exactly that call
// (name and arguments); texts with a closing marker inside a value, a missing required parameter,
// a second call when parallel_tool_calls is false, or another tool than the named one are not
// derived. (Sampled outputs validated with `jsonschema`: tests/py/test_server_tools.py.)
#include <gtest/gtest.h>

#include "chat/output_parser.h"
#include "chat/tool_grammar.h"
#include "engine/grammar.h"

using namespace kiln;
using kiln::chat::ojson;
using chat::ToolCallFormat;

namespace {

chat::ChatRequest request(const char* tools_json, const char* choice = R"("required")", bool parallel = true) {
  ojson body = {{"messages", ojson::array({{{"role", "user"}, {"content", "x"}}})},
                {"tools", ojson::parse(tools_json)},
                {"tool_choice", ojson::parse(choice)},
                {"parallel_tool_calls", parallel}};
  auto r = chat::parse_chat_request(body);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return *r;
}

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7},
     "unit":{"type":"string","enum":["c","f"]},"when":{"type":"string","format":"date"},
     "tags":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":2}},
   "required":["city","days"]}}},
  {"type":"function","function":{"name":"code","parameters":{"type":"object","properties":{
     "id":{"type":"string","pattern":"^[a-z]{2}\\d$"}},"required":["id"]}}},
  {"type":"function","function":{"name":"ping"}}
])";

std::shared_ptr<const engine::Grammar> compile(const chat::ChatRequest& req, chat::ToolGrammarOptions o) {
  auto text = chat::tool_call_gbnf(req, o);
  EXPECT_TRUE(text.ok()) << (text.ok() ? "" : text.error().to_string());
  if (!text.ok()) return nullptr;
  auto g = engine::Grammar::parse(*text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message) << "\n" << *text;
  return g.ok() ? *g : nullptr;
}

// The calls OutputParser finds in `text` as (name, arguments).
std::vector<std::pair<std::string, ojson>> parsed_calls(const std::string& text, const chat::ChatRequest& req,
                                                        ToolCallFormat f) {
  chat::ParserConfig pc;
  pc.parse_tool_calls = true;
  pc.tool_format = f;
  pc.tools = req.tools;
  auto m = chat::parse_output(text, pc);
  EXPECT_TRUE(m.content.empty()) << "content left over: " << m.content;
  std::vector<std::pair<std::string, ojson>> out;
  for (const auto& c : m.tool_calls) out.emplace_back(c.name, ojson::parse(c.arguments));
  return out;
}

struct Case {
  std::string text;
  std::vector<std::pair<std::string, ojson>> calls;  // empty: the grammar must reject the text
};

void check(ToolCallFormat f, bool mistral_args, const chat::ChatRequest& req, bool parallel, const std::vector<Case>& cases) {
  auto g = compile(req, {f, mistral_args, parallel});
  ASSERT_TRUE(g);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    if (c.calls.empty()) {
      EXPECT_FALSE(g->matches(c.text));
      continue;
    }
    EXPECT_TRUE(g->matches(c.text));
    EXPECT_EQ(parsed_calls(c.text, req, f), c.calls);
  }
}

const ojson kW1 = {{"city", "Paris"}, {"days", 3}};
const ojson kW2 = {{"city", "a</b>\n</tool_cal"}, {"days", 7}, {"unit", "f"}, {"when", "2024-02-29"}, {"tags", {"x", "<y"}}};

}  // namespace

TEST(ToolGrammar, QwenXml) {
  auto req = request(kTools);
  check(ToolCallFormat::QwenXml, false, req, true,
        {{"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
          "</function>\n</tool_call>",
          {{"get_weather", kW1}}},
         {"<tool_call>\n<function=get_weather>\n<parameter=city>\na</b>\n</tool_cal\n</parameter>\n<parameter=days>\n7\n"
          "</parameter>\n<parameter=unit>\nf\n</parameter>\n<parameter=when>\n2024-02-29\n</parameter>\n<parameter=tags>\n"
          "[\"x\", \"\\u003cy\"]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>",
          {{"get_weather", kW2}, {"ping", ojson::object()}}},
         // The pattern-constrained string cannot be written raw: the call uses the JSON body.
         {"<tool_call>\n{\"name\": \"code\", \"arguments\": {\"id\": \"ab1\"}}\n</tool_call>", {{"code", {{"id", "ab1"}}}}},
         {"<tool_call>\n<function=code>\n<parameter=id>\nab1\n</parameter>\n</function>\n</tool_call>", {}},
         {"<tool_call>\n<function=get_weather>\n<parameter=city>\nP</parameter>x\n</parameter>\n<parameter=days>\n3\n"
          "</parameter>\n</function>\n</tool_call>",
          {}},
         {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", {}},
         {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n8\n</parameter>\n"
          "</function>\n</tool_call>",
          {}},
         {"Sure! <tool_call>\n<function=ping>\n</function>\n</tool_call>", {}}});
}

TEST(ToolGrammar, HermesJsonNamedAndSingle) {
  auto req = request(kTools, R"({"type":"function","function":{"name":"get_weather"}})", false);
  check(ToolCallFormat::HermesJson, false, req, false,
        {{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
          {{"get_weather", kW1}}},
         {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a</b>\\n</tool_cal\", \"days\": 7, "
          "\"unit\": \"f\", \"when\": \"2024-02-29\", \"tags\": [\"x\", \"\\u003cy\"]}}\n</tool_call>",
          {{"get_weather", kW2}}},
         // The closing marker inside a string, a second call, another tool: not derived.
         {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"</tool_call>\", \"days\": 3}}\n</tool_call>", {}},
         {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 3}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Q\", \"days\": 3}}\n</tool_call>",
          {}},
         {"<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>", {}},
         {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>", {}}});
}

TEST(ToolGrammar, ArgKeyXml) {
  auto req = request(kTools);
  check(ToolCallFormat::ArgKeyXml, false, req, true,
        {{"<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3"
          "</arg_value></tool_call><tool_call>ping</tool_call>",
          {{"get_weather", kW1}, {"ping", ojson::object()}}},
         {"<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</arg_value></arg_value><arg_key>days</arg_key>"
          "<arg_value>3</arg_value></tool_call>",
          {}}});
}

TEST(ToolGrammar, MistralAndLlama3) {
  auto req = request(kTools);
  check(ToolCallFormat::MistralToolCalls, false, req, true,
        {{"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, "
          "{\"name\": \"ping\", \"arguments\": {}}]",
          {{"get_weather", kW1}, {"ping", ojson::object()}}},
         {"[{\"name\": \"ping\", \"arguments\": {}}]", {}}});
  check(ToolCallFormat::MistralToolCalls, true, req, true,
        {{"[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}[TOOL_CALLS]ping[ARGS]{}",
          {{"get_weather", kW1}, {"ping", ojson::object()}}},
         {"[TOOL_CALLS]get_weather[ARGS]{\"city\": \"[TOOL_CALLS]\", \"days\": 3}", {}}});
  check(ToolCallFormat::Llama3Json, false, req, true,
        {{"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}", {{"get_weather", kW1}}},
         {"{\"name\": \"nope\", \"parameters\": {}}", {}}});
}

TEST(ToolGrammar, Errors) {
  auto req = request(kTools);
  auto none = chat::tool_call_gbnf(req, {ToolCallFormat::None, false, true});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().field, "tool_choice");
  auto bad = request(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
      "a":{"type":"array","uniqueItems":true}}}}}])");
  auto e = chat::tool_call_gbnf(bad, {ToolCallFormat::QwenXml, false, true});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().field, "tools[0].function.parameters.properties.a.uniqueItems");
}

TEST(ToolGrammar, ExcludingRulesAvoidTheWordsExactly) {
  std::vector<std::pair<std::string, std::string>> rules;
  const std::string s0 = chat::excluding_rules("x", {"abab", "ba!"}, "[^ab!]", rules);
  std::string text = "root ::= " + s0 + "\n";
  for (auto& [n, b] : rules) text += n + " ::= " + b + "\n";
  auto g = engine::Grammar::parse(text);
  ASSERT_TRUE(g.ok()) << g.error().message << "\n" << text;
  for (const char* ok : {"", "aba", "abaab", "ba", "b!a!", "xabax", "bab", "ababa"}) EXPECT_EQ((*g)->matches(ok), std::string(ok).find("abab") == std::string::npos) << ok;
  for (const char* bad : {"abab", "xababx", "ba!", "aaba!", "abba!"}) EXPECT_FALSE((*g)->matches(bad)) << bad;
}
