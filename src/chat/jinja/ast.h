// chat/jinja/ast.h — lexer tokens and AST nodes of kiln's Jinja engine (internal).
// Owns: the node layout shared by the parser (parser.cpp, parser_expr.cpp: builds it) and
//       interp.cpp (walks it).
// The filter / test names the parser accepts are registry.h's tables.
// Must not: evaluate anything.
// Threading: a Program is immutable after parse and shared between renders.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja/jinja.h"
#include "chat/jinja/value.h"

namespace kiln::chat::jinja {

enum class NK : uint8_t {
  // expressions
  Const, Name, ListLit, TupleLit, DictLit, Getattr, Getitem, Slice, Call, Filter, Test,
  Not, Neg, Pos, BinOp, Compare, And, Or, CondExpr,
  // statements
  Text, Emit, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Generation, With,
  Block, Load,
};

// One generic node; the meaning of the fields depends on `kind` (see parser.cpp / parser_expr.cpp):
//  Const: cval. Name: name. List/TupleLit: ch items. DictLit: ch = k0,v0,k1,v1,…
//  Getattr: ch[0] obj, name attr. Getitem: ch[0] obj, ch[1] key (maybe a Slice).
//  Slice: ch[0..2] start/stop/step (nullptr when absent).
//  Call/Filter/Test: ch[0] callee/input (Filter in a block: nullptr), name (filter/test),
//    then n_pos positional args and kw-args named by `names`; star / dstar: `*expr` / `**expr`.
//  Not/Neg/Pos: ch[0]. BinOp: name op, ch[0], ch[1]. And/Or: ch[0], ch[1].
//  Compare: ch[0] then ch[k] compared with op names[k-1]. CondExpr: ch test, then, else|nullptr.
//  Text: name text. Emit: ch[0]. If: ch conditions, blocks bodies (+ else block).
//  For: names targets (unpack if >1 or `unpack`), ch[0] iter, ch[1] filter|nullptr,
//    blocks[0] body, blocks[1] else; `recursive`: loop(iterable) renders the loop again, one deeper. Set: names targets, attr (ns attribute), ch[0] value.
//  SetBlock: names[0], ch filters, blocks[0]. Macro: name, names params, ch defaults|nullptr,
//    blocks[0]. CallBlock: ch[0] the Call, names params, ch[1..] defaults, blocks[0].
//  FilterBlock: ch filters (input nullptr), blocks[0]. Generation: blocks[0].
//  With: names targets, ch their values (evaluated in the enclosing scope), blocks[0] the body.
//  Block: name, blocks[0] the body (rendered in place: a chat template has no parent; also
//    by `self.name()`), `scoped`, `required`. Load: name the statement (include / import / from /
//    extends), ch[0] the template name expression (a chat template cannot load another: an error
//    when executed).
struct Node {
  NK kind;
  int line = 0;
  bool unpack = false;  // For/Set: tuple target
  bool recursive = false;  // For: `recursive` (loop is callable)
  bool scoped = false, required = false;  // Block: `scoped` (sees the local scope), `required`
  bool catch_varargs = false, catch_kwargs = false;  // Macro/CallBlock: the body reads varargs / kwargs
  Node* star = nullptr;   // Call/Filter/Test: `*expr` (more positional arguments)
  Node* dstar = nullptr;  // Call/Filter/Test: `**expr` (more keyword arguments)
  bool soft = false;    // Filter/Test: unknown name allowed until executed (inside an if)
  int n_pos = 0;
  std::string name, attr;
  Value cval;
  std::vector<Node*> ch;
  std::vector<std::string> names;
  std::vector<std::vector<Node*>> blocks;
};

namespace detail {
struct Program {
  Options opt;
  std::vector<std::unique_ptr<Node>> arena;
  std::vector<Node*> body;
  std::vector<Node*> blocks;  // every {% block %}, wherever it is nested (`self.name()` renders one)
};
}  // namespace detail

// Parses into `prog` (throws JinjaError with line set).
void parse_program(std::string_view source, detail::Program& prog);

// Renders (throws JinjaError).
std::string render_program(const detail::Program& prog, const nlohmann::ordered_json& ctx);

}  // namespace kiln::chat::jinja
