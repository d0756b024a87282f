// chat/jinja/value.h — the runtime value of kiln's Jinja engine (Python object model subset).
// Owns: Value (undefined/none/bool/int/float/str/list/tuple/dict/namespace or helper object/
//       callable), Python
//       str()/repr() formatting, json.dumps-compatible serialisation, UTF-8 helpers.
// Must not: evaluate templates (that is interp.cpp).
// Threading: strings are shared immutable data; lists, dicts and namespaces are shared by
//       reference and mutable (Python semantics: list.append / dict.update / set ns.x change
//       them for every Value that refers to them) and belong to one render call; never share
//       a Value between concurrent renders.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::chat::jinja {

// Thrown inside the engine only (never escapes the public API).
struct JinjaError {
  std::string construct;  // e.g. "filter tojson", "for", "raise_exception"
  std::string message;
  int line = 0;  // 0: filled in by the interpreter from the current node
};
[[noreturn]] void fail(std::string construct, std::string message);

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value;
struct Dict;
struct Callable;
struct Interp;

struct Value {
  Kind kind = Kind::Undefined;
  bool tuple = false;   // List: a Python tuple (repr with parentheses)
  bool gen = false;     // List: a one-shot iterator/generator (map/select/...): no len, no index
  bool group = false;   // List: a groupby item (a (grouper, list) tuple with those two attributes)
  bool safe = false;    // String: markupsafe.Markup (from |safe / |escape)
  bool unsafe = false;  // Undefined: produced by the sandbox (using it is a SecurityError)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;  // String; Undefined: hint (name or message)
  std::shared_ptr<std::vector<Value>> l;  // List / tuple (lists: mutable, shared by reference)
  std::shared_ptr<Dict> d;                // Dict / Namespace
  std::shared_ptr<const Callable> fn;     // Callable

  static Value undefined(std::string hint = {});
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value flt(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value str(std::string x, bool safe = false);
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict();
  static Value ns();
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_str() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  const std::string& sv() const { return *s; }
  const std::vector<Value>& items() const { return *l; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order (Python dict)
  // Namespace only: empty for jinja2's namespace(); else one of jinja2's helper objects (cycler,
  // joiner, self, a block reference), named by its Python class (a string literal, e.g.
  // "jinja2.utils.Cycler", see registry.h): `items` are its attributes, which templates read
  // but cannot assign.
  std::string_view cls;
  const Value* find(std::string_view k) const;
  void set(std::string_view k, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
  std::string name;
  std::function<Value(Interp&, CallArgs&)> fn;
};

// Dict keys are strings; other hashable Python keys (int, float, None; bool as int) are
// encoded with a leading NUL byte so they keep their identity and repr.
std::string dict_key(const Value& k);       // throws JinjaError for unhashable keys
Value key_value(const std::string& k);      // inverse of dict_key

// Python semantics helpers.
bool truthy(const Value& v);
std::string py_str(const Value& v);   // str(v)
std::string py_repr(const Value& v);  // repr(v)
std::string py_float_repr(double d);  // repr(float)
std::string py_str_repr(std::string_view s);
bool py_eq(const Value& a, const Value& b);
const char* type_name(const Value& v);  // Python type name: 'str', 'dict', ...

struct JsonOpts {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;                // indent unit when has_indent
  std::string item_sep = ", ";       // json.dumps defaults (", " / ",")
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonOpts& o);  // throws JinjaError if not serialisable

// UTF-8 helpers (code point aware, like Python str).
std::vector<uint32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t b, size_t e);
size_t utf8_length(std::string_view s);
bool py_isspace(uint32_t cp);
bool is_ascii(std::string_view s);

}  // namespace kiln::chat::jinja
