// `kiln bench` — llama-bench-like throughput measurement of prompt processing (pp) and token
// generation (tg) on the CPU, with the same flags and table so the numbers line up side by side:
//   kiln bench -m FILE[,FILE] [-p 512] [-n 128] [-pg 512,128] [-d 0] [-r 5] [-t N] [-b 2048] [-ub 512]
//              [-ctk f16] [-ctv f16] [-fa on|off|auto] [--delta-chunk auto] [-o md|json|jsonl] [--no-warmup] [--batch-invariant]
// Every numeric/type flag takes a comma list (and may be repeated); all combinations are run.
// Each model is loaded once. For every test, a warm-up run (not timed) precedes -r timed
// repetitions; the sequence memory is cleared before each. Tokens are random ids (fixed seed).
//   pp N : N tokens decoded in chunks of -b, each split into decodes of at most -ub tokens; logits
//          only for the last token of every -b chunk (llama-bench's llama_batch_get_one).
//   tg N : N single-token decodes with logits, starting from an empty sequence.
//   pg P,N: pp P then tg N in one timing; t/s = (P + N) / time.
//   -d D : every test runs after D tokens already in the sequence (prefilled untimed before each
//          run, as llama-bench's -d / --n-depth; the test is named "tg128 @ d4096").
// t/s ± stddev are the mean and sample standard deviation over the repetitions of tokens/second.
// Memory: weights (bytes of the tensors the model runs), KV/recurrent state (Memory of n_ctx =
// D + P + N positions, one sequence) and scratch (heap bytes the Context allocates, measured with
// mallinfo2 around its construction and first decode). For tg, the weight bytes read per token
// (matrices streamed by one decode step) and the resulting GB/s are reported, so the fraction of
// the machine's memory bandwidth can be computed (bench/compare.sh does).
#include <CLI/CLI.hpp>
#include <malloc.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <thread>

#include "core/op_profile.h"
#include "engine/engine.h"
#include "model_cli.h"
#include "subcommand.h"

namespace {
using namespace kiln;
using Clock = std::chrono::steady_clock;

// The items of comma lists (each flag may be repeated), empty items dropped.
std::vector<std::string> split_list(const std::vector<std::string>& vals) {
  std::vector<std::string> out;
  for (const auto& v : vals) {
    std::string item;
    std::stringstream ss(v);
    while (std::getline(ss, item, ','))
      if (!item.empty()) out.push_back(item);
  }
  return out;
}

Result<std::vector<int64_t>> parse_int_list(const std::vector<std::string>& vals, const char* flag, int64_t min) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(vals)) {
    try {
      size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      if (x < min) return err("{} {}: must be >= {}", flag, item, min);
      out.push_back(x);
    } catch (const std::exception&) {
      return err("{} {}: not an integer", flag, item);
    }
  }
  return out;
}

// llama.cpp's LLAMA_FTYPE values (general.file_type) and their names, as llama-bench prints them.
std::string ftype_name(int64_t ft) {
  static const std::map<int64_t, const char*> names = {
      {0, "all F32"}, {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},     {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"},  {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {19, "IQ2_XXS"}, {20, "IQ2_XS"},
      {21, "Q2_K_S"}, {22, "IQ3_XS"}, {23, "IQ3_XXS"}, {24, "IQ1_S"}, {25, "IQ4_NL"},  {26, "IQ3_S"},
      {27, "IQ3_M"},  {28, "IQ2_S"},  {29, "IQ2_M"},  {30, "IQ4_XS"}, {31, "IQ1_M"},   {32, "BF16"},
      {36, "TQ1_0"},  {37, "TQ2_0"},  {38, "MXFP4_MOE"}};
  auto it = names.find(ft);
  return it == names.end() ? std::string() : it->second;
}

std::string params_label(uint64_t n) {
  if (n >= 1000000000ull) {
    std::string s = fmt::format("{:.1f}", double(n) / 1e9);
    if (s.size() > 2 && s.substr(s.size() - 2) == ".0") s.resize(s.size() - 2);
    return s + "B";
  }
  if (n >= 1000000ull) return fmt::format("{}M", uint64_t(std::llround(double(n) / 1e6)));
  return fmt::format("{}K", uint64_t(std::llround(double(n) / 1e3)));
}

std::string size_str(uint64_t bytes) {
  const double mib = double(bytes) / (1024.0 * 1024.0);
  if (mib >= 1024.0) return fmt::format("{:.2f} GiB", mib / 1024.0);
  return fmt::format("{:.2f} MiB", mib);
}

std::string params_str(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.2f} B", double(n) / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.2f} M", double(n) / 1e6);
  return fmt::format("{:.2f} K", double(n) / 1e3);
}

