// chat/jinja/filters.cpp — the registry's filter table (every filter name kiln knows) and
//       the filters on sequences, mappings and numbers (sort, map, select, groupby, int, …);
//       the text filters are in text_filters.cpp.
// Must not: evaluate template nodes (interp.cpp evaluates the input and the arguments).
// Threading: runs inside one render call (Interp); |random draws from a per-thread generator.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <random>

#include "chat/jinja/filters.h"
#include "chat/jinja/py_string.h"

namespace kiln::chat::jinja {

namespace {

std::string construct_of(const std::string& name) { return "filter " + name; }

// attribute="a.b.0": item lookups along the dotted path (digits index lists); `dflt` replaces
// an undefined step.
Value attr_path(Interp& in, const Value& item, const Value& attribute, const Value* dflt) {
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
    cur = in.get_item(cur, p);
    if (dflt && cur.is_undefined()) cur = *dflt;
  }
  return cur;
}

// The `attribute=` argument of sort/unique/min/max/join/sum: the item itself when none.
Value attr_or_self(Interp& in, const Value& item, const Value& attribute) {
  return attribute.is_none() ? item : attr_path(in, item, attribute, nullptr);
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_str()) return Value::str(ascii_lower(v.sv()));
  return v;
}

Value f_default(Interp&, const std::string&, const Value& v, CallArgs& a) {  // default, d
  Value dflt = arg_or(a, 0, "default_value", Value::str(""));
  bool boolean = truthy(arg_or(a, 1, "boolean", Value::boolean(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
  return v;
}

Value f_length(Interp& in, const std::string& name, const Value& v, CallArgs&) {  // length, count
  return Value::integer(in.py_len(v, construct_of(name).c_str()));
}

Value f_join(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  std::string d = py_str(arg_or(a, 0, "d", Value::str("")));
  Value attribute = arg_or(a, 1, "attribute", Value::none());
  std::string r;
  bool first = true;
  for (auto& e : in.iterate(v, cn.c_str())) {
    if (!first) r += d;
    first = false;
    r += py_str(attr_or_self(in, e, attribute));
    in.check_size(r.size(), cn.c_str());
  }
  return Value::str(r);
}

Value f_list(Interp& in, const std::string& name, const Value& v, CallArgs&) {
  return Value::list(in.iterate(v, construct_of(name).c_str()));  // a new list, as Python's list(v)
}

Value f_first(Interp& in, const std::string& name, const Value& v, CallArgs&) {
  auto items = in.iterate(v, construct_of(name).c_str());
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interp& in, const std::string& name, const Value& v, CallArgs&) {
  if (v.is_list() && v.gen) fail(construct_of(name), "'generator' object is not reversible");
  auto items = in.iterate(v, construct_of(name).c_str());
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// random.choice(seq): a pseudo-random element (a different one from render to render).
Value f_random(Interp&, const std::string& name, const Value& v, CallArgs&) {
  std::vector<Value> items;
  if (v.is_str()) {
    auto cps = utf8_decode(v.sv());
    for (size_t k = 0; k < cps.size(); k++) items.push_back(Value::str(utf8_encode(cps, k, k + 1)));
  } else if (v.is_list() && !v.gen) {
    items = *v.l;
  } else if (!v.is_undefined()) {
    fail(construct_of(name), std::string("'") + type_name(v) + "' object is not a sequence");
  }
  if (items.empty()) return Value::undefined("No random item, sequence was empty.");
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return items[std::uniform_int_distribution<size_t>(0, items.size() - 1)(gen)];
}

Value f_items(Interp&, const std::string& name, const Value& v, CallArgs&) {
  if (v.is_undefined()) return make_gen({});
  if (!v.is_dict()) fail(construct_of(name), "Can only get item pairs from a mapping.");
  return make_gen(dict_pairs(v));
}

Value f_dictsort(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  if (!v.is_dict()) {
    if (v.is_undefined()) undefined_error(v, cn);
    fail(cn, std::string("'") + type_name(v) + "' object has no attribute 'items'");
  }
  bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
  Value by = arg_or(a, 1, "by", Value::str("key"));
  bool rev = truthy(arg_or(a, 2, "reverse", Value::boolean(false)));
  size_t pos = by.is_str() && by.sv() == "value" ? 1 : 0;
  if (by.is_str() && by.sv() != "key" && by.sv() != "value") fail(cn, "You can only sort by either \"key\" or \"value\"");
  std::vector<Value> out = dict_pairs(v);
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key((*x.l)[pos], cs), ky = sort_key((*y.l)[pos], cs);
    return rev ? in.less(ky, kx, "<") : in.less(kx, ky, "<");
  });
  return Value::list(out);
}

Value f_sort(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  bool rev = truthy(arg_or(a, 0, "reverse", Value::boolean(false)));
  bool cs = truthy(arg_or(a, 1, "case_sensitive", Value::boolean(false)));
  Value attribute = arg_or(a, 2, "attribute", Value::none());
  auto items = in.iterate(v, construct_of(name).c_str());
  std::vector<Value> keys;
  for (auto& it : items) keys.push_back(sort_key(attr_or_self(in, it, attribute), cs));
  std::vector<size_t> idx(items.size());
  for (size_t k = 0; k < idx.size(); k++) idx[k] = k;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    return rev ? in.less(keys[y], keys[x], "<") : in.less(keys[x], keys[y], "<");
  });
  std::vector<Value> out;
  for (size_t k : idx) out.push_back(items[k]);
  return Value::list(out);
}

