// Scalar emulations of ggml's AVX-512 arithmetic, shared by the test_ggml_*.cpp kernel tests (header
// only; not a test executable). Lanes are explicit arrays and every fused multiply-add is an explicit
// std::fma; a plain a * b + c must stay two roundings. That holds only where the including file is
// compiled without -mfma (tests/CMakeLists.txt builds every test with the project's default flags, no
// -mfma / -march): the guard below turns a build that would let the compiler contract a * b + c into
// a compile error instead of a silent change of the emulated order.
#pragma once

#if defined(__FMA__)
#error "ggml_emul.h must be compiled without -mfma: its emulations rely on a * b + c not being contracted"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"

namespace kiln::kernels::testing {

// ---- bit helpers ---------------------------------------------------------------------------------
inline uint32_t bits(float f) { return f32_to_bits(f); }
inline float h2f(uint16_t h) { return fp16_to_f32(h); }
inline uint16_t f2h(float f) { return f32_to_fp16(f); }
// An unaligned little-endian fp16 (a block's scale) read from p.
inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ---- reductions --------------------------------------------------------------------------------

// GCC's _mm512_reduce_add_ps: upper 256 + lower 256, upper 128 + lower 128, then lanes {2,3} + {0,1},
// then lane 0 + lane 1.
inline float reduce16(const float* v) {
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) u[i] = t[i + 4] + t[i];
  const float w0 = u[0] + u[2], w1 = u[1] + u[3];
  return w0 + w1;
}

// ggml's hsum_float_8 (kiln's hsum): upper 128 + lower 128, lanes {2,3} + {0,1}, lane 0 + lane 1.
inline float reduce8(const float* v) {
  float u[4];
  for (int i = 0; i < 4; ++i) u[i] = v[i] + v[i + 4];
  const float w0 = u[0] + u[2], w1 = u[1] + u[3];
  return w0 + w1;
}

// ---- exp ---------------------------------------------------------------------------------------

// ggml_v_expf / exp_ggml512 (AVX-512), one lane.
inline float exp_emul(float x) {
  const float shift = 0x1.8p23f;
  const float n = std::fma(x, 0x1.715476p+0f, shift) - shift;
  const float hi = std::fma(-n, 0x1.62e4p-1f, x);
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, hi);
  const float b2 = b * b;
  const float c45 = std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f);
  const float c23 = std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
  const float c01 = std::fma(0x1.ffffecp-1f, b, 1.0f);
  const float poly = std::fma(std::fma(c45, b2, c23), b2, c01);
  if (std::fabs(n) > 192.f) return n <= 0.f ? 0.f : INFINITY;
  return std::ldexp(poly, int(n));  // vscalefps: poly * 2^n, one rounding
}

// ---- dots --------------------------------------------------------------------------------------

// The main loop of ggml_vec_dot_f32 / ggml_vec_dot_f16 on AVX-512 (GGML_F32_STEP 64): over the first
// np = n & ~63 elements, four 16-lane fma chains (element i + 16 j + l into chain j, lane l), folded
// (0+2, 1+3, 0+1) lane-wise and reduced (reduce16). x, y: the operands as floats (exact).
inline float chains4_emul(const float* x, const float* y, int64_t np) {
  float c[4][16] = {};
  for (int64_t i = 0; i < np; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 16; ++l) c[j][l] = std::fma(x[i + 16 * j + l], y[i + 16 * j + l], c[j][l]);
  float f[16];
  for (int l = 0; l < 16; ++l) {
    const float a = c[0][l] + c[2][l], b = c[1][l] + c[3][l];
    f[l] = a + b;
  }
  return reduce16(f);
}

// ggml_vec_dot_f32 as GCC 12 compiles it for AVX-512 (-O3 -march=native, disassembled): n / 64 steps
// of four 16-lane fma chains, folded (0+2, 1+3, 0+1) lane-wise and reduced (reduce16); then the rest
// r = n % 64: its first r & ~7 products (whole 16s, then a whole 8: GCC's in-order vectorized tail)
// each rounded and added one at a time, the last r % 8 with an fma each.
inline float vec_dot_f32_emul(const float* x, const float* y, int64_t n) {
  const int64_t np = n & ~int64_t(63);
  float s = np > 0 ? chains4_emul(x, y, np) : 0.f;
  const int64_t r = n - np, plain = r & ~int64_t(7);
  for (int64_t i = 0; i < plain; ++i) {
    const float p = x[np + i] * y[np + i];
    s = s + p;
  }
  for (int64_t i = plain; i < r; ++i) s = std::fma(x[np + i], y[np + i], s);
  return s;
}

// ggml_vec_dot_f16 (dot_f16_ggml512) on operands already read as floats: the same chains and fold,
// the reduction and the n % 64 tail's rounded products summed in double.
inline float vec_dot_f16_emul(const float* x, const float* y, int64_t n) {
  const int64_t np = n & ~int64_t(63);
  double sum = double(chains4_emul(x, y, np));
  for (int64_t i = np; i < n; ++i) sum += double(x[i] * y[i]);
  return float(sum);
}

// ---- norms -------------------------------------------------------------------------------------

// ggml's rms_norm sum of squares: each x * x rounded to float, summed in double (ggml_float).
// exact (optional): the sum of the exact squares, in double (for the accuracy reference).
inline double sum_sq_emul(const float* x, int64_t n, double* exact = nullptr) {
  double sum = 0, sumd = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += double(x[i] * x[i]);
    sumd += double(x[i]) * x[i];
  }
  if (exact) *exact = sumd;
  return sum;
}

}  // namespace kiln::kernels::testing
