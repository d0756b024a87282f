// chat/jinja/parser.cpp — Jinja2 lexer (with trim_blocks/lstrip_blocks exactly as jinja2's
// lexer applies them) and recursive-descent parser producing the AST in ast.h.
#include <cstring>
#include <unordered_set>

#include "chat/jinja/ast.h"
#include "chat/jinja/registry.h"

namespace kiln::chat::jinja {
namespace {

enum class TT : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  TT type;
  std::string val;
  int line;
  Value num;  // Int/Float value
};

[[noreturn]] void syntax(int line, const std::string& msg) { throw JinjaError{"syntax", msg, line}; }

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

// ---------------------------------------------------------------------------------------
class Parser {
 public:
  Parser(std::vector<Token> toks, detail::Program& prog) : t_(std::move(toks)), prog_(prog) {}

  std::vector<Node*> parse_all() {
    std::vector<Node*> body = subparse({});
    if (cur().type != TT::Eof) syntax(cur().line, "unexpected '" + cur().val + "'");
    return body;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  detail::Program& prog_;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::unordered_set<std::string> block_names_;  // jinja2: a block name is defined once

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) i_++;
  }
  bool is_op(const char* o) const { return cur().type == TT::Op && cur().val == o; }
  bool is_name(const char* n) const { return cur().type == TT::Name && cur().val == n; }
  bool skip_op(const char* o) {
    if (!is_op(o)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* o) {
    if (!skip_op(o)) syntax(cur().line, std::string("expected '") + o + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TT::Name) syntax(cur().line, "expected a name, got " + describe(cur()));
    std::string n = cur().val;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TT::BlockEnd) syntax(cur().line, "expected end of statement block, got " + describe(cur()));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TT::Eof: return "end of template";
      case TT::BlockEnd: return "end of statement block";
      case TT::VarEnd: return "end of print statement";
      case TT::String: return "string";
      default: return "'" + t.val + "'";
    }
  }

  Node* mk(NK k, int line) {
    prog_.arena.push_back(std::make_unique<Node>());
    Node* n = prog_.arena.back().get();
    n->kind = k;
    n->line = line;
    return n;
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp, int line) : p(pp) {
      if (++p.depth_ > 300) syntax(line, "template nesting too deep");
    }
    ~DepthGuard() { p.depth_--; }
  };

  // Parses statements until a block tag whose first name is in `ends` (left unconsumed,
  // positioned at that name) or EOF.
  std::vector<Node*> subparse(const std::vector<const char*>& ends) {
    std::vector<Node*> body;
    while (cur().type != TT::Eof) {
      const Token& tk = cur();
      if (tk.type == TT::Data) {
        Node* n = mk(NK::Text, tk.line);
        n->name = tk.val;
        body.push_back(n);
        next();
      } else if (tk.type == TT::VarBegin) {
        int line = tk.line;
        next();
        Node* n = mk(NK::Emit, line);
        n->ch.push_back(parse_tuple({}));
        if (cur().type != TT::VarEnd) syntax(cur().line, "expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(n);
      } else if (tk.type == TT::BlockBegin) {
        next();
        if (cur().type == TT::Name)
          for (const char* e : ends)
            if (cur().val == e) return body;
        body.push_back(parse_statement());
      } else {
        syntax(tk.line, "unexpected " + describe(tk));
      }
    }
    if (!ends.empty()) {
      std::string want;
      for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
      syntax(cur().line, "unexpected end of template, expected " + want);
    }
    return body;
  }

  Node* parse_statement() {
    DepthGuard g(*this, cur().line);
    if (cur().type != TT::Name) syntax(cur().line, "tag name expected");
    std::string kw = cur().val;
    int line = cur().line;
    next();
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "call") return parse_call_block(line);
    if (kw == "filter") return parse_filter_block(line);
    if (kw == "block") return parse_block(line);
    if (kw == "include" || kw == "import" || kw == "from" || kw == "extends") return parse_load(kw, line);
    if (kw == "with") {  // {% with a = x, b = y %} ... {% endwith %}: a scope of its own
      Node* n = mk(NK::With, line);
      while (cur().type != TT::BlockEnd) {
        if (!n->names.empty()) expect_op(",");
        n->names.push_back(expect_name());
        expect_op("=");
        n->ch.push_back(parse_expression());
      }
      expect_block_end();
      n->blocks.push_back(subparse({"endwith"}));
      next();
      expect_block_end();
      return n;
    }
    if (kw == "generation") {
      expect_block_end();
      Node* n = mk(NK::Generation, line);
      n->blocks.push_back(subparse({"endgeneration"}));
      next();
      expect_block_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) syntax(line, "'" + kw + "' outside of a loop");
      expect_block_end();
      return mk(kw == "break" ? NK::Break : NK::Continue, line);
    }
    syntax(line, "encountered unknown tag '" + kw + "'");
  }

  Node* parse_if(int line) {
    Node* n = mk(NK::If, line);
    while (true) {
      n->ch.push_back(parse_tuple({}));
      expect_block_end();
      n->blocks.push_back(subparse({"elif", "else", "endif"}));
      std::string tag = cur().val;
      next();
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end();
        n->blocks.push_back(subparse({"endif"}));
        next();
      }
      break;
    }
    expect_block_end();
    return n;
  }

  void parse_targets(Node* n, bool allow_ns) {
    // name | name.attr | name, name, ... | (name, name)
    bool paren = skip_op("(");
    std::string first = expect_name();
    if (allow_ns && !paren && skip_op(".")) {
      n->names.push_back(first);
      n->attr = expect_name();
      return;
    }
    n->names.push_back(first);
    while (skip_op(",")) {
      n->unpack = true;
      if (cur().type != TT::Name) break;
      n->names.push_back(expect_name());
    }
    if (paren) {
      n->unpack = true;
      expect_op(")");
    }
  }

  Node* parse_for(int line) {
    Node* n = mk(NK::For, line);
    parse_targets(n, false);
    if (!skip_name("in")) syntax(cur().line, "expected 'in', got " + describe(cur()));
    n->ch.push_back(parse_tuple({"recursive"}, false));
    n->ch.push_back(nullptr);
    if (skip_name("if")) n->ch[1] = parse_expression();
    n->recursive = skip_name("recursive");
    expect_block_end();
    loop_depth_++;
    n->blocks.push_back(subparse({"endfor", "else"}));
    loop_depth_--;
    if (cur().val == "else") {
      next();
      expect_block_end();
      n->blocks.push_back(subparse({"endfor"}));
    } else {
      n->blocks.emplace_back();
    }
    next();
    expect_block_end();
    return n;
  }

  Node* parse_set(int line) {
    Node* n = mk(NK::Set, line);
    parse_targets(n, true);
    if (skip_op("=")) {
      n->ch.push_back(parse_tuple({}));
      expect_block_end();
      return n;
    }
    if (n->unpack || !n->attr.empty()) syntax(line, "block set needs a single name");
    n->kind = NK::SetBlock;
    if (is_op("|")) n->ch = parse_filter_chain(nullptr);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->blocks.push_back(subparse({"endset"}));
    loop_depth_ = saved;
    next();
    expect_block_end();
    return n;
  }

  void parse_signature(Node* n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n->names.empty()) expect_op(",");
      if (is_op(")")) break;
      n->names.push_back(expect_name());
      if (skip_op("=")) n->ch.push_back(parse_expression());
      else {
        if (!n->ch.empty() && n->ch.back() && n->kind == NK::Macro) syntax(cur().line, "non-default argument follows default argument");
        n->ch.push_back(nullptr);
      }
    }
    expect_op(")");
  }

  Node* parse_macro(int line) {
    Node* n = mk(NK::Macro, line);
    n->name = expect_name();
    parse_signature(n);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->blocks.push_back(subparse({"endmacro"}));
    loop_depth_ = saved;
    next();
    expect_block_end();
    catch_extra(n);
    return n;
  }
  // jinja2's macros take extra positional / keyword arguments only where the body reads `varargs` /
  // `kwargs` (decided from the source, as jinja2's compiler does).
  // (Nested macro definitions and call-block bodies are macros of their own.)
  static bool reads(const Node* n, const char* name) {
    if (n == nullptr || n->kind == NK::Macro) return false;
    if (n->kind == NK::Name && n->name == name) return true;
    if (reads(n->star, name) || reads(n->dstar, name)) return true;
    for (const Node* c : n->ch)
      if (reads(c, name)) return true;
    if (n->kind == NK::CallBlock) return false;
    for (const auto& b : n->blocks)
      for (const Node* c : b)
        if (reads(c, name)) return true;
    return false;
  }
  static void catch_extra(Node* m) {
    for (const Node* c : m->blocks[0]) {
      m->catch_varargs = m->catch_varargs || reads(c, "varargs");
      m->catch_kwargs = m->catch_kwargs || reads(c, "kwargs");
    }
  }

  Node* parse_call_block(int line) {
    Node* n = mk(NK::CallBlock, line);
    Node sig;
    sig.kind = NK::Macro;
    if (is_op("(")) parse_signature(&sig);
    Node* call = parse_expression();
    if (call->kind != NK::Call) syntax(line, "expected call");
    n->ch.push_back(call);
    n->names = sig.names;
    for (Node* d : sig.ch) n->ch.push_back(d);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->blocks.push_back(subparse({"endcall"}));
    loop_depth_ = saved;
    next();
    expect_block_end();
    catch_extra(n);
    return n;
  }

  Node* parse_filter_block(int line) {
    Node* n = mk(NK::FilterBlock, line);
    n->ch = parse_filter_chain(nullptr, true);
    expect_block_end();
    n->blocks.push_back(subparse({"endfilter"}));
    next();
    expect_block_end();
    return n;
  }

  // {% block name [scoped] [required] %}…{% endblock [name] %}
  Node* parse_block(int line) {
    Node* n = mk(NK::Block, line);
    n->name = expect_name();
    if (!block_names_.insert(n->name).second) syntax(line, "block '" + n->name + "' defined twice");
    if (is_name("scoped")) n->scoped = true, next();
    if (is_name("required")) n->required = true, next();
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;  // a block is a function of its own: no break / continue out of it
    n->blocks.push_back(subparse({"endblock"}));
    loop_depth_ = saved;
    next();
    if (cur().type == TT::Name) {
      if (cur().val != n->name) syntax(cur().line, "endblock '" + cur().val + "' does not close block '" + n->name + "'");
      next();
    }
    expect_block_end();
    if (n->required)
      for (const Node* c : n->blocks[0])
        if (c->kind != NK::Text || c->name.find_first_not_of(" \t\n\r\f\v") != std::string::npos)
          syntax(line, "Required blocks can only contain comments or whitespace");
    return n;
  }

  // {% include name [ignore missing] [with|without context] %}, {% import name as x %},
  // {% from name import a [as b], … %}, {% extends name %}: parsed like jinja2, failing when
  // executed (a chat template is a single string; there is nothing to load).
  Node* parse_load(const std::string& kw, int line) {
    Node* n = mk(NK::Load, line);
    n->name = kw;
    n->ch.push_back(parse_expression());
    auto context_modifier = [&] {
      return (is_name("with") || is_name("without")) && peek().type == TT::Name && peek().val == "context";
    };
    if (kw == "include" && is_name("ignore") && peek().type == TT::Name && peek().val == "missing") {
      next();
      next();
    } else if (kw == "import") {
      if (!is_name("as")) syntax(cur().line, "expected 'as', got " + describe(cur()));
      next();
      expect_name();
    } else if (kw == "from") {
      if (!is_name("import")) syntax(cur().line, "expected 'import', got " + describe(cur()));
      next();
      while (!context_modifier()) {
        expect_name();
        if (is_name("as")) next(), expect_name();
        if (!is_op(",")) break;
        next();
      }
    }
    if (kw != "extends" && context_modifier()) {
      next();
      next();
    }
    expect_block_end();
    return n;
  }

  // ---- expressions ----
  Node* parse_expression(bool with_condexpr = true) {
    DepthGuard g(*this, cur().line);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  Node* parse_tuple(std::vector<const char*> extra_end, bool with_condexpr = true) {
    int line = cur().line;
    std::vector<Node*> items;
    bool is_tuple = false;
    auto at_end = [&]() {
      if (cur().type == TT::VarEnd || cur().type == TT::BlockEnd || cur().type == TT::Eof) return true;
      if (is_op(")")) return true;
      for (const char* e : extra_end)
        if (is_name(e)) return true;
      return false;
    };
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
      }
      if (at_end()) break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!is_tuple) {
      if (items.empty()) syntax(line, "expected an expression, got " + describe(cur()));
      return items[0];
    }
    Node* n = mk(NK::TupleLit, line);
    n->ch = items;
    return n;
  }

  Node* parse_condexpr() {
    int line = cur().line;
    Node* e1 = parse_or();
    while (skip_name("if")) {
      Node* test = parse_or();
      Node* e3 = nullptr;
      if (skip_name("else")) e3 = parse_condexpr();
      Node* n = mk(NK::CondExpr, line);
      n->ch = {test, e1, e3};
      e1 = n;
    }
    return e1;
  }
  Node* parse_or() {
    Node* l = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      next();
      Node* n = mk(NK::Or, line);
      n->ch = {l, parse_and()};
      l = n;
    }
    return l;
  }
  Node* parse_and() {
    Node* l = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      next();
      Node* n = mk(NK::And, line);
      n->ch = {l, parse_not()};
      l = n;
    }
    return l;
  }
  Node* parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this, cur().line);
      Node* n = mk(NK::Not, cur().line);
      next();
      n->ch = {parse_not()};
      return n;
    }
    return parse_compare();
  }
  Node* parse_compare() {
    int line = cur().line;
    Node* e = parse_math1();
    Node* cmp = nullptr;
    while (true) {
      std::string op;
      if (cur().type == TT::Op && (cur().val == "==" || cur().val == "!=" || cur().val == "<" || cur().val == ">" ||
                                   cur().val == "<=" || cur().val == ">=")) {
        op = cur().val;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == TT::Name && peek().val == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = mk(NK::Compare, line);
        cmp->ch.push_back(e);
      }
      cmp->names.push_back(op);
      cmp->ch.push_back(parse_math1());
    }
    return cmp ? cmp : e;
  }
  Node* binop(const std::string& op, Node* l, Node* r, int line) {
    Node* n = mk(NK::BinOp, line);
    n->name = op;
    n->ch = {l, r};
    return n;
  }
  Node* parse_math1() {
    Node* l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().val;
      int line = cur().line;
      next();
      l = binop(op, l, parse_concat(), line);
    }
    return l;
  }
  Node* parse_concat() {
    Node* l = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      next();
      l = binop("~", l, parse_math2(), line);
    }
    return l;
  }
  Node* parse_math2() {
    Node* l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().val;
      int line = cur().line;
      next();
      l = binop(op, l, parse_pow(), line);
    }
    return l;
  }
  Node* parse_pow() {
    Node* l = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      next();
      l = binop("**", l, parse_unary(true), line);
    }
    return l;
  }
  Node* parse_unary(bool with_filter) {
    DepthGuard g(*this, cur().line);
    Node* n;
    int line = cur().line;
    if (is_op("-") || is_op("+")) {
      bool neg = is_op("-");
      next();
      n = mk(neg ? NK::Neg : NK::Pos, line);
      n->ch = {parse_unary(false)};
    } else {
      n = parse_primary();
    }
    n = parse_postfix(n);
    if (with_filter) n = parse_filter_expr(n);
    return n;
  }
  Node* parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == TT::Name) {
      const std::string& v = tk.val;
      Node* n = mk(NK::Const, line);
      if (v == "true" || v == "True") n->cval = Value::boolean(true);
      else if (v == "false" || v == "False") n->cval = Value::boolean(false);
      else if (v == "none" || v == "None") n->cval = Value::none();
      else {
        n->kind = NK::Name;
        n->name = v;
      }
      next();
      return n;
    }
    if (tk.type == TT::String) {
      std::string s;
      while (cur().type == TT::String) {
        s += cur().val;
        next();
      }
      Node* n = mk(NK::Const, line);
      n->cval = Value::str(std::move(s));
      return n;
    }
    if (tk.type == TT::Int || tk.type == TT::Float) {
      Node* n = mk(NK::Const, line);
      n->cval = tk.num;
      next();
      return n;
    }
    if (is_op("(")) {
      next();
      if (skip_op(")")) {
        Node* n = mk(NK::TupleLit, line);
        return n;
      }
      Node* first = parse_expression();
      if (skip_op(")")) return first;
      Node* n = mk(NK::TupleLit, line);
      n->ch.push_back(first);
      while (skip_op(",")) {
        if (is_op(")")) break;
        n->ch.push_back(parse_expression());
      }
      expect_op(")");
      return n;
    }
    if (is_op("[")) {
      next();
      Node* n = mk(NK::ListLit, line);
      while (!is_op("]")) {
        if (!n->ch.empty()) expect_op(",");
        if (is_op("]")) break;
        n->ch.push_back(parse_expression());
      }
      expect_op("]");
      return n;
    }
    if (is_op("{")) {
      next();
      Node* n = mk(NK::DictLit, line);
      while (!is_op("}")) {
        if (!n->ch.empty()) expect_op(",");
        if (is_op("}")) break;
        n->ch.push_back(parse_expression());
        expect_op(":");
        n->ch.push_back(parse_expression());
      }
      expect_op("}");
      return n;
    }
    syntax(line, "unexpected " + describe(tk));
  }
  Node* parse_postfix(Node* n) {
    while (true) {
      if (is_op(".") || is_op("[")) n = parse_subscript(n);
      else if (is_op("(")) n = parse_call(n);
      else break;
    }
    return n;
  }
  Node* parse_filter_expr(Node* n) {
    while (true) {
      if (is_op("|")) {
        auto chain = parse_filter_chain(n);
        n = chain.back();
      } else if (is_name("is")) {
        n = parse_test(n);
      } else if (is_op("(")) {
        n = parse_call(n);
      } else {
        break;
      }
    }
    return n;
  }
  Node* parse_subscript(Node* obj) {
    int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == TT::Name) {
        Node* n = mk(NK::Getattr, line);
        n->ch = {obj};
        n->name = cur().val;
        next();
        return n;
      }
      if (cur().type == TT::Int) {
        Node* n = mk(NK::Getitem, line);
        Node* k = mk(NK::Const, line);
        k->cval = cur().num;
        n->ch = {obj, k};
        next();
        return n;
      }
      syntax(line, "expected name or number after '.'");
    }
    expect_op("[");
    std::vector<Node*> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.empty()) syntax(line, "expected subscript expression");
    Node* n = mk(NK::Getitem, line);
    if (args.size() == 1) {
      n->ch = {obj, args[0]};
    } else {
      Node* t = mk(NK::TupleLit, line);
      t->ch = args;
      n->ch = {obj, t};
    }
    return n;
  }
  Node* parse_subscribed() {
    int line = cur().line;
    Node* start = nullptr;
    if (!is_op(":")) {
      start = parse_expression();
      if (!is_op(":")) return start;
    }
    next();  // ':'
    Node* sl = mk(NK::Slice, line);
    sl->ch = {start, nullptr, nullptr};
    if (!is_op("]") && !is_op(",") && !is_op(":")) sl->ch[1] = parse_expression();
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) sl->ch[2] = parse_expression();
    }
    return sl;
  }
  void parse_args(Node* n) {
    expect_op("(");
    bool kw_seen = false;
    std::vector<Node*> pos, kwv;
    while (!is_op(")")) {
      if (!pos.empty() || !kwv.empty() || n->star || n->dstar) expect_op(",");
      if (is_op(")")) break;
      if (n->dstar) syntax(cur().line, "arguments after **kwargs");
      if (is_op("**")) {
        next();
        n->dstar = parse_expression();
        kw_seen = true;
        continue;
      }
      if (is_op("*")) {
        if (n->star || kw_seen) syntax(cur().line, "*args after keyword arguments or a second *args");
        next();
        n->star = parse_expression();
        continue;
      }
      if (cur().type == TT::Name && peek().type == TT::Op && peek().val == "=") {
        n->names.push_back(cur().val);
        next();
        next();
        kwv.push_back(parse_expression());
        kw_seen = true;
      } else {
        if (kw_seen || n->star) syntax(cur().line, "positional argument follows keyword argument or *args");
        pos.push_back(parse_expression());
      }
    }
    expect_op(")");
    n->n_pos = int(pos.size());
    for (Node* p : pos) n->ch.push_back(p);
    for (Node* k : kwv) n->ch.push_back(k);
  }
  Node* parse_call(Node* callee) {
    Node* n = mk(NK::Call, cur().line);
    n->ch.push_back(callee);
    parse_args(n);
    return n;
  }
  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TT::Name) {
      next();
      name += "." + expect_name();
    }
    return name;
  }
  // `| f(args) | g …` applied to `input` (nullptr in a filter block / block set).
  std::vector<Node*> parse_filter_chain(Node* input, bool start_inline = false) {
    std::vector<Node*> chain;
    while (start_inline || is_op("|")) {
      if (!start_inline) next();
      start_inline = false;
      Node* f = mk(NK::Filter, cur().line);
      f->name = dotted_name();
      f->ch.push_back(input);
      if (is_op("(")) parse_args(f);
      chain.push_back(f);
      input = f;
      if (!chain.empty() && chain.size() > 1) {
        // for blocks: each filter takes the previous one's output; keep only the chain end
      }
    }
    return chain;
  }
  Node* parse_test(Node* input) {
    int line = cur().line;
    next();  // 'is'
    bool negated = skip_name("not");
    Node* t = mk(NK::Test, line);
    t->name = dotted_name();
    t->ch.push_back(input);
    if (is_op("(")) {
      parse_args(t);
    } else if ((cur().type == TT::Name || cur().type == TT::String || cur().type == TT::Int || cur().type == TT::Float ||
                is_op("(") || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) syntax(line, "you cannot chain multiple tests with is");
      Node* arg = parse_primary();
      arg = parse_postfix(arg);
      t->ch.push_back(arg);
      t->n_pos = 1;
    }
    if (!negated) return t;
    Node* n = mk(NK::Not, line);
    n->ch = {t};
    return n;
  }
};

