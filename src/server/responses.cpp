// server/responses.cpp — OpenAI Responses API ⇄ chat pipeline (see responses.h).
#include "server/responses.h"

#include <fmt/format.h>

#include <ctime>
#include <random>

namespace kiln::server {

namespace {

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char hx[] = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = hx[rng() % 16];
  return s;
}

std::optional<ApiError> want(const json& v, bool ok, const std::string& field, const char* what) {
  if (ok) return std::nullopt;
  return bad_request(field, fmt::format("expected {}, got {}", what, json_kind(v)));
}

#define KILN_RESPONSES_TRY(expr)     \
  do {                               \
    if (auto e_ = (expr)) return e_; \
  } while (0)

// Builds chat messages from input items: consecutive assistant items (reasoning, message,
// function_call) become one assistant message.
struct InputBuilder {
  json msgs = json::array();
  std::vector<std::string> origin;
  std::string pending_reasoning;
  bool assistant_open = false;  // msgs.back() is an assistant message built from items

  json& assistant(const std::string& f) {
    if (!assistant_open) {
      msgs.push_back({{"role", "assistant"}, {"content", nullptr}});
      origin.push_back(f);
      assistant_open = true;
    }
    json& a = msgs.back();
    if (!pending_reasoning.empty()) {
      a["reasoning_content"] = a.value("reasoning_content", "") + pending_reasoning;
      pending_reasoning.clear();
    }
    return a;
  }

  void push(json m, const std::string& f) {
    assistant_open = false;
    msgs.push_back(std::move(m));
    origin.push_back(f);
  }

  // A message's content: a string, or parts (input_text / output_text / input_image / refusal).
  std::optional<ApiError> content(const json& item, const std::string& f, bool assistant_role, json& out) {
    auto c = item.find("content");
    if (c == item.end()) return bad_request(f + ".content", "is required");
    if (c->is_string()) {
      out = *c;
      return std::nullopt;
    }
    KILN_RESPONSES_TRY(want(*c, c->is_array(), f + ".content", "a string or an array of content parts"));
    json parts = json::array();
    std::string text;
    for (size_t j = 0; j < c->size(); ++j) {
      const json& p = (*c)[j];
      const std::string pf = fmt::format("{}.content[{}]", f, j);
      KILN_RESPONSES_TRY(want(p, p.is_object(), pf, "an object"));
      const std::string t = p.value("type", "");
      if (t == "input_text" || t == "output_text" || t == "text" || t == "refusal") {
        const char* key = t == "refusal" ? "refusal" : "text";
        auto tx = p.find(key);
        if (tx == p.end() || !tx->is_string()) return bad_request(pf + "." + key, "is required (a string)");
        text += tx->get<std::string>();
        parts.push_back({{"type", "text"}, {"text", *tx}});
      } else if (t == "input_image" && !assistant_role) {
        auto url = p.find("image_url");
        if (url == p.end() || !url->is_string())
          return bad_request(pf + ".image_url", "is required (a URL or data URL; file_id is not supported)");
        parts.push_back({{"type", "image_url"}, {"image_url", {{"url", *url}}}});
      } else {
        return bad_request(pf + ".type", fmt::format("'{}' content parts are not supported here", t));
      }
    }
    out = assistant_role ? json(text) : parts;
    return std::nullopt;
  }

