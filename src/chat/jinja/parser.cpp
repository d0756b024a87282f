// chat/jinja/parser.cpp — the statement rules of kiln's Jinja parser (template body, if, for,
//       set, macro, call, filter, block, with, include / import / extends, …) and the entry point
//       parse_program, with jinja2's compile-time checks (filter / test names against the
//       registry, loop controls inside loops, block names defined once).
// Must not: evaluate anything, or parse expressions (parser_expr.cpp does).
// Threading: pure functions (a Program is built by one thread, then shared read-only).
#include <cstring>
#include <unordered_set>

#include "chat/jinja/parser.h"
#include "chat/jinja/registry.h"

namespace kiln::chat::jinja {

// Parses statements until a block tag whose first name is in `ends` (left unconsumed,
// positioned at that name) or EOF.
std::vector<Node*> Parser::subparse(const std::vector<const char*>& ends) {
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

Node* Parser::parse_statement() {
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

Node* Parser::parse_if(int line) {
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

void Parser::parse_targets(Node* n, bool allow_ns) {
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

Node* Parser::parse_for(int line) {
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

Node* Parser::parse_set(int line) {
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

void Parser::parse_signature(Node* n) {
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

Node* Parser::parse_macro(int line) {
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
bool Parser::reads(const Node* n, const char* name) {
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

void Parser::catch_extra(Node* m) {
  for (const Node* c : m->blocks[0]) {
    m->catch_varargs = m->catch_varargs || reads(c, "varargs");
    m->catch_kwargs = m->catch_kwargs || reads(c, "kwargs");
  }
}

Node* Parser::parse_call_block(int line) {
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

Node* Parser::parse_filter_block(int line) {
  Node* n = mk(NK::FilterBlock, line);
  n->ch = parse_filter_chain(nullptr, true);
  expect_block_end();
  n->blocks.push_back(subparse({"endfilter"}));
  next();
  expect_block_end();
  return n;
}

// {% block name [scoped] [required] %}…{% endblock [name] %}
Node* Parser::parse_block(int line) {
  Node* n = mk(NK::Block, line);
  n->name = expect_name();
  if (!block_names_.insert(n->name).second) syntax(line, "block '" + n->name + "' defined twice");
  prog_.blocks.push_back(n);
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
Node* Parser::parse_load(const std::string& kw, int line) {
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

namespace {

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
  check_names(n->star, soft);  // f(*args) / f(**kwargs): their expressions are checked too
  check_names(n->dstar, soft);
  for (Node* c : n->ch) check_names(c, soft);
  for (auto& b : n->blocks)
    for (Node* c : b) check_names(c, soft);
}

}  // namespace

void parse_program(std::string_view source, detail::Program& prog) {
  Parser p(lex(source, prog.opt), prog);
  prog.body = p.parse_all();
  for (Node* n : prog.body) check_names(n, false);
}

}  // namespace kiln::chat::jinja
