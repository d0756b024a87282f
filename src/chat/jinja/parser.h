// chat/jinja/parser.h — the Jinja2 recursive-descent parser of kiln's Jinja engine (internal).
// Owns: the Parser class: token cursor helpers, nesting guard and the declarations of its
//       statement rules (parser.cpp) and expression rules (parser_expr.cpp).
// Must not: evaluate anything, or be included outside src/chat/jinja (parse_program in ast.h is
//       the entry point).
// Threading: a Parser is used by one thread to build one Program.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"

namespace kiln::chat::jinja {

// The tokens of lexer.cpp into the AST of ast.h. Nodes are allocated in the Program's arena.
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

  // ---- statements (parser.cpp) ----
  // Parses statements until a block tag whose first name is in `ends` (left unconsumed,
  // positioned at that name) or EOF.
  std::vector<Node*> subparse(const std::vector<const char*>& ends);
  Node* parse_statement();
  Node* parse_if(int line);
  void parse_targets(Node* n, bool allow_ns);
  Node* parse_for(int line);
  Node* parse_set(int line);
  void parse_signature(Node* n);
  Node* parse_macro(int line);
  // jinja2's macros take extra positional / keyword arguments only where the body reads `varargs` /
  // `kwargs` (decided from the source, as jinja2's compiler does).
  // (Nested macro definitions and call-block bodies are macros of their own.)
  static bool reads(const Node* n, const char* name);
  static void catch_extra(Node* m);
  Node* parse_call_block(int line);
  Node* parse_filter_block(int line);
  // {% block name [scoped] [required] %}…{% endblock [name] %}
  Node* parse_block(int line);
  // {% include name [ignore missing] [with|without context] %}, {% import name as x %},
  // {% from name import a [as b], … %}, {% extends name %}: parsed like jinja2, failing when
  // executed (a chat template is a single string; there is nothing to load).
  Node* parse_load(const std::string& kw, int line);

  // ---- expressions (parser_expr.cpp) ----
  Node* parse_expression(bool with_condexpr = true);
  Node* parse_tuple(std::vector<const char*> extra_end, bool with_condexpr = true);
  Node* parse_condexpr();
  Node* parse_or();
  Node* parse_and();
  Node* parse_not();
  Node* parse_compare();
  Node* binop(const std::string& op, Node* l, Node* r, int line);
  Node* parse_math1();
  Node* parse_concat();
  Node* parse_math2();
  Node* parse_pow();
  Node* parse_unary(bool with_filter);
  Node* parse_primary();
  Node* parse_postfix(Node* n);
  Node* parse_filter_expr(Node* n);
  Node* parse_subscript(Node* obj);
  Node* parse_subscribed();
  void parse_args(Node* n);
  Node* parse_call(Node* callee);
  std::string dotted_name();
  // `| f(args) | g …` applied to `input` (nullptr in a filter block / block set).
  std::vector<Node*> parse_filter_chain(Node* input, bool start_inline = false);
  Node* parse_test(Node* input);
};

}  // namespace kiln::chat::jinja
