// chat/json_schema.cpp — JSON Schema → GBNF (see json_schema.h).
#include "chat/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace kiln::chat {

namespace {

// Shared building blocks. Whitespace is bounded so that a model cannot pad forever.
const char* kPrimitives[][2] = {
    {"ws", R"(| " " | "\n" [ \t]{0,20})"},
    {"json-char", R"([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))"},
    {"json-string", R"("\"" json-char* "\"")"},
    {"json-int", R"("-"? ("0" | [1-9] [0-9]{0,15}))"},
    {"json-number", R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?)"},
    {"json-bool", R"("true" | "false")"},
    {"json-null", R"("null")"},
    {"json-value", R"(json-object | json-array | json-string | json-number | json-bool | json-null)"},
    {"json-object", R"("{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}")"},
    {"json-array", R"("[" ws ( json-value ws ( "," ws json-value ws )* )? "]")"},
    {"json-date", R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))"},
    {"json-time", R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
    {"json-uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
};

// Keywords that only annotate (no effect on validity).
const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "discriminator",
                                            "contentMediaType", "strict", "example", "$anchor"};

std::string sanitize(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(uint8_t(c)) || c == '-') ? c : '-';
  if (o.empty()) o = "x";
  return o;
}

std::string gbnf_literal(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"') o += "\\\"";
    else if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20 || c == 0x7F) o += fmt::format("\\x{:02X}", c);
    else o += char(c);
  }
  return o + "\"";
}

// ---- integer ranges -------------------------------------------------------------------------
// GBNF for the decimal numbers in [a, b], a <= b, both >= 0, given as digit strings of equal length.
std::string digits_range(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a.size() == 1) return a[0] == b[0] ? fmt::format("\"{}\"", a[0]) : fmt::format("[{}-{}]", a[0], b[0]);
  if (a[0] == b[0]) return fmt::format("\"{}\" {}", a[0], digits_range(a.substr(1), b.substr(1)));
  const size_t rest = a.size() - 1;
  std::vector<std::string> alts;
  alts.push_back(fmt::format("\"{}\" ({})", a[0], digits_range(a.substr(1), std::string(rest, '9'))));
  if (a[0] + 1 <= b[0] - 1)
    alts.push_back(fmt::format("[{}-{}] [0-9]{{{}}}", char(a[0] + 1), char(b[0] - 1), rest));
  alts.push_back(fmt::format("\"{}\" ({})", b[0], digits_range(std::string(rest, '0'), b.substr(1))));
  std::string o;
  for (auto& x : alts) o += (o.empty() ? "" : " | ") + x;
  return "(" + o + ")";
}

// Non-negative integers in [lo, hi] (hi < 0: unbounded, up to 16 digits) without leading zeros.
std::string nonneg_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  const std::string los = std::to_string(lo);
  const size_t max_len = hi < 0 ? std::max<size_t>(16, los.size()) : std::to_string(hi).size();
  for (size_t len = los.size(); len <= max_len; ++len) {
    std::string a = los;
    if (len != los.size()) {
      a.assign(len, '0');
      a[0] = '1';
    }
    std::string b = std::string(len, '9');
    if (hi >= 0 && len == max_len) b = std::to_string(hi);
    if (len == 1 && a == "0" && b != "0") {
      alts.push_back(digits_range(a, b));
      continue;
    }
    if (a.size() == b.size() && a <= b) alts.push_back(digits_range(a, b));
  }
  std::string o;
  for (auto& x : alts) o += (o.empty() ? "" : " | ") + x;
  return "(" + o + ")";
}

}  // namespace

struct GbnfBuilder::Impl {
  std::vector<std::pair<std::string, std::string>> rules;  // in order of creation
  std::map<std::string, std::string> by_body;              // body → name (reuse identical rules)
  std::set<std::string> names;
  std::set<std::string> prims;
  const ojson* root_schema = nullptr;
  std::string root_field;
  std::map<std::string, std::string> ref_rules;  // "#/$defs/X" → rule name
  std::map<std::string, std::string> overrides;  // primitive → replacement body (override_primitive)

