// `kiln perplexity` — perplexity of a text file the way llama-perplexity computes it:
//   tokenize the whole text (BOS per the vocabulary), cut it into chunks of --ctx tokens, for each
//   chunk start a fresh sequence (first token replaced by BOS when the vocabulary adds one), and
//   score the second half: positions j in [ctx/2, ctx-1) predict token j+1.
//   PPL = exp(mean NLL); the ± is llama.cpp's standard error estimate.
//   kiln perplexity -m FILE -f TEXT [-c CTX] [--chunks N] [-b N] [-t N] [-ctk T] [-ctv T] [-fa on|off|auto]
// Prints "[1]x.xxxx,[2]..." running estimates and "Final estimate: PPL = X +/- Y" on stdout.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "model/vocab_loader.h"
#include "model_cli.h"
#include "core/read_file.h"
#include "subcommand.h"

namespace {
using namespace kiln;

int cmd_perplexity(int argc, char** argv) {
  CLI::App app{"perplexity of a text file (like llama-perplexity)", "kiln perplexity"};
  std::string model_path, text_path;
  int64_t ctx = 512, n_batch = 512;
  int threads = 0, max_chunks = -1;
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("-f,--file", text_path, "text file")->required();
  app.add_option("-c,--ctx-size,--ctx", ctx, "tokens per chunk");
  app.add_option("--chunks", max_chunks, "score at most this many chunks (default: all)");
  app.add_option("-b,--batch-size", n_batch, "tokens per forward pass");
  app.add_option("-t,--threads", threads, "threads");
  tools::ModelFlags flags;
  flags.add(app, "K cache type (-ctk)", "V cache type (-ctv)", "mmap, mlock or none");
  tools::normalize_llama_flags(argc, argv);
  CLI11_PARSE(app, argc, argv);
  auto fail = [](const Error& e) {
    std::fprintf(stderr, "kiln perplexity: %s\n", e.message.c_str());
    return 1;
  };
  model::MemoryOptions mo;
  model::ContextOptions co;
  auto lm = flags.resolve(mo, co);
  if (!lm) return fail(lm.error());
  if (ctx < 4) return fail(err("--ctx {} too small", ctx));
  std::string text;
  if (!read_file(text_path, text)) return fail(err("{}: cannot open", text_path));
  auto m = tools::load_model_cli(model_path, *lm, true);
  if (!m) return fail(m.error());
  auto tk = model::load_tokenizer((*m)->file());
  if (!tk) return fail(tk.error());
  const auto toks = (*tk)->encode(text);
  int64_t n_chunk = int64_t(toks.size()) / ctx;
  if (max_chunks >= 0) n_chunk = std::min<int64_t>(n_chunk, max_chunks);
  if (n_chunk < 1)
    return fail(err("{}: {} tokens, need at least --ctx {} tokens", text_path, toks.size(), ctx));
  std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld\n", toks.size(), (long long)n_chunk, (long long)ctx);

  mo.n_ctx = ctx;
  auto mem = model::Memory::create(**m, mo);
  if (!mem) return fail(mem.error());
  co.n_batch = std::max<int64_t>(1, std::min(n_batch, ctx));  // -b <= 0: 1, as in kiln run
  co.n_threads = threads;
  co.delta_chunk_min = 64;
  model::Context cx(**m, co);
  const int64_t V = (*m)->config().n_vocab;
  const bool add_bos = (*tk)->vocab().add_bos && (*tk)->vocab().bos >= 0;
  const int64_t first = ctx / 2;
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  std::vector<int32_t> chunk(static_cast<size_t>(ctx));
  model::Batch b;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t ci = 0; ci < n_chunk; ++ci) {
    std::copy_n(toks.begin() + ci * ctx, ctx, chunk.begin());
    if (add_bos) chunk[0] = (*tk)->vocab().bos;
    (*mem)->seq_clear(0);
    for (int64_t s = 0; s < ctx; s += co.n_batch) {
      const int64_t n = std::min(co.n_batch, ctx - s);
      b.clear();
      for (int64_t j = 0; j < n; ++j) b.add(chunk[size_t(s + j)], int32_t(s + j), 0, s + j >= first && s + j < ctx - 1);
      if (auto st = cx.decode(b, **mem); !st) return fail(st.error());
      int64_t row = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (!b.output[size_t(j)]) continue;
        const float* lg = cx.logits(row++);
        const int32_t target = toks[size_t(ci * ctx + s + j + 1)];
        float mx = lg[0];
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, lg[v]);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(lg[v] - mx));
        const double l = std::log(sum) - double(lg[target] - mx);
        nll += l;
        nll2 += l * l;
        ++count;
      }
    }
    std::printf("[%lld]%.4f,", (long long)(ci + 1), std::exp(nll / double(count)));
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mean = nll / double(count), ppl = std::exp(mean);
  const double var = count > 1 ? (nll2 / double(count) - mean * mean) / double(count - 1) : 0;
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * std::sqrt(std::max(0.0, var)));
  std::fprintf(stderr, "perplexity: %.2f seconds, %.1f tokens per second\n", secs,
               double(n_chunk * ctx) / std::max(secs, 1e-9));
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(perplexity, "perplexity of a text file (like llama-perplexity)", cmd_perplexity);
