// chat/jinja/py_string.cpp — Python string operations on UTF-8 text (see py_string.h).
// Must not: know about templates or the interpreter. Threading: pure functions.
#include "chat/jinja/py_string.h"

#include <algorithm>
#include <cstring>

namespace kiln::chat::jinja {

std::string html_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '\'': o += "&#39;"; break;
      case '"': o += "&#34;"; break;
      default: o.push_back(c);
    }
  }
  return o;
}

namespace {

// The named entities html.unescape resolves that kiln knows; `bare`: also without the ';'
// (HTML's legacy spellings such as "&amp").
struct Entity {
  const char* name;
  uint32_t cp;
  bool bare;
};
constexpr Entity kEntities[] = {
    {"amp", '&', true},     {"lt", '<', true},       {"gt", '>', true},       {"quot", '"', true},
    {"apos", '\'', false},  {"nbsp", 0xa0, true},    {"copy", 0xa9, true},    {"reg", 0xae, true},
    {"laquo", 0xab, true},  {"raquo", 0xbb, true},   {"middot", 0xb7, true},  {"hellip", 0x2026, false},
    {"mdash", 0x2014, false}, {"ndash", 0x2013, false}, {"lsquo", 0x2018, false}, {"rsquo", 0x2019, false},
    {"ldquo", 0x201c, false}, {"rdquo", 0x201d, false}, {"bull", 0x2022, false}, {"trade", 0x2122, false},
    {"euro", 0x20ac, false},
};

// html.unescape: &#N; &#xN; (';' optional) and the named entities above.
std::string html_unescape(std::string_view s) {
  std::string out;
  size_t k = 0;
  while (k < s.size()) {
    size_t amp = s.find('&', k);
    if (amp == std::string_view::npos) break;
    out.append(s, k, amp - k);
    k = amp + 1;
    if (k < s.size() && s[k] == '#') {
      bool hex = k + 1 < s.size() && (s[k + 1] == 'x' || s[k + 1] == 'X');
      size_t d = k + (hex ? 2 : 1), e = d;
      uint64_t cp = 0;
      while (e < s.size() && (hex ? std::isxdigit(static_cast<unsigned char>(s[e])) : std::isdigit(static_cast<unsigned char>(s[e])))) {
        if (cp <= 0x10ffff) cp = cp * (hex ? 16 : 10) + uint64_t(std::isdigit(static_cast<unsigned char>(s[e])) ? s[e] - '0' : (s[e] | 0x20) - 'a' + 10);
        e++;
      }
      if (e == d) {
        out.push_back('&');
        continue;
      }
      if (cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd;
      utf8_append(out, uint32_t(cp));
      k = e < s.size() && s[e] == ';' ? e + 1 : e;
      continue;
    }
    size_t e = k;
    while (e < s.size() && e - k < 32 && !std::strchr("\t\n\f <&#;", s[e])) e++;
    std::string_view name = s.substr(k, e - k);
    const Entity* hit = nullptr;
    size_t used = 0;
    if (e < s.size() && s[e] == ';')
      for (const Entity& en : kEntities)
        if (name == en.name) hit = &en, used = name.size() + 1;
    if (!hit)  // the longest bare spelling that starts the name
      for (const Entity& en : kEntities)
        if (en.bare && name.substr(0, std::strlen(en.name)) == en.name && std::strlen(en.name) > used)
          hit = &en, used = std::strlen(en.name);
    if (!hit) {
      out.push_back('&');
      continue;
    }
    utf8_append(out, hit->cp);
    k += used;
  }
  out.append(s.substr(std::min(k, s.size())));
  return out;
}

}  // namespace

std::string strip_tags(std::string_view s) {
  std::string kept;
  size_t pos = 0;
  for (size_t start; (start = s.find('<', pos)) != std::string_view::npos;) {
    const bool comment = s.compare(start, 4, "<!--") == 0;
    size_t end = comment ? s.find("-->", start + 4) : s.find('>', start);
    if (end == std::string_view::npos) break;  // unclosed: kept as text
    kept.append(s, pos, start - pos);
    pos = end + (comment ? 3 : 1);
  }
  kept.append(s.substr(pos));
  std::string joined;
  for (const Value& w : py_split(kept, Value::none(), -1)) joined += (joined.empty() ? "" : " ") + w.sv();
  return html_unescape(joined);
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<uint32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) b++;
  if (right)
    while (e > b && strip_it(cps[e - 1])) e--;
  return utf8_encode(cps, b, e);
}

