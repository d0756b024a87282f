// chat/jinja/mutate.cpp — Python's mutating list/dict methods on Jinja values (see mutate.h).
#include "chat/jinja/mutate.h"

#include <algorithm>
#include <unordered_set>

namespace kiln::chat::jinja {

namespace {

const void* identity(const Value& v) {
  if (v.kind == Kind::List) return v.l.get();
  if (v.kind == Kind::Dict || v.kind == Kind::Namespace) return v.d.get();
  return nullptr;
}

void positional_only(const CallArgs& a, const std::string& construct, const std::string& name, size_t lo, size_t hi) {
  if (!a.kw.empty()) fail(construct, name + "() takes no keyword arguments");
  if (a.pos.size() < lo || a.pos.size() > hi) {
    std::string want = lo == hi ? "exactly " + std::to_string(lo) : "at most " + std::to_string(hi);
    fail(construct, name + "() takes " + want + " argument" + (hi == 1 ? "" : "s") + " (" +
                        std::to_string(a.pos.size()) + " given)");
  }
}

int64_t index_arg(const Value& v, const std::string& construct) {
  if (v.kind == Kind::Int) return v.i;
  if (v.kind == Kind::Bool) return v.b;
  fail(construct, std::string("'") + type_name(v) + "' object cannot be interpreted as an integer");
}

Value list_mutator(const Value& self, const std::string& name, CallArgs& a, const MutateEnv& env,
                   const std::string& construct) {
  std::vector<Value>& l = *self.l;
  const size_t n = l.size();
  if (name == "append") {
    positional_only(a, construct, "list.append", 1, 1);
    env.steps(1);
    check_no_cycle(self, a.pos[0], env, construct);
    l.push_back(a.pos[0]);
    return Value::none();
  }
  if (name == "extend") {
    positional_only(a, construct, "list.extend", 1, 1);
    std::vector<Value> add = env.iterate(a.pos[0]);  // a copy: l.extend(l) doubles l, as in Python
    env.steps(1 + add.size());
    for (const auto& e : add) check_no_cycle(self, e, env, construct);
    l.insert(l.end(), add.begin(), add.end());
    return Value::none();
  }
  if (name == "insert") {
    positional_only(a, construct, "insert", 2, 2);
    int64_t i = index_arg(a.pos[0], construct), sn = int64_t(n);
    if (i < 0) i = std::max<int64_t>(0, i + sn);
    i = std::min(i, sn);
    env.steps(1 + n / 64);
    check_no_cycle(self, a.pos[1], env, construct);
    l.insert(l.begin() + i, a.pos[1]);
    return Value::none();
  }
  if (name == "pop") {
    positional_only(a, construct, "pop", 0, 1);
    if (n == 0) fail(construct, "pop from empty list");
    int64_t i = a.pos.empty() ? -1 : index_arg(a.pos[0], construct), sn = int64_t(n);
    if (i < 0) i += sn;
    if (i < 0 || i >= sn) fail(construct, "pop index out of range");
    env.steps(1 + n / 64);
    Value r = l[size_t(i)];
    l.erase(l.begin() + i);
    return r;
  }
  if (name == "remove") {
    positional_only(a, construct, "list.remove", 1, 1);
    env.steps(1 + n / 16);
    for (size_t k = 0; k < n; k++)
      if (py_eq(l[k], a.pos[0])) {
        l.erase(l.begin() + int64_t(k));
        return Value::none();
      }
    fail(construct, "list.remove(x): x not in list");
  }
  if (name == "reverse" || name == "clear") {
    positional_only(a, construct, "list." + name, 0, 0);
    env.steps(1 + n / 64);
    if (name == "reverse") std::reverse(l.begin(), l.end());
    else l.clear();
    return Value::none();
  }
  if (name == "sort") {
    if (!a.pos.empty()) fail(construct, "sort() takes no positional arguments");
    bool reverse = false;
    for (const auto& [k, v] : a.kw) {
      if (k == "reverse") reverse = truthy(v);
      else if (k == "key") {
        if (!v.is_none()) fail(construct, "list.sort(key=…) is not supported by kiln's jinja engine (use the sort filter)");
      } else {
        fail(construct, "'" + k + "' is an invalid keyword argument for sort()");
      }
    }
    env.steps(1 + n);
    // Sort a copy (a comparison may throw half-way) and keep equal items in order, like
    // Python's stable sort; reverse=True compares reversed, which also keeps equal items in order.
    std::vector<Value> sorted = l;
    std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& x, const Value& y) {
      return reverse ? env.less(y, x) : env.less(x, y);
    });
    l.swap(sorted);
    return Value::none();
  }
  fail(construct, "'list' object has no method '" + name + "'");
}

