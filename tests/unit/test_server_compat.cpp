// The Anthropic / Responses translations (server/anthropic.h, server/responses.h) without a model:
// the chat bodies they produce, errors mapped back to their own fields, the ResponseStore bound and
// LRU order, and the Anthropic event sequence of a dialect fed parser deltas.
// (End to end with the official SDKs: tests/py/test_server_anthropic.py, test_server_responses.py.)
#include <gtest/gtest.h>

#include "server/anthropic.h"
#include "server/responses.h"

using namespace kiln;
using namespace kiln::server;

TEST(Anthropic, TranslatesBlocksIntoChatMessages) {
  json body = json::parse(R"({
    "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
    "stop_sequences": ["END"], "thinking": {"type": "disabled"},
    "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
    "messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}]})");
  AnthropicRequest ar;
  ASSERT_FALSE(anthropic_to_chat(body, false, ar).has_value());
  const json& c = ar.chat_body;
  ASSERT_EQ(c["messages"].size(), 5u);
  EXPECT_EQ(c["messages"][0], json({{"role", "system"}, {"content", "A\nB"}}));
  EXPECT_EQ(c["messages"][2]["reasoning_content"], "hmm");
  EXPECT_TRUE(c["messages"][2]["content"].is_null());
  EXPECT_EQ(c["messages"][2]["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  // tool_result first, then the user's other blocks.
  EXPECT_EQ(c["messages"][3], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "r"}}));
  EXPECT_EQ(c["messages"][4]["content"][0]["text"], "and");
  EXPECT_EQ(ar.origin, (std::vector<std::string>{"system", "messages[0]", "messages[1]", "messages[2].content[1]", "messages[2]"}));
  EXPECT_EQ(c["tool_choice"]["function"]["name"], "f");
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["stop"], json::array({"END"}));
  EXPECT_EQ(c["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(c["tools"][0]["function"]["parameters"], json({{"type", "object"}}));

  // Errors of the chat pipeline come back under the Anthropic field.
  AnthropicDialect d("m", ar);
  ApiError e = d.from_chat_error(bad_request("messages[3].content", "bad"));
  EXPECT_EQ(e.param, "messages[2].content[1].content");
  EXPECT_EQ(e.message, "messages[2].content[1].content: bad");
  e = d.from_chat_error(bad_request("tools[0].function.parameters.properties.x.not", "no"));
  EXPECT_EQ(e.param, "tools[0].input_schema.properties.x.not");
  EXPECT_EQ(anthropic_error_json(e), json::parse(R"({"type":"error","error":{"type":"invalid_request_error",
                                                   "message":"tools[0].input_schema.properties.x.not: no"}})"));
}

TEST(Anthropic, Errors) {
  auto field = [](const char* text) {
    AnthropicRequest ar;
    auto e = anthropic_to_chat(json::parse(text), false, ar);
    return e ? e->param : std::string("(none)");
  };
  EXPECT_EQ(field(R"({"messages":[{"role":"user","content":"x"}]})"), "max_tokens");
  EXPECT_EQ(field(R"({"max_tokens":1,"messages":[{"role":"user","content":[{"type":"document"}]}]})"), "messages[0].content[0].type");
  EXPECT_EQ(field(R"({"max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_result"}]}]})"), "messages[0].content[0].type");
  EXPECT_EQ(field(R"({"max_tokens":1,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})"), "temperature");
  EXPECT_EQ(field(R"({"max_tokens":1,"tool_choice":{"type":"sometimes"},"messages":[{"role":"user","content":"x"}]})"), "tool_choice.type");
  EXPECT_EQ(field(R"({"max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]})"), "messages[1].role");
}

TEST(Anthropic, StreamEventSequence) {
  AnthropicRequest ar;
  AnthropicDialect d("m", ar);
  std::string s = d.stream_begin(7);
  chat::Delta a;
  a.reasoning_content = "think";
  s += d.stream_delta(a);
  chat::Delta b;
  b.content = "hi";
  b.tool_calls.push_back({0, "toolu_x", "f", R"({"a":1})"});
  s += d.stream_delta(b);
  chat::ParsedMessage m;
  m.tool_calls.push_back({"toolu_x", "f", R"({"a":1})"});
  engine::Timings t;
  t.predicted_n = 3;
  s += d.stream_end(ChatOutcome{m, engine::FinishReason::Stop, "", t, 7});
  std::vector<std::string> events;
  for (size_t p = 0; (p = s.find("event: ", p)) != std::string::npos; p += 7) events.push_back(s.substr(p + 7, s.find('\n', p) - p - 7));
  EXPECT_EQ(events, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                                              "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
                                              "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                                              "message_stop"}));
  EXPECT_NE(s.find(R"("stop_reason":"tool_use")"), std::string::npos);
  EXPECT_NE(s.find(R"("partial_json":"{\"a\":1}")"), std::string::npos);
}

TEST(Responses, StoreIsBoundedLeastRecentlyUsedFirst) {
  ResponseStore st(3);
  for (const char* id : {"a", "b", "c"}) st.put(id, {json{{"id", id}}, json::array()});
  ASSERT_TRUE(st.get("a"));  // a is now the most recent
  st.put("d", {json{{"id", "d"}}, json::array()});
  EXPECT_EQ(st.size(), 3u);
  EXPECT_FALSE(st.get("b"));  // the least recently used went
  EXPECT_TRUE(st.get("a") && st.get("c") && st.get("d"));
  EXPECT_TRUE(st.erase("a"));
  EXPECT_FALSE(st.erase("a"));
  EXPECT_EQ(st.size(), 2u);
}

TEST(Responses, ItemsAndPreviousResponse) {
  ResponseStore st;
  json prev_msgs = json::parse(R"([{"role":"user","content":"q"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}])");
  st.put("resp_1", {json::object(), prev_msgs});
  json body = json::parse(R"({"instructions": "I", "previous_response_id": "resp_1", "max_output_tokens": 20,
      "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}, "strict": true}},
      "input": [{"type": "function_call_output", "call_id": "call_1", "output": "42"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "R"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
                {"type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}"},
                {"role": "user", "content": [{"type": "input_text", "text": "u"}]}]})");
  ResponsesRequest rr;
  ASSERT_FALSE(responses_to_chat(body, st, rr).has_value());
  const json& m = rr.chat_body["messages"];
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "I"}}));
  EXPECT_EQ(m[1], prev_msgs[0]);
  EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "42"}}));
  // reasoning + message + function_call: one assistant message.
  EXPECT_EQ(m[4]["reasoning_content"], "R");
  EXPECT_EQ(m[4]["content"], "A");
  EXPECT_EQ(m[4]["tool_calls"][0]["id"], "call_2");
  EXPECT_EQ(rr.history.size(), 5u);  // without the instructions
  EXPECT_EQ(rr.chat_body["max_tokens"], 20);
  EXPECT_EQ(rr.chat_body["response_format"]["json_schema"]["name"], "o");
  ResponsesDialect d("m", rr, nullptr);
  EXPECT_EQ(d.from_chat_error(bad_request("messages[5].content", "x")).param, "input[4].content");
  EXPECT_EQ(d.from_chat_error(bad_request("response_format.json_schema.schema.type", "x")).param, "text.format.schema.type");
  EXPECT_EQ(d.from_chat_error(bad_request("max_tokens", "x")).message, "max_output_tokens: x");

  body["previous_response_id"] = "resp_gone";
  ResponsesRequest bad;
  auto e = responses_to_chat(body, st, bad);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "previous_response_id");
}
