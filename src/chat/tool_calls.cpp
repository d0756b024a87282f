// chat/tool_calls.cpp — the body of one <tool_call>…</tool_call>: Qwen XML or JSON form.
#include <algorithm>
#include <cctype>

#include "chat/output_parser.h"
#include "chat/text_util.h"
#include "chat/tool_formats.h"

namespace kiln::chat {

namespace {

using text::dump_safe;
using text::starts_with;
using text::trim;

// The JSON-schema types a parameter allows: "type" as a string or an array of strings.
std::vector<std::string> schema_types(const ojson& schema) {
  std::vector<std::string> out;
  auto t = schema.find("type");
  if (t == schema.end()) return out;
  if (t->is_string()) out.push_back(t->get<std::string>());
  if (t->is_array())
    for (const auto& e : *t)
      if (e.is_string()) out.push_back(e.get<std::string>());
  return out;
}

// Converts one XML parameter value. Qwen's template writes non-string values with tojson and
// strings verbatim, so: a parameter whose schema type is (or includes) "string" stays a string;
// one with another type (integer, number, boolean, object, array, null, or no "type" but a
// schema such as anyOf/enum) is JSON-decoded when the text parses as JSON; a parameter the
// tool's schema does not know, or text that does not parse, stays a string (vLLM's
// qwen3_coder parser and llama.cpp do the same).
ojson convert_value(const std::string& raw, const ojson* schema) {
  if (!schema || !schema->is_object()) return ojson(raw);
  const std::vector<std::string> types = schema_types(*schema);
  auto has = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
  if (has("string")) {
    if (raw == "null" && has("null")) return nullptr;
    return ojson(raw);
  }
  std::string_view v = trim(raw);
  if (has("boolean")) {
    std::string low(v);
    std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
    if (low == "true") return true;
    if (low == "false") return false;
  }
  ojson parsed = ojson::parse(v, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded()) return parsed;
  return ojson(raw);
}

const ojson* param_schema(const Tool* tool, const std::string& param) {
  if (!tool) return nullptr;
  auto props = tool->parameters.find("properties");
  if (props == tool->parameters.end() || !props->is_object()) return nullptr;
  auto p = props->find(param);
  return p == props->end() ? nullptr : &*p;
}

bool parse_xml(std::string_view s, const std::vector<Tool>& tools, std::string& name, std::string& arguments) {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kP = "<parameter=", kPEnd = "</parameter>";
  s = trim(s);
  if (!starts_with(s, kFn)) return false;
  s.remove_prefix(kFn.size());
  size_t gt = s.find('>');
  if (gt == std::string_view::npos) return false;
  std::string_view nm = trim(s.substr(0, gt));
  if (nm.empty() || nm.find('\n') != std::string_view::npos || nm.find('<') != std::string_view::npos) return false;
  name = std::string(nm);
  s.remove_prefix(gt + 1);
  const Tool* tool = find_tool(tools, name);
  ojson args = ojson::object();
  for (;;) {
    s = trim(s);
    if (s.empty()) break;  // lenient: a missing </function> at the very end
    if (starts_with(s, kFnEnd)) {
      s.remove_prefix(kFnEnd.size());
      if (!trim(s).empty()) return false;  // text after </function> inside the call
      break;
    }
    if (!starts_with(s, kP)) return false;
    s.remove_prefix(kP.size());
    size_t pgt = s.find('>');
    if (pgt == std::string_view::npos) return false;
    std::string pname(trim(s.substr(0, pgt)));
    if (pname.empty() || pname.find('\n') != std::string::npos) return false;
    s.remove_prefix(pgt + 1);
    size_t end = s.find(kPEnd);
    if (end == std::string_view::npos) return false;
    std::string_view value = s.substr(0, end);
    // The template writes "<parameter=P>\n" VALUE "\n</parameter>": strip exactly that layout.
    if (starts_with(value, "\n")) value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    args[pname] = convert_value(std::string(value), param_schema(tool, pname));
    s.remove_prefix(end + kPEnd.size());
  }
  arguments = dump_safe(args);
  return true;
}

// GLM-4.x / Ling / Laguna: NAME<arg_key>K</arg_key><arg_value>V</arg_value>… (newlines optional).
// Values are typed like the Qwen XML form (the templates write non-strings with tojson).
bool parse_arg_key(std::string_view s, const std::vector<Tool>& tools, std::string& name, std::string& arguments) {
  constexpr std::string_view kK = "<arg_key>", kKEnd = "</arg_key>", kV = "<arg_value>", kVEnd = "</arg_value>";
  s = trim(s);
  size_t first = s.find(kK);
  std::string_view nm = trim(s.substr(0, first));
  if (nm.empty() || nm.find_first_of("<>{}\n\"") != std::string_view::npos) return false;
  name = std::string(nm);
  const Tool* tool = find_tool(tools, name);
  ojson args = ojson::object();
  s.remove_prefix(first == std::string_view::npos ? s.size() : first);
  for (;;) {
    s = trim(s);
    if (s.empty()) break;
    if (!starts_with(s, kK)) return false;
    s.remove_prefix(kK.size());
    size_t ke = s.find(kKEnd);
    if (ke == std::string_view::npos) return false;
    std::string key(trim(s.substr(0, ke)));
    s.remove_prefix(ke + kKEnd.size());
    s = trim(s);
    if (!starts_with(s, kV)) return false;
    s.remove_prefix(kV.size());
    size_t ve = s.find(kVEnd);
    if (ve == std::string_view::npos) return false;
    args[key] = convert_value(std::string(s.substr(0, ve)), param_schema(tool, key));
    s.remove_prefix(ve + kVEnd.size());
  }
  arguments = dump_safe(args);
  return true;
}

// {"name": N, "arguments"|"parameters": {…} or "<json text>"}.
bool call_from_json(const ojson& j, std::string& name, std::string& arguments) {
  if (!j.is_object()) return false;
  auto nm = j.find("name");
  if (nm == j.end() || !nm->is_string() || nm->get_ref<const std::string&>().empty()) return false;
  name = nm->get<std::string>();
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  if (a == j.end() || a->is_null()) {
    arguments = "{}";
  } else if (a->is_string()) {
    // Some models double-encode the arguments; accept them when the string is itself JSON.
    ojson inner = ojson::parse(a->get_ref<const std::string&>(), nullptr, false);
    if (inner.is_discarded()) return false;
    arguments = a->get<std::string>();
  } else {
    arguments = dump_safe(*a);
  }
  return true;
}

bool parse_json(std::string_view s, std::string& name, std::string& arguments) {
  ojson j = ojson::parse(trim(s), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  return call_from_json(j, name, arguments);
}

}  // namespace

bool parse_tail_tool_calls(ToolCallFormat format, std::string_view text, const std::vector<Tool>& tools,
                           std::vector<std::pair<std::string, std::string>>& calls) {
  calls.clear();
  std::string_view t = trim(text);
  if (t.empty()) return false;
  auto from_json_value = [&](const ojson& j) {
    std::vector<const ojson*> items;
    if (j.is_array()) {
      if (j.empty()) return false;
      for (const auto& e : j) items.push_back(&e);
    } else {
      items.push_back(&j);
    }
    for (const ojson* e : items) {
      std::string name, args;
      if (!call_from_json(*e, name, args)) return false;
      calls.emplace_back(std::move(name), std::move(args));
    }
    return true;
  };
  if (format == ToolCallFormat::Llama3Json) {
    ojson j = ojson::parse(t, nullptr, false);
    if (j.is_discarded()) return false;
    if (!from_json_value(j)) return false;
    // The whole answer is JSON: only a known tool name makes it a call (an ordinary JSON answer
    // such as {"name": "Bob"} stays content).
    for (const auto& c : calls)
      if (!find_tool(tools, c.first)) return false;
    return true;
  }
  if (format != ToolCallFormat::MistralToolCalls) return false;
  if (t.front() == '[') {  // Nemo: [TOOL_CALLS][{"name":…,"arguments":…}, …]
    ojson j = ojson::parse(t, nullptr, false);
    return !j.is_discarded() && j.is_array() && from_json_value(j);
  }
  // Mistral Small 3.2 / Devstral: NAME[ARGS]{…} (optionally NAME[CALL_ID]ID[ARGS]{…}), repeated with [TOOL_CALLS].
  constexpr std::string_view kSep = "[TOOL_CALLS]", kArgs = "[ARGS]", kId = "[CALL_ID]";
  while (!t.empty()) {
    size_t next = t.find(kSep);
    std::string_view seg = trim(t.substr(0, next));
    t = next == std::string_view::npos ? std::string_view{} : trim(t.substr(next + kSep.size()));
    size_t a = seg.find(kArgs);
    if (a == std::string_view::npos) return false;
    std::string_view head = seg.substr(0, a);
    if (size_t c = head.find(kId); c != std::string_view::npos) head = head.substr(0, c);
    head = trim(head);
    if (head.empty() || head.find_first_of("[]{}\"\n ") != std::string_view::npos) return false;
    ojson args = ojson::parse(trim(seg.substr(a + kArgs.size())), nullptr, false);
    if (args.is_discarded() || !args.is_object()) return false;
    calls.emplace_back(std::string(head), dump_safe(args));
  }
  return !calls.empty();
}

ojson typed_param_value(const std::string& raw, const Tool* tool, const std::string& param) {
  return convert_value(raw, param_schema(tool, param));
}

bool parse_tool_call_body(std::string_view body, const std::vector<Tool>& tools, std::string& name,
                          std::string& arguments) {
  std::string_view t = trim(body);
  if (starts_with(t, "<function=")) return parse_xml(t, tools, name, arguments);
  if (starts_with(t, "{")) return parse_json(t, name, arguments);
  if (t.find("<arg_key>") != std::string_view::npos) return parse_arg_key(t, tools, name, arguments);
  // GLM's arg_key form of a call without arguments is the bare name: accepted for a known tool.
  if (find_tool(tools, t)) {
    name = std::string(t);
    arguments = "{}";
    return true;
  }
  return false;
}

}  // namespace kiln::chat