Value f_unique(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
  Value attribute = arg_or(a, 1, "attribute", Value::none());
  std::vector<Value> out, seen;
  for (auto& it : in.iterate(v, construct_of(name).c_str())) {
    Value k = sort_key(attr_or_self(in, it, attribute), cs);
    bool dup = false;
    for (auto& s : seen)
      if (py_eq(s, k)) dup = true;
    if (!dup) {
      seen.push_back(k);
      out.push_back(it);
    }
  }
  return make_gen(std::move(out));
}

Value f_min_max(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
  Value attribute = arg_or(a, 1, "attribute", Value::none());
  auto items = in.iterate(v, construct_of(name).c_str());
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value bk = sort_key(attr_or_self(in, items[0], attribute), cs);
  for (size_t k = 1; k < items.size(); k++) {
    Value kk = sort_key(attr_or_self(in, items[k], attribute), cs);
    if (name == "min" ? in.less(kk, bk, "<") : in.less(bk, kk, "<")) {
      best = k;
      bk = kk;
    }
  }
  return items[best];
}

Value f_reverse(Interp& in, const std::string& name, const Value& v, CallArgs&) {
  if (v.is_str()) {
    auto cps = utf8_decode(v.sv());
    std::reverse(cps.begin(), cps.end());
    return Value::str(utf8_encode(cps, 0, cps.size()));
  }
  auto items = in.iterate(v, construct_of(name).c_str());
  std::reverse(items.begin(), items.end());
  return make_gen(std::move(items));
}

Value f_map(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  auto items = truthy(v) ? in.iterate(v, cn.c_str()) : std::vector<Value>{};
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* dflt = nullptr;
  for (auto& kv : a.kw) {
    if (kv.first == "attribute") attribute = &kv.second;
    if (kv.first == "default") dflt = &kv.second;
  }
  if (attribute) {
    for (auto& it : items) out.push_back(attr_path(in, it, *attribute, dflt));
    return make_gen(std::move(out));
  }
  if (a.pos.empty()) return make_gen(std::move(items));
  if (!a.pos[0].is_str()) fail(cn, "filter name must be a string");
  const std::string f = a.pos[0].sv();
  const FilterDef* def = find_filter(f);
  if (!def) fail(cn, "no filter named '" + f + "'");
  CallArgs fa;
  fa.pos.assign(a.pos.begin() + 1, a.pos.end());
  fa.kw = a.kw;
  for (auto& it : items) {
    in.step();
    CallArgs copy = fa;
    out.push_back(def->fn(in, f, it, copy));
  }
  return make_gen(std::move(out));
}

