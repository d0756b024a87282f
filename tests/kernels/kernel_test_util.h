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