  void use_prim(const std::string& name) {
    if (!prims.insert(name).second) return;
    for (auto& p : kPrimitives)
      if (name == p[0]) {
        // json-value and friends reference others.
        auto ov = overrides.find(name);
        const std::string body = ov != overrides.end() ? ov->second : p[1];
        for (auto& q : kPrimitives)
          if (std::string(q[0]) != name && body.find(q[0]) != std::string::npos) use_prim(q[0]);
        rules.push_back({name, body});
        names.insert(name);
      }
  }
  std::string unique_name(const std::string& base) {
    std::string n = sanitize(base);
    if (!names.count(n)) return n;
    for (int i = 2;; ++i)
      if (!names.count(fmt::format("{}-{}", n, i))) return fmt::format("{}-{}", n, i);
  }
  // A rule with this body (an existing one if identical).
  std::string rule(const std::string& base, const std::string& body) {
    if (auto it = by_body.find(body); it != by_body.end()) return it->second;
    const std::string n = unique_name(base);
    names.insert(n);
    rules.push_back({n, body});
    by_body[body] = n;
    return n;
  }

  RequestError fail(const std::string& path, const std::string& msg) { return RequestError{path, msg}; }

  // The GBNF expression for `s` at JSON path `path`; `name` is the base for helper rules.
  RequestResult<std::string> visit(const ojson& s, const std::string& path, const std::string& name);
  RequestResult<std::string> visit_object(const ojson& s, const std::string& path, const std::string& name);
  RequestResult<std::string> visit_array(const ojson& s, const std::string& path, const std::string& name);
  RequestResult<std::string> visit_string(const ojson& s, const std::string& path, const std::string& name);
  RequestResult<std::string> visit_integer(const ojson& s, const std::string& path);
  RequestResult<std::string> visit_ref(const std::string& ref, const std::string& path);
};

// Regular expressions (JSON Schema "pattern") → GBNF over the JSON-escaped text of the string.
RequestResult<std::string> pattern_to_gbnf(const std::string& re, const std::string& path);

RequestResult<std::string> GbnfBuilder::Impl::visit_ref(const std::string& ref, const std::string& path) {
  if (auto it = ref_rules.find(ref); it != ref_rules.end()) return it->second;
  const ojson* target = nullptr;
  std::string tname;
  if (ref == "#") {
    target = root_schema;
    tname = "root-ref";
  } else if (ref.rfind("#/$defs/", 0) == 0 || ref.rfind("#/definitions/", 0) == 0) {
    const bool defs = ref[2] == '$';
    const std::string key = ref.substr(defs ? 8 : 14);
    const char* sect = defs ? "$defs" : "definitions";
    if (root_schema->is_object() && root_schema->contains(sect) && (*root_schema)[sect].is_object() &&
        (*root_schema)[sect].contains(key))
      target = &(*root_schema)[sect][key];
    tname = key;
  } else {
    return fail(path, fmt::format("$ref '{}' is not supported (only '#', '#/$defs/NAME' and '#/definitions/NAME')", ref));
  }
  if (!target) return fail(path, fmt::format("$ref '{}' points to nothing", ref));
  // Reserve the rule name first: the definition may refer to itself.
  const std::string n = unique_name(tname);
  names.insert(n);
  ref_rules[ref] = n;
  const size_t slot = rules.size();
  rules.push_back({n, ""});
  auto body = visit(*target, root_field + (ref == "#" ? "" : ref.substr(1)), n);
  if (!body.ok()) return body.error();
  rules[slot].second = *body;
  return n;
}

