// `kiln fit` — the memory plan of a run without loading it (like llama-fit-params): reads the GGUF
// metadata and tensor table only (a metadata-only file from `kiln gguf gen --meta-only` will do),
// prints the plan per part and device, and the -ngl / -c (and, for a MoE model whose experts go to
// the host, --n-cpu-moe N or --cpu-moe; -ub N where it is not 512) that `kiln serve` would run with.
// Without a GPU, --device-memory simulates one. Exit status: 0 when the plan fits, 1 when it cannot (the
// error names every GPU part and its size), 2 for bad flags.
// Must not: read tensor data or allocate device memory. Threading: main thread only.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "engine/engine.h"
#include "engine/runner.h"
#include "model/fit.h"
#include "model_cli.h"
#include "subcommand.h"

namespace kiln::tools {
namespace {

int cmd_fit(int argc, char** argv) {
  CLI::App app{"plan the memory of a run (weights, KV, recurrent state, scratch, MTP, projector) and fit "
               "-ngl / -c to a GPU without loading the model",
               "kiln fit"};
  std::string model_path, mmproj, spec_type = "none", model_draft, ctkd, ctvd, n_ubatch = "auto";
  int ngld = -1;
  int64_t ctx = 0, n_batch = 2048, cache_ram = 8192, n_draft = 3, image_tokens = 4096;
  int n_parallel = 1, threads = 0, cache_states = -1;
  app.add_option("-m,--model", model_path, "GGUF model (a metadata-only file is enough)")->required();
  app.add_option("--mmproj", mmproj, "vision projector (-mm): its weights and one image batch are planned");
  app.add_option("-c,--ctx-size", ctx, "total context shared by the slots (default 0 = unset: the training context, "
                                        "lowered by --fit down to --fit-ctx)");
  app.add_option("--parallel", n_parallel, "slots (-np)");
  app.add_option("-b,--batch-size", n_batch, "logical batch (default 2048)");
  app.add_option("--ubatch-size", n_ubatch, "tokens per step (-ub N|auto; auto, the default: as kiln serve, 2048 where "
                                           "everything fits on the GPU with it, else 512)");
  app.add_option("-t,--threads", threads, "CPU threads (CPU workspaces depend on them)");
  app.add_option("--cache-ram", cache_ram, "prefix cache RAM in MiB (-cram; -1 unlimited, 0 off; default 8192)");
  app.add_option("--cache-states", cache_states,
                 "hybrid models: prefix-cache recurrent states kept with the layers (-1 auto = --parallel + 4, at most 64)");
  app.add_option("--spec-type", spec_type,
                 "none|ngram-simple|draft-mtp|draft-simple: keep slots for every speculative type; draft-mtp plans the "
                 "MTP head, its KV and draft scratch, draft-simple the draft model (-md)");
  app.add_option("--model-draft", model_draft, "draft model for --spec-type draft-simple (-md; metadata-only is enough)");
  app.add_option("--n-gpu-layers-draft", ngld, "the draft model's GPU layers (-ngld; default all)");
  app.add_option("--cache-type-k-draft", ctkd, "the draft model's K cache type (-ctkd; default -ctk)");
  app.add_option("--cache-type-v-draft", ctvd, "the draft model's V cache type (-ctvd; default -ctv)");
  app.add_option("--spec-draft-n-max,--draft-max", n_draft, "draft tokens per step for --spec-type (default 3, as kiln serve)");
  app.add_option("--image-max-tokens", image_tokens, "image tokens one image may give (the image batch; default 4096, as kiln serve)");
  ModelFlags flags;
  flags.add(app, "K cache type (-ctk): f16, q8_0, q4_0, f32", "V cache type (-ctv)");
  flags.add_fit(app);
  rename_flags(argc, argv, {{"-md", "--model-draft"}, {"-ngld", "--n-gpu-layers-draft"}, {"-ctkd", "--cache-type-k-draft"},
                            {"-ctvd", "--cache-type-v-draft"}});
  normalize_llama_flags(argc, argv);
  CLI11_PARSE(app, argc, argv);

  auto bad = [](const std::string& m) {
    std::fprintf(stderr, "kiln fit: %s\n", m.c_str());
    return 2;
  };
  if (spec_type != "none" && spec_type != "ngram-simple" && spec_type != "draft-mtp" && spec_type != "draft-simple")
    return bad("--spec-type " + spec_type + ": expected none, ngram-simple, draft-mtp or draft-simple");
  if ((spec_type == "draft-simple") != !model_draft.empty())
    return bad("--spec-type draft-simple and -md/--model-draft go together");
  model::MemoryOptions mo;
  model::ContextOptions co;
  auto lo = flags.resolve(mo, co);
  if (!lo) return bad(lo.error().message);
  auto fo = flags.fit_options();
  if (!fo) return bad(fo.error().message);
  auto gpu = flags.budget(*lo, /*simulate=*/true);
  if (!gpu) return bad(gpu.error().message);

  // Header-only opens; the files stay open while the shapes that point into them are used.
  std::vector<std::unique_ptr<gguf::File>> files;
  auto open_meta = [&](const std::string& path) -> Result<const gguf::File*> {
    gguf::OpenOptions oo;
    oo.limits.metadata_only = true;
    auto f = gguf::File::open(path, oo);
    KILN_TRY(f);
    files.push_back(std::move(*f));
    return files.back().get();
  };
  auto f = open_meta(model_path);
  if (!f) return bad(f.error().message);
  auto shape = model::ModelShape::from_file(**f);
  if (!shape) return bad(shape.error().message);
  std::optional<model::ProjectorShape> proj;
  if (!mmproj.empty()) {
    auto pf = open_meta(mmproj);
    if (!pf) return bad(pf.error().message);
    auto ps = model::ProjectorShape::from_file(**pf);
    if (!ps) return bad(ps.error().message);
    proj = std::move(*ps);
  }

  model::PlanOptions po;
  po.n_ctx = ctx;
  po.n_parallel = std::max(1, n_parallel);
  po.n_batch = n_batch;
  if (n_ubatch == "auto") {
    po.n_ubatch = model::kUbatchAuto;
  } else {
    char* end = nullptr;
    const long long ub = std::strtoll(n_ubatch.c_str(), &end, 10);
    if (n_ubatch.empty() || *end != '\0' || ub < 1)
      return bad("--ubatch-size " + n_ubatch + ": expected a positive count or auto");
    po.n_ubatch = ub;
  }
  po.type_k = mo.type_k;
  po.type_v = mo.type_v;
  po.n_threads = threads;
  po.flash_attn = co.flash_attn;
  po.n_gpu_layers = lo->n_gpu_layers;
  po.main_gpu = lo->main_gpu;
  po.placement = lo->placement;
  po.cache_ram_bytes = cache_ram < 0 ? -1 : cache_ram * (int64_t(1) << 20);
  po.spec_mtp = spec_type == "draft-mtp";
  po.n_draft = n_draft;
  po.n_spec = spec_type == "none" ? 0 : int(n_draft);  // keep slots, as the engine (SpecOptions::n_keep)
  po.n_outputs_max = int64_t(po.n_parallel) * (1 + po.n_spec);  // one logits row per slot and kept draft, as kiln serve
  po.n_top = engine::runner_top_logits(false);  // as kiln serve
  {
    engine::EngineOptions eo;  // kiln serve's rule for the spare state slots
    eo.n_parallel = po.n_parallel, eo.cache_ram_bytes = po.cache_ram_bytes, eo.cache_states = cache_states;
    po.n_rec_cache = engine::resolve_cache_states(eo);
    po.rec_cache_auto = cache_states < 0;
    po.delta_chunk_min = engine::resolve_delta_chunk(eo, po.n_gpu_layers != 0);  // --delta-chunk auto
  }
  std::optional<model::ModelShape> draft;
  if (!model_draft.empty()) {
    auto d = open_meta(model_draft);
    if (!d) return bad(d.error().message);
    auto ds = model::ModelShape::from_file(**d);
    if (!ds) return bad(ds.error().message);
    draft = std::move(*ds);
    po.draft = &*draft;
    po.draft_n_gpu_layers = ngld < 0 ? model::kGpuLayersAuto : ngld;
    po.draft_type_k = mo.type_k, po.draft_type_v = mo.type_v;
    for (auto [s, t] : {std::pair{&ctkd, &po.draft_type_k}, std::pair{&ctvd, &po.draft_type_v}})
      if (!s->empty()) {
        auto ty = parse_cache_type(*s, "-ctkd/-ctvd");
        if (!ty) return bad(ty.error().message);
        *t = *ty;
      }
  }
  po.image_max_tokens = image_tokens;
  if (!*gpu && lo->n_gpu_layers != 0)
    std::fprintf(stderr, "kiln fit: no usable GPU (%s) and no --device-memory: planning for the CPU only\n",
                 backend::cuda_unavailable_reason().c_str());
  auto plan = model::fit_plan(*shape, proj ? &*proj : nullptr, po, *fo, *gpu);
  if (!plan) {
    std::fprintf(stderr, "kiln fit: %s\n", plan.error().message.c_str());
    return 1;
  }
  std::fputs(plan->table().c_str(), stdout);
  if (!plan->fits()) {
    std::fprintf(stderr, "kiln fit: --fit off: the plan does not fit %s: %s\n", plan->gpu->name.c_str(),
                 plan->gpu_parts().c_str());
    return 1;
  }
  std::string moe;  // the expert placement kiln serve would load with (fitted, or as given)
  if (plan->n_cpu_moe >= model::kCpuMoeAll) moe = " --cpu-moe";
  else if (plan->n_cpu_moe > 0) moe = " --n-cpu-moe " + std::to_string(plan->n_cpu_moe);
  // -ub where it is not llama-server's 512 (-ub auto chose larger steps, or it was given).
  const std::string ub = plan->n_ubatch != 512 ? " -ub " + std::to_string(plan->n_ubatch) : "";
  std::printf("-ngl %d -c %lld%s%s\n", plan->n_gpu_layers, (long long)plan->n_ctx, moe.c_str(), ub.c_str());
  return 0;
}

}  // namespace
}  // namespace kiln::tools

KILN_SUBCOMMAND(fit, "plan memory and fit -ngl / -c to a GPU without loading the model (like llama-fit-params)",
                kiln::tools::cmd_fit);
