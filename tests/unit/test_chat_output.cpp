// Output parser: content / reasoning_content / tool_calls, whole and streamed.
// Every case is checked three ways: the complete parse against the expected message (derived by
// hand from the format definitions in docs/chat.md), and the concatenated streaming deltas — fed
// one byte at a time and in 40 random chunkings — against the complete parse.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>

#include "chat/output_parser.h"

using namespace kiln::chat;

namespace {

struct Expect {
  std::string content;
  std::string reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (JSON, compared parsed)
};

ParserConfig counter_ids(ParserConfig c) {
  auto n = std::make_shared<int>(0);
  c.make_tool_call_id = [n] { return "call_" + std::to_string((*n)++); };
  return c;
}

// Feeds `text` cut at the given positions; returns the concatenated deltas and checks the
// per-delta invariants.
Delta stream(const std::string& text, const ParserConfig& cfg, const std::vector<size_t>& cuts) {
  OutputParser p(counter_ids(cfg));
  Delta all;
  size_t prev = 0;
  std::vector<Delta> deltas;
  for (size_t c : cuts) {
    deltas.push_back(p.feed(std::string_view(text).substr(prev, c - prev)));
    prev = c;
  }
  deltas.push_back(p.feed(std::string_view(text).substr(prev)));
  deltas.push_back(p.finish());
  for (const auto& d : deltas) all.append(d);
  // What message() accumulated is exactly what the deltas said.
  EXPECT_EQ(all.content, p.message().content);
  EXPECT_EQ(all.reasoning_content, p.message().reasoning_content);
  EXPECT_EQ(all.tool_calls.size(), p.message().tool_calls.size());
  return all;
}

void expect_same(const Delta& got, const ParsedMessage& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  EXPECT_EQ(got.reasoning_content, want.reasoning_content) << what;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << what;
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].index, static_cast<int>(i)) << what;
    EXPECT_EQ(got.tool_calls[i].id, want.tool_calls[i].id) << what;
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << what;
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << what;
  }
}

void check(const std::string& text, const ParserConfig& cfg, const Expect& e) {
  ParsedMessage whole = parse_output(text, counter_ids(cfg));
  EXPECT_EQ(whole.content, e.content) << "text: " << text;
  EXPECT_EQ(whole.reasoning_content, e.reasoning) << "text: " << text;
  ASSERT_EQ(whole.tool_calls.size(), e.calls.size()) << "text: " << text;
  std::set<std::string> ids;
  for (size_t i = 0; i < e.calls.size(); ++i) {
    EXPECT_EQ(whole.tool_calls[i].name, e.calls[i].first);
    EXPECT_EQ(kiln::chat::ojson::parse(whole.tool_calls[i].arguments), kiln::chat::ojson::parse(e.calls[i].second))
        << whole.tool_calls[i].arguments;
    EXPECT_FALSE(whole.tool_calls[i].id.empty());
    ids.insert(whole.tool_calls[i].id);
  }
  EXPECT_EQ(ids.size(), e.calls.size()) << "tool call ids must be unique";

  // One byte at a time.
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  expect_same(stream(text, cfg, every), whole, "byte-by-byte: " + text);
  // Random chunkings.
  std::mt19937 rng(1234 + static_cast<unsigned>(text.size()));
  for (int round = 0; round < 40; ++round) {
    std::vector<size_t> cuts;
    size_t pos = 0;
    while (text.size() > 1) {
      pos += 1 + rng() % 7;
      if (pos >= text.size()) break;
      cuts.push_back(pos);
    }
    expect_same(stream(text, cfg, cuts), whole, "random chunking: " + text);
  }
  // The whole text in one feed.
  expect_same(stream(text, cfg, {}), whole, "single chunk: " + text);
}

