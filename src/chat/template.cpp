// chat/template.cpp — ChatTemplate: capability probes, Jinja context building, rendering.
#include <fmt/format.h>

#include "chat/chat.h"
#include "chat/tool_formats.h"
#include "chat/jinja/jinja.h"

namespace kiln::chat {

struct ChatTemplate::Impl {
  jinja::Template tmpl;
};

ChatTemplate::ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

namespace {

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

// Does the source show "<tool_call>" followed by a JSON object with "name" (possibly written
// inside a Jinja string literal with escaped quotes / "\n")?
bool hermes_json_example(std::string_view src) {
  for (size_t pos = src.find("<tool_call>"); pos != std::string_view::npos; pos = src.find("<tool_call>", pos + 1)) {
    std::string compact;
    for (char ch : src.substr(pos + 11, 24)) {
      if (ch == ' ' || ch == '\n' || ch == '\\') continue;
      compact += ch;
    }
    // "\n" written in a literal leaves an 'n' after removing the backslash.
    if (compact.rfind("n{", 0) == 0) compact.erase(0, 1);
    if (compact.rfind("{\"name\"", 0) == 0 || compact.rfind("{{\"name\"", 0) == 0) return true;
  }
  return false;
}

constexpr std::string_view kProbeTool = "kiln_probe_tool_7f3a";
constexpr std::string_view kProbeText = "KILN_PROBE_TEXT_5c1e";
constexpr std::string_view kProbeSystem = "KILN_PROBE_SYSTEM_91d2";

}  // namespace

kiln::Result<ChatTemplate> ChatTemplate::create(std::string_view source, TemplateConfig cfg) {
  jinja::Options jo;
  jo.strftime_now = cfg.strftime_now;
  auto parsed = jinja::Template::parse(source, jo);
  if (!parsed.ok()) return kiln::err("{}: {}", cfg.name, parsed.error().message);
  ChatTemplate t;
  t.impl_ = std::make_unique<Impl>(Impl{std::move(parsed).value()});
  t.source_ = std::string(source);
  t.cfg_ = std::move(cfg);

  // Static facts from the source text.
  TemplateCaps& c = t.caps_;
  const std::string& src = t.source_;
  if (contains(src, "<think>") && contains(src, "</think>")) {
    c.supports_thinking = true;
    c.reasoning_start = "<think>";
    c.reasoning_end = "</think>";
  }
  c.uses_enable_thinking = contains(src, "enable_thinking");
  c.uses_preserve_vars = contains(src, "preserve_thinking") || contains(src, "clear_thinking") ||
                         contains(src, "truncate_history_thinking");
  if (contains(src, "<function=") && contains(src, "<parameter=")) c.tool_format = ToolCallFormat::QwenXml;
  else if (contains(src, "<tool_call>") && contains(src, "<arg_key>")) c.tool_format = ToolCallFormat::ArgKeyXml;
  else if (hermes_json_example(src)) c.tool_format = ToolCallFormat::HermesJson;
  else if (contains(src, "[TOOL_CALLS]")) c.tool_format = ToolCallFormat::MistralToolCalls;
  else if (contains(src, "{\"name\": function name, \"parameters\"")) c.tool_format = ToolCallFormat::Llama3Json;
  if (ToolCallFormat b = detect_block_format(src); b != ToolCallFormat::None) {
    c.tool_format = b;
    const BlockFormat* bf = block_format(b);
    if (!bf->reasoning_start.empty() && contains(src, bf->reasoning_start)) {
      c.supports_thinking = true;
      c.reasoning_start = std::string(bf->reasoning_start);
      c.reasoning_end = std::string(bf->reasoning_end);
    }
  }

  // Behavioural probes: render small conversations and look for a marker string.
  auto probe = [&](const ojson& ctx, std::string_view needle) {
    auto r = t.render(ctx);
    return r.ok() && contains(r.value(), needle);
  };
  ojson base = {{"bos_token", t.cfg_.bos_token}, {"eos_token", t.cfg_.eos_token}, {"add_generation_prompt", true}};
  {
    ojson ctx = base;
    ctx["messages"] = ojson::array({{{"role", "user"}, {"content", "hi"}}});
    ctx["tools"] = ojson::array({{{"type", "function"},
                                  {"function",
                                   {{"name", kProbeTool},
                                    {"description", "probe"},
                                    {"parameters", {{"type", "object"}, {"properties", ojson::object()}}}}}}});
    c.supports_tools = probe(ctx, kProbeTool);
  }
  {
    ojson ctx = base;
    ctx["messages"] = ojson::array(
        {{{"role", "user"}, {"content", ojson::array({{{"type", "text"}, {"text", kProbeText}}})}}});
    c.supports_typed_content = probe(ctx, kProbeText);
  }
  {
    ojson ctx = base;
    ctx["messages"] = ojson::array({{{"role", "system"}, {"content", kProbeSystem}}, {{"role", "user"}, {"content", "hi"}}});
    c.supports_system_role = probe(ctx, kProbeSystem);
  }
  {
    // Arguments as a string: a template that writes `'…' + arguments` (Functionary v3.2) fails on an
    // object and renders the string; every other template gets the object.
    ojson ctx = base;
    auto with_args = [&](const ojson& args) {
      ojson call = {{"id", "call_0"}, {"type", "function"}, {"function", {{"name", kProbeTool}, {"arguments", args}}}};
      ctx["messages"] = ojson::array({{{"role", "user"}, {"content", "hi"}},
                                      {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}}});
      ctx["add_generation_prompt"] = false;
      return t.render(ctx).ok();
    };
    c.string_arguments = c.tool_format != ToolCallFormat::None && !with_args(ojson{{"a", 1}}) && with_args("{\"a\": 1}");
  }
  // A block format stays when the template renders calls but not the tool list (DeepSeek V3.1's
  // official template): calls are still parsed and tool_choice still constrains them.
  if (!c.supports_tools && !block_format(c.tool_format)) c.tool_format = ToolCallFormat::None;
  return t;
}

