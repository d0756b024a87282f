// server/responses.h — OpenAI's Responses API (`POST /v1/responses`, `GET` / `DELETE
//   /v1/responses/{id}`) on top of the chat pipeline: `input` (a string or items: messages with
//   input_text / output_text / input_image parts, function_call, function_call_output, reasoning),
//   `instructions`, function `tools`, `tool_choice`, `parallel_tool_calls`, `max_output_tokens`,
//   `text.format` (→ response_format), `reasoning.effort` ("none" → enable_thinking false) and
//   `previous_response_id` are translated into a /v1/chat/completions body; the parsed output is
//   answered as a Response object (reasoning / message / function_call output items) or its SSE
//   events (response.created, response.in_progress, response.output_item.added,
//   response.content_part.added, response.output_text.delta / .done, response.reasoning_text.delta /
//   .done, response.function_call_arguments.delta / .done, response.output_item.done,
//   response.completed or response.incomplete).
// Owns: that translation, the answer / event shapes (ResponsesDialect) and ResponseStore, the
//   bounded in-memory store of finished responses (the conversation each one ends) that
//   previous_response_id and GET / DELETE read — for the server's lifetime only.
// Must not: do I/O, talk to the engine or render templates (server/generate.cpp runs the request).
// Threading: translation functions are plain; ResponseStore is shared by all HTTP threads (one
//   mutex); a ResponsesDialect serves one request on one thread.
#pragma once
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/dialect.h"

namespace kiln::server {

// Finished responses by id, least recently used dropped beyond max_entries.
class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 512) : max_(max_entries) {}
  struct Entry {
    json response;  // the Response object as answered
    json messages;  // the chat messages of the conversation through this response (without instructions)
  };
  void put(const std::string& id, Entry e);
  std::optional<Entry> get(const std::string& id);
  bool erase(const std::string& id);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  size_t max_;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> map_;
};

struct ResponsesRequest {
  json chat_body;                   // the /v1/chat/completions body
  std::vector<std::string> origin;  // chat_body["messages"][k] came from this field ("input[2]", "instructions", …)
  json history = json::array();     // the conversation without instructions (previous response's + input)
  json echo = json::object();       // request fields the Response object repeats (instructions, tools, …)
  bool store = true;
};

// Validates and translates a Responses body; previous_response_id is looked up in `store`. Errors
// name the Responses field: "input[1].content[0].type", "previous_response_id".
std::optional<ApiError> responses_to_chat(const json& body, ResponseStore& store, ResponsesRequest& out);

class ResponsesDialect : public ChatDialect {
 public:
  ResponsesDialect(std::string model, ResponsesRequest req, std::shared_ptr<ResponseStore> store);
  json error_json(const ApiError& e) const override { return e.to_json(); }
  ApiError from_chat_error(ApiError e) const override;
  json response(const ChatOutcome& o) override;
  std::string stream_begin(int64_t n_prompt) override;
  std::string stream_delta(const chat::Delta& d) override;
  std::string stream_end(const ChatOutcome& o) override;
  std::string stream_error(const ApiError& e) override;

 private:
  enum class Item { None, Reasoning, Message, FunctionCall };
  std::string event(const char* type, json body);  // numbered SSE event
  std::string open(Item k);
  std::string close();
  json envelope(const char* status) const;  // the Response object without output / usage
  json finish(const ChatOutcome& o, json output);  // the final Response; stored when asked

  std::string id_, model_;
  int64_t created_ = 0;
  ResponsesRequest req_;
  std::shared_ptr<ResponseStore> store_;
  // Streaming state.
  int64_t seq_ = 0;
  Item open_ = Item::None;
  std::string item_id_, text_;
  std::string call_id_, call_name_;  // Item::FunctionCall: the call's id and name (text_: its arguments)
  json items_ = json::array();  // output items finished so far
};

}  // namespace kiln::server