std::vector<Tool> weather_tools() {
  Tool t;
  t.name = "get_weather";
  t.parameters = kiln::chat::ojson::parse(R"({"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
      "coords":{"type":"object"},"tags":{"type":"array"},"code":{"type":"string"},
      "ratio":{"type":["number","null"]},"any":{"anyOf":[{"type":"integer"},{"type":"string"}]}}})");
  Tool u;
  u.name = "search";
  u.parameters = kiln::chat::ojson::parse(R"({"type":"object","properties":{"query":{"type":"string"}}})");
  return {t, u};
}

ParserConfig thinking(bool opened) {
  ParserConfig c;
  c.reasoning_format = ReasoningFormat::Auto;
  c.starts_in_reasoning = opened;
  return c;
}

ParserConfig with_tools(ParserConfig c) {
  c.parse_tool_calls = true;
  c.tools = weather_tools();
  return c;
}

}  // namespace

TEST(ChatOutput, PlainContent) {
  check("Hello, world!\nHow are you?", ParserConfig{}, {"Hello, world!\nHow are you?", "", {}});
  check("", ParserConfig{}, {"", "", {}});
  check("  leading and trailing  ", ParserConfig{}, {"  leading and trailing  ", "", {}});
}

TEST(ChatOutput, ReasoningOpenedByModel) {
  check("<think>\nLet me think.\n</think>\n\nThe answer is 4.", thinking(false),
        {"The answer is 4.", "Let me think.", {}});
  check("\n<think>r</think>c", thinking(false), {"c", "r", {}});
  check("<think>\n\n</think>\n\nNo thoughts.", thinking(false), {"No thoughts.", "", {}});
}

TEST(ChatOutput, ReasoningOpenedByPrompt) {
  // Qwen3.5's generation prompt ends with "<think>\n": the model starts inside reasoning.
  check("First, 2+2.\nSo 4.\n</think>\n\n4", thinking(true), {"4", "First, 2+2.\nSo 4.", {}});
  // Unterminated reasoning (max_tokens hit): all of it is reasoning.
  check("still thinking about <this> and </thin", thinking(true),
        {"", "still thinking about <this> and </thin", {}});
}

TEST(ChatOutput, ThinkOnlyAtStart) {
  check("a <think>b</think> c", thinking(false), {"a <think>b</think> c", "", {}});
  check("<thinking is fun>", thinking(false), {"<thinking is fun>", "", {}});
  check("<thin", thinking(false), {"<thin", "", {}});
}

TEST(ChatOutput, ReasoningFormatNone) {
  ParserConfig c;
  c.reasoning_format = ReasoningFormat::None;
  check("<think>\nx\n</think>\n\ny", c, {"<think>\nx\n</think>\n\ny", "", {}});
  c.starts_in_reasoning = true;  // ignored: none means raw
  check("x\n</think>\n\ny", c, {"x\n</think>\n\ny", "", {}});
}

TEST(ChatOutput, DeepseekLegacyStreamKeepsReasoningInContent) {
  ParserConfig c = thinking(false);
  c.reasoning_format = ReasoningFormat::DeepseekLegacy;
  c.reasoning_in_content = true;
  check("<think>\nabc\n</think>\n\nhi", c, {"<think>abc</think>hi", "", {}});
  c.reasoning_in_content = false;  // non-streaming legacy = deepseek
  check("<think>\nabc\n</think>\n\nhi", c, {"hi", "abc", {}});
}

TEST(ChatOutput, QwenXmlToolCall) {
  const std::string text =
      "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  check(text, with_tools(ParserConfig{}), {"Let me check.", "", {{"get_weather", R"({"city":"Paris","days":3})"}}});
}

TEST(ChatOutput, QwenXmlValueTyping) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nNew\nYork \n</parameter>\n"          // multi-line string kept (one \n stripped each side)
      "<parameter=code>\n12345\n</parameter>\n"                // string-typed stays a string
      "<parameter=metric>\nTrue\n</parameter>\n"               // boolean, Python spelling
      "<parameter=coords>\n{\"lat\": 1.5, \"lon\": -2}\n</parameter>\n"
      "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
      "<parameter=days>\nthree\n</parameter>\n"                // not JSON → string
      "<parameter=ratio>\nnull\n</parameter>\n"
      "<parameter=any>\n7\n</parameter>\n"                     // no "type", anyOf → JSON-decoded
      "<parameter=unknown>\n42\n</parameter>\n"                // not in the schema → string
      "</function>\n</tool_call>";
  check(text, with_tools(ParserConfig{}),
        {"", "",
         {{"get_weather",
           R"({"city":"New\nYork ","code":"12345","metric":true,"coords":{"lat":1.5,"lon":-2},"tags":["a","b"],)"
           R"("days":"three","ratio":null,"any":7,"unknown":"42"})"}}});
}

