// chat/jinja/value.cpp — Python object model subset: str(), repr(), ==, truthiness, json.dumps.
#include "chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kiln::chat::jinja {

void fail(std::string construct, std::string message) {
  throw JinjaError{std::move(construct), std::move(message), 0};
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::str(std::string x, bool safe) {
  Value v;
  v.kind = Kind::String;
  v.safe = safe;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.tuple = tuple;
  v.l = std::make_shared<std::vector<Value>>(std::move(items));
  return v;
}
Value Value::dict() {
  Value v;
  v.kind = Kind::Dict;
  v.d = std::make_shared<Dict>();
  return v;
}
Value Value::ns() {
  Value v;
  v.kind = Kind::Namespace;
  v.d = std::make_shared<Dict>();
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return none();
    case T::boolean: return boolean(j.get<bool>());
    case T::number_integer: return integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return flt(double(u));
      return integer(int64_t(u));
    }
    case T::number_float: return flt(j.get<double>());
    case T::string: return str(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case T::object: {
      Value d = dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.d->items.emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default: return none();
  }
}

const Value* Dict::find(std::string_view k) const {
  for (const auto& kv : items)
    if (kv.first == k) return &kv.second;
  return nullptr;
}
void Dict::set(std::string_view k, Value v) {
  for (auto& kv : items)
    if (kv.first == k) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(std::string(k), std::move(v));
}

std::string dict_key(const Value& k) {
  switch (k.kind) {
    case Kind::String: return k.sv();
    case Kind::Bool: return std::string("\0i", 2) + (k.b ? "1" : "0");
    case Kind::Int: return std::string("\0i", 2) + std::to_string(k.i);
    case Kind::Float:
      if (std::floor(k.f) == k.f && std::fabs(k.f) < 9e18) return std::string("\0i", 2) + std::to_string(int64_t(k.f));
      return std::string("\0f", 2) + py_float_repr(k.f);
    case Kind::None: return std::string("\0n", 2);
    default: fail("dict key", std::string("unhashable type: '") + type_name(k) + "'");
  }
}
Value key_value(const std::string& k) {
  if (k.size() < 2 || k[0] != '\0') return Value::str(k);
  if (k[1] == 'i') return Value::integer(std::strtoll(k.c_str() + 2, nullptr, 10));
  if (k[1] == 'f') return Value::flt(std::strtod(k.c_str() + 2, nullptr));
  return Value::none();
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return false;
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s->empty();
    case Kind::List: return v.gen || !v.l->empty();
    case Kind::Dict: return !v.d->items.empty();
    default: return true;
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return v.safe ? "Markup" : "str";
    case Kind::List: return v.gen ? "generator" : v.tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: {  // a helper object: its class name without the module ("Cycler")
      const std::string_view c = v.d->cls;
      return c.empty() ? "Namespace" : c.data() + c.rfind('.') + 1;
    }
    case Kind::Callable: return "function";
  }
  return "object";
}

// ---- UTF-8 -----------------------------------------------------------------------------
// Invalid bytes decode to U+DC80+byte (Python's surrogateescape) and encode back losslessly.
std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; ok && k < len; k++) {
      unsigned char cc = s[i + k];
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))) ok = false;
    if (!ok) {
      out.push_back(0xDC00 + c);
      i++;
    } else {
      out.push_back(cp);
      i += len;
    }
  }
  return out;
}
void utf8_append(std::string& out, uint32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(char(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xc0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xe0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(char(0xf0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  }
}
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; i++) utf8_append(out, cps[i]);
  return out;
}
bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}
size_t utf8_length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return utf8_decode(s).size();
}
bool py_isspace(uint32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// ---- str() / repr() --------------------------------------------------------------------
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::string out;
  size_t p = 0;
  if (s[0] == '-') {
    out = "-";
    p = 1;
  }
  size_t epos = s.find('e');
  std::string digits;
  for (size_t k = p; k < epos; k++)
    if (s[k] != '.') digits.push_back(s[k]);
  int exp = std::atoi(s.c_str() + epos + 1);
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (ip.size() < size_t(exp + 1)) ip.push_back('0');
      std::string fp = digits.size() > size_t(exp + 1) ? digits.substr(exp + 1) : "0";
      out += ip + "." + fp;
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

static bool py_printable(uint32_t c) {
  if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x206f)) return false;
  if (c == 0x3000 || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) || (c >= 0xd800 && c <= 0xf8ff)) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e) return false;
  if (c >= 0xe0000 || (c >= 0xf0000)) return false;
  return true;
}