// Bytes in use on the heap (main arena + mmapped chunks).
size_t heap_in_use() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

struct ModelFacts {
  std::string path, desc;
  uint64_t size = 0;              // bytes of all tensors in the file (llama_model_size)
  uint64_t n_params = 0;          // elements of all tensors (llama_model_n_params)
  uint64_t weight_bytes = 0;      // tensors kiln runs
  uint64_t decode_read_bytes = 0; // weight bytes one single-token decode streams
  std::string backend = "CPU";    // CPU, CUDA (every layer and the output) or CUDA+CPU (partial -ngl, experts on the host)
  int64_t n_gpu_layers = 0;       // trunk layers on the GPU (llama-bench's n_gpu_layers)
};

ModelFacts model_facts(const model::Model& m, const std::string& path) {
  ModelFacts f;
  f.path = path;
  f.n_gpu_layers = m.info().n_gpu_layers + (m.info().output_on_gpu ? 1 : 0);
  if (m.info().output_on_gpu && m.info().n_gpu_layers == m.config().n_layer && m.info().n_expert_host == 0) f.backend = "CUDA";
  else if (m.info().n_gpu_layers > 0 || m.info().output_on_gpu) f.backend = "CUDA+CPU";
  const auto& file = m.file();
  const auto& c = m.config();
  std::map<std::string, bool> unused;
  for (const auto& u : m.info().unused) unused[u] = true;
  std::map<gguf::GgmlType, uint64_t> by_type;
  for (const auto& t : file.tensors()) {
    f.size += t.n_bytes;
    f.n_params += uint64_t(t.n_elements());
    if (t.n_dims >= 2) by_type[t.type] += t.n_bytes;
    if (unused.count(t.name)) continue;
    // One decode step reads every matrix once, except: the embedding table (one row) unless it is
    // also the output matrix; routed experts (only n_expert_used of n_expert).
    if (t.name == "token_embd.weight" && !c.tied_embeddings) {
      f.decode_read_bytes += t.n_bytes / uint64_t(std::max<int64_t>(1, t.ne[1]));
    } else if (t.name.find("_exps.") != std::string::npos && c.n_expert > 0) {
      f.decode_read_bytes += t.n_bytes / uint64_t(c.n_expert) * uint64_t(c.n_expert_used);
    } else {
      f.decode_read_bytes += t.n_bytes;
    }
  }
  f.weight_bytes = m.info().weight_bytes;
  std::string ft;
  if (auto v = file.get_int_or("general.file_type", -1); v && *v >= 0) ft = ftype_name(*v);
  if (ft.empty() && !by_type.empty()) {
    auto best = std::max_element(by_type.begin(), by_type.end(), [](auto& a, auto& b) { return a.second < b.second; });
    ft = std::string(gguf::type_name(best->first));
  }
  f.desc = fmt::format("{} {} {}", c.arch_str, params_label(f.n_params), ft);
  return f;
}

struct TestResult {
  const ModelFacts* model = nullptr;
  int64_t n_prompt = 0, n_gen = 0, n_batch = 0, n_ubatch = 0, delta_chunk = 0, n_depth = 0;
  int n_threads = 0;
  std::string type_k, type_v;
  std::vector<double> samples_ns;
  uint64_t state_bytes = 0, scratch_bytes = 0;
  std::string test_time;

