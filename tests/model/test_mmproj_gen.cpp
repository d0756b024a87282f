// `kiln gguf gen --mmproj` (model/gen/mmproj.h): generated vision projectors against the file
// llama.cpp's converter wrote (tests/fixtures/hf/vision/mmproj.gguf, from the tiny HF Qwen3.5-VL of
// scripts/hf_vision_fixtures.py) and through kiln's projector loader and encoder (model/vision.h).
// llama.cpp's acceptance of generated projectors is tests/py/test_mmproj_gen_llamacpp.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "model/gen/mmproj.h"
#include "model/vision.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace gen = model::gen;
using gguf::GgmlType;

const std::string kFixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/vision/mmproj.gguf";

fs::path tmp_dir() {
  const fs::path d = fs::temp_directory_path() / ("kiln-mmproj-gen-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// The generated files (a few hundred MB with the real widths) are removed when the tests end.
struct RemoveTmpDir : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("kiln-mmproj-gen-" + std::to_string(::getpid())), ec);
  }
};
const auto* const kRemoveTmpDir = ::testing::AddGlobalTestEnvironment(new RemoveTmpDir);

gen::MmprojOptions options(const std::string& preset, GgmlType t = GgmlType::F16) {
  gen::MmprojOptions o;
  const auto* p = gen::find_vision_preset(preset);
  EXPECT_NE(p, nullptr) << preset;
  if (p) o.spec = p->spec;
  o.type = t;
  o.n_threads = 2;
  return o;
}

std::string write(const gen::MmprojOptions& o, const std::string& name) {
  const std::string path = (tmp_dir() / name).string();
  auto st = gen::generate_mmproj(o, path);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return path;
}

std::unique_ptr<gguf::File> open(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.ok()) << f.error().message;
  return f.ok() ? std::move(*f) : nullptr;
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Values equal in type and content (floats within 1e-7 relative: F32 round trips).
bool same_value(const gguf::Value& a, const gguf::Value& b) {
  if (a.type != b.type || a.u != b.u || a.i != b.i || a.b != b.b || a.str != b.str) return false;
  if (std::fabs(a.f - b.f) > 1e-7 * std::max(1.0, std::fabs(b.f))) return false;
  if (a.elem_type != b.elem_type || a.arr.size() != b.arr.size()) return false;
  for (size_t i = 0; i < a.arr.size(); ++i)
    if (!same_value(a.arr[i], b.arr[i])) return false;
  return true;
}

// (1) The tiny preset is the fixture's tower: written as the converter wrote it (--outtype f32), the
// file has the same keys in the same order with the same values (but general.name), and the same
// tensors in the same order with the same types and shapes.
TEST(MmprojGen, TinyIsTheConverterLayout) {
  auto want = open(kFixture);
  auto got = open(write(options("tiny", GgmlType::F32), "tiny-f32.gguf"));
  ASSERT_TRUE(want && got);
  ASSERT_EQ(got->metadata().size(), want->metadata().size());
  for (size_t i = 0; i < want->metadata().size(); ++i) {
    const auto& w = want->metadata()[i];
    const auto& g = got->metadata()[i];
    EXPECT_EQ(g.key, w.key) << "key " << i;
    if (w.key == "general.name") continue;  // the converter's temp directory name
    EXPECT_TRUE(same_value(g.value, w.value)) << "key '" << w.key << "'";
  }
  ASSERT_EQ(got->tensors().size(), want->tensors().size());
  for (size_t i = 0; i < want->tensors().size(); ++i) {
    const auto& w = want->tensors()[i];
    const auto& g = got->tensors()[i];
    EXPECT_EQ(g.name, w.name) << "tensor " << i;
    EXPECT_EQ(g.type, w.type) << w.name;
    EXPECT_EQ(g.n_dims, w.n_dims) << w.name;
    EXPECT_EQ(g.ne, w.ne) << w.name;
  }
}

