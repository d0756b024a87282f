// chat/tool_grammar.cpp — forced tool calls as GBNF (see tool_grammar.h).
#include "chat/tool_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "chat/json_schema.h"

namespace kiln::chat {

namespace {

std::string lit(std::string_view s) { return GbnfBuilder::literal(s); }

// "\x3C\x2F…" for a GBNF character class.
std::string class_chars(const std::set<char>& cs) {
  std::string o;
  for (char c : cs) o += fmt::format("\\x{:02X}", unsigned(uint8_t(c)));
  return o;
}

std::set<char> word_chars(const std::vector<std::string>& words) {
  std::set<char> cs;
  for (const auto& w : words) cs.insert(w.begin(), w.end());
  return cs;
}

std::vector<std::string> schema_types(const ojson& s) {
  std::vector<std::string> out;
  auto t = s.find("type");
  if (t == s.end()) return out;
  if (t->is_string()) out.push_back(t->get<std::string>());
  if (t->is_array())
    for (const auto& e : *t)
      if (e.is_string()) out.push_back(e.get<std::string>());
  return out;
}

bool contains_any(std::string_view s, const std::vector<std::string>& words) {
  for (const auto& w : words)
    if (s.find(w) != std::string_view::npos) return true;
  return false;
}

// The parameters schema as an object schema: OpenAI lets `parameters` omit "type".
ojson object_schema(const ojson& params) {
  ojson p = params.is_object() ? params : ojson::object();
  const bool composite = p.contains("anyOf") || p.contains("oneOf") || p.contains("allOf") || p.contains("$ref");
  if (!p.contains("type") && !composite) p["type"] = "object";
  return p;
}

// Closing markers no argument text of a block format may contain. A marker that is not ASCII
// (DeepSeek's) is excluded by its first character, '<' (JSON strings can still write it as \u003c).
std::vector<std::string> block_close_words(ToolCallFormat f) {
  std::vector<std::string> w;
  switch (f) {
    case ToolCallFormat::DeepseekV31: w = {"<｜tool▁call▁end｜>"}; break;
    case ToolCallFormat::DeepseekDsml: w = {"</｜DSML｜parameter>"}; break;
    case ToolCallFormat::KimiK2: w = {"<|tool_call_end|>"}; break;
    case ToolCallFormat::MiniMaxXml: w = {"</parameter>"}; break;
    case ToolCallFormat::MiniMaxJson: w = {"</tool_calls>"}; break;
    case ToolCallFormat::FunctionaryV31: w = {"</function>"}; break;
    case ToolCallFormat::FunctionaryV32: w = {">>>"}; break;
    case ToolCallFormat::CommandR7b: w = {"<|END_ACTION|>"}; break;
    case ToolCallFormat::CommandRPlus: w = {"```"}; break;
    case ToolCallFormat::Harmony: w = {"<|call|>"}; break;
    default: break;
  }
  for (auto& s : w)
    if (std::any_of(s.begin(), s.end(), [](char c) { return uint8_t(c) >= 0x80; })) s = s.substr(0, 1);
  return w;
}

// What surrounds one call's JSON arguments in a block format.
std::pair<std::string, std::string> block_call_wrap(ToolCallFormat f, const std::string& name) {
  const std::string q = ojson(name).dump();
  switch (f) {
    case ToolCallFormat::DeepseekV31:
      return {lit("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>"), lit("<｜tool▁call▁end｜>")};
    case ToolCallFormat::KimiK2:
      return {lit("<|tool_call_begin|>functions." + name + ":") + " [0-9]{1,3} " + lit("<|tool_call_argument_begin|>"),
              lit("<|tool_call_end|>")};
    case ToolCallFormat::FunctionaryV31: return {lit("<function=" + name + ">"), lit("</function>")};
    case ToolCallFormat::FunctionaryV32: return {lit(name + "\n"), ""};
    case ToolCallFormat::CommandR7b:
      return {lit("{\"tool_call_id\": \"") + " [0-9]{1,3} " + lit("\", \"tool_name\": " + q + ", \"parameters\": "), lit("}")};
    case ToolCallFormat::CommandRPlus: return {lit("{\"tool_name\": " + q + ", \"parameters\": "), lit("}")};
    // <|call|> is an end-of-generation token: the call ends where the arguments do.
    case ToolCallFormat::Harmony: return {lit("<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>"), ""};
    default: return {"", ""};
  }
}

// A block format's root: OPEN tool-call (SEP tool-call)* CLOSE (GBNF pieces; "" = none).
std::tuple<std::string, std::string, std::string> block_root_parts(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::DeepseekV31: return {lit("<｜tool▁calls▁begin｜>"), "", lit("<｜tool▁calls▁end｜>")};
    case ToolCallFormat::DeepseekDsml: return {lit("<｜DSML｜function_calls>\n"), "", lit("</｜DSML｜function_calls>")};
    case ToolCallFormat::KimiK2: return {lit("<|tool_calls_section_begin|>"), "", lit("<|tool_calls_section_end|>")};
    case ToolCallFormat::MiniMaxXml: return {lit("<minimax:tool_call>\n"), "", lit("</minimax:tool_call>")};
    case ToolCallFormat::MiniMaxJson: return {lit("<tool_calls>\n"), "", lit("</tool_calls>")};
    case ToolCallFormat::FunctionaryV31: return {"", "", ""};
    case ToolCallFormat::FunctionaryV32: return {"", lit(">>>"), ""};  // the prompt wrote the first ">>>"
    case ToolCallFormat::CommandR7b: return {lit("<|START_ACTION|>["), lit(", "), lit("]<|END_ACTION|>")};
    case ToolCallFormat::CommandRPlus: return {lit("Action:\n```json\n["), lit(",\n"), lit("]\n```")};
    default: return {"", "", ""};
  }
}

struct Builder {
  const ToolGrammarOptions& opt;
  std::vector<std::string> words;  // closing markers no argument text may contain
  GbnfBuilder b;
  std::string raw_rule;  // raw text without the words (lazily added)