// jinja2 checks filter/test names at compile time, except inside if-statements and
// conditional expressions up to the nearest frame (for/macro/call/filter/block set), where
// an unknown name only fails when executed.
void check_names(Node* n, bool soft) {
  if (!n) return;
  switch (n->kind) {
    case NK::Filter:
    case NK::Test:
      if (!(n->kind == NK::Filter ? find_filter(n->name) != nullptr : find_test(n->name) != nullptr)) {
        if (!soft) throw JinjaError{n->kind == NK::Filter ? "filter" : "test",
                                    std::string("no ") + (n->kind == NK::Filter ? "filter" : "test") + " named '" + n->name + "'",
                                    n->line};
        n->soft = true;
      }
      break;
    case NK::If:
    case NK::CondExpr: soft = true; break;
    case NK::For:
      check_names(n->ch[0], soft);
      check_names(n->ch[1], false);
      for (auto& b : n->blocks)
        for (Node* c : b) check_names(c, false);
      return;
    case NK::Macro:
    case NK::Block:
    case NK::CallBlock:
    case NK::FilterBlock:
    case NK::SetBlock:
      for (Node* c : n->ch) check_names(c, n->kind == NK::CallBlock || n->kind == NK::FilterBlock ? soft : false);
      for (auto& b : n->blocks)
        for (Node* c : b) check_names(c, false);
      return;
    default: break;
  }
  for (Node* c : n->ch) check_names(c, soft);
  for (auto& b : n->blocks)
    for (Node* c : b) check_names(c, soft);
}

}  // namespace

void parse_program(std::string_view source, detail::Program& prog) {
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
  Lexer lx(std::move(src), prog.opt);
  Parser p(lx.run(), prog);
  prog.body = p.parse_all();
  for (Node* n : prog.body) check_names(n, false);
}

}  // namespace kiln::chat::jinja