RequestResult<std::string> GbnfBuilder::Impl::visit(const ojson& s, const std::string& path, const std::string& name) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) return fail(path, "the schema 'false' accepts nothing");
    use_prim("json-value");
    return std::string("json-value");
  }
  if (!s.is_object()) return fail(path, fmt::format("a schema must be an object or a boolean, got {}", s.dump()));
  // Keywords we cannot express: refused by name.
  static const char* unsupported[] = {"not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
                                      "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
                                      "contains", "minContains", "maxContains", "multipleOf", "minProperties",
                                      "maxProperties", "$dynamicRef", "$recursiveRef", "contentEncoding"};
  for (const char* k : unsupported)
    if (s.contains(k)) return fail(path + "." + k, fmt::format("the JSON Schema keyword '{}' is not supported", k));
  if (auto it = s.find("uniqueItems"); it != s.end() && !(it->is_boolean() && !it->get<bool>()))
    return fail(path + ".uniqueItems", "the JSON Schema keyword 'uniqueItems' is not supported");

  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) return fail(path + ".$ref", "expected a string");
    return visit_ref(it->get<std::string>(), path + ".$ref");
  }
  if (auto it = s.find("const"); it != s.end()) return gbnf_literal(it->dump());
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array() || it->empty()) return fail(path + ".enum", "expected a non-empty array");
    std::string o;
    for (const auto& v : *it) o += (o.empty() ? "" : " | ") + gbnf_literal(v.dump());
    return "(" + o + ")";
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_array() || it->empty()) return fail(path + "." + k, "expected a non-empty array of schemas");
      std::string o;
      for (size_t i = 0; i < it->size(); ++i) {
        // Sibling keywords (e.g. "type" next to anyOf) would intersect; refuse rather than guess.
        auto sub = visit((*it)[i], fmt::format("{}.{}[{}]", path, k, i), fmt::format("{}-{}", name, i));
        if (!sub.ok()) return sub.error();
        o += (o.empty() ? "" : " | ") + *sub;
      }
      for (auto& [key, v] : s.items())
        if (key != k && !kAnnotations.count(key))
          return fail(path + "." + key, fmt::format("'{}' next to '{}' is not supported (move it into each branch)", key, k));
      return rule(name, o);
    }
  }
  if (auto it = s.find("allOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) return fail(path + ".allOf", "expected a non-empty array of schemas");
    if (it->size() == 1) return visit((*it)[0], path + ".allOf[0]", name);
    // Several object schemas (no $ref): their properties and required lists merged.
    ojson merged = {{"type", "object"}, {"properties", ojson::object()}, {"required", ojson::array()}};
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& b = (*it)[i];
      const bool objectish = b.is_object() && !b.contains("$ref") && (b.value("type", "object") == "object") &&
                             !b.contains("anyOf") && !b.contains("oneOf") && !b.contains("allOf");
      if (!objectish) return fail(fmt::format("{}.allOf[{}]", path, i), "allOf is supported for one schema, or for object schemas to merge");
      if (b.contains("properties"))
        for (auto& [k, v] : b["properties"].items()) merged["properties"][k] = v;
      if (b.contains("required"))
        for (auto& r : b["required"]) merged["required"].push_back(r);
      if (b.contains("additionalProperties")) merged["additionalProperties"] = b["additionalProperties"];
    }
    return visit(merged, path + ".allOf", name);
  }

  ojson types = s.contains("type") ? s["type"] : ojson();
  if (types.is_null()) {
    // Infer from the keywords present.
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) types = "object";
    else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) types = "array";
    else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) types = "string";
    else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) types = "number";
  }
  if (s.value("nullable", false)) {
    ojson t = types.is_array() ? types : ojson::array({types.is_null() ? ojson("any") : types});
    t.push_back("null");
    types = t;
  }
  if (types.is_null() || types == "any") {
    use_prim("json-value");
    return std::string("json-value");
  }
  if (types.is_array()) {
    if (types.empty()) return fail(path + ".type", "expected a non-empty array of type names");
    std::string o;
    for (const auto& t : types) {
      ojson one = s;
      one["type"] = t;
      one.erase("nullable");
      auto sub = visit(one, path, fmt::format("{}-{}", name, t.is_string() ? t.get<std::string>() : "x"));
      if (!sub.ok()) return sub.error();
      o += (o.empty() ? "" : " | ") + *sub;
    }
    return rule(name, o);
  }
  if (!types.is_string()) return fail(path + ".type", fmt::format("expected a type name, got {}", types.dump()));
  const std::string t = types.get<std::string>();
  if (t == "object") return visit_object(s, path, name);
  if (t == "array") return visit_array(s, path, name);
  if (t == "string") return visit_string(s, path, name);
  if (t == "integer") return visit_integer(s, path);
  if (t == "number") {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k)) return fail(path + "." + k, fmt::format("'{}' on type 'number' is not supported (it is on 'integer')", k));
    use_prim("json-number");
    return std::string("json-number");
  }
  if (t == "boolean") {
    use_prim("json-bool");
    return std::string("json-bool");
  }
  if (t == "null") {
    use_prim("json-null");
    return std::string("json-null");
  }
  return fail(path + ".type", fmt::format("unknown type '{}'", t));
}