// Index of key k in d's items, or npos.
size_t find_index(const Dict& d, const std::string& k) {
  for (size_t i = 0; i < d.items.size(); i++)
    if (d.items[i].first == k) return i;
  return std::string::npos;
}

// d[k] = v with the reference-cycle check; charges the linear key scan.
void dict_store(const Value& self, std::string k, const Value& v, const MutateEnv& env, const std::string& construct) {
  env.steps(1 + self.d->items.size() / 16);
  check_no_cycle(self, v, env, construct);
  self.d->set(k, v);
}

Value dict_mutator(const Value& self, const std::string& name, CallArgs& a, const MutateEnv& env,
                   const std::string& construct) {
  Dict& d = *self.d;
  if (name == "update") {
    if (a.pos.size() > 1) fail(construct, "update expected at most 1 argument, got " + std::to_string(a.pos.size()));
    if (!a.pos.empty()) {
      const Value& other = a.pos[0];
      if (other.is_dict()) {
        auto items = other.d->items;  // a copy: d.update(d) is fine
        for (auto& kv : items) dict_store(self, kv.first, kv.second, env, construct);
      } else {
        auto seq = env.iterate(other);
        for (size_t k = 0; k < seq.size(); k++) {
          const Value& p = seq[k];
          std::vector<Value> kv = p.is_list() || p.is_str() || p.is_dict() ? env.iterate(p) : std::vector<Value>{};
          if (!p.is_list() && !p.is_str() && !p.is_dict())
            fail(construct, "cannot convert dictionary update sequence element #" + std::to_string(k) + " to a sequence");
          if (kv.size() != 2)
            fail(construct, "dictionary update sequence element #" + std::to_string(k) + " has length " +
                                std::to_string(kv.size()) + "; 2 is required");
          dict_store(self, dict_key(kv[0]), kv[1], env, construct);
        }
      }
    }
    for (auto& kv : a.kw) dict_store(self, kv.first, kv.second, env, construct);
    return Value::none();
  }
  if (name == "pop") {
    positional_only(a, construct, "pop", 1, 2);
    env.steps(1 + d.items.size() / 16);
    size_t i = find_index(d, dict_key(a.pos[0]));
    if (i == std::string::npos) {
      if (a.pos.size() == 2) return a.pos[1];
      fail(construct, "KeyError: " + py_repr(a.pos[0]));
    }
    Value r = d.items[i].second;
    d.items.erase(d.items.begin() + int64_t(i));
    return r;
  }
  if (name == "popitem") {
    positional_only(a, construct, "popitem", 0, 0);
    if (d.items.empty()) fail(construct, "KeyError: 'popitem(): dictionary is empty'");
    env.steps(1);
    Value r = Value::list({key_value(d.items.back().first), d.items.back().second}, true);
    d.items.pop_back();
    return r;
  }
  if (name == "setdefault") {
    positional_only(a, construct, "setdefault", 1, 2);
    std::string k = dict_key(a.pos[0]);
    env.steps(1 + d.items.size() / 16);
    if (const Value* v = d.find(k)) return *v;
    Value dflt = a.pos.size() == 2 ? a.pos[1] : Value::none();
    dict_store(self, k, dflt, env, construct);
    return dflt;
  }
  if (name == "clear") {
    positional_only(a, construct, "clear", 0, 0);
    env.steps(1 + d.items.size() / 64);
    d.items.clear();
    return Value::none();
  }
  fail(construct, "'dict' object has no method '" + name + "'");
}

}  // namespace

Value call_mutator(const Value& self, const std::string& name, CallArgs& a, const MutateEnv& env) {
  std::string construct = "method " + name;
  if (self.is_list() && !self.tuple && !self.gen) return list_mutator(self, name, a, env, construct);
  if (self.is_dict()) return dict_mutator(self, name, a, env, construct);
  fail(construct, std::string("'") + type_name(self) + "' object has no method '" + name + "'");
}

void check_no_cycle(const Value& target, const Value& v, const MutateEnv& env, const std::string& construct) {
  const void* t = identity(target);
  if (!t || !identity(v)) return;
  std::unordered_set<const void*> seen;
  std::vector<const Value*> stack{&v};
  while (!stack.empty()) {
    const Value* cur = stack.back();
    stack.pop_back();
    const void* id = identity(*cur);
    if (!id || !seen.insert(id).second) continue;
    env.steps(1);
    if (id == t)
      fail(construct, std::string("kiln's jinja engine does not let a ") + type_name(target) +
                          " contain itself (a reference cycle)");
    if (cur->kind == Kind::List) {
      for (const auto& e : *cur->l)
        if (identity(e)) stack.push_back(&e);
    } else {
      for (const auto& kv : cur->d->items)
        if (identity(kv.second)) stack.push_back(&kv.second);
    }
  }
}

}  // namespace kiln::chat::jinja
