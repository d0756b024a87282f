// server/server.cpp — HTTP routes over cpp-httplib (see server.h).
#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <thread>

#include "chat/chat.h"
#include "chat/output_parser.h"
#include "core/log.h"
#include "core/read_file.h"
#include "server/api.h"
#include "server/client_socket.h"
#include "server/embeddings.h"
#include "server/native.h"
#include "server/webui.h"

namespace kiln::server {

namespace {

using Clock = std::chrono::steady_clock;

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

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  std::unique_ptr<engine::Engine> eng;
  std::unique_ptr<chat::ChatTemplate> tmpl;
  std::string model_id;
  httplib::Server http;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> http_requests{0}, http_errors{0};
  std::atomic<uint64_t> task_ids{0};
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop_requested = false;

  // ----------------------------------------------------------------------------------------------
  // Responses

  void send_json(httplib::Response& res, const json& j, int status = 200) {
    res.status = status;
    res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json; charset=utf-8");
  }
  void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.to_json(), e.status); }

  static ApiError error_of(int status, std::string type, std::string message) {
    ApiError e;
    e.status = status;
    e.type = std::move(type);
    e.message = std::move(message);
    return e;
  }

  // ----------------------------------------------------------------------------------------------
  // Auth and readiness (pre-routing)

  bool is_public(const httplib::Request& req) const {
    if (req.method == "OPTIONS") return true;
    if (req.path == "/health" || req.path == "/v1/health") return true;
    std::string_view body, type;
    return req.method == "GET" && webui::find(req.path, body, type);  // the web UI's page
  }

  bool authorized(const httplib::Request& req) const {
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

  // ----------------------------------------------------------------------------------------------
  // Body parsing

  bool parse_body(const httplib::Request& req, httplib::Response& res, json& body) {
    body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      send_error(res, bad_request("", "the request body is not valid JSON"));
      return false;
    }
    if (!body.is_object()) {
      send_error(res, bad_request("", "the request body must be a JSON object"));
      return false;
    }
    return true;
  }

  const tokenizer::Tokenizer& tok() const { return eng->tokenizer(); }
  const engine::ModelInfo& info() const { return eng->info(); }

  std::vector<int32_t> tokenize_prompt(const std::string& text) const {
    tokenizer::EncodeOptions eo;
    eo.add_special = true;
    eo.parse_special = true;
    auto ids = tok().encode(text, eo);
    // A template that renders bos_token itself plus the vocabulary's add_bos would double it.
    if (ids.size() >= 2 && info().bos >= 0 && ids[0] == info().bos && ids[1] == info().bos) ids.erase(ids.begin());
    return ids;
  }

  std::optional<ApiError> check_context(size_t n_prompt) const {
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

  // The body's chat request rendered by the template; nullopt once the error is answered.
  std::optional<chat::Prompt> render_chat(const json& body, httplib::Response& res) {
    auto creq = chat::parse_chat_request(body);
    if (!creq.ok()) {
      send_error(res, bad_request(creq.error().field, creq.error().message));
      return std::nullopt;
    }
    chat::ApplyOptions ao;
    ao.reasoning_preserve = opt.reasoning_preserve;
    ao.default_kwargs = opt.chat_template_kwargs;
    ao.reasoning_format = opt.reasoning_format;
    auto prompt = tmpl->apply(*creq, ao);
    if (!prompt.ok()) {
      send_error(res, bad_request("messages", "the chat template failed: " + prompt.error().message));
      return std::nullopt;
    }
    return std::move(*prompt);
  }

  // ----------------------------------------------------------------------------------------------
  // Generation (shared by chat and completions)

  struct Gen {
    bool chat = true;
    std::string id;
    int64_t created = 0;
    std::vector<int32_t> prompt;
    GenParams gp;
    std::optional<chat::ParserConfig> parser;  // chat only
    std::string echo_text;                     // completions with echo
    bool native = false;                       // llama-server's /completion (chat false too)
    NativeParams np;                           // native only
    std::string prompt_text;                   // native only: the prompt as text ("prompt")
    int id_slot = -1;                          // native only: the slot that ran it (-1: unknown)
    uint64_t task = 0;
    Clock::time_point t0;
    int client_fd = -1;  // non-streamed requests: the socket polled for a disconnect (find_client_socket)
  };

  void log_timings(const Gen& g, const engine::Timings& t, const char* finish) {
    // The engine logs llama-server's "prompt eval time / eval time / total time" lines for every
    // request; this adds which endpoint and task it was, and the wall time seen by the HTTP thread.
    KILN_LOG_INFO("task {} | {} | prompt {} tokens ({} cached, {} processed), generated {} tokens, finish: {}, {:.2f} ms",
                  g.task, g.chat ? "chat" : "completion", g.prompt.size(), t.cache_n, t.prompt_n, t.predicted_n, finish,
                  std::chrono::duration<double, std::milli>(Clock::now() - g.t0).count());
  }

  static const char* finish_name(engine::FinishReason r) {
    switch (r) {
      case engine::FinishReason::Length: return "length";
      default: return "stop";
    }
  }

  // A chat choice's "logprobs": {"content": [entry per token]}, or null without logprobs.
  json chat_logprobs(const Gen& g, const std::vector<engine::TokenOut>& toks) const {
    if (!g.gp.logprobs) return nullptr;
    json content = json::array();
    for (const auto& tk : toks) content.push_back(chat_logprob_entry(tk, tok(), g.gp.top_logprobs));
    return {{"content", content}};
  }

  // A completion choice's "logprobs" (tokens, token_logprobs, top_logprobs, text_offset), or null.
  json completion_logprobs(const Gen& g, const std::vector<engine::TokenOut>& toks, size_t text_offset0) const {
    return g.gp.logprobs ? completion_logprob_lists(toks, tok(), g.gp.top_logprobs, text_offset0) : json(nullptr);
  }

  // The fields every response and stream chunk starts with.
  json response_head(const Gen& g, bool chunk) const {
    return json{{"id", g.id},
                {"object", !g.chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion"},
                {"created", g.created},
                {"model", model_id},
                {"system_fingerprint", "kiln-" KILN_SERVER_VERSION}};
  }

  // The slot running request `h` (-1 once it has left it); a single slot is always 0.
  int slot_of(const engine::RequestHandle& h) const {
    if (eng->options().n_parallel == 1) return 0;
    for (const auto& s : eng->slots())
      if (s.busy && s.request_id == h.id()) return s.id;
    return -1;
  }

  void run_blocking(Gen& g, httplib::Response& res) {
    auto h = eng->submit(g.gp.req);
    std::string text;
    std::vector<engine::TokenOut> toks;
    std::optional<engine::Event> fin;
    auto next_poll = Clock::now();
    while (!fin) {
      if (stopping.load()) {
        h.cancel();
        send_error(res, error_of(503, "unavailable_error", "the server is shutting down"));
        return;
      }
      if (Clock::now() >= next_poll) {
        next_poll = Clock::now() + std::chrono::milliseconds(100);
        if (peer_closed(g.client_fd)) {
          // Client gone (llama-server cancels too): free the slot now; the answer is never written.
          KILN_LOG_INFO("task {}: client disconnected, cancelled", g.task);
          h.cancel();
          return;
        }
      }
      auto ev = h.next(std::chrono::milliseconds(100));
      if (!ev) continue;
      if (g.id_slot < 0) g.id_slot = slot_of(h);
      text += ev->text;
      for (auto& t : ev->tokens) toks.push_back(std::move(t));
      if (ev->final()) fin = std::move(ev);
    }
    if (fin->finish == engine::FinishReason::Error) {
      KILN_LOG_WARN("task {}: {}", g.task, fin->error);
      send_error(res, error_of(500, "server_error", "generation failed: " + fin->error));
      return;
    }
    const auto& t = fin->timings;
    log_timings(g, t, engine::finish_reason_name(fin->finish));
    if (g.native) {
      NativeFinal f{std::move(text), std::move(toks), fin->finish, fin->stop_word, t, int64_t(g.prompt.size()), g.prompt_text, g.id_slot};
      return send_json(res, native_final(g.gp, g.np, f, tok(), model_id));
    }
    json out = response_head(g, false);
    if (g.chat) {
      auto msg = chat::parse_output(text, *g.parser);
      json choice = {{"index", 0}, {"message", chat::message_to_json(msg)}, {"logprobs", chat_logprobs(g, toks)}};
      choice["finish_reason"] = msg.finish_reason(finish_name(fin->finish));
      out["choices"] = json::array({choice});
    } else {
      json choice = {{"index", 0}, {"text", valid_utf8(g.echo_text + text)}};
      choice["logprobs"] = completion_logprobs(g, toks, g.echo_text.size());
      choice["finish_reason"] = finish_name(fin->finish);
      out["choices"] = json::array({choice});
    }
    out["usage"] = usage_json(int64_t(g.prompt.size()), t.predicted_n, t.cache_n);
    out["timings"] = timings_json(t);
    send_json(res, out);
  }

  struct StreamState {
    engine::RequestHandle h;
    std::optional<chat::OutputParser> parser;
    bool started = false;
    bool finished = false;
    Clock::time_point last_write;
    int id_slot = -1;        // native: the slot running it
    int64_t n_decoded = 0;   // native: tokens generated so far
  };

  void run_streaming(std::shared_ptr<Gen> g, httplib::Response& res) {
    auto st = std::make_shared<StreamState>();
    st->h = eng->submit(g->gp.req);
    if (g->chat) st->parser.emplace(*g->parser);
    st->last_write = Clock::now();
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, g, st](size_t, httplib::DataSink& sink) -> bool {
          if (st->finished) {
            sink.done();
            return true;
          }
          auto write = [&](const std::string& s) {
            st->last_write = Clock::now();
            return sink.write(s.data(), s.size());
          };
          if (!st->started) {
            st->started = true;
            if (g->chat) {
              json c = response_head(*g, true);
              c["choices"] = json::array({json{{"index", 0},
                                               {"delta", {{"role", "assistant"}, {"content", nullptr}}},
                                               {"logprobs", nullptr},
                                               {"finish_reason", nullptr}}});
              return write(sse(c));
            }
            if (!g->echo_text.empty()) {
              json c = response_head(*g, true);
              c["choices"] = json::array({json{{"index", 0}, {"text", valid_utf8(g->echo_text)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
              return write(sse(c));
            }
          }
          for (;;) {
            if (stopping.load()) {
              st->h.cancel();
              json e = error_of(503, "unavailable_error", "the server is shutting down").to_json();
              write(sse(e));
              st->finished = true;
              sink.done();
              return true;
            }
            auto ev = st->h.next(std::chrono::milliseconds(50));
            if (!ev) {
              if (!sink.is_writable()) return false;  // client gone: the handle's release cancels
              if (Clock::now() - st->last_write >= std::chrono::milliseconds(opt.sse_keepalive_ms))
                return write(": keep-alive\n\n");
              continue;
            }
            if (g->native && st->id_slot < 0) st->id_slot = slot_of(st->h);
            return on_stream_event(*g, *st, *ev, sink, write);
          }
        },
        [st](bool) {
          // Releasing the handle before its final event cancels the request (client disconnect).
          st->h = engine::RequestHandle();
        });
  }

  template <class W>
  bool on_stream_event(const Gen& g, StreamState& st, engine::Event& ev, httplib::DataSink& sink, W& write) {
    bool ok = true;
    if (ev.final() && ev.finish == engine::FinishReason::Error) {
      KILN_LOG_WARN("task {}: {}", g.task, ev.error);
      write(sse(error_of(500, "server_error", "generation failed: " + ev.error).to_json()));
      st.finished = true;
      sink.done();
      return true;
    }
    if (g.native) return on_native_event(g, st, ev, sink, write);
    if (g.chat) {
      chat::Delta d = st.parser->feed(ev.text);
      if (ev.final()) d.append(st.parser->finish());
      if (!d.empty() || (g.gp.logprobs && !ev.tokens.empty())) {
        json c = response_head(g, true);
        json choice = {{"index", 0}, {"delta", chat::delta_to_json(d)}, {"logprobs", chat_logprobs(g, ev.tokens)}};
        choice["finish_reason"] = nullptr;
        c["choices"] = json::array({choice});
        ok = write(sse(c));
      }
    } else if (!ev.text.empty() || (g.gp.logprobs && !ev.tokens.empty())) {
      json c = response_head(g, true);
      json choice = {{"index", 0}, {"text", valid_utf8(ev.text)}};
      choice["logprobs"] = completion_logprobs(g, ev.tokens, 0);
      choice["finish_reason"] = nullptr;
      c["choices"] = json::array({choice});
      ok = write(sse(c));
    }
    if (!ok) return false;
    if (!ev.final()) return true;

    const auto& t = ev.timings;
    log_timings(g, t, engine::finish_reason_name(ev.finish));
    json c = response_head(g, true);
    std::string fr = g.chat ? st.parser->message().finish_reason(finish_name(ev.finish)) : finish_name(ev.finish);
    if (g.chat)
      c["choices"] = json::array({json{{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", fr}}});
    else
      c["choices"] = json::array({json{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", fr}}});
    c["timings"] = timings_json(t);
    write(sse(c));
    if (g.gp.include_usage) {
      json u = response_head(g, true);
      u["choices"] = json::array();
      u["usage"] = usage_json(int64_t(g.prompt.size()), t.predicted_n, t.cache_n);
      u["timings"] = timings_json(t);
      write(sse(u));
    }
    write("data: [DONE]\n\n");
    st.finished = true;
    sink.done();
    return true;
  }

  // /completion's stream: chunks {content, stop:false, …}, then the summary with stop:true; no [DONE].
  template <class W>
  bool on_native_event(const Gen& g, StreamState& st, engine::Event& ev, httplib::DataSink& sink, W& write) {
    st.n_decoded += int64_t(ev.tokens.size());
    if (!ev.text.empty() || (g.gp.req.n_probs != 0 && !ev.tokens.empty()))
      if (!write(sse(native_partial(g.gp, ev.text, ev.tokens, tok(), st.id_slot, int64_t(g.prompt.size()), st.n_decoded)))) return false;
    if (!ev.final()) return true;
    log_timings(g, ev.timings, engine::finish_reason_name(ev.finish));
    NativeFinal f{"", {}, ev.finish, ev.stop_word, ev.timings, int64_t(g.prompt.size()), g.prompt_text, st.id_slot};
    write(sse(native_final(g.gp, g.np, f, tok(), model_id)));
    st.finished = true;
    sink.done();
    return true;
  }

  // ----------------------------------------------------------------------------------------------
  // Endpoints

  void h_chat(const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    if (!opt.jinja) return send_error(res, error_of(400, "invalid_request_error", "chat completions need --jinja (started with --no-jinja)"));
    auto g = std::make_shared<Gen>();
    g->chat = true;
    if (auto e = parse_gen_params(body, Endpoint::Chat, info().n_vocab, g->gp)) return send_error(res, *e);
    auto prompt = render_chat(body, res);
    if (!prompt) return;
    if (!prompt->image_urls.empty()) {
      std::string why = opt.mmproj.empty() ? "start the server with --mmproj" : "image input arrives with the vision issue";
      return send_error(res, bad_request("messages", "image input is not supported yet (" + why + ")"));
    }
    g->parser = prompt->parser;
    // A reasoning model thinks freely; the constraint applies to the answer after the thinking.
    if (g->gp.req.grammar && prompt->starts_in_reasoning) g->gp.req.grammar_trigger = prompt->parser.reasoning_end;
    g->prompt = tokenize_prompt(prompt->text);
    if (auto e = check_context(g->prompt.size())) return send_error(res, *e);
    if (!g->gp.stream) g->client_fd = find_client_socket(req);
    start(g, res);
  }

  void h_completions(const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    auto g = std::make_shared<Gen>();
    g->chat = false;
    if (auto e = parse_gen_params(body, Endpoint::Completions, info().n_vocab, g->gp)) return send_error(res, *e);
    std::string text;
    std::vector<int32_t> ids;
    bool is_tokens = false;
    if (auto e = parse_completion_prompt(body, info().n_vocab, text, ids, is_tokens)) return send_error(res, *e);
    if (is_tokens) {
      g->prompt = std::move(ids);
      if (g->gp.echo) g->echo_text = tok().decode(g->prompt);
    } else {
      g->prompt = tokenize_prompt(text);
      if (g->gp.echo) g->echo_text = text;
    }
    if (auto e = check_context(g->prompt.size())) return send_error(res, *e);
    if (!g->gp.stream) g->client_fd = find_client_socket(req);
    start(g, res);
  }

  // llama-server's native POST /completion (native.h): the /v1/completions generation, other JSON.
  void h_completion(const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    auto g = std::make_shared<Gen>();
    g->chat = false;
    g->native = true;
    if (auto e = parse_gen_params(body, Endpoint::Completions, info().n_vocab, g->gp)) return send_error(res, *e);
    g->gp.echo = false;
    if (auto e = parse_native_params(body, info().n_vocab, eng->options().n_parallel, g->np)) return send_error(res, *e);
    g->prompt = native_prompt_ids(g->np, tok(), [this](const std::string& t) { return tokenize_prompt(t); });
    g->prompt_text = g->np.prompt.size() == 1 && g->np.prompt[0].is_text ? g->np.prompt[0].text : tok().decode(g->prompt);
    if (auto e = check_context(g->prompt.size())) return send_error(res, *e);
    if (!g->gp.stream) g->client_fd = find_client_socket(req);
    start(g, res);
  }

  void start(std::shared_ptr<Gen> g, httplib::Response& res) {
    g->id = (g->chat ? "chatcmpl-" : "cmpl-") + random_id();
    g->created = unix_now();
    g->task = task_ids.fetch_add(1);
    g->t0 = Clock::now();
    g->gp.req.prompt = g->prompt;
    if (g->gp.req.max_tokens == 0) {
      // Nothing to generate (n_predict 0): answer at once, like llama-server.
      engine::Timings t;
      if (g->native) {
        NativeFinal f{"", {}, engine::FinishReason::Length, "", t, int64_t(g->prompt.size()), g->prompt_text, -1};
        GenParams gp = g->gp;
        gp.stream = false;  // one JSON answer, also when a stream was asked for
        return send_json(res, native_final(gp, g->np, f, tok(), model_id));
      }
      json out = {{"id", g->id}, {"object", g->chat ? "chat.completion" : "text_completion"}, {"created", g->created}, {"model", model_id}};
      json choice = g->chat ? json{{"index", 0}, {"message", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", "length"}}
                            : json{{"index", 0}, {"text", g->echo_text}, {"logprobs", nullptr}, {"finish_reason", "length"}};
      out["choices"] = json::array({choice});
      out["usage"] = usage_json(int64_t(g->prompt.size()), 0, 0);
      out["timings"] = timings_json(t);
      return send_json(res, out);
    }
    if (g->gp.stream) run_streaming(g, res);
    else run_blocking(*g, res);
  }

  void h_tokenize(const httplib::Request& req, httplib::Response& res) {
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

  // POST /v1/embeddings (oai) and /embedding: one engine request per input (Request::embed), run
  // concurrently in the slots, then normalized and shaped (server/embeddings.h).
  void h_embeddings(const httplib::Request& req, httplib::Response& res) { embeddings(req, res, true); }
  void h_embedding(const httplib::Request& req, httplib::Response& res) { embeddings(req, res, false); }
  engine::Pooling pooling() const {
    std::string p = opt.pooling;
    if (p.empty()) {
      const int t = info().pooling_type;
      p = t == 1 ? "mean" : t == 2 ? "cls" : t == 3 ? "last" : "none";
    }
    return p == "mean" ? engine::Pooling::Mean : p == "cls" ? engine::Pooling::Cls
         : p == "last" ? engine::Pooling::Last : engine::Pooling::None;
  }
  void embeddings(const httplib::Request& req, httplib::Response& res, bool oai) {
    if (!opt.embedding)
      return send_error(res, error_of(501, "not_supported_error",
                                      "This server does not support embeddings. Start it with `--embeddings`"));
    json body;
    if (!parse_body(req, res, body)) return;
    const engine::Pooling pool = pooling();
    if (oai && pool == engine::Pooling::None)
      return send_error(res, error_of(400, "invalid_request_error",
                                      "pooling type 'none' is not OpenAI-compatible: start the server with --pooling "
                                      "mean, cls or last"));
    const std::string field = !oai && body.contains("content") ? "content" : "input";
    std::vector<std::vector<int32_t>> inputs;
    if (auto e = parse_embedding_inputs(body, field, info().n_vocab, [this](const std::string& t) { return tokenize_prompt(t); },
                                        inputs))
      return send_error(res, *e);
    int norm = 2;
    if (auto e = parse_embd_normalize(body, norm)) return send_error(res, *e);
    bool base64 = false;
    if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
      if (!f->is_string() || (*f != "float" && *f != "base64"))
        return send_error(res, bad_request("encoding_format", "expected \"float\" or \"base64\""));
      base64 = *f == "base64";
    }
    int64_t n_tokens = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (int64_t(inputs[i].size()) > info().n_ctx_slot)
        return send_error(res, bad_request(inputs.size() > 1 ? fmt::format("{}[{}]", field, i) : field,
                                           fmt::format("{} tokens exceed the slot's context of {}", inputs[i].size(),
                                                       info().n_ctx_slot)));
      n_tokens += int64_t(inputs[i].size());
    }
    std::vector<engine::RequestHandle> hs;
    for (auto& ids : inputs) {
      engine::Request r;
      r.prompt = std::move(ids);
      r.embed = true;
      r.pooling = pool;
      hs.push_back(eng->submit(std::move(r)));
    }
    std::vector<std::vector<float>> embs(hs.size());
    for (size_t i = 0; i < hs.size(); ++i) {
      std::optional<engine::Event> fin;
      while (!fin) {
        if (stopping.load()) return send_error(res, error_of(503, "unavailable_error", "the server is shutting down"));
        auto ev = hs[i].next(std::chrono::milliseconds(100));
        if (ev && ev->final()) fin = std::move(ev);
      }
      if (fin->finish == engine::FinishReason::Error)
        return send_error(res, error_of(500, "server_error", "embedding failed: " + fin->error));
      embs[i] = std::move(fin->embedding);
      normalize_embedding(embs[i], info().n_embd, norm);
    }
    if (oai) return send_json(res, oai_embeddings_json(embs, model_id, n_tokens, base64));
    send_json(res, native_embedding_json(embs, info().n_embd));
  }

  // POST /slots/{id}?action=save|restore|erase (llama-server's; files under --slot-save-path).
  void h_slot_action(const httplib::Request& req, httplib::Response& res) {
    if (opt.slot_save_path.empty())
      return send_error(res, error_of(501, "not_supported_error",
                                      "This server does not support slot actions. Start it with `--slot-save-path`"));
    const std::string action = req.has_param("action") ? req.get_param_value("action") : "";
    int64_t id = -1;
    if (req.matches.size() > 1) {
      const std::string s = req.matches[1].str();
      if (!s.empty() && s.size() < 10) id = std::stoll(s);
    }
    if (id < 0 || id >= eng->options().n_parallel)
      return send_error(res, bad_request("id_slot", fmt::format("no slot {} ({} slots)", req.matches.size() > 1 ? req.matches[1].str() : "", eng->options().n_parallel)));
    engine::Engine::SlotAction act;
    if (action == "save") act = engine::Engine::SlotAction::Save;
    else if (action == "restore") act = engine::Engine::SlotAction::Restore;
    else if (action == "erase") act = engine::Engine::SlotAction::Erase;
    else return send_error(res, bad_request("action", "expected save, restore or erase"));
    std::string filename;
    if (act != engine::Engine::SlotAction::Erase) {
      json body;
      if (!parse_body(req, res, body)) return;
      auto f = body.find("filename");
      if (f == body.end() || !f->is_string()) return send_error(res, bad_request("filename", "expected a string"));
      filename = f->get<std::string>();
      if (!valid_slot_filename(filename))
        return send_error(res, bad_request("filename", "invalid file name (a plain name: no path separators, no leading dot)"));
    }
    const std::string path = filename.empty() ? "" : opt.slot_save_path + "/" + filename;
    if (act == engine::Engine::SlotAction::Save) {
      std::error_code ec;
      std::filesystem::create_directories(opt.slot_save_path, ec);  // an error shows up when the file is written
    }
    auto r = eng->slot_action(act, int(id), path);
    if (!r) return send_error(res, bad_request(filename.empty() ? "id_slot" : "filename", r.error().message));
    if (act == engine::Engine::SlotAction::Erase) return send_json(res, {{"id_slot", id}, {"n_erased", r->n_tokens}});
    const bool save = act == engine::Engine::SlotAction::Save;
    send_json(res, {{"id_slot", id},
                    {"filename", filename},
                    {save ? "n_saved" : "n_restored", r->n_tokens},
                    {save ? "n_written" : "n_read", r->n_bytes},
                    {"timings", {{save ? "save_ms" : "restore_ms", r->ms}}}});
  }
  static bool valid_slot_filename(const std::string& f) {
    if (f.empty() || f.size() > 255 || f[0] == '.') return false;
    for (unsigned char c : f)
      if (c < 0x20 || c == '/' || c == '\\' || c == ':' || c == '*' || c == '?' || c == '"' || c == '<' || c == '>' ||
          c == '|' || c == 0x7f)
        return false;
    return true;
  }

  void h_detokenize(const httplib::Request& req, httplib::Response& res) {
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

  void h_apply_template(const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    if (auto prompt = render_chat(body, res)) send_json(res, {{"prompt", prompt->text}});
  }

  json model_meta() const {
    const auto& mi = info();
    return json{{"arch", mi.arch},         {"name", mi.name},     {"n_ctx_train", mi.n_ctx_train}, {"n_ctx", mi.n_ctx},
                {"n_vocab", mi.n_vocab},   {"n_embd", mi.n_embd}, {"size", mi.n_params_bytes},     {"hybrid", mi.hybrid}};
  }

  void h_models(const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    json models = json::array();
    data.push_back({{"id", model_id}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "kiln"}, {"meta", model_meta()}});
    models.push_back({{"name", model_id}, {"model", model_id}, {"aliases", opt.aliases}, {"details", {{"format", "gguf"}}}});
    send_json(res, {{"object", "list"}, {"data", data}, {"models", models}});
  }

  void h_props(const httplib::Request&, httplib::Response& res) {
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
                    {"modalities", {{"vision", false}, {"audio", false}}},
                    {"build_info", "kiln " KILN_SERVER_VERSION},
                    {"is_sleeping", false}});
  }

  void h_slots(const httplib::Request&, httplib::Response& res) {
    json a = json::array();
    for (const auto& s : eng->slots())
      a.push_back({{"id", s.id},          {"id_task", s.busy ? int64_t(s.request_id) : -1}, {"n_ctx", s.n_ctx},
                   {"is_processing", s.busy}, {"n_past", s.n_past},                        {"n_prompt_tokens", s.n_prompt},
                   {"n_decoded", s.n_decoded}, {"cache_n", s.cache_n}});
    send_json(res, a);
  }

  void h_metrics(const httplib::Request&, httplib::Response& res) {
    if (!opt.metrics)
      return send_error(res, error_of(501, "not_supported_error", "this server does not support metrics (start it with --metrics)"));
    res.set_content(metrics_text(eng->metrics(), http_requests.load(), http_errors.load()), "text/plain; version=0.0.4");
  }

  void h_health(const httplib::Request&, httplib::Response& res) {
    if (ready.load()) return send_json(res, {{"status", "ok"}});
    send_error(res, error_of(503, "unavailable_error", "Loading model"));
  }

  void h_root(const httplib::Request& req, httplib::Response& res) {
    std::string_view body, type;
    if (webui::find(req.path, body, type)) res.set_content(std::string(body), std::string(type));
    else res.status = 404;  // answered by the error handler
  }

  // ----------------------------------------------------------------------------------------------
  // Set-up

  using H = void (Impl::*)(const httplib::Request&, httplib::Response&);
  httplib::Server::Handler wrap(H h) {
    return [this, h](const httplib::Request& req, httplib::Response& res) {
      try {
        (this->*h)(req, res);
      } catch (const std::exception& e) {
        KILN_LOG_ERROR("{} {}: {}", req.method, req.path, e.what());
        send_error(res, error_of(500, "server_error", std::string("internal error: ") + e.what()));
      }
    };
  }

  void setup_routes() {
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
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key");
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
      const bool pub = is_public(req);
      if (!pub && !authorized(req)) {
        send_error(res, error_of(401, "authentication_error", "Invalid API Key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!ready.load() && !pub) {
        send_error(res, error_of(503, "unavailable_error", "Loading model"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.is_chunked_content_provider_) return;
      if (res.status == 413)
        send_error(res, error_of(413, "invalid_request_error",
                                 fmt::format("the request body is larger than the limit of {} bytes (--max-body-size)", opt.max_body_bytes)));
      else if (res.status == 404)
        send_error(res, error_of(404, "not_found_error", fmt::format("no endpoint {} {}", req.method, req.path)));
      else if (res.status >= 500)
        send_error(res, error_of(res.status, "server_error", "internal error"));
      else
        send_error(res, error_of(res.status, "invalid_request_error", "malformed HTTP request"));
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

  Status init_template() {
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
};

Server::Server(ServerOptions opt) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(opt);
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
  if (!o.mmproj.empty()) KILN_LOG_INFO("--mmproj {}: accepted; image input comes with the vision issue", o.mmproj);
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
