// Request validation: a table of malformed /v1/chat/completions bodies, each naming the field at
// fault, plus normalisation of the valid forms.
#include <gtest/gtest.h>

#include "chat/chat.h"

using namespace kiln::chat;

namespace {

struct Bad {
  const char* body;
  const char* field;       // expected RequestError::field
  const char* msg_substr;  // expected to appear in RequestError::message
};

const char* kTools = R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";

std::string with_tools(const std::string& rest) {
  return std::string(R"({"messages":[{"role":"user","content":"hi"}],)") + kTools + (rest.empty() ? "" : "," + rest) + "}";
}

}  // namespace

TEST(ChatRequest, MalformedTable) {
  const std::string t1 = with_tools(R"("tool_choice":"sometimes")");
  const std::string t2 = with_tools(R"("tool_choice":{"type":"function","function":{"name":"nope"}})");
  const std::string t3 = with_tools(R"("tool_choice":{"type":"function"})");
  const std::string t4 = with_tools(R"("tool_choice":7)");
  std::vector<Bad> table = {
      {R"([1,2])", "body", "must be a JSON object"},
      {R"({})", "messages", "required"},
      {R"({"messages":{}})", "messages", "must be an array"},
      {R"({"messages":[]})", "messages", "must not be empty"},
      {R"({"messages":["hi"]})", "messages[0]", "must be an object"},
      {R"({"messages":[{"content":"hi"}]})", "messages[0].role", "required"},
      {R"({"messages":[{"role":3,"content":"hi"}]})", "messages[0].role", "must be a string"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"robot","content":"x"}]})",
       "messages[2].role", "unknown role 'robot'"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content", "required for role 'user'"},
      {R"({"messages":[{"role":"system","content":null}]})", "messages[0].content", "required"},
      {R"({"messages":[{"role":"user","content":42}]})", "messages[0].content", "a string or an array"},
      {R"({"messages":[{"role":"user","content":["x"]}]})", "messages[0].content[0]", "must be an object"},
      {R"({"messages":[{"role":"user","content":[{"text":"x"}]}]})", "messages[0].content[0].type", "required"},
      {R"({"messages":[{"role":"user","content":[{"type":"audio","text":"x"}]}]})", "messages[0].content[0].type",
       "unsupported content part type 'audio'"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text", "required"},
      {R"({"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})", "messages[0].content[0].text",
       "must be a string"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].image_url",
       "required"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0].image_url.url", "required"},
      {R"({"messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}}]}]})",
       "messages[0].content[0].type", "only allowed in user messages"},
      {R"({"messages":[{"role":"user","content":"a","tool_calls":[]}]})", "messages[0].tool_calls",
       "only allowed in assistant messages"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":{}}]})",
       "messages[1].tool_calls", "must be an array"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function"}]}]})",
       "messages[1].tool_calls[0].function", "required"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}]})",
       "messages[1].tool_calls[0].function.name", "required"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{oops"}}]}]})",
       "messages[1].tool_calls[0].function.arguments", "not valid JSON"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"type":"retrieval","function":{"name":"f"}}]}]})",
       "messages[1].tool_calls[0].type", "unsupported tool call type"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"x","reasoning_content":5}]})",
       "messages[1].reasoning_content", "must be a string"},
      {R"({"messages":[{"role":"user","content":"a","reasoning_content":"r"}]})", "messages[0].reasoning_content",
       "only allowed in assistant messages"},
      {R"({"messages":[{"role":"tool","content":"42","tool_call_id":7}]})", "messages[0].tool_call_id",
       "must be a string"},
      {R"({"messages":[{"role":"user","content":"a","name":false}]})", "messages[0].name", "must be a string"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":{}})", "tools", "must be an array"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"code_interpreter"}]})", "tools[0].type",
       "unsupported tool type"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]})", "tools[0].function", "required"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"description":"d"}}]})",
       "tools[0].function.name", "required"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"bad name!"}}]})",
       "tools[0].function.name", "invalid function name"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})",
       "tools[1].function.name", "duplicate function name"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]})",
       "tools[0].function.parameters", "must be an object"},
      {R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":[]}}}]})",
       "tools[0].function.parameters.properties", "must be an object"},
      {t1.c_str(), "tool_choice", "unknown value 'sometimes'"},
      {t2.c_str(), "tool_choice.function.name", "no tool named 'nope'"},
      {t3.c_str(), "tool_choice.function", "required"},
      {t4.c_str(), "tool_choice", "a string or an object"},
      {R"({"messages":[{"role":"user","content":"a"}],"tool_choice":"required"})", "tool_choice",
       "needs at least one tool"},
      {R"({"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":[1]})", "chat_template_kwargs",
       "must be an object"},
      {R"({"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"enable_thinking":"no"}})",
       "chat_template_kwargs.enable_thinking", "must be a boolean"},
      {R"({"messages":[{"role":"user","content":"a"}],"add_generation_prompt":"yes"})", "add_generation_prompt",
       "must be a boolean"},
      {R"({"messages":[{"role":"user","content":"a"}],"parallel_tool_calls":1})", "parallel_tool_calls",
       "must be a boolean"},
      {R"({"messages":[{"role":"user","content":"a"}],"reasoning_format":"verbose"})", "reasoning_format",
       "unknown value 'verbose'"},
  };
  ASSERT_GE(table.size(), 20u);
  for (const auto& b : table) {
    auto body = ojson::parse(b.body);
    auto r = parse_chat_request(body);
    ASSERT_FALSE(r.ok()) << "accepted: " << b.body;
    EXPECT_EQ(r.error().field, b.field) << b.body << " → " << r.error().to_string();
    EXPECT_NE(r.error().message.find(b.msg_substr), std::string::npos)
        << b.body << " → " << r.error().to_string() << " (wanted '" << b.msg_substr << "')";
    EXPECT_EQ(r.error().to_string().rfind(std::string(b.field) + ": ", 0), 0u);
  }
}

