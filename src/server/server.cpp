// server/server.cpp — the server's set-up over cpp-httplib (see server.h): routes, auth and readiness,
//   error bodies in the shape of the path's API (Anthropic's under /v1/messages), the small endpoints
//   (tokenize, detokenize, apply-template, models, props, slots, metrics, health, web UI), template
//   loading and run/stop. The generation endpoints are generate.cpp's, the Anthropic / Responses
//   routes compat.cpp's, embeddings and slot actions embed_slots.cpp's; Server::Impl is declared in
//   impl.h.
#include "server/server.h"

#include <cstdlib>
#include <ctime>
#include <thread>

#include "core/log.h"
#include "core/read_file.h"
#include "server/anthropic.h"
#include "server/impl.h"
#include "server/responses.h"
#include "server/webui.h"

namespace kiln::server {

namespace {

// ChatML: the fallback when the model has no tokenizer.chat_template (llama-server does the same).
constexpr const char* kChatmlTemplate =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Time depends only on the lengths, never on where the strings differ.
  size_t n = std::max(a.size(), b.size());
  unsigned diff = unsigned(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? (unsigned char)a[i] : 0;
    unsigned char y = i < b.size() ? (unsigned char)b[i] : 0;
    diff |= unsigned(x ^ y);
  }
  return diff == 0;
}

int64_t unix_now() { return int64_t(std::time(nullptr)); }

std::string file_stem(const std::string& path) {
  auto slash = path.find_last_of('/');
  std::string f = slash == std::string::npos ? path : path.substr(slash + 1);
  return f;
}


}  // namespace

void Server::Impl::send_json(httplib::Response& res, const json& j, int status) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json; charset=utf-8");
}

ApiError Server::Impl::error_of(int status, std::string type, std::string message) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  return e;
}

bool Server::Impl::is_public(const httplib::Request& req) const {
  if (req.method == "OPTIONS") return true;
  if (req.path == "/health" || req.path == "/v1/health") return true;
  std::string_view body, type;
  return req.method == "GET" && webui::find(req.path, body, type);  // the web UI's page
}

bool Server::Impl::authorized(const httplib::Request& req) const {
  if (opt.api_keys.empty()) return true;
  std::string key;
  std::string auth = req.get_header_value("Authorization");
  const std::string bearer = "Bearer ";
  if (auth.size() > bearer.size() && auth.compare(0, bearer.size(), bearer) == 0) key = auth.substr(bearer.size());
  if (key.empty()) key = req.get_header_value("x-api-key");
  if (key.empty()) return false;
  bool ok = false;
  for (const auto& k : opt.api_keys) ok |= constant_time_equal(k, key);  // no early exit
  return ok;
}

void Server::Impl::send_error_for(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  send_json(res, is_anthropic_path(req.path) ? anthropic_error_json(e) : e.to_json(), e.status);
}

bool Server::Impl::parse_body(const httplib::Request& req, httplib::Response& res, json& body) {
  body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) {
    send_error_for(req, res, bad_request("", "the request body is not valid JSON"));
    return false;
  }
  if (!body.is_object()) {
    send_error_for(req, res, bad_request("", "the request body must be a JSON object"));
    return false;
  }
  return true;
}

std::vector<int32_t> Server::Impl::tokenize_prompt(const std::string& text) const {
  tokenizer::EncodeOptions eo;
  eo.add_special = true;
  eo.parse_special = true;
  auto ids = tok().encode(text, eo);
  // A template that renders bos_token itself plus the vocabulary's add_bos would double it.
  if (ids.size() >= 2 && info().bos >= 0 && ids[0] == info().bos && ids[1] == info().bos) ids.erase(ids.begin());
  return ids;
}

std::optional<ApiError> Server::Impl::check_context(size_t n_prompt) const {
  if (n_prompt == 0) return bad_request("prompt", "the prompt is empty after tokenization");
  if (int64_t(n_prompt) >= info().n_ctx_slot) {
    ApiError e = error_of(400, "exceed_context_size_error",
                          fmt::format("the request exceeds the available context size: the prompt has {} tokens, a slot "
                                      "holds {} (raise -c/--ctx-size or lower --parallel)",
                                      n_prompt, info().n_ctx_slot));
    e.param = "messages";
    return e;
  }
  return std::nullopt;
}

