// Shared helpers for the kernel tests (header only; not a test executable).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "tensor/quant.h"

namespace kiln::kernels::testing {

// Normalised mean squared error, as llama.cpp's test-backend-ops: sum (a-b)^2 / sum b^2.
inline double nmse(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den == 0 ? num : num / den;
}
inline double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return nmse(got.data(), want.data(), std::min(got.size(), want.size()));
}

inline std::vector<float> randv(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Every matmul_supported weight type.
inline constexpr GgmlType kMatmulTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                            GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                            GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

// A 64-byte aligned workspace of n bytes (matmul / attention workspaces must be aligned).
struct AlignedWs {
  std::vector<uint8_t> buf;
  void* p = nullptr;
  explicit AlignedWs(size_t n) : buf(n + 64) {
    p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  }
};

// n weight rows of type t from the k * n floats f (row j: f[k * j, k * (j + 1))), `stride` bytes apart
// (0: tensor::row_size(t, k), rows packed): F32 rows copied, other types quantized by
// tensor::quantize_row. The bytes between rows (stride > row size) are `pad`.
inline std::vector<uint8_t> weight_rows(GgmlType t, const float* f, int64_t k, int64_t n, size_t stride = 0,
                                        uint8_t pad = 0) {
  if (stride == 0) stride = tensor::row_size(t, k);
  std::vector<uint8_t> w(stride * size_t(n), pad);
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* row = w.data() + stride * size_t(j);
    if (t == GgmlType::F32) std::memcpy(row, f + k * j, size_t(k) * 4);
    else tensor::quantize_row(t, f + k * j, row, k);
  }
  return w;
}

// The MatmulArgs of Y = W X: n weight rows of type t (k values each, w_stride bytes apart), m columns
// of X (x_stride floats apart) into m columns of Y (y_stride floats apart); expert: MatmulArgs::expert.
inline MatmulArgs matmul_args(GgmlType t, const void* w, size_t w_stride, int64_t k, int64_t n, int64_t m,
                              const float* x, int64_t x_stride, float* y, int64_t y_stride, bool expert = false) {
  return MatmulArgs{t, w, w_stride, k, n, m, x, x_stride, y, y_stride, expert};
}

// kernels::matmul(a) on pool with a fresh aligned workspace of matmul_workspace(a.wt, a.k, a.m, pool.size()).
inline void run_matmul(const MatmulArgs& a, ThreadPool& pool) {
  AlignedWs ws(matmul_workspace(a.wt, a.k, a.m, pool.size()));
  matmul(a, ws.p, pool);
}

// nc activation columns for the table's dot kernels (cpu::VecDotQ8Fn): column c is the k floats
// make_x(c) quantized by qa (cpu::Table::quantize_act of type at), the columns `stride` =
// act_bytes(at, k) + 64 bytes apart in a 64-byte aligned buffer.
struct ActColumns {
  size_t stride;
  AlignedWs buf;
  template <class MakeX>
  ActColumns(cpu::QuantizeActFn qa, GgmlType at, int64_t k, int nc, MakeX make_x)
      : stride(cpu::act_bytes(at, k) + 64), buf(stride * size_t(nc)) {
    for (int c = 0; c < nc; ++c) {
      const std::vector<float> x = make_x(c);
      qa(x.data(), k, col(c));
    }
  }
  uint8_t* col(int c) const { return static_cast<uint8_t*>(buf.p) + size_t(c) * stride; }
};

// Every ISA level this CPU supports (scalar always). Restores the selected level on destruction.
inline std::vector<CpuIsa> isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}
struct IsaGuard {
  CpuIsa saved = current_isa();
  ~IsaGuard() { set_isa(saved); }
};

}  // namespace kiln::kernels::testing

// Selects the AVX-512 table until the end of the enclosing scope (the test body; IsaGuard restores
// the level), or skips the test with "no AVX-512: " << why where the host lacks it.
#define KILN_REQUIRE_AVX512(why)                          \
  ::kiln::kernels::testing::IsaGuard kiln_isa_guard_;     \
  if (!::kiln::kernels::set_isa(::kiln::CpuIsa::Avx512)) \
    GTEST_SKIP() << "no AVX-512: " << why