TEST(ChatOutput, MultipleCallsAndReasoning) {
  const std::string text =
      "I need two lookups.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\n"
      "x < y && z\n</parameter>\n</function>\n</tool_call>";
  check(text, with_tools(thinking(true)),
        {"", "I need two lookups.", {{"get_weather", R"({"city":"Oslo"})"}, {"search", R"({"query":"x < y && z"})"}}});
}

TEST(ChatOutput, JsonToolCalls) {
  const std::string text =
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"kiln\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}</tool_call>"
      "<tool_call>{\"name\": \"search\", \"parameters\": {\"query\": \"q\"}}</tool_call>";
  check(text, with_tools(ParserConfig{}),
        {"",
         "",
         {{"search", R"({"query":"kiln"})"}, {"get_weather", R"({"city":"Rome"})"}, {"search", R"({"query":"q"})"}}});
}

TEST(ChatOutput, ArgKeyToolCalls) {
  // GLM-4.x / Ling / Laguna form; values typed by the schema like the Qwen XML form.
  const std::string text =
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
      "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
      "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a b</arg_value>\n</tool_call>";
  check(text, with_tools(ParserConfig{}),
        {"", "", {{"get_weather", R"({"city":"Rome","days":2})"}, {"search", R"({"query":"a b"})"}}});
  // A bare name with no arguments, and a broken pair.
  check("<tool_call>search<arg_key>query</arg_key></tool_call>", with_tools(ParserConfig{}),
        {"<tool_call>search<arg_key>query</arg_key></tool_call>", "", {}});
}

TEST(ChatOutput, TextAroundCalls) {
  const std::string text =
      "Sure.\n<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>\nDone.";
  check(text, with_tools(ParserConfig{}), {"Sure.Done.", "", {{"search", "{}"}}});
}

TEST(ChatOutput, MalformedDegradesToContent) {
  auto cfg = with_tools(ParserConfig{});
  // Unterminated call at the end of generation.
  check("Hi <tool_call>\n<function=search>\n<parameter=query>\nabc", cfg,
        {"Hi <tool_call>\n<function=search>\n<parameter=query>\nabc", "", {}});
  // Bad JSON.
  check("<tool_call>{bad json}</tool_call>", cfg, {"<tool_call>{bad json}</tool_call>", "", {}});
  // Neither form.
  check("<tool_call>call search now</tool_call> ok", cfg, {"<tool_call>call search now</tool_call> ok", "", {}});
  // XML with an unterminated parameter.
  check("<tool_call><function=search><parameter=query>abc</function></tool_call>", cfg,
        {"<tool_call><function=search><parameter=query>abc</function></tool_call>", "", {}});
  // JSON without a name.
  check("<tool_call>{\"arguments\": {}}</tool_call>", cfg, {"<tool_call>{\"arguments\": {}}</tool_call>", "", {}});
  // A good call after a bad one still parses.
  check("<tool_call>{oops}</tool_call><tool_call>{\"name\":\"search\",\"arguments\":{\"query\":\"z\"}}</tool_call>", cfg,
        {"<tool_call>{oops}</tool_call>", "", {{"search", R"({"query":"z"})"}}});
  // A partial marker at the very end is content.
  check("hello <tool_", cfg, {"hello <tool_", "", {}});
}

TEST(ChatOutput, ToolParsingOff) {
  ParserConfig cfg;  // parse_tool_calls = false (no tools, or tool_choice none)
  const std::string text = "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>";
  check(text, cfg, {text, "", {}});
}

