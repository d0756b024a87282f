// chat/tool_formats.cpp — block tool-call formats: the table and the per-format body readers (see
//   tool_formats.h).
#include "chat/tool_formats.h"

#include "chat/text_util.h"

#include <map>

namespace kiln::chat {

namespace {

using text::dump_safe;
using text::is_ws;
using text::starts_with;
using text::trim;

bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }

// A JSON object's text: kept as written (so that streamed pieces add up to it), or "" when it is not
// an object.
bool json_object_text(std::string_view s, std::string& out) {
  s = trim(s);
  ojson j = ojson::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  out = std::string(s);
  return true;
}

bool valid_name(std::string_view n) { return text::valid_tool_name(n); }

// Splits `s` at each occurrence of `open` … `close`, calling f(inner); text between the pieces must
// be whitespace. False when anything else is there or f fails.
template <class F>
bool each_between(std::string_view s, std::string_view open, std::string_view close, F&& f) {
  bool any = false;
  for (;;) {
    s = trim(s);
    if (s.empty()) return any;
    if (!starts_with(s, open)) return false;
    s.remove_prefix(open.size());
    size_t e = s.find(close);
    if (e == std::string_view::npos) return false;
    if (!f(s.substr(0, e))) return false;
    s.remove_prefix(e + close.size());
    any = true;
  }
}

// <PFX invoke name="N"> (<PFX parameter name="P"[ string="true|false"]>V</PFX parameter>)* </PFX invoke>, repeated.
bool parse_invokes(std::string_view body, std::string_view pfx, const std::vector<Tool>& tools, bool string_attr,
                   std::vector<ParsedCall>& calls) {
  const std::string inv_open = std::string("<") + std::string(pfx) + "invoke name=\"";
  const std::string inv_close = std::string("</") + std::string(pfx) + "invoke>";
  const std::string par_open = std::string("<") + std::string(pfx) + "parameter name=\"";
  const std::string par_close = std::string("</") + std::string(pfx) + "parameter>";
  return each_between(body, inv_open, inv_close, [&](std::string_view inv) {
    size_t q = inv.find("\">");
    if (q == std::string_view::npos) return false;
    std::string name(inv.substr(0, q));
    if (!valid_name(name)) return false;
    const Tool* tool = find_tool(tools, name);
    inv.remove_prefix(q + 2);
    ojson args = ojson::object();
    bool ok = inv.find_first_not_of(" \t\r\n") == std::string_view::npos ||
              each_between(inv, par_open, par_close, [&](std::string_view par) {
                size_t nq = par.find('"');
                if (nq == std::string_view::npos) return false;
                std::string key(par.substr(0, nq));
                par.remove_prefix(nq + 1);
                int is_string = -1;  // DSML's string="true|false"; -1: typed by the schema
                if (string_attr) {
                  if (starts_with(par, " string=\"true\"")) is_string = 1, par.remove_prefix(14);
                  else if (starts_with(par, " string=\"false\"")) is_string = 0, par.remove_prefix(15);
                }
                if (!starts_with(par, ">")) return false;
                par.remove_prefix(1);
                const std::string raw(par);
                if (is_string == 1) {
                  args[key] = raw;
                } else if (is_string == 0) {
                  ojson v = ojson::parse(trim(raw), nullptr, false);
                  args[key] = v.is_discarded() ? ojson(raw) : v;
                } else {
                  args[key] = typed_param_value(raw, tool, key);
                }
                return true;
              });
    if (!ok) return false;
    calls.push_back({name, dump_safe(args), ""});
    return true;
  });
}

// {"name"|"tool_name": N, "arguments"|"parameters": {…}}
bool call_of(const ojson& j, std::vector<ParsedCall>& calls) {
  if (!j.is_object()) return false;
  auto n = j.find("name");
  if (n == j.end()) n = j.find("tool_name");
  if (n == j.end() || !n->is_string() || !valid_name(n->get<std::string>())) return false;
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  ojson args = a == j.end() || a->is_null() ? ojson::object() : *a;
  if (args.is_string()) args = ojson::parse(args.get<std::string>(), nullptr, false);
  if (!args.is_object()) return false;
  calls.push_back({n->get<std::string>(), dump_safe(args), ""});
  return true;
}

bool parse_deepseek_v31(std::string_view body, std::vector<ParsedCall>& calls) {
  return each_between(body, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", [&](std::string_view c) {
    size_t sep = c.find("<｜tool▁sep｜>");
    if (sep == std::string_view::npos) return false;
    std::string_view name = trim(c.substr(0, sep)), rest = c.substr(sep + std::string_view("<｜tool▁sep｜>").size());
    if (name == "function") {  // V3 / R1: function<sep>NAME\n```json\n{…}\n```
      size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) return false;
      name = trim(rest.substr(0, nl));
      rest = trim(rest.substr(nl + 1));
      if (!starts_with(rest, "```json") || rest.size() < 10 || rest.substr(rest.size() - 3) != "```") return false;
      rest = rest.substr(7, rest.size() - 10);
    }
    std::string args;
    if (!valid_name(name) || !json_object_text(rest, args)) return false;
    calls.push_back({std::string(name), args, ""});
    return true;
  });
}