// The converter's type rules in an F16 (the usual download) and a Q8_0 file, on the real widths.
TEST(MmprojGen, ConverterTypeRules) {
  for (GgmlType ft : {GgmlType::F16, GgmlType::Q8_0}) {
    auto o = options("qwen35-9b", ft);
    auto pl = gen::plan_mmproj(o);
    ASSERT_TRUE(pl.ok()) << pl.error().message;
    size_t n_blk = 0;
    for (const auto& t : *pl) {
      GgmlType want = ft;
      if (t.ne.size() == 1 || t.name == "v.position_embd.weight") want = GgmlType::F32;
      else if (t.name.starts_with("v.patch_embd.weight")) want = ft == GgmlType::F16 ? GgmlType::F16 : GgmlType::F32;
      else if (ft == GgmlType::Q8_0 && t.name.ends_with("ffn_down.weight")) want = GgmlType::F16;  // 4304 % 32
      EXPECT_EQ(t.type, want) << t.name << " in a " << gguf::type_name(ft) << " file";
      n_blk += t.name.ends_with("attn_qkv.weight");
    }
    EXPECT_EQ(n_blk, 27u);
    EXPECT_EQ(pl->size(), 27u * 12 + 10);
  }
  // Blocks in the converter's (sorted HF name) order: 0, 1, 10, ..., 19, 2, 20, ...
  auto pl = gen::plan_mmproj(options("qwen35-9b"));
  ASSERT_TRUE(pl.ok());
  EXPECT_EQ((*pl)[12].name, "v.blk.1.attn_out.bias");
  EXPECT_EQ((*pl)[24].name, "v.blk.10.attn_out.bias");
  EXPECT_EQ(gen::size_label(243520), "244K");
  EXPECT_EQ(gen::size_label(455600000), "456M");
  EXPECT_EQ(gen::size_label(1500000), "1.5M");
}

// The real presets' sizes: Qwen3.5-9B's tower in F16 is the 870.5 MiB docs/memory.md plans with
// (+5.1 MiB: the position table is F32 in the converter's files).
TEST(MmprojGen, RealPresetSizes) {
  auto bytes = [](const std::string& preset) {
    auto pl = gen::plan_mmproj(options(preset));
    EXPECT_TRUE(pl.ok());
    uint64_t b = 0, n = 0;
    for (const auto& t : *pl) {
      b += t.n_bytes;
      uint64_t e = 1;
      for (auto d : t.ne) e *= uint64_t(d);
      n += e;
    }
    return std::pair{b, n};
  };
  const auto [b9, n9] = bytes("qwen35-9b");
  const auto [b27, n27] = bytes("qwen35-27b");
  const uint64_t pos_f16_to_f32 = 1152ull * 2304 * 2;
  EXPECT_NEAR(double(b9 - pos_f16_to_f32) / 1048576.0, 870.5, 0.05);
  EXPECT_EQ(n27 - n9, 4608ull * (5120 - 4096) + (5120 - 4096));  // only mm.2 grows
  EXPECT_GT(b27, b9);
  EXPECT_EQ(gen::size_label(n9), "456M");
}

TEST(MmprojGen, DeterministicAcrossThreads) {
  auto o = options("tiny");
  o.n_threads = 1;
  const std::string a = bytes_of(write(o, "det-1.gguf"));
  o.n_threads = 3;
  const std::string b = bytes_of(write(o, "det-3.gguf"));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  o.seed = 43;
  EXPECT_NE(bytes_of(write(o, "det-seed.gguf")), a);
}

TEST(MmprojGen, ValidationNamesTheField) {
  auto expect_err = [](gen::MmprojOptions o, const char* what) {
    auto pl = gen::plan_mmproj(o);
    ASSERT_FALSE(pl.ok()) << what;
    EXPECT_NE(pl.error().message.find(what), std::string::npos) << pl.error().message;
  };
  auto o = options("tiny");
  o.spec.n_head = 3;
  expect_err(o, "n_head");
  o = options("tiny");
  o.spec.n_head = 8;  // head 8: fine; 64 / 32 = 2 is not a multiple of 4
  EXPECT_TRUE(gen::plan_mmproj(o).ok());
  o.spec.n_head = 32;
  expect_err(o, "multiple of 4");
  o = options("tiny");
  o.spec.n_pos = 60;
  expect_err(o, "square");
  o = options("tiny");
  o.spec.deepstack = {2};
  expect_err(o, "deepstack layer 2");
  o = options("tiny");
  o.type = GgmlType::Q4_K;
  expect_err(o, "Q4_K");
}

