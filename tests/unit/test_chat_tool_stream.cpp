// Streamed tool calls (chat/tool_stream.h): the JSON object scanner, and for each format that
// streams, that a call's first delta (index, id, name) arrives before its arguments are complete,
// that the arguments come in several pieces, and that the pieces — fed one byte at a time and in
// random chunkings — add up to exactly the blocking answer (expected values written by hand from the
// format definitions in docs/chat.md).
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "chat/output_parser.h"
#include "chat/tool_stream.h"

using namespace kiln::chat;

namespace {

using Status = JsonArgsScanner::Status;

// Feeds `text` to a scanner; returns the emitted text and the status after each byte.
std::pair<std::string, std::vector<Status>> scan(std::string_view text, bool minify) {
  JsonArgsScanner s(minify);
  std::string out;
  std::vector<Status> st;
  for (char c : text) {
    st.push_back(s.feed(c, out));
    if (st.back() != Status::More) break;
  }
  return {out, st};
}

TEST(JsonArgsScanner, MinifiesAndEndsAtTheClosingBrace) {
  const std::string text = R"({ "a" : [1, -2.5e3, true, null, {"b": "x y\n\u00e9\"}"}], "c":{} , "d": [ ] })";
  auto [out, st] = scan(text, true);
  EXPECT_EQ(out, R"({"a":[1,-2.5e3,true,null,{"b":"x y\n\u00e9\"}"}],"c":{},"d":[]})");
  ASSERT_EQ(st.size(), text.size());
  EXPECT_EQ(st.back(), Status::Done);
  for (size_t i = 0; i + 1 < st.size(); ++i) EXPECT_EQ(st[i], Status::More) << i;
  // Nothing parses differently from the original.
  EXPECT_EQ(ojson::parse(out), ojson::parse(text));
}

TEST(JsonArgsScanner, RawKeepsTheTextAsWritten) {
  const std::string text = "{\n  \"city\": \"Paris\",\n  \"days\": 3\n}";
  auto [out, st] = scan(text + "  trailing", false);
  EXPECT_EQ(out, text);
  EXPECT_EQ(st.back(), Status::Done);
  EXPECT_EQ(st.size(), text.size());
}

TEST(JsonArgsScanner, StringsPassAtOnceScalarsWhenTheyEnd) {
  JsonArgsScanner s(true);
  std::string out;
  for (char c : std::string(R"({"q": "hel)")) ASSERT_EQ(s.feed(c, out), Status::More);
  EXPECT_EQ(out, R"({"q":"hel)");
  EXPECT_TRUE(s.confirmed());
  JsonArgsScanner n(true);
  out.clear();
  for (char c : std::string(R"({"n": 12)")) ASSERT_EQ(n.feed(c, out), Status::More);
  EXPECT_EQ(out, R"({"n":)");  // the number may go on
  ASSERT_EQ(n.feed('}', out), Status::Done);
  EXPECT_EQ(out, R"({"n":12})");
  // An escape is passed once complete.
  JsonArgsScanner e(true);
  out.clear();
  for (char c : std::string(R"({"s":"\u00)")) ASSERT_EQ(e.feed(c, out), Status::More);
  EXPECT_EQ(out, R"({"s":")");
}

TEST(JsonArgsScanner, ConfirmedAfterTheFirstKeyOrAnEmptyObject) {
  JsonArgsScanner s(true);
  std::string out;
  for (char c : std::string(R"({"ab")")) s.feed(c, out);
  EXPECT_FALSE(s.confirmed());
  s.feed(':', out);
  EXPECT_TRUE(s.confirmed());
  JsonArgsScanner e(true);
  e.feed('{', out);
  EXPECT_FALSE(e.confirmed());
  EXPECT_EQ(e.feed('}', out), Status::Done);
  EXPECT_TRUE(e.confirmed());
}

TEST(JsonArgsScanner, RejectsWhatIsNotJson) {
  for (std::string bad : {"[1]", "{a}", "{\"a\" 1}", "{\"a\":1,}", "{\"a\":01}", "{\"a\":tru}", "{\"a\":\"\\q\"}",
                          "{\"a\":\"\\u12g4\"}", "{\"a\":\"x\ny\"}", "{\"a\":1]", "{\"a\":[1}", "{,}", "{\"a\":nul }"}) {
    auto [out, st] = scan(bad, true);
    EXPECT_EQ(st.back(), Status::Invalid) << bad;
    EXPECT_EQ(bad.substr(0, out.size()), out) << "only a prefix of the text is emitted";
  }
}

// ---------------------------------------------------------------------------------------------

std::vector<Tool> tools() {
  Tool t;
  t.name = "get_weather";
  t.parameters = ojson::parse(R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}})");
  Tool u;
  u.name = "search";
  u.parameters = ojson::parse(R"({"type":"object","properties":{"query":{"type":"string"}}})");
  return {t, u};
}

