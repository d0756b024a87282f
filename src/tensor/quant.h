// tensor/quant.h — reference (scalar) quantization and dequantization for every supported
// GGUF tensor type. These are the oracles the SIMD/CUDA kernels are tested against.
// Owns: row-level quantize/dequantize entry points; block structs live in tensor/blocks.h.
// Must not: be used on hot paths where a kernel exists (they are plain scalar code).
// Threading: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/result.h"
#include "gguf/types.h"

namespace kiln::tensor {

using gguf::GgmlType;

// True for the types with reference quantize + dequantize here:
// F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS Q8_K.
bool has_reference(GgmlType t);

// Bytes for n elements of type t (n must be a multiple of the block size).
size_t row_size(GgmlType t, int64_t n);

// dst: n floats. src: row_size(t, n) bytes. n % block_size == 0 (checked).
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// dst: row_size(t, n) bytes. src: n floats. n % block_size == 0 (checked).
// Round-to-nearest with each format's scale search; blocks are valid for llama.cpp.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace kiln::tensor
