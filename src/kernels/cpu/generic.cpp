// Generic (portable C++) entries of the CPU kernel table. Quantized weights take the float path
// (dequantize a row, then dot_f32); the integer dots live in the per-ISA files.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "tensor/dtype.h"

namespace kiln::kernels::cpu {
namespace {

// Dot of row `at` (element i is at(i)) with x: 8 lanes, then a fixed pairwise reduction (the SIMD
// paths sum the same way).
template <class At>
float dot8(At at, const float* x, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += at(i + j) * x[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += at(i) * x[i];
  return s;
}

float dot_f32_generic(const float* a, const float* b, int64_t n) {
  return dot8([a](int64_t i) { return a[i]; }, b, n);
}

void axpy_generic(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void scale_generic(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

float dot_row_f32(const void* w, const float* x, int64_t k) { return dot_f32_generic(static_cast<const float*>(w), x, k); }
// F16 / BF16 weight rows.
template <float (*to_f32)(uint16_t)>
float dot_row_16(const void* w, const float* x, int64_t k) {
  const auto* p = static_cast<const uint8_t*>(w);
  return dot8([p](int64_t i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return to_f32(h);
  }, x, k);
}
float dot_row_f16(const void* w, const float* x, int64_t k) { return dot_row_16<fp16_to_f32>(w, x, k); }
float dot_row_bf16(const void* w, const float* x, int64_t k) { return dot_row_16<bf16_to_f32>(w, x, k); }

void silu_generic(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}
void sigmoid_generic(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}
void swiglu_generic(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}
void sigmoid_mul_generic(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + std::exp(-b[i]));
}

}  // namespace

void fill_generic(Table& t) {
  // No quantize_act / vec_dot_q8 entries (they stay empty): quantized weights take the float path.
  t.isa = CpuIsa::Scalar;
  t.dot_f32 = dot_f32_generic;
  t.axpy = axpy_generic;
  t.scale = scale_generic;
  t.silu = silu_generic;
  t.sigmoid = sigmoid_generic;
  t.swiglu = swiglu_generic;
  t.sigmoid_mul = sigmoid_mul_generic;
  t.dot_row[type_index(GgmlType::F32)] = dot_row_f32;
  t.dot_row[type_index(GgmlType::F16)] = dot_row_f16;
  t.dot_row[type_index(GgmlType::BF16)] = dot_row_bf16;
  for (const auto& tr : tensor::all_dtype_traits()) {
    const int i = type_index(tr.type);
    if (i < kNumTypes && matmul_supported(tr.type)) t.to_f32[i] = tr.dequantize_row;
  }
}

}  // namespace kiln::kernels::cpu
