// chat/jinja/format.cpp — Python's string formatting on Jinja values: `fmt % args` (and
//       |format), str.format (jinja2's sandboxed formatter), and pprint.pformat (|pprint).
// Must not: evaluate template nodes or know filter names.
// Threading: runs inside one render call (Interp); py_pformat is a pure function.
#include <algorithm>
#include <cstring>

#include "chat/jinja/interp.h"

namespace kiln::chat::jinja {

std::string Interp::printf_format(const std::string& fmt, const Value& args) {
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
std::string Interp::str_format(const std::string& fmt, CallArgs& a) {
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

std::string Interp::format_spec(const Value& v, const std::string& spec) {
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


namespace {

// pprint.PrettyPrinter(width=80, indent=1, sort_dicts=True), the subset of it that Jinja values
// reach: dicts, lists, tuples and strings are broken over lines when their repr is too wide.
struct PFormat {
  static constexpr int64_t kWidth = 80;
  std::string out;

  // pprint's dict order: Python's < where the keys compare, else by type name.
  static bool key_less(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
      if (a.kind != Kind::Float && b.kind != Kind::Float) return as_int(a, "pprint") < as_int(b, "pprint");
      return as_num(a) < as_num(b);
    }
    if (a.is_str() && b.is_str()) return a.sv() < b.sv();
    return std::strcmp(type_name(a), type_name(b)) < 0;
  }
  static std::vector<std::pair<Value, Value>> sorted_items(const Value& d) {
    std::vector<std::pair<Value, Value>> items;
    for (const auto& [k, v] : d.d->items) items.emplace_back(key_value(k), v);
    std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return key_less(x.first, y.first); });
    return items;
  }
  static bool breakable_list(const Value& v) { return v.is_list() && !v.gen; }

  // pprint's repr: repr() with every dict's items sorted.
  static std::string repr(const Value& v, int depth = 0) {
    if (depth > 100) fail("filter pprint", "maximum nesting depth exceeded");
    if (v.is_dict()) {
      std::string s = "{";
      for (const auto& [k, x] : sorted_items(v)) s += (s.size() > 1 ? ", " : "") + repr(k, depth + 1) + ": " + repr(x, depth + 1);
      return s + "}";
    }
    if (breakable_list(v)) {
      std::string s = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.l->size(); k++) s += (k ? ", " : "") + repr((*v.l)[k], depth + 1);
      if (v.tuple && v.l->size() == 1) s += ",";
      return s + (v.tuple ? ")" : "]");
    }
    return py_repr(v);
  }

  void format(const Value& v, int64_t indent, int64_t allowance, int level) {
    std::string rep = repr(v);
    if (int64_t(utf8_length(rep)) > kWidth - indent - allowance) {
      if (v.is_dict()) return format_dict(v, indent, allowance, level + 1);
      if (breakable_list(v)) return format_list(v, indent, allowance, level + 1);
      if (v.is_str() && !v.safe) return format_str(v.sv(), indent, allowance, level + 1);
    }
    out += rep;
  }

  void format_dict(const Value& d, int64_t indent, int64_t allowance, int level) {
    out += '{';
    auto items = sorted_items(d);
    indent += 1;
    for (size_t k = 0; k < items.size(); k++) {
      const bool last = k + 1 == items.size();
      std::string key = repr(items[k].first);
      out += key + ": ";
      format(items[k].second, indent + int64_t(utf8_length(key)) + 2, last ? allowance + 1 : 1, level);
      if (!last) out += ",\n" + std::string(size_t(indent), ' ');
    }
    out += '}';
  }

  void format_list(const Value& l, int64_t indent, int64_t allowance, int level) {
    const std::string end = !l.tuple ? "]" : l.l->size() == 1 ? ",)" : ")";
    out += l.tuple ? '(' : '[';
    indent += 1;
    for (size_t k = 0; k < l.l->size(); k++) {
      const bool last = k + 1 == l.l->size();
      if (k) out += ",\n" + std::string(size_t(indent), ' ');
      format((*l.l)[k], indent, last ? allowance + int64_t(end.size()) : 1, level);
    }
    out += end;
  }

  // A long string: one repr per line, and per run of words where a line is too wide; at the
  // top level the pieces are wrapped in parentheses (implicit concatenation).
  void format_str(const std::string& s, int64_t indent, int64_t allowance, int level) {
    if (s.empty()) {
      out += "''";
      return;
    }
    auto cps = utf8_decode(s);
    std::vector<std::string> lines;  // str.splitlines(keepends=True)
    for (size_t b = 0, k = 0; k < cps.size(); k++) {
      uint32_t c = cps[k];
      bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                 c == 0x85 || c == 0x2028 || c == 0x2029;
      if (brk && c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') k++;
      if (brk || k + 1 == cps.size()) {
        lines.push_back(utf8_encode(cps, b, k + 1));
        b = k + 1;
      }
    }
    if (level == 1) {
      indent += 1;
      allowance += 1;
    }
    auto rlen = [](const std::string& x) { return int64_t(utf8_length(py_str_repr(x))); };
    const int64_t max_width = kWidth - indent;
    int64_t max_width1 = max_width;
    std::vector<std::string> chunks;
    for (size_t i = 0; i < lines.size(); i++) {
      const bool last_line = i + 1 == lines.size();
      if (last_line) max_width1 -= allowance;
      if (rlen(lines[i]) <= max_width1) {
        chunks.push_back(py_str_repr(lines[i]));
        continue;
      }
      std::vector<std::string> parts;  // re.findall(r'\S*\s*', line) without the final ''
      auto lc = utf8_decode(lines[i]);
      for (size_t b = 0; b < lc.size();) {
        size_t e = b;
        while (e < lc.size() && !py_isspace(lc[e])) e++;
        while (e < lc.size() && py_isspace(lc[e])) e++;
        parts.push_back(utf8_encode(lc, b, e));
        b = e;
      }
      int64_t max_width2 = max_width;
      std::string current;
      for (size_t j = 0; j < parts.size(); j++) {
        if (j + 1 == parts.size() && last_line) max_width2 -= allowance;
        std::string candidate = current + parts[j];
        if (rlen(candidate) > max_width2) {
          if (!current.empty()) chunks.push_back(py_str_repr(current));
          current = parts[j];
        } else {
          current = std::move(candidate);
        }
      }
      if (!current.empty()) chunks.push_back(py_str_repr(current));
    }
    if (chunks.size() == 1) {
      out += chunks[0];
      return;
    }
    if (level == 1) out += '(';
    for (size_t i = 0; i < chunks.size(); i++) out += (i ? "\n" + std::string(size_t(indent), ' ') : "") + chunks[i];
    if (level == 1) out += ')';
  }
};

}  // namespace

std::string py_pformat(const Value& v) {
  PFormat p;
  p.format(v, 0, 0, 0);
  return std::move(p.out);
}

}  // namespace kiln::chat::jinja