  std::string name() const {
    const std::string d = n_depth > 0 ? fmt::format(" @ d{}", n_depth) : "";
    if (n_prompt > 0 && n_gen == 0) return fmt::format("pp{}{}", n_prompt, d);
    if (n_gen > 0 && n_prompt == 0) return fmt::format("tg{}{}", n_gen, d);
    return fmt::format("pp{}+tg{}{}", n_prompt, n_gen, d);
  }
  std::vector<double> ts() const {
    std::vector<double> out;
    for (double ns : samples_ns) out.push_back(double(n_prompt + n_gen) * 1e9 / ns);
    return out;
  }
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
  }
  static double stdev(const std::vector<double>& v) {
    if (v.size() < 2) return 0;
    const double m = mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / double(v.size() - 1));
  }
  // Weight-streaming rate of a pure decode test.
  double tg_gbps() const { return n_prompt == 0 && n_gen > 0 ? double(model->decode_read_bytes) * mean(ts()) / 1e9 : 0; }

  nlohmann::json to_json() const {
    nlohmann::json j;
    j["model_filename"] = model->path;
    j["model_type"] = model->desc;
    j["model_size"] = model->size;
    j["model_n_params"] = model->n_params;
    j["backend"] = model->backend;
    j["n_gpu_layers"] = model->n_gpu_layers;
    j["n_threads"] = n_threads;
    j["n_batch"] = n_batch;
    j["n_ubatch"] = n_ubatch;
    j["type_k"] = type_k;
    j["type_v"] = type_v;
    j["delta_chunk"] = delta_chunk;
    j["n_prompt"] = n_prompt;
    j["n_gen"] = n_gen;
    j["n_depth"] = n_depth;
    j["test"] = name();
    j["test_time"] = test_time;
    const auto t = ts();
    j["avg_ns"] = uint64_t(mean(samples_ns));
    j["stddev_ns"] = uint64_t(stdev(samples_ns));
    j["avg_ts"] = mean(t);
    j["stddev_ts"] = stdev(t);
    j["samples_ns"] = samples_ns;
    j["samples_ts"] = t;
    j["weights_bytes"] = model->weight_bytes;
    j["state_bytes"] = state_bytes;
    j["scratch_bytes"] = scratch_bytes;
    j["decode_weight_read_bytes"] = model->decode_read_bytes;
    if (n_prompt == 0 && n_gen > 0) j["tg_weight_gbps"] = tg_gbps();
    return j;
  }
};

struct Runner {
  model::Context* cx = nullptr;
  model::Memory* mem = nullptr;
  int64_t n_vocab = 0;
  std::mt19937 rng{1234};

  int32_t tok() { return int32_t(rng() % uint64_t(n_vocab)); }

  Status prompt(int64_t n, int64_t n_batch, int64_t n_ubatch) {
    model::Batch b;
    int64_t pos = mem->seq_pos(0);
    for (int64_t i = 0; i < n; i += n_batch) {
      const int64_t nb = std::min(n_batch, n - i);
      for (int64_t j = 0; j < nb; j += n_ubatch) {
        const int64_t nu = std::min(n_ubatch, nb - j);
        b.clear();
        for (int64_t k = 0; k < nu; ++k) b.add(tok(), int32_t(pos + k), 0, j + k == nb - 1);
        KILN_TRY(cx->decode(b, *mem));
        pos += nu;
      }
    }
    return {};
  }
  Status gen(int64_t n) {
    model::Batch b;
    int32_t t = tok();
    for (int64_t i = 0; i < n; ++i) {
      b.clear();
      b.add(t, int32_t(mem->seq_pos(0)), 0, true);
      KILN_TRY(cx->decode(b, *mem));
      t = tok();
    }
    return {};
  }
};

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void print_md_header() {
  std::printf("| %-28s | %10s | %10s | %-7s | %7s | %13s | %20s |\n", "model", "size", "params", "backend", "threads",
              "test", "t/s");
  std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(28, '-').c_str(), std::string(9, '-').c_str(),
              std::string(9, '-').c_str(), std::string(7, '-').c_str(), std::string(6, '-').c_str(),
              std::string(12, '-').c_str(), std::string(19, '-').c_str());
}

void print_md_row(const TestResult& r) {
  const auto t = r.ts();
  const std::string ts = fmt::format("{:.2f} ± {:.2f}", TestResult::mean(t), TestResult::stdev(t));
  // "±" is two bytes in UTF-8; pad by display width.
  std::printf("| %-28s | %10s | %10s | %-7s | %7d | %13s | %21s |\n", r.model->desc.c_str(), size_str(r.model->size).c_str(),
              params_str(r.model->n_params).c_str(), r.model->backend.c_str(), r.n_threads, r.name().c_str(), ts.c_str());
  std::fflush(stdout);
}

