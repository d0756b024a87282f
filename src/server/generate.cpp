// server/generate.cpp — the generation endpoints (/v1/chat/completions, /v1/completions, llama-server's
//   /completion) and what runs them: the chat pipeline (parse, template, tool_choice grammar,
//   tokenize, context check; prepare_chat, also used by the Anthropic and Responses endpoints
//   through start_dialect), the blocking runner (polls for a client gone) and the SSE streaming
//   runner, with the answer shaped as OpenAI chat / completions, native /completion or a ChatDialect.
// Must not: touch tensors; block the engine thread (it only submits and reads the request's events).
// Threading: each function runs on the HTTP worker thread serving the request (see server.h).
#include <algorithm>
#include <ctime>

#include "chat/tool_formats.h"
#include "core/log.h"
#include "server/client_socket.h"
#include "server/constraint.h"
#include "server/impl.h"

namespace kiln::server {

namespace {

int64_t unix_now() { return int64_t(std::time(nullptr)); }

}  // namespace

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

std::optional<ApiError> Server::Impl::render_chat(const json& body, chat::ChatRequest& creq, chat::Prompt& prompt) {
  auto parsed = chat::parse_chat_request(body);
  if (!parsed.ok()) return bad_request(parsed.error().field, parsed.error().message);
  creq = std::move(*parsed);
  chat::ApplyOptions ao;
  ao.reasoning_preserve = opt.reasoning_preserve;
  ao.default_kwargs = opt.chat_template_kwargs;
  ao.reasoning_format = opt.reasoning_format;
  auto p = tmpl->apply(creq, ao);
  if (!p.ok()) return bad_request("messages", "the chat template failed: " + p.error().message);
  prompt = std::move(*p);
  return std::nullopt;
}

std::optional<ApiError> Server::Impl::prepare_chat(const json& body, const httplib::Request& req, Gen& g, chat::ChatRequest* creq_out) {
  if (!opt.jinja) return error_of(400, "invalid_request_error", "chat completions need --jinja (started with --no-jinja)");
  g.chat = true;
  if (auto e = parse_gen_params(body, Endpoint::Chat, info().n_vocab, g.gp)) return e;
  chat::ChatRequest creq;
  chat::Prompt prompt;
  if (auto e = render_chat(body, creq, prompt)) return e;
  if (!prompt.image_urls.empty() && !info().vision)
    return bad_request("messages", "image input needs a vision projector: start the server with --mmproj");
  // tool_choice "required" / named: the output is constrained to tool calls (server/constraint.h).
  if (auto e = apply_tool_choice(creq, tmpl->caps(), tmpl->source(), g.gp)) return e;
  g.parser = prompt.parser;
  // Block tool-call formats write their markers as special tokens (DeepSeek, Kimi, Command R,
  // harmony): they are rendered as text so that the output parser sees them (llama-server's
  // preserved tokens).
  if (chat::block_format(prompt.parser.tool_format)) g.gp.req.render_special = true;
  // The format's markers that the vocabulary has as control tokens are text in this request: rendered,
  // and matched by the tool_choice grammar as the one token the model writes them with.
  if (prompt.parser.parse_tool_calls) g.gp.req.preserved_tokens = preserved_marker_tokens(tok(), prompt.parser.tool_format);
  // A reasoning model thinks freely; the constraint applies to the answer after the thinking.
  if (g.gp.req.grammar && prompt.starts_in_reasoning) g.gp.req.grammar_trigger = prompt.parser.reasoning_end;
  if (prompt.image_urls.empty()) g.prompt = tokenize_prompt(prompt.text);
  else if (auto e = image_prompt(prompt, g)) return e;
  if (auto e = check_context(g.prompt.size())) return e;
  if (!g.gp.stream) g.client_fd = find_client_socket(req);
  if (creq_out) *creq_out = std::move(creq);
  return std::nullopt;
}

void Server::Impl::start_dialect(const json& chat_body, const httplib::Request& req, httplib::Response& res,
                                 std::shared_ptr<ChatDialect> d, const std::function<void(Gen&)>& adjust) {
  auto g = std::make_shared<Gen>();
  if (auto e = prepare_chat(chat_body, req, *g)) return send_error(res, d->from_chat_error(*e), d.get());
  g->dialect = std::move(d);
  if (adjust) adjust(*g);
  start(g, res);
}

void Server::Impl::log_timings(const Gen& g, const engine::Timings& t, const char* finish) {
  // The engine logs llama-server's "prompt eval time / eval time / total time" lines for every
  // request; this adds which endpoint and task it was, and the wall time seen by the HTTP thread.
  KILN_LOG_INFO("task {} | {} | prompt {} tokens ({} cached, {} processed), generated {} tokens, finish: {}, {:.2f} ms",
                g.task, g.chat ? "chat" : "completion", g.prompt.size(), t.cache_n, t.prompt_n, t.predicted_n, finish,
                std::chrono::duration<double, std::milli>(Clock::now() - g.t0).count());
}

const char* Server::Impl::finish_name(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::Length: return "length";
    default: return "stop";
  }
}

