// tensor/dtype.h — the dtype traits table: one row per tensor type with reference code.
// Owns: for each supported GgmlType its geometry, bits per weight, the reference row
//   quantize/dequantize functions and the activation ("vec_dot") type a mat-vec kernel
//   quantizes the input vector to before taking dot products with rows of this type.
// Must not: hold kernels; kernels/ builds its own dispatch tables from this one.
// Threading: the table is immutable; every function here is pure and thread-safe.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

#include "gguf/types.h"

namespace kiln::tensor {

using gguf::GgmlType;

// Row functions: n elements (a multiple of block_size), src/dst sized by row_size.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

struct DTypeTraits {
  GgmlType type;
  std::string_view name;      // GGUF spelling, e.g. "Q4_K"
  uint32_t block_size;        // elements per block
  uint32_t type_size;         // bytes per block
  double bits_per_weight;     // 8 * type_size / block_size
  // Activation type for mat-vec / mat-mul against weights of this type:
  //   F32 -> F32, F16 -> F16, BF16 -> BF16 (dot in float),
  //   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL -> Q8_0, Q2_K..Q6_K IQ4_XS Q8_K -> Q8_K.
  GgmlType vec_dot_type;
  DequantizeRowFn dequantize_row;
  QuantizeRowFn quantize_row;
};

// nullptr when t has no reference implementation here (see has_reference in tensor/quant.h).
const DTypeTraits* dtype_traits(GgmlType t);

// All rows, in ggml type-id order.
std::span<const DTypeTraits> all_dtype_traits();

}  // namespace kiln::tensor