RequestResult<std::string> GbnfBuilder::Impl::visit_object(const ojson& s, const std::string& path, const std::string& name) {
  use_prim("ws");
  const ojson props = s.value("properties", ojson::object());
  if (!props.is_object()) return fail(path + ".properties", "expected an object");
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return fail(path + ".required", "expected an array of property names");
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string()) return fail(fmt::format("{}.required[{}]", path, i), "expected a string");
      const std::string r = (*it)[i].get<std::string>();
      if (!props.contains(r) && props.size() > 0)
        return fail(fmt::format("{}.required[{}]", path, i), fmt::format("'{}' is not among the properties", r));
      required.insert(r);
    }
  }
  const ojson addl = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
  if (props.empty()) {
    if (!required.empty()) return fail(path + ".required", "required properties without 'properties' are not supported");
    if (addl.is_boolean() && !addl.get<bool>()) return gbnf_literal("{") + " ws " + gbnf_literal("}");
    // A map: any keys, values of the additionalProperties schema.
    std::string v;
    if (addl.is_boolean()) {
      use_prim("json-value");
      v = "json-value";
    } else {
      auto sub = visit(addl, path + ".additionalProperties", name + "-value");
      if (!sub.ok()) return sub.error();
      v = *sub;
    }
    use_prim("json-string");
    const std::string kv = rule(name + "-kv", "json-string ws \":\" ws " + v + " ws");
    return rule(name, fmt::format("\"{{\" ws ( {} ( \",\" ws {} )* )? \"}}\"", kv, kv));
  }
  if (!addl.is_boolean() && !addl.is_object())
    return fail(path + ".additionalProperties", "expected a boolean or a schema");
  // Properties in the schema's order; optional ones may be skipped. tail[i][first]: properties
  // i.. where `first` means nothing was written yet (no leading comma).
  std::vector<std::pair<std::string, std::string>> kvs;  // (key, rule)
  for (auto& [k, v] : props.items()) {
    auto sub = visit(v, path + ".properties." + k, name + "-" + k);
    if (!sub.ok()) return sub.error();
    kvs.push_back({k, rule(name + "-" + k + "-kv", gbnf_literal(ojson(k).dump()) + " ws \":\" ws " + *sub)});
  }
  const size_t n = kvs.size();
  std::vector<std::array<std::string, 2>> tail(n + 1);
  tail[n] = {"", ""};
  for (size_t i = n; i-- > 0;) {
    for (int first = 0; first < 2; ++first) {
      const std::string lead = first ? "" : "\",\" ws ";
      const std::string take = lead + kvs[i].second + " ws " + tail[i + 1][0];
      std::string body = required.count(kvs[i].first) ? take : "(" + take + ") | " + (tail[i + 1][first].empty() ? "\"\"" : tail[i + 1][first]);
      tail[i][size_t(first)] = rule(fmt::format("{}-tail{}-{}", name, first ? "-first" : "", i), body);
    }
  }
  return rule(name, "\"{\" ws " + tail[0][1] + " \"}\"");
}

RequestResult<std::string> GbnfBuilder::Impl::visit_array(const ojson& s, const std::string& path, const std::string& name) {
  use_prim("ws");
  int64_t lo = 0, hi = -1;
  for (const char* k : {"minItems", "maxItems"}) {
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1000)
        return fail(path + "." + k, "expected an integer in [0, 1000]");
      (k[1] == 'i' ? lo : hi) = it->get<int64_t>();
    }
  }
  if (hi >= 0 && hi < lo) return fail(path + ".maxItems", "is below minItems");
  std::vector<std::string> prefix;
  if (auto it = s.find("prefixItems"); it != s.end()) {
    if (!it->is_array()) return fail(path + ".prefixItems", "expected an array of schemas");
    for (size_t i = 0; i < it->size(); ++i) {
      auto sub = visit((*it)[i], fmt::format("{}.prefixItems[{}]", path, i), fmt::format("{}-{}", name, i));
      if (!sub.ok()) return sub.error();
      prefix.push_back(*sub);
    }
  }
  std::string item;
  bool items_allowed = true;
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_array()) return fail(path + ".items", "an array of schemas (draft 4 tuples) is not supported; use prefixItems");
    if (it->is_boolean() && !it->get<bool>()) items_allowed = false;
    else {
      auto sub = visit(*it, path + ".items", name + "-item");
      if (!sub.ok()) return sub.error();
      item = *sub;
    }
  } else {
    use_prim("json-value");
    item = "json-value";
  }
  if (!prefix.empty()) {
    // Tuples: the prefix items in order (all of them; fewer would be valid but not useful), then
    // items if allowed.
    if (lo > int64_t(prefix.size()) || (hi >= 0 && hi < int64_t(prefix.size())))
      return fail(path + ".minItems", "minItems/maxItems with prefixItems are supported only around the tuple length");
    std::string body = "\"[\" ws ";
    for (size_t i = 0; i < prefix.size(); ++i) body += (i ? "\",\" ws " : "") + prefix[i] + " ws ";
    if (items_allowed && hi != int64_t(prefix.size())) body += "( \",\" ws " + item + " ws )* ";
    return rule(name, body + "\"]\"");
  }
  if (!items_allowed) return rule(name, "\"[\" ws \"]\"");
  const std::string it_ws = rule(name + "-elem", item + " ws");
  std::string body = "\"[\" ws ";
  if (lo == 0 && hi == 0) return rule(name, body + "\"]\"");
  std::string more;  // repetitions after the first element
  const int64_t mlo = std::max<int64_t>(0, lo - 1);
  if (hi < 0) more = fmt::format("( \",\" ws {} ){{{},}}", it_ws, mlo);
  else more = fmt::format("( \",\" ws {} ){{{},{}}}", it_ws, mlo, hi - 1);
  const std::string seq = it_ws + " " + more;
  body += lo == 0 ? "( " + seq + " )? " : seq + " ";
  return rule(name, body + "\"]\"");
}