// select / reject (test on the item) and selectattr / rejectattr (test on an attribute).
Value f_select(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const bool select = name.rfind("select", 0) == 0, attr_mode = name.size() > 6 && name.ends_with("attr");
  std::vector<Value> items = truthy(v) ? in.iterate(v, construct_of(name).c_str()) : std::vector<Value>{};
  size_t off = 0;
  Value attribute;
  if (attr_mode) {
    if (a.pos.empty()) fail(construct_of(name), "missing attribute argument");
    attribute = a.pos[0];
    off = 1;
  }
  const TestDef* test = nullptr;
  std::string test_name;
  CallArgs targs;
  if (a.pos.size() > off) {
    if (!a.pos[off].is_str()) fail(construct_of(name), "test name must be a string");
    test_name = a.pos[off].sv();
    test = find_test(test_name);
    if (!test) fail(construct_of(name), "no test named '" + test_name + "'");
    targs.pos.assign(a.pos.begin() + long(off) + 1, a.pos.end());
    targs.kw = a.kw;
  }
  std::vector<Value> out;
  for (auto& it : items) {
    in.step();
    Value probe = attr_mode ? attr_path(in, it, attribute, nullptr) : it;
    bool r = test ? test->fn(in, test_name, probe, targs) : truthy(probe);
    if (r == select) out.push_back(it);
  }
  return make_gen(std::move(out));
}

Value f_int(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  Value dflt = arg_or(a, 0, "default", Value::integer(0));
  if (v.kind == Kind::Int) return v;
  if (v.kind == Kind::Bool) return Value::integer(v.b);
  if (v.kind == Kind::Float) {
    if (std::isnan(v.f) || std::isinf(v.f)) return dflt;
    return Value::integer(int64_t(v.f));
  }
  if (v.is_undefined()) undefined_error(v, construct_of(name));
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

Value f_float(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  Value dflt = arg_or(a, 0, "default", Value::flt(0.0));
  if (v.kind == Kind::Float) return v;
  if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::flt(as_num(v));
  if (v.is_undefined()) undefined_error(v, construct_of(name));
  if (v.is_str()) {
    std::string s = py_strip(v.sv(), nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::flt(d);
  }
  return dflt;
}

Value f_abs(Interp&, const std::string& name, const Value& v, CallArgs&) {
  if (v.kind == Kind::Int) {
    if (v.i == INT64_MIN) fail(construct_of(name), "integer overflow");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.kind == Kind::Bool) return Value::integer(v.b);
  if (v.kind == Kind::Float) return Value::flt(std::fabs(v.f));
  if (v.is_undefined()) undefined_error(v, construct_of(name));
  fail(construct_of(name), std::string("bad operand type for abs(): '") + type_name(v) + "'");
}

Value f_round(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  int64_t prec = as_int(arg_or(a, 0, "precision", Value::integer(0)), cn.c_str());
  std::string method = py_str(arg_or(a, 1, "method", Value::str("common")));
  if (!v.is_number()) {
    if (v.is_undefined()) undefined_error(v, cn);
    fail(cn, "round needs a number");
  }
  double x = as_num(v), m = std::pow(10.0, double(prec));
  double r;
  if (method == "common") r = std::nearbyint(x * m) / m;  // banker's rounding like Python round()
  else if (method == "ceil") r = std::ceil(x * m) / m;
  else if (method == "floor") r = std::floor(x * m) / m;
  else fail(cn, "method must be common, ceil or floor");
  return Value::flt(r);
}

Value f_sum(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  Value attribute = arg_or(a, 0, "attribute", Value::none());
  Value acc = arg_or(a, 1, "start", Value::integer(0));
  for (auto& it : in.iterate(v, construct_of(name).c_str())) acc = in.arith("+", acc, attr_or_self(in, it, attribute));
  return acc;
}

Value f_attr(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const Value* n = arg(a, 0, "name");
  if (!n || !n->is_str()) fail(construct_of(name), "attribute name must be a string");
  return in.get_attr(v, n->sv());
}

// Sorted by the attribute, runs of equal keys: (grouper, list) tuples.
Value f_groupby(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  Value attribute = arg_or(a, 0, "attribute", Value::none());
  if (attribute.is_none()) fail(construct_of(name), "groupby needs an attribute");
  const Value dflt = arg_or(a, 1, "default", Value::none());
  const Value* dp = dflt.is_none() ? nullptr : &dflt;
  bool cs = truthy(arg_or(a, 2, "case_sensitive", Value::boolean(false)));
  auto items = in.iterate(v, construct_of(name).c_str());
  std::vector<Value> keys;
  for (auto& it : items) keys.push_back(sort_key(attr_path(in, it, attribute, dp), cs));
  std::vector<size_t> idx(items.size());
  for (size_t k = 0; k < idx.size(); k++) idx[k] = k;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return in.less(keys[x], keys[y], "<"); });
  std::vector<Value> out;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    std::vector<Value> members;
    while (j < idx.size() && py_eq(keys[idx[j]], keys[idx[i]])) members.push_back(items[idx[j++]]);
    // The grouper as the first member has it (not lowercased), as jinja2 returns it.
    Value g = Value::list({attr_path(in, members[0], attribute, dp), Value::list(members)}, true);
    g.group = true;
    out.push_back(std::move(g));
    i = j;
  }
  return Value::list(std::move(out));
}