// Planar [3][h][w] pixels in [-1, 1] (what media::preprocess gives with mean = std = 0.5).
std::vector<float> pixels(int w, int h) {
  std::vector<float> px(size_t(3 * w * h));
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        px[size_t((c * h + y) * w + x)] = std::sin(0.37f * float(x + 1) * float(c + 1) + 0.21f * float(y)) *
                                          std::cos(0.05f * float(x * y + c));
  return px;
}

// (2) kiln loads a generated projector and encodes an image into finite embeddings of the right
// count (image tokens: (w / 32) x (h / 32)) and width (n_out, one more per DeepStack layer).
void expect_encodes(const gen::MmprojOptions& o, const std::string& name, int w, int h) {
  const std::string path = write(o, name);
  auto vm = model::VisionModel::load(path, {LoadMode::Mmap, false, 0});
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  const auto& c = (*vm)->config();
  EXPECT_EQ(c.n_layer, o.spec.n_layer);
  EXPECT_EQ(c.n_embd, o.spec.n_embd);
  EXPECT_EQ(c.n_out, o.spec.n_out);
  EXPECT_EQ(c.n_pos_side * c.n_pos_side, o.spec.n_pos);
  EXPECT_EQ(int64_t(c.deepstack.size()), int64_t(o.spec.deepstack.size()));
  ThreadPool pool(2);
  model::VisionEncoder enc(**vm, pool);
  const auto px = pixels(w, h);
  auto e = enc.encode(px.data(), w, h);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->nx, w / 32);
  EXPECT_EQ(e->ny, h / 32);
  const int64_t width = o.spec.n_out * int64_t(1 + o.spec.deepstack.size());
  ASSERT_EQ(int64_t(e->data.size()), width * e->nx * e->ny);
  double sum = 0, sum2 = 0;
  size_t bad = 0;
  for (float v : e->data) {
    bad += !std::isfinite(v);
    sum += v;
    sum2 += double(v) * v;
  }
  EXPECT_EQ(bad, 0u) << name;
  const double n = double(e->data.size()), sd = std::sqrt(std::max(0.0, sum2 / n - (sum / n) * (sum / n)));
  std::printf("%s: %d x %d tokens of %lld, std %.3f\n", name.c_str(), e->nx, e->ny, (long long)width, sd);
  EXPECT_GT(sd, 0.05) << name;  // not collapsed ...
  EXPECT_LT(sd, 20.0) << name;  // ... nor blown up
}

TEST(MmprojGen, KilnEncodesTiny) {
  expect_encodes(options("tiny"), "enc-tiny.gguf", 96, 64);
}

// The real 9B widths (E 1152, 16 heads of 72, FFN 4304, 4608-wide merger) with 2 of its 27 blocks:
// F16 and Q8_0 (its ffn_down F16), and a DeepStack tower (Qwen3-VL's layout).
TEST(MmprojGen, KilnEncodesRealWidths) {
  auto o = options("qwen35-9b");
  o.spec.n_layer = 2;
  o.spec.n_out = 256;
  expect_encodes(o, "enc-9b-2blk-f16.gguf", 128, 64);
  o.type = GgmlType::Q8_0;
  expect_encodes(o, "enc-9b-2blk-q8.gguf", 64, 96);
  o.type = GgmlType::F16;
  o.spec.n_layer = 3;
  o.spec.deepstack = {0, 2};
  expect_encodes(o, "enc-9b-ds.gguf", 64, 64);
}

// A metadata-only projector is what `kiln fit` reads: small, with the full tensor table.
TEST(MmprojGen, MetaOnlyHeader) {
  auto o = options("qwen35-9b");
  o.meta_only = true;
  const std::string path = write(o, "meta.gguf");
  EXPECT_LT(fs::file_size(path), uint64_t(1) << 20);
  gguf::OpenOptions oo;
  oo.limits.metadata_only = true;
  auto f = gguf::File::open(path, oo);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->tensors().size(), 27u * 12 + 10);
  EXPECT_EQ(*(*f)->get_string("clip.projector_type"), "qwen3vl_merger");
  EXPECT_EQ(*(*f)->get_int("clip.vision.projection_dim"), 4096);
  EXPECT_EQ(*(*f)->get_int("clip.vision.image_size"), 768);
}

}  // namespace
}  // namespace kiln
