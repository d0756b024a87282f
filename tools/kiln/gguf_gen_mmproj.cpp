// `kiln gguf gen --mmproj` — write a random-weight vision projector (mmproj) in the layout llama.cpp's
// converter writes for Qwen3.5 / Qwen3-VL (model/gen/mmproj.h). Reached from `kiln gguf gen` when
// --mmproj is among its arguments; the text-model options do not apply here.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include "gguf_cmds.h"
#include "model/gen/mmproj.h"

namespace kiln::tools {
namespace {

namespace gen = kiln::model::gen;

const char* kHelpFooter = R"(
Examples:
  kiln gguf gen --mmproj --preset qwen35-9b -o mmproj-9b-F16.gguf      # ~0.85 GiB, Qwen3.5-9B's tower
  kiln gguf gen --mmproj --preset qwen35-27b --type Q8_0 -o mm27.gguf
  kiln gguf gen --mmproj --preset qwen35-9b --n-layer 2 --n-out 256 -o small.gguf  # real widths, 2 blocks
  kiln gguf gen --mmproj --preset qwen35-9b --meta-only -o mm.meta.gguf  # header only, for `kiln fit`

The projector's n_out (out_hidden_size) must equal the text model's n_embd (qwen35-9b: 4096,
qwen35-27b: 5120). Types as llama.cpp's converter writes them: --type is the converter's --outtype
for the matrices; biases, norms and v.position_embd are F32; v.patch_embd.weight(.1) is F16 in an F16
file and F32 otherwise; Q8_0 matrices whose rows are not a multiple of 32 (ffn_down) fall back to F16.
The output depends only on the options and --seed (byte-identical across runs and thread counts).
)";

void print_presets() {
  for (const auto& p : gen::vision_presets())
    std::printf("  %-14.*s %.*s\n", int(p.name.size()), p.name.data(), int(p.description.size()), p.description.data());
}

bool parse_list(const std::string& s, std::vector<int64_t>& out) {
  out.clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) return false;
    } catch (...) {
      return false;
    }
  }
  return true;
}

}  // namespace

int gguf_gen_mmproj_main(int argc, char** argv) {
  CLI::App app{"kiln gguf gen --mmproj — write a random-weight vision projector (qwen3vl_merger, as llama.cpp's "
               "converter writes it for Qwen3.5 / Qwen3-VL)",
               "kiln gguf gen --mmproj"};
  app.footer(kHelpFooter);
  std::string preset, type_name = "F16", out, deepstack;
  uint64_t seed = 42;
  int threads = 0;
  bool mmproj = false, list = false, dry_run = false, meta_only = false, quiet = false;
  int64_t n_layer = -1, n_embd = -1, n_head = -1, n_ff = -1, n_out = -1, n_pos = -1, patch = -1;
  app.add_flag("--mmproj", mmproj, "write a vision projector (this command; how `kiln gguf gen` gets here)");
  app.add_option("--preset", preset, "named tower (see --list-presets)");
  app.add_flag("--list-presets", list, "list the projector presets and exit");
  app.add_option("--type", type_name, "matrix type, the converter's --outtype: F32 F16 BF16 Q8_0 (default F16)");
  app.add_option("--seed", seed, "random seed (default 42)");
  app.add_option("-o,--output", out, "output file");
  app.add_option("-t,--threads", threads, "threads for weight synthesis (default: all cores)");
  app.add_flag("--dry-run", dry_run, "print the tensor plan and size, write nothing");
  app.add_flag("--meta-only", meta_only, "write the header only (metadata and tensor table): for `kiln fit`");
  app.add_flag("-q,--quiet", quiet, "no progress output");
  auto* ov = "shape overrides";
  app.add_option("--n-layer", n_layer, "ViT blocks (depth)")->group(ov);
  app.add_option("--n-embd", n_embd, "ViT width (hidden_size)")->group(ov);
  app.add_option("--n-head", n_head, "attention heads (num_heads)")->group(ov);
  app.add_option("--n-ff", n_ff, "MLP width (intermediate_size)")->group(ov);
  app.add_option("--n-out", n_out, "merger output width (out_hidden_size = the text model's n_embd)")->group(ov);
  app.add_option("--n-pos", n_pos, "learned position grid (num_position_embeddings, a square)")->group(ov);
  app.add_option("--patch", patch, "patch size")->group(ov);
  app.add_option("--deepstack", deepstack, "DeepStack block indices, e.g. 8,16,24 (Qwen3-VL; Qwen3.5 has none)")
      ->group(ov);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (list) {
    std::printf("projector presets (--mmproj):\n");
    print_presets();
    return 0;
  }
  if (preset.empty()) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: --preset is required; presets:\n");
    print_presets();
    return 2;
  }
  const gen::VisionPreset* p = gen::find_vision_preset(preset);
  if (!p) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: unknown preset '%s'; presets:\n", preset.c_str());
    print_presets();
    return 2;
  }
  gen::MmprojOptions opt;
  opt.spec = p->spec;
  gen::VisionSpec& s = opt.spec;
  auto set = [](int64_t v, int64_t& dst) {
    if (v >= 0) dst = v;
  };
  set(n_layer, s.n_layer);
  set(n_embd, s.n_embd);
  set(n_head, s.n_head);
  set(n_ff, s.n_ff);
  set(n_out, s.n_out);
  set(n_pos, s.n_pos);
  set(patch, s.patch);
  if (!deepstack.empty() && !parse_list(deepstack, s.deepstack)) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: --deepstack '%s' is not a comma-separated list of numbers\n",
                 deepstack.c_str());
    return 2;
  }
  auto t = gguf::type_from_name(type_name);
  if (!t) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: unknown --type '%s' (F32, F16, BF16, Q8_0)\n", type_name.c_str());
    return 2;
  }
  opt.type = *t;
  opt.seed = seed;
  opt.n_threads = threads;
  opt.meta_only = meta_only;

  auto pl = gen::plan_mmproj(opt);
  if (!pl.ok()) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: %s\n", pl.error().message.c_str());
    return 2;
  }
  const GenTotals tot = gen_totals(*pl);
  const uint64_t total = tot.bytes, n_params = tot.params;
  if (dry_run) {
    print_gen_plan(*pl, 32);
    return 0;
  }
  if (out.empty()) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: -o FILE is required\n");
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto st = gen::generate_mmproj(opt, out, gen_progress("kiln gguf gen --mmproj", quiet));
  if (!quiet) std::fprintf(stderr, "\n");
  if (!st.ok()) {
    std::fprintf(stderr, "kiln gguf gen --mmproj: %s\n", st.error().message.c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet)
    std::fprintf(stderr, "kiln gguf gen --mmproj: wrote %s%s (%zu tensors, %.1f M params, %.1f MiB%s) in %.2f s\n",
                 meta_only ? "the header of " : "", out.c_str(), pl->size(), double(n_params) / 1e6,
                 double(total) / 1048576.0, meta_only ? " of tensor data not written" : "", secs);
  return 0;
}

}  // namespace kiln::tools
