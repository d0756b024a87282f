// server/api.h — OpenAI / llama-server JSON ⇄ engine types, without HTTP: request validation
//   (every error names the field), sampling parameters, the response and stream-chunk shapes,
//   error bodies, and the Prometheus text for /metrics.
// Owns: ApiError, GenParams (the server-side view of one generation request), JSON builders.
// Must not: do I/O, touch tensors or talk to the engine thread (it only fills engine::Request).
// Threading: plain functions; safe from any HTTP thread.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kiln::server {

using json = nlohmann::ordered_json;

// An error answered to the client: HTTP status + OpenAI error body
//   {"error":{"code":status,"message":…,"type":…,"param":…}}
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";  // OpenAI types: invalid_request_error,
                                               // authentication_error, not_found_error, server_error,
                                               // unavailable_error, exceed_context_size_error
  std::string message;                          // names the field: "temperature: must be >= 0"
  std::string param;                            // the field ("" if none)
  json to_json() const;
};

ApiError bad_request(std::string field, std::string message);
// "null", "a boolean", "a string", "an array", "an object" or "a number": for error messages.
const char* json_kind(const json& v);

// Generation parameters shared by /v1/chat/completions, /v1/completions and /completion.
struct GenParams {
  engine::Request req;            // sampling, max_tokens, stop, n_probs, ignore_eos, cache_prompt (prompt empty)
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool logprobs = false;          // chat: logprobs; completions: logprobs given (> 0 or 0)
  int top_logprobs = 0;
  bool echo = false;              // completions only
  int n = 1;                      // choices (OpenAI n, 1..kMaxChoices): one engine request each
};
inline constexpr int kMaxChoices = 16;

// Which endpoint the body belongs to: shapes the accepted fields.
enum class Endpoint { Chat, Completions };

// Parses the sampling / length / streaming fields of a body. n_vocab bounds logit_bias ids.
// Unknown keys are ignored (like OpenAI and llama-server); present keys are type- and range-checked.
std::optional<ApiError> parse_gen_params(const json& body, Endpoint ep, int64_t n_vocab, GenParams& out);

// Completions prompt: a string, an array of token ids, or an array holding exactly one of those.
// Exactly one of text / tokens is set on success.
std::optional<ApiError> parse_completion_prompt(const json& body, int64_t n_vocab, std::string& text,
                                                std::vector<int32_t>& tokens, bool& is_tokens);

// Token text as JSON-safe UTF-8 (invalid bytes → U+FFFD) and its raw bytes.
std::string valid_utf8(const std::string& s);
json bytes_array(const std::string& s);

// OpenAI chat logprobs entry for one token: {"token","logprob","bytes","top_logprobs":[…]}.
json chat_logprob_entry(const engine::TokenOut& t, const tokenizer::Tokenizer& tok, int top_n);

// OpenAI completions "logprobs": {tokens, token_logprobs, top_logprobs (null when top_n is 0),
// text_offset (from text_offset0)}.
json completion_logprob_lists(const std::vector<engine::TokenOut>& toks, const tokenizer::Tokenizer& tok, int top_n,
                              size_t text_offset0);

// llama-server's "timings" object.
json timings_json(const engine::Timings& t);

// usage with prompt_tokens_details.cached_tokens.
json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

// Prometheus text exposition (llama-server's metric names plus kiln's prefix-cache counters).
std::string metrics_text(const engine::Metrics& m, uint64_t http_requests, uint64_t http_errors);

// A 24-character random id suffix ("chatcmpl-" + this).
std::string random_id();

}  // namespace kiln::server
