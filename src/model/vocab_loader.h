// model/vocab_loader.h — builds a tokenizer::Vocab from a GGUF file's tokenizer.ggml.* keys.
// Owns: the mapping from GGUF metadata to Vocab, with llama.cpp's defaults (SPM: BOS 1, EOS 2,
//       UNK 0, add_bos, add_space_prefix; BPE: flags implied by tokenizer.ggml.pre) and the
//       file's own keys overriding them.
// Must not: tokenize (that is tokenizer::Tokenizer) or read tensors.
// Threading: a pure function of an immutable gguf::File.
#pragma once
#include <memory>

#include "core/result.h"
#include "gguf/reader.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace kiln::model {

// Errors name the file and key: missing tokenizer.ggml.tokens, wrong types, unknown model,
// unsupported pre-tokenizer, array length mismatches.
Result<kiln::tokenizer::Vocab> load_vocab(const kiln::gguf::File& file);
// load_vocab + tokenizer::Tokenizer::create.
Result<std::unique_ptr<kiln::tokenizer::Tokenizer>> load_tokenizer(const kiln::gguf::File& file);

}  // namespace kiln::model
