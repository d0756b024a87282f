// server/anthropic.cpp — Anthropic Messages API ⇄ chat pipeline (see anthropic.h).
#include "server/anthropic.h"

#include <fmt/format.h>

#include <random>

namespace kiln::server {

namespace {

std::string random_alnum(size_t n) {
  static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(n, 'x');
  for (auto& c : s) c = al[rng() % (sizeof(al) - 1)];
  return s;
}

std::optional<ApiError> want(const json& v, bool ok, const std::string& field, const char* what) {
  if (ok) return std::nullopt;
  return bad_request(field, fmt::format("expected {}, got {}", what, json_kind(v)));
}

#define KILN_ANTHROPIC_TRY(expr)     \
  do {                               \
    if (auto e_ = (expr)) return e_; \
  } while (0)

// An image block's source → an OpenAI image_url part (the chat pipeline fetches, decodes and
// checks it: server/images.cpp, so that images are handled in one place).
std::optional<ApiError> image_part(const json& blk, const std::string& f, json& part) {
  auto src = blk.find("source");
  if (src == blk.end() || !src->is_object()) return bad_request(f + ".source", "expected an object");
  const std::string type = src->value("type", "");
  std::string url;
  if (type == "base64") url = "data:" + src->value("media_type", "image/png") + ";base64," + src->value("data", "");
  else if (type == "url") url = src->value("url", "");
  else return bad_request(f + ".source.type", fmt::format("'{}' is not supported (base64, url are)", type));
  part = {{"type", "image_url"}, {"image_url", {{"url", url}}}};
  return std::nullopt;
}

// tool_result content: a string or text blocks, joined.
std::optional<ApiError> tool_result_text(const json& blk, const std::string& f, std::string& text) {
  auto c = blk.find("content");
  if (c == blk.end() || c->is_null()) return std::nullopt;
  if (c->is_string()) {
    text = c->get<std::string>();
    return std::nullopt;
  }
  KILN_ANTHROPIC_TRY(want(*c, c->is_array(), f + ".content", "a string or an array of content blocks"));
  for (size_t j = 0; j < c->size(); ++j) {
    const json& b = (*c)[j];
    const std::string bf = fmt::format("{}.content[{}]", f, j);
    KILN_ANTHROPIC_TRY(want(b, b.is_object(), bf, "an object"));
    const std::string t = b.value("type", "");
    if (t == "image") return bad_request(bf + ".type", "images in tool results are not supported yet (the vision issue)");
    if (t != "text") return bad_request(bf + ".type", fmt::format("'{}' blocks are not supported in tool results (text is)", t));
    auto tx = b.find("text");
    KILN_ANTHROPIC_TRY(want(tx == b.end() ? json() : *tx, tx != b.end() && tx->is_string(), bf + ".text", "a string"));
    text += (text.empty() ? "" : "\n") + tx->get<std::string>();
  }
  return std::nullopt;
}

// One Anthropic message → chat messages (a user message's tool_result blocks become tool messages first).
std::optional<ApiError> translate_message(const json& m, size_t i, AnthropicRequest& out) {
  const std::string f = fmt::format("messages[{}]", i);
  KILN_ANTHROPIC_TRY(want(m, m.is_object(), f, "an object"));
  auto role_it = m.find("role");
  if (role_it == m.end()) return bad_request(f + ".role", "is required");
  const std::string role = role_it->is_string() ? role_it->get<std::string>() : "";
  if (role != "user" && role != "assistant")
    return bad_request(f + ".role", fmt::format("expected 'user' or 'assistant', got {}", role_it->dump()));
  json& msgs = out.chat_body["messages"];
  auto c = m.find("content");
  if (c == m.end()) return bad_request(f + ".content", "is required");
  if (c->is_string()) {
    msgs.push_back({{"role", role}, {"content", *c}});
    out.origin.push_back(f);
    return std::nullopt;
  }
  KILN_ANTHROPIC_TRY(want(*c, c->is_array(), f + ".content", "a string or an array of content blocks"));
  json parts = json::array(), calls = json::array();
  std::string text, thinking;
  for (size_t j = 0; j < c->size(); ++j) {
    const json& b = (*c)[j];
    const std::string bf = fmt::format("{}.content[{}]", f, j);
    KILN_ANTHROPIC_TRY(want(b, b.is_object(), bf, "an object"));
    auto t_it = b.find("type");
    if (t_it == b.end() || !t_it->is_string()) return bad_request(bf + ".type", "is required (a string)");
    const std::string t = t_it->get<std::string>();
    auto str = [&](const char* key, std::string& dst) -> std::optional<ApiError> {
      auto v = b.find(key);
      if (v == b.end() || !v->is_string()) return bad_request(bf + "." + key, "is required (a string)");
      dst = v->get<std::string>();
      return std::nullopt;
    };
    if (t == "text") {
      std::string s;
      KILN_ANTHROPIC_TRY(str("text", s));
      if (role == "user") parts.push_back({{"type", "text"}, {"text", s}});
      else text += s;
    } else if (t == "image" && role == "user") {
      json part;
      KILN_ANTHROPIC_TRY(image_part(b, bf, part));
      parts.push_back(part);
    } else if (t == "tool_result" && role == "user") {
      std::string id, result;
      KILN_ANTHROPIC_TRY(str("tool_use_id", id));
      KILN_ANTHROPIC_TRY(tool_result_text(b, bf, result));
      msgs.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
      out.origin.push_back(bf);
    } else if (t == "tool_use" && role == "assistant") {
      std::string id, name;
      KILN_ANTHROPIC_TRY(str("id", id));
      KILN_ANTHROPIC_TRY(str("name", name));
      auto in = b.find("input");
      if (in == b.end() || !in->is_object()) return bad_request(bf + ".input", "is required (an object)");
      calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", in->dump()}}}});
    } else if (t == "thinking" && role == "assistant") {
      std::string s;
      KILN_ANTHROPIC_TRY(str("thinking", s));
      thinking += s;
    } else if (t == "redacted_thinking" && role == "assistant") {
      // Opaque to a local model: dropped.
    } else {
      return bad_request(bf + ".type", fmt::format("'{}' blocks are not supported in {} messages", t, role));
    }
  }
  if (role == "user") {
    if (!parts.empty()) {
      msgs.push_back({{"role", "user"}, {"content", parts}});
      out.origin.push_back(f);
    }
    return std::nullopt;
  }
  json a = {{"role", "assistant"}, {"content", text.empty() && !calls.empty() ? json(nullptr) : json(text)}};
  if (!thinking.empty()) a["reasoning_content"] = thinking;
  if (!calls.empty()) a["tool_calls"] = calls;
  msgs.push_back(a);
  out.origin.push_back(f);
  return std::nullopt;
}

std::optional<ApiError> translate_tools(const json& body, json& chat) {
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    KILN_ANTHROPIC_TRY(want(*it, it->is_array(), "tools", "an array"));
    json tools = json::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string f = fmt::format("tools[{}]", i);
      KILN_ANTHROPIC_TRY(want(t, t.is_object(), f, "an object"));
      if (auto ty = t.find("type"); ty != t.end() && !ty->is_null() && *ty != "custom")
        return bad_request(f + ".type", fmt::format("server tool {} is not supported (only client tools with input_schema)", ty->dump()));
      auto name = t.find("name");
      if (name == t.end() || !name->is_string()) return bad_request(f + ".name", "is required (a string)");
      auto schema = t.find("input_schema");
      if (schema == t.end() || !schema->is_object()) return bad_request(f + ".input_schema", "is required (an object)");
      json fn = {{"name", *name}, {"parameters", *schema}};
      if (auto d = t.find("description"); d != t.end() && d->is_string()) fn["description"] = *d;
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    KILN_ANTHROPIC_TRY(want(*it, it->is_object(), "tool_choice", "an object"));
    const std::string t = it->value("type", "");
    if (t == "auto") chat["tool_choice"] = "auto";
    else if (t == "any") chat["tool_choice"] = "required";
    else if (t == "none") chat["tool_choice"] = "none";
    else if (t == "tool") {
      auto n = it->find("name");
      if (n == it->end() || !n->is_string()) return bad_request("tool_choice.name", "is required (a string)");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *n}}}};
    } else {
      return bad_request("tool_choice.type", fmt::format("expected 'auto', 'any', 'tool' or 'none', got '{}'", t));
    }
    if (auto d = it->find("disable_parallel_tool_use"); d != it->end() && !d->is_null()) {
      KILN_ANTHROPIC_TRY(want(*d, d->is_boolean(), "tool_choice.disable_parallel_tool_use", "a boolean"));
      chat["parallel_tool_calls"] = !d->get<bool>();
    }
  }
  return std::nullopt;
}