  std::optional<ApiError> item(const json& it, size_t i) {
    const std::string f = fmt::format("input[{}]", i);
    KILN_RESPONSES_TRY(want(it, it.is_object(), f, "an object"));
    const std::string type = it.value("type", it.contains("role") ? "message" : "");
    auto str = [&](const char* key, std::string& dst) -> std::optional<ApiError> {
      auto v = it.find(key);
      if (v == it.end() || !v->is_string()) return bad_request(f + "." + key, "is required (a string)");
      dst = v->get<std::string>();
      return std::nullopt;
    };
    if (type == "message") {
      std::string role;
      KILN_RESPONSES_TRY(str("role", role));
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad_request(f + ".role", fmt::format("unknown role '{}'", role));
      json c;
      KILN_RESPONSES_TRY(content(it, f, role == "assistant", c));
      if (role == "assistant") {
        json& a = assistant(f);
        a["content"] = (a["content"].is_string() ? a["content"].get<std::string>() : "") + c.get<std::string>();
      } else {
        push({{"role", role}, {"content", c}}, f);
      }
    } else if (type == "function_call") {
      std::string call_id, name, args;
      KILN_RESPONSES_TRY(str("call_id", call_id));
      KILN_RESPONSES_TRY(str("name", name));
      KILN_RESPONSES_TRY(str("arguments", args));
      json& a = assistant(f);
      if (!a.contains("tool_calls")) a["tool_calls"] = json::array();
      a["tool_calls"].push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
    } else if (type == "function_call_output") {
      std::string call_id;
      KILN_RESPONSES_TRY(str("call_id", call_id));
      auto out = it.find("output");
      json text;
      if (out != it.end() && out->is_string()) text = *out;
      else if (out != it.end() && out->is_array()) KILN_RESPONSES_TRY(content(json{{"content", *out}}, f + ".output", true, text));
      else return bad_request(f + ".output", "is required (a string or an array of content parts)");
      push({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}}, f);
    } else if (type == "reasoning") {
      // The reasoning text (content), else its summary: attached to the next assistant message.
      std::string text;
      for (const char* key : {"content", "summary"}) {
        if (!text.empty()) break;
        if (auto c = it.find(key); c != it.end() && c->is_array())
          for (const auto& p : *c)
            if (p.is_object() && p.contains("text") && p["text"].is_string()) text += p["text"].get<std::string>();
      }
      pending_reasoning += text;
    } else {
      return bad_request(f + ".type", fmt::format("'{}' input items are not supported (message, function_call, "
                                                  "function_call_output and reasoning are)", type));
    }
    return std::nullopt;
  }
};

std::optional<ApiError> translate_tools(const json& body, json& chat) {
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_array(), "tools", "an array"));
    json tools = json::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string f = fmt::format("tools[{}]", i);
      KILN_RESPONSES_TRY(want(t, t.is_object(), f, "an object"));
      const std::string type = t.value("type", "");
      if (type != "function") return bad_request(f + ".type", fmt::format("'{}' tools are not supported (function tools are)", type));
      auto name = t.find("name");
      if (name == t.end() || !name->is_string()) return bad_request(f + ".name", "is required (a string)");
      json fn = {{"name", *name}};
      if (auto p = t.find("parameters"); p != t.end() && !p->is_null()) fn["parameters"] = *p;
      if (auto d = t.find("description"); d != t.end() && d->is_string()) fn["description"] = *d;
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      chat["tool_choice"] = *it;  // auto / none / required, checked by the chat pipeline
    } else {
      KILN_RESPONSES_TRY(want(*it, it->is_object(), "tool_choice", "a string or an object"));
      if (it->value("type", "") != "function" || !it->contains("name") || !(*it)["name"].is_string())
        return bad_request("tool_choice", "expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": …}");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
    }
  }
  return std::nullopt;
}

}  // namespace

void ResponseStore::put(const std::string& id, Entry e) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = map_.find(id); it != map_.end()) {
    lru_.erase(it->second.second);
    map_.erase(it);
  }
  lru_.push_front(id);
  map_.emplace(id, std::make_pair(std::move(e), lru_.begin()));
  while (map_.size() > max_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return false;
  lru_.erase(it->second.second);
  map_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return map_.size();
}