ParserConfig cfg_for(ToolCallFormat f) {
  ParserConfig c;
  c.parse_tool_calls = true;
  c.tool_format = f;
  c.tools = tools();
  auto n = std::make_shared<int>(0);
  c.make_tool_call_id = [n] { return "call_" + std::to_string((*n)++); };
  return c;
}

struct Streamed {
  Delta all;
  std::vector<size_t> first_at;   // per call: bytes fed when its first delta came
  std::vector<int> pieces;        // per call: deltas that carried a non-empty piece of its arguments
  ParsedMessage msg;
};

Streamed feed_cut(const std::string& text, const ParserConfig& cfg, const std::vector<size_t>& cuts) {
  OutputParser p(cfg);
  Streamed s;
  size_t prev = 0;
  auto take = [&](const Delta& d, size_t fed) {
    for (const auto& c : d.tool_calls) {
      if (c.first()) {
        EXPECT_EQ(c.index, static_cast<int>(s.first_at.size()));
        EXPECT_FALSE(c.name.empty());
        s.first_at.push_back(fed);
        s.pieces.push_back(0);
      } else {
        EXPECT_TRUE(c.name.empty());
        EXPECT_FALSE(c.arguments.empty()) << "empty pieces are not sent";
      }
      if (!c.arguments.empty()) ++s.pieces.at(c.index);
    }
    s.all.append(d);
  };
  for (size_t c : cuts) {
    take(p.feed(std::string_view(text).substr(prev, c - prev)), c);
    prev = c;
  }
  take(p.feed(std::string_view(text).substr(prev)), text.size());
  take(p.finish(), text.size());
  s.msg = p.message();
  return s;
}

void same(const Streamed& s, const ParsedMessage& want, const std::string& what) {
  EXPECT_EQ(s.all.content, want.content) << what;
  ASSERT_EQ(s.all.tool_calls.size(), want.tool_calls.size()) << what;
  for (size_t i = 0; i < want.tool_calls.size(); ++i) {
    EXPECT_EQ(s.all.tool_calls[i].id, want.tool_calls[i].id) << what;
    EXPECT_EQ(s.all.tool_calls[i].name, want.tool_calls[i].name) << what;
    EXPECT_EQ(s.all.tool_calls[i].arguments, want.tool_calls[i].arguments) << what;
  }
  EXPECT_EQ(s.msg.last_call_cut, want.last_call_cut) << what;
}

std::vector<size_t> every_byte(const std::string& text) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);
  return cuts;
}

// Cuts 1..max_step bytes apart.
std::vector<size_t> random_cuts(const std::string& text, std::mt19937& rng, unsigned max_step) {
  std::vector<size_t> cuts;
  for (size_t pos = 0;;) {
    pos += 1 + rng() % max_step;
    if (pos >= text.size()) return cuts;
    cuts.push_back(pos);
  }
}

struct Call {
  std::string name, arguments, id;  // id "" = generated
};