  // Raw text of any length without the words (XML / arg_key string values).
  std::string raw_text() {
    if (raw_rule.empty()) {
      std::vector<std::pair<std::string, std::string>> rules;
      raw_rule = excluding_rules("tc-raw", words, "[^\\x00" + class_chars(word_chars(words)) + "]", rules);
      for (auto& [n, body] : rules) b.add_rule(n, body);
    }
    return raw_rule;
  }

  // A raw value for an XML / arg_key parameter of a string type, or nullopt when the schema asks
  // for more than the raw form can express (the tool is then called with a JSON body).
  std::optional<std::string> raw_string_value(const ojson& p, const std::vector<std::string>& types) {
    static const std::set<std::string> ok = {"type", "enum", "const", "minLength", "maxLength", "format", "nullable",
                                             "title", "description", "default", "examples", "example", "$comment",
                                             "deprecated", "readOnly", "writeOnly"};
    for (auto& [k, v] : p.items())
      if (!ok.count(k)) return std::nullopt;
    const bool null_ok = std::find(types.begin(), types.end(), "null") != types.end();
    std::vector<ojson> values;
    if (auto e = p.find("enum"); e != p.end() && e->is_array()) values.assign(e->begin(), e->end());
    if (auto c = p.find("const"); c != p.end()) values = {*c};
    if (p.contains("enum") || p.contains("const")) {
      std::string alts;
      for (const auto& v : values) {
        std::string text;
        if (v.is_null() && null_ok) text = "null";
        else if (v.is_string() && !(null_ok && v.get<std::string>() == "null")) text = v.get<std::string>();
        else return std::nullopt;  // a number in a string enum, or "null" that would read back as null
        if (contains_any(text, words)) return std::nullopt;
        alts += (alts.empty() ? "" : " | ") + lit(text);
      }
      return alts.empty() ? std::nullopt : std::optional<std::string>("(" + alts + ")");
    }
    if (auto f = p.find("format"); f != p.end()) {
      static const std::map<std::string, std::string> formats = {
          {"date", "json-date"}, {"time", "json-time"}, {"date-time", "json-date \"T\" json-time"}, {"uuid", "json-uuid"}};
      auto fm = f->is_string() ? formats.find(f->get<std::string>()) : formats.end();
      if (fm == formats.end() || p.contains("minLength") || p.contains("maxLength")) return std::nullopt;
      for (const char* prim : {"json-date", "json-time", "json-uuid"})
        if (fm->second.find(prim) != std::string::npos) b.primitive(prim);
      return "(" + fm->second + ")";
    }
    if (p.contains("minLength") || p.contains("maxLength")) {
      const int64_t lo = p.value("minLength", int64_t(0)), hi = p.value("maxLength", int64_t(-1));
      std::set<char> first;
      for (const auto& w : words) first.insert(w[0]);
      const std::string unit = "[^\\x00" + class_chars(first) + "]";
      return hi < 0 ? fmt::format("{}{{{},}}", unit, lo) : fmt::format("{}{{{},{}}}", unit, lo, hi);
    }
    return raw_text();
  }

