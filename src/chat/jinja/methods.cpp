// chat/jinja/methods.cpp — the str, list, tuple and dict methods templates may call
//       (`s.strip()`, `d.items()`, `l.append(x)`, …): their registry tables and the
//       non-mutating implementations (mutate.cpp implements the mutators).
// Must not: decide whether a mutator may run (objects.cpp binds methods and applies
//       Options::immutable_sandbox) or evaluate template nodes.
// Threading: runs inside one render call (Interp).
#include <algorithm>

#include "chat/jinja/interp.h"
#include "chat/jinja/py_string.h"

namespace kiln::chat::jinja {

namespace {

std::string construct_of(const std::string& name) { return "method " + name; }

const Value& required(CallArgs& a, size_t idx, const char* arg_name, const std::string& name) {
  const Value* v = arg(a, idx, arg_name);
  if (!v) fail(construct_of(name), "missing argument");
  return *v;
}

// ---- str ----

Value str_strip(Interp&, const std::string& name, const Value& self, CallArgs& a) {
  const Value* v = arg(a, 0, "chars");
  if (v && !v->is_none() && !v->is_str())
    fail(construct_of(name), std::string("argument must be str or None, not ") + type_name(*v));
  const std::string* chars = v && v->is_str() ? &v->sv() : nullptr;
  return Value::str(py_strip(self.sv(), chars, name != "rstrip", name != "lstrip"));
}

Value str_split(Interp&, const std::string& name, const Value& self, CallArgs& a) {
  const std::string& s = self.sv();
  Value sep = arg_or(a, 0, "sep", Value::none());
  int64_t maxsplit = as_int(arg_or(a, 1, "maxsplit", Value::integer(-1)), "split");
  if (name == "rsplit" && maxsplit >= 0) {
    // rsplit with a limit: split fully, then re-join the head.
    auto parts = py_split(s, sep, -1);
    if (int64_t(parts.size()) - 1 <= maxsplit) return Value::list(parts);
    if (sep.is_none()) fail(construct_of(name), "rsplit(None, maxsplit) is not supported");
    size_t keep = parts.size() - size_t(maxsplit);
    std::string head;
    for (size_t k = 0; k < keep; k++) head += (k ? sep.sv() : "") + parts[k].sv();
    std::vector<Value> out{Value::str(head)};
    for (size_t k = keep; k < parts.size(); k++) out.push_back(parts[k]);
    return Value::list(out);
  }
  return Value::list(py_split(s, sep, maxsplit));
}

Value str_splitlines(Interp&, const std::string&, const Value& self, CallArgs&) {
  std::vector<Value> out;
  for (auto& l : split_lines(self.sv())) out.push_back(Value::str(l));
  return Value::list(out);
}

Value str_affix(Interp&, const std::string& name, const Value& self, CallArgs& a) {  // startswith / endswith
  const std::string& s = self.sv();
  const Value& p = required(a, 0, "prefix", name);
  std::vector<Value> cands = p.is_list() && p.tuple ? *p.l : std::vector<Value>{p};
  for (const auto& c : cands) {
    if (!c.is_str()) fail(construct_of(name), "argument must be str or a tuple of str");
    const std::string& x = c.sv();
    if (name == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                             : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value::boolean(true);
  }
  return Value::boolean(false);
}

Value str_replace(Interp& in, const std::string& name, const Value& self, CallArgs& a) {
  const Value* o = arg(a, 0, "old");
  const Value* n = arg(a, 1, "new");
  if (!o || !n || !o->is_str() || !n->is_str()) fail(construct_of(name), "replace() arguments must be str");
  std::string r = py_replace(self.sv(), o->sv(), n->sv(), as_int(arg_or(a, 2, "count", Value::integer(-1)), "replace"));
  in.check_size(r.size(), "replace");
  return Value::str(std::move(r));
}

Value str_case(Interp&, const std::string& name, const Value& self, CallArgs&) {
  const std::string& s = self.sv();
  if (name == "upper") return Value::str(ascii_upper(s));
  if (name == "title") return Value::str(py_title(s));
  if (name == "capitalize") return Value::str(py_capitalize(s));
  if (name == "swapcase") {
    std::string r = s;
    for (char& c : r) c = std::isupper(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : char(std::toupper(c));
    return Value::str(r);
  }
  return Value::str(ascii_lower(s));  // lower, casefold
}

Value str_find(Interp&, const std::string& name, const Value& self, CallArgs& a) {  // find rfind index rindex count
  const std::string& s = self.sv();
  const Value& sub = required(a, 0, "sub", name);
  if (!sub.is_str()) fail(construct_of(name), "must be str");
  const std::string& x = sub.sv();
  if (name == "count") {
    if (x.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) n++;
    return Value::integer(n);
  }
  size_t p = (name == "find" || name == "index") ? s.find(x) : s.rfind(x);
  if (p == std::string::npos) {
    if (name == "index" || name == "rindex") fail(construct_of(name), "substring not found");
    return Value::integer(-1);
  }
  return Value::integer(int64_t(utf8_length(std::string_view(s).substr(0, p))));
}

Value str_join(Interp& in, const std::string& name, const Value& self, CallArgs& a) {
  std::string r;
  bool first = true;
  for (const auto& e : in.iterate(required(a, 0, "iterable", name), "join")) {
    if (!e.is_str()) fail(construct_of(name), std::string("sequence item: expected str instance, ") + type_name(e) + " found");
    if (!first) r += self.sv();
    first = false;
    r += e.sv();
    in.check_size(r.size(), "join");
  }
  return Value::str(r);
}

Value str_format(Interp& in, const std::string&, const Value& self, CallArgs& a) {
  return Value::str(in.str_format(self.sv(), a), self.safe);
}

Value str_is(Interp&, const std::string& name, const Value& self, CallArgs&) {  // isdigit isalpha … islower
  const std::string& s = self.sv();
  auto all = [&](int (*pred)(int)) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [pred](char c) { return pred(static_cast<unsigned char>(c)) != 0; });
  };
  if (name == "isalpha") return Value::boolean(all(::isalpha));
  if (name == "isalnum") return Value::boolean(all(::isalnum));
  if (name == "islower" || name == "isupper") return Value::boolean(py_is_case(s, name == "isupper"));
  if (name == "isspace") {
    auto cps = utf8_decode(s);
    return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), py_isspace));
  }
  return Value::boolean(all(::isdigit));  // isdigit, isdecimal, isnumeric
}

