// tools/kiln/model_cli.h — shared by `kiln run`, `kiln perplexity` and `kiln logits`: their
// llama.cpp-like model and cache flags (ModelFlags), loading a model (progress, load time).
// `kiln bench` uses pieces of it; the tokenizer of a file comes from model::load_tokenizer.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "gguf/types.h"
#include "model/context.h"
#include "model/fit.h"
#include "model/model.h"

namespace kiln::tools {

// CLI11 has no multi-letter single-dash options: rename_flags rewrites llama.cpp's spellings (e.g.
// "-npp") to the long names the command declares, in place before parsing. The names are literals
// that CLI11 only reads.
struct FlagAlias {
  const char* from;
  const char* to;
};
inline void rename_flags(int argc, char** argv, std::initializer_list<FlagAlias> aliases) {
  for (int i = 1; i < argc; ++i)
    for (const FlagAlias& a : aliases)
      if (std::strcmp(argv[i], a.from) == 0) {
        argv[i] = const_cast<char*>(a.to);
        break;
      }
}
// The model, cache and fit flags every model command shares (-ctk/-ctv/-ngl style).
inline void normalize_llama_flags(int argc, char** argv) {
  rename_flags(argc, argv,
               {{"-fit", "--fit"}, {"-fitt", "--fit-target"}, {"-fitc", "--fit-ctx"}, {"-np", "--parallel"},
                {"-mm", "--mmproj"}, {"-ub", "--ubatch-size"}, {"-cram", "--cache-ram"}, {"-ctk", "--cache-type-k"},
                {"-ctv", "--cache-type-v"}, {"-fa", "--flash-attn"}, {"-ngl", "--n-gpu-layers"}, {"-dev", "--device"},
                {"-mg", "--main-gpu"}, {"-cmoe", "--cpu-moe"}, {"-ncmoe", "--n-cpu-moe"}, {"-ot", "--override-tensor"}});
}

inline Result<gguf::GgmlType> parse_cache_type(const std::string& s, const char* flag) {
  auto t = gguf::type_from_name(s);
  if (!t || (*t != gguf::GgmlType::F32 && *t != gguf::GgmlType::F16 && *t != gguf::GgmlType::Q8_0 &&
             *t != gguf::GgmlType::Q4_0))
    return err("{} {}: supported cache types are f32, f16, q8_0, q4_0", flag, s);
  return *t;
}

// --flash-attn on|off|auto (llama.cpp's values). off selects llama.cpp's non-flash attention
// arithmetic (model::ContextOptions::flash_attn); on and auto kiln's streaming attention.
inline Result<bool> parse_flash_attn(const std::string& s) {
  if (s == "on" || s == "auto" || s == "1" || s == "true") return true;
  if (s == "off" || s == "0" || s == "false") return false;
  return err("--flash-attn {}: expected on, off or auto", s);
}
inline constexpr const char* kFlashAttnHelp =
    "on|off|auto (-fa): off computes attention as llama.cpp does without flash attention, bit for bit "
    "on AVX-512 hosts with an f16 cache";

// -ngl N|auto|all (llama-server's values): a layer count, model::kGpuLayersAll or kGpuLayersAuto.
inline Result<int> parse_gpu_layers(const std::string& s) {
  if (s == "auto") return model::kGpuLayersAuto;
  if (s == "all" || s == "-1") return model::kGpuLayersAll;
  try {
    size_t used = 0;
    const int n = std::stoi(s, &used);
    if (used == s.size() && n >= 0) return n;
  } catch (...) {
  }
  return err("-ngl {}: expected a number of layers, auto or all", s);
}

// -dev/--device none|CUDA<i> (llama-server's names): none keeps everything on the CPU.
inline Status apply_device(const std::string& s, model::LoadOptions& lo) {
  if (s.empty()) return {};
  if (s == "none" || s == "cpu" || s == "CPU") {
    lo.n_gpu_layers = 0;
    return {};
  }
  if (s.rfind("CUDA", 0) == 0 && s.size() > 4 && s.find_first_not_of("0123456789", 4) == std::string::npos) {
    lo.main_gpu = std::stoi(s.substr(4));
    return {};
  }
  return err("--device {}: expected none or CUDA<i> (one device; see `kiln devices`)", s);
}

inline Result<LoadMode> parse_load_mode(const std::string& s) {
  if (s == "mmap") return LoadMode::Mmap;
  if (s == "mlock") return LoadMode::Mlock;
  if (s == "none" || s == "read") return LoadMode::Read;
  return err("--load-mode {}: expected mmap, mlock or none", s);
}

// -ctk/-ctv, --load-mode and --flash-attn as `kiln run`, `kiln perplexity` and `kiln logits` take
// them: add() registers them (the help texts are each command's; no load_mode_help: no
// --load-mode), resolve() checks the values after parsing and puts them into the options.
struct ModelFlags {
  std::string ctk = "f16", ctv = "f16", load_mode = "mmap", flash_attn = "auto", ngl = "auto", device;
  int main_gpu = 0;
  // MoE expert offload (model/placement.h): --cpu-moe, --n-cpu-moe N, -ot PATTERN=DEVICE (repeatable).
  bool cpu_moe = false;
  int n_cpu_moe = 0;
  std::vector<std::string> override_tensor;
  // Memory planning (model/fit.h, docs/memory.md): --fit on|off, --fit-target MiB, --fit-ctx N,
  // --device-memory SIZE (or KILN_DEVICE_MEMORY).
  std::string fit = "on", fit_target = "1024", device_memory;
  int64_t fit_ctx = 4096;

