// server/options.h — `kiln serve`'s command line: llama-server's flag spellings, their environment
//   variables (LLAMA_ARG_*, LLAMA_API_KEY) and kiln's own (KILN_*), parsed by one table.
// Owns: ServerOptions (everything the server and the engine are configured with) and the parser.
// Must not: open files other than --api-key-file, load models or start threads.
// Threading: plain functions and values.
//
// Precedence: a flag on the command line beats KILN_<NAME>, which beats LLAMA_ARG_<NAME> (or
// LLAMA_API_KEY), which beats the default. Unknown flags are errors naming the flag.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat.h"
#include "core/result.h"
#include "engine/engine.h"

namespace kiln::server {

struct ServerOptions {
  std::string model_path;               // -m
  std::vector<std::string> aliases;     // -a (comma list); the first is the model id in the API
  std::string host = "127.0.0.1";       // --host
  int port = 8080;                      // --port
  engine::EngineOptions engine;         // -c -np -b -ub -t -ctk -ctv --load-mode --cache-ram
  std::string n_gpu_layers = "auto";    // -ngl as given (parsed into engine.n_gpu_layers)
  bool cpu_moe = false;                 // --cpu-moe      } combined into engine.placement
  int n_cpu_moe = 0;                    // --n-cpu-moe N  } (model::placement_options) after parsing
  std::vector<std::string> override_tensor;  // -ot values (repeatable; the command line's replace the variable's)
  std::string flash_attn = "auto";      // -fa on|off|auto: off = llama.cpp's non-flash attention arithmetic
  std::string fit = "on";               // --fit on|off (engine.fit; --fit-target, --fit-ctx, --device-memory: engine.*)
  std::string mmproj;                   // -mm/--mmproj: the vision projector (engine.mmproj); --no-mmproj clears it
  int64_t image_min_tokens = 8;         // --image-min-tokens: each image gives at least this many tokens (llama.cpp's Qwen-VL default)
  int64_t image_max_tokens = 4096;      // --image-max-tokens: and at most this many
  size_t image_max_bytes = size_t(20) << 20;  // encoded image size limit (data: URLs and fetched http(s) images)
  int image_fetch_timeout_ms = 10000;   // http(s) image URLs: connect + read timeout
  bool jinja = true;                    // --jinja / --no-jinja
  chat::ReasoningFormat reasoning_format = chat::ReasoningFormat::Auto;  // --reasoning-format
  bool reasoning_preserve = true;       // --reasoning-preserve / --no-reasoning-preserve
  chat::ojson chat_template_kwargs = chat::ojson::object();  // --chat-template-kwargs
  std::string chat_template_file;       // --chat-template-file: overrides the GGUF's template
  bool metrics = false;                 // --metrics
  bool embedding = false;               // --embedding / --embeddings: POST /v1/embeddings and /embedding
  std::string pooling;                  // --pooling none|mean|cls|last ("": the GGUF's pooling_type, else none)
  bool spm_infill = false;              // --spm-infill: /infill writes the suffix before the prefix
  std::string slot_save_path;           // --slot-save-path DIR: enables POST /slots/{id}?action=save|restore|erase
  std::vector<std::string> api_keys;    // --api-key (comma list) + --api-key-file (one per line)
  float slot_prompt_similarity = 0.1f;  // --slot-prompt-similarity: accepted (kiln's prefix cache
                                        // reuses across slots, so no slot-choice heuristic is needed)
  int64_t cache_ram_mib = 8192;         // --cache-ram MiB (-1 unlimited, 0 off)
  size_t max_body_bytes = size_t(64) << 20;  // --max-body-size (bytes): larger bodies get 413
  int http_threads = 0;                 // --threads-http (0: max(16, 4 * parallel))
  int sse_keepalive_ms = 5000;          // --sse-keepalive-ms: ": keep-alive" comment when idle this long
  int test_load_delay_ms = 0;           // --test-load-delay-ms (development/testing): /health stays
                                        // 503 this long after the model is ready
  bool help = false;                    // --help
  bool version = false;                 // --version
};

using Getenv = std::function<const char*(const char*)>;

// Parses argv (argv[0] is the program name). getenv defaults to ::getenv.
Result<ServerOptions> parse_server_args(int argc, const char* const* argv, const Getenv& getenv = {});

// The --help text (every flag with its variables and default).
std::string server_help_text();

}  // namespace kiln::server