TEST(ChatOutput, NoPartialMarkerInDeltas) {
  const std::string text =
      "Checking.\n<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>";
  OutputParser p(with_tools(thinking(true)));
  std::string reasoning_prefix = "Some thought\n</think>\n\n";
  for (char c : reasoning_prefix + text) {
    Delta d = p.feed(std::string_view(&c, 1));
    EXPECT_EQ(d.content.find('<'), std::string::npos) << "partial marker leaked: " << d.content;
    EXPECT_EQ(d.reasoning_content.find('<'), std::string::npos) << d.reasoning_content;
  }
  Delta d = p.finish();
  EXPECT_TRUE(d.content.empty());
  EXPECT_EQ(p.message().content, "Checking.");
  EXPECT_EQ(p.message().reasoning_content, "Some thought");
  ASSERT_EQ(p.message().tool_calls.size(), 1u);
  EXPECT_EQ(p.message().finish_reason("stop"), "tool_calls");
}

TEST(ChatOutput, ToolCallIds) {
  const std::string one = "<tool_call>{\"name\":\"search\",\"arguments\":{}}</tool_call>";
  ParsedMessage m = parse_output(one + one + one, with_tools(ParserConfig{}));  // default random ids
  ASSERT_EQ(m.tool_calls.size(), 3u);
  std::set<std::string> ids;
  for (const auto& c : m.tool_calls) {
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    EXPECT_EQ(c.id.size(), 5u + 24u);
    ids.insert(c.id);
  }
  EXPECT_EQ(ids.size(), 3u);
}

TEST(ChatOutput, JsonShapes) {
  ParsedMessage m = parse_output("ok", ParserConfig{});
  EXPECT_EQ(m.finish_reason("length"), "length");
  auto j = message_to_json(m);
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["content"], "ok");
  EXPECT_FALSE(j.contains("tool_calls"));

  m = parse_output("<tool_call>{\"name\":\"search\",\"arguments\":{\"query\":\"a\"}}</tool_call>",
                   counter_ids(with_tools(ParserConfig{})));
  j = message_to_json(m);
  EXPECT_TRUE(j["content"].is_null());
  ASSERT_EQ(j["tool_calls"].size(), 1u);
  EXPECT_EQ(j["tool_calls"][0]["id"], "call_0");
  EXPECT_EQ(j["tool_calls"][0]["type"], "function");
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "search");
  EXPECT_TRUE(j["tool_calls"][0]["function"]["arguments"].is_string());

  Delta d;
  d.tool_calls.push_back({0, "call_x", "search", "{}"});
  auto dj = delta_to_json(d);
  EXPECT_FALSE(dj.contains("content"));
  EXPECT_EQ(dj["tool_calls"][0]["index"], 0);
  EXPECT_EQ(dj["tool_calls"][0]["function"]["arguments"], "{}");

  // Invalid UTF-8 from the model never makes serialisation throw.
  Delta bad;
  bad.content = std::string("a\xff\xfe") + "b";
  EXPECT_NO_THROW((void)delta_to_json(bad).dump());
}

TEST(ChatOutput, MistralToolCalls) {
  ParserConfig cfg = with_tools(ParserConfig{});
  cfg.tool_format = ToolCallFormat::MistralToolCalls;
  // Nemo: a JSON array after the marker.
  check("Let me look.[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}, \"id\": \"abcdefghi\"},"
        " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
        cfg, {"Let me look.", "", {{"search", R"({"query":"a"})"}, {"get_weather", R"({"city":"Rome"})"}}});
  // Mistral Small 3.2 / Devstral: NAME[ARGS]{…} repeated.
  check("[TOOL_CALLS]search[ARGS]{\"query\": \"x\"}[TOOL_CALLS]get_weather[CALL_ID]abc123xyz[ARGS]{\"city\": \"Oslo\"}",
        cfg, {"", "", {{"search", R"({"query":"x"})"}, {"get_weather", R"({"city":"Oslo"})"}}});
  // Malformed → content, verbatim.
  check("ok [TOOL_CALLS]search[ARGS]{broken", cfg, {"ok [TOOL_CALLS]search[ARGS]{broken", "", {}});
  // <tool_call> means nothing in this format.
  check("<tool_call>{\"name\":\"search\",\"arguments\":{}}</tool_call>", cfg,
        {"<tool_call>{\"name\":\"search\",\"arguments\":{}}</tool_call>", "", {}});
}

