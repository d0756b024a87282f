// server/dialect.h — a chat generation answered in another vendor's API shapes: the Anthropic
//   Messages API (server/anthropic.h) and OpenAI's Responses API (server/responses.h). The request
//   is translated into a /v1/chat/completions body and runs through the same pipeline (template,
//   tokenizer, constraints, engine, chat::OutputParser); a ChatDialect only shapes what comes out.
// Owns: the ChatDialect interface, ChatOutcome and the SSE framing helper.
// Must not: do I/O or talk to the engine (the server writes what a dialect returns).
// Threading: one ChatDialect per request, used by the one HTTP thread serving it.
#pragma once
#include <string>

#include "chat/output_parser.h"
#include "server/api.h"

namespace kiln::server {

// What a finished chat generation reports.
struct ChatOutcome {
  const chat::ParsedMessage& msg;
  engine::FinishReason finish = engine::FinishReason::Stop;
  std::string stop_word;    // the stop string that ended it ("" if none)
  engine::Timings timings;  // cache_n = prompt tokens reused, predicted_n = tokens generated
  int64_t n_prompt = 0;     // prompt tokens in all
};

class ChatDialect {
 public:
  virtual ~ChatDialect() = default;
  // This API's error body for `e` (its HTTP status stays e.status).
  virtual json error_json(const ApiError& e) const = 0;
  // An error of the chat pipeline, whose field names the translated /v1/chat/completions body,
  // renamed to the field of this API's request ("messages[3].content" → "input[2].content").
  virtual ApiError from_chat_error(ApiError e) const { return e; }
  // The non-streamed answer.
  virtual json response(const ChatOutcome& o) = 0;
  // Streaming: the SSE text to write first, for each parser delta ("" = nothing), at the end, and
  // for an error after the stream has started.
  virtual std::string stream_begin(int64_t n_prompt) = 0;
  virtual std::string stream_delta(const chat::Delta& d) = 0;
  virtual std::string stream_end(const ChatOutcome& o) = 0;
  virtual std::string stream_error(const ApiError& e) = 0;
};

// "event: NAME\ndata: JSON\n\n" (invalid UTF-8 replaced).
inline std::string sse_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace kiln::server
