// chat/jinja/interp.h — the interpreter state and what its files share (internal).
// Owns: Scope, Interp (one render's runtime state: options, step/size accounting, root scope,
//       globals) and the argument / value helpers that interp.cpp, objects.cpp, format.cpp,
//       filters.cpp, text_filters.cpp, jinja_tests.cpp, methods.cpp and globals.cpp use.
//       Which file defines each member is noted at its group.
// Must not: be included outside src/chat/jinja (jinja.h is the public API).
// Threading: an Interp belongs to one render call on one thread.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/mutate.h"
#include "chat/jinja/registry.h"

namespace kiln::chat::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  Dict vars;
  const Value* find(std::string_view k) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (const Value* v = s->vars.find(k)) return v;
    return nullptr;
  }
  void set(std::string_view k, Value v) { vars.set(k, std::move(v)); }
};
using ScopeP = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

// ---- value helpers (objects.cpp) ----
[[noreturn]] void undefined_error(const Value& u, const std::string& construct);
int64_t as_int(const Value& v, const char* construct);  // Python int (bool counts); else error
double as_num(const Value& v);                         // a number as double
Value make_callable(std::string name, std::function<Value(Interp&, CallArgs&)> fn);
Value make_gen(std::vector<Value> items);  // a one-shot generator (map/select/… results)
std::vector<Value> dict_pairs(const Value& d);  // dict.items(): (key, value) tuples

// Argument `idx` (positional) or keyword `name`; nullptr when neither was passed.
const Value* arg(CallArgs& a, size_t idx, const char* name);
Value arg_or(CallArgs& a, size_t idx, const char* name, Value dflt);

// pprint.pformat(v) (width 80, dicts sorted by key), as jinja2's |pprint (format.cpp).
std::string py_pformat(const Value& v);

struct Interp {
  const detail::Program& prog;
  const Options& opt;
  size_t steps = 0;
  size_t depth = 0;
  int cur_line = 0;
  ScopeP root;
  Value globals;   // Dict of builtins (global_table())
  Value self_ref;  // `self` (jinja2's TemplateReference), made when first read
  MutateEnv menv;  // what list/dict mutators need from us (mutate.h)

  explicit Interp(const detail::Program& p);

  void step(size_t n = 1);
  void check_size(size_t n, const char* construct);

  // ---- statements and expressions (interp.cpp) ----
  Value lookup(const std::string& name, Scope& sc);
  Value call_value(const Value& callee, CallArgs& a, const std::string& what);
  Value make_macro(Node* m, ScopeP def_scope);
  Value invoke_macro(Node* sig, const ScopeP& def_scope, CallArgs& a);
  void eval_args(Node* n, size_t first, Scope& sc, CallArgs& a);
  Value eval(Node* n, Scope& sc);
  void emit(std::string& out, std::string_view s);
  Value apply_filter_node(Node* f, const Value& v, Scope& sc);
  Value apply_filter_chain(const std::vector<Node*>& chain, Value v, Scope& sc);
  void assign(Node* n, const Value& v, Scope& sc);
  void bind_names(Node* n, const Value& v, Scope& sc, const char* construct);
  Value filtered_body(Node* n, const ScopeP& sc);
  Flow exec_block(const std::vector<Node*>& body, const ScopeP& sc, std::string& out);
  Flow exec(Node* n, const ScopeP& sc, std::string& out);
  Flow run_for(Node* n, const ScopeP& sc, const Value& seq, int64_t depth, std::string& out);
  void render_block(Node* n, const ScopeP& parent, std::string& out);
  Value template_reference();

  // ---- the Python object protocol, sandboxed (objects.cpp) ----
  Value get_attr(const Value& obj, const std::string& name);  // attribute first, then item
  Value get_item(const Value& obj, const Value& key);         // item first, then attribute
  Value slice(const Value& obj, const Value& a, const Value& b, const Value& c);
  std::vector<Value> iterate(const Value& v, const char* construct);  // Python iter() as a list
  int64_t py_len(const Value& v, const char* construct);
  bool contains(const Value& container, const Value& item);
  bool less(const Value& a, const Value& b, const char* op);  // Python a < b
  bool compare(const std::string& op, const Value& a, const Value& b);
  Value arith(const std::string& op, const Value& a, const Value& b);

  // ---- string formatting (format.cpp) ----
  std::string printf_format(const std::string& fmt, const Value& args);  // fmt % args
  std::string str_format(const std::string& fmt, CallArgs& a);          // fmt.format(*a)
  std::string format_spec(const Value& v, const std::string& spec);

  // ---- registry dispatch (filters.cpp, jinja_tests.cpp, globals.cpp) ----
  Value apply_filter(const std::string& name, const Value& v, CallArgs& a);
  bool apply_test(const std::string& name, const Value& v, CallArgs& a);
  void install_globals();
};

}  // namespace kiln::chat::jinja
