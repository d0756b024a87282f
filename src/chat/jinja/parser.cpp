// chat/jinja/parser.cpp — Jinja2 recursive-descent parser: the tokens of lexer.cpp into the
//       AST of ast.h, with jinja2's compile-time checks (filter / test names against the
//       registry, loop controls inside loops, block names defined once).
// Must not: evaluate anything.
// Threading: pure functions (a Program is built by one thread, then shared read-only).
#include <cstring>
#include <unordered_set>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/registry.h"

namespace kiln::chat::jinja {
namespace {


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
  Parser p(lex(source, prog.opt), prog);
  prog.body = p.parse_all();
  for (Node* n : prog.body) check_names(n, false);
}

}  // namespace kiln::chat::jinja
