// `kiln batched-bench` — llama-batched-bench-like throughput of several sequences decoded together,
// with llama-batched-bench's flags and table so both engines line up side by side:
//   kiln batched-bench -m FILE -npp 512 -ntg 128 -npl 1,8,32 [-pps] [-b 2048] [-ub 512] [-ngl all]
//                      [-fa on] [-ctk f16] [-ctv f16] [-o md|jsonl]
// For every (npp, ntg, npl): the memory is cleared; the prompt phase decodes npl sequences of npp
// random tokens (with -pps one shared prompt, then copied to the other sequences, as
// llama-batched-bench's "prompt shared") in decodes of at most -ub tokens, logits for each
// sequence's last token; the generation phase runs ntg steps of one token per sequence (npl tokens
// per decode, logits for all). T_PP / T_TG are the phases' wall times (the GPU is synchronized by
// every decode's logits), S_PP = npl * npp / T_PP (npp with -pps), S_TG = npl * ntg / T_TG,
// S = N_KV / (T_PP + T_TG) with N_KV = the positions held at the end (llama-batched-bench's columns).
// A warm-up decode precedes the first test. With KILN_CUDA_PROFILE=1 each test's per-op GPU times
// go to stderr. Owns nothing beyond the command; threading: main thread.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "model_cli.h"
#include "subcommand.h"

