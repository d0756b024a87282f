// engine/grammar.cpp — GBNF parser and compiler (see grammar.h).
//   Parsing builds codepoint-level rules; repetitions become helper rules (x* → R ::= x R | ε, so
//   the recursion is a tail call and never deepens a matcher's stack); compiling lowers every
//   character class to byte sets (ASCII: one byte set; otherwise a helper rule whose alternatives
//   are the class's UTF-8 byte-range sequences) and lays the alternatives out in one array.
#include "engine/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

namespace kiln::engine {

namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int kMaxRepeat = 1000;  // {m,n} bounds above this are refused (the rules grow with n)

using Range = std::pair<uint32_t, uint32_t>;

// A parsed element: a set of codepoints (a literal character is a one-codepoint set) or a rule.
struct PElem {
  bool is_ref = false;
  uint32_t ref = 0;
  std::vector<Range> ranges;  // normalised (sorted, disjoint, no surrogates) when !is_ref
};
using PSeq = std::vector<PElem>;

struct PRule {
  std::string name;
  std::vector<PSeq> alts;
  bool defined = false;
  int used_line = 0;  // first reference (for "not defined" errors)
  bool generated = false;
};

std::vector<Range> normalise(std::vector<Range> r, bool negate) {
  std::sort(r.begin(), r.end());
  std::vector<Range> m;
  for (auto [lo, hi] : r) {
    if (!m.empty() && lo <= m.back().second + 1) m.back().second = std::max(m.back().second, hi);
    else m.push_back({lo, hi});
  }
  if (negate) {
    std::vector<Range> c;
    uint32_t next = 0;
    for (auto [lo, hi] : m) {
      if (lo > next) c.push_back({next, lo - 1});
      next = hi + 1;
    }
    if (next <= kMaxCodepoint) c.push_back({next, kMaxCodepoint});
    m = std::move(c);
  }
  // Surrogates have no UTF-8 encoding.
  std::vector<Range> out;
  for (auto [lo, hi] : m) {
    if (hi < 0xD800 || lo > 0xDFFF) out.push_back({lo, hi});
    else {
      if (lo < 0xD800) out.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    }
  }
  return out;
}

std::string utf8_encode(uint32_t c) {
  std::string s;
  if (c < 0x80) s += char(c);
  else if (c < 0x800) s += {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
  else if (c < 0x10000) s += {char(0xE0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
  else
    s += {char(0xF0 | (c >> 18)), char(0x80 | ((c >> 12) & 0x3F)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
  return s;
}

// Splits the codepoint range [lo, hi] into sequences of byte ranges whose concatenations are
// exactly the UTF-8 encodings of [lo, hi] (each sequence: one byte range per encoded byte).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  const int n = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out.push_back(std::move(seq));
}

// ------------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::string_view t) : s_(t) {}

  Status run(std::string_view root_name, std::vector<PRule>& rules, uint32_t& root) {
    for (;;) {
      skip_ws(true);
      if (eof()) break;
      const int line = line_;
      std::string name = parse_name();
      if (name.empty()) return fail(fmt::format("expected a rule name, got {}", describe()));
      skip_ws(false);
      if (s_.substr(pos_, 3) != "::=") return fail(fmt::format("expected '::=' after rule name '{}'", name));
      advance(3);
      skip_ws(true);
      const uint32_t id = rule_id(name, line);
      if (rules_[id].defined) return fail(fmt::format("rule '{}' is defined twice (first on line {})", name, def_line_[id]));
      rules_[id].defined = true;
      def_line_[id] = line;
      std::vector<PSeq> alts;
      KILN_TRY(parse_alternates(alts, false));
      rules_[id].alts = std::move(alts);
      skip_ws(false);
      if (!eof() && peek() != '\n' && peek() != '\r') return fail(fmt::format("unexpected {}", describe()));
    }
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!rules_[r].defined)
        return err("grammar: rule '{}' (used on line {}) is not defined", rules_[r].name, rules_[r].used_line);
    auto it = ids_.find(std::string(root_name));
    if (it == ids_.end()) return err("grammar: there is no '{}' rule (the start symbol)", root_name);
    root = it->second;
    rules = std::move(rules_);
    return {};
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  std::vector<PRule> rules_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint32_t, int> def_line_;

  bool eof() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < s_.size(); ++i, ++pos_) {
      if (s_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }
  std::string describe() const {
    if (eof()) return "the end of the grammar";
    const char c = peek();
    if (c == '\n') return "the end of the line";
    if (uint8_t(c) < 0x20 || uint8_t(c) >= 0x7F) return fmt::format("byte 0x{:02X}", uint8_t(c));
    return fmt::format("'{}'", c);
  }
  Status fail(const std::string& msg) const { return err("grammar: line {}, column {}: {}", line_, col_, msg); }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  // Spaces, tabs and comments; newlines too when `newlines`.
  void skip_ws(bool newlines) {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t') advance();
      else if (c == '#') {
        while (!eof() && peek() != '\n') advance();
      } else if ((c == '\n' || c == '\r') && newlines) advance();
      else break;
    }
  }
  std::string parse_name() {
    std::string n;
    while (!eof() && is_name_char(peek())) {
      n += peek();
      advance();
    }
    return n;
  }
  uint32_t rule_id(const std::string& name, int line) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = uint32_t(rules_.size());
    rules_.push_back(PRule{name, {}, false, line, false});
    ids_.emplace(name, id);
    return id;
  }
  uint32_t new_rule(const std::string& base, std::vector<PSeq> alts) {
    const uint32_t id = uint32_t(rules_.size());
    rules_.push_back(PRule{fmt::format("{}-{}", base, id), std::move(alts), true, line_, true});
    return id;
  }

  Status parse_alternates(std::vector<PSeq>& alts, bool nested) {
    PSeq seq;
    KILN_TRY(parse_sequence(seq, nested));
    alts.push_back(std::move(seq));
    for (;;) {
      skip_ws(nested);
      if (!nested) {
        // An alternative may continue on the next line when that line starts with '|'.
        size_t save = pos_;
        int sl = line_, sc = col_;
        skip_ws(true);
        if (peek() != '|') {
          pos_ = save;
          line_ = sl;
          col_ = sc;
        }
      }
      if (peek() != '|') return {};
      advance();
      skip_ws(true);
      PSeq next;
      KILN_TRY(parse_sequence(next, nested));
      alts.push_back(std::move(next));
    }
  }

  // One character of a literal or class (after any backslash escape), as a codepoint.
  Status parse_char(uint32_t& cp, char close) {
    if (eof()) return fail(fmt::format("unterminated {}", close == '"' ? "literal" : "character class"));
    const uint8_t c = uint8_t(peek());
    if (c == '\n' || c == '\r')
      return fail(fmt::format("unterminated {} (end of the line)", close == '"' ? "literal" : "character class"));
    if (c == '\\') {
      advance();
      const char e = peek();
      auto hex = [&](int n) -> Status {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          const char h = peek();
          int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return fail(fmt::format("escape \\{} needs {} hex digits", e, n));
          v = v * 16 + uint32_t(d);
          advance();
        }
        if (v > kMaxCodepoint) return fail(fmt::format("escape \\{}: U+{:X} is beyond U+10FFFF", e, v));
        cp = v;
        return {};
      };
      switch (e) {
        case 'n': cp = '\n'; advance(); return {};
        case 'r': cp = '\r'; advance(); return {};
        case 't': cp = '\t'; advance(); return {};
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': cp = uint8_t(e); advance(); return {};
        case 'x': advance(); return hex(2);
        case 'u': advance(); return hex(4);
        case 'U': advance(); return hex(8);
        default: return fail(fmt::format("unknown escape \\{}", e == '\n' || e == '\0' ? std::string("(end of line)") : std::string(1, e)));
      }
    }
    // A UTF-8 encoded character of the grammar text.
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + size_t(n) > s_.size()) return fail(fmt::format("invalid UTF-8 (byte 0x{:02X})", c));
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      const uint8_t b = uint8_t(s_[pos_ + size_t(k)]);
      if ((b & 0xC0) != 0x80) return fail(fmt::format("invalid UTF-8 (byte 0x{:02X})", c));
      v = (v << 6) | (b & 0x3F);
    }
    advance(size_t(n));
    cp = v;
    return {};
  }

  Status parse_int(int& v) {
    if (!(peek() >= '0' && peek() <= '9')) return fail(fmt::format("expected a number in {{m,n}}, got {}", describe()));
    int64_t x = 0;
    while (peek() >= '0' && peek() <= '9') {
      x = x * 10 + (peek() - '0');
      if (x > kMaxRepeat) return fail(fmt::format("repetition count above {} is not supported", kMaxRepeat));
      advance();
    }
    v = int(x);
    return {};
  }

  Status parse_sequence(PSeq& seq, bool nested) {
    long last = -1;  // start of the last item (for a repetition operator)
    for (;;) {
      skip_ws(nested);
      if (eof()) return {};
      const char c = peek();
      if (c == '"') {
        advance();
        last = long(seq.size());
        while (peek() != '"') {
          uint32_t cp;
          KILN_TRY(parse_char(cp, '"'));
          PElem e;
          e.ranges = {{cp, cp}};
          seq.push_back(std::move(e));
        }
        advance();
      } else if (c == '[') {
        advance();
        bool neg = false;
        if (peek() == '^') {
          neg = true;
          advance();
        }
        std::vector<Range> r;
        while (peek() != ']') {
          uint32_t lo, hi;
          KILN_TRY(parse_char(lo, ']'));
          hi = lo;
          if (peek() == '-' && peek(1) != ']') {
            advance();
            KILN_TRY(parse_char(hi, ']'));
            if (hi < lo) return fail(fmt::format("character range U+{:X}-U+{:X} is reversed", lo, hi));
          }
          r.push_back({lo, hi});
        }
        advance();
        last = long(seq.size());
        PElem e;
        e.ranges = normalise(std::move(r), neg);
        seq.push_back(std::move(e));
      } else if (c == '.') {
        advance();
        last = long(seq.size());
        PElem e;
        e.ranges = normalise({}, true);
        seq.push_back(std::move(e));
      } else if (c == '(') {
        advance();
        skip_ws(true);
        std::vector<PSeq> alts;
        KILN_TRY(parse_alternates(alts, true));
        skip_ws(true);
        if (peek() != ')') return fail(fmt::format("expected ')', got {}", describe()));
        advance();
        last = long(seq.size());
        PElem e;
        e.is_ref = true;
        e.ref = new_rule("group", std::move(alts));
        seq.push_back(std::move(e));
      } else if (is_name_char(c)) {
        // A rule reference; at the top level "name ::=" would be the next rule on this line.
        const int line = line_;
        std::string name = parse_name();
        {
          size_t p = pos_;
          while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
          if (s_.substr(p, 3) == "::=") return fail(fmt::format("rule '{}' must start on a new line", name));
        }
        last = long(seq.size());
        PElem e;
        e.is_ref = true;
        e.ref = rule_id(name, line);
        seq.push_back(std::move(e));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last < 0) return fail(fmt::format("repetition operator '{}' without a preceding item", c));
        advance();
        int lo = 0, hi = -1;  // hi -1: unbounded
        if (c == '+') lo = 1;
        else if (c == '?') hi = 1;
        else if (c == '{') {
          skip_ws(false);
          KILN_TRY(parse_int(lo));
          skip_ws(false);
          if (peek() == ',') {
            advance();
            skip_ws(false);
            if (peek() != '}') {
              KILN_TRY(parse_int(hi));
              if (hi < lo) return fail(fmt::format("repetition {{{},{}}}: the maximum is below the minimum", lo, hi));
            }
          } else {
            hi = lo;
          }
          skip_ws(false);
          if (peek() != '}') return fail(fmt::format("expected '}}', got {}", describe()));
          advance();
        }
        PSeq item(seq.begin() + last, seq.end());
        seq.erase(seq.begin() + last, seq.end());
        repeat(seq, std::move(item), lo, hi);
        last = -1;
      } else {
        return {};  // '|', ')', end of line: the caller decides
      }
    }
  }

  // Appends `item` repeated lo..hi times (hi < 0: unbounded) to seq.
  void repeat(PSeq& seq, PSeq item, int lo, int hi) {
    PElem atom;
    if (item.size() == 1) atom = item[0];
    else {
      atom.is_ref = true;
      atom.ref = new_rule("seq", {std::move(item)});
    }
    for (int i = 0; i < lo; ++i) seq.push_back(atom);
    if (hi < 0) {
      // R ::= atom R | ε  (a tail call: the matcher's stack does not grow)
      const uint32_t r = new_rule("star", {});
      PElem self;
      self.is_ref = true;
      self.ref = r;
      rules_[r].alts = {PSeq{atom, self}, PSeq{}};
      seq.push_back(self);
      return;
    }
    // (atom (atom (…)?)?)? with hi - lo levels, built from the inside out.
    PElem inner;
    bool have_inner = false;
    for (int k = 0; k < hi - lo; ++k) {
      PSeq a{atom};
      if (have_inner) a.push_back(inner);
      const uint32_t r = new_rule("opt", {std::move(a), PSeq{}});
      inner.is_ref = true;
      inner.ref = r;
      have_inner = true;
    }
    if (have_inner) seq.push_back(inner);
  }
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Compiler

