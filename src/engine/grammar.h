// engine/grammar.h — GBNF grammars (llama.cpp's grammar format) compiled to a byte-level
//   pushdown automaton: rules of alternatives of sequences over byte sets and rule references.
//
// Owns: parsing GBNF text (rules `name ::= …`, alternation `|`, grouping `( )`, repetition
//   `* + ? {m} {m,} {m,n}`, literals "…" and character classes [a-z…] / [^…] / `.` with escapes
//   \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, comments `#`), lowering repetitions to helper
//   rules, lowering codepoint classes to UTF-8 byte sequences, and checking the result (undefined
//   rules, missing root, left recursion). Errors name the line and column or the rule.
// Must not: know about tokens, vocabularies or requests (matching tokens is grammar_matcher.h);
//   see JSON (JSON Schema → GBNF is the server's business, chat/json_schema.h, called by server/constraint.h).
// Threading: a Grammar is immutable after parse() and may be shared by any number of threads.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace kiln::engine {

// 256-bit byte set.
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { w[b >> 6] |= uint64_t(1) << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(uint8_t(b));
  }
  bool operator==(const ByteSet&) const = default;
};

class Grammar {
 public:
  // One element of a rule alternative. Alternatives are stored back to back in `elems()`, each
  // terminated by an End element; a position is an index into that array.
  enum class Kind : uint8_t { Bytes, Ref, End };
  struct Elem {
    Kind kind = Kind::End;
    uint32_t arg = 0;  // Bytes: index into byte_sets(); Ref: rule id
  };

  // Parses and compiles GBNF text; `root` names the start rule. Errors:
  //   "grammar: line 3, column 7: expected '::=' after rule name 'value'",
  //   "grammar: rule 'item' (line 2) is not defined", "grammar: rule 'expr' is left-recursive".
  static Result<std::shared_ptr<const Grammar>> parse(std::string_view text, std::string_view root = "root");

  const std::vector<Elem>& elems() const { return elems_; }
  const std::vector<ByteSet>& byte_sets() const { return sets_; }
  // Start positions of each alternative of rule r.
  const std::vector<uint32_t>& alts(uint32_t r) const { return alts_[r]; }
  uint32_t root() const { return root_; }
  size_t n_rules() const { return alts_.size(); }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }
  const std::string& text() const { return text_; }

  // Whole-string check (tests, debugging): does the grammar derive exactly these bytes?
  bool matches(std::string_view bytes) const;

  struct Builder;

 private:
  std::vector<Elem> elems_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<uint32_t>> alts_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
  std::string text_;
};

}  // namespace kiln::engine
