// Dispatched matmul / get_rows (every weight type x every ISA this CPU has) against the scalar
// reference (kernels/ref: dequantize the row with tensor's reference, dot in double).
#include <cstring>

#include "kernel_test_util.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Tolerance (NMSE vs the exact product of the dequantized weights). Float weights: only the
// summation order differs. Quantized weights: the fast paths quantize X to 8 bits per 32
// (relative error ~ 1/254 per element): measured NMSE ~1.2e-5 for every type, bound 1e-4
// (test-backend-ops uses 5e-4).
double tolerance(GgmlType t) { return is_float(t) ? 1e-10 : 1e-4; }

std::vector<uint8_t> make_weights(GgmlType t, int64_t k, int64_t n, size_t stride, uint32_t seed) {
  std::vector<uint8_t> w(stride * size_t(n), 0xAB);  // padding bytes between rows are garbage
  const auto f = randv(size_t(k * n), seed);
  for (int64_t j = 0; j < n; ++j) {
    if (t == GgmlType::F32) std::memcpy(w.data() + stride * j, f.data() + k * j, size_t(k) * 4);
    else tensor::quantize_row(t, f.data() + k * j, w.data() + stride * size_t(j), k);
  }
  return w;
}

void check_matmul(GgmlType t, int64_t k, int64_t n, int64_t m, ThreadPool& pool) {
  const size_t rs = tensor::row_size(t, k);
  const size_t stride = rs + 16;  // rows not packed: exercises w_stride
  const auto w = make_weights(t, k, n, stride, uint32_t(k * 7 + n));
  const int64_t xs = k + 3, ys = n + 5;
  const auto x = randv(size_t(xs * m), uint32_t(m + 11));
  MatmulArgs a{t, w.data(), stride, k, n, m, x.data(), xs, nullptr, ys};
  std::vector<float> want(size_t(ys * m), 0.f), got(size_t(ys * m), 0.f);
  a.y = want.data();
  ref::matmul(a);
  std::vector<uint8_t> ws(matmul_workspace(t, k, m, pool.size()) + 64);
  void* wsp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) & ~uintptr_t(63));
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    std::fill(got.begin(), got.end(), 0.f);
    a.y = got.data();
    matmul(a, wsp, pool);
    const double e = nmse(got, want);
    EXPECT_LE(e, tolerance(t)) << gguf::type_name(t) << " isa " << isa_name(isa) << " k " << k << " n " << n << " m " << m;
    // Nothing written outside the [n, m] window (the y_stride padding stays 0).
    for (int64_t c = 0; c < m; ++c)
      for (int64_t j = n; j < ys; ++j) ASSERT_EQ(got[size_t(c * ys + j)], 0.f);
  }
}

}  // namespace

TEST(Matmul, EveryTypeEveryIsaMatVec) {
  IsaGuard g;
  ThreadPool pool(3);
  for (GgmlType t : kTypes) check_matmul(t, 512, 37, 1, pool);  // 37 rows: uneven thread split
}

TEST(Matmul, EveryTypeEveryIsaSmallBatch) {
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : kTypes) check_matmul(t, 768, 19, 5, pool);
}

TEST(Matmul, ManyTokens513) {
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16}) check_matmul(t, 256, 24, 513, pool);
}

TEST(Matmul, SingleRowAndSingleBlockFewColumns) {
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : kTypes)
    for (int64_t m : {1, 2, 3, 4}) check_matmul(t, 256, 1, m, pool);  // every column-group width
}

TEST(Matmul, OddBlockCountLegacyTypes) {
  // 11 blocks of 32: the kernels' two-chain unrolling leaves a tail block.
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::IQ4_NL})
    for (int64_t m : {1, 2, 3}) check_matmul(t, 352, 13, m, pool);
}

TEST(GetRows, EveryTypeEveryIsa) {
  IsaGuard g;
  ThreadPool pool(3);
  const int64_t k = 256, n_rows = 11;
  const int32_t ids[] = {3, 0, 10, 3, 7};
  for (GgmlType t : kTypes) {
    const size_t rs = tensor::row_size(t, k);
    const auto w = make_weights(t, k, n_rows, rs, 9);
    std::vector<float> want(5 * k), got(5 * k);
    ref::get_rows(t, w.data(), rs, n_rows, k, ids, 5, want.data(), k);
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(set_isa(isa));
      get_rows(t, w.data(), rs, n_rows, k, ids, 5, got.data(), k, pool);
      EXPECT_EQ(got, want) << gguf::type_name(t) << " " << isa_name(isa);  // dequantization is exact
    }
  }
}
