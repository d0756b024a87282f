// `kiln gguf gen` — write a random-weight model that llama.cpp (and kiln) can load.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "gguf_cmds.h"
#include "model/gen/gen.h"

namespace kiln::tools {
namespace {

namespace gen = kiln::model::gen;

const char* kHelpFooter = R"(
Examples:
  kiln gguf gen --preset tiny-qwen35 -o tiny.gguf
  kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp -o q9b.gguf
  kiln gguf gen --arch llama --n-layer 4 --n-embd 512 --type Q8_0 -o l.gguf
  kiln gguf gen --mmproj --preset qwen35-9b -o mmproj.gguf   # a vision projector (see --mmproj --help)

Types: --type applies one type to every quantizable matrix (like llama-quantize --pure); rows whose
length is not a multiple of the block size fall back (IQ4_XS->IQ4_NL, Q4_K->Q5_0, Q5_K->Q5_1,
Q6_K->Q8_0, Q2_K/Q3_K->Q4_0, then F16). --mix iq4_xs / q4_k_m approximate llama-quantize's
per-tensor choices (output Q6_K, attn_v/attn_qkv and ffn_down with more bits in some layers).
Norms, biases, ssm_a, ssm_conv1d and the MoE router are always F32.
The output depends only on the options and --seed (byte-identical across runs and thread counts).
)";

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void print_presets() {
  for (const auto& p : gen::presets())
    std::printf("  %-20.*s %-10s %.*s\n", int(p.name.size()), p.name.data(), p.spec.arch.c_str(),
                int(p.description.size()), p.description.data());
}

}  // namespace