  // One parameter value in the XML / arg_key forms: strings raw, everything else JSON (the parser
  // JSON-decodes a value whose schema type is not a string). nullopt: not expressible raw.
  RequestResult<std::optional<std::string>> xml_value(const ojson& p, const std::string& field, const std::string& prefix,
                                                      const ojson& root) {
    const std::vector<std::string> types = p.is_object() ? schema_types(p) : std::vector<std::string>{};
    if (std::find(types.begin(), types.end(), "string") != types.end()) return raw_string_value(p, types);
    auto r = b.add_schema(p, field, prefix, &root);
    if (!r.ok()) return r.error();
    return std::optional<std::string>(*r);
  }

  // The XML or arg_key body of a call to `tool`, or nullopt when its parameters need the JSON form.
  RequestResult<std::optional<std::string>> markup_call(const Tool& tool, const ojson& params, const std::string& field,
                                                        const std::string& prefix) {
    using Opt = std::optional<std::string>;
    if (params.value("type", ojson()) != ojson("object") || params.contains("anyOf") || params.contains("oneOf") ||
        params.contains("allOf") || params.contains("$ref"))
      return Opt();
    const ojson props = params.value("properties", ojson::object());
    if (!props.is_object()) return Opt();
    std::set<std::string> required;
    if (auto r = params.find("required"); r != params.end() && r->is_array())
      for (const auto& k : *r)
        if (k.is_string()) required.insert(k.get<std::string>());
    const ToolCallFormat f = opt.format;
    const bool xml = f == ToolCallFormat::QwenXml, dsml = f == ToolCallFormat::DeepseekDsml,
               minimax = f == ToolCallFormat::MiniMaxXml;
    const std::string D = "｜DSML｜";
    std::string body = xml       ? lit("<function=" + tool.name + ">\n")
                       : dsml    ? lit("<" + D + "invoke name=\"" + tool.name + "\">\n")
                       : minimax ? lit("<invoke name=\"" + tool.name + "\">\n")
                                 : lit(tool.name);
    for (auto& [k, v] : props.items()) {
      if (k.empty() || k.find_first_of("<>\n\r\"") != std::string::npos || k.front() == ' ' || k.back() == ' ' ||
          k.front() == '\t' || k.back() == '\t')
        return Opt();
      const std::string pfield = field + ".properties." + k;
      auto val = xml_value(v, pfield, prefix + "-" + k, params);
      if (!val.ok()) return val.error();
      bool raw = val->has_value() && v.is_object() && [&] {
        auto t = schema_types(v);
        return std::find(t.begin(), t.end(), "string") != t.end();
      }();
      if (!*val && dsml) {  // DSML writes any value as JSON with string="false"
        auto j = b.add_schema(v, pfield, prefix + "-" + k + "-j", &params);
        if (!j.ok()) return j.error();
        val = std::optional<std::string>(*j);
        raw = false;
      }
      if (!*val && minimax)
        return RequestError{pfield, "this string schema (pattern or formats) cannot be enforced on a raw minimax-xml value"};
      if (!*val) return Opt();
      std::string item;
      if (xml) item = lit("<parameter=" + k + ">\n") + " " + **val + " " + lit("\n</parameter>\n");
      else if (dsml)
        item = lit("<" + D + "parameter name=\"" + k + "\" string=\"" + (raw ? "true" : "false") + "\">") + " " + **val + " " +
               lit("</" + D + "parameter>\n");
      else if (minimax) item = lit("<parameter name=\"" + k + "\">") + " " + **val + " " + lit("</parameter>\n");
      else item = lit("<arg_key>" + k + "</arg_key><arg_value>") + " " + **val + " " + lit("</arg_value>");
      body += " " + (required.count(k) ? item : "(" + item + ")?");
    }
    if (xml) body += " " + lit("</function>");
    if (dsml) body += " " + lit("</" + D + "invoke>\n");
    if (minimax) body += " " + lit("</invoke>\n");
    return Opt(body);
  }

  // {"name": "NAME", "<key>": ARGS}
  RequestResult<std::string> json_call(const Tool& tool, const ojson& params, const std::string& field,
                                       const std::string& prefix, const char* key) {
    auto args = b.add_schema(params, field, prefix);
    if (!args.ok()) return args.error();
    return lit(fmt::format("{{\"name\": {}, \"{}\": ", ojson(tool.name).dump(), key)) + " " + *args + " " + lit("}");
  }
};

}  // namespace

