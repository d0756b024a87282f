// server/native.h — llama-server's native `POST /completion`: the request fields it adds to
//   GenParams (the mixed prompt, id_slot, return_tokens) and its response / stream-chunk JSON
//   (content, stop_type, stopping_word, tokens_*, generation_settings, completion_probabilities).
// Owns: NativeParams and the JSON builders of that endpoint; nothing else.
// Must not: do I/O, talk to the engine thread or touch tensors (the server runs the generation
//   exactly as for /v1/completions and hands the events here to be shaped).
// Threading: plain functions; safe from any HTTP thread.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "server/api.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

// One element of a /completion prompt: text to tokenize, or token ids taken as they are.
struct PromptPart {
  bool is_text = false;
  std::string text;
  std::vector<int32_t> ids;
};

// The /completion fields beyond GenParams.
struct NativeParams {
  std::vector<PromptPart> prompt;  // in order; the server tokenizes the text parts
  bool return_tokens = false;      // "tokens": the generated ids in the final answer
  int id_slot = -1;                // requested slot (-1: any); accepted, not honoured (no pinning)
};

// Parses "prompt" (a string; an array of token ids; an array mixing ids and strings; or an array
// holding exactly one of those) and id_slot (in [-1, n_slots)), return_tokens, post_sampling_probs.
std::optional<ApiError> parse_native_params(const json& body, int64_t n_vocab, int n_slots, NativeParams& out);

// The prompt's token ids: id parts as given, text parts tokenized with special tokens parsed; a
// first text part goes through `tokenize_first` (the server's: adds BOS as the vocabulary says),
// later ones get no BOS (llama-server's mixed-prompt rule).
std::vector<int32_t> native_prompt_ids(const NativeParams& np, const tokenizer::Tokenizer& tok,
                                       const std::function<std::vector<int32_t>(const std::string&)>& tokenize_first);

// llama-server's stop_type: "eos" (end-of-generation token), "word" (a stop string), "limit"
// (n_predict or the slot's context), "none" (cancelled / error).
const char* native_stop_type(engine::FinishReason r, const std::string& stop_word);

// completion_probabilities: one entry per token {id, token, bytes, logprob, top_logprobs:[{id, token,
// bytes, logprob}…]} (top_n alternatives, most likely first).
json native_probs(const std::vector<engine::TokenOut>& toks, const tokenizer::Tokenizer& tok, int top_n);

// generation_settings: the sampling parameters the request ran with.
json native_settings(const GenParams& gp, const std::string& model_id);

// A stream chunk before the end: {index, content, tokens, stop:false, id_slot, tokens_predicted,
// tokens_evaluated[, completion_probabilities]}.
json native_partial(const GenParams& gp, const std::string& text, const std::vector<engine::TokenOut>& toks,
                    const tokenizer::Tokenizer& tok, int id_slot, int64_t n_prompt, int64_t n_decoded);

// What the final answer reports (non-streamed: the whole content; streamed: content "" and no
// tokens / probabilities, those went with the chunks).
struct NativeFinal {
  std::string content;
  std::vector<engine::TokenOut> tokens;  // generated tokens (ids; probabilities when n_probs)
  engine::FinishReason finish = engine::FinishReason::None;
  std::string stop_word;
  engine::Timings timings;
  int64_t n_prompt = 0;
  std::string prompt_text;
  int id_slot = -1;
};
json native_final(const GenParams& gp, const NativeParams& np, const NativeFinal& f, const tokenizer::Tokenizer& tok,
                  const std::string& model_id);

}  // namespace kiln::server