bool parse_kimi(std::string_view body, std::vector<ParsedCall>& calls) {
  return each_between(body, "<|tool_call_begin|>", "<|tool_call_end|>", [&](std::string_view c) {
    constexpr std::string_view kArg = "<|tool_call_argument_begin|>";
    size_t a = c.find(kArg);
    if (a == std::string_view::npos) return false;
    std::string_view id = trim(c.substr(0, a));
    std::string_view name = id;
    if (starts_with(name, "functions.")) name.remove_prefix(10);
    if (size_t colon = name.rfind(':'); colon != std::string_view::npos) name = name.substr(0, colon);
    std::string args;
    if (!valid_name(name) || !json_object_text(c.substr(a + kArg.size()), args)) return false;
    calls.push_back({std::string(name), args, std::string(id)});
    return true;
  });
}

// JSON objects one after another (MiniMax M1: one per line).
bool parse_json_lines(std::string_view body, std::vector<ParsedCall>& calls) {
  body = trim(body);
  if (body.empty()) return false;
  while (!body.empty()) {
    // The end of the first object: try each closing brace until the prefix parses.
    size_t end = std::string_view::npos;
    for (size_t i = body.find('}'); i != std::string_view::npos; i = body.find('}', i + 1)) {
      ojson j = ojson::parse(body.substr(0, i + 1), nullptr, false);
      if (!j.is_discarded()) {
        if (!call_of(j, calls)) return false;
        end = i + 1;
        break;
      }
    }
    if (end == std::string_view::npos) return false;
    body = trim(body.substr(end));
  }
  return true;
}

bool parse_json_array(std::string_view body, std::vector<ParsedCall>& calls) {
  ojson j = ojson::parse(trim(body), nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty()) return false;
  for (const auto& e : j)
    if (!call_of(e, calls)) return false;
  return true;
}

// Functionary v3.2: NAME\n{…} segments separated by ">>>" ("all\nTEXT" segments are not calls).
bool parse_functionary_v32(std::string_view body, std::vector<ParsedCall>& calls) {
  bool any = false;
  while (!body.empty()) {
    size_t next = body.find(">>>");
    std::string_view seg = body.substr(0, next);
    body = next == std::string_view::npos ? std::string_view{} : body.substr(next + 3);
    size_t nl = seg.find('\n');
    if (nl == std::string_view::npos) return false;
    std::string_view name = trim(seg.substr(0, nl));
    std::string args;
    if (name == "all" || !valid_name(name) || !json_object_text(seg.substr(nl + 1), args)) return false;
    calls.push_back({std::string(name), args, ""});
    any = true;
  }
  return any;
}

}  // namespace

