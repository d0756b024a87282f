// chat/jinja/jinja_tests.cpp — Jinja tests (`x is defined`, `n is divisibleby 3`, `a is eq b`,
//       …): the registry's test table and jinja2's implementations of them.
// Must not: evaluate template nodes (interp.cpp evaluates the operand and arguments).
// Threading: runs inside one render call (Interp).
#include "chat/jinja/interp.h"
#include "chat/jinja/py_string.h"

namespace kiln::chat::jinja {

namespace {

const Value& operand(CallArgs& a, const std::string& name) {
  if (a.pos.empty()) fail("test " + name, "missing argument");
  return a.pos[0];
}

bool test_kind(Interp&, const std::string& name, const Value& v, CallArgs&) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_str();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") return v.is_str() || v.is_dict() || v.is_undefined() || (v.is_list() && !v.gen);
  if (name == "iterable") return v.is_str() || v.is_dict() || v.is_undefined() || v.is_list();
  if (name == "callable") return v.kind == Kind::Callable || v.fn || v.is_undefined();  // (joiner, self.name, loop)
  return v.is_str() && v.safe;  // escaped
}

bool test_case(Interp&, const std::string& name, const Value& v, CallArgs&) {  // lower / upper
  const std::string s = py_str(v);
  return py_is_case(s, name != "lower");
}

bool test_parity(Interp&, const std::string& name, const Value& v, CallArgs&) {  // odd / even
  int64_t n = as_int(v, ("test " + name).c_str());
  return name == "odd" ? (n % 2 != 0) : (n % 2 == 0);
}

bool test_divisibleby(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  const std::string construct = "test " + name;
  int64_t n = as_int(v, construct.c_str()), d = as_int(operand(a, name), construct.c_str());
  if (d == 0) fail(construct, "integer division or modulo by zero");
  return n % d == 0;
}

bool test_sameas(Interp&, const std::string& name, const Value& v, CallArgs& a) {  // Python `is`
  const Value& o = operand(a, name);
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::None:
    case Kind::Undefined: return true;
    case Kind::Bool: return v.b == o.b;
    case Kind::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
    case Kind::String: return v.s == o.s;
    case Kind::List: return v.l == o.l;
    case Kind::Dict:
    case Kind::Namespace: return v.d == o.d;
    case Kind::Callable: return v.fn == o.fn;
    default: return false;
  }
}

bool test_in(Interp& in, const std::string& name, const Value& v, CallArgs& a) { return in.contains(operand(a, name), v); }

bool test_compare(Interp& in, const std::string& name, const Value& v, CallArgs& a) {  // == eq ne < lt …
  return in.compare(name, v, operand(a, name));
}

bool test_registered(Interp&, const std::string& name, const Value& v, CallArgs&) {  // filter / test
  return v.is_str() && (name == "filter" ? find_filter(v.sv()) != nullptr : find_test(v.sv()) != nullptr);
}

constexpr TestDef kTests[] = {
    {"!=", test_compare},     {"<", test_compare},       {"<=", test_compare},  {"==", test_compare},
    {">", test_compare},      {">=", test_compare},      {"boolean", test_kind}, {"callable", test_kind},
    {"defined", test_kind},   {"divisibleby", test_divisibleby}, {"eq", test_compare}, {"equalto", test_compare},
    {"escaped", test_kind},   {"even", test_parity},     {"false", test_kind},  {"filter", test_registered},
    {"float", test_kind},     {"ge", test_compare},      {"greaterthan", test_compare}, {"gt", test_compare},
    {"in", test_in},          {"integer", test_kind},    {"iterable", test_kind}, {"le", test_compare},
    {"lessthan", test_compare}, {"lower", test_case},    {"lt", test_compare},  {"mapping", test_kind},
    {"ne", test_compare},     {"none", test_kind},       {"number", test_kind}, {"odd", test_parity},
    {"sameas", test_sameas},  {"sequence", test_kind},   {"string", test_kind}, {"test", test_registered},
    {"true", test_kind},      {"undefined", test_kind},  {"upper", test_case},
};

}  // namespace

std::span<const TestDef> test_table() { return kTests; }

bool Interp::apply_test(const std::string& name, const Value& v, CallArgs& a) {
  const TestDef* t = find_test(name);
  if (!t) fail("test " + name, "no test named '" + name + "'");
  return t->fn(*this, name, v, a);
}

}  // namespace kiln::chat::jinja