TEST(ChatOutput, Llama3JsonToolCalls) {
  ParserConfig cfg = with_tools(ParserConfig{});
  cfg.tool_format = ToolCallFormat::Llama3Json;
  check("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", cfg,
        {"", "", {{"get_weather", R"({"city":"Paris"})"}}});
  check("\n<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"q\"}}", cfg,
        {"", "", {{"search", R"({"query":"q"})"}}});
  // JSON that is not a known tool stays content; so does prose, and JSON later in the text.
  check("{\"name\": \"Bob\", \"age\": 3}", cfg, {"{\"name\": \"Bob\", \"age\": 3}", "", {}});
  check("Hello {\"name\": \"search\"}", cfg, {"Hello {\"name\": \"search\"}", "", {}});
  check("<|python_tag|>brave_search.call(query=\"x\")", cfg, {"<|python_tag|>brave_search.call(query=\"x\")", "", {}});
}

TEST(ChatOutput, RandomFragmentsChunkInvariance) {
  // Random texts built from marker fragments, partial markers, whitespace and prose: whatever the
  // configuration, streaming in random chunks must equal the whole parse.
  const std::vector<std::string> frags = {
      "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=search>", "</function>",
      "<parameter=query>", "</parameter>", "{\"name\": \"search\", \"arguments\": {\"query\": \"q\"}}",
      "search<arg_key>query</arg_key><arg_value>v</arg_value>", "[TOOL_CALLS]", "search[ARGS]{\"query\":1}",
      "<|python_tag|>", "<", "</", "<tool", "</thi", "[TOOL", "\n", "\n\n", " ", "  ", "hello", "wörld", "{", "}", "x"};
  std::vector<ParserConfig> cfgs;
  for (auto fmt : {ReasoningFormat::None, ReasoningFormat::Auto}) {
    for (bool opened : {false, true}) {
      for (auto tf : {ToolCallFormat::None, ToolCallFormat::HermesJson, ToolCallFormat::MistralToolCalls,
                      ToolCallFormat::Llama3Json}) {
        ParserConfig c;
        c.reasoning_format = fmt;
        c.starts_in_reasoning = opened;
        if (tf != ToolCallFormat::None) c = with_tools(c);
        c.tool_format = tf == ToolCallFormat::None ? ToolCallFormat::HermesJson : tf;
        cfgs.push_back(c);
      }
    }
  }
  ParserConfig legacy = with_tools(thinking(false));
  legacy.reasoning_format = ReasoningFormat::DeepseekLegacy;
  legacy.reasoning_in_content = true;
  cfgs.push_back(legacy);

  std::mt19937 rng(42);
  for (int n = 0; n < 400; ++n) {
    std::string text;
    int len = 1 + rng() % 12;
    for (int i = 0; i < len; ++i) text += frags[rng() % frags.size()];
    const ParserConfig& cfg = cfgs[n % cfgs.size()];
    ParsedMessage whole = parse_output(text, counter_ids(cfg));
    for (int round = 0; round < 4; ++round) {
      std::vector<size_t> cuts;
      size_t pos = 0;
      for (;;) {
        pos += 1 + rng() % (round == 0 ? 1 : 6);
        if (pos >= text.size()) break;
        cuts.push_back(pos);
      }
      expect_same(stream(text, cfg, cuts), whole, "config " + std::to_string(n % cfgs.size()) + ": " + text);
    }
    // Nothing is lost: with reasoning_format none and no tool parsing, content is the raw text.
    if (cfg.reasoning_format == ReasoningFormat::None && !cfg.parse_tool_calls) {
      EXPECT_EQ(whole.content, text);
    }
  }
}