const char* error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

}  // namespace

bool is_anthropic_path(std::string_view path) {
  return path == "/v1/messages" || path.substr(0, 13) == "/v1/messages/";
}

json anthropic_error_json(const ApiError& e) {
  return json{{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", e.message}}}};
}

std::string anthropic_tool_id() { return "toolu_" + random_alnum(24); }

std::optional<ApiError> anthropic_to_chat(const json& body, bool count_tokens, AnthropicRequest& out) {
  if (!body.is_object()) return bad_request("", "the request body must be a JSON object");
  json& chat = out.chat_body;
  chat = json::object();
  chat["messages"] = json::array();
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    KILN_ANTHROPIC_TRY(want(*it, it->is_string(), "model", "a string"));
    chat["model"] = *it;
  }
  if (!count_tokens) {
    auto mt = body.find("max_tokens");
    if (mt == body.end() || mt->is_null()) return bad_request("max_tokens", "is required");
    KILN_ANTHROPIC_TRY(want(*mt, mt->is_number_integer(), "max_tokens", "an integer"));
    if (mt->get<int64_t>() < 1) return bad_request("max_tokens", fmt::format("must be at least 1, got {}", mt->get<int64_t>()));
    chat["max_tokens"] = *mt;
    // Sampling fields keep their names; the chat pipeline type- and range-checks them (temperature
    // within Anthropic's [0, 1] here).
    for (const char* k : {"temperature", "top_p", "top_k", "stream", "seed"})  // seed: kiln's extension
      if (auto it = body.find(k); it != body.end()) chat[k] = *it;
    if (auto t = body.find("temperature"); t != body.end() && t->is_number() && (t->get<double>() < 0 || t->get<double>() > 1))
      return bad_request("temperature", fmt::format("{} is out of range [0, 1]", t->dump()));
    // Structured output: output_config.format {"type": "json_schema", "schema": …} → response_format.
    if (auto oc = body.find("output_config"); oc != body.end() && !oc->is_null()) {
      KILN_ANTHROPIC_TRY(want(*oc, oc->is_object(), "output_config", "an object"));
      if (auto fm = oc->find("format"); fm != oc->end() && !fm->is_null()) {
        KILN_ANTHROPIC_TRY(want(*fm, fm->is_object(), "output_config.format", "an object"));
        if (fm->value("type", "") != "json_schema")
          return bad_request("output_config.format.type", "expected 'json_schema'");
        if (!fm->contains("schema")) return bad_request("output_config.format.schema", "is required");
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", (*fm)["schema"]}}}};
      }
    }
    if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
      KILN_ANTHROPIC_TRY(want(*it, it->is_array(), "stop_sequences", "an array of strings"));
      if (!it->empty()) chat["stop"] = *it;
    }
  }
  if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
    std::string sys;
    if (it->is_string()) {
      sys = it->get<std::string>();
    } else {
      KILN_ANTHROPIC_TRY(want(*it, it->is_array(), "system", "a string or an array of text blocks"));
      for (size_t j = 0; j < it->size(); ++j) {
        const json& b = (*it)[j];
        const std::string f = fmt::format("system[{}]", j);
        if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
          return bad_request(f, "expected a text block {\"type\": \"text\", \"text\": …}");
        sys += (sys.empty() ? "" : "\n") + b["text"].get<std::string>();
      }
    }
    chat["messages"].push_back({{"role", "system"}, {"content", sys}});
    out.origin.push_back("system");
  }
  auto msgs = body.find("messages");
  if (msgs == body.end()) return bad_request("messages", "is required");
  KILN_ANTHROPIC_TRY(want(*msgs, msgs->is_array(), "messages", "an array"));
  if (msgs->empty()) return bad_request("messages", "must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) KILN_ANTHROPIC_TRY(translate_message((*msgs)[i], i, out));
  if (msgs->back().value("role", "") == "assistant")
    return bad_request(fmt::format("messages[{}].role", msgs->size() - 1),
                       "a final assistant message (prefill) is not supported: the answer would start a new turn");
  KILN_ANTHROPIC_TRY(translate_tools(body, chat));
  if (auto it = body.find("thinking"); it != body.end() && !it->is_null()) {
    KILN_ANTHROPIC_TRY(want(*it, it->is_object(), "thinking", "an object"));
    const std::string t = it->value("type", "");
    if (t != "enabled" && t != "disabled" && t != "adaptive")
      return bad_request("thinking.type", fmt::format("expected 'enabled', 'adaptive' or 'disabled', got '{}'", t));
    // The template's thinking switch; budget_tokens is not enforced (max_tokens bounds the whole answer).
    chat["chat_template_kwargs"] = {{"enable_thinking", t != "disabled"}};
  }
  return std::nullopt;
}