  void add_fit(CLI::App& app) {
    app.add_option("--fit", fit, "on|off (-fit): plan memory before loading; -ngl auto takes as many layers as fit");
    app.add_option("--fit-target", fit_target, "MiB[,MiB...] (-fitt): memory --fit keeps free on the GPU (default 1024)");
    app.add_option("--fit-ctx", fit_ctx, "N (-fitc): the smallest context --fit may choose when -c is unset (default 4096)");
    app.add_option("--device-memory", device_memory, "SIZE: use at most this much GPU memory (e.g. 8GiB)")
        ->envname("KILN_DEVICE_MEMORY");
  }
  // The fitting options and the GPU budget (simulate: without a usable GPU, plan for a simulated
  // device of --device-memory bytes, as `kiln fit` does).
  Result<std::optional<model::DeviceBudget>> budget(const model::LoadOptions& lo, bool simulate) const {
    auto t = model::parse_fit_target(fit_target);
    KILN_TRY(t);
    uint64_t cap = 0;
    if (!device_memory.empty()) {
      auto c = model::parse_memory_size(device_memory, "--device-memory");
      KILN_TRY(c);
      cap = *c;
    }
    if (lo.n_gpu_layers == 0) return std::optional<model::DeviceBudget>{};
    return model::gpu_budget(lo.main_gpu, cap, t->front(), simulate);
  }
  Result<model::FitOptions> fit_options() const {
    if (fit != "on" && fit != "off") return err("--fit {}: expected on or off", fit);
    model::FitOptions f;
    f.fit = fit == "on";
    f.fit_ctx = fit_ctx;
    return f;
  }

  void add(CLI::App& app, const char* ctk_help, const char* ctv_help, const char* load_mode_help = nullptr) {
    app.add_option("--cache-type-k", ctk, ctk_help);
    app.add_option("--cache-type-v", ctv, ctv_help);
    if (load_mode_help) app.add_option("--load-mode", load_mode, load_mode_help);
    app.add_option("--flash-attn", flash_attn, kFlashAttnHelp);
    app.add_option("--n-gpu-layers,--gpu-layers", ngl,
                   "N|auto|all (-ngl): layers on the GPU, the last ones first (auto: as many as fit, see --fit; 0: CPU)");
    app.add_option("--device", device, "none|CUDA<i> (-dev): the device to use (none: CPU only)");
    app.add_option("--main-gpu", main_gpu, "CUDA device ordinal (-mg)");
    add_moe(app, cpu_moe, n_cpu_moe, override_tensor);
  }
  // The expert-offload flags, as `kiln bench` also registers them.
  static void add_moe(CLI::App& app, bool& cpu_moe, int& n_cpu_moe, std::vector<std::string>& ot) {
    app.add_flag("--cpu-moe", cpu_moe, "(-cmoe) keep the expert tensors of every MoE layer in host memory (run there)");
    app.add_option("--n-cpu-moe", n_cpu_moe, "N (-ncmoe): keep the expert tensors of the first N layers in host memory");
    app.add_option("--override-tensor", ot,
                   "PATTERN=DEVICE[,...] (-ot, repeatable): tensors whose name matches the regex go to DEVICE (CPU or "
                   "CUDA<i>); kiln moves the expert tensors of GPU layers")
        ->expected(1)
        ->take_all();
  }

