// chat/jinja/interp.cpp — tree-walking evaluator: scopes, statements, operators, filters,
// tests, str/list/dict methods and globals with jinja2 + SandboxedEnvironment semantics
// (llama-server's: list/dict mutators allowed, see mutate.cpp), or HF transformers'
// ImmutableSandboxedEnvironment when Options::immutable_sandbox is set.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <unordered_set>

#include "chat/jinja/ast.h"
#include "chat/jinja/mutate.h"

namespace kiln::chat::jinja {

namespace {
const std::unordered_set<std::string>& known_filters() {
  static const std::unordered_set<std::string> s = {
      "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
      "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "join", "last",
      "length", "list", "lower", "items", "map", "min", "max", "pprint", "random", "reject", "rejectattr",
      "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags", "sum",
      "title", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr",
      "tojson"};
  return s;
}
const std::unordered_set<std::string>& known_tests() {
  static const std::unordered_set<std::string> s = {
      "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false", "true",
      "integer", "float", "lower", "upper", "string", "mapping", "number", "sequence", "iterable", "callable",
      "sameas", "escaped", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan", "ge", ">=", "<",
      "lt", "lessthan", "<=", "le"};
  return s;
}
}  // namespace

bool is_known_filter(const std::string& n) { return known_filters().count(n) > 0; }
bool is_known_test(const std::string& n) { return known_tests().count(n) > 0; }

namespace {

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

std::string html_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '\'': o += "&#39;"; break;
      case '"': o += "&#34;"; break;
      default: o.push_back(c);
    }
  }
  return o;
}

// Python's str.strip family. chars == nullptr → whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<uint32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) b++;
  if (right)
    while (e > b && strip_it(cps[e - 1])) e--;
  return utf8_encode(cps, b, e);
}

