// server/infill.h — llama-server's `POST /infill` (fill-in-the-middle): its request fields
//   (input_prefix, input_suffix, input_extra, prompt) and the FIM prompt built from the
//   vocabulary's FIM tokens (tokenizer.ggml.fim_pre/suf/mid/rep/sep_token_id, or found by their
//   text as llama.cpp does: tokenizer/tokenizer.cpp).
// Owns: InfillParams, the check that a model can infill (501 naming the missing tokens), and the
//   prompt layout (llama-server's repo-level pattern, https://arxiv.org/pdf/2409.12186):
//     [FIM_REP]myproject\n [FIM_SEP]FILE0\n TEXT0 … [FIM_SEP]filename\n
//     [BOS] [FIM_PRE]PREFIX PROMPT [FIM_SUF]SUFFIX [FIM_MID]
//   (with --spm-infill the suffix part comes before the prefix part); without FIM_REP / FIM_SEP
//   the extra chunks are separated by "\n\n--- snippet ---\n\n". Prefix, suffix and extra context
//   are cut to fit the batch and context as llama-server cuts them (prefix:suffix = 3:1 of n_batch,
//   the extra context the last n_ctx - n_batch - 2·n_predict tokens).
// Must not: do I/O or talk to the engine (the server runs the ids as a /completion request).
// Threading: plain functions; safe from any HTTP thread.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/native.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

struct InfillChunk {
  std::string filename = "tmp";  // llama-server's default when a chunk has none
  std::string text;
};

struct InfillParams {
  std::vector<PromptPart> input_prefix;  // text (tokenized without special tokens) and/or token ids
  std::vector<PromptPart> input_suffix;
  std::vector<InfillChunk> input_extra;  // other files of the project, oldest context first
  std::string prompt;                    // text the completion continues, after the prefix
};

// Parses the fields; every error names the field (input_prefix, input_extra[2].filename, …).
// input_prefix and input_suffix are required (a string, possibly empty, or an array of token ids and
// strings); input_extra is optional (an array of {text, filename?}); prompt an optional string.
std::optional<ApiError> parse_infill_params(const json& body, int64_t n_vocab, InfillParams& out);

// nullopt when the vocabulary has FIM prefix, suffix and middle tokens; else 501
// not_supported_error naming each missing one and its GGUF key.
std::optional<ApiError> infill_support_error(const tokenizer::Vocab& v);

struct InfillLimits {
  int64_t n_batch = 2048;  // -b
  int64_t n_ctx = 0;       // a slot's context
  int64_t n_predict = -1;  // the request's max_tokens (-1: unlimited)
  bool spm = false;        // --spm-infill: suffix before prefix
};

// The prompt's token ids in the layout above (the vocabulary must pass infill_support_error).
std::vector<int32_t> infill_prompt_ids(const InfillParams& p, const tokenizer::Tokenizer& tok, const InfillLimits& lim);

}  // namespace kiln::server