  // Fills mo.type_k/type_v, co.flash_attn and the load options (mode, GPU layers, device).
  Result<model::LoadOptions> resolve(model::MemoryOptions& mo, model::ContextOptions& co) const {
    auto kt = parse_cache_type(ctk, "-ctk");
    KILN_TRY(kt);
    auto vt = parse_cache_type(ctv, "-ctv");
    KILN_TRY(vt);
    auto lm = parse_load_mode(load_mode);
    KILN_TRY(lm);
    auto fa = parse_flash_attn(flash_attn);
    KILN_TRY(fa);
    auto ng = parse_gpu_layers(ngl);
    KILN_TRY(ng);
    mo.type_k = *kt;
    mo.type_v = *vt;
    co.flash_attn = *fa;
    model::LoadOptions lo;
    lo.load_mode = *lm;
    lo.n_gpu_layers = *ng;
    lo.main_gpu = main_gpu;
    KILN_TRY(apply_device(device, lo));
    auto pl = model::placement_options(cpu_moe, n_cpu_moe, override_tensor);
    KILN_TRY(pl);
    lo.placement = std::move(*pl);
    return lo;
  }
};

// Plans the run's memory from the file's metadata before loading (model::fit_plan), prints the
// plan table on stderr (when show) and returns the load options to use: -ngl fitted when auto, and the
// --n-cpu-moe fitting chose for a MoE model whose expert flags were left unset.
inline Result<model::LoadOptions> fit_cli(const gguf::File& f, model::LoadOptions lo, const model::PlanOptions& po,
                                          const ModelFlags& flags, bool show) {
  auto shape = model::ModelShape::from_file(f);
  KILN_TRY(shape);
  auto fo = flags.fit_options();
  KILN_TRY(fo);
  auto gpu = flags.budget(lo, /*simulate=*/false);
  KILN_TRY(gpu);
  model::PlanOptions o = po;
  o.n_gpu_layers = lo.n_gpu_layers;
  o.main_gpu = lo.main_gpu;
  o.placement = lo.placement;
  auto plan = model::fit_plan(*shape, nullptr, o, *fo, *gpu);
  KILN_TRY(plan);
  if (show) std::fputs(plan->table().c_str(), stderr);
  if (*gpu) {
    lo.n_gpu_layers = plan->n_gpu_layers;
    lo.placement.n_cpu_moe = plan->n_cpu_moe;
  }
  return lo;
}

// Loads with a progress bar on stderr (when show_progress) and prints the load time. With `plan`
// (the run's context and batch), the memory plan is made first and -ngl auto fitted (fit_cli).
inline Result<std::unique_ptr<model::Model>> load_model_cli(const std::string& path, model::LoadOptions lo,
                                                            bool show_progress, const model::PlanOptions* plan = nullptr,
                                                            const ModelFlags* flags = nullptr) {
  if (show_progress)
    lo.progress = [](size_t done, size_t total) {
      const int w = 30, filled = total ? int(w * done / total) : w;
      std::fprintf(stderr, "\rloading [%.*s%*s] %zu/%zu layers", filled, "==============================", w - filled,
                   "", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  gguf::OpenOptions oo;
  oo.load_mode = lo.load_mode;
  auto f = gguf::File::open(path, oo);
  KILN_TRY(f);
  if (plan && flags) {
    auto fitted = fit_cli(**f, lo, *plan, *flags, show_progress);
    KILN_TRY(fitted);
    lo = std::move(*fitted);
  }
  auto m = model::load_model(std::move(*f), lo);
  KILN_TRY(m);
  if (show_progress) {
    const auto& c = (*m)->config();
    std::fprintf(stderr, "model: %s, %s, %lld layers, n_embd %lld, n_vocab %lld, %.2f MiB weights, loaded in %.1f ms\n",
                 c.arch_str.c_str(), c.name.c_str(), (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_vocab,
                 double((*m)->info().weight_bytes) / (1024.0 * 1024.0), (*m)->info().load_ms);
  }
  return m;
}

}  // namespace kiln::tools