// The blocking answer equals `calls` (+ content); byte-by-byte each call's first delta comes before
// `before` (a byte offset: where the call's arguments are not yet complete) and its arguments come in
// at least `min_pieces` deltas; every chunking adds up to the blocking answer.
void check_streams(ToolCallFormat f, const std::string& text, const std::vector<Call>& calls,
                   const std::vector<size_t>& before, int min_pieces, const std::string& content = "") {
  const ParserConfig cfg = cfg_for(f);
  ParsedMessage whole = parse_output(text, cfg);
  EXPECT_EQ(whole.content, content) << text;
  ASSERT_EQ(whole.tool_calls.size(), calls.size()) << text;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(whole.tool_calls[i].name, calls[i].name) << text;
    EXPECT_EQ(whole.tool_calls[i].arguments, calls[i].arguments) << text;
    if (!calls[i].id.empty()) EXPECT_EQ(whole.tool_calls[i].id, calls[i].id) << text;
  }
  Streamed bytes = feed_cut(text, cfg_for(f), every_byte(text));
  same(bytes, whole, "byte-by-byte: " + text);
  ASSERT_EQ(bytes.first_at.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_LT(bytes.first_at[i], before[i]) << "call " << i << " was not streamed: " << text;
    EXPECT_GE(bytes.pieces[i], min_pieces) << "call " << i << ": " << text;
  }
  std::mt19937 rng(99 + static_cast<unsigned>(text.size()));
  for (int round = 0; round < 40; ++round) same(feed_cut(text, cfg_for(f), random_cuts(text, rng, 9)), whole, "random chunking: " + text);
  same(feed_cut(text, cfg_for(f), {}), whole, "one chunk: " + text);
}

size_t at(const std::string& text, std::string_view what, size_t from = 0) {
  size_t p = text.find(what, from);
  EXPECT_NE(p, std::string::npos) << what;
  return p;
}

const std::string kArgs = R"({"city": "Paris", "days": 3})";
const std::string kMin = R"({"city":"Paris","days":3})";

TEST(ToolStream, HermesJsonStreamsMinifiedArguments) {
  const std::string t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + kArgs + "}\n</tool_call>";
  check_streams(ToolCallFormat::HermesJson, t, {{"get_weather", kMin, ""}}, {at(t, "Paris")}, 3);
  // Two calls, text before; members after the arguments are ignored.
  const std::string t2 = "Sure.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a b\"}, \"id\": 7}\n</tool_call>\n"
                         "<tool_call>\n{\"name\": \"get_weather\", \"parameters\": " + kArgs + "}\n</tool_call>";
  check_streams(ToolCallFormat::HermesJson, t2, {{"search", R"({"query":"a b"})", ""}, {"get_weather", kMin, ""}},
                {at(t2, "a b"), at(t2, "Paris")}, 2, "Sure.");
}

TEST(ToolStream, QwenXmlSendsOneParameterAtATime) {
  const std::string t =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "</function>\n</tool_call>";
  // The header comes with the first closed parameter, before the second one is written.
  check_streams(ToolCallFormat::QwenXml, t, {{"get_weather", kMin, ""}}, {at(t, "<parameter=days>")}, 3);
}

TEST(ToolStream, MistralBothForms) {
  const std::string t = "[TOOL_CALLS]get_weather[ARGS]" + kArgs + "[TOOL_CALLS]search[CALL_ID]abc123xyz[ARGS]{\"query\": \"q\"}";
  check_streams(ToolCallFormat::MistralToolCalls, t, {{"get_weather", kMin, ""}, {"search", R"({"query":"q"})", ""}},
                {at(t, "Paris"), at(t, "\"q\"}")}, 2);
  const std::string t2 = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + kArgs +
                         ", \"id\": \"abcdefghi\"}, {\"name\": \"search\", \"arguments\": {\"query\": \"q\"}}]";
  check_streams(ToolCallFormat::MistralToolCalls, t2, {{"get_weather", kMin, ""}, {"search", R"({"query":"q"})", ""}},
                {at(t2, "Paris"), at(t2, "\"q\"}")}, 2);
}

TEST(ToolStream, Llama3OnlyForAKnownTool) {
  const std::string t = "{\"name\": \"get_weather\", \"parameters\": " + kArgs + "}";
  check_streams(ToolCallFormat::Llama3Json, t, {{"get_weather", kMin, ""}}, {at(t, "Paris")}, 3);
  // An ordinary JSON answer stays content.
  ParsedMessage m = parse_output(R"({"name": "Bob", "parameters": {"a": 1}})", cfg_for(ToolCallFormat::Llama3Json));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, R"({"name": "Bob", "parameters": {"a": 1}})");
}