json Server::Impl::chat_logprobs(const Gen& g, const std::vector<engine::TokenOut>& toks) const {
  if (!g.gp.logprobs) return nullptr;
  json content = json::array();
  for (const auto& tk : toks) content.push_back(chat_logprob_entry(tk, tok(), g.gp.top_logprobs));
  return {{"content", content}};
}

json Server::Impl::completion_logprobs(const Gen& g, const std::vector<engine::TokenOut>& toks, size_t text_offset0) const {
  return g.gp.logprobs ? completion_logprob_lists(toks, tok(), g.gp.top_logprobs, text_offset0) : json(nullptr);
}

json Server::Impl::response_head(const Gen& g, bool chunk) const {
  return json{{"id", g.id},
              {"object", !g.chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion"},
              {"created", g.created},
              {"model", model_id},
              {"system_fingerprint", "kiln-" KILN_SERVER_VERSION}};
}

int Server::Impl::slot_of(const engine::RequestHandle& h) const {
  if (eng->options().n_parallel == 1) return 0;
  for (const auto& s : eng->slots())
    if (s.busy && s.request_id == h.id()) return s.id;
  return -1;
}

void Server::Impl::run_blocking(Gen& g, httplib::Response& res) {
  auto h = eng->submit(g.gp.req);
  std::string text;
  std::vector<engine::TokenOut> toks;
  std::optional<engine::Event> fin;
  auto next_poll = Clock::now();
  while (!fin) {
    if (stopping.load()) {
      h.cancel();
      send_error(res, error_of(503, "unavailable_error", "the server is shutting down"), g.dialect.get());
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
    send_error(res, error_of(500, "server_error", "generation failed: " + fin->error), g.dialect.get());
    return;
  }
  const auto& t = fin->timings;
  log_timings(g, t, engine::finish_reason_name(fin->finish));
  if (g.native) {
    NativeFinal f{std::move(text), std::move(toks), fin->finish, fin->stop_word, t, int64_t(g.prompt.size()), g.prompt_text, g.id_slot};
    return send_json(res, native_final(g.gp, g.np, f, tok(), model_id));
  }
  if (g.dialect) {
    auto msg = chat::parse_output(text, *g.parser);
    return send_json(res, g.dialect->response(ChatOutcome{msg, fin->finish, fin->stop_word, t, int64_t(g.prompt.size())}));
  }
  json out = response_head(g, false);
  out["choices"] = json::array({choice_json(g, 0, text, toks, fin->finish)});
  out["usage"] = usage_json(int64_t(g.prompt.size()), t.predicted_n, t.cache_n);
  out["timings"] = timings_json(t);
  send_json(res, out);
}

json Server::Impl::choice_json(const Gen& g, size_t index, const std::string& text,
                               const std::vector<engine::TokenOut>& toks, engine::FinishReason finish) const {
  if (g.chat) {
    auto msg = chat::parse_output(text, *g.parser);
    json c = {{"index", index}, {"message", chat::message_to_json(msg)}, {"logprobs", chat_logprobs(g, toks)}};
    c["finish_reason"] = msg.finish_reason(finish_name(finish));
    return c;
  }
  json c = {{"index", index}, {"text", valid_utf8(g.echo_text + text)}};
  c["logprobs"] = completion_logprobs(g, toks, g.echo_text.size());
  c["finish_reason"] = finish_name(finish);
  return c;
}

void Server::Impl::run_streaming(std::shared_ptr<Gen> g, httplib::Response& res) {
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
          if (g->dialect) return write(g->dialect->stream_begin(int64_t(g->prompt.size())));
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
            ApiError e = error_of(503, "unavailable_error", "the server is shutting down");
            write(g->dialect ? g->dialect->stream_error(e) : sse(e.to_json()));
            st->finished = true;
            sink.done();
            return true;
          }
          // Wake at least as often as the keep-alive interval (at most every 50 ms to check shutdown).
          auto ev = st->h.next(std::chrono::milliseconds(std::clamp(opt.sse_keepalive_ms, 1, 50)));
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

bool Server::Impl::on_stream_event(const Gen& g, StreamState& st, engine::Event& ev, httplib::DataSink& sink, const WriteFn& write) {
  bool ok = true;
  if (ev.final() && ev.finish == engine::FinishReason::Error) {
    KILN_LOG_WARN("task {}: {}", g.task, ev.error);
    ApiError e = error_of(500, "server_error", "generation failed: " + ev.error);
    write(g.dialect ? g.dialect->stream_error(e) : sse(e.to_json()));
    st.finished = true;
    sink.done();
    return true;
  }
  if (g.native) return on_native_event(g, st, ev, sink, write);
  if (g.dialect) {
    chat::Delta d = st.parser->feed(ev.text);
    if (ev.final()) d.append(st.parser->finish());
    if (std::string s = g.dialect->stream_delta(d); !s.empty() && !write(s)) return false;
    if (!ev.final()) return true;
    log_timings(g, ev.timings, engine::finish_reason_name(ev.finish));
    write(g.dialect->stream_end(ChatOutcome{st.parser->message(), ev.finish, ev.stop_word, ev.timings, int64_t(g.prompt.size())}));
    st.finished = true;
    sink.done();
    return true;
  }
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

bool Server::Impl::on_native_event(const Gen& g, StreamState& st, engine::Event& ev, httplib::DataSink& sink, const WriteFn& write) {
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

void Server::Impl::h_chat(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  auto g = std::make_shared<Gen>();
  if (auto e = prepare_chat(body, req, *g)) return send_error(res, *e);
  start(g, res);
}

void Server::Impl::h_completions(const httplib::Request& req, httplib::Response& res) {
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

std::shared_ptr<Server::Impl::Gen> Server::Impl::native_gen(const json& body, httplib::Response& res) {
  auto g = std::make_shared<Gen>();
  g->chat = false;
  g->native = true;
  if (auto e = parse_gen_params(body, Endpoint::Completions, info().n_vocab, g->gp)) {
    send_error(res, *e);
    return nullptr;
  }
  g->gp.echo = false;
  return g;
}

void Server::Impl::h_completion(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, body)) return;
  auto g = native_gen(body, res);
  if (!g) return;
  if (auto e = parse_native_params(body, info().n_vocab, eng->options().n_parallel, g->np)) return send_error(res, *e);
  g->prompt = native_prompt_ids(g->np, tok(), [this](const std::string& t) { return tokenize_prompt(t); });
  g->prompt_text = g->np.prompt.size() == 1 && g->np.prompt[0].is_text ? g->np.prompt[0].text : tok().decode(g->prompt);
  if (auto e = check_context(g->prompt.size())) return send_error(res, *e);
  if (!g->gp.stream) g->client_fd = find_client_socket(req);
  start(g, res);
}

void Server::Impl::start(std::shared_ptr<Gen> g, httplib::Response& res) {
  g->id = (g->chat ? "chatcmpl-" : "cmpl-") + random_id();
  g->created = unix_now();
  g->task = task_ids.fetch_add(1);
  g->t0 = Clock::now();
  g->gp.req.prompt = g->prompt;
  if (g->gp.req.max_tokens == 0) {
    // Nothing to generate (n_predict 0): answer at once, like llama-server.
    engine::Timings t;
    if (g->dialect) {
      chat::ParsedMessage none;
      return send_json(res, g->dialect->response(ChatOutcome{none, engine::FinishReason::Length, "", t, int64_t(g->prompt.size())}));
    }
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
  if (g->gp.n > 1 && (g->native || g->dialect))
    return send_error(res, bad_request("n", "n > 1 is answered only by /v1/chat/completions and /v1/completions"));
  if (g->gp.n > 1) return g->gp.stream ? run_streaming_n(g, res) : run_blocking_n(*g, res);
  if (g->gp.stream) run_streaming(g, res);
  else run_blocking(*g, res);
}

}  // namespace kiln::server
