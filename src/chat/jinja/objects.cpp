// chat/jinja/objects.cpp — the Python object protocol on Jinja values, as jinja2's sandbox
//       runs it: attribute and item access (methods from the registry), slicing, iteration,
//       len(), `in`, ordering and comparison, arithmetic; and the value helpers of interp.h.
// Must not: evaluate template nodes (interp.cpp) or implement filters / methods themselves.
// Threading: runs inside one render call (Interp).
#include <algorithm>
#include <cmath>

#include "chat/jinja/interp.h"
#include "chat/jinja/py_string.h"

namespace kiln::chat::jinja {

[[noreturn]] void undefined_error(const Value& u, const std::string& construct) {
  if (u.unsafe) fail(construct, u.s ? *u.s : "unsafe access");
  fail(construct, u.s ? *u.s : "value is undefined");
}

int64_t as_int(const Value& v, const char* construct) {
  if (v.kind == Kind::Int) return v.i;
  if (v.kind == Kind::Bool) return v.b;
  if (v.is_undefined()) undefined_error(v, construct);
  fail(construct, std::string("'") + type_name(v) + "' object cannot be interpreted as an integer");
}

double as_num(const Value& v) { return v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? double(v.b) : double(v.i); }

Value make_callable(std::string name, std::function<Value(Interp&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  v.fn = std::move(c);
  return v;
}

Value make_gen(std::vector<Value> items) {
  Value v = Value::list(std::move(items));
  v.gen = true;
  return v;
}

std::vector<Value> dict_pairs(const Value& d) {
  std::vector<Value> out;
  for (auto& kv : d.d->items) out.push_back(Value::list({key_value(kv.first), kv.second}, true));
  return out;
}

const Value* arg(CallArgs& a, size_t idx, const char* name) {
  if (idx < a.pos.size()) return &a.pos[idx];
  for (auto& kv : a.kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

Value arg_or(CallArgs& a, size_t idx, const char* name, Value dflt) {
  const Value* v = arg(a, idx, name);
  return v ? *v : dflt;
}

namespace {

// obj.name bound to `self` as a callable; a mutator under the immutable sandbox is an unsafe
// undefined instead (using it is a SecurityError, as in HF's ImmutableSandboxedEnvironment).
Value bound_method(const Interp& in, const Value& self, const MethodDef& m) {
  if (m.mutates && in.opt.immutable_sandbox) {
    Value u = Value::undefined("access to attribute '" + std::string(m.name) + "' of '" + type_name(self) +
                               "' object is unsafe.");
    u.unsafe = true;
    return u;
  }
  const MethodDef* def = &m;
  return make_callable(std::string(m.name), [self, def](Interp& in, CallArgs& a) {
    return def->fn(in, std::string(def->name), self, a);
  });
}

}  // namespace

Value Interp::get_attr(const Value& obj, const std::string& name) {
  const MethodDef* m = nullptr;
  switch (obj.kind) {
    case Kind::Undefined: undefined_error(obj, "attribute '" + name + "'");
    case Kind::Dict:
      if ((m = find_def(dict_method_table(), name))) return bound_method(*this, obj, *m);
      if (const Value* v = obj.d->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    case Kind::Namespace:
      if (obj.d->cls == kCyclerClass && (m = find_def(cycler_method_table(), name))) return bound_method(*this, obj, *m);
      if (const Value* v = obj.d->find(name)) return *v;
      if (!obj.d->cls.empty()) return Value::undefined("'" + std::string(obj.d->cls) + " object' has no attribute '" + name + "'");
      break;
    case Kind::String: m = find_def(str_method_table(), name); break;
    case Kind::List:
      if (obj.gen) break;
      if (obj.group && (name == "grouper" || name == "list")) return (*obj.l)[name == "grouper" ? 0 : 1];
      m = find_def(obj.tuple ? tuple_method_table() : list_method_table(), name);
      break;
    default: break;
  }
  if (m) return bound_method(*this, obj, *m);
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
}

// environment.getitem (sandboxed): item first, then attribute for string keys.
Value Interp::get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::Undefined: undefined_error(obj, "subscript");
    case Kind::Dict:
      if (key.is_str()) {
        if (const Value* v = obj.d->find(key.sv())) return *v;
        return get_attr(obj, key.sv());
      }
      if (key.is_number() || key.is_none())
        if (const Value* v = obj.d->find(dict_key(key))) return *v;
      return Value::undefined("'dict object' has no attribute " + py_repr(key));
    case Kind::List:
      if (!obj.gen && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
        int64_t i = as_int(key, "subscript"), n = int64_t(obj.l->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(std::string(type_name(obj)) + " object has no element " + py_repr(key));
        return (*obj.l)[size_t(i)];
      }
      break;
    case Kind::String:
      if (key.kind == Kind::Int || key.kind == Kind::Bool) {
        auto cps = utf8_decode(obj.sv());
        int64_t i = as_int(key, "subscript"), n = int64_t(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("str object has no element " + py_repr(key));
        return Value::str(utf8_encode(cps, size_t(i), size_t(i) + 1));
      }
      break;
    case Kind::Namespace:
      if (key.is_str()) return get_attr(obj, key.sv());
      break;
    default: break;
  }
  if (key.is_str()) return get_attr(obj, key.sv());
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute " + py_repr(key));
}

Value Interp::slice(const Value& obj, const Value& a, const Value& b, const Value& c) {
  if (obj.is_undefined()) undefined_error(obj, "slice");
  if (!(obj.is_str() || (obj.is_list() && !obj.gen))) return Value::undefined("object is not sliceable");
  auto idx = [&](const Value& v, bool& has) -> int64_t {
    has = !(v.is_none() || v.is_undefined());
    if (!has) return 0;
    if (v.kind != Kind::Int && v.kind != Kind::Bool) fail("slice", "slice indices must be integers or None");
    return as_int(v, "slice");
  };
  bool hs, he, hst;
  int64_t start = idx(a, hs), stop = idx(b, he), stp = idx(c, hst);
  if (!hst) stp = 1;
  if (stp == 0) fail("slice", "slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_str()) {
    cps = utf8_decode(obj.sv());
    n = int64_t(cps.size());
  } else {
    n = int64_t(obj.l->size());
  }
  auto adj = [&](int64_t v, bool has, int64_t dflt) {
    if (!has) return dflt;
    if (v < 0) {
      v += n;
      if (v < 0) v = stp < 0 ? -1 : 0;
    } else if (v >= n) {
      v = stp < 0 ? n - 1 : n;
    }
    return v;
  };
  start = adj(start, hs, stp < 0 ? n - 1 : 0);
  stop = adj(stop, he, stp < 0 ? -1 : n);
  std::vector<size_t> picks;
  if (stp > 0)
    for (int64_t k = start; k < stop; k += stp) picks.push_back(size_t(k));
  else
    for (int64_t k = start; k > stop; k += stp) picks.push_back(size_t(k));
  if (obj.is_str()) {
    std::string o;
    for (size_t k : picks) utf8_append(o, cps[k]);
    return Value::str(std::move(o));
  }
  std::vector<Value> items;
  for (size_t k : picks) items.push_back((*obj.l)[k]);
  return Value::list(std::move(items), obj.tuple);
}

// Python iter(): list of elements.
std::vector<Value> Interp::iterate(const Value& v, const char* construct) {
  switch (v.kind) {
    case Kind::Undefined:
      if (v.unsafe) undefined_error(v, construct);
      return {};
    case Kind::List: return *v.l;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.d->items) keys.push_back(key_value(kv.first));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      auto cps = utf8_decode(v.sv());
      for (size_t k = 0; k < cps.size(); k++) chars.push_back(Value::str(utf8_encode(cps, k, k + 1)));
      return chars;
    }
    default: fail(construct, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

int64_t Interp::py_len(const Value& v, const char* construct) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return int64_t(utf8_length(v.sv()));
    case Kind::List:
      if (v.gen) break;
      return int64_t(v.l->size());
    case Kind::Dict: return int64_t(v.d->items.size());
    default: break;
  }
  fail(construct, std::string("object of type '") + type_name(v) + "' has no len()");
}

bool Interp::contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined:
      if (container.unsafe) undefined_error(container, "in");
      return false;
    case Kind::String:
      if (!item.is_str()) fail("in", std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      return container.sv().find(item.sv()) != std::string::npos;
    case Kind::List:
      for (const auto& e : *container.l)
        if (py_eq(e, item)) return true;
      return false;
    case Kind::Dict:
      if (item.is_list() && !item.tuple) fail("in", "unhashable type: 'list'");
      if (item.is_dict()) fail("in", "unhashable type: 'dict'");
      return container.d->find(dict_key(item)) != nullptr;
    default: fail("in", std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

// Python ordering (<).
bool Interp::less(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) undefined_error(a, std::string("comparison ") + op);
  if (b.is_undefined()) undefined_error(b, std::string("comparison ") + op);
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) return as_int(a, op) < as_int(b, op);
    return as_num(a) < as_num(b);
  }
  if (a.is_str() && b.is_str()) return a.sv() < b.sv();
  if (a.is_list() && b.is_list() && !a.gen && !b.gen && a.tuple == b.tuple) {
    size_t n = std::min(a.l->size(), b.l->size());
    for (size_t k = 0; k < n; k++) {
      if (py_eq((*a.l)[k], (*b.l)[k])) continue;
      return less((*a.l)[k], (*b.l)[k], op);
    }
    return a.l->size() < b.l->size();
  }
  fail(std::string("comparison ") + op, std::string("'") + op + "' not supported between instances of '" + type_name(a) +
                                            "' and '" + type_name(b) + "'");
}
bool Interp::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==" || op == "eq" || op == "equalto") return py_eq(a, b);
  if (op == "!=" || op == "ne") return !py_eq(a, b);
  if (op == "<" || op == "lt" || op == "lessthan") return less(a, b, "<");
  if (op == ">" || op == "gt" || op == "greaterthan") return less(b, a, ">");
  if (op == "<=" || op == "le") return py_eq(a, b) || less(a, b, "<=");
  if (op == ">=" || op == "ge") return py_eq(a, b) || less(b, a, ">=");
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  fail("comparison", "unknown operator " + op);
}

// ---- arithmetic ----
Value Interp::arith(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = py_str(a) + py_str(b);
    check_size(s.size(), "~");
    return Value::str(std::move(s));
  }
  std::string construct = "operator " + op;
  if (a.is_undefined()) undefined_error(a, construct);
  if (b.is_undefined()) undefined_error(b, construct);
  auto type_err = [&]() -> Value {
    fail(construct, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool ints = a.kind != Kind::Float && b.kind != Kind::Float;
    if (ints) {
      int64_t x = as_int(a, "op"), y = as_int(b, "op"), r = 0;
      bool ovf = false;
      if (op == "+") ovf = __builtin_add_overflow(x, y, &r);
      else if (op == "-") ovf = __builtin_sub_overflow(x, y, &r);
      else if (op == "*") ovf = __builtin_mul_overflow(x, y, &r);
      else if (op == "/") {
        if (y == 0) fail(construct, "division by zero");
        return Value::flt(double(x) / double(y));
      } else if (op == "//" || op == "%") {
        if (y == 0) fail(construct, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail(construct, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      } else if (op == "**") {
        if (y < 0) return Value::flt(std::pow(double(x), double(y)));
        r = 1;
        for (int64_t k = 0; k < y && !ovf; k++) ovf = __builtin_mul_overflow(r, x, &r);
        if (y > 64 && (x == 0 || x == 1)) ovf = false;
      } else {
        return type_err();
      }
      if (ovf) fail(construct, "integer overflow (kiln integers are 64-bit)");
      return Value::integer(r);
    }
    double x = as_num(a), y = as_num(b);
    if (op == "+") return Value::flt(x + y);
    if (op == "-") return Value::flt(x - y);
    if (op == "*") return Value::flt(x * y);
    if (op == "/") {
      if (y == 0) fail(construct, "float division by zero");
      return Value::flt(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(construct, "float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value::flt(m);
      return Value::flt(std::floor((x - m) / y + 0.5) == (x - m) / y ? (x - m) / y : std::floor(x / y));
    }
    if (op == "**") return Value::flt(std::pow(x, y));
    return type_err();
  }
  if (op == "+") {
    if (a.is_str() && b.is_str()) {
      std::string s;
      bool safe = a.safe || b.safe;
      s = (safe && !a.safe ? html_escape(a.sv()) : a.sv()) + (safe && !b.safe ? html_escape(b.sv()) : b.sv());
      check_size(s.size(), "+");
      return Value::str(std::move(s), safe);
    }
    if (a.is_list() && b.is_list() && !a.gen && !b.gen && a.tuple == b.tuple) {
      std::vector<Value> items = *a.l;
      items.insert(items.end(), b.l->begin(), b.l->end());
      return Value::list(std::move(items), a.tuple);
    }
    return type_err();
  }
  if (op == "*") {
    const Value* seq = a.is_number() ? &b : &a;
    const Value* cnt = a.is_number() ? &a : &b;
    if (cnt->kind == Kind::Float || !cnt->is_number()) return type_err();
    int64_t n = std::max<int64_t>(0, as_int(*cnt, "*"));
    if (seq->is_str()) {
      if (n > 0 && seq->sv().size() * uint64_t(n) > opt.max_output_bytes) check_size(seq->sv().size() * n, "*");
      std::string s;
      for (int64_t k = 0; k < n; k++) s += seq->sv();
      return Value::str(std::move(s), seq->safe);
    }
    if (seq->is_list() && !seq->gen) {
      if (n > 0 && seq->l->size() * uint64_t(n) > opt.max_steps) fail("*", "list too large");
      std::vector<Value> items;
      for (int64_t k = 0; k < n; k++) items.insert(items.end(), seq->l->begin(), seq->l->end());
      return Value::list(std::move(items), seq->tuple);
    }
    return type_err();
  }
  if (op == "%" && a.is_str()) return Value::str(printf_format(a.sv(), b), a.safe);
  return type_err();
}

}  // namespace kiln::chat::jinja