TEST(ToolStream, DeepseekAndKimiKeepArgumentsAsWritten) {
  const std::string d = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + kArgs +
                        "<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": \"q\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  check_streams(ToolCallFormat::DeepseekV31, d, {{"get_weather", kArgs, ""}, {"search", R"({"query": "q"})", ""}},
                {at(d, "Paris"), at(d, "\"q\"}")}, 2);
  const std::string k = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" + kArgs +
                        "<|tool_call_end|><|tool_calls_section_end|>";
  check_streams(ToolCallFormat::KimiK2, k, {{"get_weather", kArgs, "functions.get_weather:0"}}, {at(k, "Paris")}, 3);
}

TEST(ToolStream, MiniMaxJsonFunctionaryHarmony) {
  const std::string m = "<tool_calls>\n{\"name\": \"get_weather\", \"arguments\": " + kArgs +
                        "}\n{\"name\": \"search\", \"arguments\": {\"query\": \"q\"}}\n</tool_calls>";
  check_streams(ToolCallFormat::MiniMaxJson, m, {{"get_weather", kMin, ""}, {"search", R"({"query":"q"})", ""}},
                {at(m, "Paris"), at(m, "\"q\"}")}, 2);
  const std::string f1 = "<function=get_weather>" + kArgs + "</function>";
  check_streams(ToolCallFormat::FunctionaryV31, f1, {{"get_weather", kArgs, ""}}, {at(f1, "Paris")}, 3);
  const std::string f2 = "get_weather\n" + kArgs + ">>>search\n{\"query\": \"q\"}";
  check_streams(ToolCallFormat::FunctionaryV32, f2, {{"get_weather", kArgs, ""}, {"search", R"({"query": "q"})", ""}},
                {at(f2, "Paris"), at(f2, "\"q\"}")}, 2);
  const std::string h = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                        "<|constrain|>json<|message|>" + kArgs + "<|call|>";
  ParserConfig hc = cfg_for(ToolCallFormat::Harmony);
  check_streams(ToolCallFormat::Harmony, h, {{"get_weather", kArgs, ""}}, {at(h, "Paris")}, 3,
                parse_output(h, hc).content);
}

TEST(ToolStream, ArgumentsThatStopBeingJsonEndTheCall) {
  // Sent (the first key was read), then not JSON: the call keeps what was sent, the rest of the
  // body is dropped; every chunking agrees.
  const std::string t = "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": x}}</tool_call> after";
  check_streams(ToolCallFormat::HermesJson, t, {{"search", R"({"query":)", ""}}, {at(t, "x}")}, 1, "after");
  // Not yet sent: the whole body is read as before (here: content).
  ParsedMessage m = parse_output("<tool_call>{\"name\": \"search\", \"arguments\": {oops}}</tool_call>",
                                 cfg_for(ToolCallFormat::HermesJson));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "<tool_call>{\"name\": \"search\", \"arguments\": {oops}}</tool_call>");
}

TEST(ToolStream, CutByTheEndOfGeneration) {
  const std::string t = "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"abc";
  const ParserConfig cfg = cfg_for(ToolCallFormat::HermesJson);
  ParsedMessage m = parse_output(t, cfg);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"query":"abc)");
  EXPECT_TRUE(m.last_call_cut);
  EXPECT_EQ(m.finish_reason("length"), "length");
  EXPECT_EQ(m.finish_reason("stop"), "tool_calls");
  same(feed_cut(t, cfg_for(ToolCallFormat::HermesJson), every_byte(t)), m, "byte-by-byte cut");
  // A complete call is not cut.
  ParsedMessage ok = parse_output("<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>", cfg);
  ASSERT_EQ(ok.tool_calls.size(), 1u);
  EXPECT_EQ(ok.tool_calls[0].arguments, "{}");
  EXPECT_FALSE(ok.last_call_cut);
  EXPECT_EQ(ok.finish_reason("length"), "tool_calls");
}