std::optional<ApiError> responses_to_chat(const json& body, ResponseStore& store, ResponsesRequest& out) {
  if (!body.is_object()) return bad_request("", "the request body must be a JSON object");
  json& chat = out.chat_body;
  chat = json::object();
  for (const char* k : {"background", "conversation", "prompt"})
    if (auto it = body.find(k); it != body.end() && !it->is_null() && *it != json(false))
      return bad_request(k, fmt::format("'{}' is not supported", k));
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_string(), "model", "a string"));
    chat["model"] = *it;
  }
  for (const char* k : {"temperature", "top_p", "stream", "parallel_tool_calls", "seed"})  // seed: kiln's extension
    if (auto it = body.find(k); it != body.end()) chat[k] = *it;
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) chat["max_tokens"] = *it;
  if (auto it = body.find("store"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_boolean(), "store", "a boolean"));
    out.store = it->get<bool>();
  }
  json messages = json::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_string(), "instructions", "a string"));
    messages.push_back({{"role", "system"}, {"content", *it}});
    out.origin.push_back("instructions");
  }
  if (auto it = body.find("previous_response_id"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_string(), "previous_response_id", "a string"));
    auto prev = store.get(it->get<std::string>());
    if (!prev)
      return bad_request("previous_response_id", fmt::format("no stored response '{}' (responses live in this server process "
                                                             "only, and only with store: true)", it->get<std::string>()));
    out.history = prev->messages;
    for (const auto& m : out.history) {
      messages.push_back(m);
      out.origin.push_back("previous_response_id");
    }
  }
  InputBuilder ib;
  auto in = body.find("input");
  if (in == body.end() || in->is_null()) return bad_request("input", "is required");
  if (in->is_string()) {
    ib.push({{"role", "user"}, {"content", *in}}, "input");
  } else {
    KILN_RESPONSES_TRY(want(*in, in->is_array(), "input", "a string or an array of input items"));
    for (size_t i = 0; i < in->size(); ++i) KILN_RESPONSES_TRY(ib.item((*in)[i], i));
  }
  if (ib.msgs.empty()) return bad_request("input", "must contain at least one message or item");
  for (size_t k = 0; k < ib.msgs.size(); ++k) {
    messages.push_back(ib.msgs[k]);
    out.history.push_back(ib.msgs[k]);
    out.origin.push_back(ib.origin[k]);
  }
  chat["messages"] = messages;
  KILN_RESPONSES_TRY(translate_tools(body, chat));
  if (auto it = body.find("text"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_object(), "text", "an object"));
    if (auto fm = it->find("format"); fm != it->end() && !fm->is_null()) {
      KILN_RESPONSES_TRY(want(*fm, fm->is_object(), "text.format", "an object"));
      const std::string t = fm->value("type", "");
      if (t == "json_schema") {
        json js = {{"name", fm->value("name", "output")}};
        if (fm->contains("schema")) js["schema"] = (*fm)["schema"];
        if (fm->contains("strict")) js["strict"] = (*fm)["strict"];
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else {
        chat["response_format"] = {{"type", t}};
      }
    }
  }
  if (auto it = body.find("reasoning"); it != body.end() && !it->is_null()) {
    KILN_RESPONSES_TRY(want(*it, it->is_object(), "reasoning", "an object"));
    if (auto ef = it->find("effort"); ef != it->end() && ef->is_string())
      chat["chat_template_kwargs"] = {{"enable_thinking", *ef != "none"}};
  }
  for (const char* k : {"instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "previous_response_id", "reasoning",
                        "temperature", "text", "tool_choice", "tools", "top_p", "truncation"})
    if (auto it = body.find(k); it != body.end()) out.echo[k] = *it;
  return std::nullopt;
}

ResponsesDialect::ResponsesDialect(std::string model, ResponsesRequest req, std::shared_ptr<ResponseStore> store)
    : id_("resp_" + random_hex(48)), model_(std::move(model)), created_(int64_t(std::time(nullptr))), req_(std::move(req)),
      store_(std::move(store)) {}

ApiError ResponsesDialect::from_chat_error(ApiError e) const {
  std::string p = e.param;
  if (p.rfind("messages[", 0) == 0) {
    size_t close = p.find(']');
    size_t k = std::stoul(p.substr(9, close - 9));
    if (k < req_.origin.size()) p = req_.origin[k] + p.substr(close + 1);
  } else if (p.rfind("tools[", 0) == 0 && p.find("].function.") != std::string::npos) {
    p.replace(p.find("].function."), 11, "].");
  } else if (p == "max_tokens") {
    p = "max_output_tokens";
  } else if (p.rfind("response_format", 0) == 0) {
    p = "text.format" + p.substr(p.rfind("response_format.json_schema", 0) == 0 ? 27 : 15);
  }
  if (p != e.param) {
    if (e.message.rfind(e.param, 0) == 0) e.message = p + e.message.substr(e.param.size());
    e.param = p;
  }
  return e;
}

