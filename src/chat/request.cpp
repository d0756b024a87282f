// chat/request.cpp — validation and normalisation of an OpenAI chat request's chat fields.
#include <fmt/format.h>

#include <cctype>
#include <set>

#include "chat/chat.h"

namespace kiln::chat {

std::optional<ReasoningFormat> parse_reasoning_format(std::string_view s) {
  if (s == "none") return ReasoningFormat::None;
  if (s == "auto") return ReasoningFormat::Auto;
  if (s == "deepseek") return ReasoningFormat::Deepseek;
  if (s == "deepseek-legacy") return ReasoningFormat::DeepseekLegacy;
  return std::nullopt;
}

const char* reasoning_format_name(ReasoningFormat f) {
  switch (f) {
    case ReasoningFormat::None: return "none";
    case ReasoningFormat::Auto: return "auto";
    case ReasoningFormat::Deepseek: return "deepseek";
    case ReasoningFormat::DeepseekLegacy: return "deepseek-legacy";
  }
  return "?";
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::None: return "none";
    case ToolCallFormat::QwenXml: return "qwen-xml";
    case ToolCallFormat::HermesJson: return "hermes-json";
    case ToolCallFormat::ArgKeyXml: return "arg-key-xml";
    case ToolCallFormat::MistralToolCalls: return "mistral";
    case ToolCallFormat::Llama3Json: return "llama3-json";
    case ToolCallFormat::DeepseekV31: return "deepseek-v3.1";
    case ToolCallFormat::DeepseekDsml: return "deepseek-dsml";
    case ToolCallFormat::KimiK2: return "kimi-k2";
    case ToolCallFormat::MiniMaxXml: return "minimax-xml";
    case ToolCallFormat::MiniMaxJson: return "minimax-json";
    case ToolCallFormat::FunctionaryV31: return "functionary-v3.1";
    case ToolCallFormat::FunctionaryV32: return "functionary-v3.2";
    case ToolCallFormat::CommandR7b: return "command-r7b";
    case ToolCallFormat::CommandRPlus: return "command-r-plus";
    case ToolCallFormat::Harmony: return "harmony";
  }
  return "?";
}

const Tool* find_tool(const std::vector<Tool>& tools, std::string_view name) {
  for (const auto& t : tools)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

const char* type_name(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "a boolean";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned:
    case ojson::value_t::number_float: return "a number";
    case ojson::value_t::string: return "a string";
    case ojson::value_t::array: return "an array";
    case ojson::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

RequestError rerr(std::string field, std::string msg) { return RequestError{std::move(field), std::move(msg)}; }

RequestError wrong_type(const std::string& field, const char* want, const ojson& got) {
  return rerr(field, fmt::format("must be {}, got {}", want, type_name(got)));
}

// Function names: OpenAI allows [a-zA-Z0-9_-], max 64; we also allow '.' and ':' (seen in MCP
// tool names) but nothing that could break a template's markup.
bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':')) return false;
  return true;
}