const BlockFormat* block_format(ToolCallFormat f) {
  static const std::map<ToolCallFormat, BlockFormat> table = {
      {ToolCallFormat::DeepseekV31, {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", {}, {}, {}, false}},
      {ToolCallFormat::DeepseekDsml, {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>", {}, {}, {}, false}},
      {ToolCallFormat::KimiK2, {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", {}, {}, {}, false}},
      {ToolCallFormat::MiniMaxXml, {"<minimax:tool_call>", "</minimax:tool_call>", {}, {}, {}, false}},
      {ToolCallFormat::MiniMaxJson, {"<tool_calls>", "</tool_calls>", {}, {}, {}, false}},
      {ToolCallFormat::FunctionaryV31, {"<function=", "</function>", {}, {}, {}, false}},
      {ToolCallFormat::FunctionaryV32, {">>>", "", {}, {}, {}, true}},
      {ToolCallFormat::CommandR7b,
       {"<|START_ACTION|>", "<|END_ACTION|>", {"<|START_RESPONSE|>", "<|END_RESPONSE|>"}, "<|START_THINKING|>",
        "<|END_THINKING|>", false}},
      {ToolCallFormat::CommandRPlus, {"Action:", "", {}, {}, {}, false}},
      {ToolCallFormat::Harmony,
       {"<|channel|>commentary to=functions.", "<|call|>",
        {"<|start|>assistant", "<|channel|>final<|message|>", "<|channel|>commentary<|message|>", "<|end|>"},
        "<|channel|>analysis<|message|>", "<|end|>", false}},
  };
  auto it = table.find(f);
  return it == table.end() ? nullptr : &it->second;
}

bool parse_block_calls(ToolCallFormat f, std::string_view body, const std::vector<Tool>& tools,
                       std::vector<ParsedCall>& calls) {
  calls.clear();
  bool ok = false;
  switch (f) {
    case ToolCallFormat::DeepseekV31: ok = parse_deepseek_v31(body, calls); break;
    case ToolCallFormat::DeepseekDsml: ok = parse_invokes(body, "｜DSML｜", tools, true, calls); break;
    case ToolCallFormat::KimiK2: ok = parse_kimi(body, calls); break;
    case ToolCallFormat::MiniMaxXml: ok = parse_invokes(body, "", tools, false, calls); break;
    case ToolCallFormat::MiniMaxJson: ok = parse_json_lines(body, calls); break;
    case ToolCallFormat::FunctionaryV31: {  // NAME>{…}
      size_t gt = body.find('>');
      std::string args;
      ok = gt != std::string_view::npos && valid_name(body.substr(0, gt)) && json_object_text(body.substr(gt + 1), args);
      if (ok) calls.push_back({std::string(body.substr(0, gt)), args, ""});
      break;
    }
    case ToolCallFormat::FunctionaryV32: ok = parse_functionary_v32(body, calls); break;
    case ToolCallFormat::CommandR7b: ok = parse_json_array(body, calls); break;
    case ToolCallFormat::CommandRPlus: {  // \n```json\n[…]\n```
      std::string_view t = trim(body);
      if (starts_with(t, "```json")) t.remove_prefix(7);
      else if (starts_with(t, "```")) t.remove_prefix(3);
      else return false;
      t = trim(t);
      if (t.size() < 3 || t.substr(t.size() - 3) != "```") return false;
      ok = parse_json_array(t.substr(0, t.size() - 3), calls);
      break;
    }
    case ToolCallFormat::Harmony: {  // NAME [<|constrain|>json]<|message|>{…}
      size_t m = body.find("<|message|>");
      if (m == std::string_view::npos) return false;
      std::string_view head = body.substr(0, m);
      std::string_view name = trim(head.substr(0, head.find_first_of(" <")));
      std::string args;
      ok = valid_name(name) && json_object_text(body.substr(m + 11), args);
      if (ok) calls.push_back({std::string(name), args, ""});
      break;
    }
    default: return false;
  }
  if (!ok) calls.clear();
  return ok;
}

std::vector<std::string_view> tool_call_markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::QwenXml:
    case ToolCallFormat::HermesJson: return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::ArgKeyXml:
      return {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
    case ToolCallFormat::MistralToolCalls: return {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
    case ToolCallFormat::Llama3Json: return {"<|python_tag|>"};
    case ToolCallFormat::DeepseekV31:
      return {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"};
    case ToolCallFormat::KimiK2:
      return {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
              "<|tool_call_argument_begin|>"};
    case ToolCallFormat::MiniMaxXml: return {"<minimax:tool_call>", "</minimax:tool_call>"};
    case ToolCallFormat::MiniMaxJson: return {"<tool_calls>", "</tool_calls>"};
    case ToolCallFormat::CommandR7b:
      return {"<|START_ACTION|>", "<|END_ACTION|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>",
              "<|END_RESPONSE|>"};
    case ToolCallFormat::Harmony:
      return {"<|channel|>", "<|message|>", "<|call|>", "<|constrain|>", "<|start|>", "<|end|>"};
    default: return {};
  }
}

ToolCallFormat detect_block_format(std::string_view src) {
  if (contains(src, "<｜tool▁calls▁begin｜>") && contains(src, "<｜tool▁sep｜>")) return ToolCallFormat::DeepseekV31;
  if (contains(src, "DSML｜") && contains(src, "function_calls")) return ToolCallFormat::DeepseekDsml;
  if (contains(src, "<|tool_calls_section_begin|>")) return ToolCallFormat::KimiK2;
  if (contains(src, "<minimax:tool_call>")) return ToolCallFormat::MiniMaxXml;
  if (contains(src, "<tool_calls>") && contains(src, "</tool_calls>")) return ToolCallFormat::MiniMaxJson;
  if (contains(src, ">>>all") && contains(src, "'>>>' + tool_call['function']['name']")) return ToolCallFormat::FunctionaryV32;
  if (contains(src, "'<function=' + ") && contains(src, "</function>")) return ToolCallFormat::FunctionaryV31;
  if (contains(src, "<|START_ACTION|>") && contains(src, "<|END_ACTION|>")) return ToolCallFormat::CommandR7b;
  if (contains(src, "Action:") && contains(src, "```json") && contains(src, "tool_name")) return ToolCallFormat::CommandRPlus;
  if (contains(src, "<|channel|>") && contains(src, "to=functions.")) return ToolCallFormat::Harmony;
  return ToolCallFormat::None;
}

}  // namespace kiln::chat