RequestResult<std::string> GbnfBuilder::Impl::visit_string(const ojson& s, const std::string& path, const std::string& name) {
  use_prim("json-char");
  int64_t lo = 0, hi = -1;
  for (const char* k : {"minLength", "maxLength"}) {
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1000)
        return fail(path + "." + k, "expected an integer in [0, 1000]");
      (k[1] == 'i' ? lo : hi) = it->get<int64_t>();
    }
  }
  if (hi >= 0 && hi < lo) return fail(path + ".maxLength", "is below minLength");
  const bool has_len = s.contains("minLength") || s.contains("maxLength");
  if (auto it = s.find("format"); it != s.end()) {
    if (!it->is_string()) return fail(path + ".format", "expected a string");
    const std::string f = it->get<std::string>();
    static const std::map<std::string, std::string> formats = {
        {"date", "json-date"}, {"time", "json-time"}, {"date-time", "json-date \"T\" json-time"}, {"uuid", "json-uuid"}};
    auto fm = formats.find(f);
    if (fm == formats.end()) return fail(path + ".format", fmt::format("format '{}' is not supported (date, time, date-time, uuid are)", f));
    if (s.contains("pattern") || has_len) return fail(path + ".format", "format together with pattern/minLength/maxLength is not supported");
    for (const char* p : {"json-date", "json-time", "json-uuid"})
      if (fm->second.find(p) != std::string::npos) use_prim(p);
    return rule(name, "\"\\\"\" " + fm->second + " \"\\\"\"");
  }
  if (auto it = s.find("pattern"); it != s.end()) {
    if (!it->is_string()) return fail(path + ".pattern", "expected a string");
    if (has_len) return fail(path + ".pattern", "pattern together with minLength/maxLength is not supported");
    auto body = pattern_to_gbnf(it->get<std::string>(), path + ".pattern");
    if (!body.ok()) return body.error();
    return rule(name, "\"\\\"\" (" + *body + ") \"\\\"\"");
  }
  if (!has_len) {
    use_prim("json-string");
    return std::string("json-string");
  }
  return rule(name, hi < 0 ? fmt::format("\"\\\"\" json-char{{{},}} \"\\\"\"", lo) : fmt::format("\"\\\"\" json-char{{{},{}}} \"\\\"\"", lo, hi));
}

