// chat/jinja/globals.cpp — the global functions templates may call: jinja2's range (with the
//       sandbox's size limit), namespace, dict, cycler, joiner and lipsum, and HF's
//       raise_exception and strftime_now; and the methods of a cycler.
// Must not: evaluate template nodes.
// Threading: runs inside one render call (Interp); strftime_now reads the local time, lipsum
//       draws from a per-thread generator.
#include <cmath>
#include <cstdint>
#include <ctime>
#include <random>

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

// Extra arguments of a call to a Python function `fn` that takes `max_pos` positional
// arguments, or keywords among `names`, are a TypeError.
void check_signature(const char* fn, CallArgs& a, size_t max_pos, std::initializer_list<std::string_view> names) {
  if (a.pos.size() > max_pos)
    fail(fn, std::string(fn) + "() takes at most " + std::to_string(max_pos) + " positional arguments but " +
                 std::to_string(a.pos.size()) + " were given");
  for (size_t k = 0; k < a.kw.size(); k++) {
    bool known = false;
    for (size_t p = 0; p < names.size(); p++)
      if (names.begin()[p] == a.kw[k].first) {
        if (p < a.pos.size()) fail(fn, std::string(fn) + "() got multiple values for argument '" + a.kw[k].first + "'");
        known = true;
      }
    if (!known) fail(fn, std::string(fn) + "() got an unexpected keyword argument '" + a.kw[k].first + "'");
  }
}

// cycler(*items): jinja2.utils.Cycler, an object with the attributes items (a tuple), pos and
// current (items[pos]) and the methods next() and reset() (cycler_method_table).
Value g_cycler(Interp&, CallArgs& a) {
  check_signature("cycler", a, SIZE_MAX, {});
  if (a.pos.empty()) fail("cycler", "at least one item has to be provided");
  Value c = Value::ns();
  c.d->cls = kCyclerClass;
  Value first = a.pos[0];
  c.d->set("items", Value::list(std::move(a.pos), true));
  c.d->set("pos", Value::integer(0));
  c.d->set("current", std::move(first));
  return c;
}

void cycler_seek(const Value& self, int64_t pos) {
  const Value& items = *self.d->find("items");
  self.d->set("pos", Value::integer(pos));
  self.d->set("current", items.items()[size_t(pos)]);
}

// c.next(): the current item, then advances to the next one (after the last, the first).
Value m_cycler_next(Interp&, const std::string& name, const Value& self, CallArgs& a) {
  if (!a.pos.empty() || !a.kw.empty()) fail("cycler." + name, "Cycler.next() takes no arguments");
  Value cur = *self.d->find("current");
  const int64_t n = int64_t(self.d->find("items")->items().size());
  cycler_seek(self, (self.d->find("pos")->i + 1) % n);
  return cur;
}

// c.reset(): back to the first item.
Value m_cycler_reset(Interp&, const std::string& name, const Value& self, CallArgs& a) {
  if (!a.pos.empty() || !a.kw.empty()) fail("cycler." + name, "Cycler.reset() takes no arguments");
  cycler_seek(self, 0);
  return Value::none();
}

// joiner(sep=", "): jinja2.utils.Joiner, a callable object that returns '' the first time it is
// called and `sep` after that (attributes sep and used).
Value g_joiner(Interp&, CallArgs& a) {
  check_signature("joiner", a, 1, {"sep"});
  Value j = Value::ns();
  j.d->cls = kJoinerClass;
  j.d->set("sep", arg_or(a, 0, "sep", Value::str(", ")));
  j.d->set("used", Value::boolean(false));
  std::shared_ptr<Dict> state = j.d;  // held by the callable, not by the Dict: no reference cycle
  j.fn = std::make_shared<Callable>(Callable{"joiner", [state](Interp&, CallArgs& c) -> Value {
    if (!c.pos.empty() || !c.kw.empty()) fail("joiner", "Joiner.__call__() takes no arguments");
    if (!truthy(*state->find("used"))) {
      state->set("used", Value::boolean(true));
      return Value::str("");
    }
    return *state->find("sep");
  }});
  return j;
}

// lipsum's bounds: Python ints (and integral floats, which random.randrange accepts).
int64_t lipsum_int(const Value& v, const char* what) {
  if (v.kind == Kind::Float && std::floor(v.f) == v.f && std::fabs(v.f) < 9e15) return int64_t(v.f);
  return as_int(v, what);
}