std::string excluding_rules(const std::string& name, const std::vector<std::string>& words, const std::string& other,
                            std::vector<std::pair<std::string, std::string>>& rules) {
  // States: the proper prefixes of the words ("" first). δ(q, c) is the longest suffix of q+c that
  // is a state, or dead when a word ends there.
  std::vector<std::string> states = {""};
  for (const auto& w : words)
    for (size_t n = 1; n < w.size(); ++n)
      if (std::find(states.begin(), states.end(), w.substr(0, n)) == states.end()) states.push_back(w.substr(0, n));
  const std::set<char> chars = word_chars(words);
  auto state_name = [&](size_t k) { return fmt::format("{}-s{}", name, k); };
  for (size_t k = 0; k < states.size(); ++k) {
    std::string body = "\"\" | (" + other + ") " + state_name(0);
    for (char c : chars) {
      const std::string s = states[k] + c;
      bool dead = false;
      for (const auto& w : words) dead |= s.size() >= w.size() && s.compare(s.size() - w.size(), w.size(), w) == 0;
      if (dead) continue;
      size_t to = 0;
      for (size_t len = s.size(); len > 0 && to == 0; --len) {
        auto it = std::find(states.begin(), states.end(), s.substr(s.size() - len));
        if (it != states.end()) to = size_t(it - states.begin());
      }
      body += " | " + lit(std::string(1, c)) + " " + state_name(to);
    }
    rules.push_back({state_name(k), body});
  }
  return state_name(0);
}