// jinja2's do_slice: n columns, the first len % n one longer.
Value f_slice(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  const int64_t n = as_int(arg_or(a, 0, "slices", Value::integer(1)), cn.c_str());
  if (n <= 0) fail(cn, "slices must be positive");
  Value fill = arg_or(a, 1, "fill_with", Value::none());
  auto seq = in.iterate(v, cn.c_str());
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
  return make_gen(std::move(out));
}

Value f_batch(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  int64_t n = as_int(arg_or(a, 0, "linecount", Value::integer(1)), cn.c_str());
  if (n <= 0) fail(cn, "linecount must be positive");
  Value fill = arg_or(a, 1, "fill_with", Value::none());
  std::vector<Value> out, cur;
  for (auto& it : in.iterate(v, cn.c_str())) {
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
  return make_gen(std::move(out));
}

namespace tf = text_filters;

// Every filter jinja2 3.1 has (tojson with HF's signature).
constexpr FilterDef kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},           {"batch", f_batch},
    {"capitalize", tf::change_case}, {"center", tf::center}, {"count", f_length},
    {"d", f_default},         {"default", f_default},     {"dictsort", f_dictsort},
    {"e", tf::escape},        {"escape", tf::escape},     {"filesizeformat", tf::filesizeformat},
    {"first", f_first},       {"float", f_float},         {"forceescape", tf::escape},
    {"format", tf::format},   {"groupby", f_groupby},     {"indent", tf::indent},
    {"int", f_int},           {"items", f_items},         {"join", f_join},
    {"last", f_last},         {"length", f_length},       {"list", f_list},
    {"lower", tf::change_case}, {"map", f_map},           {"max", f_min_max},
    {"min", f_min_max},       {"pprint", tf::pprint},     {"random", f_random},
    {"reject", f_select},     {"rejectattr", f_select},   {"replace", tf::replace},
    {"reverse", f_reverse},   {"round", f_round},         {"safe", tf::string},
    {"select", f_select},     {"selectattr", f_select},   {"slice", f_slice},
    {"sort", f_sort},         {"string", tf::string},     {"striptags", tf::striptags},
    {"sum", f_sum},           {"title", tf::change_case}, {"tojson", tf::tojson},
    {"trim", tf::trim},       {"truncate", tf::truncate}, {"unique", f_unique},
    {"upper", tf::change_case}, {"urlencode", tf::urlencode}, {"urlize", tf::urlize},
    {"wordcount", tf::wordcount}, {"wordwrap", tf::wordwrap}, {"xmlattr", tf::xmlattr},
};

}  // namespace

std::span<const FilterDef> filter_table() { return kFilters; }

Value Interp::apply_filter(const std::string& name, const Value& v, CallArgs& a) {
  const FilterDef* f = find_filter(name);
  if (!f) fail(construct_of(name), "no filter named '" + name + "'");
  return f->fn(*this, name, v, a);
}

}  // namespace kiln::chat::jinja
