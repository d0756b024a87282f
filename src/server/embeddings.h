// server/embeddings.h — the embedding endpoints' request parsing and answers: OpenAI's
//   POST /v1/embeddings ({input, encoding_format}) and llama-server's POST /embedding ({content}).
// Owns: the input forms (a string, a list of strings, a list of token ids, a list of such lists),
//   embd_normalize as llama-server defines it (-1 none, 0 max-abs scaled to int16 range, 1 taxicab,
//   2 Euclidean (the default), p > 2 the p-norm), and the two response shapes.
// Must not: talk to the engine, do I/O or touch tensors (the server submits one engine request
//   per input with Request::embed and hands the pooled vectors here).
// Threading: plain functions; safe from any HTTP thread.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "server/api.h"

namespace kiln::server {

// The inputs of `field` as token id lists: strings go through `tokenize` (the server's: BOS as the
// vocabulary says, special tokens parsed), id lists are checked against n_vocab. Errors name the
// field and element; empty inputs are refused.
std::optional<ApiError> parse_embedding_inputs(const json& body, const std::string& field, int64_t n_vocab,
                                               const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                                               std::vector<std::vector<int32_t>>& out);

// "embd_normalize" of the body (default 2); errors name the field.
std::optional<ApiError> parse_embd_normalize(const json& body, int& out);

// Normalizes each row of n floats of v in place (v.size() a multiple of n).
void normalize_embedding(std::vector<float>& v, int64_t n, int mode);

// OpenAI's answer: {object: "list", data: [{object: "embedding", index, embedding}], model, usage}.
// base64: each embedding as the base64 of its little-endian float32 bytes (encoding_format).
json oai_embeddings_json(const std::vector<std::vector<float>>& embs, const std::string& model, int64_t prompt_tokens,
                         bool base64);

// llama-server's /embedding answer: [{index, embedding: [[n_embd floats], ...]}] — one row per input
// (pooled), or one per token (pooling none).
json native_embedding_json(const std::vector<std::vector<float>>& embs, int64_t n_embd);

}  // namespace kiln::server