AnthropicDialect::AnthropicDialect(std::string model, AnthropicRequest req)
    : id_("msg_" + random_alnum(24)), model_(std::move(model)), req_(std::move(req)) {}

ApiError AnthropicDialect::from_chat_error(ApiError e) const {
  // "messages[k]…" of the translated body → the Anthropic field it came from; tool schemas.
  auto rename = [&](std::string& s) {
    if (s.rfind("messages[", 0) == 0) {
      size_t close = s.find(']');
      size_t k = std::stoul(s.substr(9, close - 9));
      if (k < req_.origin.size()) s = req_.origin[k] + s.substr(close + 1);
    } else if (s.rfind("tools[", 0) == 0) {
      size_t p = s.find("].function.parameters");
      if (p != std::string::npos) s = s.substr(0, p) + "].input_schema" + s.substr(p + 21);
      else if ((p = s.find("].function.")) != std::string::npos) s = s.substr(0, p) + "]." + s.substr(p + 11);
    }
  };
  if (!e.param.empty()) {
    const std::string old = e.param;
    rename(e.param);
    if (e.message.rfind(old, 0) == 0) e.message = e.param + e.message.substr(old.size());
  }
  for (auto [from, to] : {std::pair<std::string, std::string>{"response_format.json_schema.schema", "output_config.format.schema"},
                          {"stop", "stop_sequences"}}) {
    if (e.param.rfind(from, 0) != 0) continue;
    const std::string p = to + e.param.substr(from.size());
    if (e.message.rfind(e.param, 0) == 0) e.message = p + e.message.substr(e.param.size());
    e.param = p;
  }
  return e;
}