void Server::Impl::h_tokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  auto it = body.find("content");
  if (it == body.end() || !it->is_string()) return send_error(res, bad_request("content", "expected a string"));
  bool add_special = false, parse_special = true, with_pieces = false;
  for (auto [k, dst] : {std::pair<const char*, bool*>{"add_special", &add_special}, {"parse_special", &parse_special}, {"with_pieces", &with_pieces}}) {
    auto f = body.find(k);
    if (f == body.end() || f->is_null()) continue;
    if (!f->is_boolean()) return send_error(res, bad_request(k, "expected a boolean"));
    *dst = f->get<bool>();
  }
  tokenizer::EncodeOptions eo;
  eo.add_special = add_special;
  eo.parse_special = parse_special;
  auto ids = tok().encode(it->get<std::string>(), eo);
  json toks = json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      toks.push_back(id);
      continue;
    }
    std::string p = tok().token_to_piece(id, true);
    json piece = valid_utf8(p) == p ? json(p) : bytes_array(p);
    toks.push_back({{"id", id}, {"piece", piece}});
  }
  send_json(res, {{"tokens", toks}});
}

void Server::Impl::h_detokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) return send_error(res, bad_request("tokens", "expected an array of token ids"));
  std::vector<int32_t> ids;
  for (size_t k = 0; k < it->size(); ++k) {
    const auto& v = (*it)[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= info().n_vocab)
      return send_error(res, bad_request(fmt::format("tokens[{}]", k), fmt::format("expected a token id in [0, {})", info().n_vocab)));
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  send_json(res, {{"content", valid_utf8(tok().decode(ids))}});
}

void Server::Impl::h_apply_template(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  chat::ChatRequest creq;
  chat::Prompt prompt;
  if (auto e = render_chat(body, creq, prompt)) return send_error(res, *e);
  send_json(res, {{"prompt", prompt.text}});
}

json Server::Impl::model_meta() const {
  const auto& mi = info();
  return json{{"arch", mi.arch},         {"name", mi.name},     {"n_ctx_train", mi.n_ctx_train}, {"n_ctx", mi.n_ctx},
              {"n_vocab", mi.n_vocab},   {"n_embd", mi.n_embd}, {"size", mi.n_params_bytes},     {"hybrid", mi.hybrid}};
}

void Server::Impl::h_models(const httplib::Request&, httplib::Response& res) {
  json data = json::array();
  json models = json::array();
  data.push_back({{"id", model_id}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "kiln"}, {"meta", model_meta()}});
  models.push_back({{"name", model_id}, {"model", model_id}, {"aliases", opt.aliases}, {"details", {{"format", "gguf"}}}});
  send_json(res, {{"object", "list"}, {"data", data}, {"models", models}});
}