std::string py_str_repr(std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : utf8_decode(s)) {
    if (c == uint32_t(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      char b[8];
      std::snprintf(b, sizeof b, "\\udc%02x", c - 0xDC00);
      out += b;
    } else if (!py_printable(c)) {
      char b[16];
      if (c < 0x100) std::snprintf(b, sizeof b, "\\x%02x", c);
      else if (c < 0x10000) std::snprintf(b, sizeof b, "\\u%04x", c);
      else std::snprintf(b, sizeof b, "\\U%08x", c);
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(q);
  return out;
}

static void repr_into(std::string& out, const Value& v, int depth);

static void str_into(std::string& out, const Value& v, int depth) {
  switch (v.kind) {
    case Kind::Undefined: return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.b ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float: out += py_float_repr(v.f); return;
    case Kind::String: out += *v.s; return;
    case Kind::List: {
      if (v.gen) {
        out += "<generator object>";
        return;
      }
      if (depth > 100) fail("str", "maximum nesting depth exceeded");
      out += v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.l->size(); k++) {
        if (k) out += ", ";
        repr_into(out, (*v.l)[k], depth + 1);
      }
      if (v.tuple && v.l->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      return;
    }
    case Kind::Dict:
    case Kind::Namespace: {
      if (v.kind == Kind::Namespace && !v.d->cls.empty()) {  // object.__repr__ of a helper object
        if (v.d->cls == "jinja2.runtime.TemplateReference") {
          out += "<TemplateReference None>";  // jinja2 names the template; from_string's has no name
          return;
        }
        char addr[32];
        std::snprintf(addr, sizeof addr, "%p", static_cast<const void*>(v.d.get()));
        out += "<" + std::string(v.d->cls) + " object at " + addr + ">";
        return;
      }
      if (depth > 100) fail("str", "maximum nesting depth exceeded");
      if (v.kind == Kind::Namespace) out += "<Namespace ";
      out += "{";
      bool first = true;
      for (const auto& kv : v.d->items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, key_value(kv.first), depth + 1);
        out += ": ";
        repr_into(out, kv.second, depth + 1);
      }
      out += "}";
      if (v.kind == Kind::Namespace) out += ">";
      return;
    }
    case Kind::Callable: out += "<function " + v.fn->name + ">"; return;
  }
}

static void repr_into(std::string& out, const Value& v, int depth) {
  if (v.kind == Kind::String) {
    if (v.safe) out += "Markup(";
    out += py_str_repr(*v.s);
    if (v.safe) out += ")";
  } else if (v.kind == Kind::Undefined) {
    out += "Undefined";
  } else {
    str_into(out, v, depth);
  }
}

std::string py_str(const Value& v) {
  if (v.kind == Kind::String) return *v.s;
  std::string out;
  str_into(out, v, 0);
  return out;
}
std::string py_repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

bool py_eq(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) {
      int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
      return x == y;
    }
    double x = a.kind == Kind::Float ? a.f : a.kind == Kind::Bool ? a.b : double(a.i);
    double y = b.kind == Kind::Float ? b.f : b.kind == Kind::Bool ? b.b : double(b.i);
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return *a.s == *b.s;
    case Kind::List: {
      if (a.gen || b.gen) return a.l == b.l;
      if (a.tuple != b.tuple || a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); k++)
        if (!py_eq((*a.l)[k], (*b.l)[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.d->items.size() != b.d->items.size()) return false;
      for (const auto& kv : a.d->items) {
        const Value* o = b.d->find(kv.first);
        if (!o || !py_eq(kv.second, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.d == b.d;
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

// ---- json.dumps --------------------------------------------------------------------------
static void json_str(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto esc_u = [&](uint32_t c) {  // c <= 0xFFFF; the buffer fits any uint32_t for -Wformat-truncation
    char b[12];
    std::snprintf(b, sizeof b, "\\u%04x", c);
    out += b;
  };
  // The escapes both modes share (Python's ESCAPE); true when c was written.
  auto escape_common = [&](uint32_t c) {
    switch (c) {
      case '"': out += "\\\""; return true;
      case '\\': out += "\\\\"; return true;
      case '\n': out += "\\n"; return true;
      case '\r': out += "\\r"; return true;
      case '\t': out += "\\t"; return true;
      case '\b': out += "\\b"; return true;
      case '\f': out += "\\f"; return true;
      default:
        if (c >= 0x20) return false;
        esc_u(c);
        return true;
    }
  };
  if (!ensure_ascii) {
    for (unsigned char c : s)
      if (!escape_common(c)) out.push_back(char(c));
  } else {
    for (uint32_t c : utf8_decode(s)) {
      if (escape_common(c)) continue;
      if (c < 0x7f) {
        out.push_back(char(c));
      } else if (c >= 0x10000) {
        uint32_t v = c - 0x10000;
        esc_u(0xd800 + (v >> 10));
        esc_u(0xdc00 + (v & 0x3ff));
      } else {
        esc_u(c);
      }
    }
  }
  out.push_back('"');
}

static void json_into(std::string& out, const Value& v, const JsonOpts& o, int level) {
  if (level > 200) fail("tojson", "maximum nesting depth exceeded");
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
      else out += py_float_repr(v.f);
      return;
    case Kind::String: json_str(out, *v.s, o.ensure_ascii); return;
    case Kind::List: {
      if (v.gen) break;
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.l->size(); k++) {
        if (k) out += o.item_sep;
        if (o.has_indent) {
          out += "\n";
          for (int d = 0; d <= level; d++) out += o.indent;
        }
        json_into(out, (*v.l)[k], o, level + 1);
      }
      if (o.has_indent) {
        out += "\n";
        for (int d = 0; d < level; d++) out += o.indent;
      }
      out += "]";
      return;
    }
    case Kind::Dict: {
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.d->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += o.item_sep;
        first = false;
        if (o.has_indent) {
          out += "\n";
          for (int d = 0; d <= level; d++) out += o.indent;
        }
        if (!kv->first.empty() && kv->first[0] == '\0') {
          Value kk = key_value(kv->first);
          json_str(out, kk.is_none() ? "null" : py_str(kk), o.ensure_ascii);
        } else {
          json_str(out, kv->first, o.ensure_ascii);
        }
        out += o.key_sep;
        json_into(out, kv->second, o, level + 1);
      }
      if (o.has_indent) {
        out += "\n";
        for (int d = 0; d < level; d++) out += o.indent;
      }
      out += "}";
      return;
    }
    default: break;
  }
  fail("tojson", std::string("Object of type ") + type_name(v) + " is not JSON serializable");
}

std::string json_dumps(const Value& v, const JsonOpts& o) {
  std::string out;
  json_into(out, v, o, 0);
  return out;
}

}  // namespace kiln::chat::jinja