json AnthropicDialect::usage(const ChatOutcome& o) const {
  // Anthropic counts prompt tokens read from the cache apart from input_tokens.
  return json{{"input_tokens", o.n_prompt - o.timings.cache_n},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", o.timings.cache_n},
              {"output_tokens", o.timings.predicted_n}};
}

namespace {

json tool_input(const std::string& arguments) {
  json in = json::parse(arguments, nullptr, false);
  return in.is_object() ? in : json::object();
}

std::pair<const char*, json> stop_of(const ChatOutcome& o) {
  if (o.finish == engine::FinishReason::Length) return {"max_tokens", nullptr};  // also when calls came before the cut
  if (!o.msg.tool_calls.empty()) return {"tool_use", nullptr};
  if (!o.stop_word.empty()) return {"stop_sequence", o.stop_word};
  return {"end_turn", nullptr};
}

}  // namespace

json AnthropicDialect::response(const ChatOutcome& o) {
  json content = json::array();
  if (!o.msg.reasoning_content.empty())
    content.push_back({{"type", "thinking"}, {"thinking", valid_utf8(o.msg.reasoning_content)}, {"signature", ""}});
  if (!o.msg.content.empty()) content.push_back({{"type", "text"}, {"text", valid_utf8(o.msg.content)}});
  for (const auto& c : o.msg.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
  auto [reason, seq] = stop_of(o);
  return json{{"id", id_},     {"type", "message"},       {"role", "assistant"},  {"model", model_},
              {"content", content}, {"stop_reason", reason}, {"stop_sequence", seq}, {"usage", usage(o)}};
}

std::string AnthropicDialect::close() {
  std::string s;
  if (open_ == Block::Thinking)
    s += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                           {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  if (open_ != Block::None) s += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  open_ = Block::None;
  return s;
}

std::string AnthropicDialect::open(Block b) {
  if (open_ == b) return "";
  std::string s = close();
  ++index_;
  open_ = b;
  json block = b == Block::Thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}} : json{{"type", "text"}, {"text", ""}};
  return s + sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
}

std::string AnthropicDialect::stream_begin(int64_t n_prompt) {
  json msg = {{"id", id_},      {"type", "message"},       {"role", "assistant"},    {"model", model_},
              {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
              {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}};
  return sse_event("message_start", {{"type", "message_start"}, {"message", msg}}) + sse_event("ping", {{"type", "ping"}});
}

std::string AnthropicDialect::stream_delta(const chat::Delta& d) {
  std::string s;
  auto delta = [&](json body) {
    s += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(body)}});
  };
  if (!d.reasoning_content.empty()) {
    s += open(Block::Thinking);
    delta({{"type", "thinking_delta"}, {"thinking", valid_utf8(d.reasoning_content)}});
  }
  if (!d.content.empty()) {
    s += open(Block::Text);
    delta({{"type", "text_delta"}, {"text", valid_utf8(d.content)}});
  }
  // A call's first delta opens a tool_use block; its argument pieces are input_json_delta events (they
  // add up to the call's arguments, which the blocking answer's `input` is parsed from); the block
  // stays open until the next block or the end.
  for (const auto& c : d.tool_calls) {
    if (c.first()) {
      s += close();
      ++index_;
      open_ = Block::ToolUse;
      s += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_},
                                             {"content_block", {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}}}});
    }
    if (!c.arguments.empty()) delta({{"type", "input_json_delta"}, {"partial_json", valid_utf8(c.arguments)}});
  }
  return s;
}

std::string AnthropicDialect::stream_end(const ChatOutcome& o) {
  std::string s = close();
  auto [reason, seq] = stop_of(o);
  s += sse_event("message_delta", {{"type", "message_delta"}, {"delta", {{"stop_reason", reason}, {"stop_sequence", seq}}}, {"usage", usage(o)}});
  return s + sse_event("message_stop", {{"type", "message_stop"}});
}

std::string AnthropicDialect::stream_error(const ApiError& e) { return sse_event("error", anthropic_error_json(e)); }

}  // namespace kiln::server
