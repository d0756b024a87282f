// chat/jinja/parser_expr.cpp — the expression rules of kiln's Jinja parser: conditional
//       expressions, and / or / not, comparisons, arithmetic, literals, attribute and item
//       access, slices, calls with *args / **kwargs, filters and tests (precedence as in jinja2).
// Must not: evaluate anything, or check filter / test names (parser.cpp does, after parsing).
// Threading: pure functions (a Program is built by one thread, then shared read-only).
#include "chat/jinja/parser.h"

namespace kiln::chat::jinja {

Node* Parser::parse_expression(bool with_condexpr) {
  DepthGuard g(*this, cur().line);
  return with_condexpr ? parse_condexpr() : parse_or();
}

Node* Parser::parse_tuple(std::vector<const char*> extra_end, bool with_condexpr) {
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

Node* Parser::parse_condexpr() {
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

Node* Parser::parse_or() {
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

Node* Parser::parse_and() {
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

Node* Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard g(*this, cur().line);
    Node* n = mk(NK::Not, cur().line);
    next();
    n->ch = {parse_not()};
    return n;
  }
  return parse_compare();
}

Node* Parser::parse_compare() {
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

Node* Parser::binop(const std::string& op, Node* l, Node* r, int line) {
  Node* n = mk(NK::BinOp, line);
  n->name = op;
  n->ch = {l, r};
  return n;
}

Node* Parser::parse_math1() {
  Node* l = parse_concat();
  while (is_op("+") || is_op("-")) {
    std::string op = cur().val;
    int line = cur().line;
    next();
    l = binop(op, l, parse_concat(), line);
  }
  return l;
}

Node* Parser::parse_concat() {
  Node* l = parse_math2();
  while (is_op("~")) {
    int line = cur().line;
    next();
    l = binop("~", l, parse_math2(), line);
  }
  return l;
}

Node* Parser::parse_math2() {
  Node* l = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = cur().val;
    int line = cur().line;
    next();
    l = binop(op, l, parse_pow(), line);
  }
  return l;
}

Node* Parser::parse_pow() {
  Node* l = parse_unary(true);
  while (is_op("**")) {
    int line = cur().line;
    next();
    l = binop("**", l, parse_unary(true), line);
  }
  return l;
}

Node* Parser::parse_unary(bool with_filter) {
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

Node* Parser::parse_primary() {
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

Node* Parser::parse_postfix(Node* n) {
  while (true) {
    if (is_op(".") || is_op("[")) n = parse_subscript(n);
    else if (is_op("(")) n = parse_call(n);
    else break;
  }
  return n;
}

Node* Parser::parse_filter_expr(Node* n) {
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

Node* Parser::parse_subscript(Node* obj) {
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

Node* Parser::parse_subscribed() {
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

void Parser::parse_args(Node* n) {
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

Node* Parser::parse_call(Node* callee) {
  Node* n = mk(NK::Call, cur().line);
  n->ch.push_back(callee);
  parse_args(n);
  return n;
}

std::string Parser::dotted_name() {
  std::string name = expect_name();
  while (is_op(".") && peek().type == TT::Name) {
    next();
    name += "." + expect_name();
  }
  return name;
}

// `| f(args) | g …` applied to `input` (nullptr in a filter block / block set).
std::vector<Node*> Parser::parse_filter_chain(Node* input, bool start_inline) {
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
  }
  return chain;
}

Node* Parser::parse_test(Node* input) {
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

}  // namespace kiln::chat::jinja
