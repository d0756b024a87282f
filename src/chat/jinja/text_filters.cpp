// chat/jinja/text_filters.cpp — the filters that produce text: tojson, escape, trim, case,
//       replace, indent, center, format, truncate, filesizeformat, urlencode, xmlattr, pprint,
//       striptags, wordwrap, urlize (listed in filters.cpp's table).
// Must not: evaluate template nodes or register names (filters.cpp's table does).
// Threading: runs inside one render call (Interp).
#include <algorithm>
#include <cstring>

#include "chat/jinja/filters.h"
#include "chat/jinja/py_string.h"

namespace kiln::chat::jinja::text_filters {

namespace {
std::string construct_of(const std::string& name) { return "filter " + name; }
}  // namespace

Value tojson(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  JsonOpts o;
  o.ensure_ascii = truthy(arg_or(a, 0, "ensure_ascii", Value::boolean(false)));
  Value indent = arg_or(a, 1, "indent", Value::none());
  if (!indent.is_none()) {
    o.has_indent = true;
    if (indent.is_str()) o.indent = indent.sv();
    else o.indent = std::string(size_t(std::max<int64_t>(0, as_int(indent, cn.c_str()))), ' ');
    o.item_sep = ",";
  }
  Value seps = arg_or(a, 2, "separators", Value::none());
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.l->size() != 2 || !(*seps.l)[0].is_str() || !(*seps.l)[1].is_str())
      fail(cn, "separators must be a pair of strings");
    o.item_sep = (*seps.l)[0].sv();
    o.key_sep = (*seps.l)[1].sv();
  }
  o.sort_keys = truthy(arg_or(a, 3, "sort_keys", Value::boolean(false)));
  std::string s = json_dumps(v, o);
  in.check_size(s.size(), cn.c_str());
  return Value::str(std::move(s));
}

Value string(Interp&, const std::string& name, const Value& v, CallArgs&) {  // string, safe
  if (name == "safe") return Value::str(py_str(v), true);
  return v.is_str() ? v : Value::str(py_str(v));
}

Value escape(Interp&, const std::string& name, const Value& v, CallArgs&) {  // escape, e, forceescape
  if (v.is_str() && v.safe && name != "forceescape") return v;
  return Value::str(html_escape(py_str(v)), true);
}

Value trim(Interp&, const std::string&, const Value& v, CallArgs& a) {
  Value chars = arg_or(a, 0, "chars", Value::none());
  const std::string* cs = chars.is_str() ? &chars.sv() : nullptr;
  return Value::str(py_strip(py_str(v), cs, true, true), v.safe);
}