kiln::Result<std::string> ChatTemplate::render(const ojson& context) const {
  auto r = impl_->tmpl.render(context);
  if (!r.ok()) return kiln::err("{}: {}", cfg_.name, r.error().message);
  return r;
}

ojson ChatTemplate::build_context(const ChatRequest& req, const ApplyOptions& opt,
                                  std::vector<std::string>* image_urls) const {
  // Index of the last user message: assistant turns before it are "earlier turns" whose
  // reasoning --no-reasoning-preserve drops. Turns after it (the current tool-calling loop)
  // keep theirs: the model needs its own reasoning to continue a multi-step call.
  long last_user = -1;
  for (size_t i = 0; i < req.messages.size(); ++i)
    if (req.messages[i].role == "user") last_user = static_cast<long>(i);

  ojson messages = ojson::array();
  for (size_t i = 0; i < req.messages.size(); ++i) {
    const Message& m = req.messages[i];
    ojson jm = ojson::object();
    // Most templates know only system/user/assistant/tool; OpenAI's "developer" is the system
    // role for newer clients.
    jm["role"] = m.role == "developer" ? std::string("system") : m.role;
    if (m.content_is_null) {
      jm["content"] = "";
    } else if (!m.content_is_parts) {
      jm["content"] = m.content;
    } else if (caps_.supports_typed_content) {
      ojson parts = ojson::array();
      for (const auto& p : m.parts) {
        if (p.kind == ContentPart::Kind::Image) {
          if (image_urls) image_urls->push_back(p.image_url);
          parts.push_back({{"type", "text"}, {"text", kMediaMarker}});
        } else {
          parts.push_back({{"type", "text"}, {"text", p.text}});
        }
      }
      jm["content"] = std::move(parts);
    } else {
      std::string text;
      for (size_t k = 0; k < m.parts.size(); ++k) {
        if (k) text += '\n';
        if (m.parts[k].kind == ContentPart::Kind::Image) {
          if (image_urls) image_urls->push_back(m.parts[k].image_url);
          text += kMediaMarker;
        } else {
          text += m.parts[k].text;
        }
      }
      jm["content"] = std::move(text);
    }
    if (m.reasoning_content && (opt.reasoning_preserve || static_cast<long>(i) > last_user))
      jm["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const auto& tc : m.tool_calls) {
        ojson call = ojson::object();
        if (!tc.id.empty()) call["id"] = tc.id;
        call["type"] = "function";
        // Templates iterate arguments|items or print arguments|tojson: give them the object (unless
        // the template concatenates the arguments as a string: caps_.string_arguments).
        ojson args = caps_.string_arguments ? ojson(ojson::value_t::discarded)
                                            : ojson::parse(tc.arguments, nullptr, /*allow_exceptions=*/false);
        call["function"] = {{"name", tc.name}, {"arguments", args.is_discarded() ? ojson(tc.arguments) : args}};
        calls.push_back(std::move(call));
      }
      jm["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) jm["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) jm["name"] = m.name;
    messages.push_back(std::move(jm));
  }

  ojson ctx = ojson::object();
  ctx["messages"] = std::move(messages);
  if (!req.tools.empty()) {
    ojson tools = ojson::array();
    for (const auto& t : req.tools) tools.push_back(t.raw);
    ctx["tools"] = std::move(tools);
  }
  ctx["add_generation_prompt"] = req.add_generation_prompt;
  ctx["bos_token"] = cfg_.bos_token;
  ctx["eos_token"] = cfg_.eos_token;
  ctx["enable_thinking"] = opt.enable_thinking.value_or(true);
  if (caps_.uses_preserve_vars) {
    ctx["preserve_thinking"] = opt.reasoning_preserve;
    ctx["clear_thinking"] = !opt.reasoning_preserve;
    ctx["truncate_history_thinking"] = !opt.reasoning_preserve;
  }
  // --chat-template-kwargs, then the request's chat_template_kwargs (which win). They cannot
  // replace the conversation itself.
  for (const ojson* kw : {&opt.default_kwargs, &req.chat_template_kwargs}) {
    if (!kw->is_object()) continue;
    for (auto it = kw->begin(); it != kw->end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools") continue;
      ctx[it.key()] = it.value();
    }
  }
  return ctx;
}