std::optional<RequestError> parse_content(const ojson& m, const std::string& path, Message& out) {
  auto it = m.find("content");
  const bool assistant = out.role == "assistant";
  if (it == m.end() || it->is_null()) {
    // OpenAI: content may be omitted/null only for assistant messages (tool calls, refusals).
    if (!assistant) return rerr(path + ".content", "required for role '" + out.role + "'");
    out.content_is_null = true;
    return std::nullopt;
  }
  if (it->is_string()) {
    out.content = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return wrong_type(path + ".content", "a string or an array of content parts", *it);
  out.content_is_parts = true;
  for (size_t j = 0; j < it->size(); ++j) {
    const ojson& p = (*it)[j];
    const std::string pp = fmt::format("{}.content[{}]", path, j);
    if (!p.is_object()) return wrong_type(pp, "an object", p);
    auto t = p.find("type");
    if (t == p.end()) return rerr(pp + ".type", "required");
    if (!t->is_string()) return wrong_type(pp + ".type", "a string", *t);
    const std::string type = t->get<std::string>();
    ContentPart part;
    if (type == "text") {
      auto tx = p.find("text");
      if (tx == p.end()) return rerr(pp + ".text", "required");
      if (!tx->is_string()) return wrong_type(pp + ".text", "a string", *tx);
      part.kind = ContentPart::Kind::Text;
      part.text = tx->get<std::string>();
    } else if (type == "image_url") {
      if (out.role != "user")
        return rerr(pp + ".type", "image_url parts are only allowed in user messages, not '" + out.role + "'");
      auto iu = p.find("image_url");
      if (iu == p.end()) return rerr(pp + ".image_url", "required");
      std::string url;
      if (iu->is_string()) {
        url = iu->get<std::string>();
      } else if (iu->is_object()) {
        auto u = iu->find("url");
        if (u == iu->end()) return rerr(pp + ".image_url.url", "required");
        if (!u->is_string()) return wrong_type(pp + ".image_url.url", "a string", *u);
        url = u->get<std::string>();
      } else {
        return wrong_type(pp + ".image_url", "an object", *iu);
      }
      if (url.empty()) return rerr(pp + ".image_url.url", "must not be empty");
      part.kind = ContentPart::Kind::Image;
      part.image_url = std::move(url);
    } else {
      return rerr(pp + ".type", "unsupported content part type '" + type + "' (expected 'text' or 'image_url')");
    }
    out.parts.push_back(std::move(part));
  }
  return std::nullopt;
}

std::optional<RequestError> parse_tool_calls(const ojson& m, const std::string& path, Message& out) {
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return std::nullopt;
  if (out.role != "assistant") return rerr(path + ".tool_calls", "only allowed in assistant messages");
  if (!it->is_array()) return wrong_type(path + ".tool_calls", "an array", *it);
  for (size_t j = 0; j < it->size(); ++j) {
    const ojson& c = (*it)[j];
    const std::string cp = fmt::format("{}.tool_calls[{}]", path, j);
    if (!c.is_object()) return wrong_type(cp, "an object", c);
    ToolCall tc;
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
      if (!id->is_string()) return wrong_type(cp + ".id", "a string", *id);
      tc.id = id->get<std::string>();
    }
    if (auto ty = c.find("type"); ty != c.end() && !ty->is_null()) {
      if (!ty->is_string()) return wrong_type(cp + ".type", "a string", *ty);
      if (*ty != "function") return rerr(cp + ".type", "unsupported tool call type '" + ty->get<std::string>() + "' (expected 'function')");
    }
    auto fn = c.find("function");
    if (fn == c.end()) return rerr(cp + ".function", "required");
    if (!fn->is_object()) return wrong_type(cp + ".function", "an object", *fn);
    auto nm = fn->find("name");
    if (nm == fn->end()) return rerr(cp + ".function.name", "required");
    if (!nm->is_string()) return wrong_type(cp + ".function.name", "a string", *nm);
    tc.name = nm->get<std::string>();
    if (tc.name.empty()) return rerr(cp + ".function.name", "must not be empty");
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      tc.arguments = "{}";
    } else if (args->is_string()) {
      const std::string& s = args->get_ref<const std::string&>();
      ojson parsed = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) return rerr(cp + ".function.arguments", "not valid JSON");
      tc.arguments = s;
    } else if (args->is_object()) {
      tc.arguments = args->dump();
    } else {
      return wrong_type(cp + ".function.arguments", "a JSON string", *args);
    }
    out.tool_calls.push_back(std::move(tc));
  }
  return std::nullopt;
}

std::optional<RequestError> parse_message(const ojson& m, const std::string& path, Message& out) {
  if (!m.is_object()) return wrong_type(path, "an object", m);
  auto r = m.find("role");
  if (r == m.end()) return rerr(path + ".role", "required");
  if (!r->is_string()) return wrong_type(path + ".role", "a string", *r);
  out.role = r->get<std::string>();
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  if (!kRoles.count(out.role)) return rerr(path + ".role", "unknown role '" + out.role + "'");
  if (auto e = parse_content(m, path, out)) return e;
  if (auto e = parse_tool_calls(m, path, out)) return e;
  if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null()) {
    if (out.role != "assistant") return rerr(path + ".reasoning_content", "only allowed in assistant messages");
    if (!rc->is_string()) return wrong_type(path + ".reasoning_content", "a string", *rc);
    out.reasoning_content = rc->get<std::string>();
  }
  if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
    if (out.role != "tool") return rerr(path + ".tool_call_id", "only allowed in tool messages");
    if (!id->is_string()) return wrong_type(path + ".tool_call_id", "a string", *id);
    out.tool_call_id = id->get<std::string>();
  }
  if (auto nm = m.find("name"); nm != m.end() && !nm->is_null()) {
    if (!nm->is_string()) return wrong_type(path + ".name", "a string", *nm);
    out.name = nm->get<std::string>();
  }
  return std::nullopt;
}

