// tokenizer/vocab.h — the plain vocabulary description a Tokenizer is built from.
// Owns: token strings, scores, token types, BPE merges, special-token ids and tokenizer flags,
//       exactly as a GGUF file stores them under `tokenizer.ggml.*` (filled by model/vocab_loader).
// Must not: read files or know about GGUF; validation happens in Tokenizer::create.
// Threading: a plain value.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::tokenizer {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// Values of `tokenizer.ggml.token_type` (GGUF / llama.cpp token types).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// `tokenizer.ggml.model`: "gpt2" → byte-level BPE, "llama" → SentencePiece-style (score merges).
enum class ModelKind { Bpe, Spm };

struct Vocab {
  std::string source;      // file name, for error messages
  ModelKind kind = ModelKind::Bpe;
  std::string model_name;  // tokenizer.ggml.model as stored ("gpt2", "llama")
  std::string pre;         // tokenizer.ggml.pre ("qwen35", "qwen2", "llama-bpe", "smollm", "gpt-2", ...)

  std::vector<std::string> tokens;  // id → text (byte-level mapped for BPE, ▁ for SPM spaces)
  std::vector<float> scores;        // empty or one per token (SPM merge priority)
  std::vector<TokenType> types;     // empty (all Normal) or one per token
  std::vector<std::string> merges;  // BPE: "left right", rank = index

  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken,
          sep = kNoToken, pad = kNoToken, mask = kNoToken;
  TokenId fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken, fim_pad = kNoToken,
          fim_rep = kNoToken, fim_sep = kNoToken;

  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM: prepend ' ' to text at the start / after a special token
  bool ignore_merges = false;     // BPE: a pre-token that is itself a token is emitted whole (llama3)
  bool clean_spaces = false;      // detokenize: " ," → "," etc. (llama.cpp's clean_up_tokenization_spaces)
};

}  // namespace kiln::tokenizer