namespace {
using namespace kiln;
using Clock = std::chrono::steady_clock;

Result<std::vector<int64_t>> int_list(const std::vector<std::string>& vals, const char* flag, int64_t min) {
  std::vector<int64_t> out;
  for (const auto& v : vals) {
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      size_t used = 0;
      long long x = 0;
      try {
        x = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size()) return err("{} {}: not an integer", flag, item);
      if (x < min) return err("{} {}: must be >= {}", flag, item, min);
      out.push_back(x);
    }
  }
  if (out.empty()) return err("{}: no values", flag);
  return out;
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int cmd_batched_bench(int argc, char** argv) {
  CLI::App app{"llama-batched-bench-like throughput of several sequences decoded together", "kiln batched-bench"};
  std::vector<std::string> npp = {"128", "256", "512"}, ntg = {"128", "256"}, npl = {"1", "2", "4", "8", "16", "32"};
  int64_t n_batch = 2048, n_ubatch = 512, n_kv_max = 0;
  int threads = 0;
  bool pps = false;
  std::string output = "md";
  tools::ModelFlags flags;
  flags.ngl = "all";
  std::string model;
  app.add_option("-m,--model", model, "GGUF model file")->required();
  app.add_option("--npp", npp, "-npp: prompt tokens per sequence (comma list)");
  app.add_option("--ntg", ntg, "-ntg: generated tokens per sequence (comma list)");
  app.add_option("--npl", npl, "-npl: sequences decoded together (comma list)");
  app.add_flag("--pps", pps, "-pps: one prompt shared by all sequences (prefilled once, then copied)");
  app.add_option("-c,--ctx-size", n_kv_max,
                 "KV cells of all sequences together (llama-batched-bench's n_kv_max; default: what the runs need)");
  app.add_option("-b,--batch-size", n_batch, "logical batch size (tokens the prompt phase groups)");
  app.add_option("--ubatch-size", n_ubatch, "-ub: physical batch size (tokens per decode)");
  app.add_option("-t,--threads", threads, "CPU threads (default: all cores)");
  app.add_option("-o,--output-format", output, "md or jsonl")->check(CLI::IsMember({"md", "jsonl"}));
  flags.add(app, "-ctk: K cache type (f32, f16, q8_0, q4_0)", "-ctv: V cache type");
  tools::rename_flags(argc, argv,
                      {{"-npp", "--npp"}, {"-ntg", "--ntg"}, {"-npl", "--npl"}, {"-pps", "--pps"}, {"--output", "--output-format"}});
  tools::normalize_llama_flags(argc, argv);
  CLI11_PARSE(app, argc, argv);
  auto fail = [](const Error& e) {
    std::fprintf(stderr, "kiln batched-bench: %s\n", e.message.c_str());
    return 1;
  };
  auto PP = int_list(npp, "-npp", 1);
  if (!PP) return fail(PP.error());
  auto TG = int_list(ntg, "-ntg", 0);
  if (!TG) return fail(TG.error());
  auto PL = int_list(npl, "-npl", 1);
  if (!PL) return fail(PL.error());
  if (n_batch < 1 || n_ubatch < 1) return fail(err("-b and -ub must be >= 1"));
  n_ubatch = std::min(n_ubatch, n_batch);
  int64_t max_pl = 0, max_ctx = 0;
  for (int64_t pl : *PL) max_pl = std::max(max_pl, pl);
  for (int64_t p : *PP)
    for (int64_t g : *TG) max_ctx = std::max(max_ctx, p + g);
  if (max_pl > n_ubatch) return fail(err("-npl {} is larger than -ub {}: one generation step must fit a decode", max_pl, n_ubatch));
  if (n_kv_max < 0) return fail(err("-c {} must be >= 0", n_kv_max));
  if (n_kv_max > 0) {  // the cells are split evenly among the largest -npl's sequences
    if (n_kv_max / max_pl < max_ctx)
      return fail(err("-c {} gives each of {} sequences {} KV cells; the runs need {} (npp + ntg)", n_kv_max, max_pl,
                      n_kv_max / max_pl, max_ctx));
    max_ctx = n_kv_max / max_pl;
  }

  model::MemoryOptions mo;
  model::ContextOptions co;
  auto lo = flags.resolve(mo, co);
  if (!lo) return fail(lo.error());
  auto m = tools::load_model_cli(model, *lo, /*show_progress=*/false);
  if (!m) return fail(m.error());
  mo.n_ctx = max_ctx;
  mo.n_seq = int(max_pl);
  auto mem = model::Memory::create(**m, mo);
  if (!mem) return fail(mem.error());
  co.n_batch = n_ubatch;
  co.n_outputs_max = max_pl;
  co.n_threads = threads;
  model::Context cx(**m, co);
  const int64_t n_vocab = (*m)->config().n_vocab;
  std::mt19937 rng(1234);
  auto tok = [&] { return int32_t(rng() % uint64_t(n_vocab)); };

  // Decodes the queued tokens in pieces of at most -ub (the prompt phase's -b groups them first).
  model::Batch b;
  auto flush = [&](model::Batch& all) -> Status {
    for (size_t i = 0; i < all.token.size(); i += size_t(n_ubatch)) {
      const size_t e = std::min(all.token.size(), i + size_t(n_ubatch));
      b.clear();
      for (size_t j = i; j < e; ++j) b.add(all.token[j], all.pos[j], all.seq[j], all.output[j] != 0);
      KILN_TRY(cx.decode(b, **mem));
    }
    all.clear();
    return {};
  };
  {  // warm-up: one short prompt (at most the context)
    model::Batch w;
    const int n_warm = int(std::min<int64_t>(16, max_ctx));
    for (int i = 0; i < n_warm; ++i) w.add(tok(), i, 0, i == n_warm - 1);
    if (auto st = flush(w); !st) return fail(st.error());
    (*mem)->seq_clear(0);
  }

  if (output == "md") {
    std::printf("\nn_kv_max = %lld, n_batch = %lld, n_ubatch = %lld, flash_attn = %d, is_pp_shared = %d, n_gpu_layers = %lld\n\n",
                (long long)max_ctx * max_pl, (long long)n_batch, (long long)n_ubatch, co.flash_attn ? 1 : 0, pps ? 1 : 0,
                (long long)(*m)->info().n_gpu_layers);
    std::printf("| %6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |\n", "PP", "TG", "B", "N_KV", "T_PP s",
                "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s");
    std::printf("|--------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n");
  }
  for (int64_t pp : *PP)
    for (int64_t tg : *TG)
      for (int64_t pl : *PL) {
        for (int s = 0; s < mo.n_seq; ++s) (*mem)->seq_clear(s);
        model::Batch all;
        backend::cuda_profile_report();  // KILN_CUDA_PROFILE: forget earlier op times
        const auto t0 = Clock::now();
        const int64_t n_prompt_seqs = pps ? 1 : pl;
        for (int64_t s = 0; s < n_prompt_seqs; ++s) {
          for (int64_t i = 0; i < pp; ++i) {
            all.add(tok(), int32_t(i), int32_t(s), i == pp - 1);
            if (int64_t(all.token.size()) >= n_batch)
              if (auto st = flush(all); !st) return fail(st.error());
          }
        }
        if (auto st = flush(all); !st) return fail(st.error());
        if (pps)
          for (int64_t s = 1; s < pl; ++s) (*mem)->seq_copy(0, int(s));
        const auto t1 = Clock::now();
        for (int64_t i = 0; i < tg; ++i) {
          b.clear();
          for (int64_t s = 0; s < pl; ++s) b.add(tok(), int32_t(pp + i), int32_t(s), true);
          if (auto st = cx.decode(b, **mem); !st) return fail(st.error());
        }
        const auto t2 = Clock::now();
        if (const std::string prof = backend::cuda_profile_report(); !prof.empty())
          std::fprintf(stderr, "pp %lld tg %lld pl %lld: %s\n", (long long)pp, (long long)tg, (long long)pl, prof.c_str());
        const double t_pp = seconds(t0, t1), t_tg = seconds(t1, t2), t = t_pp + t_tg;
        const int64_t n_kv = pps ? pp + pl * tg : pl * (pp + tg);
        const double s_pp = double(pps ? pp : pl * pp) / t_pp, s_tg = tg > 0 ? double(pl * tg) / t_tg : 0.0;
        if (output == "md") {
          std::printf("| %6lld | %6lld | %4lld | %6lld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n",
                      (long long)pp, (long long)tg, (long long)pl, (long long)n_kv, t_pp, s_pp, t_tg, s_tg, t,
                      double(n_kv) / t);
        } else {
          nlohmann::json j;
          j["n_kv_max"] = max_ctx * max_pl;
          j["n_batch"] = n_batch;
          j["n_ubatch"] = n_ubatch;
          j["flash_attn"] = co.flash_attn ? 1 : 0;
          j["is_pp_shared"] = pps ? 1 : 0;
          j["n_gpu_layers"] = (*m)->info().n_gpu_layers;
          j["n_threads"] = cx.pool().size();
          j["pp"] = pp, j["tg"] = tg, j["pl"] = pl, j["n_kv"] = n_kv;
          j["t_pp"] = t_pp, j["speed_pp"] = s_pp, j["t_tg"] = t_tg, j["speed_tg"] = s_tg, j["t"] = t;
          j["speed"] = double(n_kv) / t;
          std::printf("%s\n", j.dump().c_str());
        }
        std::fflush(stdout);
      }
  return 0;
}

}  // namespace

// Registered by hand: the subcommand's name has a dash (llama-batched-bench's).
static ::kiln::tools::SubcommandReg kiln_subcommand_reg_batched_bench(
    "batched-bench", "llama-batched-bench-like throughput of npl sequences decoded together", cmd_batched_bench);
