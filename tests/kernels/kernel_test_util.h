// Shared helpers for the kernel tests (header only; not a test executable).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/ops.h"

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
