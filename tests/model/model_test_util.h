// Shared by the model and engine tests: tiny generated models (cached per process-independent
// path under the temp dir, written atomically so parallel CTest processes can share them),
// metadata-only files of real shapes (for the memory plan) and seeded random token ids.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "model/fit.h"
#include "model/gen/gen.h"

namespace kiln::test {

// Path of `preset` generated with weight type `t` and `seed` in temp/<dir>/; generated on first use.
inline std::string generated_model(const std::string& dir, const std::string& preset, gguf::GgmlType t,
                                   uint64_t seed) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / dir;
  fs::create_directories(d);
  const fs::path p =
      d / (preset + "-" + std::string(gguf::type_name(t)) + "-s" + std::to_string(seed) + ".gguf");
  if (!fs::exists(p)) {
    model::gen::GenOptions o;
    const auto* pr = model::gen::find_preset(preset);
    EXPECT_NE(pr, nullptr) << "unknown preset " << preset;
    if (!pr) return p.string();
    o.spec = pr->spec;
    o.type = t;
    o.seed = seed;
    o.n_threads = 2;
    const fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid());
    auto st = model::gen::generate(o, tmp.string());
    EXPECT_TRUE(st.ok()) << st.error().message;
    fs::rename(tmp, p);
  }
  return p.string();
}

// The generator's options `o` written metadata-only (header and tensor table, no data) to `path`,
// opened with metadata-only limits, and the model shape the memory planner reads from it.
struct MetaModel {
  std::unique_ptr<gguf::File> file;
  model::ModelShape shape;
};
inline MetaModel meta_model(const std::filesystem::path& path, model::gen::GenOptions o) {
  o.meta_only = true;
  EXPECT_TRUE(model::gen::generate(o, path.string()).ok());
  EXPECT_LT(std::filesystem::file_size(path), uint64_t(16) << 20);  // the header only
  MetaModel m;
  gguf::OpenOptions oo;
  oo.limits.metadata_only = true;
  auto f = gguf::File::open(path.string(), oo);
  EXPECT_TRUE(f.ok()) << f.error().message;
  if (!f.ok()) return m;
  m.file = std::move(*f);
  auto s = model::ModelShape::from_file(*m.file);
  EXPECT_TRUE(s.ok()) << s.error().message;
  if (s.ok()) m.shape = std::move(*s);
  return m;
}

inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

}  // namespace kiln::test