// The words of jinja2's lorem ipsum (jinja2.constants.LOREM_IPSUM_WORDS).
constexpr std::string_view kLoremWords[] = {
    "a", "ac", "accumsan", "ad", "adipiscing", "aenean", "aliquam", "aliquet", "amet", "ante", "aptent", "arcu",
    "at", "auctor", "augue", "bibendum", "blandit", "class", "commodo", "condimentum", "congue", "consectetuer",
    "consequat", "conubia", "convallis", "cras", "cubilia", "cum", "curabitur", "curae", "cursus", "dapibus",
    "diam", "dictum", "dictumst", "dignissim", "dis", "dolor", "donec", "dui", "duis", "egestas", "eget",
    "eleifend", "elementum", "elit", "enim", "erat", "eros", "est", "et", "etiam", "eu", "euismod", "facilisi",
    "facilisis", "fames", "faucibus", "felis", "fermentum", "feugiat", "fringilla", "fusce", "gravida",
    "habitant", "habitasse", "hac", "hendrerit", "hymenaeos", "iaculis", "id", "imperdiet", "in", "inceptos",
    "integer", "interdum", "ipsum", "justo", "lacinia", "lacus", "laoreet", "lectus", "leo", "libero", "ligula",
    "litora", "lobortis", "lorem", "luctus", "maecenas", "magna", "magnis", "malesuada", "massa", "mattis",
    "mauris", "metus", "mi", "molestie", "mollis", "montes", "morbi", "mus", "nam", "nascetur", "natoque", "nec",
    "neque", "netus", "nibh", "nisi", "nisl", "non", "nonummy", "nostra", "nulla", "nullam", "nunc", "odio",
    "orci", "ornare", "parturient", "pede", "pellentesque", "penatibus", "per", "pharetra", "phasellus",
    "placerat", "platea", "porta", "porttitor", "posuere", "potenti", "praesent", "pretium", "primis", "proin",
    "pulvinar", "purus", "quam", "quis", "quisque", "rhoncus", "ridiculus", "risus", "rutrum", "sagittis",
    "sapien", "scelerisque", "sed", "sem", "semper", "senectus", "sit", "sociis", "sociosqu", "sodales",
    "sollicitudin", "suscipit", "suspendisse", "taciti", "tellus", "tempor", "tempus", "tincidunt", "torquent",
    "tortor", "tristique", "turpis", "ullamcorper", "ultrices", "ultricies", "urna", "ut", "varius", "vehicula",
    "vel", "velit", "venenatis", "vestibulum", "vitae", "vivamus", "viverra", "volutpat", "vulputate",
};

// lipsum(n=5, html=True, min=20, max=100): n paragraphs of random lorem ipsum words, as jinja2's
// generate_lorem_ipsum makes them: each paragraph randrange(min, max) words, no word twice in a
// row, a comma after some 3 to 7 words and a full stop after some 10 to 19 (the next word
// capitalised), ending with a full stop. html: each paragraph in <p>…</p>, one per line (Markup);
// else paragraphs separated by a blank line. Random like jinja2's: the text differs per call.
Value g_lipsum(Interp& in, CallArgs& a) {
  check_signature("lipsum", a, 4, {"n", "html", "min", "max"});
  const int64_t n = as_int(arg_or(a, 0, "n", Value::integer(5)), "lipsum");
  const bool html = truthy(arg_or(a, 1, "html", Value::boolean(true)));
  const int64_t lo = lipsum_int(arg_or(a, 2, "min", Value::integer(20)), "lipsum");
  const int64_t hi = lipsum_int(arg_or(a, 3, "max", Value::integer(100)), "lipsum");
  thread_local std::mt19937_64 gen{std::random_device{}()};
  auto randrange = [](int64_t b, int64_t e) { return std::uniform_int_distribution<int64_t>(b, e - 1)(gen); };
  constexpr size_t kWords = std::size(kLoremWords);
  std::string out;
  for (int64_t p = 0; p < n; p++) {
    in.step();
    if (hi <= lo) fail("lipsum", "empty range for randrange() (" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
    const int64_t count = randrange(lo, hi);
    std::string para;
    bool capital = true;
    int64_t last_comma = 0, last_stop = 0;
    size_t last = kWords;
    for (int64_t k = 0; k < count; k++) {
      in.step();
      size_t w;
      do w = size_t(randrange(0, int64_t(kWords)));
      while (w == last);
      last = w;
      if (k) para += ' ';
      const size_t at = para.size();
      para += kLoremWords[w];
      if (capital) para[at] = char(para[at] - 'a' + 'A');
      capital = false;
      if (k - randrange(3, 8) > last_comma) {
        last_comma = k;
        last_stop += 2;
        para += ',';
      }
      if (k - randrange(10, 20) > last_stop) {
        last_comma = last_stop = k;
        para += '.';
        capital = true;
      }
      in.check_size(out.size() + para.size(), "lipsum");
    }
    if (!para.empty() && para.back() == ',') para.back() = '.';
    else if (para.empty() || para.back() != '.') para += '.';
    if (p) out += html ? "\n" : "\n\n";
    out += html ? "<p>" + para + "</p>" : para;
    in.check_size(out.size(), "lipsum");
  }
  return Value::str(std::move(out), html);
}

constexpr GlobalDef kGlobals[] = {
    {"cycler", g_cycler}, {"dict", g_dict},   {"joiner", g_joiner},
    {"lipsum", g_lipsum}, {"namespace", g_namespace}, {"raise_exception", g_raise_exception},
    {"range", g_range},   {"strftime_now", g_strftime_now},
};

constexpr MethodDef kCyclerMethods[] = {{"next", m_cycler_next}, {"reset", m_cycler_reset}};

}  // namespace

std::span<const GlobalDef> global_table() { return kGlobals; }
std::span<const MethodDef> cycler_method_table() { return kCyclerMethods; }

void Interp::install_globals() {
  globals = Value::dict();
  for (const GlobalDef& g : global_table()) {
    GlobalFn fn = g.fn;
    globals.d->set(g.name, make_callable(std::string(g.name), [fn](Interp& in, CallArgs& a) { return fn(in, a); }));
  }
}

}  // namespace kiln::chat::jinja
