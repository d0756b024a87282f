// server/anthropic.h — the Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`)
//   on top of the chat pipeline: the request is translated into a /v1/chat/completions body (system,
//   messages with text / image / tool_use / tool_result / thinking blocks, tools, tool_choice,
//   stop_sequences, max_tokens, temperature / top_p / top_k, thinking → enable_thinking), and the
//   parsed output (chat::OutputParser) is answered as an Anthropic message or its SSE event sequence
//   (message_start, content_block_start / delta / stop, message_delta, message_stop).
// Owns: that translation, the field mapping of errors back to the Anthropic request, the answer and
//   event shapes (AnthropicDialect), Anthropic's error body {"type":"error","error":{"type","message"}}.
// Must not: do I/O, talk to the engine or render templates (server/generate.cpp runs the request).
// Threading: plain functions; an AnthropicDialect serves one request on one thread.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "server/dialect.h"

namespace kiln::server {

// Paths answered with Anthropic's error shape: /v1/messages and below.
bool is_anthropic_path(std::string_view path);

// {"type":"error","error":{"type": <Anthropic type for e.status>, "message": e.message}}: 400
// invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 500 api_error, 503 overloaded_error.
json anthropic_error_json(const ApiError& e);

// A translated request.
struct AnthropicRequest {
  json chat_body;                   // the /v1/chat/completions body
  std::vector<std::string> origin;  // chat_body["messages"][k] came from this request field ("system", "messages[2]")
};

// Validates and translates a Messages body (count_tokens: max_tokens is not required, generation
// fields are ignored). Errors name the Anthropic field: "messages[1].content[0].type".
std::optional<ApiError> anthropic_to_chat(const json& body, bool count_tokens, AnthropicRequest& out);

// "toolu_" + 24 random alphanumerics.
std::string anthropic_tool_id();

class AnthropicDialect : public ChatDialect {
 public:
  AnthropicDialect(std::string model, AnthropicRequest req);
  json error_json(const ApiError& e) const override { return anthropic_error_json(e); }
  ApiError from_chat_error(ApiError e) const override;
  json response(const ChatOutcome& o) override;
  std::string stream_begin(int64_t n_prompt) override;
  std::string stream_delta(const chat::Delta& d) override;
  std::string stream_end(const ChatOutcome& o) override;
  std::string stream_error(const ApiError& e) override;

 private:
  enum class Block { None, Thinking, Text, ToolUse };
  std::string open(Block b);  // closes the open block and starts b (if it is not open already; not ToolUse)
  std::string close();
  json usage(const ChatOutcome& o) const;

  std::string id_, model_;
  AnthropicRequest req_;
  Block open_ = Block::None;
  int index_ = -1;  // index of the last content block started
};

}  // namespace kiln::server
