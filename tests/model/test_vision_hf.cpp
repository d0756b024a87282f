// HF oracle for images in (issue #17): the tiny Qwen3.5 vision-language model of
// scripts/hf_vision_fixtures.py (tests/fixtures/hf/vision). Its projector was converted by
// llama.cpp's own converter, so loading it checks kiln reads what llama.cpp writes; the images are
// decoded and preprocessed by kiln (media/) and encoded on the CPU; embeddings and the prompt logits
// of a conversation holding both images must equal HF's (float32) within 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/read_file.h"
#include "media/image.h"
#include "model/context.h"
#include "model/vision.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/vision/";

std::vector<float> read_f32(const std::string& path) {
  std::string s;
  EXPECT_TRUE(read_file(path, s)) << path;
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), v.size() * 4);
  return v;
}

nlohmann::json meta() {
  std::string s;
  EXPECT_TRUE(read_file(kDir + "meta.json", s));
  return nlohmann::json::parse(s);
}

media::PreprocessParams params_of(const model::VisionConfig& c) {
  media::PreprocessParams p;
  p.patch = int(c.patch);
  p.merge = int(c.merge);
  p.min_tokens = 4;  // the fixtures hold 6 and 8 tokens (llama.cpp's default floor is 8)
  for (int i = 0; i < 3; ++i) p.mean[i] = c.mean[i], p.std[i] = c.std[i];
  return p;
}

TEST(VisionHf, LoadsLlamaCppProjector) {
  auto vm = model::VisionModel::load(kDir + "mmproj.gguf", {LoadMode::Mmap, false, 0});
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  const auto& c = (*vm)->config();
  EXPECT_EQ(c.projector_type, "qwen3vl_merger");
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.patch, 16);
  EXPECT_EQ(c.merge, 2);
  EXPECT_EQ(c.n_pos_side, 8);
  EXPECT_EQ(c.n_out, 64);
  EXPECT_TRUE(c.deepstack.empty());
  EXPECT_NEAR(c.mean[0], 0.48145466f, 1e-6f);
  EXPECT_NEAR(c.std[2], 0.27577711f, 1e-6f);
  // A text model is not a projector: the error names the key.
  auto bad = model::VisionModel::load(kDir + "model.gguf", {LoadMode::Mmap, false, 0});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("clip.projector_type"), std::string::npos) << bad.error().message;
}

TEST(VisionHf, ImageEmbeddingsEqualHf) {
  auto vm = model::VisionModel::load(kDir + "mmproj.gguf", {LoadMode::Mmap, false, 0});
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  ThreadPool pool(2);
  model::VisionEncoder enc(**vm, pool);
  const auto m = meta();
  for (size_t i = 0; i < m["images"].size(); ++i) {
    const auto& im = m["images"][i];
    std::string bytes;
    ASSERT_TRUE(read_file(kDir + im["file"].get<std::string>(), bytes));
    auto img = media::decode_image(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(img.ok()) << img.error().message;
    const media::Pixels px = media::preprocess(*img, params_of((*vm)->config()));
    ASSERT_EQ(px.w, im["w"].get<int>());  // sides multiples of 32: no resize
    ASSERT_EQ(px.h, im["h"].get<int>());
    auto e = enc.encode(px.chw.data(), px.w, px.h);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e->nx, im["nx"].get<int>());
    EXPECT_EQ(e->ny, im["ny"].get<int>());
    const auto want = read_f32(kDir + "embd" + std::to_string(i) + ".f32");
    ASSERT_EQ(e->data.size(), want.size());
    double maxd = 0;
    for (size_t k = 0; k < want.size(); ++k) maxd = std::max(maxd, double(std::fabs(e->data[k] - want[k])));
    EXPECT_LE(maxd, 1e-3) << "image " << i;
    std::printf("image %zu: %d tokens, max |kiln - HF| = %.2e\n", i, e->nx * e->ny, maxd);
  }
}