void Server::Impl::h_props(const httplib::Request&, httplib::Response& res) {
  const auto& mi = info();
  json params = {{"n_predict", -1}, {"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}};
  send_json(res, {{"default_generation_settings", {{"n_ctx", mi.n_ctx_slot}, {"params", params}}},
                  {"total_slots", eng->options().n_parallel},
                  {"model_alias", model_id},
                  {"model_path", opt.model_path},
                  {"n_ctx", mi.n_ctx},
                  {"n_ctx_slot", mi.n_ctx_slot},
                  {"chat_template", tmpl->source()},
                  {"bos_token", valid_utf8(mi.bos_text)},
                  {"eos_token", valid_utf8(mi.eos_text)},
                  {"modalities", {{"vision", mi.vision}, {"audio", false}}},
                  // kiln's: the most pixels an image can give the model (--image-max-tokens x the
                  // pixels of one token); larger images are scaled down to it anyway (the web UI does
                  // so before sending).
                  {"image_max_pixels", mi.vision ? opt.image_max_tokens * mi.vision_patch * mi.vision_patch *
                                                       mi.vision_merge * mi.vision_merge
                                                 : 0},
                  {"build_info", "kiln " KILN_SERVER_VERSION},
                  {"is_sleeping", false}});
}

void Server::Impl::h_slots(const httplib::Request&, httplib::Response& res) {
  json a = json::array();
  for (const auto& s : eng->slots())
    a.push_back({{"id", s.id},          {"id_task", s.busy ? int64_t(s.request_id) : -1}, {"n_ctx", s.n_ctx},
                 {"is_processing", s.busy}, {"n_past", s.n_past},                        {"n_prompt_tokens", s.n_prompt},
                 {"n_decoded", s.n_decoded}, {"cache_n", s.cache_n},
                 {"draft_n", s.draft_n},     {"draft_n_accepted", s.draft_n_accepted}});
  send_json(res, a);
}

void Server::Impl::h_metrics(const httplib::Request&, httplib::Response& res) {
  if (!opt.metrics)
    return send_error(res, error_of(501, "not_supported_error", "this server does not support metrics (start it with --metrics)"));
  res.set_content(metrics_text(eng->metrics(), http_requests.load(), http_errors.load()), "text/plain; version=0.0.4");
}

void Server::Impl::h_health(const httplib::Request&, httplib::Response& res) {
  if (ready.load()) return send_json(res, {{"status", "ok"}});
  // Loading: llama-server's 503 error body, plus the fraction of the weights checked and placed.
  const ApiError e = error_of(503, "unavailable_error", "Loading model");
  json j = e.to_json();
  j["progress"] = eng ? double(eng->load_progress()) : 0.0;
  send_json(res, j, e.status);
}

void Server::Impl::h_root(const httplib::Request& req, httplib::Response& res) {
  std::string_view body, type;
  if (webui::find(req.path, body, type)) res.set_content(std::string(body), std::string(type));
  else res.status = 404;  // answered by the error handler
}

httplib::Server::Handler Server::Impl::wrap(H h) {
  return [this, h](const httplib::Request& req, httplib::Response& res) {
    try {
      (this->*h)(req, res);
    } catch (const std::exception& e) {
      KILN_LOG_ERROR("{} {}: {}", req.method, req.path, e.what());
      send_error_for(req, res, error_of(500, "server_error", std::string("internal error: ") + e.what()));
    }
  };
}

void Server::Impl::setup_routes() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_keep_alive_max_count(1000);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  int threads = opt.http_threads > 0 ? opt.http_threads : std::max(16, 4 * opt.engine.n_parallel + 4);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_default_headers({{"Server", "kiln"}, {"Access-Control-Allow-Origin", "*"}});

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    http_requests.fetch_add(1);
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    // Answered here, before httplib reads the body: the connection closes after the answer, or the
    // unread body would be parsed as the next request on a kept-alive socket (and stall shutdown).
    const bool pub = is_public(req);
    if (!pub && !authorized(req)) {
      send_error_for(req, res, error_of(401, "authentication_error", "Invalid API Key"));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!ready.load() && !pub) {
      send_error_for(req, res, error_of(503, "unavailable_error", "Loading model"));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return;
    if (res.status == 413)
      send_error_for(req, res, error_of(413, "invalid_request_error",
                               fmt::format("the request body is larger than the limit of {} bytes (--max-body-size)", opt.max_body_bytes)));
    else if (res.status == 404)
      send_error_for(req, res, error_of(404, "not_found_error", fmt::format("no endpoint {} {}", req.method, req.path)));
    else if (res.status >= 500)
      send_error_for(req, res, error_of(res.status, "server_error", "internal error"));
    else
      send_error_for(req, res, error_of(res.status, "invalid_request_error", "malformed HTTP request"));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (res.status >= 400) http_errors.fetch_add(1);
    if (req.path != "/health" && req.path != "/v1/health" && req.path != "/metrics")
      KILN_LOG_DEBUG("{} {} -> {}", req.method, req.path, res.status);
  });

  http.Get("/health", wrap(&Impl::h_health));
  http.Get("/v1/health", wrap(&Impl::h_health));
  http.Get("/v1/models", wrap(&Impl::h_models));
  http.Get("/models", wrap(&Impl::h_models));
  http.Post("/v1/chat/completions", wrap(&Impl::h_chat));
  http.Post("/chat/completions", wrap(&Impl::h_chat));
  http.Post("/v1/completions", wrap(&Impl::h_completions));
  http.Post("/completions", wrap(&Impl::h_completions));
  http.Post("/completion", wrap(&Impl::h_completion));
  http.Post("/infill", wrap(&Impl::h_infill));
  http.Post("/v1/messages", wrap(&Impl::h_messages));
  http.Post("/v1/messages/count_tokens", wrap(&Impl::h_count_tokens));
  http.Post("/v1/responses", wrap(&Impl::h_responses));
  http.Get(R"(/v1/responses/([A-Za-z0-9_\-]+))", wrap(&Impl::h_response_get));
  http.Delete(R"(/v1/responses/([A-Za-z0-9_\-]+))", wrap(&Impl::h_response_delete));
  http.Post("/tokenize", wrap(&Impl::h_tokenize));
  http.Post("/v1/embeddings", wrap(&Impl::h_embeddings));
  http.Post("/embeddings", wrap(&Impl::h_embeddings));
  http.Post("/embedding", wrap(&Impl::h_embedding));
  http.Post("/detokenize", wrap(&Impl::h_detokenize));
  http.Post("/apply-template", wrap(&Impl::h_apply_template));
  http.Get("/props", wrap(&Impl::h_props));
  http.Get("/slots", wrap(&Impl::h_slots));
  http.Post(R"(/slots/([0-9]+))", wrap(&Impl::h_slot_action));
  http.Get("/metrics", wrap(&Impl::h_metrics));
  http.Get("/", wrap(&Impl::h_root));
  http.Get("/index.html", wrap(&Impl::h_root));
}