RequestResult<std::string> tool_call_gbnf(const ChatRequest& req, const ToolGrammarOptions& opt) {
  if (opt.format == ToolCallFormat::None)
    return RequestError{"tool_choice",
                        "'required' or a named function needs a chat template with a tool-call format, and this one has none "
                        "(give one with --chat-template-file)"};
  if (req.tools.empty()) return RequestError{"tool_choice", "needs at least one tool in tools"};
  Builder B{opt, {}, {}, {}};
  switch (opt.format) {
    case ToolCallFormat::QwenXml: B.words = {"</tool_call>", "</parameter>"}; break;
    case ToolCallFormat::HermesJson: B.words = {"</tool_call>"}; break;
    case ToolCallFormat::ArgKeyXml: B.words = {"</tool_call>", "</arg_value>"}; break;
    case ToolCallFormat::MistralToolCalls:
      if (opt.mistral_args) B.words = {"[TOOL_CALLS]"};
      break;
    default:
      if (auto w = block_close_words(opt.format); !w.empty()) B.words = std::move(w);
      break;
  }
  if (!B.words.empty()) {
    // JSON strings: unbounded ones exclude the words exactly; length-bounded ones (json-char{m,n})
    // exclude the words' first characters, which stay writable as \u escapes.
    const std::set<char> chars = word_chars(B.words);
    std::set<char> first;
    for (const auto& w : B.words) first.insert(w[0]);
    const std::string esc = R"("\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))";
    std::vector<std::pair<std::string, std::string>> rules;
    const std::string s0 = excluding_rules("tc-str", B.words, R"([^"\\\x7F\x00-\x1F)" + class_chars(chars) + "] | " + esc, rules);
    B.b.override_primitive("json-string", "\"\\\"\" " + s0 + " \"\\\"\"");
    B.b.override_primitive("json-char", R"([^"\\\x7F\x00-\x1F)" + class_chars(first) + "] | " + esc);
    for (auto& [n, body] : rules) B.b.add_rule(n, body);
  }

  std::vector<std::string> calls;
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const Tool& tool = req.tools[i];
    if (req.tool_choice.mode == ToolChoice::Mode::Named && tool.name != req.tool_choice.name) continue;
    const std::string field = fmt::format("tools[{}].function.parameters", i);
    const std::string prefix = fmt::format("t{}", i);
    const ojson params = object_schema(tool.parameters);
    // Every schema is checked whole first, so that errors name the keyword whatever form is used.
    if (auto whole = json_schema_to_gbnf(params, field); !whole.ok()) return whole.error();
    std::string call;
    switch (opt.format) {
      case ToolCallFormat::QwenXml:
      case ToolCallFormat::ArgKeyXml:
      case ToolCallFormat::HermesJson: {
        const bool nl = opt.format != ToolCallFormat::ArgKeyXml;
        std::optional<std::string> body;
        if (opt.format != ToolCallFormat::HermesJson) {
          auto m = B.markup_call(tool, params, field, prefix);
          if (!m.ok()) return m.error();
          body = *m;
        }
        if (!body) {
          auto j = B.json_call(tool, params, field, prefix, "arguments");
          if (!j.ok()) return j.error();
          body = *j;
        }
        call = lit(nl ? "<tool_call>\n" : "<tool_call>") + " " + *body + " " + lit(nl ? "\n</tool_call>" : "</tool_call>");
        break;
      }
      case ToolCallFormat::MistralToolCalls: {
        if (opt.mistral_args) {
          auto args = B.b.add_schema(params, field, prefix);
          if (!args.ok()) return args.error();
          call = lit(tool.name + "[ARGS]") + " " + *args;
        } else {
          auto j = B.json_call(tool, params, field, prefix, "arguments");
          if (!j.ok()) return j.error();
          call = *j;
        }
        break;
      }
      case ToolCallFormat::Llama3Json: {
        auto j = B.json_call(tool, params, field, prefix, "parameters");
        if (!j.ok()) return j.error();
        call = *j;
        break;
      }
      case ToolCallFormat::DeepseekDsml:
      case ToolCallFormat::MiniMaxXml: {
        auto m = B.markup_call(tool, params, field, prefix);
        if (!m.ok()) return m.error();
        if (!*m) return RequestError{field, std::string("these parameters cannot be written in the ") +
                                                tool_call_format_name(opt.format) + " format (an object schema with properties)"};
        call = **m;
        break;
      }
      case ToolCallFormat::MiniMaxJson: {
        auto j = B.json_call(tool, params, field, prefix, "arguments");
        if (!j.ok()) return j.error();
        call = *j + " " + lit("\n");
        break;
      }
      default: {  // block formats whose arguments are one JSON object
        auto args = B.b.add_schema(params, field, prefix);
        if (!args.ok()) return args.error();
        auto [head, tail] = block_call_wrap(opt.format, tool.name);
        call = head + " " + *args + (tail.empty() ? "" : " " + tail);
        break;
      }
    }
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return RequestError{"tool_choice.function.name", "no tool named '" + req.tool_choice.name + "' in tools"};
  std::string alts;
  for (const auto& c : calls) alts += (alts.empty() ? "" : " | ") + c;
  B.b.add_rule("tool-call", alts);
  std::string root;
  switch (opt.format) {
    case ToolCallFormat::MistralToolCalls:
      if (opt.mistral_args)
        root = lit("[TOOL_CALLS]") + " tool-call" + (opt.parallel ? " (" + lit("[TOOL_CALLS]") + " tool-call)*" : "");
      else
        root = lit("[TOOL_CALLS][") + " tool-call" + (opt.parallel ? " (" + lit(", ") + " tool-call)*" : "") + " " + lit("]");
      break;
    case ToolCallFormat::Llama3Json: root = "tool-call"; break;  // Llama 3.x writes one call per turn
    case ToolCallFormat::DeepseekV31:
    case ToolCallFormat::DeepseekDsml:
    case ToolCallFormat::KimiK2:
    case ToolCallFormat::MiniMaxXml:
    case ToolCallFormat::MiniMaxJson:
    case ToolCallFormat::FunctionaryV31:
    case ToolCallFormat::FunctionaryV32:
    case ToolCallFormat::CommandR7b:
    case ToolCallFormat::CommandRPlus:
    case ToolCallFormat::Harmony: {
      if (opt.format == ToolCallFormat::Harmony) {  // a call ends the turn (<|call|>): one per answer
        root = "tool-call";
        break;
      }
      auto [open, sep, close] = block_root_parts(opt.format);
      root = (open.empty() ? "" : open + " ") + "tool-call" + (opt.parallel ? " (" + (sep.empty() ? "" : sep + " ") + "tool-call)*" : "") +
             (close.empty() ? "" : " " + close);
      break;
    }
    default: {
      const std::string sep = opt.format == ToolCallFormat::ArgKeyXml ? "" : "\n";
      root = "tool-call" + (opt.parallel ? " (" + (sep.empty() ? std::string() : lit(sep) + " ") + "tool-call)*" : "");
    }
  }
  B.b.add_rule("root", root);
  return B.b.text();
}

}  // namespace kiln::chat