int gguf_gen_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)  // a vision projector: its own options (gguf_gen_mmproj.cpp)
    if (std::string_view(argv[i]) == "--mmproj") return gguf_gen_mmproj_main(argc, argv);
  CLI::App app{"kiln gguf gen — write a random-weight GGUF model (llama, qwen3, qwen35, qwen35moe)",
               "kiln gguf gen"};
  app.footer(kHelpFooter);
  std::string arch, preset, type_name = "F16", mix_name, out;
  uint64_t seed = 42;
  int threads = 0;
  bool list = false, mtp = false, dry_run = false, quiet = false, tied = false, untied = false, meta_only = false,
       fast = false;
  int64_t n_layer = -1, n_embd = -1, n_head = -1, n_head_kv = -1, head_dim = -1, n_ff = -1, n_vocab = -1,
          n_ctx = -1, n_rot = -1, fai = -1, ssm_conv = -1, ssm_state = -1, ssm_groups = -1, ssm_v_heads = -1,
          n_expert = -1, n_expert_used = -1, n_ff_exp = -1, n_ff_shexp = -1, n_mtp = -1;
  double rope_theta = -1, rms_eps = -1;

  app.add_option("--arch", arch, "architecture: llama, qwen3, qwen35, qwen35moe (starts from its tiny shape)");
  app.add_option("--preset", preset, "named shape (see --list-presets)");
  app.add_flag("--list-presets", list, "list the presets and exit");
  app.add_option("--type", type_name, "tensor type for every quantizable matrix: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 "
                                      "Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS (default F16)");
  app.add_option("--mix", mix_name, "per-tensor mix like llama-quantize: iq4_xs or q4_k_m (overrides --type)");
  app.add_option("--seed", seed, "random seed (default 42)");
  std::string vocab;
  app.add_option("--vocab", vocab,
                 "take the tokenizer (tokenizer.* metadata) from this GGUF, e.g. llama.cpp's ggml-vocab-qwen35.gguf, "
                 "padded with unused tokens to n_vocab (raised to its token count if below)");
  app.add_flag("--mtp", mtp, "append one MTP (nextn) block (qwen35, qwen35moe)");
  app.add_option("--n-mtp", n_mtp, "number of MTP blocks");
  app.add_option("-o,--output", out, "output file");
  app.add_option("-t,--threads", threads, "threads for weight synthesis/quantization (default: all cores)");
  app.add_flag("--dry-run", dry_run, "print the tensor plan and size, write nothing");
  app.add_flag("--meta-only", meta_only,
               "write the header only (metadata and tensor table, no tensor data): a small file `kiln fit` plans with");
  app.add_flag("--fast", fast,
               "fast weights: each tensor's first 64 rows synthesised, the rest assembled from their quantization blocks "
               "(a full-size file at disk speed, for memory, load and speed runs; rows are not independent)");
  app.add_flag("-q,--quiet", quiet, "no progress output");
  auto* ov = "shape overrides";
  app.add_option("--n-layer", n_layer, "trunk layers (block_count without MTP)")->group(ov);
  app.add_option("--n-embd", n_embd, "hidden size")->group(ov);
  app.add_option("--n-head", n_head, "attention heads")->group(ov);
  app.add_option("--n-head-kv", n_head_kv, "attention KV heads")->group(ov);
  app.add_option("--head-dim", head_dim, "attention head size (key_length = value_length)")->group(ov);
  app.add_option("--n-ff", n_ff, "dense FFN width")->group(ov);
  app.add_option("--n-vocab", n_vocab, "vocabulary size (token_embd rows)")->group(ov);
  app.add_option("--n-ctx", n_ctx, "context_length")->group(ov);
  app.add_option("--n-rot", n_rot, "rope.dimension_count (default head_dim; qwen35: head_dim/4)")->group(ov);
  app.add_option("--rope-theta", rope_theta, "rope.freq_base")->group(ov);
  app.add_option("--rms-eps", rms_eps, "attention.layer_norm_rms_epsilon")->group(ov);
  app.add_flag("--tied", tied, "tied embeddings (no output.weight)")->group(ov);
  app.add_flag("--untied", untied, "separate output.weight")->group(ov);
  app.add_option("--full-attn-interval", fai, "qwen35: every N-th layer is full attention")->group(ov);
  app.add_option("--ssm-conv", ssm_conv, "qwen35: conv kernel size")->group(ov);
  app.add_option("--ssm-state", ssm_state, "qwen35: head size S of the delta-net heads")->group(ov);
  app.add_option("--ssm-groups", ssm_groups, "qwen35: delta-net K heads (Hk)")->group(ov);
  app.add_option("--ssm-v-heads", ssm_v_heads, "qwen35: delta-net V heads (Hv, multiple of Hk)")->group(ov);
  app.add_option("--n-expert", n_expert, "qwen35moe: experts")->group(ov);
  app.add_option("--n-expert-used", n_expert_used, "qwen35moe: experts used per token")->group(ov);
  app.add_option("--n-ff-exp", n_ff_exp, "qwen35moe: expert FFN width")->group(ov);
  app.add_option("--n-ff-shexp", n_ff_shexp, "qwen35moe: shared expert FFN width")->group(ov);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (list) {
    std::printf("presets:\n");
    print_presets();
    return 0;
  }
  if (arch.empty() == preset.empty()) {
    std::fprintf(stderr, "kiln gguf gen: give exactly one of --arch or --preset (see --help)\n");
    return 2;
  }
  gen::GenOptions opt;
  if (!preset.empty()) {
    const gen::Preset* p = gen::find_preset(preset);
    if (!p) {
      std::fprintf(stderr, "kiln gguf gen: unknown preset '%s'; presets:\n", preset.c_str());
      print_presets();
      return 2;
    }
    opt.spec = p->spec;
  } else {
    auto s = gen::default_spec(arch);
    if (!s) {
      std::fprintf(stderr, "kiln gguf gen: unknown arch '%s' (llama, qwen3, qwen35, qwen35moe)\n", arch.c_str());
      return 2;
    }
    opt.spec = *s;
  }
  gen::ModelSpec& s = opt.spec;
  const bool hybrid = s.arch == "qwen35" || s.arch == "qwen35moe";
  auto set = [](int64_t v, int64_t& dst) {
    if (v >= 0) dst = v;
  };
  set(n_layer, s.n_layer);
  set(n_embd, s.n_embd);
  set(n_head, s.n_head);
  set(n_head_kv, s.n_head_kv);
  set(n_ff, s.n_ff);
  set(n_vocab, s.n_vocab);
  set(n_ctx, s.n_ctx);
  set(fai, s.full_attention_interval);
  set(ssm_conv, s.ssm_d_conv);
  set(ssm_state, s.ssm_d_state);
  set(ssm_groups, s.ssm_n_group);
  set(ssm_v_heads, s.ssm_dt_rank);
  set(n_expert, s.n_expert);
  set(n_expert_used, s.n_expert_used);
  set(n_ff_exp, s.n_ff_exp);
  set(n_ff_shexp, s.n_ff_shexp);
  if (head_dim >= 0) {
    s.head_dim = head_dim;
    s.n_rot = hybrid ? head_dim / 4 : head_dim;
  }
  set(n_rot, s.n_rot);
  if (hybrid && (head_dim >= 0 || n_rot >= 0)) {
    const int32_t half = int32_t(s.n_rot / 2), a = (half + 2) / 3;
    s.rope_sections = {a, a, half - 2 * a, 0};
  }
  if (rope_theta > 0) s.rope_theta = rope_theta;
  if (rms_eps > 0) s.rms_eps = rms_eps;
  if (tied && untied) {
    std::fprintf(stderr, "kiln gguf gen: --tied and --untied are exclusive\n");
    return 2;
  }
  if (tied) s.tied_embeddings = true;
  if (untied) s.tied_embeddings = false;
  if (mtp) s.n_mtp = 1;
  set(n_mtp, s.n_mtp);
  if (!mix_name.empty()) {
    const std::string m = lower(mix_name);
    if (m == "iq4_xs") {
      opt.mix = gen::Mix::IQ4_XS;
    } else if (m == "q4_k_m") {
      opt.mix = gen::Mix::Q4_K_M;
    } else {
      std::fprintf(stderr, "kiln gguf gen: unknown --mix '%s' (iq4_xs, q4_k_m)\n", mix_name.c_str());
      return 2;
    }
  } else {
    auto t = gguf::type_from_name(type_name);
    if (!t) {
      std::fprintf(stderr, "kiln gguf gen: unknown --type '%s'\n", type_name.c_str());
      return 2;
    }
    opt.type = *t;
  }
  if (!vocab.empty()) {
    auto nv = gen::vocab_size(vocab);
    if (!nv.ok()) {
      std::fprintf(stderr, "kiln gguf gen: --vocab: %s\n", nv.error().message.c_str());
      return 2;
    }
    if (n_vocab >= 0 && n_vocab < *nv) {
      std::fprintf(stderr, "kiln gguf gen: --n-vocab %lld is below the %lld tokens of --vocab %s\n", (long long)n_vocab,
                   (long long)*nv, vocab.c_str());
      return 2;
    }
    s.n_vocab = std::max(s.n_vocab, *nv);
    opt.vocab_from = vocab;
  }
  opt.seed = seed;
  opt.n_threads = threads;
  opt.meta_only = meta_only;
  opt.fast = fast;

  auto pl = gen::plan(opt);
  if (!pl.ok()) {
    std::fprintf(stderr, "kiln gguf gen: %s\n", pl.error().message.c_str());
    return 2;
  }
  const GenTotals tot = gen_totals(*pl);
  const uint64_t total = tot.bytes, n_params = tot.params;
  if (dry_run) {
    print_gen_plan(*pl, 44);
    return 0;
  }
  if (out.empty()) {
    std::fprintf(stderr, "kiln gguf gen: -o FILE is required\n");
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto st = gen::generate(opt, out, gen_progress("kiln gguf gen", quiet));
  if (!quiet) std::fprintf(stderr, "\n");
  if (!st.ok()) {
    std::fprintf(stderr, "kiln gguf gen: %s\n", st.error().message.c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet && meta_only)
    std::fprintf(stderr, "kiln gguf gen: wrote the header of %s (%s, %zu tensors, %.3f B params, %.1f MiB of tensor data not written)\n",
                 out.c_str(), s.arch.c_str(), pl->size(), double(n_params) / 1e9, double(total) / 1048576.0);
  else if (!quiet)
    std::fprintf(stderr, "kiln gguf gen: wrote %s (%s, %zu tensors, %.3f B params, %.1f MiB) in %.2f s (%.0f MiB/s)\n",
                 out.c_str(), s.arch.c_str(), pl->size(), double(n_params) / 1e9, double(total) / 1048576.0, secs,
                 double(total) / 1048576.0 / std::max(secs, 1e-9));
  return 0;
}

GenTotals gen_totals(const std::vector<gen::PlannedTensor>& pl) {
  GenTotals t;
  for (const auto& p : pl) {
    t.bytes += p.n_bytes;
    uint64_t n = 1;
    for (auto d : p.ne) n *= uint64_t(d);
    t.params += n;
  }
  return t;
}

void print_gen_plan(const std::vector<gen::PlannedTensor>& pl, int name_width) {
  for (const auto& t : pl) {
    std::string shape;
    for (size_t i = 0; i < t.ne.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.ne[i]);
    std::printf("%-*s %-7.*s [%s] %llu bytes\n", name_width, t.name.c_str(), int(gguf::type_name(t.type).size()),
                gguf::type_name(t.type).data(), shape.c_str(), (unsigned long long)t.n_bytes);
  }
  const GenTotals tot = gen_totals(pl);
  std::printf("%zu tensors, %.3f B parameters, %.3f GiB of tensor data\n", pl.size(), double(tot.params) / 1e9,
              double(tot.bytes) / double(1ull << 30));
}

std::function<void(size_t, size_t)> gen_progress(const char* what, bool quiet) {
  if (quiet) return [](size_t, size_t) {};
  auto last = std::make_shared<int>(-1);
  return [what, last](size_t done, size_t all) {
    if (all == 0) return;
    const int pct = int(100 * done / all);
    if (pct != *last) {
      std::fprintf(stderr, "\r%s: %3d%% (%zu/%zu tensors)", what, pct, done, all);
      *last = pct;
    }
  };
}

}  // namespace kiln::tools