RequestResult<std::string> GbnfBuilder::Impl::visit_integer(const ojson& s, const std::string& path) {
  // Bounds as integers: minimum / exclusiveMinimum (a number, or draft 4's boolean modifier).
  std::optional<int64_t> lo, hi;
  auto num = [&](const char* k, std::optional<double>& out) -> std::optional<RequestError> {
    if (auto it = s.find(k); it != s.end() && !it->is_boolean()) {
      if (!it->is_number() || std::fabs(it->get<double>()) > 1e15) return fail(path + "." + k, "expected a number within ±1e15");
      out = it->get<double>();
    }
    return std::nullopt;
  };
  std::optional<double> mn, mx, xmn, xmx;
  for (auto [k, o] : {std::pair<const char*, std::optional<double>*>{"minimum", &mn}, {"maximum", &mx},
                      {"exclusiveMinimum", &xmn}, {"exclusiveMaximum", &xmx}})
    if (auto e = num(k, *o)) return *e;
  if (s.value("exclusiveMinimum", ojson(false)) == ojson(true) && mn) xmn = mn, mn.reset();
  if (s.value("exclusiveMaximum", ojson(false)) == ojson(true) && mx) xmx = mx, mx.reset();
  if (mn) lo = int64_t(std::ceil(*mn));
  if (xmn) lo = std::max(lo.value_or(INT64_MIN), int64_t(std::floor(*xmn)) + 1);
  if (mx) hi = int64_t(std::floor(*mx));
  if (xmx) hi = std::min(hi.value_or(INT64_MAX), int64_t(std::ceil(*xmx)) - 1);
  if (!lo && !hi) {
    use_prim("json-int");
    return std::string("json-int");
  }
  if (lo && hi && *lo > *hi) return fail(path + ".maximum", "no integer lies within the bounds");
  std::vector<std::string> alts;
  // Negative part: "-" then magnitudes in [max(1, -hi), -lo] (unbounded when lo is absent).
  if (!lo || *lo < 0) {
    const int64_t mag_lo = hi && *hi < 0 ? -*hi : 1;
    const int64_t mag_hi = lo ? -*lo : -1;
    alts.push_back("\"-\" " + nonneg_range(mag_lo, mag_hi));
  }
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo && *lo > 0 ? *lo : 0, hi ? *hi : -1));
  std::string o;
  for (auto& x : alts) o += (o.empty() ? "" : " | ") + x;
  return rule("int-range", o);
}

// ------------------------------------------------------------------------------------------------

GbnfBuilder::GbnfBuilder() : impl_(std::make_unique<Impl>()) {}
GbnfBuilder::~GbnfBuilder() = default;
GbnfBuilder::GbnfBuilder(GbnfBuilder&&) noexcept = default;

RequestResult<std::string> GbnfBuilder::add_schema(const ojson& schema, const std::string& field, const std::string& prefix,
                                                   const ojson* root) {
  impl_->root_schema = root ? root : &schema;
  impl_->root_field = field;
  impl_->ref_rules.clear();  // $refs are relative to each schema
  impl_->use_prim("ws");
  auto e = impl_->visit(schema, field, prefix);
  if (!e.ok()) return e.error();
  const std::string n = impl_->unique_name(prefix);
  impl_->names.insert(n);
  impl_->rules.push_back({n, *e});
  return n;
}

void GbnfBuilder::add_rule(const std::string& name, const std::string& body) {
  impl_->names.insert(name);
  impl_->rules.push_back({name, body});
}

void GbnfBuilder::override_primitive(const std::string& name, const std::string& body) {
  KILN_CHECK(!impl_->prims.count(name), "GbnfBuilder::override_primitive('{}') after its first use", name);
  impl_->overrides[name] = body;
}

std::string GbnfBuilder::primitive(const std::string& name) {
  impl_->use_prim(name);
  KILN_CHECK(impl_->names.count(name), "GbnfBuilder::primitive: no primitive '{}'", name);
  return name;
}

std::string GbnfBuilder::literal(std::string_view s) { return gbnf_literal(s); }

std::string GbnfBuilder::text() const {
  std::string o;
  for (auto& [n, b] : impl_->rules) o += n + " ::= " + b + "\n";
  return o;
}

RequestResult<std::string> json_schema_to_gbnf(const ojson& schema, const std::string& field) {
  GbnfBuilder b;
  auto top = b.add_schema(schema, field, "schema");
  if (!top.ok()) return top.error();
  // Nothing after the value: the request stops as soon as the JSON text is complete.
  b.add_rule("root", *top);
  return b.text();
}

std::string json_object_gbnf() {
  GbnfBuilder b;
  auto top = b.add_schema(ojson{{"type", "object"}}, "response_format", "object");
  b.add_rule("root", *top);
  return b.text();
}

// ------------------------------------------------------------------------------------------------
// pattern → GBNF. The pattern constrains the decoded string; the grammar writes its JSON text, so
// characters JSON must escape are written escaped (a quote as \", a backslash as two), control characters are
// never generated (classes exclude them), and an unanchored pattern may be surrounded by any text.

namespace {

using CRange = std::pair<uint32_t, uint32_t>;

class RegexToGbnf {
 public:
  RegexToGbnf(std::string re, std::string path) : r_(std::move(re)), path_(std::move(path)) {}