json ResponsesDialect::envelope(const char* status) const {
  const json& q = req_.echo;
  auto echo = [&](const char* k, json dflt) { return q.contains(k) ? q[k] : dflt; };
  return json{{"id", id_},
              {"object", "response"},
              {"created_at", created_},
              {"status", status},
              {"model", model_},
              {"output", json::array()},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"instructions", echo("instructions", nullptr)},
              {"max_output_tokens", echo("max_output_tokens", nullptr)},
              {"metadata", echo("metadata", json::object())},
              {"parallel_tool_calls", echo("parallel_tool_calls", true)},
              {"previous_response_id", echo("previous_response_id", nullptr)},
              {"reasoning", echo("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
              {"store", req_.store},
              {"temperature", echo("temperature", nullptr)},
              {"text", echo("text", json{{"format", {{"type", "text"}}}})},
              {"tool_choice", echo("tool_choice", "auto")},
              {"tools", echo("tools", json::array())},
              {"top_p", echo("top_p", nullptr)},
              {"truncation", echo("truncation", "disabled")},
              {"usage", nullptr}};
}

json ResponsesDialect::finish(const ChatOutcome& o, json output) {
  const bool cut = o.finish == engine::FinishReason::Length;
  json r = envelope(cut ? "incomplete" : "completed");
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["output"] = output;
  r["usage"] = {{"input_tokens", o.n_prompt},
                {"input_tokens_details", {{"cached_tokens", o.timings.cache_n}}},
                {"output_tokens", o.timings.predicted_n},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", o.n_prompt + o.timings.predicted_n}};
  if (req_.store && store_) {
    // The conversation continues with the assistant's turn, as the chat pipeline reads it back.
    json a = {{"role", "assistant"}, {"content", o.msg.content.empty() && !o.msg.tool_calls.empty() ? json(nullptr) : json(o.msg.content)}};
    if (!o.msg.reasoning_content.empty()) a["reasoning_content"] = o.msg.reasoning_content;
    if (!o.msg.tool_calls.empty()) {
      a["tool_calls"] = json::array();
      for (const auto& c : o.msg.tool_calls)
        a["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    json msgs = req_.history;
    msgs.push_back(a);
    store_->put(id_, ResponseStore::Entry{r, msgs});
  }
  return r;
}

namespace {

json reasoning_item(const std::string& id, const std::string& text) {
  return json{{"id", id}, {"type", "reasoning"}, {"summary", json::array()},
              {"content", json::array({{{"type", "reasoning_text"}, {"text", valid_utf8(text)}}})}, {"status", "completed"}};
}
json text_part(const std::string& text) {
  return json{{"type", "output_text"}, {"text", valid_utf8(text)}, {"annotations", json::array()}, {"logprobs", json::array()}};
}
json message_item(const std::string& id, const std::string& text, const char* status) {
  json content = json::array();
  if (!text.empty() || std::string(status) == "completed") content.push_back(text_part(text));
  return json{{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
}
json call_item(const std::string& id, const std::string& call_id, const std::string& name, const std::string& args, const char* status) {
  return json{{"id", id}, {"type", "function_call"}, {"status", status}, {"call_id", call_id}, {"name", name}, {"arguments", args}};
}

}  // namespace

json ResponsesDialect::response(const ChatOutcome& o) {
  json output = json::array();
  if (!o.msg.reasoning_content.empty()) output.push_back(reasoning_item("rs_" + random_hex(48), o.msg.reasoning_content));
  if (!o.msg.content.empty() || o.msg.tool_calls.empty()) output.push_back(message_item("msg_" + random_hex(48), o.msg.content, "completed"));
  for (const auto& c : o.msg.tool_calls) output.push_back(call_item("fc_" + random_hex(48), c.id, c.name, c.arguments, "completed"));
  return finish(o, std::move(output));
}

std::string ResponsesDialect::event(const char* type, json body) {
  json e = {{"type", type}, {"sequence_number", seq_++}};
  for (auto& [k, v] : body.items()) e[k] = std::move(v);
  return sse_event(type, e);
}

std::string ResponsesDialect::close() {
  if (open_ == Item::None) return "";
  const int64_t idx = int64_t(items_.size());
  std::string s;
  json item;
  if (open_ == Item::FunctionCall) {
    item = call_item(item_id_, call_id_, call_name_, valid_utf8(text_), "completed");
    s += event("response.function_call_arguments.done",
               {{"item_id", item_id_}, {"output_index", idx}, {"name", call_name_}, {"arguments", valid_utf8(text_)}});
  } else if (open_ == Item::Reasoning) {
    item = reasoning_item(item_id_, text_);
    json part = {{"type", "reasoning_text"}, {"text", valid_utf8(text_)}};
    s += event("response.reasoning_text.done", {{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"text", valid_utf8(text_)}});
    s += event("response.content_part.done", {{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"part", part}});
  } else {
    item = message_item(item_id_, text_, "completed");
    s += event("response.output_text.done", {{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0},
                                             {"text", valid_utf8(text_)}, {"logprobs", json::array()}});
    s += event("response.content_part.done", {{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"part", text_part(text_)}});
  }
  s += event("response.output_item.done", {{"output_index", idx}, {"item", item}});
  items_.push_back(item);
  open_ = Item::None;
  text_.clear();
  return s;
}

std::string ResponsesDialect::open(Item k) {
  if (open_ == k) return "";
  std::string s = close();
  open_ = k;
  const int64_t idx = int64_t(items_.size());
  item_id_ = (k == Item::Reasoning ? "rs_" : "msg_") + random_hex(48);
  json item = k == Item::Reasoning ? json{{"id", item_id_}, {"type", "reasoning"}, {"summary", json::array()}, {"content", json::array()},
                                          {"status", "in_progress"}}
                                   : message_item(item_id_, "", "in_progress");
  json part = k == Item::Reasoning ? json{{"type", "reasoning_text"}, {"text", ""}} : text_part("");
  s += event("response.output_item.added", {{"output_index", idx}, {"item", item}});
  s += event("response.content_part.added", {{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"part", part}});
  return s;
}

std::string ResponsesDialect::stream_begin(int64_t) {
  json r = envelope("in_progress");
  std::string s = event("response.created", {{"response", r}});
  return s + event("response.in_progress", {{"response", r}});
}

std::string ResponsesDialect::stream_delta(const chat::Delta& d) {
  std::string s;
  if (!d.reasoning_content.empty()) {
    s += open(Item::Reasoning);
    text_ += d.reasoning_content;
    s += event("response.reasoning_text.delta", {{"item_id", item_id_}, {"output_index", int64_t(items_.size())}, {"content_index", 0},
                                                 {"delta", valid_utf8(d.reasoning_content)}});
  }
  if (!d.content.empty()) {
    s += open(Item::Message);
    text_ += d.content;
    s += event("response.output_text.delta", {{"item_id", item_id_}, {"output_index", int64_t(items_.size())}, {"content_index", 0},
                                              {"delta", valid_utf8(d.content)}, {"logprobs", json::array()}});
  }
  // A call's first delta adds a function_call item; its argument pieces are
  // function_call_arguments.delta events; the item is done at the next item or the end.
  for (const auto& c : d.tool_calls) {
    if (c.first()) {
      s += close();
      open_ = Item::FunctionCall;
      item_id_ = "fc_" + random_hex(48);
      call_id_ = c.id;
      call_name_ = c.name;
      s += event("response.output_item.added",
                 {{"output_index", int64_t(items_.size())}, {"item", call_item(item_id_, c.id, c.name, "", "in_progress")}});
    }
    if (c.arguments.empty() || open_ != Item::FunctionCall) continue;
    text_ += c.arguments;
    s += event("response.function_call_arguments.delta",
               {{"item_id", item_id_}, {"output_index", int64_t(items_.size())}, {"delta", valid_utf8(c.arguments)}});
  }
  return s;
}

std::string ResponsesDialect::stream_end(const ChatOutcome& o) {
  std::string s = close();
  if (items_.empty()) {  // nothing generated: one empty message, as the non-streamed answer has
    s += open(Item::Message);
    s += close();
  }
  json r = finish(o, items_);
  return s + event(r["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", r}});
}

std::string ResponsesDialect::stream_error(const ApiError& e) {
  return event("error", {{"code", e.type}, {"message", e.message}, {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
}

}  // namespace kiln::server