Value change_case(Interp&, const std::string& name, const Value& v, CallArgs&) {  // upper lower capitalize title
  const std::string s = py_str(v);
  if (name == "upper") return Value::str(ascii_upper(s), v.safe);
  if (name == "lower") return Value::str(ascii_lower(s), v.safe);
  if (name == "capitalize") return Value::str(py_capitalize(s), v.safe);
  // title: jinja2 splits at runs of [-\s({\[<]+ and capitalises every piece
  std::string r;
  bool at_start = true;
  for (char c : s) {
    bool brk = c != '\0' && (std::strchr("-({[<", c) || py_isspace(static_cast<unsigned char>(c)));
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

Value replace(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  Value o = arg_or(a, 0, "old", Value::str("")), n = arg_or(a, 1, "new", Value::str(""));
  Value cnt = arg_or(a, 2, "count", Value::none());
  std::string r = py_replace(py_str(v), py_str(o), py_str(n), cnt.is_none() ? -1 : as_int(cnt, cn.c_str()));
  in.check_size(r.size(), cn.c_str());
  return Value::str(std::move(r));
}

Value indent(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  Value width = arg_or(a, 0, "width", Value::integer(4));
  bool first = truthy(arg_or(a, 1, "first", Value::boolean(false)));
  bool blank = truthy(arg_or(a, 2, "blank", Value::boolean(false)));
  std::string ind = width.is_str() ? width.sv() : std::string(size_t(std::max<int64_t>(0, as_int(width, cn.c_str()))), ' ');
  auto lines = split_lines(py_str(v) + "\n");
  std::string r;
  if (blank) {
    for (size_t k = 0; k < lines.size(); k++) r += (k ? "\n" + ind : "") + lines[k];
  } else {
    r = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); k++) r += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  if (first) r = ind + r;
  in.check_size(r.size(), cn.c_str());
  return Value::str(r, v.safe);
}

Value center(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  int64_t width = as_int(arg_or(a, 0, "width", Value::integer(80)), construct_of(name).c_str());
  return Value::str(py_justify(py_str(v), width, " ", 'c'));
}

Value wordcount(Interp&, const std::string&, const Value& v, CallArgs&) {
  return Value::integer(int64_t(py_split(py_str(v), Value::none(), -1).size()));
}

Value format(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  if (!a.kw.empty())
    fail(construct_of(name), a.pos.empty() ? "keyword arguments to |format are not supported"
                                           : "can't handle positional and keyword arguments at the same time");
  return Value::str(in.printf_format(py_str(v), Value::list(a.pos, true)), v.safe);
}

// jinja2's do_truncate (leeway: the default policy, 5).
Value truncate(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  const std::string str = py_str(v);
  auto cps = utf8_decode(str);
  const int64_t length = as_int(arg_or(a, 0, "length", Value::integer(255)), cn.c_str());
  const bool killwords = truthy(arg_or(a, 1, "killwords", Value::boolean(false)));
  const std::string end = py_str(arg_or(a, 2, "end", Value::str("...")));
  Value lw = arg_or(a, 3, "leeway", Value::none());
  const int64_t leeway = lw.is_none() ? 5 : as_int(lw, cn.c_str());
  const int64_t end_len = int64_t(utf8_decode(end).size());
  if (length < end_len) fail(cn, "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) fail(cn, "expected leeway >= 0, got " + std::to_string(leeway));
  if (int64_t(cps.size()) <= length + leeway) return Value::str(str);
  std::string head = utf8_encode(cps, 0, size_t(length - end_len));
  if (!killwords) {
    const size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head.resize(sp);
  }
  return Value::str(head + end);
}

Value filesizeformat(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  const bool binary = truthy(arg_or(a, 0, "binary", Value::boolean(false)));
  double bytes = 0;
  if (v.is_number()) {
    bytes = as_num(v);
  } else {
    const std::string t = py_str(v);
    char* e = nullptr;
    bytes = std::strtod(t.c_str(), &e);
    if (t.empty() || e == t.c_str() || *e != '\0') fail(construct_of(name), "could not convert string to float: '" + t + "'");
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

// jinja2's do_urlencode: quote(str, safe="/"); mappings and pairs as a query string.
Value urlencode(Interp& in, const std::string& name, const Value& v, CallArgs&) {
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
  auto pairs = v.is_dict() ? dict_pairs(v) : in.iterate(v, construct_of(name).c_str());
  for (const Value& p : pairs) {
    if (!p.is_list() || p.l->size() != 2) fail(construct_of(name), "expected (key, value) pairs");
    if (!out.empty()) out += '&';
    out += quote(py_str((*p.l)[0]), true) + "=" + quote(py_str((*p.l)[1]), true);
  }
  return Value::str(out);
}

// jinja2 3.1.6's do_xmlattr (no autoescape: a plain string).
Value xmlattr(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  if (!v.is_dict()) fail(construct_of(name), std::string("expected a mapping, got ") + type_name(v));
  const bool autospace = truthy(arg_or(a, 0, "autospace", Value::boolean(true)));
  std::string out;
  for (const auto& [k, x] : v.d->items) {
    if (x.is_none() || x.is_undefined()) continue;
    const std::string key = py_str(key_value(k));
    for (char c : key)
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '/' || c == '>' || c == '=')
        fail(construct_of(name), "Invalid character in attribute name: " + py_repr(Value::str(key)));
    if (!out.empty()) out += ' ';
    out += html_escape(key) + "=\"" + html_escape(py_str(x)) + "\"";
  }
  if (autospace && !out.empty()) out = " " + out;
  return Value::str(out);
}

Value pprint(Interp& in, const std::string& name, const Value& v, CallArgs&) {
  std::string s = py_pformat(v);
  in.check_size(s.size(), construct_of(name).c_str());
  return Value::str(std::move(s));
}

Value striptags(Interp&, const std::string&, const Value& v, CallArgs&) { return Value::str(strip_tags(py_str(v))); }

// jinja2's do_wordwrap: every line of the text wrapped on its own (textwrap.wrap), joined
// by wrapstring.
Value wordwrap(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  const int64_t width = as_int(arg_or(a, 0, "width", Value::integer(79)), cn.c_str());
  const bool break_long = truthy(arg_or(a, 1, "break_long_words", Value::boolean(true)));
  const Value wrap = arg_or(a, 2, "wrapstring", Value::none());
  const bool hyphens = truthy(arg_or(a, 3, "break_on_hyphens", Value::boolean(true)));
  if (width <= 0) fail(cn, "invalid width " + std::to_string(width) + " (must be > 0)");
  const std::string sep = wrap.is_none() ? "\n" : py_str(wrap);
  std::string out;
  bool first_line = true;
  for (const std::string& line : split_lines(py_str(v))) {
    if (!first_line) out += sep;
    first_line = false;
    bool first = true;
    for (const std::string& piece : py_wrap(line, width, break_long, hyphens)) {
      out += (first ? "" : sep) + piece;
      first = false;
    }
    in.check_size(out.size(), cn.c_str());
  }
  return Value::str(out);
}


namespace {

// \w on UTF-8 bytes: ASCII letters, digits, '_', and every byte of a non-ASCII character
// (urlize splits at whitespace first, so a non-ASCII character here is not a space).
bool word_byte(char c) { return is_word_cp(static_cast<unsigned char>(c)) || static_cast<unsigned char>(c) >= 0x80; }
bool host_byte(char c) { return word_byte(c) || c == '%' || c == '-'; }  // [\w%-]
size_t cp_count(std::string_view s) { return utf8_length(s); }
bool starts_with_ci(std::string_view s, std::string_view p) { return s.size() >= p.size() && ascii_lower(std::string(s.substr(0, p.size()))) == p; }
size_t count_of(std::string_view s, std::string_view x) {  // str.count: non-overlapping
  size_t n = 0;
  for (size_t p = s.find(x); p != std::string_view::npos; p = s.find(x, p + x.size())) n++;
  return n;
}

// After the host: (?::\d{1,5})? (?:[/?#]\S*)? and the end of the word.
bool url_rest(std::string_view s, size_t p) {
  if (p < s.size() && s[p] == ':') {
    size_t q = p + 1;
    while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) q++;
    if (q == p + 1 || q - p - 1 > 5) return false;
    p = q;
  }
  return p == s.size() || s[p] == '/' || s[p] == '?' || s[p] == '#';
}

// The dot-separated labels of the host name at p (a run of [\w%.-]); `end` is where it stops.
std::vector<std::string_view> host_labels(std::string_view s, size_t p, size_t& end) {
  end = p;
  while (end < s.size() && (host_byte(s[end]) || s[end] == '.')) end++;
  std::vector<std::string_view> labels;
  for (size_t b = p;; ) {
    size_t dot = s.substr(0, end).find('.', b);
    labels.push_back(s.substr(b, (dot == std::string_view::npos ? end : dot) - b));
    if (dot == std::string_view::npos) break;
    b = dot + 1;
  }
  return labels;
}

bool all_of_bytes(std::string_view s, bool (*pred)(char)) { return std::all_of(s.begin(), s.end(), pred); }

// jinja2's _http_re: scheme or www. + domain + a letters (or xn--) TLD; a bare domain with a
// common TLD; or scheme + IPv4 / IPv6 address; then an optional port and path.
bool is_url(std::string_view s) {
  const bool https = starts_with_ci(s, "https://"), scheme = https || starts_with_ci(s, "http://");
  const size_t p = https ? 8 : scheme ? 7 : starts_with_ci(s, "www.") ? 4 : 0;
  size_t end;
  if (p > 0) {  // (https?://|www\.)(([\w%-]+\.)+)?([a-z]{2,63}|xn--[\w%]{2,59})
    auto labels = host_labels(s, p, end);
    std::string_view tld = labels.back();
    bool ok = std::none_of(labels.begin(), labels.end() - 1, [](std::string_view l) { return l.empty(); });
    bool letters = tld.size() >= 2 && tld.size() <= 63 && all_of_bytes(tld, [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; });
    std::string_view idna = tld.substr(std::min<size_t>(4, tld.size()));
    bool xn = starts_with_ci(tld, "xn--") && cp_count(idna) >= 2 && cp_count(idna) <= 59 &&
              all_of_bytes(idna, [](char c) { return word_byte(c) || c == '%'; });
    if (ok && (letters || xn) && url_rest(s, end)) return true;
  }
  if (p == 0) {  // ([\w%-]{2,63}\.)+(com|net|int|edu|gov|org|info|mil)
    auto labels = host_labels(s, 0, end);
    static const char* common[] = {"com", "net", "int", "edu", "gov", "org", "info", "mil"};
    const std::string tld = ascii_lower(std::string(labels.back()));
    bool ok = labels.size() >= 2 && std::any_of(std::begin(common), std::end(common), [&](const char* t) { return tld == t; }) &&
              std::all_of(labels.begin(), labels.end() - 1, [](std::string_view l) { return cp_count(l) >= 2 && cp_count(l) <= 63; });
    if (ok && url_rest(s, end)) return true;
  }
  if (!scheme) return false;
  if (p < s.size() && s[p] == '[') {  // \[([\da-f]{0,4}:){2}([\da-f]{0,4}:?){1,6}]
    size_t q = p + 1;
    auto hex_run = [&](size_t max) {
      size_t n = 0;
      while (q < s.size() && n < max && std::isxdigit(static_cast<unsigned char>(s[q]))) q++, n++;
    };
    for (int k = 0; k < 2; k++) {
      hex_run(4);
      if (q >= s.size() || s[q] != ':') return false;
      q++;
    }
    int groups = 0;
    do {
      hex_run(4);
      if (q < s.size() && s[q] == ':') q++;
      groups++;
    } while (q < s.size() && (std::isxdigit(static_cast<unsigned char>(s[q])) || s[q] == ':') && groups < 6);
    return q < s.size() && s[q] == ']' && url_rest(s, q + 1);
  }
  auto labels = host_labels(s, p, end);  // IPv4: four groups of 1 to 3 digits
  return labels.size() == 4 && url_rest(s, end) && std::all_of(labels.begin(), labels.end(), [](std::string_view l) {
           return !l.empty() && l.size() <= 3 && all_of_bytes(l, [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
         });
}

// jinja2's _email_re: ^\S+@\w[\w.-]*\.\w+$
bool is_email(std::string_view s) {
  size_t at = s.rfind('@');
  if (at == std::string_view::npos || at == 0) return false;
  std::string_view dom = s.substr(at + 1);
  size_t dot = dom.rfind('.');
  return !dom.empty() && word_byte(dom[0]) && dot != std::string_view::npos && dot >= 1 && dot + 1 < dom.size() &&
         all_of_bytes(dom, [](char c) { return word_byte(c) || c == '.' || c == '-'; }) &&
         all_of_bytes(dom.substr(dot + 1), word_byte);
}

}  // namespace

// jinja2's do_urlize with its default policies (rel="noopener", no target, no extra schemes):
// the text HTML-escaped, and every word that looks like a URL or an e-mail address a link.
Value urlize(Interp& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string cn = construct_of(name);
  const Value limit = arg_or(a, 0, "trim_url_limit", Value::none());
  const bool nofollow = truthy(arg_or(a, 1, "nofollow", Value::boolean(false)));
  const Value target = arg_or(a, 2, "target", Value::none());
  const Value rel = arg_or(a, 3, "rel", Value::none());
  const Value schemes = arg_or(a, 4, "extra_schemes", Value::none());
  std::vector<std::string> rel_parts{"noopener"};
  if (nofollow) rel_parts.push_back("nofollow");
  if (truthy(rel))
    for (const Value& r : py_split(py_str(rel), Value::none(), -1)) rel_parts.push_back(r.sv());
  std::sort(rel_parts.begin(), rel_parts.end());
  rel_parts.erase(std::unique(rel_parts.begin(), rel_parts.end()), rel_parts.end());
  std::string rel_s;
  for (const auto& r : rel_parts) rel_s += (rel_s.empty() ? "" : " ") + r;
  const std::string attrs = " rel=\"" + html_escape(rel_s) + "\"" + (truthy(target) ? " target=\"" + html_escape(py_str(target)) + "\"" : "");
  std::vector<std::string> extra;
  if (!schemes.is_none())
    for (const Value& sc : in.iterate(schemes, cn.c_str())) {
      const std::string s = py_str(sc);
      size_t colon = s.find(':'), slashes = colon == std::string::npos ? 0 : s.size() - colon - 1;
      if (colon == std::string::npos || cp_count(s.substr(0, colon)) < 2 || slashes > 2 ||
          s.find_first_not_of('/', colon + 1) != std::string::npos ||
          !all_of_bytes(std::string_view(s).substr(0, colon), [](char c) { return word_byte(c) || c == '.' || c == '+' || c == '-'; }))
        fail(cn, py_repr(Value::str(s)) + " is not a valid URI scheme prefix.");
      extra.push_back(s);
    }
  auto trim_url = [&](const std::string& x) {
    if (limit.is_none()) return x;
    auto cps = utf8_decode(x);
    const int64_t n = as_int(limit, cn.c_str());
    return int64_t(cps.size()) > n ? utf8_encode(cps, 0, size_t(std::max<int64_t>(0, n))) + "..." : x;
  };

  const std::string text = v.is_str() && v.safe ? v.sv() : html_escape(py_str(v));
  auto cps = utf8_decode(text);
  std::string out;
  for (size_t b = 0; b < cps.size();) {
    size_t e = b;
    const bool space = py_isspace(cps[b]);
    while (e < cps.size() && py_isspace(cps[e]) == space) e++;
    std::string word = utf8_encode(cps, b, e);
    b = e;
    if (space) {
      out += word;
      continue;
    }
    std::string_view w = word;
    size_t h = 0;  // head: ^([(<]|&lt;)+
    while (h < w.size() && (w[h] == '(' || w[h] == '<' || w.substr(h, 4) == "&lt;")) h += w[h] == '&' ? 4 : 1;
    size_t t = w.size();  // tail: ([)>.,\n]|&gt;)+$
    while (t > h && (std::strchr(")>.,\n", w[t - 1]) || (t - h >= 4 && w.substr(t - 4, 4) == "&gt;"))) t -= w[t - 1] == ';' ? 4 : 1;
    std::string head(w.substr(0, h)), middle(w.substr(h, t - h)), tail(w.substr(t));
    for (auto [open, close] : {std::pair<std::string_view, std::string_view>{"(", ")"}, {"<", ">"}, {"&lt;", "&gt;"}}) {
      const size_t opens = count_of(middle, open);
      if (opens <= count_of(middle, close)) continue;
      for (size_t k = std::min(opens, count_of(tail, close)); k > 0; k--) {  // move closers from the tail
        size_t cut = tail.find(close) + close.size();
        middle += tail.substr(0, cut);
        tail.erase(0, cut);
      }
    }
    if (is_url(middle)) {
      const bool has_scheme = middle.starts_with("https://") || middle.starts_with("http://");
      middle = "<a href=\"" + (has_scheme ? "" : std::string("https://")) + middle + "\"" + attrs + ">" + trim_url(middle) + "</a>";
    } else if (middle.starts_with("mailto:") && is_email(std::string_view(middle).substr(7))) {
      middle = "<a href=\"" + middle + "\">" + middle.substr(7) + "</a>";
    } else if (middle.find('@') != std::string::npos && !middle.starts_with("www.") && !middle.starts_with("@") &&
               middle.find(':') == std::string::npos && is_email(middle)) {
      middle = "<a href=\"mailto:" + middle + "\">" + middle + "</a>";
    } else {
      for (const std::string& sc : extra)
        if (middle != sc && middle.starts_with(sc)) middle = "<a href=\"" + middle + "\"" + attrs + ">" + middle + "</a>";
    }
    out += head + middle + tail;
    in.check_size(out.size(), cn.c_str());
  }
  return Value::str(out);
}

}  // namespace kiln::chat::jinja::text_filters