  RequestResult<std::string> run() {
    bool head = !r_.empty() && r_[0] == '^';
    if (head) i_ = 1;
    bool tail = false;
    std::string end = r_;
    if (r_.size() > i_ && r_.back() == '$' && (r_.size() < 2 || r_[r_.size() - 2] != '\\')) {
      tail = true;
      r_.pop_back();
    }
    std::string body;
    if (auto e = alternates(body)) return *e;
    if (i_ != r_.size()) return fail(fmt::format("unexpected '{}' at offset {}", r_[i_], i_));
    const std::string any = "([^\"\\\\\\x7F\\x00-\\x1F])*";
    return (head ? "" : any + " ") + "(" + body + ")" + (tail ? "" : " " + any);
  }

 private:
  std::string r_, path_;
  size_t i_ = 0;

  RequestError fail(const std::string& m) const { return RequestError{path_, "pattern: " + m}; }
  bool eof() const { return i_ >= r_.size(); }

  std::optional<RequestError> alternates(std::string& out) {
    std::string seq;
    if (auto e = sequence(seq)) return e;
    out = seq.empty() ? "\"\"" : seq;
    while (!eof() && r_[i_] == '|') {
      ++i_;
      seq.clear();
      if (auto e = sequence(seq)) return e;
      out += " | " + (seq.empty() ? "\"\"" : seq);
    }
    return std::nullopt;
  }

  std::optional<RequestError> sequence(std::string& out) {
    while (!eof() && r_[i_] != '|' && r_[i_] != ')') {
      std::string atom;
      if (auto e = parse_atom(atom)) return e;
      // quantifier
      if (!eof() && (r_[i_] == '*' || r_[i_] == '+' || r_[i_] == '?')) {
        atom = "(" + atom + ")" + r_[i_];
        ++i_;
      } else if (!eof() && r_[i_] == '{') {
        const size_t close = r_.find('}', i_);
        if (close == std::string::npos) return fail("unterminated {m,n}");
        const std::string q = r_.substr(i_, close - i_ + 1);
        for (char c : q.substr(1, q.size() - 2))
          if (!(std::isdigit(uint8_t(c)) || c == ',')) return fail(fmt::format("bad quantifier {}", q));
        atom = "(" + atom + ")" + q;
        i_ = close + 1;
      }
      if (!eof() && r_[i_] == '?') ++i_;  // lazy: the same language
      if (!eof() && (r_[i_] == '*' || r_[i_] == '+' || r_[i_] == '{')) return fail("nested quantifiers are not supported");
      out += (out.empty() ? "" : " ") + atom;
    }
    return std::nullopt;
  }

  // One UTF-8 character of the pattern at i_.
  uint32_t take_char() {
    const uint8_t c = uint8_t(r_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n && i_ + size_t(k) < r_.size(); ++k) v = (v << 6) | (uint8_t(r_[i_ + size_t(k)]) & 0x3F);
    i_ += size_t(n);
    return v;
  }

