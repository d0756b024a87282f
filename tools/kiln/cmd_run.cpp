// `kiln run` — load a model, stream a completion of a prompt to stdout, then print llama.cpp-like
// timing lines to stderr. `--chat` reads user turns from stdin and formats them with the model's
// chat template (tokenizer.chat_template).
//   kiln run -m FILE -p PROMPT [-n N] [--temp T] [--top-k K] [--seed S] [-c CTX] [-t N] [-b N]
//            [-ctk T] [-ctv T] [-fa on|off|auto] [--load-mode mmap|mlock|none] [--chat] [--ids-out FILE]
// Sampling here is deliberately simple (greedy when --temp <= 0, else top-k + temperature); the
// full sampler chain belongs to the engine.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "chat/chat.h"
#include "model/vocab_loader.h"
#include "model_cli.h"
#include "subcommand.h"

namespace {
using namespace kiln;
using Clock = std::chrono::steady_clock;

struct Sampler {
  float temp = 0.8f;
  int top_k = 40;
  std::mt19937_64 rng;
  std::vector<std::pair<float, int32_t>> cand;
  int32_t sample(const float* logits, int64_t V) {
    if (temp <= 0) return int32_t(std::max_element(logits, logits + V) - logits);
    cand.resize(size_t(V));
    for (int64_t i = 0; i < V; ++i) cand[size_t(i)] = {logits[i], int32_t(i)};
    const size_t k = top_k > 0 ? std::min<size_t>(size_t(top_k), cand.size()) : cand.size();
    std::partial_sort(cand.begin(), cand.begin() + ptrdiff_t(k), cand.end(), std::greater<>());
    const float mx = cand[0].first;
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += (cand[i].first = std::exp((cand[i].first - mx) / temp));
    double r = std::uniform_real_distribution<double>(0, sum)(rng);
    for (size_t i = 0; i < k; ++i)
      if ((r -= cand[i].first) <= 0) return cand[i].second;
    return cand[k - 1].second;
  }
};

struct Timing {
  double prompt_ms = 0, gen_ms = 0;
  int64_t prompt_tokens = 0, gen_tokens = 0;
  void print(double load_ms) const {
    auto line = [](const char* what, double ms, int64_t n, const char* unit) {
      std::fprintf(stderr, "kiln: %16s = %10.2f ms / %5lld %s (%8.2f ms per token, %8.2f tokens per second)\n", what, ms,
                   (long long)n, unit, n ? ms / double(n) : 0.0, ms > 0 ? 1000.0 * double(n) / ms : 0.0);
    };
    std::fprintf(stderr, "\nkiln: %16s = %10.2f ms\n", "load time", load_ms);
    line("prompt eval time", prompt_ms, prompt_tokens, "tokens");
    line("eval time", gen_ms, gen_tokens, "runs  ");
    std::fprintf(stderr, "kiln: %16s = %10.2f ms / %5lld tokens\n", "total time", prompt_ms + gen_ms,
                 (long long)(prompt_tokens + gen_tokens));
  }
};

class Runner {
 public:
  Runner(model::Context& cx, model::Memory& mem, const tokenizer::Tokenizer& tok, Sampler& s)
      : cx_(cx), mem_(mem), tok_(tok), s_(s) {}

  // Brings the sequence to `toks` (reusing the common prefix when the memory allows), returns the
  // logits row of the last token.
  Status prefill(const std::vector<int32_t>& toks, Timing& tm) {
    if (toks.empty()) return err("empty prompt");
    size_t keep = 0;
    while (keep < have_.size() && keep < toks.size() - 1 && have_[keep] == toks[keep]) ++keep;
    if (keep != have_.size() && !mem_.seq_keep(0, int64_t(keep)).ok()) {
      mem_.seq_clear(0);
      keep = 0;
    }
    have_.resize(keep);
    if (int64_t(toks.size()) > mem_.n_ctx()) return err("prompt of {} tokens exceeds the context size {}", toks.size(), mem_.n_ctx());
    const auto t0 = Clock::now();
    for (size_t i = keep; i < toks.size(); i += size_t(cx_.n_batch())) {
      const size_t n = std::min(toks.size() - i, size_t(cx_.n_batch()));
      b_.clear();
      b_.add_run(std::span(toks.data() + i, n), int32_t(i), 0, false, i + n == toks.size());
      KILN_TRY(cx_.decode(b_, mem_));
    }
    tm.prompt_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    tm.prompt_tokens += int64_t(toks.size() - keep);
    have_ = toks;
    return {};
  }

  // Generates up to n tokens after a prefill, streaming text to out. Stops at end-of-generation.
  Status generate(int n, Timing& tm, std::vector<int32_t>& ids, FILE* out) {
    const int64_t V = cx_.model().config().n_vocab;
    tokenizer::StreamDecoder dec(tok_);
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      const int32_t id = s_.sample(cx_.logits(cx_.n_outputs() - 1), V);
      ids.push_back(id);
      if (tok_.is_eog(id)) break;
      std::fputs(dec.push(id).c_str(), out);
      std::fflush(out);
      if (int64_t(have_.size()) >= mem_.n_ctx()) break;
      b_.clear();
      b_.add(id, int32_t(have_.size()), 0, true);
      KILN_TRY(cx_.decode(b_, mem_));
      have_.push_back(id);
      ++tm.gen_tokens;
    }
    std::fputs(dec.flush().c_str(), out);
    std::fflush(out);
    tm.gen_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return {};
  }

