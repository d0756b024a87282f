// `kiln perplexity` — perplexity of a text file the way llama-perplexity computes it:
//   tokenize the whole text (BOS per the vocabulary), cut it into chunks of --ctx tokens, for each
//   chunk start a fresh sequence (first token replaced by BOS when the vocabulary adds one), and
//   score the second half: positions j in [ctx/2, ctx-1) predict token j+1.
//   PPL = exp(mean NLL); the ± is llama.cpp's standard error estimate.
//   kiln perplexity -m FILE -f TEXT [-c CTX] [--chunks N] [-b N] [-t N] [-ctk T] [-ctv T] [-fa on|off|auto]
// Prints "[1]x.xxxx,[2]..." running estimates and "Final estimate: PPL = X +/- Y" on stdout.
// KL divergence, with llama-perplexity's flags and file format (either program reads the other's):
//   --kl-divergence-base F -f TEXT    also writes F: the tokens and every scored position's log-probs
//   --kl-divergence-base F --kl-divergence   (no -f) scores F's tokens and compares with its log-probs:
//                                     mean KLD, same-top-1 rate, ln(PPL(Q)/PPL(base)), Δp (kld_file.h).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "kld_file.h"

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
  std::string kld_path;
  bool kld_mode = false;
  app.add_option("-f,--file", text_path, "text file (not with --kl-divergence: the tokens come from the base file)");
  app.add_option("--kl-divergence-base", kld_path,
                 "llama-perplexity's KL-divergence base file: written (with -f), or read (with --kl-divergence)");
  app.add_flag("--kl-divergence", kld_mode, "score the base file's tokens and print KL divergence against it");
  auto* ctx_opt = app.add_option("-c,--ctx-size,--ctx", ctx, "tokens per chunk");
  app.add_option("--chunks", max_chunks, "score at most this many chunks (default: all)");
  app.add_option("-b,--batch-size", n_batch, "tokens per forward pass");
  app.add_option("-t,--threads", threads, "threads");
  tools::ModelFlags flags;
  flags.add(app, "K cache type (-ctk)", "V cache type (-ctv)", "mmap, mlock or none");
  flags.add_fit(app);
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
  if (kld_mode && kld_path.empty()) return fail(err("--kl-divergence needs --kl-divergence-base FILE"));
  if (!kld_mode && text_path.empty()) return fail(err("-f TEXT is required (unless --kl-divergence)"));
  // --kl-divergence: the base file fixes n_ctx, the vocabulary size and the tokens.
  std::ifstream kin;
  int32_t base_hdr[3] = {0, 0, 0};  // n_ctx, n_vocab, n_chunk
  std::vector<int32_t> base_toks;
  if (kld_mode) {
    kin.open(kld_path, std::ios::binary);
    char magic[8] = {};
    if (!kin || !kin.read(magic, 8) || std::memcmp(magic, "_logits_", 8) != 0 ||
        !kin.read(reinterpret_cast<char*>(base_hdr), sizeof base_hdr) || base_hdr[0] < 4 || base_hdr[1] < 1 ||
        base_hdr[2] < 1)
      return fail(err("{}: not a KL-divergence base file (llama-perplexity --kl-divergence-base format)", kld_path));
    base_toks.resize(size_t(base_hdr[0]) * size_t(base_hdr[2]));
    if (!kin.read(reinterpret_cast<char*>(base_toks.data()), std::streamsize(base_toks.size() * 4)))
      return fail(err("{}: truncated token list", kld_path));
    if (ctx != base_hdr[0] && ctx_opt->count() > 0)
      std::fprintf(stderr, "perplexity: --ctx %lld ignored: the base file was made with %d\n", (long long)ctx, base_hdr[0]);
    ctx = base_hdr[0];
  }
  if (ctx < 4) return fail(err("--ctx {} too small", ctx));
  std::string text;
  if (!kld_mode && !read_file(text_path, text)) return fail(err("{}: cannot open", text_path));
  model::PlanOptions po;  // the run's memory: one sequence of --ctx, all logits of a batch
  po.n_ctx = ctx;
  po.n_batch = po.n_ubatch = std::max<int64_t>(1, std::min(n_batch, ctx));
  po.type_k = mo.type_k;
  po.type_v = mo.type_v;
  po.n_threads = threads;
  po.delta_chunk_min = 64;
  po.flash_attn = co.flash_attn;
  auto m = tools::load_model_cli(model_path, *lm, true, &po, &flags);
  if (!m) return fail(m.error());
  auto tk = model::load_tokenizer((*m)->file());
  if (!tk) return fail(tk.error());
  const auto toks = kld_mode ? base_toks : (*tk)->encode(text);
  int64_t n_chunk = int64_t(toks.size()) / ctx;
  if (max_chunks >= 0) n_chunk = std::min<int64_t>(n_chunk, max_chunks);
  if (n_chunk < 1)
    return fail(err("{}: {} tokens, need at least --ctx {} tokens", text_path, toks.size(), ctx));
  if (kld_mode && base_hdr[1] != (*m)->config().n_vocab)
    return fail(err("{}: made with a vocabulary of {} tokens, {} has {}", kld_path, base_hdr[1], model_path,
                    (*m)->config().n_vocab));
  for (int32_t t : toks)
    if (t < 0 || t >= (*m)->config().n_vocab) return fail(err("{}: token id {} outside the vocabulary", kld_path, t));
  std::ofstream kout;
  const int nv = tools::kld_words((*m)->config().n_vocab);
  std::vector<uint16_t> kwords(static_cast<size_t>(nv));
  if (!kld_mode && !kld_path.empty()) {
    kout.open(kld_path, std::ios::binary);
    const int32_t hdr[3] = {int32_t(ctx), int32_t((*m)->config().n_vocab), int32_t(n_chunk)};
    kout.write("_logits_", 8);
    kout.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    kout.write(reinterpret_cast<const char*>(toks.data()), std::streamsize(size_t(n_chunk * ctx) * 4));
    if (!kout) return fail(err("{}: cannot write", kld_path));
  }
  tools::KldStats kst;
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
        if (kout.is_open()) {
          tools::kld_encode(lg, V, target, kwords.data());
          kout.write(reinterpret_cast<const char*>(kwords.data()), std::streamsize(kwords.size() * 2));
        } else if (kld_mode) {
          if (!kin.read(reinterpret_cast<char*>(kwords.data()), std::streamsize(kwords.size() * 2)))
            return fail(err("{}: truncated log-probs in chunk {}", kld_path, ci + 1));
          kst.add(lg, V, target, kwords.data());
        }
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
  if (kout.is_open() && !kout.flush()) return fail(err("{}: write failed", kld_path));
  if (kld_mode) kst.print(stdout);
  std::fprintf(stderr, "perplexity: %.2f seconds, %.1f tokens per second\n", secs,
               double(n_chunk * ctx) / std::max(secs, 1e-9));
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(perplexity, "perplexity of a text file (like llama-perplexity)", cmd_perplexity);
