// tokenizer/tokenizer.h — text ⇄ token ids for GGUF vocabularies (llama.cpp-compatible).
// Owns: byte-level BPE (tokenizer.ggml.model = gpt2) with the pre-tokenizer named by
//       tokenizer.ggml.pre (PCRE2, UTF + UCP, JIT), SentencePiece-style score merging
//       (tokenizer.ggml.model = llama) with ▁ spaces and <0xXX> byte fallback, special/added
//       token matching before pre-tokenization, detokenization and a streaming decoder that
//       never emits half a UTF-8 character.
// Must not: depend on gguf (it takes a plain Vocab) or on anything but core.
// Threading: a Tokenizer is immutable after create(); encode/decode are const and may be
//       called from many threads at once. A StreamDecoder is per-sequence state (one thread).
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/vocab.h"

namespace kiln::tokenizer {

struct EncodeOptions {
  bool add_special = true;    // add BOS / EOS when the vocabulary says so (tokenizer.ggml.add_*_token)
  bool parse_special = true;  // match control tokens ("<|im_start|>") in the text; false: treat as text
                              // (user-defined/added tokens are always matched, like llama.cpp)
};

// Flags llama.cpp derives from tokenizer.ggml.pre for byte-level BPE vocabularies (before the
// file's own tokenizer.ggml.add_bos_token etc. override them). nullopt: pre not supported.
struct PreDefaults {
  bool add_bos = false;
  bool ignore_merges = false;
  bool clean_spaces = true;
};
std::optional<PreDefaults> bpe_pre_defaults(std::string_view pre);
// The pre-tokenizer names Tokenizer::create accepts for BPE vocabularies.
std::vector<std::string> supported_pre_tokenizers();

class Tokenizer {
 public:
  // Validates the vocabulary (types, scores, merges, special ids, byte tokens, pre-tokenizer).
  // Unknown tokenizer.ggml.pre → error; missing/empty pre → "default" with a warning.
  static Result<std::unique_ptr<Tokenizer>> create(Vocab vocab);
  ~Tokenizer();

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt = {}) const;

  // The bytes one token stands for. special=false renders control/unknown tokens as "".
  std::string token_to_piece(TokenId id, bool special = true) const;
  // Whole-sequence detokenization (llama.cpp llama_detokenize semantics: the first token's
  // SPM leading space is removed, clean_spaces applied). Invalid UTF-8 is passed through.
  std::string decode(std::span<const TokenId> ids, bool remove_special = false, bool special = true) const;

  const Vocab& vocab() const;
  int32_t n_tokens() const;
  TokenId find(std::string_view token_text) const;  // exact token text → id, or kNoToken
  bool is_eog(TokenId id) const;                     // end of generation (eos, eot, eom, <|im_end|>, ...)
  bool is_control(TokenId id) const;
  const std::vector<TokenId>& eog_ids() const;
  std::string_view pre_tokenizer() const;            // the resolved pre-tokenizer name

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming: push() returns only complete UTF-8 characters;
// bytes of an unfinished character are held until the next token completes them. Bytes that
// can never form a valid character are emitted as U+FFFD. flush() returns what is held.
class StreamDecoder {
 public:
  // special: control tokens as text; preserved: these control tokens as text in any case (sorted).
  explicit StreamDecoder(const Tokenizer& tok, bool special = false, std::vector<TokenId> preserved = {});
  std::string push(TokenId id);
  std::string flush();
  void reset();

 private:
  const Tokenizer* tok_;
  bool special_;
  std::vector<TokenId> preserved_;
  bool first_ = true;
  std::string pending_;
};

// Length of the longest prefix of `s` that is complete, valid UTF-8 followed only by an
// unfinished (but so far valid) sequence; used by StreamDecoder, exposed for tests.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace kiln::tokenizer
