// chat/jinja/lexer.cpp — Jinja2 lexer: template text, {{ }}, {% %} and {# #} tags with
//       whitespace control and trim_blocks / lstrip_blocks exactly as jinja2's lexer applies them,
//       Python string / number literals (see lexer.h).
// Must not: build AST nodes (the parser does: parser.cpp, parser_expr.cpp).
// Threading: pure functions.
#include "chat/jinja/lexer.h"

#include <cerrno>
#include <cstring>

namespace kiln::chat::jinja {

void syntax(int line, const std::string& msg) { throw JinjaError{"syntax", msg, line}; }

namespace {


bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python str.rstrip() (unicode whitespace).
size_t rstrip_len(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    unsigned char c = s[e - 1];
    if (c < 0x80) {
      if (py_isspace(c)) { e--; continue; }
      break;
    }
    size_t b = e - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80 && e - b < 4) b--;
    auto cps = utf8_decode(s.substr(b, e - b));
    if (cps.size() == 1 && py_isspace(cps[0])) { e = b; continue; }
    break;
  }
  return e;
}
// Length of the Python-whitespace prefix of s.
size_t lstrip_len(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    unsigned char c = s[b];
    if (c < 0x80) {
      if (py_isspace(c)) { b++; continue; }
      break;
    }
    size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    auto cps = utf8_decode(s.substr(b, len));
    if (cps.size() == 1 && py_isspace(cps[0])) { b += len; continue; }
    break;
  }
  return b;
}
bool all_space(std::string_view s) { return lstrip_len(s) == s.size(); }