kiln::Result<Prompt> ChatTemplate::apply(const ChatRequest& req, const ApplyOptions& opt) const {
  Prompt p;
  p.context = build_context(req, opt, &p.image_urls);
  auto text = render(p.context);
  if (!text.ok()) return text.error();
  p.text = std::move(text).value();

  // Does the generation prompt leave a reasoning block open? (Qwen3.5 ends with "<think>\n".)
  if (req.add_generation_prompt && caps_.supports_thinking) {
    size_t open = p.text.rfind(caps_.reasoning_start);
    size_t close = p.text.rfind(caps_.reasoning_end);
    if (open != std::string::npos && (close == std::string::npos || close < open))
      p.starts_in_reasoning = p.text.find_first_not_of(" \n\r\t", open + caps_.reasoning_start.size()) == std::string::npos;
  }

  ParserConfig& pc = p.parser;
  pc.reasoning_format = req.reasoning_format.value_or(opt.reasoning_format);
  pc.reasoning_in_content = req.stream && pc.reasoning_format == ReasoningFormat::DeepseekLegacy;
  pc.starts_in_reasoning = p.starts_in_reasoning && pc.reasoning_format != ReasoningFormat::None;
  if (caps_.supports_thinking) {
    pc.reasoning_start = caps_.reasoning_start;
    pc.reasoning_end = caps_.reasoning_end;
  }
  pc.parse_tool_calls = !req.tools.empty() && req.tool_choice.mode != ToolChoice::Mode::None &&
                        caps_.tool_format != ToolCallFormat::None;
  pc.tool_format = caps_.tool_format;
  if (pc.parse_tool_calls) pc.tools = req.tools;
  return p;
}

}  // namespace kiln::chat
