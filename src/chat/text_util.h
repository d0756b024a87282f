// chat/text_util.h — small text helpers shared by the chat layer's tool-call readers
//   (output_parser.cpp, tool_calls.cpp, tool_formats.cpp, tool_stream.cpp).
// Owns: whitespace tests and trimming, prefix tests, the longest partial-marker suffix, the check of a
//   tool name as the formats write it, a JSON dump that never throws on invalid UTF-8.
// Must not: hold state or know any format's markers.
// Threading: pure functions; safe from any thread.
#pragma once
#include <algorithm>
#include <string>
#include <string_view>

#include "chat/chat.h"

namespace kiln::chat::text {

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Compact JSON; invalid UTF-8 in strings is replaced, never thrown.
inline std::string dump_safe(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// A tool name as a call writes it: 1–128 bytes, no markup, quotes or whitespace.
inline bool valid_tool_name(std::string_view n) {
  return !n.empty() && n.size() <= 128 && n.find_first_of("<>{}[]\"\n\r\t ") == std::string_view::npos;
}

// Length of the longest proper suffix of `s` that is a prefix of `marker` (what must be held back
// because the next chunk might complete the marker).
inline size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
  if (marker.empty()) return 0;
  const size_t max = std::min(s.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace kiln::chat::text
