// chat/jinja/py_string.h — the Python string operations kiln's Jinja engine needs (internal):
//       str.strip/split/replace/title/splitlines/center…, markupsafe's escape and striptags,
//       textwrap.wrap as jinja2's |wordwrap calls it.
// Owns: their Python semantics on UTF-8 text (code point aware; case mapping ASCII-only).
// Must not: know about templates, filters or the interpreter (plain strings in, strings out;
//       errors are JinjaError via fail()).
// Threading: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja/value.h"

namespace kiln::chat::jinja {

// markupsafe.escape: & < > ' " as HTML entities.
std::string html_escape(std::string_view s);
// markupsafe's Markup(s).striptags(): drop <!-- comments --> and <tags>, collapse whitespace to
// single spaces, unescape entities (numeric ones and the common named ones).
std::string strip_tags(std::string_view s);

// str.strip / lstrip / rstrip. chars == nullptr → whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit): sep None/undefined → runs of whitespace.
std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit);
// str.replace(a, b, count); count < 0 → all.
std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count);
// str.splitlines() (without the line ends).
std::vector<std::string> split_lines(const std::string& s);

std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);
std::string py_capitalize(std::string s);  // str.capitalize()
std::string py_title(const std::string& s);  // str.title()
bool py_is_case(const std::string& s, bool upper);  // str.isupper() (upper) / str.islower()
// str.center / ljust / rjust / zfill (`how`: 'c', 'l', 'r'; zfill is 'r' with "0").
std::string py_justify(const std::string& s, int64_t width, const std::string& fill, char how);

// textwrap.wrap(text, width, expand_tabs=False, replace_whitespace=False, break_long_words,
// break_on_hyphens): the lines of one paragraph. width must be > 0.
std::vector<std::string> py_wrap(const std::string& text, int64_t width, bool break_long_words, bool break_on_hyphens);

// A Unicode "word" character (\w), approximated: ASCII letters, digits and '_', and every
// non-ASCII code point that is not whitespace.
bool is_word_cp(uint32_t cp);

}  // namespace kiln::chat::jinja