TEST(ToolStream, RandomFragmentsEveryFormat) {
  // Random texts from each format's markers, headers, JSON pieces (valid and not), names with odd
  // characters, partial markers and prose: streamed byte by byte and in random chunks they give the
  // blocking answer exactly — the streamer's decisions depend only on the bytes, never the chunking.
  const std::vector<std::string> common = {
      "{", "}", "\"", ":", ",", " ", "\n", "x", "\"query\"", ": \"a b\"", "12", "1.5e3", "true", "null", "[", "]",
      "\\\"", "\\u00e9", "get_weather", "search", "wörld", "<", "{\"query\": \"q\"}", "{\"city\": \"Paris\", \"days\": 3}"};
  const std::vector<std::pair<ToolCallFormat, std::vector<std::string>>> formats = {
      {ToolCallFormat::HermesJson, {"<tool_call>", "</tool_call>", "{\"name\": \"search\", \"arguments\": ",
                                    "{\"name\": \"get_weather\", \"parameters\": ", "<function=search>", "</function>",
                                    "<parameter=query>", "</parameter>", "<parameter=a\"b>", "</tool_", "\"id\": 1"}},
      {ToolCallFormat::QwenXml, {"<tool_call>\n<function=get_weather>\n", "<parameter=city>\nParis\n</parameter>\n",
                                 "<parameter=days>\n3\n</parameter>\n", "</function>\n</tool_call>", "<parameter=", ">",
                                 "</parameter>", "<tool_call>", "</tool_call>"}},
      {ToolCallFormat::MistralToolCalls, {"[TOOL_CALLS]", "search[ARGS]", "get_weather[CALL_ID]a\"b[ARGS]", "[ARGS]",
                                          "[{\"name\": \"search\", \"arguments\": ", "}, ", "}]", "[TOOL"}},
      {ToolCallFormat::Llama3Json, {"{\"name\": \"search\", \"parameters\": ", "{\"name\": \"Bob\", \"parameters\": ",
                                    "<|python_tag|>", "}"}},
      {ToolCallFormat::DeepseekV31, {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>search<｜tool▁sep｜>",
                                     "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "function<｜tool▁sep｜>search\n```json\n",
                                     "```", "<｜tool▁"}},
      {ToolCallFormat::KimiK2, {"<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>",
                                "<|tool_call_end|>", "<|tool_calls_section_end|>", "<|tool_call"}},
      {ToolCallFormat::MiniMaxJson, {"<tool_calls>\n", "{\"name\": \"search\", \"arguments\": ", "}\n", "</tool_calls>"}},
      {ToolCallFormat::FunctionaryV31, {"<function=search>", "<function=get_weather>", "</function>", "<function="}},
      {ToolCallFormat::Harmony, {"<|channel|>commentary to=functions.search <|constrain|>json<|message|>", "<|call|>",
                                 "<|channel|>final<|message|>", "<|end|>", "<|start|>assistant", "<|channel|>commentary to=functions."}},
  };
  std::mt19937 rng(7);
  for (const auto& [format, own] : formats) {
    std::vector<std::string> frags = common;
    frags.insert(frags.end(), own.begin(), own.end());
    for (int n = 0; n < 250; ++n) {
      std::string text;
      // Mostly: a well-formed opening, then random pieces.
      if (rng() % 3) text += own[0];
      const int len = 1 + int(rng() % 14);
      for (int i = 0; i < len; ++i) text += frags[rng() % frags.size()];
      ParsedMessage whole = parse_output(text, cfg_for(format));
      same(feed_cut(text, cfg_for(format), every_byte(text)), whole, "byte-by-byte: " + text);
      for (int round = 0; round < 3; ++round)
        same(feed_cut(text, cfg_for(format), random_cuts(text, rng, 8)), whole, "random chunking: " + text);
    }
  }
}

TEST(ToolStream, DeltaJsonShapes) {
  OutputParser p(cfg_for(ToolCallFormat::HermesJson));
  Delta a = p.feed("<tool_call>{\"name\": \"search\", \"arguments\": {\"query\":");
  Delta b = p.feed(" \"x\"}}</tool_call>");
  ojson ja = delta_to_json(a), jb = delta_to_json(b);
  ASSERT_EQ(ja["tool_calls"].size(), 1u);
  EXPECT_EQ(ja["tool_calls"][0]["index"], 0);
  EXPECT_EQ(ja["tool_calls"][0]["id"], "call_0");
  EXPECT_EQ(ja["tool_calls"][0]["type"], "function");
  EXPECT_EQ(ja["tool_calls"][0]["function"]["name"], "search");
  EXPECT_EQ(ja["tool_calls"][0]["function"]["arguments"], "{\"query\":");
  ASSERT_EQ(jb["tool_calls"].size(), 1u);
  EXPECT_EQ(jb["tool_calls"][0], ojson::parse(R"({"index":0,"function":{"arguments":"\"x\"}"}})"));
}

}  // namespace
