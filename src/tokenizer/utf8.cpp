#include "tokenizer/utf8.h"

namespace kiln::tokenizer {

std::string utf8_encode(uint32_t c) {
  std::string r;
  if (c < 0x80) {
    r += char(c);
  } else if (c < 0x800) {
    r += char(0xC0 | (c >> 6));
    r += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    r += char(0xE0 | (c >> 12));
    r += char(0x80 | ((c >> 6) & 0x3F));
    r += char(0x80 | (c & 0x3F));
  } else {
    r += char(0xF0 | (c >> 18));
    r += char(0x80 | ((c >> 12) & 0x3F));
    r += char(0x80 | ((c >> 6) & 0x3F));
    r += char(0x80 | (c & 0x3F));
  }
  return r;
}

namespace {
// Length of the valid sequence at s[i], or 0 if the byte at i does not start one.
size_t valid_len(std::string_view s, size_t i, uint32_t& cpt) {
  uint8_t c = uint8_t(s[i]);
  if (c < 0x80) {
    cpt = c;
    return 1;
  }
  size_t n;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) { n = 2; cpt = c & 0x1F; min = 0x80; }
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; cpt = c & 0x0F; min = 0x800; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; cpt = c & 0x07; min = 0x10000; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    uint8_t d = uint8_t(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cpt = (cpt << 6) | (d & 0x3F);
  }
  if (cpt < min || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) return 0;
  return n;
}
}  // namespace

uint32_t utf8_decode_lenient(std::string_view s, size_t& i) {
  uint32_t cpt = 0;
  size_t n = valid_len(s, i, cpt);
  if (n == 0) {
    ++i;
    return 0xFFFD;
  }
  i += n;
  return cpt;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cpt;
    size_t n = valid_len(s, i, cpt);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace kiln::tokenizer