struct Grammar::Builder {
  Grammar& g;
  std::vector<PRule>& rules;
  std::map<std::array<uint64_t, 4>, uint32_t> set_ids;
  std::map<std::vector<Range>, uint32_t> class_rules;  // non-ASCII classes → helper rule
  std::unordered_map<uint32_t, std::vector<Range>> class_ranges;  // helper rule → its class

  uint32_t set_id(const ByteSet& s) {
    auto [it, added] = set_ids.emplace(s.w, uint32_t(g.sets_.size()));
    if (added) g.sets_.push_back(s);
    return it->second;
  }
  void emit_bytes(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.add_range(lo, hi);
    g.elems_.push_back({Kind::Bytes, set_id(s)});
  }
  // Lowers one parsed element into elems_ (may create helper rules, compiled later).
  void emit(const PElem& e) {
    if (e.is_ref) {
      g.elems_.push_back({Kind::Ref, e.ref});
      return;
    }
    const auto& r = e.ranges;
    if (r.empty()) {  // matches nothing
      g.elems_.push_back({Kind::Bytes, set_id(ByteSet{})});
      return;
    }
    if (r.back().second < 0x80) {
      ByteSet s;
      for (auto [lo, hi] : r) s.add_range(uint8_t(lo), uint8_t(hi));
      g.elems_.push_back({Kind::Bytes, set_id(s)});
      return;
    }
    if (r.size() == 1 && r[0].first == r[0].second) {
      for (char b : utf8_encode(r[0].first)) emit_bytes(uint8_t(b), uint8_t(b));
      return;
    }
    auto it = class_rules.find(r);
    if (it == class_rules.end()) {
      // ASCII part: one alternative with one byte set; the rest: one alternative per sequence.
      const uint32_t id = uint32_t(rules.size());
      PRule pr;
      pr.name = fmt::format("class-{}", id);
      pr.defined = pr.generated = true;
      rules.push_back(std::move(pr));
      it = class_rules.emplace(r, id).first;
      class_ranges.emplace(id, r);
    }
    g.elems_.push_back({Kind::Ref, it->second});
  }
  void emit_class_rule(uint32_t id, const std::vector<Range>& r) {
    ByteSet ascii;
    bool any_ascii = false;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : r) {
      if (lo < 0x80) {
        ascii.add_range(uint8_t(lo), uint8_t(std::min<uint32_t>(hi, 0x7F)));
        any_ascii = true;
        if (hi < 0x80) continue;
        lo = 0x80;
      }
      utf8_sequences(lo, hi, seqs);
    }
    if (any_ascii) {
      g.alts_[id].push_back(uint32_t(g.elems_.size()));
      g.elems_.push_back({Kind::Bytes, set_id(ascii)});
      g.elems_.push_back({Kind::End, 0});
    }
    for (const auto& s : seqs) {
      g.alts_[id].push_back(uint32_t(g.elems_.size()));
      for (auto [lo, hi] : s) emit_bytes(lo, hi);
      g.elems_.push_back({Kind::End, 0});
    }
  }

  Status compile() {
    // emit() appends helper rules for non-ASCII classes while this loop runs: they are compiled
    // when the loop reaches them.
    for (uint32_t r = 0; r < rules.size(); ++r) {
      g.alts_.resize(rules.size());
      g.names_.push_back(rules[r].name);
      if (auto c = class_ranges.find(r); c != class_ranges.end()) {
        emit_class_rule(r, c->second);
        continue;
      }
      const std::vector<PSeq> alts = rules[r].alts;  // a copy: emit() may grow `rules`
      for (const auto& alt : alts) {
        g.alts_[r].push_back(uint32_t(g.elems_.size()));
        for (const auto& e : alt) emit(e);
        g.elems_.push_back({Kind::End, 0});
      }
    }
    return check_left_recursion();
  }

  Status check_left_recursion() {
    const size_t n = g.alts_.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t p : g.alts_[r]) {
          bool all = true;
          for (; g.elems_[p].kind != Kind::End; ++p)
            if (g.elems_[p].kind == Kind::Bytes || !nullable[g.elems_[p].arg]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Left-corner edges: rule → rules that can start it (after nullable prefixes).
    std::vector<std::vector<uint32_t>> edges(n);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t p : g.alts_[r])
        for (; g.elems_[p].kind == Kind::Ref; ++p) {
          edges[r].push_back(g.elems_[p].arg);
          if (!nullable[g.elems_[p].arg]) break;
        }
    std::vector<int> color(n, 0);  // 0 new, 1 on the DFS path, 2 done
    std::vector<std::pair<uint32_t, size_t>> st;
    for (uint32_t s = 0; s < n; ++s) {
      if (color[s]) continue;
      st.push_back({s, 0});
      color[s] = 1;
      while (!st.empty()) {
        auto& [r, i] = st.back();
        if (i < edges[r].size()) {
          const uint32_t t = edges[r][i++];
          if (color[t] == 1) {
            // Name a rule of the cycle the user wrote, if any.
            uint32_t named = t;
            for (auto it = st.rbegin(); it != st.rend(); ++it) {
              if (!rules[it->first].generated) {
                named = it->first;
                break;
              }
              if (it->first == t) break;
            }
            return err("grammar: rule '{}' is left-recursive (it can derive itself without consuming input); "
                       "rewrite it with repetition", g.names_[named]);
          }
          if (color[t] == 0) {
            color[t] = 1;
            st.push_back({t, 0});
          }
        } else {
          color[r] = 2;
          st.pop_back();
        }
      }
    }
    return {};
  }
};

