// server/server.h — the OpenAI-compatible HTTP server (`kiln serve`): routes, auth, errors, SSE
//   streaming, request logs, /metrics, graceful shutdown. Inference is the engine's (engine.h);
//   this module only parses JSON, applies the chat template, tokenizes and formats results.
// Owns: the cpp-httplib server and its worker threads, the Engine, the ChatTemplate.
// Must not: touch tensors or model internals; block the engine thread (it talks to the engine
//   only through Engine::submit / RequestHandle / metrics() / slots()).
//
// Threading:
//   - run() is called on the main thread: it starts the engine loading (its own thread), binds and
//     serves on an HTTP thread pool (--threads-http), and returns after stop() or a load failure.
//   - Each HTTP request is handled on one pool thread: parse → template → tokenize → submit → read
//     the RequestHandle's events (streaming: inside httplib's chunked content provider).
//   - stop() may be called from any thread (the signal watcher in cmd_serve): streams end with a
//     cancellation, the listener closes, the engine is destroyed after the HTTP threads joined.
#pragma once
#include <atomic>
#include <memory>

#include "server/options.h"

namespace kiln::server {

class Server {
 public:
  explicit Server(ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until stop() (exit code 0) or until the model fails to load / the port cannot be bound (1).
  // `external_stop` (may be null) is polled: a signal handler sets it.
  int run(const std::atomic<bool>* external_stop = nullptr);
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