void print_md_memory(const std::vector<TestResult>& rs) {
  std::printf("\n| %-28s | %13s | %5s | %7s | %5s | %12s | %14s | %12s | %16s |\n", "model", "test", "ctk", "ctv", "ub",
              "weights MiB", "KV+state MiB", "scratch MiB", "tg weight GB/s");
  std::printf("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& r : rs) {
    const double mib = 1024.0 * 1024.0;
    const std::string gbps = r.tg_gbps() > 0 ? fmt::format("{:.2f}", r.tg_gbps()) : "";
    std::printf("| %-28s | %13s | %5s | %7s | %5lld | %12.2f | %14.2f | %12.2f | %16s |\n", r.model->desc.c_str(),
                r.name().c_str(), r.type_k.c_str(), r.type_v.c_str(), (long long)r.n_ubatch,
                double(r.model->weight_bytes) / mib, double(r.state_bytes) / mib, double(r.scratch_bytes) / mib,
                gbps.c_str());
  }
  for (const auto& r : rs)
    if (r.tg_gbps() > 0) {
      std::printf("\ntg weight GB/s = weight bytes streamed per decoded token (%s: %.2f MiB) x t/s.\n",
                  r.model->desc.c_str(), double(r.model->decode_read_bytes) / (1024.0 * 1024.0));
      break;
    }
}

// CLI11 has no multi-letter single-dash options: llama-bench's -ub/-pg/-ctk/-ctv/-fa to long forms.
void normalize_bench_flags(int argc, char** argv) {
  tools::rename_flags(argc, argv, {{"-ub", "--ubatch-size"}, {"-pg", "--n-prompt-gen"}, {"-mg", "--main-gpu"}});
  tools::normalize_llama_flags(argc, argv);
}