TEST(ChatRequest, ValidForms) {
  auto body = ojson::parse(R"({
    "model": "x", "temperature": 0.2, "stream": true,
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "what is"},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": false,
    "chat_template_kwargs": {"enable_thinking": false},
    "reasoning_format": "deepseek-legacy"
  })");
  auto r = parse_chat_request(body);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const ChatRequest& q = r.value();
  ASSERT_EQ(q.messages.size(), 4u);
  EXPECT_EQ(q.messages[0].role, "developer");
  EXPECT_TRUE(q.messages[1].content_is_parts);
  ASSERT_EQ(q.messages[1].parts.size(), 2u);
  EXPECT_EQ(q.messages[1].parts[1].kind, ContentPart::Kind::Image);
  EXPECT_EQ(q.messages[1].parts[1].image_url, "data:image/png;base64,AAAA");
  EXPECT_TRUE(q.messages[2].content_is_null);
  EXPECT_EQ(q.messages[2].reasoning_content.value_or(""), "hmm");
  ASSERT_EQ(q.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(q.messages[2].tool_calls[0].name, "get_weather");
  EXPECT_EQ(ojson::parse(q.messages[2].tool_calls[0].arguments), ojson::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(q.messages[3].tool_call_id, "call_1");
  ASSERT_EQ(q.tools.size(), 1u);
  EXPECT_EQ(q.tools[0].description, "weather");
  EXPECT_EQ(q.tool_choice.mode, ToolChoice::Mode::Named);
  EXPECT_EQ(q.tool_choice.name, "get_weather");
  EXPECT_FALSE(q.parallel_tool_calls);
  EXPECT_TRUE(q.stream);
  EXPECT_EQ(q.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(q.reasoning_format, ReasoningFormat::DeepseekLegacy);

  // Minimal request: defaults.
  auto m = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"hi"}]})"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->tool_choice.mode, ToolChoice::Mode::Auto);
  EXPECT_TRUE(m->add_generation_prompt);
  EXPECT_FALSE(m->reasoning_format.has_value());
  // Arguments given as an object are accepted and re-serialised.
  auto o = parse_chat_request(ojson::parse(
      R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}]})"));
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->messages[0].tool_calls[0].arguments, R"({"a":1})");
}

TEST(ChatRequest, ReasoningFormatNames) {
  for (auto f : {ReasoningFormat::None, ReasoningFormat::Auto, ReasoningFormat::Deepseek, ReasoningFormat::DeepseekLegacy})
    EXPECT_EQ(parse_reasoning_format(reasoning_format_name(f)), f);
  EXPECT_FALSE(parse_reasoning_format("DeepSeek").has_value());
}
