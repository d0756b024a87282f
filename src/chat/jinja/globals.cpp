// chat/jinja/globals.cpp — the global functions templates may call: jinja2's range (with the
//       sandbox's size limit), namespace and dict, and HF's raise_exception and strftime_now.
// Must not: evaluate template nodes.
// Threading: runs inside one render call (Interp); strftime_now reads the local time.
#include <ctime>

#include "chat/jinja/interp.h"

namespace kiln::chat::jinja {

namespace {

Value g_raise_exception(Interp&, CallArgs& a) { fail("raise_exception", a.pos.empty() ? std::string() : py_str(a.pos[0])); }

Value g_strftime_now(Interp& in, CallArgs& a) {
  if (a.pos.empty() || !a.pos[0].is_str()) fail("strftime_now", "strftime_now(format) needs a string");
  if (in.opt.strftime_now) return Value::str(in.opt.strftime_now(a.pos[0].sv()));
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[512];
  size_t n = std::strftime(buf, sizeof buf, a.pos[0].sv().c_str(), &tm);
  return Value::str(std::string(buf, n));
}

Value g_range(Interp& in, CallArgs& a) {
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
}

// namespace(...) and dict(...): mappings and keyword arguments merged into a new object.
Value merged(Value into, const char* construct, CallArgs& a) {
  for (auto& p : a.pos) {
    if (!p.is_dict()) fail(construct, std::string(construct) + "() positional argument must be a mapping");
    for (auto& kv : p.d->items) into.d->set(kv.first, kv.second);
  }
  for (auto& kv : a.kw) into.d->set(kv.first, kv.second);
  return into;
}
Value g_namespace(Interp&, CallArgs& a) { return merged(Value::ns(), "namespace", a); }
Value g_dict(Interp&, CallArgs& a) { return merged(Value::dict(), "dict", a); }

constexpr GlobalDef kGlobals[] = {
    {"dict", g_dict},   {"namespace", g_namespace}, {"raise_exception", g_raise_exception},
    {"range", g_range}, {"strftime_now", g_strftime_now},
};

}  // namespace

std::span<const GlobalDef> global_table() { return kGlobals; }

void Interp::install_globals() {
  globals = Value::dict();
  for (const GlobalDef& g : global_table()) {
    GlobalFn fn = g.fn;
    globals.d->set(g.name, make_callable(std::string(g.name), [fn](Interp& in, CallArgs& a) { return fn(in, a); }));
  }
}

}  // namespace kiln::chat::jinja
