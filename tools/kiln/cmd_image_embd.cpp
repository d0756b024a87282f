// `kiln image-embd` (developer command, not in the help list's main commands): encodes images with a
// vision projector (--mmproj) as `kiln serve` does — decode, llama.cpp's preprocessing, the ViT and
// merger on the projector's device — and writes the embeddings, for the llama.cpp oracle test
// (tests/py/test_mmproj_gen_llamacpp.py) and for timing encodes (issue #17).
//   kiln image-embd --mmproj F --image FILE [--image FILE ...] [-o out.f32] [--repeat N] [-t N]
//                   [--image-min-tokens N] [--image-max-tokens N] [--no-mmproj-offload] [--main-gpu N]
// Prints one line per image: its size, token grid, output width and the mean encode time over
// --repeat runs. -o: the embeddings of every image, rows in token order (y, x), float32 little-endian.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "core/read_file.h"
#include "core/thread_pool.h"
#include "media/image.h"
#include "model/vision.h"
#include "subcommand.h"

namespace {
using namespace kiln;

int cmd_image_embd(int argc, char** argv) {
  CLI::App app{"kiln image-embd — encode images with a vision projector and write the embeddings (developer)",
               "kiln image-embd"};
  std::string mmproj, out;
  std::vector<std::string> images;
  int threads = 0, repeat = 1, main_gpu = 0;
  int64_t min_tokens = 8, max_tokens = 4096;
  bool no_offload = false;
  app.add_option("--mmproj", mmproj, "vision projector (qwen3vl_merger)")->required();
  app.add_option("--image", images, "image file (PNG, JPEG, WebP, GIF, BMP); repeatable")->required();
  app.add_option("-o,--output", out, "write the embeddings (float32, rows of every image in order)");
  app.add_option("--repeat", repeat, "encode each image N times; the time printed is the mean of runs 2..N (N > 1)");
  app.add_option("-t,--threads", threads, "CPU threads (default: all cores)");
  app.add_option("--image-min-tokens", min_tokens, "fewest tokens an image may give (default 8)");
  app.add_option("--image-max-tokens", max_tokens, "most tokens an image may give (default 4096)");
  app.add_flag("--no-mmproj-offload", no_offload, "encode on the CPU even when a GPU is usable");
  app.add_option("--main-gpu", main_gpu, "the GPU the projector goes to (default 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (repeat < 1) {
    std::fprintf(stderr, "kiln image-embd: --repeat must be >= 1\n");
    return 2;
  }
  auto vm = model::VisionModel::load(mmproj, {LoadMode::Mmap, !no_offload, main_gpu});
  if (!vm.ok()) {
    std::fprintf(stderr, "kiln image-embd: %s\n", vm.error().message.c_str());
    return 1;
  }
  const model::VisionConfig& c = (*vm)->config();
  media::PreprocessParams pp;
  pp.patch = int(c.patch);
  pp.merge = int(c.merge);
  pp.min_tokens = std::min(min_tokens, max_tokens);
  pp.max_tokens = max_tokens;
  for (int i = 0; i < 3; ++i) pp.mean[i] = c.mean[i], pp.std[i] = c.std[i];
  ThreadPool pool(threads);
  model::VisionEncoder enc(**vm, pool);
  std::ofstream f;
  if (!out.empty()) {
    f.open(out, std::ios::binary | std::ios::trunc);
    if (!f) {
      std::fprintf(stderr, "kiln image-embd: %s: cannot open for writing\n", out.c_str());
      return 1;
    }
  }
  for (size_t i = 0; i < images.size(); ++i) {
    std::string bytes;
    if (!read_file(images[i], bytes)) {
      std::fprintf(stderr, "kiln image-embd: %s: cannot read\n", images[i].c_str());
      return 1;
    }
    auto img = media::decode_image(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    if (!img.ok()) {
      std::fprintf(stderr, "kiln image-embd: %s: %s\n", images[i].c_str(), img.error().message.c_str());
      return 1;
    }
    const media::Pixels px = media::preprocess(*img, pp);
    Result<model::ImageEmbedding> e = err("not encoded");
    double total_ms = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      e = enc.encode(px.chw.data(), px.w, px.h);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!e.ok()) {
        std::fprintf(stderr, "kiln image-embd: %s: %s\n", images[i].c_str(), e.error().message.c_str());
        return 1;
      }
      if (r > 0 || repeat == 1) total_ms += ms;
    }
    const int n_timed = repeat == 1 ? 1 : repeat - 1;
    // A projector on the host runs on this command's pool (the model's host device only holds its weights).
    const std::string where = (*vm)->device().type() == backend::DeviceType::Cpu
                                  ? "the CPU, " + std::to_string(pool.size()) + " threads"
                                  : (*vm)->device().name();
    std::printf("image %zu: %s %dx%d px -> %dx%d px, %d x %d tokens of %lld floats, encode %.2f ms (mean of %d) on %s\n",
                i, images[i].c_str(), img->w, img->h, px.w, px.h, e->nx, e->ny, (long long)c.n_out_total(),
                total_ms / n_timed, n_timed, where.c_str());
    if (f) f.write(reinterpret_cast<const char*>(e->data.data()), std::streamsize(e->data.size() * sizeof(float)));
  }
  if (f && !f.good()) {
    std::fprintf(stderr, "kiln image-embd: %s: write failed\n", out.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

// The name has a dash, which KILN_SUBCOMMAND's identifier cannot carry.
static ::kiln::tools::SubcommandReg kiln_subcommand_reg_image_embd(
    "image-embd", "(dev) encode images with a projector: embeddings to a file, encode time", cmd_image_embd);