int cmd_bench(int argc, char** argv) {
  CLI::App app{"llama-bench-like prompt processing / generation throughput", "kiln bench"};
  std::vector<std::string> models, n_prompt = {"512"}, n_gen = {"128"}, pg, n_depth = {"0"}, n_batch = {"2048"},
                                   n_ubatch = {"512"}, threads, ctk = {"f16"}, ctv = {"f16"}, delta_chunk = {"auto"};
  int reps = 5;
  std::string output = "md", flash_attn = "auto", ngl = "auto";
  int main_gpu = 0;
  bool no_warmup = false, progress = false, batch_invariant = false;
  app.add_option("-m,--model", models, "GGUF model file(s); comma list or repeated")->required();
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens (pp tests; 0 = none)");
  app.add_option("-n,--n-gen", n_gen, "generated tokens (tg tests; 0 = none)");
  app.add_option("--n-prompt-gen", pg, "-pg P,N: prompt then generation in one test (repeatable)");
  app.add_option("-d,--n-depth", n_depth, "tokens already in the context before each test (prefilled untimed)");
  app.add_option("-b,--batch-size", n_batch, "logical batch size (logits for the last token of each)");
  app.add_option("--ubatch-size", n_ubatch, "-ub: physical batch size (tokens per decode)");
  app.add_option("-t,--threads", threads, "threads (default: all cores)");
  app.add_option("--cache-type-k", ctk, "-ctk: K cache type (f32, f16, q8_0, q4_0)");
  app.add_option("--cache-type-v", ctv, "-ctv: V cache type");
  app.add_option("--flash-attn", flash_attn, tools::kFlashAttnHelp);
  app.add_option("--n-gpu-layers", ngl, "-ngl N|auto|all: layers on the GPU (0: CPU)");
  app.add_option("--main-gpu", main_gpu, "-mg: CUDA device ordinal");
  bool cpu_moe = false;
  int n_cpu_moe = 0;
  std::vector<std::string> override_tensor;
  tools::ModelFlags::add_moe(app, cpu_moe, n_cpu_moe, override_tensor);
  app.add_option("--delta-chunk", delta_chunk,
                 "qwen35: runs of >= N tokens use the chunked gated delta rule (0: never; auto, the default: as kiln "
                 "serve, 64 with layers on a GPU without --batch-invariant, else 0)");
  app.add_option("-r,--repetitions", reps, "timed repetitions per test")->check(CLI::PositiveNumber);
  app.add_option("-o,--output", output, "md, json or jsonl")->check(CLI::IsMember({"md", "json", "jsonl"}));
  app.add_flag("--no-warmup", no_warmup, "skip the untimed warm-up run");
  app.add_flag("--batch-invariant", batch_invariant, "per-token kernels on the GPU (kiln serve --batch-invariant)");
  app.add_flag("--progress", progress, "print progress to stderr");
  normalize_bench_flags(argc, argv);
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const Error& e) {
    std::fprintf(stderr, "kiln bench: %s\n", e.message.c_str());
    return 1;
  };
  auto fa = tools::parse_flash_attn(flash_attn);
  if (!fa) return fail(fa.error());
  const bool fa_on = *fa;
  auto NGL = tools::parse_gpu_layers(ngl);
  if (!NGL) return fail(NGL.error());
  model::LoadOptions lo;
  lo.n_gpu_layers = *NGL;
  lo.main_gpu = main_gpu;
  auto PL = model::placement_options(cpu_moe, n_cpu_moe, override_tensor);
  if (!PL) return fail(PL.error());
  lo.placement = std::move(*PL);
  auto P = parse_int_list(n_prompt, "-p", 0);
  if (!P) return fail(P.error());
  auto N = parse_int_list(n_gen, "-n", 0);
  if (!N) return fail(N.error());
  auto Dp = parse_int_list(n_depth, "-d", 0);
  if (!Dp) return fail(Dp.error());
  auto B = parse_int_list(n_batch, "-b", 1);
  if (!B) return fail(B.error());
  auto UB = parse_int_list(n_ubatch, "-ub", 1);
  if (!UB) return fail(UB.error());
  if (threads.empty()) threads = {std::to_string(std::max(1u, std::thread::hardware_concurrency()))};
  auto T = parse_int_list(threads, "-t", 1);
  if (!T) return fail(T.error());
  std::vector<std::string> dcs;  // auto (-1): kiln serve's default, resolved per model (engine::resolve_delta_chunk)
  for (const auto& v : split_list(delta_chunk)) dcs.push_back(v == "auto" ? "-1" : v);
  auto DC = parse_int_list(dcs, "--delta-chunk", -1);
  if (!DC) return fail(DC.error());
  std::vector<std::pair<int64_t, int64_t>> pgs;
  for (const auto& s : pg) {
    auto v = parse_int_list({s}, "-pg", 0);
    if (!v) return fail(v.error());
    if (v->size() != 2) return fail(err("-pg {}: expected PROMPT,GEN", s));
    pgs.emplace_back((*v)[0], (*v)[1]);
  }
  std::vector<std::pair<std::string, gguf::GgmlType>> KT, VT;
  for (const auto& s : split_list(ctk)) {
    auto t = tools::parse_cache_type(s, "-ctk");
    if (!t) return fail(t.error());
    KT.emplace_back(s, *t);
  }
  for (const auto& s : split_list(ctv)) {
    auto t = tools::parse_cache_type(s, "-ctv");
    if (!t) return fail(t.error());
    VT.emplace_back(s, *t);
  }
  // (n_prompt, n_gen) of every test, in llama-bench order: pp, tg, pg.
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t p : *P)
    if (p > 0) shapes.emplace_back(p, 0);
  for (int64_t n : *N)
    if (n > 0) shapes.emplace_back(0, n);
  for (auto [p, n] : pgs)
    if (p + n > 0) shapes.emplace_back(p, n);
  if (shapes.empty()) return fail(err("no tests: every -p, -n and -pg value is 0"));

  const bool md = output == "md";
  if (md) print_md_header();
  nlohmann::json json_rows = nlohmann::json::array();
  std::vector<std::unique_ptr<ModelFacts>> facts;
  std::vector<TestResult> all;

  for (const auto& path : split_list(models)) {
    auto m = tools::load_model_cli(path, lo, progress);
    if (!m) return fail(m.error());
    facts.push_back(std::make_unique<ModelFacts>(model_facts(**m, path)));
    const ModelFacts& mf = *facts.back();
    for (int64_t nt : *T)
      for (int64_t ub : *UB)
        for (int64_t dc : *DC) {
          // One Context per (threads, ubatch, delta-chunk); its scratch is measured on the heap.
          model::ContextOptions co;
          co.n_batch = ub;
          co.n_threads = int(nt);
          engine::EngineOptions eo;
          eo.delta_chunk_min = int(dc), eo.batch_invariant = batch_invariant;
          co.delta_chunk_min = engine::resolve_delta_chunk(eo, mf.n_gpu_layers > 0);
          co.batch_invariant = batch_invariant;
          co.flash_attn = fa_on;
          const size_t heap0 = heap_in_use();
          model::Context cx(**m, co);
          size_t scratch = heap_in_use() - std::min(heap0, heap_in_use());
          bool first_decode = true;
          for (int64_t nb : *B)
            for (const auto& [kname, ktype] : KT)
              for (const auto& [vname, vtype] : VT)
                for (int64_t nd : *Dp)
                for (auto [np, ng] : shapes) {
                  model::MemoryOptions mo;
                  mo.n_ctx = nd + np + ng;
                  mo.n_seq = 1;
                  mo.type_k = ktype;
                  mo.type_v = vtype;
                  auto mem = model::Memory::create(**m, mo);
                  if (!mem) return fail(mem.error());
                  Runner run;
                  run.cx = &cx;
                  run.mem = mem->get();
                  run.n_vocab = (*m)->config().n_vocab;
                  auto depth = [&]() -> Status {  // the context the test starts from (untimed)
                    (*mem)->seq_clear(0);
                    if (nd > 0) KILN_TRY(run.prompt(nd, nb, ub));
                    return {};
                  };
                  auto once = [&]() -> Status {
                    if (np > 0) KILN_TRY(run.prompt(np, nb, ub));
                    if (ng > 0) KILN_TRY(run.gen(ng));
                    return {};
                  };
                  TestResult r;
                  r.model = &mf;
                  r.n_prompt = np;
                  r.n_gen = ng;
                  r.n_batch = nb;
                  r.n_ubatch = ub;
                  r.delta_chunk = co.delta_chunk_min;
                  r.n_depth = nd;
                  r.n_threads = cx.pool().size();
                  r.type_k = kname;
                  r.type_v = vname;
                  r.state_bytes = (*mem)->total_bytes();
                  r.test_time = now_iso();
                  if (first_decode) {
                    // Scratch also counts anything the first decode allocates (it should be nothing).
                    const size_t h0 = heap_in_use();
                    Runner w = run;
                    (*mem)->seq_clear(0);
                    if (auto st = np > 0 ? w.prompt(std::min<int64_t>(np, ub), nb, ub) : w.gen(1); !st) return fail(st.error());
                    const size_t h1 = heap_in_use();
                    if (h1 > h0) scratch += h1 - h0;
                    first_decode = false;
                  }
                  r.scratch_bytes = scratch;
                  if (!no_warmup) {
                    // llama-bench's warm-up: the prompt once, then one generated token.
                    if (auto st = depth(); !st) return fail(st.error());
                    if (np > 0)
                      if (auto st = run.prompt(np, nb, ub); !st) return fail(st.error());
                    if (ng > 0)
                      if (auto st = run.gen(1); !st) return fail(st.error());
                  }
                  backend::cuda_profile_report();  // KILN_CUDA_PROFILE: forget the warm-up's op times
                  op_profile::report("");           // KILN_CPU_PROFILE: likewise
                  for (int i = 0; i < reps; ++i) {
                    if (auto st = depth(); !st) return fail(st.error());  // ends with logits read: the device is idle
                    const auto t0 = Clock::now();
                    if (auto st = once(); !st) return fail(st.error());
                    const auto t1 = Clock::now();
                    r.samples_ns.push_back(double(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
                    if (progress) std::fprintf(stderr, "%s %s rep %d/%d\n", mf.desc.c_str(), r.name().c_str(), i + 1, reps);
                  }
                  if (const std::string prof = backend::cuda_profile_report(); !prof.empty())
                    std::fprintf(stderr, "%s %s, %d reps: %s\n", mf.desc.c_str(), r.name().c_str(), reps, prof.c_str());
                  if (const std::string prof = op_profile::report("CPU op times (KILN_CPU_PROFILE)"); !prof.empty())
                    std::fprintf(stderr, "%s %s, %d reps, %d threads: %s\n", mf.desc.c_str(), r.name().c_str(), reps,
                                 r.n_threads, prof.c_str());
                  if (md) print_md_row(r);
                  else if (output == "jsonl") std::printf("%s\n", r.to_json().dump().c_str());
                  else json_rows.push_back(r.to_json());
                  std::fflush(stdout);
                  all.push_back(std::move(r));
                }
        }
  }
  if (md) print_md_memory(all);
  if (output == "json") std::printf("%s\n", json_rows.dump(2).c_str());
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(bench, "llama-bench-like throughput: pp/tg tokens per second, memory", cmd_bench);
