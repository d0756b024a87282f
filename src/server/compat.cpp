// server/compat.cpp — the routes of other vendors' APIs, each a translation into the chat pipeline:
//   Anthropic `POST /v1/messages` and `/v1/messages/count_tokens` (server/anthropic.h), OpenAI
//   `POST /v1/responses` and `GET` / `DELETE /v1/responses/{id}` (server/responses.h).
// Must not: hold API shapes (those are anthropic.cpp's / responses.cpp's) or generation logic
//   (generate.cpp's prepare_chat / start_dialect run the request exactly as /v1/chat/completions).
// Threading: each handler runs on the HTTP worker thread serving the request.
#include "server/anthropic.h"
#include "server/impl.h"
#include "server/responses.h"

namespace kiln::server {

void Server::Impl::h_messages(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  AnthropicRequest ar;
  if (auto e = anthropic_to_chat(body, /*count_tokens=*/false, ar)) return send_error_for(req, res, *e);
  json chat = ar.chat_body;
  auto d = std::make_shared<AnthropicDialect>(model_id, std::move(ar));
  // Tool-use ids in Anthropic's form.
  start_dialect(chat, req, res, d, [](Gen& g) { g.parser->make_tool_call_id = anthropic_tool_id; });
}

void Server::Impl::h_count_tokens(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  AnthropicRequest ar;
  if (auto e = anthropic_to_chat(body, /*count_tokens=*/true, ar)) return send_error_for(req, res, *e);
  AnthropicDialect d(model_id, ar);
  chat::ChatRequest creq;
  chat::Prompt prompt;
  if (auto e = render_chat(ar.chat_body, creq, prompt)) return send_error_for(req, res, d.from_chat_error(*e));
  // The rendered prompt as the model would see it (images counted as their marker until vision).
  send_json(res, {{"input_tokens", int64_t(tokenize_prompt(prompt.text).size())}});
}

void Server::Impl::h_responses(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  ResponsesRequest rr;
  if (auto e = responses_to_chat(body, *response_store, rr)) return send_error(res, *e);
  json chat = rr.chat_body;
  start_dialect(chat, req, res, std::make_shared<ResponsesDialect>(model_id, std::move(rr), response_store));
}

void Server::Impl::h_response_get(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto e = response_store->get(id);
  if (!e) return send_error(res, error_of(404, "not_found_error", "no stored response '" + id + "'"));
  send_json(res, e->response);
}

void Server::Impl::h_response_delete(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!response_store->erase(id)) return send_error(res, error_of(404, "not_found_error", "no stored response '" + id + "'"));
  send_json(res, {{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
}

}  // namespace kiln::server
