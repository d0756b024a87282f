// `kiln spec-bench` — speculative decoding's decode speed through the engine (what the server runs):
//   kiln spec-bench -m FILE [--spec-type none|ngram-simple|draft-mtp|draft-simple] [--spec-draft-n-max N]
//                   [--spec-draft-p-min P] [--spec-draft-vocab N] [--spec-synth-len L] [-md FILE] [-np N]
//                   [-npp 64] [-ntg 64] [-r 3] [-t N] [-c CTX] [-o md|jsonl]
// Each repetition submits -np greedy requests of -npp random tokens (ignore_eos, -ntg tokens each)
// at once and waits for them; the row reports the decode speed (generated tokens over the requests'
// decode wall time, llama-server's predicted_per_second summed over concurrent requests, the median
// over repetitions) and the drafts verified / accepted. A warm-up request precedes the repetitions.
// The engine's own flags are EngineOptions'; synthetic acceptance (--spec-synth-len) accepts drafts
// at the given mean length, so it measures the verification cost at that acceptance.
// KILN_CUDA_PROFILE=1 / KILN_CPU_PROFILE=1: the repetitions' op times (drafts, verify steps, plain
// steps together; the warm-up's forgotten) on stderr, as `kiln bench` prints them.
// Owns nothing beyond the command; threading: main thread (the engine runs its own).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "backend/backend.h"
#include "core/op_profile.h"
#include "engine/engine.h"
#include "model_cli.h"
#include "subcommand.h"

namespace {
using namespace kiln;

int cmd_spec_bench(int argc, char** argv) {
  CLI::App app{"speculative decoding speed through the engine", "kiln spec-bench"};
  std::string model, type = "none", draft, out = "md";
  int n_max = 3, np = 1, npp = 64, ntg = 64, reps = 3, threads = 0;
  double p_min = 0.75, synth_len = -1;
  int64_t ctx = 0, draft_vocab = 0;
  app.add_option("-m,--model", model, "GGUF model")->required();
  app.add_option("--spec-type", type, "none|ngram-simple|draft-mtp|draft-simple");
  app.add_option("--spec-draft-n-max", n_max, "most draft tokens per step");
  app.add_option("--spec-draft-p-min", p_min, "model drafters stop below this probability");
  app.add_option("--spec-draft-vocab", draft_vocab, "draft-mtp: draft among the first N token ids (0: all)");
  app.add_option("--spec-synth-len", synth_len, "synthetic acceptance: mean accepted length (benchmarking)");
  app.add_option("--model-draft", draft, "-md: draft model (draft-simple)");
  app.add_option("--parallel", np, "-np: concurrent requests");
  app.add_option("--npp", npp, "-npp: prompt tokens per request");
  app.add_option("--ntg", ntg, "-ntg: generated tokens per request");
  app.add_option("-r,--repetitions", reps, "repetitions");
  app.add_option("-t,--threads", threads, "threads");
  app.add_option("-c,--ctx-size", ctx, "total context (default: np * (npp + ntg + 16))");
  app.add_option("-o,--output", out, "md or jsonl");
  // llama.cpp's short spellings (CLI11 takes one-character short names only).
  tools::rename_flags(argc, argv, {{"-md", "--model-draft"}, {"-np", "--parallel"}, {"-npp", "--npp"}, {"-ntg", "--ntg"}});
  CLI11_PARSE(app, argc, argv);
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "kiln spec-bench: %s\n", m.c_str());
    return 1;
  };
  auto st = engine::spec_type_from_name(type);
  if (!st) return fail("--spec-type " + type + ": expected none, ngram-simple, draft-mtp or draft-simple");
  if (np < 1 || npp < 1 || ntg < 1 || reps < 1) return fail("-np, -npp, -ntg and -r must be positive");
  engine::EngineOptions eo;
  eo.n_parallel = np;
  eo.n_ctx = ctx > 0 ? ctx : int64_t(np) * (npp + ntg + 16);
  eo.n_threads = threads;
  eo.cache_ram_bytes = 0;  // every repetition prefills its prompts
  eo.spec.type = *st;
  eo.spec.draft_vocab = draft_vocab;
  eo.spec.n_max = n_max;
  eo.spec.p_min = float(p_min);
  eo.spec.synth_len = synth_len;
  eo.spec.model_draft = draft;
  auto e = engine::Engine::load(model, eo);
  if (!e.ok()) return fail(e.error().message);
  const int64_t V = (*e)->info().n_vocab;
  std::mt19937 rng(1);
  auto run = [&](int n) {
    std::vector<engine::RequestHandle> hs;
    for (int i = 0; i < n; ++i) {
      engine::Request r;
      r.prompt.resize(size_t(npp));
      for (auto& t : r.prompt) t = int32_t(rng() % uint32_t(std::min<int64_t>(V, 1 << 30)));
      r.sampling.temperature = 0;
      r.max_tokens = ntg;
      r.ignore_eos = true;
      hs.push_back((*e)->submit(std::move(r)));
    }
    double tps = 0;
    int64_t drafted = 0, accepted = 0;
    for (auto& h : hs)
      for (;;) {
        auto ev = h.next(std::chrono::milliseconds(1000));
        if (!ev || !ev->final()) continue;
        if (ev->timings.predicted_ms > 0) tps += 1000.0 * double(ev->timings.predicted_n) / ev->timings.predicted_ms;
        drafted += ev->timings.draft_n;
        accepted += ev->timings.draft_n_accepted;
        break;
      }
    return std::tuple{tps, drafted, accepted};
  };
  run(1);                          // warm-up
  backend::cuda_profile_report();  // KILN_CUDA_PROFILE / KILN_CPU_PROFILE: forget the warm-up's op times
  op_profile::report("");
  std::vector<double> tps;
  int64_t drafted = 0, accepted = 0;
  for (int r = 0; r < reps; ++r) {
    auto [t, d, a] = run(np);
    tps.push_back(t);
    drafted += d, accepted += a;
  }
  if (const std::string prof = backend::cuda_profile_report(); !prof.empty()) std::fprintf(stderr, "%s\n", prof.c_str());
  if (const std::string prof = op_profile::report("CPU op times (KILN_CPU_PROFILE)"); !prof.empty())
    std::fprintf(stderr, "%s\n", prof.c_str());
  std::sort(tps.begin(), tps.end());
  const double med = tps[tps.size() / 2];
  const double rate = drafted > 0 ? double(accepted) / double(drafted) : 0;
  std::string label = type;
  if (synth_len >= 0) label += fmt::format(" (synth-len {})", synth_len);
  if (out == "jsonl")
    std::printf("{\"spec\": \"%s\", \"n_max\": %d, \"np\": %d, \"npp\": %d, \"ntg\": %d, \"tg_tps\": %.3f, \"draft_n\": %lld, "
                "\"draft_n_accepted\": %lld}\n",
                label.c_str(), n_max, np, npp, ntg, med, (long long)drafted, (long long)accepted);
  else
    std::printf("| %s | %d | %d | %d | %.2f | %lld | %lld | %.1f%% |\n", label.c_str(), n_max, np, ntg, med,
                (long long)drafted, (long long)accepted, 100 * rate);
  return 0;
}

}  // namespace

// Registered by hand: the subcommand's name has a dash.
static ::kiln::tools::SubcommandReg kiln_subcommand_reg_spec_bench(
    "spec-bench", "speculative decoding speed through the engine (plain, drafters, synthetic acceptance)", cmd_spec_bench);