std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (sep.is_none() || sep.is_undefined()) {
    auto cps = utf8_decode(s);
    size_t i = 0, n = cps.size();
    while (true) {
      while (i < n && py_isspace(cps[i])) i++;
      if (i >= n) break;
      if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
        size_t e = n;
        while (e > i && py_isspace(cps[e - 1])) e--;
        out.push_back(Value::str(utf8_encode(cps, i, e)));
        break;
      }
      size_t j = i;
      while (j < n && !py_isspace(cps[j])) j++;
      out.push_back(Value::str(utf8_encode(cps, i, j)));
      i = j;
    }
    return out;
  }
  if (!sep.is_str()) fail("split", std::string("must be str or None, not ") + type_name(sep));
  const std::string& d = sep.sv();
  if (d.empty()) fail("split", "empty separator");
  size_t pos = 0;
  while (true) {
    if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) break;
    size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.push_back(Value::str(s.substr(pos, f - pos)));
    pos = f + d.size();
  }
  out.push_back(Value::str(s.substr(pos)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  std::string out;
  if (a.empty()) {
    auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); k++) {
      if (count < 0 || done < count) {
        out += b;
        done++;
      }
      if (k < cps.size()) utf8_append(out, cps[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(a, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += b;
    pos = f + a.size();
    done++;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  // \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029
  std::vector<std::string> out;
  auto cps = utf8_decode(s);
  size_t b = 0;
  for (size_t k = 0; k < cps.size(); k++) {
    uint32_t c = cps[k];
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      out.push_back(utf8_encode(cps, b, k));
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') k++;
      b = k + 1;
    }
  }
  if (b < cps.size()) out.push_back(utf8_encode(cps, b, cps.size()));
  return out;
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  return s;
}
std::string py_capitalize(std::string s) {
  s = ascii_lower(std::move(s));
  if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

namespace {
bool is_cased_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
}  // namespace

// ASCII letters; other bytes are case-less word breaks unless >= 0x80.
std::string py_title(const std::string& s) {
  std::string o = s;
  bool prev_cased = false;
  for (char& c : o) {
    bool alpha = is_cased_alpha(c);
    if (alpha) {
      c = prev_cased ? char(std::tolower(static_cast<unsigned char>(c))) : char(std::toupper(static_cast<unsigned char>(c)));
    }
    prev_cased = alpha || (static_cast<unsigned char>(c) >= 0x80 && prev_cased);
  }
  return o;
}

bool py_is_case(const std::string& s, bool upper) {
  bool cased = false;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (upper ? std::islower(u) : std::isupper(u)) return false;
    cased = cased || (upper ? std::isupper(u) : std::islower(u));
  }
  return cased;
}

std::string py_justify(const std::string& s, int64_t width, const std::string& fill, char how) {
  int64_t len = int64_t(utf8_length(s));
  if (len >= width) return s;
  int64_t pad = width - len, left = how == 'r' ? pad : how == 'c' ? pad / 2 + (pad & width & 1) : 0;
  std::string r;
  for (int64_t k = 0; k < left; k++) r += fill;
  r += s;
  for (int64_t k = 0; k < pad - left; k++) r += fill;
  return r;
}

bool is_word_cp(uint32_t c) {
  if (c < 0x80) return std::isalnum(int(c)) || c == '_';
  return !py_isspace(c);
}

namespace {

// textwrap's whitespace (ASCII only), letters ([^\d\W]) and word punctuation ([\w!"'&.,?]).
bool wrap_space(uint32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x0b || c == 0x0c; }
bool wrap_letter(uint32_t c) { return is_word_cp(c) && !(c >= '0' && c <= '9'); }
bool word_punct(uint32_t c) { return is_word_cp(c) || (c != 0 && c < 0x80 && std::strchr("!\"'&.,?", int(c))); }

// textwrap.TextWrapper._split: runs of whitespace and words; with break_on_hyphens a word
// also ends after a hyphen between letters ("long-term") and before an em-dash ("--").
std::vector<std::vector<uint32_t>> wrap_split(const std::vector<uint32_t>& t, bool hyphens) {
  const int64_t n = int64_t(t.size());
  auto at = [&](int64_t i) -> uint32_t { return i >= 0 && i < n ? t[size_t(i)] : 0; };
  auto dashes_then_word = [&](int64_t i) {  // -{2,}\w at i
    int64_t j = i;
    while (at(j) == '-') j++;
    return j - i >= 2 && is_word_cp(at(j)) ? j : int64_t(-1);
  };
  std::vector<std::vector<uint32_t>> chunks;
  for (int64_t i = 0; i < n;) {
    int64_t e = i + 1;
    if (wrap_space(t[size_t(i)])) {
      while (e < n && wrap_space(t[size_t(e)])) e++;
    } else if (!hyphens) {
      while (e < n && !wrap_space(t[size_t(e)])) e++;
    } else if (int64_t j = word_punct(at(i - 1)) ? dashes_then_word(i) : -1; j >= 0) {
      e = j;  // an em-dash between words
    } else {
      for (int64_t p = i + 1;; p++) {
        if (p >= n || wrap_space(t[size_t(p)])) {
          e = p;
          break;
        }
        if (at(p) == '-' && ((wrap_letter(at(p - 2)) && wrap_letter(at(p - 1))) ||
                             (wrap_letter(at(p - 3)) && at(p - 2) == '-' && wrap_letter(at(p - 1)))) &&
            wrap_letter(at(p + 1)) && (wrap_letter(at(p + 2)) || (at(p + 2) == '-' && wrap_letter(at(p + 3))))) {
          e = p + 1;
          break;
        }
        if (word_punct(at(p - 1)) && dashes_then_word(p) >= 0) {
          e = p;
          break;
        }
      }
    }
    chunks.emplace_back(t.begin() + i, t.begin() + e);
    i = e;
  }
  return chunks;
}

}  // namespace

std::vector<std::string> py_wrap(const std::string& text, int64_t width, bool break_long_words, bool break_on_hyphens) {
  using Chunk = std::vector<uint32_t>;
  std::vector<Chunk> chunks = wrap_split(utf8_decode(text), break_on_hyphens);
  std::reverse(chunks.begin(), chunks.end());  // the next chunk is at the back
  auto blank = [](const Chunk& c) { return std::all_of(c.begin(), c.end(), py_isspace); };
  std::vector<std::string> lines;
  while (!chunks.empty()) {
    if (!lines.empty() && blank(chunks.back())) chunks.pop_back();  // no line starts with whitespace
    std::vector<Chunk> line;
    int64_t len = 0;
    while (!chunks.empty() && len + int64_t(chunks.back().size()) <= width) {
      len += int64_t(chunks.back().size());
      line.push_back(std::move(chunks.back()));
      chunks.pop_back();
    }
    if (!chunks.empty() && int64_t(chunks.back().size()) > width) {  // a word longer than a line
      Chunk& c = chunks.back();
      if (break_long_words) {
        size_t end = size_t(width - len);
        if (break_on_hyphens) {  // break after the last hyphen that has a non-hyphen before it
          auto hy = std::find(std::make_reverse_iterator(c.begin() + end), c.rend(), uint32_t('-'));
          size_t h = size_t(c.rend() - hy) - 1;
          if (hy != c.rend() && h > 0 && std::any_of(c.begin(), c.begin() + h, [](uint32_t x) { return x != '-'; }))
            end = h + 1;
        }
        line.emplace_back(c.begin(), c.begin() + end);
        c.erase(c.begin(), c.begin() + end);
      } else if (line.empty()) {
        line.push_back(std::move(c));
        chunks.pop_back();
      }
    }
    if (!line.empty() && blank(line.back())) line.pop_back();
    if (line.empty()) continue;
    std::string s;
    for (const Chunk& c : line) s += utf8_encode(c, 0, c.size());
    lines.push_back(std::move(s));
  }
  return lines;
}

}  // namespace kiln::chat::jinja
