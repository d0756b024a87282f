// chat/jinja/lexer.h — the tokens of kiln's Jinja engine and the lexer that makes them (internal).
// Owns: the token layout shared by lexer.cpp (makes them) and the parser (reads them), and the
//       syntax error every stage of parsing throws.
// Must not: build AST nodes or know filter / test names.
// Threading: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja/jinja.h"
#include "chat/jinja/value.h"

namespace kiln::chat::jinja {

enum class TT : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  TT type;
  std::string val;
  int line;
  Value num;  // Int/Float value
};

// Throws the JinjaError of a template syntax error ("syntax", msg) at `line`.
[[noreturn]] void syntax(int line, const std::string& msg);

// The tokens of `source` (newlines normalised and one trailing newline dropped as jinja2 does,
// whitespace control, trim_blocks / lstrip_blocks from `opt`), ending with an Eof token.
std::vector<Token> lex(std::string_view source, const Options& opt);

}  // namespace kiln::chat::jinja
