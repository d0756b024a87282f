// tokenizer/utf8.h — small UTF-8 helpers shared by the tokenizer and its tests.
// Owns: encoding a code point, lead-byte lengths, lenient decoding, sanitizing to valid UTF-8.
// Threading: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::tokenizer {

std::string utf8_encode(uint32_t cpt);  // cpt must be <= 0x10FFFF

// Sequence length announced by a lead byte (1 for ASCII and for stray continuation bytes).
inline size_t utf8_seq_len(uint8_t c) {
  if (c < 0xC0) return 1;
  if (c < 0xE0) return 2;
  if (c < 0xF0) return 3;
  return 4;
}

// Decodes one code point at s[i] and advances i; an invalid byte yields U+FFFD and advances 1.
uint32_t utf8_decode_lenient(std::string_view s, size_t& i);

// Returns s with every byte that is not part of a valid UTF-8 sequence (stray continuation
// bytes, truncated sequences, overlong forms, surrogates, > U+10FFFF) replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

}  // namespace kiln::tokenizer
