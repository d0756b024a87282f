// `kiln grammar` — check a GBNF grammar or a JSON schema (print the GBNF it becomes, or the error
// naming the line / keyword), and benchmark constrained decoding's per-token cost over a GGUF
// file's vocabulary (the token mask and its application to a logits row, cold and warm).
// Owns: the command line only; the work is engine/grammar*.h and chat/json_schema.h.
// Threading: main thread only.
#include <algorithm>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <random>

#include "chat/json_schema.h"
#include "core/read_file.h"
#include "engine/grammar.h"
#include "engine/grammar_matcher.h"
#include "engine/sampling.h"
#include "gguf/reader.h"
#include "model/vocab_loader.h"
#include "subcommand.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

int cmd_grammar(int argc, char** argv) {
  CLI::App app{"Check a GBNF grammar or a JSON schema (prints the GBNF), or benchmark token masks over a vocabulary.",
               "kiln grammar"};
  std::string gfile, jfile, model;
  int bench = 0, steps = 200, window_depth = kiln::engine::GrammarAutomaton::Options{}.window_depth;
  uint32_t seed = 1;
  app.add_option("-g,--grammar", gfile, "GBNF file");
  app.add_option("-j,--json-schema", jfile, "JSON schema file (converted to GBNF)");
  app.add_option("-m,--model", model, "GGUF file whose vocabulary the benchmark uses (vocab-only files work)");
  app.add_option("--bench", bench, "benchmark: this many generations of random allowed tokens")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "tokens per generation at most (default 200)")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "random seed (default 1)");
  app.add_option("--window-depth", window_depth, "positions per precomputed token window (0: every new state walks the whole trie)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (gfile.empty() == jfile.empty()) {
    std::fprintf(stderr, "kiln grammar: give exactly one of -g FILE or -j FILE\n");
    return 2;
  }
  std::string text;
  if (!kiln::read_file(gfile.empty() ? jfile : gfile, text)) {
    std::fprintf(stderr, "kiln grammar: cannot read %s\n", (gfile.empty() ? jfile : gfile).c_str());
    return 1;
  }
  if (!jfile.empty()) {
    auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) {
      std::fprintf(stderr, "kiln grammar: %s is not valid JSON\n", jfile.c_str());
      return 1;
    }
    auto g = kiln::chat::json_schema_to_gbnf(schema, "schema");
    if (!g.ok()) {
      std::fprintf(stderr, "kiln grammar: %s\n", g.error().to_string().c_str());
      return 1;
    }
    text = *g;
  }
  auto t0 = Clock::now();
  auto g = kiln::engine::Grammar::parse(text);
  const double compile_ms = ms_since(t0);
  if (!g.ok()) {
    std::fprintf(stderr, "kiln grammar: %s\n", g.error().message.c_str());
    return 1;
  }
  if (bench == 0) {
    std::printf("%s", text.c_str());
    std::fprintf(stderr, "ok: %zu rules, compiled in %.2f ms\n", (*g)->n_rules(), compile_ms);
    return 0;
  }
  if (model.empty()) {
    std::fprintf(stderr, "kiln grammar: --bench needs -m MODEL (its vocabulary)\n");
    return 2;
  }
  auto f = kiln::gguf::File::open(model);
  if (!f) {
    std::fprintf(stderr, "kiln grammar: %s\n", f.error().message.c_str());
    return 1;
  }
  auto tr = kiln::model::load_tokenizer(**f);
  if (!tr) {
    std::fprintf(stderr, "kiln grammar: %s\n", tr.error().message.c_str());
    return 1;
  }
  const auto& tok = **tr;
  const int64_t n_vocab = tok.n_tokens();
  t0 = Clock::now();
  auto trie = kiln::engine::TokenTrie::build(tok, tok.eog_ids(), n_vocab);
  const double trie_ms = ms_since(t0);
  std::printf("vocabulary %lld tokens, trie %zu nodes built in %.1f ms; grammar %zu rules compiled in %.2f ms\n",
              (long long)n_vocab, trie->n_nodes(), trie_ms, (*g)->n_rules(), compile_ms);

  kiln::engine::GrammarAutomaton::Options opt;
  opt.window_depth = window_depth;
  kiln::engine::GrammarAutomaton::Options ref_opt;  // the former scheme: every new state one trie walk
  ref_opt.window_depth = 0;

  // A request's first constrained step on the engine thread: unprepared, the automaton is built and
  // its start state's mask computed there; prepared (what Engine::submit does on the submitting
  // thread: GrammarCache::prepare = precompute() + the start mask), the engine finds the start mask
  // cached. Best of 5.
  {
    double cold_ms = 1e9, ref_ms = 1e9, prep_ms = 1e9;
    size_t windows = 0, mib = 0;
    for (int r = 0; r < 5; ++r) {
      t0 = Clock::now();
      kiln::engine::GrammarAutomaton a0(*g, trie, opt);
      (void)a0.mask(a0.start());
      cold_ms = std::min(cold_ms, ms_since(t0));
      t0 = Clock::now();
      kiln::engine::GrammarAutomaton a1(*g, trie, ref_opt);
      (void)a1.mask(a1.start());
      ref_ms = std::min(ref_ms, ms_since(t0));
      t0 = Clock::now();
      kiln::engine::GrammarAutomaton a2(*g, trie, opt);
      a2.precompute();
      (void)a2.mask(a2.start());
      prep_ms = std::min(prep_ms, ms_since(t0));
      windows = a2.n_windows();
      mib = a2.memory_bytes();
    }
    std::printf("first constrained step unprepared: %.3f ms (window depth %d), %.3f ms (whole-trie walk); "
                "prepared: a lookup, after %.1f ms on the submitting thread (precompute: %zu windows, automaton %.1f MiB)\n",
                cold_ms, window_depth, ref_ms, prep_ms, windows, double(mib) / (1 << 20));
  }

  // Random logits and a sampler (temperature 1, llama.cpp defaults) to time the mask's application.
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  for (auto& x : logits) x = nd(rng);
  kiln::engine::SamplingParams sp;
  sp.seed = seed;
  sp.temperature = 1.0f;
  kiln::engine::Sampler sampler(sp, n_vocab);

  std::vector<double> mask_times;  // each mask of the last run, ms
  auto pct = [&](double q) {
    std::sort(mask_times.begin(), mask_times.end());
    return mask_times.empty() ? 0.0 : mask_times[std::min(mask_times.size() - 1, size_t(q * double(mask_times.size())))];
  };
  auto run = [&](kiln::engine::GrammarAutomaton& a, int gens, double& mask_ms, double& sample_ms, int64_t& n_steps,
                 int64_t& n_done) {
    mask_ms = sample_ms = 0;
    mask_times.clear();
    n_steps = n_done = 0;
    std::mt19937 pick(seed);
    std::vector<int32_t> allowed;
    for (int gi = 0; gi < gens; ++gi) {
      uint32_t s = a.start();
      for (int k = 0; k < steps; ++k) {
        auto tm = Clock::now();
        const uint64_t* m = a.mask(s);
        const double dt = ms_since(tm);
        mask_ms += dt;
        mask_times.push_back(dt);
        tm = Clock::now();
        (void)sampler.sample(logits.data(), m);
        sample_ms += ms_since(tm);
        ++n_steps;
        // The token: uniform among the allowed ones (a stress test: it visits far more states than a
        // model would), the end when the grammar is complete and nothing else is allowed.
        allowed.clear();
        for (int64_t w = 0; w < int64_t(trie->words()); ++w)
          for (uint64_t b = m[w]; b; b &= b - 1) {
            const int32_t t = int32_t(w * 64 + __builtin_ctzll(b));
            if (!trie->is_eog(t)) allowed.push_back(t);
          }
        if (allowed.empty()) {
          ++n_done;
          break;
        }
        s = a.next_token(s, allowed[pick() % allowed.size()]);
        if (a.only_end(s)) {
          ++n_done;
          break;
        }
      }
    }
  };
  // Cold: a fresh automaton (windows precomputed, as prepare() leaves it), every state's first mask
  // computed on the way; then the same generations again, warm (every mask cached).
  double mask_ms, sample_ms;
  int64_t n_steps, n_done;
  for (const auto* o : {&ref_opt, &opt}) {
    kiln::engine::GrammarAutomaton a(*g, trie, *o);
    a.precompute();
    t0 = Clock::now();
    run(a, bench, mask_ms, sample_ms, n_steps, n_done);
    std::printf("cold (%s): %d generations, %lld steps (%lld complete) in %.1f ms: mask %.1f us/step (%zu states, %zu masks "
                "built, %zu windows)\n",
                o->window_depth ? "windows" : "whole-trie walks", bench, (long long)n_steps, (long long)n_done, ms_since(t0),
                1e3 * mask_ms / double(n_steps), a.n_states(), a.masks_computed(), a.n_windows());
    if (o != &opt) continue;
    const size_t built = a.masks_computed();
    run(a, bench, mask_ms, sample_ms, n_steps, n_done);
    std::printf("warm: mask %.2f us/step (%zu new masks), sampler with mask %.1f us/step; automaton memory %.1f MiB\n",
                1e3 * mask_ms / double(n_steps), a.masks_computed() - built, 1e3 * sample_ms / double(n_steps),
                double(a.memory_bytes()) / (1 << 20));
  }
  // Uncached: every mask computed anew (transitions and windows memoised, precomputed as prepare()
  // does): the cost of a state seen for the first time.
  for (const auto* o : {&ref_opt, &opt}) {
    kiln::engine::GrammarAutomaton::Options uo = *o;
    uo.mask_cache_bytes = 0;
    kiln::engine::GrammarAutomaton u(*g, trie, uo);
    u.precompute();
    run(u, bench, mask_ms, sample_ms, n_steps, n_done);  // builds the transitions
    const size_t checks = u.context_checks();
    run(u, bench, mask_ms, sample_ms, n_steps, n_done);
    if (o->window_depth)
      std::printf("a new state's mask (mask cache off, windows precomputed): %.1f us/step (p99 %.0f us, slowest %.0f us), "
                  "%.0f context-dependent tokens run per mask\n", 1e3 * mask_ms / double(n_steps), 1e3 * pct(0.99), 1e3 * pct(1),
                  double(u.context_checks() - checks) / double(n_steps));
    else
      std::printf("a new state's mask (mask cache off, whole-trie walk): %.1f us/step (p99 %.0f us, slowest %.0f us)\n",
                  1e3 * mask_ms / double(n_steps), 1e3 * pct(0.99), 1e3 * pct(1));
  }
  t0 = Clock::now();
  const int reps = 200;
  for (int i = 0; i < reps; ++i) (void)sampler.sample(logits.data());
  std::printf("sampler without mask: %.1f us/step\n", 1e3 * ms_since(t0) / reps);
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(grammar, "check a GBNF grammar / JSON schema, benchmark token masks", cmd_grammar);