Result<std::shared_ptr<const Grammar>> Grammar::parse(std::string_view text, std::string_view root) {
  std::vector<PRule> rules;
  uint32_t root_id = 0;
  Parser p(text);
  KILN_TRY(p.run(root, rules, root_id));
  auto g = std::make_shared<Grammar>();
  g->text_ = std::string(text);
  g->root_ = root_id;
  Builder b{*g, rules, {}, {}, {}};
  KILN_TRY(b.compile());
  return std::shared_ptr<const Grammar>(std::move(g));
}

// A direct simulation over explicit stacks (positions, top last): the reference the token
// automaton (grammar_matcher.cpp) is tested against.
bool Grammar::matches(std::string_view bytes) const {
  using Stack = std::vector<uint32_t>;
  std::set<Stack> cur;
  std::function<void(Stack, int)> expand = [&](Stack s, int depth) {
    if (depth > 10000) return;
    if (s.empty()) {
      cur.insert(s);
      return;
    }
    const uint32_t p = s.back();
    const Elem& e = elems_[p];
    if (e.kind == Kind::Bytes) {
      cur.insert(s);
    } else if (e.kind == Kind::End) {
      s.pop_back();
      expand(std::move(s), depth + 1);
    } else {
      s.pop_back();
      if (elems_[p + 1].kind != Kind::End) s.push_back(p + 1);
      for (uint32_t a : alts_[e.arg]) {
        Stack t = s;
        t.push_back(a);
        expand(std::move(t), depth + 1);
      }
    }
  };
  for (uint32_t a : alts_[root_]) expand(Stack{a}, 0);
  for (char ch : bytes) {
    std::set<Stack> prev;
    prev.swap(cur);
    for (const Stack& s : prev) {
      if (s.empty()) continue;
      const uint32_t p = s.back();
      if (!sets_[elems_[p].arg].has(uint8_t(ch))) continue;
      Stack t = s;
      t.back() = p + 1;
      expand(std::move(t), 0);
    }
    if (cur.empty()) return false;
  }
  return cur.count(Stack{}) > 0;
}

}  // namespace kiln::engine