// Python unicode-escape decoding of a string literal body (jinja2 does exactly this).
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    char c = s[i];
    if (c != '\\' || i + 1 >= s.size()) {
      out.push_back(c);
      continue;
    }
    char n = s[++i];
    auto hex = [&](int count) -> uint32_t {
      uint32_t v = 0;
      for (int k = 1; k <= count; k++) {
        if (i + k >= s.size()) syntax(line, "truncated escape in string literal");
        char h = s[i + k];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= h - '0';
        else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
        else syntax(line, "bad escape in string literal");
      }
      i += count;
      return v;
    };
    switch (n) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': utf8_append(out, hex(2)); break;
      case 'u': utf8_append(out, hex(4)); break;
      case 'U': {
        uint32_t v = hex(8);
        if (v > 0x10ffff) syntax(line, "bad \\U escape in string literal");
        utf8_append(out, v);
        break;
      }
      default:
        if (n >= '0' && n <= '7') {
          uint32_t v = n - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) v = v * 8 + (s[++i] - '0');
          utf8_append(out, v);
        } else {
          out.push_back('\\');
          out.push_back(n);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const Options& o) : s_(std::move(src)), o_(o) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t start = s_.find('{', pos);
      while (start != std::string::npos && start + 1 < s_.size() && !std::strchr("{%#", s_[start + 1]))
        start = s_.find('{', start + 1);
      if (start == std::string::npos || start + 1 >= s_.size()) {
        emit_data(s_.substr(pos));
        break;
      }
      char kind = s_[start + 1];
      char sign = start + 2 < s_.size() ? s_[start + 2] : 0;
      if (sign != '-' && sign != '+') sign = 0;
      std::string text = s_.substr(pos, start - pos);
      if (sign == '-') {
        text.resize(rstrip_len(text));
      } else if (sign != '+' && o_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      emit_data(text);
      size_t p = start + 2 + (sign ? 1 : 0);
      int tag_line = line_at(start);
      if (kind == '#') {
        size_t e = s_.find("#}", p);
        if (e == std::string::npos) syntax(tag_line, "missing end of comment tag");
        char esign = e > p && (s_[e - 1] == '-' || s_[e - 1] == '+') ? s_[e - 1] : 0;
        pos = tag_tail(e + 2, esign, /*trims=*/true, line_starting);
        continue;
      }
      if (kind == '%' && is_raw(p)) {
        pos = lex_raw(p, tag_line, line_starting);
        continue;
      }
      toks_.push_back({kind == '{' ? TT::VarBegin : TT::BlockBegin, "", tag_line, {}});
      pos = lex_tag(p, kind == '%', tag_line, line_starting);
    }
    toks_.push_back({TT::Eof, "", line_at(s_.size()), {}});
    return std::move(toks_);
  }

 private:
  std::string s_;
  const Options& o_;
  std::vector<Token> toks_;
  size_t line_pos_ = 0;
  int line_ = 1;

  int line_at(size_t pos) {
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < s_.size(); line_pos_++)
      if (s_[line_pos_] == '\n') line_++;
    return line_;
  }
  void emit_data(std::string text) {
    if (!text.empty()) toks_.push_back({TT::Data, std::move(text), 0, {}});
  }

  // Whitespace control after a tag's closing delimiter (which ends just before `after`):
  // "-" strips the following whitespace; otherwise trim_blocks drops one newline after a
  // block/comment tag (`trims`), unless "+" says not to. Returns where the text resumes.
  size_t tag_tail(size_t after, char sign, bool trims, bool& line_starting) {
    if (sign == '-') after += lstrip_len(std::string_view(s_).substr(after));
    else if (sign != '+' && trims && o_.trim_blocks && after < s_.size() && s_[after] == '\n') after++;
    line_starting = s_[after - 1] == '\n';
    return after;
  }

  bool is_raw(size_t p) {
    size_t q = p;
    while (q < s_.size() && ascii_space(s_[q])) q++;
    if (s_.compare(q, 3, "raw") != 0) return false;
    q += 3;
    while (q < s_.size() && ascii_space(s_[q])) q++;
    return s_.compare(q, 2, "%}") == 0 || s_.compare(q, 3, "-%}") == 0 || s_.compare(q, 3, "+%}") == 0;
  }
  size_t lex_raw(size_t p, int line, bool& line_starting) {
    size_t q = s_.find("%}", p);
    bool strip_after = s_[q - 1] == '-';
    size_t body = q + 2;
    if (strip_after) body += lstrip_len(std::string_view(s_).substr(body));
    // find {% endraw %}
    size_t search = body;
    while (true) {
      size_t t = s_.find("{%", search);
      if (t == std::string::npos) syntax(line, "missing end of raw directive");
      size_t r = t + 2;
      char sign = r < s_.size() && (s_[r] == '-' || s_[r] == '+') ? s_[r] : 0;
      if (sign) r++;
      while (r < s_.size() && ascii_space(s_[r])) r++;
      if (s_.compare(r, 6, "endraw") == 0) {
        r += 6;
        while (r < s_.size() && ascii_space(s_[r])) r++;
        char esign = 0;
        if (r < s_.size() && (s_[r] == '-' || s_[r] == '+')) esign = s_[r++];
        if (s_.compare(r, 2, "%}") == 0) {
          std::string text = s_.substr(body, t - body);
          if (sign == '-') text.resize(rstrip_len(text));
          emit_data(text);
          return tag_tail(r + 2, esign, /*trims=*/true, line_starting);
        }
      }
      search = t + 2;
    }
  }

  size_t lex_tag(size_t p, bool block, int begin_line, bool& line_starting) {
    int depth = 0;
    while (true) {
      while (p < s_.size() && lstrip_len(std::string_view(s_).substr(p, 4)) > 0)
        p += lstrip_len(std::string_view(s_).substr(p, 4));
      if (p >= s_.size()) syntax(begin_line, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      int line = line_at(p);
      if (depth == 0) {
        const char* end = block ? "%}" : "}}";
        bool minus = s_[p] == '-' && s_.compare(p + 1, 2, end) == 0;
        bool plus = block && s_[p] == '+' && s_.compare(p + 1, 2, end) == 0;
        if (minus || plus || s_.compare(p, 2, end) == 0) {
          toks_.push_back({block ? TT::BlockEnd : TT::VarEnd, "", line, {}});
          return tag_tail(p + 2 + (minus || plus ? 1 : 0), minus ? '-' : plus ? '+' : 0, block, line_starting);
        }
      }
      char c = s_[p];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p, line);
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) q++;
        toks_.push_back({TT::Name, s_.substr(p, q - p), line, {}});
        p = q;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = p + 1;
        while (q < s_.size() && s_[q] != c) q += s_[q] == '\\' ? 2 : 1;
        if (q >= s_.size()) syntax(line, "unexpected end of string literal");
        toks_.push_back({TT::String, unescape(std::string_view(s_).substr(p + 1, q - p - 1), line), line, {}});
        p = q + 1;
        continue;
      }
      static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
      bool found = false;
      for (const char* o : ops2)
        if (s_.compare(p, 2, o) == 0) {
          toks_.push_back({TT::Op, o, line, {}});
          p += 2;
          found = true;
          break;
        }
      if (found) continue;
      if (std::strchr("+-/*%~[](){}<>=.:|,;", c)) {
        if (c == '(' || c == '[' || c == '{') depth++;
        if (c == ')' || c == ']' || c == '}') {
          if (depth == 0) syntax(line, std::string("unexpected '") + c + "'");
          depth--;
        }
        toks_.push_back({TT::Op, std::string(1, c), line, {}});
        p++;
        continue;
      }
      syntax(line, std::string("unexpected char '") + c + "'");
    }
  }

  size_t lex_number(size_t p, int line) {
    auto digits = [&](size_t q) {  // (\d+_)*\d+ ; returns end or q when none
      size_t r = q;
      while (r < s_.size() && std::isdigit(static_cast<unsigned char>(s_[r]))) {
        while (r < s_.size() && std::isdigit(static_cast<unsigned char>(s_[r]))) r++;
        if (r + 1 < s_.size() && s_[r] == '_' && std::isdigit(static_cast<unsigned char>(s_[r + 1]))) r++;
      }
      return r;
    };
    size_t q = digits(p);
    size_t end = q;
    bool is_float = false;
    if (q + 1 < s_.size() && s_[q] == '.' && std::isdigit(static_cast<unsigned char>(s_[q + 1]))) {
      end = digits(q + 1);
      is_float = true;
    }
    if (end < s_.size() && (s_[end] == 'e' || s_[end] == 'E')) {
      size_t r = end + 1;
      if (r < s_.size() && (s_[r] == '+' || s_[r] == '-')) r++;
      size_t r2 = digits(r);
      if (r2 > r) {
        end = r2;
        is_float = true;
      }
    }
    std::string txt;
    for (size_t k = p; k < end; k++)
      if (s_[k] != '_') txt.push_back(s_[k]);
    Token t{is_float ? TT::Float : TT::Int, txt, line, {}};
    if (is_float) {
      t.num = Value::flt(std::strtod(txt.c_str(), nullptr));
    } else {
      errno = 0;
      long long v = std::strtoll(txt.c_str(), nullptr, 10);
      if (errno == ERANGE) syntax(line, "integer literal too large");
      t.num = Value::integer(v);
    }
    toks_.push_back(std::move(t));
    return end;
  }
};

}  // namespace

std::vector<Token> lex(std::string_view source, const Options& opt) {
  // jinja2 normalises newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); k++) {
    if (source[k] == '\r') {
      src.push_back('\n');
      if (k + 1 < source.size() && source[k + 1] == '\n') k++;
    } else {
      src.push_back(source[k]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), opt).run();
}

}  // namespace kiln::chat::jinja