 private:
  model::Context& cx_;
  model::Memory& mem_;
  const tokenizer::Tokenizer& tok_;
  Sampler& s_;
  model::Batch b_;
  std::vector<int32_t> have_;
};

int cmd_run(int argc, char** argv) {
  CLI::App app{"generate text from a prompt", "kiln run"};
  std::string model_path, prompt, ids_out;
  int n_predict = 128, threads = 0, top_k = 40;
  int64_t ctx = 4096, n_batch = 512;
  float temp = 0.8f;
  uint64_t seed = 0xC0FFEE;
  bool chat = false;
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("-p,--prompt", prompt, "prompt text");
  app.add_option("-n,--n-predict", n_predict, "tokens to generate");
  app.add_option("--temp", temp, "temperature (<= 0: greedy)");
  app.add_option("--top-k", top_k, "top-k (0: all)");
  app.add_option("-s,--seed", seed, "sampling seed");
  app.add_option("-c,--ctx-size", ctx, "context size");
  app.add_option("-b,--batch-size", n_batch, "prompt tokens per forward pass");
  app.add_option("-t,--threads", threads, "threads (default: all cores)");
  tools::ModelFlags flags;
  flags.add(app, "K cache type (-ctk): f16, q8_0, q4_0, f32", "V cache type (-ctv)",
            "mmap, mlock or none (read into memory)");
  flags.add_fit(app);
  app.add_flag("--chat", chat, "interactive chat on stdin using the model's chat template");
  app.add_option("--ids-out", ids_out, "write the generated token ids (one per line) to this file");
  tools::normalize_llama_flags(argc, argv);
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const Error& e) {
    std::fprintf(stderr, "kiln run: %s\n", e.message.c_str());
    return 1;
  };
  model::MemoryOptions mo;
  model::ContextOptions co;
  auto lm = flags.resolve(mo, co);
  if (!lm) return fail(lm.error());
  if (!chat && prompt.empty()) return fail(err("-p PROMPT is required (or --chat)"));
  // The memory plan of this run (explicit context, one sequence, last-token logits) fits -ngl auto.
  model::PlanOptions po;
  po.n_ctx = ctx;
  po.n_batch = po.n_ubatch = std::max<int64_t>(1, std::min(n_batch, ctx));
  po.n_outputs_max = 1;
  po.type_k = mo.type_k;
  po.type_v = mo.type_v;
  po.n_threads = threads;
  po.delta_chunk_min = 64;
  po.flash_attn = co.flash_attn;
  auto m = tools::load_model_cli(model_path, *lm, true, &po, &flags);
  if (!m) return fail(m.error());
  auto tk = model::load_tokenizer((*m)->file());
  if (!tk) return fail(tk.error());
  mo.n_ctx = ctx;
  auto mem = model::Memory::create(**m, mo);
  if (!mem) return fail(mem.error());
  co.n_batch = std::max<int64_t>(1, std::min(n_batch, ctx));
  co.n_threads = threads;
  co.delta_chunk_min = 64;
  co.n_outputs_max = 1;  // only the last token's logits are sampled
  model::Context cx(**m, co);
  Sampler s;
  s.temp = temp;
  s.top_k = top_k;
  s.rng.seed(seed);
  Runner r(cx, **mem, **tk, s);
  Timing tm;
  std::vector<int32_t> ids;

  if (!chat) {
    const auto toks = (*tk)->encode(prompt);
    std::fputs(prompt.c_str(), stdout);
    if (auto st = r.prefill(toks, tm); !st) return fail(st.error());
    if (auto st = r.generate(n_predict, tm, ids, stdout); !st) return fail(st.error());
    std::fputs("\n", stdout);
  } else {
    const gguf::Value* tv = (*m)->file().find("tokenizer.chat_template");
    if (!tv || tv->type != gguf::ValueType::STRING) return fail(err("{}: no tokenizer.chat_template", model_path));
    chat::TemplateConfig tc;
    tc.name = "tokenizer.chat_template";
    const auto& vocab = (*tk)->vocab();
    if (vocab.bos >= 0) tc.bos_token = (*tk)->token_to_piece(vocab.bos);
    if (vocab.eos >= 0) tc.eos_token = (*tk)->token_to_piece(vocab.eos);
    auto tmpl = chat::ChatTemplate::create(tv->str, tc);
    if (!tmpl) return fail(tmpl.error());
    chat::ChatRequest req;
    if (!prompt.empty()) req.messages.push_back({.role = "system", .content = prompt});
    std::string line;
    std::fprintf(stderr, "chat: type a message, an empty line or EOF ends\n> ");
    while (std::getline(std::cin, line) && !line.empty()) {
      req.messages.push_back({.role = "user", .content = line});
      auto p = tmpl->apply(req);
      if (!p) return fail(p.error());
      const auto toks = (*tk)->encode(p->text);
      if (auto st = r.prefill(toks, tm); !st) return fail(st.error());
      ids.clear();
      if (auto st = r.generate(n_predict, tm, ids, stdout); !st) return fail(st.error());
      req.messages.push_back({.role = "assistant", .content = (*tk)->decode(ids, true, false)});
      std::fprintf(stdout, "\n");
      std::fprintf(stderr, "> ");
    }
  }
  if (!ids_out.empty()) {
    std::ofstream f(ids_out);
    for (int32_t id : ids) f << id << "\n";
  }
  tm.print((*m)->info().load_ms);
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(run, "generate text from a prompt with a GGUF model (streams; --chat for a conversation)", cmd_run);
