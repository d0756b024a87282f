// server/constraint.cpp — response_format / json_schema / grammar → engine grammar (see constraint.h).
#include "server/constraint.h"

#include <fmt/format.h>

#include <algorithm>

#include "chat/json_schema.h"
#include "chat/tool_formats.h"
#include "chat/tool_grammar.h"
#include "engine/grammar.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

namespace {

ApiError schema_error(const chat::RequestError& e) { return bad_request(e.field, e.message); }

}  // namespace

std::vector<int32_t> preserved_marker_tokens(const tokenizer::Tokenizer& tok, chat::ToolCallFormat format) {
  std::vector<int32_t> ids;
  for (std::string_view m : chat::tool_call_markers(format)) {
    const auto id = tok.find(m);
    if (id != tokenizer::kNoToken && tok.is_control(id)) ids.push_back(int32_t(id));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::optional<ApiError> compile_grammar(const std::string& text, const std::string& field, GenParams& out) {
  auto g = engine::Grammar::parse(text);
  if (!g.ok()) {
    std::string m = g.error().message;
    if (m.rfind("grammar: ", 0) == 0) m = m.substr(9);
    return bad_request(field, m);
  }
  out.req.grammar = *g;
  return std::nullopt;
}

std::optional<ApiError> parse_constraint(const json& b, GenParams& out) {
  std::vector<std::string> given;
  std::string gbnf, field;

  if (auto it = b.find("response_format"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return bad_request("response_format", fmt::format("expected an object, got {}", json_kind(*it)));
    auto t = it->find("type");
    if (t == it->end() || !t->is_string()) return bad_request("response_format.type", "expected a string");
    const std::string type = t->get<std::string>();
    if (type == "json_object") {
      // llama-server also takes a schema here: {"type": "json_object", "schema": {…}}.
      if (auto s = it->find("schema"); s != it->end() && !s->is_null()) {
        auto r = chat::json_schema_to_gbnf(*s, "response_format.schema");
        if (!r.ok()) return schema_error(r.error());
        gbnf = *r;
      } else {
        gbnf = chat::json_object_gbnf();
      }
      field = "response_format";
      given.push_back("response_format");
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        return bad_request("response_format.json_schema", "expected an object with the schema");
      if (auto st = js->find("strict"); st != js->end() && !st->is_null() && !st->is_boolean())
        return bad_request("response_format.json_schema.strict", fmt::format("expected a boolean, got {}", json_kind(*st)));
      if (auto n = js->find("name"); n != js->end() && !n->is_null() && !n->is_string())
        return bad_request("response_format.json_schema.name", fmt::format("expected a string, got {}", json_kind(*n)));
      auto s = js->find("schema");
      if (s == js->end() || s->is_null()) return bad_request("response_format.json_schema.schema", "is required");
      auto r = chat::json_schema_to_gbnf(*s, "response_format.json_schema.schema");
      if (!r.ok()) return schema_error(r.error());
      gbnf = *r;
      field = "response_format";
      given.push_back("response_format");
    } else if (type != "text") {
      return bad_request("response_format.type",
                         fmt::format("'{}' is not supported (text, json_object, json_schema are)", type));
    }
  }
  if (auto it = b.find("json_schema"); it != b.end() && !it->is_null()) {
    if (!it->is_object() && !it->is_boolean())
      return bad_request("json_schema", fmt::format("expected a JSON schema (an object), got {}", json_kind(*it)));
    if (!(it->is_object() && it->empty())) {
      auto r = chat::json_schema_to_gbnf(*it, "json_schema");
      if (!r.ok()) return schema_error(r.error());
      gbnf = *r;
      field = "json_schema";
      given.push_back("json_schema");
    }
  }
  if (auto it = b.find("grammar"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) return bad_request("grammar", fmt::format("expected GBNF text (a string), got {}", json_kind(*it)));
    if (!it->get<std::string>().empty()) {
      gbnf = it->get<std::string>();
      field = "grammar";
      given.push_back("grammar");
    }
  }
  if (given.size() > 1)
    return bad_request(given[1], fmt::format("only one of response_format (json), json_schema and grammar may be given, got {} and {}",
                                             given[0], given[1]));
  if (given.empty()) return std::nullopt;
  return compile_grammar(gbnf, field, out);
}

std::optional<ApiError> apply_tool_choice(const chat::ChatRequest& req, const chat::TemplateCaps& caps,
                                          const std::string& template_source, GenParams& out) {
  using Mode = chat::ToolChoice::Mode;
  if (req.tool_choice.mode != Mode::Required && req.tool_choice.mode != Mode::Named) return std::nullopt;
  if (out.req.grammar)
    return bad_request("tool_choice", "a required or named tool_choice cannot be combined with response_format (json), "
                                      "json_schema or grammar");
  chat::ToolGrammarOptions o;
  o.format = caps.tool_format;
  o.mistral_args = template_source.find("[ARGS]") != std::string::npos;
  o.parallel = req.parallel_tool_calls;
  auto g = chat::tool_call_gbnf(req, o);
  if (!g.ok()) return schema_error(g.error());
  return compile_grammar(*g, "tool_choice", out);
}

}  // namespace kiln::server