// The prompt: text, <|vision_start|>, image 0's tokens, <|vision_end|>, text, the same for image 1,
// text; image tokens take kiln's embeddings, every token the M-RoPE positions llama.cpp's mtmd gives
// (checked against HF's get_rope_index), in chunks of 5 tokens (runs that split images).
TEST(VisionHf, PromptLogitsEqualHf) {
  auto vm = model::VisionModel::load(kDir + "mmproj.gguf", {LoadMode::Mmap, false, 0});
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  auto lm = model::load_model(kDir + "model.gguf");
  ASSERT_TRUE(lm.ok()) << lm.error().message;
  const auto& cfg = (*lm)->config();
  ThreadPool pool(2);
  model::VisionEncoder enc(**vm, pool);
  const auto m = meta();
  std::vector<model::ImageEmbedding> embs;
  for (const auto& im : m["images"]) {
    std::string bytes;
    ASSERT_TRUE(read_file(kDir + im["file"].get<std::string>(), bytes));
    auto img = media::decode_image(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(img.ok());
    const media::Pixels px = media::preprocess(*img, params_of((*vm)->config()));
    auto e = enc.encode(px.chw.data(), px.w, px.h);
    ASSERT_TRUE(e.ok());
    embs.push_back(std::move(*e));
  }
  const std::vector<int32_t> ids = m["prompt"].get<std::vector<int32_t>>();
  const int32_t img_tok = m["image_token"].get<int32_t>();
  const int64_t T = int64_t(ids.size());
  // Embedding pointers and llama.cpp's positions: text advances by 1, an image of nx x ny tokens
  // at p0 gives (p0, p0 + y, p0 + x) and advances by max(nx, ny).
  std::vector<const float*> embd(size_t(T), nullptr);
  std::vector<int32_t> mpos(size_t(3 * T));
  int32_t p = 0;
  size_t img = 0;
  for (int64_t t = 0; t < T;) {
    if (ids[size_t(t)] != img_tok) {
      for (int k = 0; k < 3; ++k) mpos[size_t(3 * t + k)] = p;
      ++p, ++t;
      continue;
    }
    const auto& e = embs[img++];
    for (int y = 0; y < e.ny; ++y)
      for (int x = 0; x < e.nx; ++x, ++t) {
        embd[size_t(t)] = e.data.data() + size_t(y * e.nx + x) * size_t(cfg.n_embd);
        mpos[size_t(3 * t)] = p, mpos[size_t(3 * t + 1)] = p + y, mpos[size_t(3 * t + 2)] = p + x;
      }
    p += std::max(e.nx, e.ny);
  }
  const auto hf_pos = m["mrope_positions"];
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < 3; ++k) ASSERT_EQ(mpos[size_t(3 * t + k)], hf_pos[size_t(k)][size_t(t)].get<int32_t>()) << t;

  model::ContextOptions co;
  co.n_batch = 8;
  model::Context ctx(**lm, co);
  model::MemoryOptions mo;
  mo.n_ctx = 64;
  mo.n_seq = 1;
  mo.type_k = mo.type_v = gguf::GgmlType::F32;  // F32 throughout, as the HF oracle
  auto mem = model::Memory::create(**lm, mo);
  ASSERT_TRUE(mem.ok()) << mem.error().message;
  const auto want = read_f32(kDir + "logits.f32");
  ASSERT_EQ(int64_t(want.size()), T * cfg.n_vocab);
  double maxd = 0;
  for (int64_t t0 = 0; t0 < T; t0 += 5) {
    model::Batch b;
    const int64_t n = std::min<int64_t>(5, T - t0);
    for (int64_t t = t0; t < t0 + n; ++t) {
      b.add(ids[size_t(t)], int32_t(t), 0, true);
      b.embd.push_back(embd[size_t(t)]);
      for (int k = 0; k < 3; ++k) b.mpos.push_back(mpos[size_t(3 * t + k)]);
    }
    auto st = ctx.decode(b, **mem);
    ASSERT_TRUE(st.ok()) << st.error().message;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t v = 0; v < cfg.n_vocab; ++v)
        maxd = std::max(maxd, double(std::fabs(ctx.logits(i)[v] - want[size_t((t0 + i) * cfg.n_vocab + v)])));
  }
  EXPECT_LE(maxd, 1e-3);
  std::printf("prompt of %lld tokens with 2 images: max |kiln - HF| logit = %.2e\n", (long long)T, maxd);
}

}  // namespace
}  // namespace kiln