std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (sep.is_none() || sep.is_undefined()) {
    auto cps = utf8_decode(s);
    size_t i = 0, n = cps.size();
    while (true) {
      while (i < n && py_isspace(cps[i])) i++;
      if (i >= n) break;
      if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
        size_t e = n;
        while (e > i && py_isspace(cps[e - 1])) e--;
        out.push_back(Value::str(utf8_encode(cps, i, e)));
        break;
      }
      size_t j = i;
      while (j < n && !py_isspace(cps[j])) j++;
      out.push_back(Value::str(utf8_encode(cps, i, j)));
      i = j;
    }
    return out;
  }
  if (!sep.is_str()) fail("split", std::string("must be str or None, not ") + type_name(sep));
  const std::string& d = sep.sv();
  if (d.empty()) fail("split", "empty separator");
  size_t pos = 0;
  while (true) {
    if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) break;
    size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.push_back(Value::str(s.substr(pos, f - pos)));
    pos = f + d.size();
  }
  out.push_back(Value::str(s.substr(pos)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  std::string out;
  if (a.empty()) {
    auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); k++) {
      if (count < 0 || done < count) {
        out += b;
        done++;
      }
      if (k < cps.size()) utf8_append(out, cps[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(a, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += b;
    pos = f + a.size();
    done++;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  return s;
}
// str.capitalize() / |capitalize (ASCII letters).
std::string py_capitalize(std::string s) {
  s = ascii_lower(std::move(s));
  if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}
bool is_cased_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python str.title() (ASCII letters; other bytes are case-less word breaks unless >= 0x80).
std::string py_title(const std::string& s) {
  std::string o = s;
  bool prev_cased = false;
  for (char& c : o) {
    bool alpha = is_cased_alpha(c);
    if (alpha) {
      c = prev_cased ? char(std::tolower(static_cast<unsigned char>(c))) : char(std::toupper(static_cast<unsigned char>(c)));
    }
    prev_cased = alpha || (static_cast<unsigned char>(c) >= 0x80 && prev_cased);
  }
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------
struct Interp {
  const detail::Program& prog;
  const Options& opt;
  size_t steps = 0;
  size_t depth = 0;
  int cur_line = 0;
  ScopeP root;
  Value globals;  // Dict of builtins

  MutateEnv menv;  // what list/dict mutators need from us (mutate.h)

  Interp(const detail::Program& p) : prog(p), opt(p.opt) {
    menv.steps = [this](size_t n) { step(n); };
    menv.less = [this](const Value& a, const Value& b) { return less(a, b, "<"); };
    menv.iterate = [this](const Value& v) { return iterate(v, "iterate"); };
  }

  void step(size_t n = 1) {
    steps += n;
    if (steps > opt.max_steps) fail("limit", "template exceeded max_steps (" + std::to_string(opt.max_steps) + ")");
  }
  void check_size(size_t n, const char* construct) {
    if (n > opt.max_output_bytes)
      fail(construct, "output exceeds max_output_bytes (" + std::to_string(opt.max_output_bytes) + ")");
  }

  // ---- lookups ----
  Value lookup(const std::string& name, Scope& sc) {
    if (const Value* v = sc.find(name)) return *v;
    if (const Value* g = globals.d->find(name)) return *g;
    return Value::undefined("'" + name + "' is undefined");
  }

  Value make_method(const Value& self, const std::string& name, bool unsafe_mutator) {
    if (unsafe_mutator) {
      Value u = Value::undefined("access to attribute '" + name + "' of '" + type_name(self) + "' object is unsafe.");
      u.unsafe = true;
      return u;
    }
    Value v;
    v.kind = Kind::Callable;
    auto c = std::make_shared<Callable>();
    c->name = name;
    Value selfc = self;
    c->fn = [selfc, name](Interp& in, CallArgs& a) { return in.call_method(selfc, name, a); };
    v.fn = c;
    return v;
  }

  static bool is_str_method(const std::string& n) {
    static const std::unordered_set<std::string> s = {
        "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
        "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
        "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
        "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
        "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
        "translate", "upper", "zfill"};
    return s.count(n) > 0;
  }

  // environment.getattr (sandboxed): attribute first, then item.
  Value get_attr(const Value& obj, const std::string& name) {
    switch (obj.kind) {
      case Kind::Undefined: undefined_error(obj, "attribute '" + name + "'");
      case Kind::Dict: {
        static const std::unordered_set<std::string> safe = {"get", "items", "keys", "values", "copy", "fromkeys"};
        if (safe.count(name)) return make_method(obj, name, false);
        if (is_dict_mutator(name)) return make_method(obj, name, opt.immutable_sandbox);
        if (const Value* v = obj.d->find(name)) return *v;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      }
      case Kind::Namespace: {
        if (const Value* v = obj.d->find(name)) return *v;
        return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
      }
      case Kind::String:
        if (is_str_method(name)) return make_method(obj, name, false);
        break;
      case Kind::List: {
        if (obj.gen) break;
        if (obj.group && (name == "grouper" || name == "list")) return (*obj.l)[name == "grouper" ? 0 : 1];
        static const std::unordered_set<std::string> safe = {"index", "count", "copy"};
        if (safe.count(name) && !obj.tuple) return make_method(obj, name, false);
        if ((name == "index" || name == "count") && obj.tuple) return make_method(obj, name, false);
        if (is_list_mutator(name) && !obj.tuple) return make_method(obj, name, opt.immutable_sandbox);
        break;
      }
      default: break;
    }
    return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
  }

  // environment.getitem (sandboxed): item first, then attribute for string keys.
  Value get_item(const Value& obj, const Value& key) {
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

  Value slice(const Value& obj, const Value& a, const Value& b, const Value& c) {
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
  std::vector<Value> iterate(const Value& v, const char* construct) {
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

  int64_t py_len(const Value& v, const char* construct) {
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

  bool contains(const Value& container, const Value& item) {
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
  bool less(const Value& a, const Value& b, const char* op) {
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
  bool compare(const std::string& op, const Value& a, const Value& b) {
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
  Value arith(const std::string& op, const Value& a, const Value& b) {
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

  std::string printf_format(const std::string& fmt, const Value& args) {
    std::vector<Value> av;
    if (args.is_list() && args.tuple) av = *args.l;
    else av.push_back(args);
    size_t ai = 0;
    std::string out;
    for (size_t k = 0; k < fmt.size(); k++) {
      if (fmt[k] != '%') {
        out.push_back(fmt[k]);
        continue;
      }
      if (++k >= fmt.size()) fail("%", "incomplete format");
      if (fmt[k] == '%') {
        out.push_back('%');
        continue;
      }
      std::string spec = "%";
      while (k < fmt.size() && std::strchr("-+ #0123456789.", fmt[k])) spec.push_back(fmt[k++]);
      if (k >= fmt.size()) fail("%", "incomplete format");
      char conv = fmt[k];
      if (ai >= av.size()) fail("%", "not enough arguments for format string");
      const Value& v = av[ai++];
      char buf[512];
      if (conv == 's' || conv == 'r') {
        std::string s = conv == 's' ? py_str(v) : py_repr(v);
        std::snprintf(buf, sizeof buf, (spec + "s").c_str(), s.c_str());
        out += spec == "%" ? s : std::string(buf);
      } else if (conv == 'd' || conv == 'i') {
        if (!v.is_number()) fail("%", "%d format: a real number is required");
        int64_t n = v.kind == Kind::Float ? int64_t(v.f) : as_int(v, "%");
        std::snprintf(buf, sizeof buf, (spec + "lld").c_str(), (long long)n);
        out += buf;
      } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'g' || conv == 'x' || conv == 'X' || conv == 'o') {
        if (!v.is_number()) fail("%", "format: a real number is required");
        if (conv == 'x' || conv == 'X' || conv == 'o') std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), (long long)as_int(v, "%"));
        else std::snprintf(buf, sizeof buf, (spec + conv).c_str(), as_num(v));
        out += buf;
      } else {
        fail("%", std::string("unsupported format character '") + conv + "'");
      }
    }
    if (ai < av.size() && !(args.is_dict())) fail("%", "not all arguments converted during string formatting");
    return out;
  }

  // str.format (sandboxed formatter): {} {0} {name} {0[key]} {name.attr} with !s/!r and a
  // simple format spec (fill/align/width/.precision/type).
  std::string str_format(const std::string& fmt, CallArgs& a) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t k = 0; k < fmt.size(); k++) {
      char c = fmt[k];
      if (c == '}') {
        if (k + 1 < fmt.size() && fmt[k + 1] == '}') k++;
        else fail("format", "single '}' encountered in format string");
        out.push_back('}');
        continue;
      }
      if (c != '{') {
        out.push_back(c);
        continue;
      }
      if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
        out.push_back('{');
        k++;
        continue;
      }
      size_t e = fmt.find('}', k);
      if (e == std::string::npos) fail("format", "expected '}' before end of string");
      std::string field = fmt.substr(k + 1, e - k - 1);
      k = e;
      std::string spec, conv;
      size_t colon = field.find(':');
      if (colon != std::string::npos) {
        spec = field.substr(colon + 1);
        field = field.substr(0, colon);
      }
      size_t bang = field.find('!');
      if (bang != std::string::npos) {
        conv = field.substr(bang + 1);
        field = field.substr(0, bang);
      }
      size_t pe = field.find_first_of(".[");
      std::string head = field.substr(0, pe);
      Value v;
      if (head.empty()) {
        if (auto_idx >= a.pos.size()) fail("format", "Replacement index out of range");
        v = a.pos[auto_idx++];
      } else if (std::all_of(head.begin(), head.end(), ::isdigit)) {
        size_t idx = std::stoul(head);
        if (idx >= a.pos.size()) fail("format", "Replacement index out of range");
        v = a.pos[idx];
      } else {
        bool found = false;
        for (auto& kv : a.kw)
          if (kv.first == head) {
            v = kv.second;
            found = true;
          }
        if (!found) fail("format", "KeyError: '" + head + "'");
      }
      while (pe != std::string::npos && pe < field.size()) {
        if (field[pe] == '.') {
          size_t ne = field.find_first_of(".[", pe + 1);
          v = get_attr(v, field.substr(pe + 1, ne == std::string::npos ? std::string::npos : ne - pe - 1));
          pe = ne;
        } else {
          size_t ce = field.find(']', pe);
          if (ce == std::string::npos) fail("format", "Missing ']' in format string");
          std::string key = field.substr(pe + 1, ce - pe - 1);
          v = std::all_of(key.begin(), key.end(), ::isdigit) && !key.empty() ? get_item(v, Value::integer(std::stoll(key)))
                                                                            : get_item(v, Value::str(key));
          pe = ce + 1 < field.size() ? ce + 1 : std::string::npos;
        }
      }
      std::string s;
      if (conv == "r") s = py_repr(v);
      else s = format_spec(v, spec);
      out += s;
      check_size(out.size(), "format");
    }
    return out;
  }

  std::string format_spec(const Value& v, const std::string& spec) {
    if (spec.empty()) return py_str(v);
    size_t p = 0;
    char fill = ' ', align = 0;
    if (spec.size() >= 2 && std::strchr("<>^=", spec[1])) {
      fill = spec[0];
      align = spec[1];
      p = 2;
    } else if (std::strchr("<>^=", spec[0])) {
      align = spec[0];
      p = 1;
    }
    std::string rest = spec.substr(p);
    size_t q = 0;
    while (q < rest.size() && std::isdigit(static_cast<unsigned char>(rest[q]))) q++;
    int width = q ? std::stoi(rest.substr(0, q)) : 0;
    int prec = -1;
    if (q < rest.size() && rest[q] == '.') {
      size_t r = q + 1;
      while (r < rest.size() && std::isdigit(static_cast<unsigned char>(rest[r]))) r++;
      prec = std::stoi(rest.substr(q + 1, r - q - 1));
      q = r;
    }
    std::string type = rest.substr(q);
    std::string body;
    if (type == "f" || type == "F" || type == "e" || type == "%") {
      if (!v.is_number()) fail("format", "Unknown format code for object of type '" + std::string(type_name(v)) + "'");
      char buf[512];
      std::snprintf(buf, sizeof buf, ("%." + std::to_string(prec < 0 ? 6 : prec) + type).c_str(), as_num(v));
      body = buf;
    } else if (type == "d") {
      body = std::to_string(as_int(v, "format"));
    } else if (type.empty() || type == "s") {
      body = py_str(v);
      if (prec >= 0 && v.is_str()) {
        auto cps = utf8_decode(body);
        if (cps.size() > size_t(prec)) body = utf8_encode(cps, 0, prec);
      }
    } else {
      fail("format", "unsupported format spec '" + spec + "'");
    }
    size_t len = utf8_length(body);
    if (int(len) < width) {
      size_t pad = width - len;
      if (!align) align = v.is_number() ? '>' : '<';
      std::string f(1, fill);
      std::string padl, padr;
      if (align == '<') for (size_t k = 0; k < pad; k++) padr += f;
      else if (align == '^') {
        for (size_t k = 0; k < pad / 2; k++) padl += f;
        for (size_t k = 0; k < pad - pad / 2; k++) padr += f;
      } else for (size_t k = 0; k < pad; k++) padl += f;
      body = padl + body + padr;
    }
    return body;
  }

  // ---- argument helpers ----
  static const Value* arg(CallArgs& a, size_t idx, const char* name) {
    if (idx < a.pos.size()) return &a.pos[idx];
    for (auto& kv : a.kw)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  static Value arg_or(CallArgs& a, size_t idx, const char* name, Value dflt) {
    const Value* v = arg(a, idx, name);
    return v ? *v : dflt;
  }

  // ---- methods ----
  Value call_method(const Value& self, const std::string& name, CallArgs& a) {
    std::string construct = "method " + name;
    if (self.is_str()) {
      const std::string& s = self.sv();
      auto opt_str = [&](size_t i, const char* n) -> const std::string* {
        const Value* v = arg(a, i, n);
        if (!v || v->is_none()) return nullptr;
        if (!v->is_str()) fail(construct, std::string("argument must be str or None, not ") + type_name(*v));
        return &v->sv();
      };
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::str(py_strip(s, opt_str(0, "chars"), name != "rstrip", name != "lstrip"));
      if (name == "split" || name == "rsplit") {
        Value sep = arg_or(a, 0, "sep", Value::none());
        int64_t maxsplit = as_int(arg_or(a, 1, "maxsplit", Value::integer(-1)), "split");
        if (name == "rsplit" && maxsplit >= 0) {
          // rsplit with a limit: split fully, then re-join the head.
          auto parts = py_split(s, sep, -1);
          if (int64_t(parts.size()) - 1 <= maxsplit) return Value::list(parts);
          if (sep.is_none()) fail(construct, "rsplit(None, maxsplit) is not supported");
          size_t keep = parts.size() - size_t(maxsplit);
          std::string head;
          for (size_t k = 0; k < keep; k++) head += (k ? sep.sv() : "") + parts[k].sv();
          std::vector<Value> out{Value::str(head)};
          for (size_t k = keep; k < parts.size(); k++) out.push_back(parts[k]);
          return Value::list(out);
        }
        return Value::list(py_split(s, sep, maxsplit));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = arg(a, 0, "prefix");
        if (!p) fail(construct, "missing argument");
        std::vector<Value> cands = p->is_list() && p->tuple ? *p->l : std::vector<Value>{*p};
        for (const auto& c : cands) {
          if (!c.is_str()) fail(construct, "argument must be str or a tuple of str");
          const std::string& x = c.sv();
          if (name == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                                   : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "replace") {
        const Value* o = arg(a, 0, "old");
        const Value* n = arg(a, 1, "new");
        if (!o || !n || !o->is_str() || !n->is_str()) fail(construct, "replace() arguments must be str");
        std::string r = py_replace(s, o->sv(), n->sv(), as_int(arg_or(a, 2, "count", Value::integer(-1)), "replace"));
        check_size(r.size(), "replace");
        return Value::str(std::move(r));
      }
      if (name == "upper") return Value::str(ascii_upper(s));
      if (name == "lower" || name == "casefold") return Value::str(ascii_lower(s));
      if (name == "title") return Value::str(py_title(s));
      if (name == "capitalize") return Value::str(py_capitalize(s));
      if (name == "swapcase") {
        std::string r = s;
        for (char& c : r) c = std::isupper(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : char(std::toupper(c));
        return Value::str(r);
      }
      if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
        const Value* sub = arg(a, 0, "sub");
        if (!sub || !sub->is_str()) fail(construct, "must be str");
        const std::string& x = sub->sv();
        if (name == "count") {
          if (x.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
          int64_t n = 0;
          for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) n++;
          return Value::integer(n);
        }
        size_t p = (name == "find" || name == "index") ? s.find(x) : s.rfind(x);
        if (p == std::string::npos) {
          if (name == "index" || name == "rindex") fail(construct, "substring not found");
          return Value::integer(-1);
        }
        return Value::integer(int64_t(utf8_length(std::string_view(s).substr(0, p))));
      }
      if (name == "join") {
        const Value* it = arg(a, 0, "iterable");
        if (!it) fail(construct, "missing argument");
        std::string r;
        bool first = true;
        for (const auto& e : iterate(*it, "join")) {
          if (!e.is_str()) fail(construct, std::string("sequence item: expected str instance, ") + type_name(e) + " found");
          if (!first) r += s;
          first = false;
          r += e.sv();
          check_size(r.size(), "join");
        }
        return Value::str(r);
      }
      if (name == "format") return Value::str(str_format(s, a), self.safe);
      if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
        return Value::boolean(!s.empty() && std::all_of(s.begin(), s.end(), ::isdigit));
      if (name == "isalpha") return Value::boolean(!s.empty() && std::all_of(s.begin(), s.end(), ::isalpha));
      if (name == "isalnum") return Value::boolean(!s.empty() && std::all_of(s.begin(), s.end(), ::isalnum));
      if (name == "isspace") {
        auto cps = utf8_decode(s);
        return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), py_isspace));
      }
      if (name == "islower" || name == "isupper") {
        bool cased = false, ok = true;
        for (char c : s) {
          if (std::islower(static_cast<unsigned char>(c))) {
            cased = true;
            if (name == "isupper") ok = false;
          } else if (std::isupper(static_cast<unsigned char>(c))) {
            cased = true;
            if (name == "islower") ok = false;
          }
        }
        return Value::boolean(cased && ok);
      }
      if (name == "removeprefix" || name == "removesuffix") {
        const Value* x = arg(a, 0, "prefix");
        if (!x || !x->is_str()) fail(construct, "must be str");
        const std::string& p = x->sv();
        if (name == "removeprefix" && s.compare(0, p.size(), p) == 0 && s.size() >= p.size()) return Value::str(s.substr(p.size()));
        if (name == "removesuffix" && !p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
          return Value::str(s.substr(0, s.size() - p.size()));
        return Value::str(s);
      }
      if (name == "splitlines") {
        std::vector<Value> out;
        for (auto& l : split_lines(s)) out.push_back(Value::str(l));
        return Value::list(out);
      }
      if (name == "partition" || name == "rpartition") {
        const Value* x = arg(a, 0, "sep");
        if (!x || !x->is_str() || x->sv().empty()) fail(construct, "bad separator");
        size_t p = name == "partition" ? s.find(x->sv()) : s.rfind(x->sv());
        if (p == std::string::npos)
          return name == "partition" ? Value::list({Value::str(s), Value::str(""), Value::str("")}, true)
                                     : Value::list({Value::str(""), Value::str(""), Value::str(s)}, true);
        return Value::list({Value::str(s.substr(0, p)), *x, Value::str(s.substr(p + x->sv().size()))}, true);
      }
      if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
        int64_t w = as_int(arg_or(a, 0, "width", Value::integer(0)), construct.c_str());
        std::string fill = name == "zfill" ? "0" : " ";
        if (const Value* f = arg(a, 1, "fillchar"); f && f->is_str()) fill = f->sv();
        int64_t len = int64_t(utf8_length(s));
        if (len >= w) return Value::str(s);
        int64_t pad = w - len, left = 0;
        if (name == "rjust" || name == "zfill") left = pad;
        else if (name == "center") left = pad / 2 + (pad & w & 1);
        std::string r;
        for (int64_t k = 0; k < left; k++) r += fill;
        r += s;
        for (int64_t k = 0; k < pad - left; k++) r += fill;
        return Value::str(r);
      }
      fail(construct, "str." + name + "() is not supported by kiln's jinja engine");
    }
    if ((self.is_dict() && is_dict_mutator(name)) || (self.is_list() && !self.tuple && is_list_mutator(name)))
      return call_mutator(self, name, a, menv);
    if (self.is_dict()) {
      if (name == "fromkeys") {  // a classmethod: a new dict, self untouched
        const Value* it = arg(a, 0, "iterable");
        if (!it) fail(construct, "fromkeys expected at least 1 argument, got 0");
        Value d = Value::dict(), v = arg_or(a, 1, "value", Value::none());
        for (const auto& k : iterate(*it, "fromkeys")) {
          step(1 + d.d->items.size() / 16);
          d.d->set(dict_key(k), v);
        }
        return d;
      }
      if (name == "get") {
        const Value* k = arg(a, 0, "key");
        if (!k) fail(construct, "get expected at least 1 argument, got 0");
        if (k->is_str() || k->is_number() || k->is_none())
          if (const Value* v = self.d->find(dict_key(*k))) return *v;
        return arg_or(a, 1, "default", Value::none());
      }
      if (name == "items") return Value::list(dict_pairs(self));
      if (name == "keys") {
        std::vector<Value> out;
        for (auto& kv : self.d->items) out.push_back(key_value(kv.first));
        return Value::list(out);
      }
      if (name == "values") {
        std::vector<Value> out;
        for (auto& kv : self.d->items) out.push_back(kv.second);
        return Value::list(out);
      }
      if (name == "copy") {
        Value d = Value::dict();
        d.d->items = self.d->items;
        return d;
      }
    }
    if (self.is_list()) {
      if (name == "copy") return Value::list(*self.l, self.tuple);
      if (name == "count") {
        const Value* x = arg(a, 0, "value");
        int64_t n = 0;
        if (x)
          for (auto& e : *self.l) n += py_eq(e, *x);
        return Value::integer(n);
      }
      if (name == "index") {
        const Value* x = arg(a, 0, "value");
        if (x)
          for (size_t k = 0; k < self.l->size(); k++)
            if (py_eq((*self.l)[k], *x)) return Value::integer(int64_t(k));
        fail(construct, "value is not in list");
      }
    }
    fail(construct, std::string("'") + type_name(self) + "' object has no method '" + name + "'");
  }

  static std::vector<std::string> split_lines(const std::string& s) {
    // Python str.splitlines(): \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029
    std::vector<std::string> out;
    auto cps = utf8_decode(s);
    size_t b = 0;
    for (size_t k = 0; k < cps.size(); k++) {
      uint32_t c = cps[k];
      if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
          c == 0x2028 || c == 0x2029) {
        out.push_back(utf8_encode(cps, b, k));
        if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') k++;
        b = k + 1;
      }
    }
    if (b < cps.size()) out.push_back(utf8_encode(cps, b, cps.size()));
    return out;
  }

  // ---- tests ----
  bool apply_test(const std::string& name, const Value& v, CallArgs& a) {
    std::string construct = "test " + name;
    auto a0 = [&]() -> const Value& {
      if (a.pos.empty()) fail(construct, "missing argument");
      return a.pos[0];
    };
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
    if (name == "callable") return v.kind == Kind::Callable || v.is_undefined();
    if (name == "escaped") return v.is_str() && v.safe;
    if (name == "lower" || name == "upper") {
      if (!v.is_str()) {
        std::string s = py_str(v);
        CallArgs none;
        return call_method(Value::str(s), name == "lower" ? "islower" : "isupper", none).b;
      }
      CallArgs none;
      return call_method(v, name == "lower" ? "islower" : "isupper", none).b;
    }
    if (name == "odd" || name == "even") {
      int64_t n = as_int(v, construct.c_str());
      return name == "odd" ? (n % 2 != 0) : (n % 2 == 0);
    }
    if (name == "divisibleby") {
      int64_t n = as_int(v, construct.c_str()), d = as_int(a0(), construct.c_str());
      if (d == 0) fail(construct, "integer division or modulo by zero");
      return n % d == 0;
    }
    if (name == "sameas") {
      const Value& o = a0();
      if (v.kind != o.kind) return false;
      switch (v.kind) {
        case Kind::None:
        case Kind::Undefined: return true;
        case Kind::Bool: return v.b == o.b;
        case Kind::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;
        case Kind::String: return v.s == o.s;
        case Kind::List: return v.l == o.l;
        case Kind::Dict:
        case Kind::Namespace: return v.d == o.d;
        case Kind::Callable: return v.fn == o.fn;
        default: return false;
      }
    }
    if (name == "in") return contains(a0(), v);
    if (name == "filter") return v.is_str() && is_known_filter(v.sv());
    if (name == "test") return v.is_str() && is_known_test(v.sv());
    if (is_known_test(name)) return compare(name, v, a0());
    fail(construct, "no test named '" + name + "'");
  }

  // ---- filters ----
  // dict.items(): (key, value) tuples in insertion order.
  static std::vector<Value> dict_pairs(const Value& d) {
    std::vector<Value> out;
    for (auto& kv : d.d->items) out.push_back(Value::list({key_value(kv.first), kv.second}, true));
    return out;
  }

  // The `attribute=` argument of sort/unique/min/max/join/sum: the item itself when none.
  Value attr_or_self(const Value& item, const Value& attribute) {
    return attribute.is_none() ? item : attr_path(item, attribute, nullptr);
  }

  Value attr_path(const Value& item, const Value& attribute, const Value* dflt) {
    std::vector<Value> parts;
    if (attribute.is_str()) {
      for (auto& p : py_split(attribute.sv(), Value::str("."), -1)) {
        const std::string& ps = p.sv();
        if (!ps.empty() && std::all_of(ps.begin(), ps.end(), ::isdigit)) parts.push_back(Value::integer(std::stoll(ps)));
        else parts.push_back(p);
      }
    } else {
      parts.push_back(attribute);
    }
    Value cur = item;
    for (auto& p : parts) {
      cur = get_item(cur, p);
      if (dflt && cur.is_undefined()) cur = *dflt;
    }
    return cur;
  }

  Value sort_key(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_str()) return Value::str(ascii_lower(v.sv()));
    return v;
  }

  Value gen(std::vector<Value> items) {
    Value v = Value::list(std::move(items));
    v.gen = true;
    return v;
  }

  Value select_or_reject(const Value& in, CallArgs& a, bool select, bool attr_mode) {
    std::vector<Value> items = truthy(in) ? iterate(in, "select") : std::vector<Value>{};
    size_t off = 0;
    Value attribute;
    if (attr_mode) {
      if (a.pos.empty()) fail("selectattr", "missing attribute argument");
      attribute = a.pos[0];
      off = 1;
    }
    std::string test;
    CallArgs targs;
    bool has_test = a.pos.size() > off;
    if (has_test) {
      if (!a.pos[off].is_str()) fail("select", "test name must be a string");
      test = a.pos[off].sv();
      for (size_t k = off + 1; k < a.pos.size(); k++) targs.pos.push_back(a.pos[k]);
      targs.kw = a.kw;
      if (!is_known_test(test)) fail("select", "no test named '" + test + "'");
    }
    std::vector<Value> out;
    for (auto& it : items) {
      step();
      Value probe = attr_mode ? attr_path(it, attribute, nullptr) : it;
      bool r = has_test ? apply_test(test, probe, targs) : truthy(probe);
      if (r == select) out.push_back(it);
    }
    return gen(std::move(out));
  }

  Value apply_filter(const std::string& name, const Value& v, CallArgs& a) {
    std::string construct = "filter " + name;
    const char* cn = construct.c_str();
    if (name == "tojson") {
      JsonOpts o;
      o.ensure_ascii = truthy(arg_or(a, 0, "ensure_ascii", Value::boolean(false)));
      Value indent = arg_or(a, 1, "indent", Value::none());
      if (!indent.is_none()) {
        o.has_indent = true;
        if (indent.is_str()) o.indent = indent.sv();
        else o.indent = std::string(size_t(std::max<int64_t>(0, as_int(indent, cn))), ' ');
        o.item_sep = ",";
      }
      Value seps = arg_or(a, 2, "separators", Value::none());
      if (!seps.is_none()) {
        if (!seps.is_list() || seps.l->size() != 2 || !(*seps.l)[0].is_str() || !(*seps.l)[1].is_str())
          fail(construct, "separators must be a pair of strings");
        o.item_sep = (*seps.l)[0].sv();
        o.key_sep = (*seps.l)[1].sv();
      }
      o.sort_keys = truthy(arg_or(a, 3, "sort_keys", Value::boolean(false)));
      std::string s = json_dumps(v, o);
      check_size(s.size(), cn);
      return Value::str(std::move(s));
    }
    if (name == "default" || name == "d") {
      Value dflt = arg_or(a, 0, "default_value", Value::str(""));
      bool boolean = truthy(arg_or(a, 1, "boolean", Value::boolean(false)));
      if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
      return v;
    }
    if (name == "length" || name == "count") return Value::integer(py_len(v, cn));
    if (name == "string") {
      if (v.is_str()) return v;
      return Value::str(py_str(v));
    }
    if (name == "safe") return Value::str(py_str(v), true);
    if (name == "escape" || name == "e" || name == "forceescape") {
      if (v.is_str() && v.safe && name != "forceescape") return v;
      return Value::str(html_escape(py_str(v)), true);
    }
    if (name == "trim") {
      Value chars = arg_or(a, 0, "chars", Value::none());
      const std::string* cs = chars.is_str() ? &chars.sv() : nullptr;
      return Value::str(py_strip(py_str(v), cs, true, true), v.safe);
    }
    if (name == "upper") return Value::str(ascii_upper(py_str(v)), v.safe);
    if (name == "lower") return Value::str(ascii_lower(py_str(v)), v.safe);
    if (name == "capitalize") return Value::str(py_capitalize(py_str(v)), v.safe);
    if (name == "title") {
      // jinja2: split at runs of [-\s({\[<]+ and capitalise every piece
      std::string s = py_str(v), r;
      bool at_start = true;
      for (char c : s) {
        bool brk = std::strchr("-({[<", c) || py_isspace(static_cast<unsigned char>(c));
        if (c == '\0') brk = false;
        if (brk) {
          r.push_back(c);
          at_start = true;
        } else {
          r.push_back(at_start ? char(std::toupper(static_cast<unsigned char>(c))) : char(std::tolower(static_cast<unsigned char>(c))));
          at_start = false;
        }
      }
      return Value::str(r, v.safe);
    }
    if (name == "replace") {
      std::string s = py_str(v);
      Value o = arg_or(a, 0, "old", Value::str("")), n = arg_or(a, 1, "new", Value::str(""));
      Value cnt = arg_or(a, 2, "count", Value::none());
      std::string r = py_replace(s, py_str(o), py_str(n), cnt.is_none() ? -1 : as_int(cnt, cn));
      check_size(r.size(), cn);
      return Value::str(std::move(r));
    }
    if (name == "join") {
      std::string d = py_str(arg_or(a, 0, "d", Value::str("")));
      Value attribute = arg_or(a, 1, "attribute", Value::none());
      std::string r;
      bool first = true;
      for (auto& e : iterate(v, cn)) {
        if (!first) r += d;
        first = false;
        r += py_str(attr_or_self(e, attribute));
        check_size(r.size(), cn);
      }
      return Value::str(r);
    }
    if (name == "list") {
      return Value::list(iterate(v, cn));  // a new list, as Python's list(v)
    }
    if (name == "first") {
      auto items = iterate(v, cn);
      if (items.empty()) return Value::undefined("No first item, sequence was empty.");
      return items.front();
    }
    if (name == "last") {
      if (v.is_list() && v.gen) fail(construct, "'generator' object is not reversible");
      auto items = iterate(v, cn);
      if (items.empty()) return Value::undefined("No last item, sequence was empty.");
      return items.back();
    }
    if (name == "items") {
      if (v.is_undefined()) return gen({});
      if (!v.is_dict()) fail(construct, "Can only get item pairs from a mapping.");
      return gen(dict_pairs(v));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) {
        if (v.is_undefined()) undefined_error(v, cn);
        fail(construct, std::string("'") + type_name(v) + "' object has no attribute 'items'");
      }
      bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
      Value by = arg_or(a, 1, "by", Value::str("key"));
      bool rev = truthy(arg_or(a, 2, "reverse", Value::boolean(false)));
      size_t pos = by.is_str() && by.sv() == "value" ? 1 : 0;
      if (by.is_str() && by.sv() != "key" && by.sv() != "value") fail(construct, "You can only sort by either \"key\" or \"value\"");
      std::vector<Value> out = dict_pairs(v);
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        Value kx = sort_key((*x.l)[pos], cs), ky = sort_key((*y.l)[pos], cs);
        return rev ? less(ky, kx, "<") : less(kx, ky, "<");
      });
      return Value::list(out);
    }
    if (name == "sort") {
      bool rev = truthy(arg_or(a, 0, "reverse", Value::boolean(false)));
      bool cs = truthy(arg_or(a, 1, "case_sensitive", Value::boolean(false)));
      Value attribute = arg_or(a, 2, "attribute", Value::none());
      auto items = iterate(v, cn);
      std::vector<Value> keys;
      for (auto& it : items) keys.push_back(sort_key(attr_or_self(it, attribute), cs));
      std::vector<size_t> idx(items.size());
      for (size_t k = 0; k < idx.size(); k++) idx[k] = k;
      std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
        return rev ? less(keys[y], keys[x], "<") : less(keys[x], keys[y], "<");
      });
      std::vector<Value> out;
      for (size_t k : idx) out.push_back(items[k]);
      return Value::list(out);
    }
    if (name == "unique") {
      bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
      Value attribute = arg_or(a, 1, "attribute", Value::none());
      std::vector<Value> out, seen;
      for (auto& it : iterate(v, cn)) {
        Value k = sort_key(attr_or_self(it, attribute), cs);
        bool dup = false;
        for (auto& s : seen)
          if (py_eq(s, k)) dup = true;
        if (!dup) {
          seen.push_back(k);
          out.push_back(it);
        }
      }
      return gen(std::move(out));
    }
    if (name == "min" || name == "max") {
      bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
      Value attribute = arg_or(a, 1, "attribute", Value::none());
      auto items = iterate(v, cn);
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      size_t best = 0;
      Value bk = sort_key(attr_or_self(items[0], attribute), cs);
      for (size_t k = 1; k < items.size(); k++) {
        Value kk = sort_key(attr_or_self(items[k], attribute), cs);
        if (name == "min" ? less(kk, bk, "<") : less(bk, kk, "<")) {
          best = k;
          bk = kk;
        }
      }
      return items[best];
    }
    if (name == "reverse") {
      if (v.is_str()) {
        auto cps = utf8_decode(v.sv());
        std::reverse(cps.begin(), cps.end());
        return Value::str(utf8_encode(cps, 0, cps.size()));
      }
      auto items = iterate(v, cn);
      std::reverse(items.begin(), items.end());
      return gen(std::move(items));
    }
    if (name == "map") {
      auto items = truthy(v) ? iterate(v, cn) : std::vector<Value>{};
      std::vector<Value> out;
      const Value* attribute = nullptr;
      for (auto& kv : a.kw)
        if (kv.first == "attribute") attribute = &kv.second;
      if (attribute) {
        const Value* dflt = nullptr;
        for (auto& kv : a.kw)
          if (kv.first == "default") dflt = &kv.second;
        for (auto& it : items) out.push_back(attr_path(it, *attribute, dflt));
        return gen(std::move(out));
      }
      if (a.pos.empty()) return gen(std::move(items));
      if (!a.pos[0].is_str()) fail(construct, "filter name must be a string");
      std::string f = a.pos[0].sv();
      if (!is_known_filter(f)) fail(construct, "no filter named '" + f + "'");
      CallArgs fa;
      fa.pos.assign(a.pos.begin() + 1, a.pos.end());
      fa.kw = a.kw;
      for (auto& it : items) {
        step();
        CallArgs copy = fa;
        out.push_back(apply_filter(f, it, copy));
      }
      return gen(std::move(out));
    }
    if (name == "select") return select_or_reject(v, a, true, false);
    if (name == "reject") return select_or_reject(v, a, false, false);
    if (name == "selectattr") return select_or_reject(v, a, true, true);
    if (name == "rejectattr") return select_or_reject(v, a, false, true);
    if (name == "int") {
      Value dflt = arg_or(a, 0, "default", Value::integer(0));
      if (v.kind == Kind::Int) return v;
      if (v.kind == Kind::Bool) return Value::integer(v.b);
      if (v.kind == Kind::Float) {
        if (std::isnan(v.f) || std::isinf(v.f)) return dflt;
        return Value::integer(int64_t(v.f));
      }
      if (v.is_undefined()) undefined_error(v, cn);
      if (v.is_str()) {
        std::string s = py_strip(v.sv(), nullptr, true, true);
        std::string t;
        for (char c : s)
          if (c != '_') t.push_back(c);
        char* end = nullptr;
        errno = 0;
        long long n = std::strtoll(t.c_str(), &end, 10);
        if (!t.empty() && end && *end == '\0' && errno == 0) return Value::integer(n);
        double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == '\0' && !std::isnan(d) && !std::isinf(d)) return Value::integer(int64_t(d));
      }
      return dflt;
    }
    if (name == "float") {
      Value dflt = arg_or(a, 0, "default", Value::flt(0.0));
      if (v.kind == Kind::Float) return v;
      if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::flt(as_num(v));
      if (v.is_undefined()) undefined_error(v, cn);
      if (v.is_str()) {
        std::string s = py_strip(v.sv(), nullptr, true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value::flt(d);
      }
      return dflt;
    }
    if (name == "abs") {
      if (v.kind == Kind::Int) {
        if (v.i == INT64_MIN) fail(construct, "integer overflow");
        return Value::integer(v.i < 0 ? -v.i : v.i);
      }
      if (v.kind == Kind::Bool) return Value::integer(v.b);
      if (v.kind == Kind::Float) return Value::flt(std::fabs(v.f));
      if (v.is_undefined()) undefined_error(v, cn);
      fail(construct, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    }
    if (name == "round") {
      int64_t prec = as_int(arg_or(a, 0, "precision", Value::integer(0)), cn);
      std::string method = py_str(arg_or(a, 1, "method", Value::str("common")));
      if (!v.is_number()) {
        if (v.is_undefined()) undefined_error(v, cn);
        fail(construct, "round needs a number");
      }
      double x = as_num(v), m = std::pow(10.0, double(prec));
      double r;
      if (method == "common") r = std::nearbyint(x * m) / m;  // banker's rounding like Python round()
      else if (method == "ceil") r = std::ceil(x * m) / m;
      else if (method == "floor") r = std::floor(x * m) / m;
      else fail(construct, "method must be common, ceil or floor");
      return Value::flt(r);
    }
    if (name == "indent") {
      Value width = arg_or(a, 0, "width", Value::integer(4));
      bool first = truthy(arg_or(a, 1, "first", Value::boolean(false)));
      bool blank = truthy(arg_or(a, 2, "blank", Value::boolean(false)));
      std::string ind = width.is_str() ? width.sv() : std::string(size_t(std::max<int64_t>(0, as_int(width, cn))), ' ');
      std::string s = py_str(v) + "\n";
      auto lines = split_lines(s);
      std::string r;
      if (blank) {
        for (size_t k = 0; k < lines.size(); k++) r += (k ? "\n" + ind : "") + lines[k];
      } else {
        r = lines.empty() ? "" : lines[0];
        for (size_t k = 1; k < lines.size(); k++) r += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
      }
      if (first) r = ind + r;
      check_size(r.size(), cn);
      return Value::str(r, v.safe);
    }
    if (name == "center") {
      CallArgs ca;
      ca.pos.push_back(arg_or(a, 0, "width", Value::integer(80)));
      return call_method(Value::str(py_str(v)), "center", ca);
    }
    if (name == "wordcount") {
      return Value::integer(int64_t(py_split(py_str(v), Value::none(), -1).size()));
    }
    if (name == "format") {
      if (!a.kw.empty())
        fail(construct, a.pos.empty() ? "keyword arguments to |format are not supported"
                                      : "can't handle positional and keyword arguments at the same time");
      return Value::str(printf_format(py_str(v), Value::list(a.pos, true)), v.safe);
    }
    if (name == "sum") {
      Value attribute = arg_or(a, 0, "attribute", Value::none());
      Value acc = arg_or(a, 1, "start", Value::integer(0));
      for (auto& it : iterate(v, cn)) acc = arith("+", acc, attr_or_self(it, attribute));
      return acc;
    }
    if (name == "attr") {
      const Value* n = arg(a, 0, "name");
      if (!n || !n->is_str()) fail(construct, "attribute name must be a string");
      return get_attr(v, n->sv());
    }
    if (name == "groupby") {  // sorted by the attribute, runs of equal keys: (grouper, list) tuples
      Value attribute = arg_or(a, 0, "attribute", Value::none());
      if (attribute.is_none()) fail(construct, "groupby needs an attribute");
      const Value dflt = arg_or(a, 1, "default", Value::none());
      const Value* dp = dflt.is_none() ? nullptr : &dflt;
      bool cs = truthy(arg_or(a, 2, "case_sensitive", Value::boolean(false)));
      auto items = iterate(v, cn);
      std::vector<Value> keys;
      for (auto& it : items) keys.push_back(sort_key(attr_path(it, attribute, dp), cs));
      std::vector<size_t> idx(items.size());
      for (size_t k = 0; k < idx.size(); k++) idx[k] = k;
      std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return less(keys[x], keys[y], "<"); });
      std::vector<Value> out;
      for (size_t i = 0; i < idx.size();) {
        size_t j = i;
        std::vector<Value> members;
        while (j < idx.size() && py_eq(keys[idx[j]], keys[idx[i]])) members.push_back(items[idx[j++]]);
        // The grouper as the first member has it (not lowercased), as jinja2 returns it.
        Value g = Value::list({attr_path(members[0], attribute, dp), Value::list(members)}, true);
        g.group = true;
        out.push_back(std::move(g));
        i = j;
      }
      return Value::list(std::move(out));
    }
    if (name == "slice") {  // jinja2's do_slice: n columns, the first len % n one longer
      const int64_t n = as_int(arg_or(a, 0, "slices", Value::integer(1)), cn);
      if (n <= 0) fail(construct, "slices must be positive");
      Value fill = arg_or(a, 1, "fill_with", Value::none());
      auto seq = iterate(v, cn);
      const int64_t len = int64_t(seq.size()), per = len / n, extra = len % n;
      std::vector<Value> out;
      int64_t off = 0;
      for (int64_t s = 0; s < n; ++s) {
        const int64_t b = off + s * per;
        if (s < extra) ++off;
        const int64_t e = off + (s + 1) * per;
        std::vector<Value> part(seq.begin() + b, seq.begin() + e);
        if (!fill.is_none() && s >= extra) part.push_back(fill);
        out.push_back(Value::list(std::move(part)));
      }
      return gen(std::move(out));
    }
    if (name == "truncate") {  // jinja2's do_truncate (leeway: the default policy, 5)
      const std::string str = py_str(v);
      auto cps = utf8_decode(str);
      const int64_t length = as_int(arg_or(a, 0, "length", Value::integer(255)), cn);
      const bool killwords = truthy(arg_or(a, 1, "killwords", Value::boolean(false)));
      const std::string end = py_str(arg_or(a, 2, "end", Value::str("...")));
      Value lw = arg_or(a, 3, "leeway", Value::none());
      const int64_t leeway = lw.is_none() ? 5 : as_int(lw, cn);
      const int64_t end_len = int64_t(utf8_decode(end).size());
      if (length < end_len) fail(construct, "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
      if (leeway < 0) fail(construct, "expected leeway >= 0, got " + std::to_string(leeway));
      if (int64_t(cps.size()) <= length + leeway) return Value::str(str);
      std::string head = utf8_encode(cps, 0, size_t(length - end_len));
      if (!killwords) {
        const size_t sp = head.rfind(' ');
        if (sp != std::string::npos) head.resize(sp);
      }
      return Value::str(head + end);
    }
    if (name == "filesizeformat") {  // jinja2's do_filesizeformat
      const bool binary = truthy(arg_or(a, 0, "binary", Value::boolean(false)));
      double bytes = 0;
      if (v.is_number()) {
        bytes = as_num(v);
      } else {
        const std::string t = py_str(v);
        char* e = nullptr;
        bytes = std::strtod(t.c_str(), &e);
        if (t.empty() || e == t.c_str() || *e != '\0') fail(construct, "could not convert string to float: '" + t + "'");
      }
      const double base = binary ? 1024 : 1000;
      static const char* dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
      static const char* bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
      if (bytes == 1) return Value::str("1 Byte");
      if (bytes < base) return Value::str(std::to_string(int64_t(bytes)) + " Bytes");
      double unit = base;
      int i = 0;
      for (; i < 8; ++i) {
        unit *= base;
        if (bytes < unit || i == 7) break;
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, binary ? bin[i] : dec[i]);
      return Value::str(buf);
    }
    if (name == "urlencode") {  // jinja2's do_urlencode: quote(str, safe="/"); pairs as a query string
      auto quote = [](const std::string& s, bool qs) {
        std::string o;
        for (unsigned char c : s) {
          if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!qs && c == '/')) {
            o += char(c);
          } else if (qs && c == ' ') {
            o += '+';
          } else {
            char h[4];
            std::snprintf(h, sizeof h, "%%%02X", c);
            o += h;
          }
        }
        return o;
      };
      if (v.is_str() || !(v.is_list() || v.is_dict())) return Value::str(quote(py_str(v), false));
      std::string out;
      auto pairs = v.is_dict() ? std::vector<Value>{} : iterate(v, cn);
      if (v.is_dict())
        for (const auto& [k, x] : v.d->items) pairs.push_back(Value::list({key_value(k), x}, true));
      for (const Value& p : pairs) {
        if (!p.is_list() || p.l->size() != 2) fail(construct, "expected (key, value) pairs");
        if (!out.empty()) out += '&';
        out += quote(py_str((*p.l)[0]), true) + "=" + quote(py_str((*p.l)[1]), true);
      }
      return Value::str(out);
    }
    if (name == "xmlattr") {  // jinja2 3.1.6's do_xmlattr (no autoescape: a plain string)
      if (!v.is_dict()) fail(construct, std::string("expected a mapping, got ") + type_name(v));
      const bool autospace = truthy(arg_or(a, 0, "autospace", Value::boolean(true)));
      std::string out;
      for (const auto& [k, x] : v.d->items) {
        if (x.is_none() || x.is_undefined()) continue;
        const std::string key = py_str(key_value(k));
        for (char c : key)
          if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '/' || c == '>' || c == '=')
            fail(construct, "Invalid character in attribute name: " + py_repr(Value::str(key)));
        if (!out.empty()) out += ' ';
        out += html_escape(key) + "=\"" + html_escape(py_str(x)) + "\"";
      }
      if (autospace && !out.empty()) out = " " + out;
      return Value::str(out);
    }
    if (name == "batch") {
      int64_t n = as_int(arg_or(a, 0, "linecount", Value::integer(1)), cn);
      if (n <= 0) fail(construct, "linecount must be positive");
      Value fill = arg_or(a, 1, "fill_with", Value::none());
      std::vector<Value> out, cur;
      for (auto& it : iterate(v, cn)) {
        cur.push_back(it);
        if (int64_t(cur.size()) == n) {
          out.push_back(Value::list(cur));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (!fill.is_none())
          while (int64_t(cur.size()) < n) cur.push_back(fill);
        out.push_back(Value::list(cur));
      }
      return gen(std::move(out));
    }
    fail(construct, "filter '" + name + "' is not supported by kiln's jinja engine");
  }

  // ---- calls ----
  Value call_value(const Value& callee, CallArgs& a, const std::string& what) {
    if (callee.kind == Kind::Callable || callee.fn) return callee.fn->fn(*this, a);  // (a recursive loop's `loop`)
    if (callee.is_undefined()) undefined_error(callee, "call " + what);
    fail("call " + what, std::string("'") + type_name(callee) + "' object is not callable");
  }

  // A {% macro %}, or a {% call %} block's body as its caller() (a CallBlock has no name).
  Value make_macro(Node* m, ScopeP def_scope) {
    Value v;
    v.kind = Kind::Callable;
    auto c = std::make_shared<Callable>();
    c->name = m->name.empty() ? "caller" : m->name;
    c->fn = [m, def_scope](Interp& in, CallArgs& a) { return in.invoke_macro(m, def_scope, a); };
    v.fn = c;
    return v;
  }

  // Calls macro `sig` (params/defaults in sig, body sig->blocks[0]).
  Value invoke_macro(Node* sig, const ScopeP& def_scope, CallArgs& a) {
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
  void eval_args(Node* n, size_t first, Scope& sc, CallArgs& a) {
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

  Value eval(Node* n, Scope& sc) {
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

  void emit(std::string& out, std::string_view s) {
    out.append(s);
    check_size(out.size(), "output");
  }

  // One filter node (its arguments are f->ch[1..]) applied to v.
  Value apply_filter_node(Node* f, const Value& v, Scope& sc) {
    CallArgs a;
    eval_args(f, 1, sc, a);
    cur_line = f->line;
    if (f->soft) fail("filter " + f->name, "no filter named '" + f->name + "'");
    return apply_filter(f->name, v, a);
  }

  Value apply_filter_chain(const std::vector<Node*>& chain, Value v, Scope& sc) {
    for (Node* f : chain) v = apply_filter_node(f, v, sc);
    return v;
  }

  void assign(Node* n, const Value& v, Scope& sc) {
    if (!n->attr.empty()) {
      const Value* ns = sc.find(n->names[0]);
      if (!ns) ns = globals.d->find(n->names[0]);
      if (!ns || ns->kind != Kind::Namespace) fail("set", "Can only set attributes on namespace objects.");
      check_no_cycle(*ns, v, menv, "set");
      ns->d->set(n->attr, v);
      return;
    }
    bind_names(n, v, sc, "set");
  }

  // Binds n's target names ({% set a, b = … %}, {% for k, v in … %}) to v, unpacking it when
  // the target is a tuple.
  void bind_names(Node* n, const Value& v, Scope& sc, const char* construct) {
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
  Value filtered_body(Node* n, const ScopeP& sc) {
    auto inner = std::make_shared<Scope>();
    inner->parent = sc;
    std::string buf;
    exec_block(n->blocks[0], inner, buf);
    return apply_filter_chain(n->ch, Value::str(std::move(buf)), *sc);
  }

  Flow exec_block(const std::vector<Node*>& body, const ScopeP& sc, std::string& out) {
    for (Node* n : body) {
      Flow f = exec(n, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(Node* n, const ScopeP& sc, std::string& out) {
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
      case NK::For: return exec_for(n, sc, out);
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
      case NK::Break: return Flow::Break;
      case NK::Continue: return Flow::Continue;
      default: fail("statement", "not a statement");
    }
  }

  Flow exec_for(Node* n, const ScopeP& sc, std::string& out) {
    Value seq = eval(n->ch[0], *sc);
    cur_line = n->line;
    return run_for(n, sc, seq, 1, out);
  }

  // The loop of For node n over seq at loop depth `depth` (a recursive loop's loop(x) runs it again
  // over x, one deeper, and returns what that rendered as Markup, as jinja2 does).
  Flow run_for(Node* n, const ScopeP& sc, const Value& seq, int64_t depth, std::string& out) {
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
      Value cyc;
      cyc.kind = Kind::Callable;
      auto c = std::make_shared<Callable>();
      c->name = "cycle";
      c->fn = [k](Interp&, CallArgs& a) -> Value {
        if (a.pos.empty()) fail("loop.cycle", "no items for cycling given");
        return a.pos[k % a.pos.size()];
      };
      cyc.fn = c;
      L.set("cycle", cyc);
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

  // ---- globals ----
  void add_global(const std::string& name, std::function<Value(Interp&, CallArgs&)> fn) {
    Value v;
    v.kind = Kind::Callable;
    auto c = std::make_shared<Callable>();
    c->name = name;
    c->fn = std::move(fn);
    v.fn = c;
    globals.d->set(name, v);
  }

  void install_globals() {
    globals = Value::dict();
    add_global("raise_exception", [](Interp&, CallArgs& a) -> Value {
      fail("raise_exception", a.pos.empty() ? std::string() : py_str(a.pos[0]));
    });
    add_global("strftime_now", [](Interp& in, CallArgs& a) -> Value {
      if (a.pos.empty() || !a.pos[0].is_str()) fail("strftime_now", "strftime_now(format) needs a string");
      if (in.opt.strftime_now) return Value::str(in.opt.strftime_now(a.pos[0].sv()));
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof buf, a.pos[0].sv().c_str(), &tm);
      return Value::str(std::string(buf, n));
    });
    add_global("range", [](Interp& in, CallArgs& a) -> Value {
      if (a.pos.empty() || a.pos.size() > 3) fail("range", "range expected 1 to 3 arguments");
      int64_t start = 0, stop, stp = 1;
      if (a.pos.size() == 1) stop = as_int(a.pos[0], "range");
      else {
        start = as_int(a.pos[0], "range");
        stop = as_int(a.pos[1], "range");
        if (a.pos.size() == 3) stp = as_int(a.pos[2], "range");
      }
      if (stp == 0) fail("range", "range() arg 3 must not be zero");
      long double cnt = stp > 0 ? (stop > start ? ((long double)stop - start + stp - 1) / stp : 0)
                                : (start > stop ? ((long double)start - stop - stp - 1) / -stp : 0);
      if (cnt > 100000) fail("range", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      std::vector<Value> out;
      for (int64_t k = start; stp > 0 ? k < stop : k > stop; k += stp) {
        in.step();
        out.push_back(Value::integer(k));
      }
      return Value::list(std::move(out));
    });
    add_global("namespace", [](Interp&, CallArgs& a) -> Value {
      Value ns = Value::ns();
      for (auto& p : a.pos) {
        if (!p.is_dict()) fail("namespace", "namespace() positional argument must be a mapping");
        for (auto& kv : p.d->items) ns.d->set(kv.first, kv.second);
      }
      for (auto& kv : a.kw) ns.d->set(kv.first, kv.second);
      return ns;
    });
    add_global("dict", [](Interp&, CallArgs& a) -> Value {
      Value d = Value::dict();
      for (auto& p : a.pos) {
        if (!p.is_dict()) fail("dict", "dict() positional argument must be a mapping");
        for (auto& kv : p.d->items) d.d->set(kv.first, kv.second);
      }
      for (auto& kv : a.kw) d.d->set(kv.first, kv.second);
      return d;
    });
  }
};

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