  static std::string lit(uint32_t c) {
    if (c == '"') return "\"\\\\\\\"\"";     // the two bytes \"
    if (c == '\\') return "\"\\\\\\\\\"";  // the two bytes \\ (json)
    if (c < 0x20 || c == 0x7F) return fmt::format("\"\\\\u{:04x}\"", c);
    return fmt::format("[\\U{:08X}]", c);
  }
  // A set of codepoints as a GBNF class, minus what a JSON string must escape.
  static std::string cls(std::vector<CRange> r, bool negate) {
    std::sort(r.begin(), r.end());
    std::vector<CRange> m;
    for (auto x : r) {
      if (!m.empty() && x.first <= m.back().second + 1) m.back().second = std::max(m.back().second, x.second);
      else m.push_back(x);
    }
    if (negate) {
      std::vector<CRange> c;
      uint32_t next = 0;
      for (auto [lo, hi] : m) {
        if (lo > next) c.push_back({next, lo - 1});
        next = hi + 1;
      }
      if (next <= 0x10FFFF) c.push_back({next, 0x10FFFF});
      m = c;
    }
    std::string o = "[";
    auto add = [&](uint32_t lo, uint32_t hi) {
      if (lo > hi) return;
      o += fmt::format("\\U{:08X}", lo);
      if (hi > lo) o += fmt::format("-\\U{:08X}", hi);
    };
    for (auto [lo, hi] : m) {
      // remove 0x00-0x1F, '"' (0x22), '\\' (0x5C), 0x7F
      std::vector<CRange> cut = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, 0x10FFFF}};
      for (auto [a, b] : cut) add(std::max(lo, a), std::min(hi, b));
    }
    if (o == "[") return "[^\\x00-\\U0010FFFF]";  // matches nothing
    return o + "]";
  }

  std::optional<RequestError> class_escape(char e, std::vector<CRange>& r, bool& neg) {
    neg = false;
    switch (e) {
      case 'd': r = {{'0', '9'}}; return std::nullopt;
      case 'D': r = {{'0', '9'}}; neg = true; return std::nullopt;
      case 'w': r = {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}}; return std::nullopt;
      case 'W': r = {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}}; neg = true; return std::nullopt;
      case 's': r = {{' ', ' '}}; return std::nullopt;  // \t \n… would be JSON escapes: not generated
      case 'S': r = {{' ', ' '}, {'\t', '\r'}}; neg = true; return std::nullopt;
      default: return fail(fmt::format("escape \\{} is not supported", e));
    }
  }

  std::optional<RequestError> parse_atom(std::string& out) {
    const char c = r_[i_];
    if (c == '(') {
      ++i_;
      if (!eof() && r_[i_] == '?') {
        if (i_ + 1 < r_.size() && r_[i_ + 1] == ':') i_ += 2;
        else return fail("lookaround and named groups are not supported");
      }
      std::string inner;
      if (auto e = alternates(inner)) return e;
      if (eof() || r_[i_] != ')') return fail("unbalanced parenthesis");
      ++i_;
      out = "(" + inner + ")";
      return std::nullopt;
    }
    if (c == '[') {
      ++i_;
      bool neg = false;
      if (!eof() && r_[i_] == '^') {
        neg = true;
        ++i_;
      }
      std::vector<CRange> r;
      bool first = true;
      while (!eof() && (r_[i_] != ']' || first)) {
        first = false;
        uint32_t lo;
        if (r_[i_] == '\\') {
          if (i_ + 1 >= r_.size()) return fail("dangling backslash");
          const char e = r_[i_ + 1];
          i_ += 2;
          if (std::string("dDwWsS").find(e) != std::string::npos) {
            std::vector<CRange> sub;
            bool sneg;
            if (auto er = class_escape(e, sub, sneg)) return er;
            if (sneg) return fail(fmt::format("\\{} inside a class is not supported", e));
            r.insert(r.end(), sub.begin(), sub.end());
            continue;
          }
          lo = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : uint32_t(uint8_t(e));
        } else {
          lo = take_char();
        }
        uint32_t hi = lo;
        if (i_ + 1 < r_.size() && r_[i_] == '-' && r_[i_ + 1] != ']') {
          ++i_;
          if (r_[i_] == '\\') {
            if (i_ + 1 >= r_.size()) return fail("dangling backslash");
            hi = uint32_t(uint8_t(r_[i_ + 1]));
            i_ += 2;
          } else {
            hi = take_char();
          }
          if (hi < lo) return fail("reversed range in a class");
        }
        r.push_back({lo, hi});
      }
      if (eof()) return fail("unterminated class");
      ++i_;
      out = cls(r, neg);
      return std::nullopt;
    }
    if (c == '.') {
      ++i_;
      out = cls({{'\n', '\n'}}, true);
      return std::nullopt;
    }
    if (c == '\\') {
      if (i_ + 1 >= r_.size()) return fail("dangling backslash");
      const char e = r_[i_ + 1];
      i_ += 2;
      if (std::string("dDwWsS").find(e) != std::string::npos) {
        std::vector<CRange> r;
        bool neg;
        if (auto er = class_escape(e, r, neg)) return er;
        out = cls(r, neg);
        return std::nullopt;
      }
      if (std::isdigit(uint8_t(e)) || e == 'b' || e == 'B' || e == 'k' || e == 'p' || e == 'P')
        return fail(fmt::format("\\{} is not supported", e));
      out = lit(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : uint32_t(uint8_t(e)));
      return std::nullopt;
    }
    if (c == '^' || c == '$') return fail(fmt::format("'{}' is supported only at the start / end of the pattern", c));
    if (c == '*' || c == '+' || c == '?' || c == '{') return fail(fmt::format("quantifier '{}' without an item", c));
    out = lit(take_char());
    return std::nullopt;
  }
};

}  // namespace

RequestResult<std::string> pattern_to_gbnf(const std::string& re, const std::string& path) {
  return RegexToGbnf(re, path).run();
}

}  // namespace kiln::chat