Status Server::Impl::init_template() {
  std::string src;
  std::string name = "tokenizer.chat_template";
  if (!opt.chat_template_file.empty()) {
    if (!read_file(opt.chat_template_file, src))
      return err("--chat-template-file: cannot read '{}'", opt.chat_template_file);
    name = opt.chat_template_file;
  } else {
    src = info().chat_template;
    if (src.empty()) {
      KILN_LOG_WARN("{}: no tokenizer.chat_template; using ChatML", opt.model_path);
      src = kChatmlTemplate;
      name = "ChatML (fallback)";
    }
  }
  chat::TemplateConfig cfg;
  cfg.name = name;
  cfg.bos_token = info().bos_text;
  cfg.eos_token = info().eos_text;
  auto t = chat::ChatTemplate::create(src, cfg);
  KILN_TRY(t);
  tmpl = std::make_unique<chat::ChatTemplate>(std::move(*t));
  return {};
}

Server::Server(ServerOptions opt) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(opt);
  impl_->response_store = std::make_shared<ResponseStore>();
  auto& o = impl_->opt;
  impl_->model_id = o.aliases.empty() ? file_stem(o.model_path) : o.aliases.front();
}

Server::~Server() = default;

void Server::stop() {
  std::lock_guard<std::mutex> lk(impl_->stop_mu);
  impl_->stop_requested = true;
  impl_->stop_cv.notify_all();
}

int Server::run(const std::atomic<bool>* external_stop) {
  Impl& I = *impl_;
  const auto& o = I.opt;
  if (o.engine.n_parallel > 1) KILN_LOG_INFO("{} slots; prefixes are shared across slots", o.engine.n_parallel);

  const auto t_start = Clock::now();
  I.eng = engine::Engine::load_async(o.model_path, o.engine);
  I.setup_routes();

  int port = o.port;
  if (port == 0) {
    port = I.http.bind_to_any_port(o.host);
    if (port < 0) {
      KILN_LOG_ERROR("cannot bind {} on a free port", o.host);
      I.eng.reset();
      return 1;
    }
  } else if (!I.http.bind_to_port(o.host, port)) {
    KILN_LOG_ERROR("cannot bind {}:{} (in use? another server running?)", o.host, port);
    I.eng.reset();
    return 1;
  }
  KILN_LOG_INFO("kiln serve: listening on http://{}:{} (model {}, loading)", o.host, port, o.model_path);
  std::fflush(stdout);
  std::atomic<bool> listener_done{false};
  std::thread listener([&] {
    I.http.listen_after_bind();
    listener_done.store(true);
  });

  auto wait_stop = [&](std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lk(I.stop_mu);
    I.stop_cv.wait_for(lk, d, [&] { return I.stop_requested; });
    if (external_stop && external_stop->load()) I.stop_requested = true;
    return I.stop_requested;
  };

  int rc = 0;
  bool stopped = false;
  // Loading.
  while (!stopped) {
    auto s = I.eng->state();
    if (s == engine::EngineState::Failed) {
      KILN_LOG_ERROR("failed to load {}: {}", o.model_path, I.eng->load_error());
      rc = 1;
      break;
    }
    if (s == engine::EngineState::Ready) break;
    stopped = wait_stop(std::chrono::milliseconds(20));
  }
  if (rc == 0 && !stopped) {
    auto st = I.init_template();
    if (!st.ok()) {
      KILN_LOG_ERROR("{}", st.error().message);
      rc = 1;
    }
  }
  if (rc == 0 && !stopped) {
    const auto& mi = I.info();
    KILN_LOG_INFO("model loaded in {:.0f} ms: {} ({}), n_ctx {} = {} slots x {}, hybrid: {}, chat template caps: tools {}, thinking {}",
                  std::chrono::duration<double, std::milli>(Clock::now() - t_start).count(), mi.name, mi.arch, mi.n_ctx,
                  I.eng->options().n_parallel, mi.n_ctx_slot, mi.hybrid, I.tmpl->caps().supports_tools,
                  I.tmpl->caps().supports_thinking);
    if (o.test_load_delay_ms > 0) stopped = wait_stop(std::chrono::milliseconds(o.test_load_delay_ms));
    if (!stopped) {
      I.ready.store(true);
      KILN_LOG_INFO("server is ready: http://{}:{}/v1 (model id '{}'{})", o.host, port, I.model_id,
                    o.api_keys.empty() ? "" : ", API key required");
      while (!wait_stop(std::chrono::milliseconds(100))) {
      }
    }
  }
  KILN_LOG_INFO("kiln serve: shutting down");
  I.stopping.store(true);
  // httplib's stop() does nothing before listen has started, and a load that fails at once can get
  // here first: wait for the listener to run (or to have given up), then stop it.
  while (!I.http.is_running() && !listener_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  I.http.stop();
  listener.join();
  I.eng.reset();
  KILN_LOG_INFO("kiln serve: stopped");
  return rc;
}

}  // namespace kiln::server
