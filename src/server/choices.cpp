// server/choices.cpp — OpenAI's n > 1 on /v1/chat/completions and /v1/completions: n engine requests
//   for one prompt, answered as one response with n choices (blocking) or one SSE stream whose
//   chunks carry each choice's index (streaming).
// Owns: submitting the choices (the first alone; the rest once its prompt is processed, so they
//   reuse it through the prefix cache; seeds seed + i), collecting and interleaving their events.
// Must not: touch tensors or the engine's state (it only submits and reads the requests' events).
// Threading: the HTTP worker thread serving the request; the streaming provider runs on it too.
#include <deque>

#include "core/log.h"
#include "server/client_socket.h"
#include "server/impl.h"

namespace kiln::server {

std::vector<engine::RequestHandle> Server::Impl::submit_choices(const Gen& g, std::deque<engine::Event>& early) {
  std::vector<engine::RequestHandle> hs;
  for (int i = 0; i < g.gp.n; ++i) {
    engine::Request r = g.gp.req;
    if (r.sampling.has_seed()) {
      r.sampling.seed = (r.sampling.seed + uint64_t(i)) & 0xFFFFFFFFu;
      if (!r.sampling.has_seed()) r.sampling.seed = 0;  // seed + i wrapped onto "random"
    }
    hs.push_back(eng->submit(std::move(r)));
    if (i > 0 || !g.gp.req.cache_prompt) continue;
    // The others start once the first has processed the prompt — its first event (kept in `early`
    // for the caller) — so they reuse it through the prefix cache. At most a minute of waiting.
    const auto t0 = Clock::now();
    while (!stopping.load() && Clock::now() - t0 < std::chrono::seconds(60))
      if (auto ev = hs[0].next(std::chrono::milliseconds(20))) {
        early.push_back(std::move(*ev));
        break;
      }
  }
  return hs;
}

void Server::Impl::run_blocking_n(Gen& g, httplib::Response& res) {
  std::deque<engine::Event> early;  // choice 0's first events, read while submitting
  auto hs = submit_choices(g, early);
  const size_t n = hs.size();
  std::vector<std::string> text(n);
  std::vector<std::vector<engine::TokenOut>> toks(n);
  std::vector<std::optional<engine::Event>> fin(n);
  size_t left = n;
  auto next_poll = Clock::now();
  while (left > 0) {
    if (stopping.load()) return send_error(res, error_of(503, "unavailable_error", "the server is shutting down"));
    if (Clock::now() >= next_poll) {
      next_poll = Clock::now() + std::chrono::milliseconds(100);
      if (peer_closed(g.client_fd)) {
        KILN_LOG_INFO("task {}: client disconnected, cancelled", g.task);
        return;  // the handles' release cancels every choice
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (fin[i]) continue;
      std::optional<engine::Event> ev;
      if (i == 0 && !early.empty()) ev = std::move(early.front()), early.pop_front();
      else ev = hs[i].next(std::chrono::milliseconds(5));
      if (!ev) continue;
      text[i] += ev->text;
      for (auto& t : ev->tokens) toks[i].push_back(std::move(t));
      if (ev->final()) {
        if (ev->finish == engine::FinishReason::Error) {
          KILN_LOG_WARN("task {}: choice {}: {}", g.task, i, ev->error);
          return send_error(res, error_of(500, "server_error", "generation failed: " + ev->error));
        }
        fin[i] = std::move(ev);
        --left;
      }
    }
  }
  json out = response_head(g, false);
  json choices = json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    const engine::Event& f = *fin[i];
    completion_tokens += f.timings.predicted_n;
    choices.push_back(choice_json(g, i, text[i], toks[i], f.finish));
  }
  const auto& t0 = fin[0]->timings;
  log_timings(g, t0, engine::finish_reason_name(fin[0]->finish));
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(int64_t(g.prompt.size()), completion_tokens, t0.cache_n);
  out["timings"] = timings_json(t0);
  send_json(res, out);
}

void Server::Impl::run_streaming_n(std::shared_ptr<Gen> g, httplib::Response& res) {
  struct Multi {
    std::deque<engine::Event> early;  // choice 0's first events, read while submitting
    std::vector<engine::RequestHandle> hs;
    std::vector<std::optional<chat::OutputParser>> parser;
    std::vector<bool> done;
    int64_t completion_tokens = 0;
    engine::Timings t0;
    size_t left = 0;
    bool started = false, finished = false;
    Clock::time_point last_write;
  };
  auto m = std::make_shared<Multi>();
  m->hs = submit_choices(*g, m->early);
  m->left = m->hs.size();
  m->done.assign(m->hs.size(), false);
  m->parser.resize(m->hs.size());
  if (g->chat)
    for (auto& p : m->parser) p.emplace(*g->parser);
  m->last_write = Clock::now();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, g, m](size_t, httplib::DataSink& sink) -> bool {
        if (m->finished) {
          sink.done();
          return true;
        }
        auto write = [&](const std::string& s) {
          m->last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        auto chunk = [&](size_t i, json delta_or_text, json logprobs, json finish) {
          json c = response_head(*g, true);
          json ch = {{"index", i}};
          if (g->chat) ch["delta"] = std::move(delta_or_text);
          else ch["text"] = std::move(delta_or_text);
          ch["logprobs"] = std::move(logprobs);
          ch["finish_reason"] = std::move(finish);
          c["choices"] = json::array({std::move(ch)});
          return c;
        };
        if (!m->started) {
          m->started = true;
          std::string s;
          for (size_t i = 0; i < m->hs.size(); ++i) {
            if (g->chat) s += sse(chunk(i, {{"role", "assistant"}, {"content", nullptr}}, nullptr, nullptr));
            else if (!g->echo_text.empty()) s += sse(chunk(i, valid_utf8(g->echo_text), nullptr, nullptr));
          }
          if (!s.empty()) return write(s);
        }
        for (;;) {
          if (stopping.load()) {
            write(sse(error_of(503, "unavailable_error", "the server is shutting down").to_json()));
            m->finished = true;
            sink.done();
            return true;
          }
          bool any = false;
          for (size_t i = 0; i < m->hs.size(); ++i) {
            if (m->done[i]) continue;
            std::optional<engine::Event> ev;
            if (i == 0 && !m->early.empty()) ev = std::move(m->early.front()), m->early.pop_front();
            else ev = m->hs[i].next(std::chrono::milliseconds(5));
            if (!ev) continue;
            any = true;
            if (ev->final() && ev->finish == engine::FinishReason::Error) {
              KILN_LOG_WARN("task {}: choice {}: {}", g->task, i, ev->error);
              write(sse(error_of(500, "server_error", "generation failed: " + ev->error).to_json()));
              m->finished = true;
              sink.done();
              return true;
            }
            std::string s;
            if (g->chat) {
              chat::Delta d = m->parser[i]->feed(ev->text);
              if (ev->final()) d.append(m->parser[i]->finish());
              if (!d.empty() || (g->gp.logprobs && !ev->tokens.empty()))
                s += sse(chunk(i, chat::delta_to_json(d), chat_logprobs(*g, ev->tokens), nullptr));
            } else if (!ev->text.empty() || (g->gp.logprobs && !ev->tokens.empty())) {
              s += sse(chunk(i, valid_utf8(ev->text), completion_logprobs(*g, ev->tokens, 0), nullptr));
            }
            if (ev->final()) {
              m->done[i] = true;
              --m->left;
              m->completion_tokens += ev->timings.predicted_n;
              if (i == 0) m->t0 = ev->timings;
              const std::string fr = g->chat ? m->parser[i]->message().finish_reason(finish_name(ev->finish))
                                             : finish_name(ev->finish);
              json c = chunk(i, g->chat ? json::object() : json(""), nullptr, fr);
              c["timings"] = timings_json(ev->timings);
              s += sse(c);
            }
            if (!s.empty() && !write(s)) return false;
          }
          if (m->left == 0) {
            log_timings(*g, m->t0, "stop");
            std::string s;
            if (g->gp.include_usage) {
              json u = response_head(*g, true);
              u["choices"] = json::array();
              u["usage"] = usage_json(int64_t(g->prompt.size()), m->completion_tokens, m->t0.cache_n);
              u["timings"] = timings_json(m->t0);
              s += sse(u);
            }
            s += "data: [DONE]\n\n";
            write(s);
            m->finished = true;
            sink.done();
            return true;
          }
          if (any) return true;
          if (!sink.is_writable()) return false;  // client gone: releasing the handles cancels
          if (Clock::now() - m->last_write >= std::chrono::milliseconds(opt.sse_keepalive_ms))
            return write(": keep-alive\n\n");
        }
      },
      [m](bool) { m->hs.clear(); });  // releasing the handles cancels whatever still runs
}

}  // namespace kiln::server
