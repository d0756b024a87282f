// chat/jinja/interp.cpp — the tree-walking evaluator: scopes, statements (if, for with
//       recursive loops, set, macro, call, filter, with, block and `self.name()`, …), expressions, calls and
//       macros, with jinja2 + SandboxedEnvironment semantics (llama-server's: list/dict mutators
//       allowed, see mutate.cpp) or HF transformers' ImmutableSandboxedEnvironment when
//       Options::immutable_sandbox is set. Filters, tests, methods and globals are looked up in
//       the registry (registry.h); values are operated on through objects.cpp.
// Must not: implement filters, tests or methods (their files do), or load other templates (a
//       chat template is one string: include / import / extends fail when executed).
// Threading: one Interp per render call; the Program it walks is shared and read-only.
#include <algorithm>

#include "chat/jinja/interp.h"

namespace kiln::chat::jinja {

Interp::Interp(const detail::Program& p) : prog(p), opt(p.opt) {
  menv.steps = [this](size_t n) { step(n); };
  menv.less = [this](const Value& a, const Value& b) { return less(a, b, "<"); };
  menv.iterate = [this](const Value& v) { return iterate(v, "iterate"); };
}

void Interp::step(size_t n) {
  steps += n;
  if (steps > opt.max_steps) fail("limit", "template exceeded max_steps (" + std::to_string(opt.max_steps) + ")");
}

void Interp::check_size(size_t n, const char* construct) {
  if (n > opt.max_output_bytes)
    fail(construct, "output exceeds max_output_bytes (" + std::to_string(opt.max_output_bytes) + ")");
}

Value Interp::lookup(const std::string& name, Scope& sc) {
  if (const Value* v = sc.find(name)) return *v;
  if (name == "self") return template_reference();  // (jinja2's compiler resolves it likewise)
  if (const Value* g = globals.d->find(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

// ---- calls ----
Value Interp::call_value(const Value& callee, CallArgs& a, const std::string& what) {
  if (callee.kind == Kind::Callable || callee.fn) return callee.fn->fn(*this, a);  // (a recursive loop's `loop`)
  if (callee.is_undefined()) undefined_error(callee, "call " + what);
  fail("call " + what, std::string("'") + type_name(callee) + "' object is not callable");
}

// A {% macro %}, or a {% call %} block's body as its caller() (a CallBlock has no name).
Value Interp::make_macro(Node* m, ScopeP def_scope) {
  return make_callable(m->name.empty() ? "caller" : m->name,
                       [m, def_scope](Interp& in, CallArgs& a) { return in.invoke_macro(m, def_scope, a); });
}

// Calls macro `sig` (params/defaults in sig, body sig->blocks[0]).
Value Interp::invoke_macro(Node* sig, const ScopeP& def_scope, CallArgs& a) {
  std::string construct = "macro " + (sig->name.empty() ? std::string("caller") : sig->name);
  if (++depth > opt.max_recursion) {
    depth--;
    fail(construct, "maximum recursion depth exceeded (" + std::to_string(opt.max_recursion) + ")");
  }
  struct Dec {
    size_t& d;
    ~Dec() { d--; }
  } dec{depth};
  size_t nparams = sig->names.size();
  if (a.pos.size() > nparams && !sig->catch_varargs)
    fail(construct, "macro '" + sig->name + "' takes not more than " + std::to_string(nparams) + " argument(s)");
  auto sc = std::make_shared<Scope>();
  sc->parent = def_scope;
  std::vector<bool> bound(nparams, false);
  std::vector<Value> extra_pos;
  for (size_t k = 0; k < a.pos.size(); k++) {
    if (k >= nparams) {
      extra_pos.push_back(a.pos[k]);
      continue;
    }
    sc->set(sig->names[k], a.pos[k]);
    bound[k] = true;
  }
  Value caller, extra_kw = Value::dict();
  for (auto& kv : a.kw) {
    auto it = std::find(sig->names.begin(), sig->names.end(), kv.first);
    if (it == sig->names.end()) {
      if (kv.first == "caller") {
        caller = kv.second;
        continue;
      }
      if (sig->catch_kwargs) {
        extra_kw.d->set(kv.first, kv.second);
        continue;
      }
      fail(construct, "macro '" + sig->name + "' takes no keyword argument '" + kv.first + "'");
    }
    size_t idx = size_t(it - sig->names.begin());
    if (bound[idx]) fail(construct, "macro got multiple values for argument '" + kv.first + "'");
    sc->set(kv.first, kv.second);
    bound[idx] = true;
  }
  size_t def_off = sig->kind == NK::CallBlock ? 1 : 0;
  for (size_t k = 0; k < nparams; k++) {
    if (bound[k]) continue;
    Node* d = k + def_off < sig->ch.size() ? sig->ch[k + def_off] : nullptr;
    sc->set(sig->names[k], d ? eval(d, *sc) : Value::undefined("parameter '" + sig->names[k] + "' was not provided"));
  }
  if (!caller.is_undefined()) sc->set("caller", caller);
  if (sig->catch_varargs) sc->set("varargs", Value::list(std::move(extra_pos), true));
  if (sig->catch_kwargs) sc->set("kwargs", extra_kw);
  std::string out;
  exec_block(sig->blocks[0], sc, out);
  return Value::str(std::move(out));
}

// ---- evaluation ----
void Interp::eval_args(Node* n, size_t first, Scope& sc, CallArgs& a) {
  size_t np = size_t(n->n_pos);
  for (size_t k = 0; k < np; k++) a.pos.push_back(eval(n->ch[first + k], sc));
  if (n->star)
    for (Value& v : iterate(eval(n->star, sc), "*args")) a.pos.push_back(std::move(v));
  for (size_t k = 0; k < n->names.size(); k++) a.kw.emplace_back(n->names[k], eval(n->ch[first + np + k], sc));
  if (n->dstar) {
    const Value d = eval(n->dstar, sc);
    if (!d.is_dict()) fail("**kwargs", std::string("argument after ** must be a mapping, not ") + type_name(d));
    for (const auto& [k, v] : d.d->items) {
      const Value key = key_value(k);
      if (!key.is_str()) fail("**kwargs", "keywords must be strings");
      for (const auto& [name, _] : a.kw)
        if (name == key.sv()) fail("**kwargs", "got multiple values for keyword argument '" + name + "'");
      a.kw.emplace_back(key.sv(), v);
    }
  }
}

Value Interp::eval(Node* n, Scope& sc) {
  step();
  cur_line = n->line;
  switch (n->kind) {
    case NK::Const: return n->cval;
    case NK::Name: return lookup(n->name, sc);
    case NK::ListLit:
    case NK::TupleLit: {
      std::vector<Value> items;
      items.reserve(n->ch.size());
      for (Node* c : n->ch) items.push_back(eval(c, sc));
      return Value::list(std::move(items), n->kind == NK::TupleLit);
    }
    case NK::DictLit: {
      Value d = Value::dict();
      for (size_t k = 0; k + 1 < n->ch.size(); k += 2) {
        Value key = eval(n->ch[k], sc);
        d.d->set(dict_key(key), eval(n->ch[k + 1], sc));
      }
      return d;
    }
    case NK::Getattr: return get_attr(eval(n->ch[0], sc), n->name);
    case NK::Getitem: {
      Value obj = eval(n->ch[0], sc);
      Node* k = n->ch[1];
      if (k->kind == NK::Slice) {
        Value none = Value::none();
        Value a = k->ch[0] ? eval(k->ch[0], sc) : none, b = k->ch[1] ? eval(k->ch[1], sc) : none,
              c = k->ch[2] ? eval(k->ch[2], sc) : none;
        cur_line = n->line;
        return slice(obj, a, b, c);
      }
      Value key = eval(k, sc);
      cur_line = n->line;
      return get_item(obj, key);
    }
    case NK::Call: {
      Value callee = eval(n->ch[0], sc);
      CallArgs a;
      eval_args(n, 1, sc, a);
      cur_line = n->line;
      std::string what = n->ch[0]->kind == NK::Name || n->ch[0]->kind == NK::Getattr ? n->ch[0]->name : "";
      return call_value(callee, a, what);
    }
    case NK::Filter: return apply_filter_node(n, n->ch[0] ? eval(n->ch[0], sc) : Value::str(""), sc);
    case NK::Test: {
      Value in = eval(n->ch[0], sc);
      CallArgs a;
      eval_args(n, 1, sc, a);
      cur_line = n->line;
      if (n->soft) fail("test " + n->name, "no test named '" + n->name + "'");
      return Value::boolean(apply_test(n->name, in, a));
    }
    case NK::Not: return Value::boolean(!truthy(eval(n->ch[0], sc)));
    case NK::Neg:
    case NK::Pos: {
      Value v = eval(n->ch[0], sc);
      if (v.is_undefined()) undefined_error(v, n->kind == NK::Neg ? "unary -" : "unary +");
      if (!v.is_number()) fail("unary operator", std::string("bad operand type for unary operator: '") + type_name(v) + "'");
      if (n->kind == NK::Pos) return v.kind == Kind::Bool ? Value::integer(v.b) : v;
      if (v.kind == Kind::Float) return Value::flt(-v.f);
      int64_t x = as_int(v, "unary -");
      if (x == INT64_MIN) fail("unary -", "integer overflow");
      return Value::integer(-x);
    }
    case NK::BinOp: {
      Value a = eval(n->ch[0], sc);
      Value b = eval(n->ch[1], sc);
      cur_line = n->line;
      return arith(n->name, a, b);
    }
    case NK::Compare: {
      Value left = eval(n->ch[0], sc);
      for (size_t k = 0; k < n->names.size(); k++) {
        Value right = eval(n->ch[k + 1], sc);
        cur_line = n->line;
        if (!compare(n->names[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case NK::And: {
      Value l = eval(n->ch[0], sc);
      if (!truthy(l)) return l;
      return eval(n->ch[1], sc);
    }
    case NK::Or: {
      Value l = eval(n->ch[0], sc);
      if (truthy(l)) return l;
      return eval(n->ch[1], sc);
    }
    case NK::CondExpr: {
      if (truthy(eval(n->ch[0], sc))) return eval(n->ch[1], sc);
      if (n->ch[2]) return eval(n->ch[2], sc);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
    default: fail("expression", "not an expression");
  }
}

void Interp::emit(std::string& out, std::string_view s) {
  out.append(s);
  check_size(out.size(), "output");
}

// One filter node (its arguments are f->ch[1..]) applied to v.
Value Interp::apply_filter_node(Node* f, const Value& v, Scope& sc) {
  CallArgs a;
  eval_args(f, 1, sc, a);
  cur_line = f->line;
  if (f->soft) fail("filter " + f->name, "no filter named '" + f->name + "'");
  return apply_filter(f->name, v, a);
}

Value Interp::apply_filter_chain(const std::vector<Node*>& chain, Value v, Scope& sc) {
  for (Node* f : chain) v = apply_filter_node(f, v, sc);
  return v;
}

void Interp::assign(Node* n, const Value& v, Scope& sc) {
  if (!n->attr.empty()) {
    const Value* ns = sc.find(n->names[0]);
    if (!ns) ns = globals.d->find(n->names[0]);
    if (!ns || ns->kind != Kind::Namespace || !ns->d->cls.empty())
      fail("set", "Can only set attributes on namespace objects.");
    check_no_cycle(*ns, v, menv, "set");
    ns->d->set(n->attr, v);
    return;
  }
  bind_names(n, v, sc, "set");
}

// Binds n's target names ({% set a, b = … %}, {% for k, v in … %}) to v, unpacking it when
// the target is a tuple.
void Interp::bind_names(Node* n, const Value& v, Scope& sc, const char* construct) {
  if (!n->unpack) {
    sc.set(n->names[0], v);
    return;
  }
  auto items = iterate(v, construct);
  if (items.size() != n->names.size())
    fail(construct, items.size() > n->names.size() ? "too many values to unpack (expected " + std::to_string(n->names.size()) + ")"
                                                   : "not enough values to unpack (expected " + std::to_string(n->names.size()) + ", got " + std::to_string(items.size()) + ")");
  for (size_t k = 0; k < items.size(); k++) sc.set(n->names[k], items[k]);
}

// {% set x | filters %}…{% endset %} and {% filter … %}…{% endfilter %}: the body rendered in
// its own scope, then passed through the filter chain n->ch.
Value Interp::filtered_body(Node* n, const ScopeP& sc) {
  auto inner = std::make_shared<Scope>();
  inner->parent = sc;
  std::string buf;
  exec_block(n->blocks[0], inner, buf);
  return apply_filter_chain(n->ch, Value::str(std::move(buf)), *sc);
}

Flow Interp::exec_block(const std::vector<Node*>& body, const ScopeP& sc, std::string& out) {
  for (Node* n : body) {
    Flow f = exec(n, sc, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Flow Interp::exec(Node* n, const ScopeP& sc, std::string& out) {
  step();
  cur_line = n->line;
  switch (n->kind) {
    case NK::Text: emit(out, n->name); return Flow::Normal;
    case NK::Emit: {
      Value v = eval(n->ch[0], *sc);
      if (v.is_str()) emit(out, v.sv());
      else emit(out, py_str(v));
      return Flow::Normal;
    }
    case NK::If: {
      for (size_t k = 0; k < n->ch.size(); k++)
        if (truthy(eval(n->ch[k], *sc))) return exec_block(n->blocks[k], sc, out);
      if (n->blocks.size() > n->ch.size()) return exec_block(n->blocks.back(), sc, out);
      return Flow::Normal;
    }
    case NK::For: {
      Value seq = eval(n->ch[0], *sc);
      cur_line = n->line;
      return run_for(n, sc, seq, 1, out);
    }
    case NK::Set: {
      Value v = eval(n->ch[0], *sc);
      cur_line = n->line;
      assign(n, v, *sc);
      return Flow::Normal;
    }
    case NK::SetBlock: sc->set(n->names[0], filtered_body(n, sc)); return Flow::Normal;
    case NK::Macro: sc->set(n->name, make_macro(n, sc)); return Flow::Normal;
    case NK::CallBlock: {
      Node* call = n->ch[0];
      Value callee = eval(call->ch[0], *sc);
      CallArgs a;
      eval_args(call, 1, *sc, a);
      // caller(): the call block's body, with the block's own parameters.
      a.kw.emplace_back("caller", make_macro(n, sc));
      cur_line = n->line;
      Value r = call_value(callee, a, call->ch[0]->kind == NK::Name ? call->ch[0]->name : "");
      emit(out, py_str(r));
      return Flow::Normal;
    }
    case NK::FilterBlock: emit(out, py_str(filtered_body(n, sc))); return Flow::Normal;
    case NK::Generation: return exec_block(n->blocks[0], sc, out);
    case NK::With: {
      auto ws = std::make_shared<Scope>();
      ws->parent = sc;
      for (size_t k = 0; k < n->names.size(); ++k) ws->set(n->names[k], eval(n->ch[k], *sc));
      return exec_block(n->blocks[0], ws, out);
    }
    case NK::Block:  // rendered in place; it sees the template's variables, or with `scoped` the local ones
      // (jinja2 checks `required` here, where a child template would have overridden the block)
      if (n->required) fail("block " + n->name, "Required block '" + n->name + "' not found");
      render_block(n, n->scoped ? sc : root, out);
      return Flow::Normal;
    case NK::Load: {
      Value what = eval(n->ch[0], *sc);
      cur_line = n->line;
      fail(n->name, "cannot load template " + py_repr(what) +
                        ": a chat template is a single string, there is no template loader");
    }
    case NK::Break: return Flow::Break;
    case NK::Continue: return Flow::Continue;
    default: fail("statement", "not a statement");
  }
}

// The loop of For node n over seq at loop depth `depth` (a recursive loop's loop(x) runs it again
// over x, one deeper, and returns what that rendered as Markup, as jinja2 does).
Flow Interp::run_for(Node* n, const ScopeP& sc, const Value& seq, int64_t depth, std::string& out) {
  std::vector<Value> items = iterate(seq, "for");
  if (n->ch[1]) {
    std::vector<Value> kept;
    for (auto& it : items) {
      step();
      Scope probe;
      probe.parent = sc;
      bind_names(n, it, probe, "for");
      if (truthy(eval(n->ch[1], probe))) kept.push_back(it);
    }
    items.swap(kept);
  }
  size_t len = items.size();
  for (size_t k = 0; k < len; k++) {
    step();
    auto it_scope = std::make_shared<Scope>();
    it_scope->parent = sc;
    bind_names(n, items[k], *it_scope, "for");
    Value loop = Value::ns();
    auto& L = *loop.d;
    L.set("index", Value::integer(int64_t(k + 1)));
    L.set("index0", Value::integer(int64_t(k)));
    L.set("revindex", Value::integer(int64_t(len - k)));
    L.set("revindex0", Value::integer(int64_t(len - k - 1)));
    L.set("first", Value::boolean(k == 0));
    L.set("last", Value::boolean(k + 1 == len));
    L.set("length", Value::integer(int64_t(len)));
    L.set("depth", Value::integer(depth));
    L.set("depth0", Value::integer(depth - 1));
    L.set("previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
    L.set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("there is no next item"));
    L.set("cycle", make_callable("cycle", [k](Interp&, CallArgs& a) -> Value {
            if (a.pos.empty()) fail("loop.cycle", "no items for cycling given");
            return a.pos[k % a.pos.size()];
          }));
    if (n->recursive) {  // loop(iterable): the same loop one level deeper (a callable namespace)
      auto rc = std::make_shared<Callable>();
      rc->name = "loop";
      rc->fn = [n, sc, depth](Interp& in, CallArgs& a) -> Value {
        if (a.pos.size() != 1 || !a.kw.empty()) fail("loop", "a recursive loop is called with one iterable");
        if (++in.depth > in.opt.max_recursion) {
          in.depth--;
          fail("loop", "maximum recursion depth exceeded (" + std::to_string(in.opt.max_recursion) + ")");
        }
        struct Dec {
          size_t& d;
          ~Dec() { d--; }
        } dec{in.depth};
        std::string sub;
        in.run_for(n, sc, a.pos[0], depth + 1, sub);
        return Value::str(std::move(sub), true);
      };
      loop.fn = rc;
    } else {  // jinja2's LoopContext is callable either way (a test `loop is callable` sees it)
      static const auto not_recursive = std::make_shared<const Callable>(Callable{"loop", [](Interp&, CallArgs&) -> Value {
        fail("loop", "The loop must have the 'recursive' marker to be called recursively.");
      }});
      loop.fn = not_recursive;
    }
    it_scope->set("loop", loop);
    Flow f = exec_block(n->blocks[0], it_scope, out);
    if (f == Flow::Break) break;
  }
  if (len == 0 && n->blocks.size() > 1 && !n->blocks[1].empty()) {
    auto else_scope = std::make_shared<Scope>();
    else_scope->parent = sc;
    return exec_block(n->blocks[1], else_scope, out) == Flow::Normal ? Flow::Normal : Flow::Normal;
  }
  return Flow::Normal;
}

// Block n's body in a scope of its own under `parent`. A chat template has no parent template,
// so `super` in a block is jinja2's undefined "there is no parent block" (calling it fails).
void Interp::render_block(Node* n, const ScopeP& parent, std::string& out) {
  auto bs = std::make_shared<Scope>();
  bs->parent = parent;
  bs->set("super", Value::undefined("there is no parent block called '" + n->name + "'."));
  exec_block(n->blocks[0], bs, out);
}

// `self`: jinja2's TemplateReference, whose attributes are the template's blocks. self.name is a
// BlockReference (attributes name and super): self.name() renders that block with the template's
// variables (not the caller's locals) and returns the text, as jinja2 does.
Value Interp::template_reference() {
  if (self_ref.kind == Kind::Namespace) return self_ref;
  self_ref = Value::ns();
  self_ref.d->cls = kTemplateRefClass;
  for (Node* b : prog.blocks) {
    Value ref = Value::ns();
    ref.d->cls = kBlockRefClass;
    ref.d->set("name", Value::str(b->name));
    ref.d->set("super", Value::undefined("there is no parent block called '" + b->name + "'."));
    ref.fn = std::make_shared<Callable>(Callable{b->name, [b](Interp& in, CallArgs& a) -> Value {
      if (!a.pos.empty() || !a.kw.empty()) fail("block " + b->name, "BlockReference.__call__() takes no arguments");
      if (++in.depth > in.opt.max_recursion) {
        in.depth--;
        fail("block " + b->name, "maximum recursion depth exceeded (" + std::to_string(in.opt.max_recursion) + ")");
      }
      struct Dec {
        size_t& d;
        ~Dec() { d--; }
      } dec{in.depth};
      std::string text;
      in.render_block(b, in.root, text);
      return Value::str(std::move(text));
    }});
    self_ref.d->set(b->name, std::move(ref));
  }
  return self_ref;
}

std::string render_program(const detail::Program& prog, const nlohmann::ordered_json& ctx) {
  Interp in(prog);
  try {
    in.install_globals();
    in.root = std::make_shared<Scope>();
    if (ctx.is_object())
      for (auto it = ctx.begin(); it != ctx.end(); ++it) in.root->vars.items.emplace_back(it.key(), Value::from_json(it.value()));
    std::string out;
    in.exec_block(prog.body, in.root, out);
    in.root->vars.items.clear();  // break macro ↔ scope reference cycles
    return out;
  } catch (JinjaError& e) {
    if (in.root) in.root->vars.items.clear();
    if (e.line == 0) e.line = in.cur_line;
    throw;
  }
}

}  // namespace kiln::chat::jinja