Value str_remove_affix(Interp&, const std::string& name, const Value& self, CallArgs& a) {  // removeprefix / removesuffix
  const std::string& s = self.sv();
  const Value& x = required(a, 0, "prefix", name);
  if (!x.is_str()) fail(construct_of(name), "must be str");
  const std::string& p = x.sv();
  if (name == "removeprefix" && s.compare(0, p.size(), p) == 0 && s.size() >= p.size()) return Value::str(s.substr(p.size()));
  if (name == "removesuffix" && !p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
    return Value::str(s.substr(0, s.size() - p.size()));
  return Value::str(s);
}

Value str_partition(Interp&, const std::string& name, const Value& self, CallArgs& a) {  // partition / rpartition
  const std::string& s = self.sv();
  const Value* x = arg(a, 0, "sep");
  if (!x || !x->is_str() || x->sv().empty()) fail(construct_of(name), "bad separator");
  size_t p = name == "partition" ? s.find(x->sv()) : s.rfind(x->sv());
  if (p == std::string::npos)
    return name == "partition" ? Value::list({Value::str(s), Value::str(""), Value::str("")}, true)
                               : Value::list({Value::str(""), Value::str(""), Value::str(s)}, true);
  return Value::list({Value::str(s.substr(0, p)), *x, Value::str(s.substr(p + x->sv().size()))}, true);
}

Value str_justify(Interp&, const std::string& name, const Value& self, CallArgs& a) {  // center ljust rjust zfill
  int64_t w = as_int(arg_or(a, 0, "width", Value::integer(0)), construct_of(name).c_str());
  std::string fill = name == "zfill" ? "0" : " ";
  if (const Value* f = arg(a, 1, "fillchar"); f && f->is_str()) fill = f->sv();
  return Value::str(py_justify(self.sv(), w, fill, name == "center" ? 'c' : name == "ljust" ? 'l' : 'r'));
}

// ---- list and tuple ----

Value seq_copy(Interp&, const std::string&, const Value& self, CallArgs&) { return Value::list(*self.l, self.tuple); }

Value seq_count(Interp&, const std::string&, const Value& self, CallArgs& a) {
  const Value* x = arg(a, 0, "value");
  int64_t n = 0;
  if (x)
    for (auto& e : *self.l) n += py_eq(e, *x);
  return Value::integer(n);
}

Value seq_index(Interp&, const std::string& name, const Value& self, CallArgs& a) {
  if (const Value* x = arg(a, 0, "value"))
    for (size_t k = 0; k < self.l->size(); k++)
      if (py_eq((*self.l)[k], *x)) return Value::integer(int64_t(k));
  fail(construct_of(name), "value is not in list");
}

// append, extend, pop, … (list) and update, pop, … (dict): mutate.cpp.
Value mutator(Interp& in, const std::string& name, const Value& self, CallArgs& a) {
  return call_mutator(self, name, a, in.menv);
}

// ---- dict ----

Value dict_fromkeys(Interp& in, const std::string& name, const Value&, CallArgs& a) {  // a classmethod: self untouched
  const Value* it = arg(a, 0, "iterable");
  if (!it) fail(construct_of(name), "fromkeys expected at least 1 argument, got 0");
  Value d = Value::dict(), v = arg_or(a, 1, "value", Value::none());
  for (const auto& k : in.iterate(*it, "fromkeys")) {
    in.step(1 + d.d->items.size() / 16);
    d.d->set(dict_key(k), v);
  }
  return d;
}

Value dict_get(Interp&, const std::string& name, const Value& self, CallArgs& a) {
  const Value* k = arg(a, 0, "key");
  if (!k) fail(construct_of(name), "get expected at least 1 argument, got 0");
  if (k->is_str() || k->is_number() || k->is_none())
    if (const Value* v = self.d->find(dict_key(*k))) return *v;
  return arg_or(a, 1, "default", Value::none());
}

Value dict_view(Interp&, const std::string& name, const Value& self, CallArgs&) {  // items / keys / values
  if (name == "items") return Value::list(dict_pairs(self));
  std::vector<Value> out;
  for (auto& kv : self.d->items) out.push_back(name == "keys" ? key_value(kv.first) : kv.second);
  return Value::list(out);
}

Value dict_copy(Interp&, const std::string&, const Value& self, CallArgs&) {
  Value d = Value::dict();
  d.d->items = self.d->items;
  return d;
}

constexpr MethodDef kStrMethods[] = {
    {"capitalize", str_case},     {"casefold", str_case},       {"center", str_justify},
    {"count", str_find},          {"endswith", str_affix},      {"find", str_find},
    {"format", str_format},       {"index", str_find},          {"isalnum", str_is},
    {"isalpha", str_is},          {"isdecimal", str_is},        {"isdigit", str_is},
    {"islower", str_is},          {"isnumeric", str_is},        {"isspace", str_is},
    {"isupper", str_is},          {"join", str_join},           {"ljust", str_justify},
    {"lower", str_case},          {"lstrip", str_strip},        {"partition", str_partition},
    {"removeprefix", str_remove_affix}, {"removesuffix", str_remove_affix}, {"replace", str_replace},
    {"rfind", str_find},          {"rindex", str_find},         {"rjust", str_justify},
    {"rpartition", str_partition}, {"rsplit", str_split},       {"rstrip", str_strip},
    {"split", str_split},         {"splitlines", str_splitlines}, {"startswith", str_affix},
    {"strip", str_strip},         {"swapcase", str_case},       {"title", str_case},
    {"upper", str_case},          {"zfill", str_justify},
};

constexpr MethodDef kListMethods[] = {
    {"append", mutator, true}, {"clear", mutator, true},   {"copy", seq_copy},        {"count", seq_count},
    {"extend", mutator, true}, {"index", seq_index},       {"insert", mutator, true}, {"pop", mutator, true},
    {"remove", mutator, true}, {"reverse", mutator, true}, {"sort", mutator, true},
};

constexpr MethodDef kTupleMethods[] = {{"count", seq_count}, {"index", seq_index}};

constexpr MethodDef kDictMethods[] = {
    {"clear", mutator, true},      {"copy", dict_copy}, {"fromkeys", dict_fromkeys}, {"get", dict_get},
    {"items", dict_view},          {"keys", dict_view}, {"pop", mutator, true},      {"popitem", mutator, true},
    {"setdefault", mutator, true}, {"update", mutator, true}, {"values", dict_view},
};

}  // namespace

std::span<const MethodDef> str_method_table() { return kStrMethods; }
std::span<const MethodDef> list_method_table() { return kListMethods; }
std::span<const MethodDef> tuple_method_table() { return kTupleMethods; }
std::span<const MethodDef> dict_method_table() { return kDictMethods; }

}  // namespace kiln::chat::jinja
