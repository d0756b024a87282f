// kernels::matmul under ThreadPool::parallel_for_dynamic (the weight rows in chunks claimed by
// whichever thread is free): for every weight type, ragged row counts (not multiples of 4, 8 or 16)
// cut into many chunks, one column (the decode mat-vec), 3 columns and 16 (the tile path), the
// result on 2..4 threads is bit for bit the 1-thread one, every output row written (a sentinel
// NaN pattern otherwise survives). The pool-level tests (test_thread_pool.cpp) check that no index
// is run twice and that a delayed worker's chunks are taken by the others.
#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "kernel_test_util.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

TEST(MatmulSchedule, DynamicRowsMatchOneThreadBitExact) {
  constexpr uint32_t kSentinel = 0x7fc0dead;  // a NaN no kernel produces
  float sentinel;
  std::memcpy(&sentinel, &kSentinel, 4);
  ThreadPool one(1), two(2), three(3), four(4);
  for (GgmlType t : kMatmulTypes) {
    const int64_t k = 256;
    // 2 rows past a multiple of 16 / 8 rows past / 5 past a multiple of 8 (not of 4): with k = 256,
    // 1 column, 2 threads these are 10-40 chunks (kernels/cpu/matmul.cpp chunk_rows).
    for (int64_t n : {1042, 2056, 2053}) {
      const auto f = randv(size_t(k * n), uint32_t(n) + uint32_t(t) * 131u);
      const auto w = weight_rows(t, f.data(), k, n);
      const size_t stride = tensor::row_size(t, k);
      for (int64_t m : {1, 3, 16}) {
        const auto x = randv(size_t(k * m), uint32_t(m * 7 + n));
        std::vector<float> want(size_t(n * m), sentinel);
        run_matmul(matmul_args(t, w.data(), stride, k, n, m, x.data(), k, want.data(), n), one);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NE(f32_to_bits(want[i]), kSentinel) << gguf::type_name(t) << " n " << n << " m " << m << " 1 thread, output " << i;
        for (ThreadPool* pool : {&two, &three, &four}) {
          for (int rep = 0; rep < 3; ++rep) {  // the split differs from call to call
            std::vector<float> y(size_t(n * m), sentinel);
            run_matmul(matmul_args(t, w.data(), stride, k, n, m, x.data(), k, y.data(), n), *pool);
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(f32_to_bits(y[i]), f32_to_bits(want[i])) << gguf::type_name(t) << " n " << n << " m " << m << " threads "
                                                   << pool->size() << " row " << i % size_t(n) << " col " << i / size_t(n);
          }
        }
      }
    }
  }
}

}  // namespace
