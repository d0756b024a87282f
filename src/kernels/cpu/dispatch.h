// kernels/cpu/dispatch.h — the CPU kernel table: one set of function pointers per ISA level
//   (generic -> AVX2 -> AVX-512), filled once; the ops in kernels/cpu/ops.cpp call through it.
// Owns: the activation format of the integer mat-vec paths ("Q8A") and the table layout.
// Must not: be included outside src/kernels (it is an implementation detail of ops.h).
// Threading: tables are immutable after construction; set_isa() swaps a pointer (tests only).
//
// Q8A activations, one column of k elements (k % 32 == 0), act_bytes(k) bytes, 64-aligned:
//   int8  qs[k]           x[i] ~= d[i/32] * qs[i], qs in -127..127
//   float d[k/32]         per-32 scale (amax / 127)
//   float s[k/32]         d * sum(qs of the block)  (for the offset/min terms)
// One format serves every quantized weight type: 32-element legacy blocks, and the 16/32-element
// sub-blocks of the K-quants / IQ4_XS (a per-32 activation scale is finer than ggml's Q8_K).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/cpu_features.h"
#include "gguf/types.h"

namespace kiln::kernels::cpu {

inline constexpr int kNumTypes = 40;  // > largest GgmlType id we handle
inline size_t act_bytes(int64_t k) { return (size_t(k) + size_t(k / 32) * 8 + 63) & ~size_t(63); }
inline const int8_t* act_qs(const void* a) { return static_cast<const int8_t*>(a); }
inline const float* act_d(const void* a, int64_t k) { return reinterpret_cast<const float*>(static_cast<const int8_t*>(a) + k); }
inline const float* act_s(const void* a, int64_t k) { return act_d(a, k) + k / 32; }

using QuantizeActFn = void (*)(const float* x, int64_t k, void* act);
// Dots of one weight row (k elements of the table's type) with nc (1..kMaxCols) Q8A columns at
// act + c*act_stride: out[c] = row . column c.
inline constexpr int kMaxCols = 4;
using VecDotQ8Fn = void (*)(int64_t k, const void* w_row, const void* act, size_t act_stride, int nc, float* out);
// Dot of one F32/F16/BF16 row with F32 x.
using DotRowFn = float (*)(const void* w_row, const float* x, int64_t k);
using ToF32Fn = void (*)(const void* src, float* dst, int64_t n);
using DotF32Fn = float (*)(const float* a, const float* b, int64_t n);
using AxpyFn = void (*)(float a, const float* x, float* y, int64_t n);  // y += a * x
using ScaleFn = void (*)(float* y, float a, int64_t n);                  // y *= a
using UnaryFn = void (*)(const float* x, float* y, int64_t n);
using BinaryFn = void (*)(const float* a, const float* b, float* y, int64_t n);

struct Table {
  CpuIsa isa = CpuIsa::Scalar;
  QuantizeActFn quantize_act = nullptr;
  VecDotQ8Fn vec_dot_q8[kNumTypes] = {};  // nullptr: dequantize the row and use dot_f32
  DotRowFn dot_row[kNumTypes] = {};       // F32 / F16 / BF16 only
  ToF32Fn to_f32[kNumTypes] = {};         // every matmul_supported type
  DotF32Fn dot_f32 = nullptr;
  AxpyFn axpy = nullptr;
  ScaleFn scale = nullptr;
  UnaryFn silu = nullptr, sigmoid = nullptr;
  BinaryFn swiglu = nullptr, sigmoid_mul = nullptr;  // silu(a) * b, a * sigmoid(b)
};

const Table& table();             // the current table
const Table* table_for(CpuIsa isa);  // nullptr if the CPU lacks it

// Per-ISA fillers (each defined in its own translation unit with its own compile flags).
void fill_generic(Table& t);
void fill_avx2(Table& t);
void fill_avx512(Table& t);

inline int type_index(gguf::GgmlType t) { return int(t); }

}  // namespace kiln::kernels::cpu
