// StagedUpload (model/staged_upload.h) on the host device: tensors of every size class (smaller
// than a stage, several stages, straddling stage ends) arrive byte for byte with a 1 MiB stage, in
// order with later ones, after finish(). The CUDA path is exercised by every GPU model test's load.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/staged_upload.h"

namespace kiln::model {
namespace {

TEST(ModelUpload, StagedBytesArriveWhole) {
  ThreadPool pool(2);
  auto dev = backend::make_cpu_device(pool);
  std::mt19937 g(3);
  const std::vector<size_t> sizes = {17, size_t(1) << 20, (size_t(1) << 20) - 5, 3 * (size_t(1) << 20) + 11, 256, 700000,
                                     1, (size_t(5) << 20) + 3};
  std::vector<std::vector<uint8_t>> src;
  std::vector<std::unique_ptr<backend::Buffer>> dst;
  StagedUpload up(*dev, size_t(1) << 20);
  for (size_t n : sizes) {
    src.emplace_back(n);
    for (auto& b : src.back()) b = uint8_t(g());
    dst.push_back(dev->alloc(n + 64));
    const auto t = backend::Tensor::make(dst.back().get(), 64, gguf::GgmlType::I8, {int64_t(n), 1, 1, 1});
    up.add(t, src.back().data(), n);
  }
  up.finish();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto* got = static_cast<const uint8_t*>(dst[i]->host_ptr()) + 64;
    EXPECT_TRUE(std::equal(src[i].begin(), src[i].end(), got)) << "tensor " << i << " of " << sizes[i] << " bytes";
  }
}

}  // namespace
}  // namespace kiln::model