std::optional<RequestError> parse_tools(const ojson& body, ChatRequest& req) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return wrong_type("tools", "an array", *it);
  std::set<std::string> names;
  for (size_t i = 0; i < it->size(); ++i) {
    const ojson& t = (*it)[i];
    const std::string tp = fmt::format("tools[{}]", i);
    if (!t.is_object()) return wrong_type(tp, "an object", t);
    auto ty = t.find("type");
    if (ty == t.end()) return rerr(tp + ".type", "required");
    if (!ty->is_string()) return wrong_type(tp + ".type", "a string", *ty);
    if (*ty != "function") return rerr(tp + ".type", "unsupported tool type '" + ty->get<std::string>() + "' (expected 'function')");
    auto fn = t.find("function");
    if (fn == t.end()) return rerr(tp + ".function", "required");
    if (!fn->is_object()) return wrong_type(tp + ".function", "an object", *fn);
    Tool tool;
    auto nm = fn->find("name");
    if (nm == fn->end()) return rerr(tp + ".function.name", "required");
    if (!nm->is_string()) return wrong_type(tp + ".function.name", "a string", *nm);
    tool.name = nm->get<std::string>();
    if (!valid_function_name(tool.name))
      return rerr(tp + ".function.name", "invalid function name '" + tool.name + "' (letters, digits, '_', '-', '.', ':'; at most 128)");
    if (!names.insert(tool.name).second) return rerr(tp + ".function.name", "duplicate function name '" + tool.name + "'");
    if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
      if (!d->is_string()) return wrong_type(tp + ".function.description", "a string", *d);
      tool.description = d->get<std::string>();
    }
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
      if (!p->is_object()) return wrong_type(tp + ".function.parameters", "an object (a JSON schema)", *p);
      if (auto props = p->find("properties"); props != p->end() && !props->is_object())
        return wrong_type(tp + ".function.parameters.properties", "an object", *props);
      tool.parameters = *p;
    }
    tool.raw = t;
    req.tools.push_back(std::move(tool));
  }
  return std::nullopt;
}

std::optional<RequestError> parse_tool_choice(const ojson& body, ChatRequest& req) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) {
    req.tool_choice.mode = ToolChoice::Mode::Auto;
    return std::nullopt;
  }
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "auto") req.tool_choice.mode = ToolChoice::Mode::Auto;
    else if (s == "none") req.tool_choice.mode = ToolChoice::Mode::None;
    else if (s == "required") req.tool_choice.mode = ToolChoice::Mode::Required;
    else return rerr("tool_choice", "unknown value '" + s + "' (expected 'auto', 'none', 'required' or an object)");
  } else if (it->is_object()) {
    auto ty = it->find("type");
    if (ty == it->end()) return rerr("tool_choice.type", "required");
    if (!ty->is_string() || *ty != "function") return rerr("tool_choice.type", "must be 'function'");
    auto fn = it->find("function");
    if (fn == it->end()) return rerr("tool_choice.function", "required");
    if (!fn->is_object()) return wrong_type("tool_choice.function", "an object", *fn);
    auto nm = fn->find("name");
    if (nm == fn->end()) return rerr("tool_choice.function.name", "required");
    if (!nm->is_string()) return wrong_type("tool_choice.function.name", "a string", *nm);
    req.tool_choice.mode = ToolChoice::Mode::Named;
    req.tool_choice.name = nm->get<std::string>();
    if (!req.find_tool(req.tool_choice.name))
      return rerr("tool_choice.function.name", "no tool named '" + req.tool_choice.name + "' in tools");
  } else {
    return wrong_type("tool_choice", "a string or an object", *it);
  }
  if (req.tool_choice.mode == ToolChoice::Mode::Required && req.tools.empty())
    return rerr("tool_choice", "'required' needs at least one tool in tools");
  return std::nullopt;
}

std::optional<RequestError> get_bool(const ojson& body, const char* key, bool& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(key, "a boolean", *it);
  out = it->get<bool>();
  return std::nullopt;
}

}  // namespace

RequestResult<ChatRequest> parse_chat_request(const ojson& body) {
  if (!body.is_object()) return wrong_type("body", "a JSON object", body);
  ChatRequest req;
  auto msgs = body.find("messages");
  if (msgs == body.end()) return rerr("messages", "required");
  if (!msgs->is_array()) return wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) return rerr("messages", "must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    Message m;
    if (auto e = parse_message((*msgs)[i], fmt::format("messages[{}]", i), m)) return *e;
    req.messages.push_back(std::move(m));
  }
  if (auto e = parse_tools(body, req)) return *e;
  if (auto e = parse_tool_choice(body, req)) return *e;
  if (auto e = get_bool(body, "parallel_tool_calls", req.parallel_tool_calls)) return *e;
  if (auto e = get_bool(body, "add_generation_prompt", req.add_generation_prompt)) return *e;
  if (auto e = get_bool(body, "stream", req.stream)) return *e;
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) return wrong_type("chat_template_kwargs", "an object", *kw);
    req.chat_template_kwargs = *kw;
    if (auto et = kw->find("enable_thinking"); et != kw->end() && !et->is_boolean())
      return wrong_type("chat_template_kwargs.enable_thinking", "a boolean", *et);
  }
  if (auto rf = body.find("reasoning_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_string()) return wrong_type("reasoning_format", "a string", *rf);
    auto f = parse_reasoning_format(rf->get<std::string>());
    if (!f) return rerr("reasoning_format", "unknown value '" + rf->get<std::string>() + "' (expected none, auto, deepseek, deepseek-legacy)");
    req.reasoning_format = *f;
  }
  return req;
}

}  // namespace kiln::chat
