// kernels/cpu/dispatch.h — the CPU kernel table: one set of function pointers per ISA level
//   (generic -> AVX2 -> AVX-512), filled once; the ops in kernels/cpu/{matmul,attention,delta,ops}.cpp call through it.
// Owns: the activation formats of the integer mat-vec paths (ggml's Q8_0/Q8_1/Q8_K) and the table layout.
// Must not: be included outside src/kernels (it is an implementation detail of ops.h).
// Threading: tables are immutable after construction; set_isa() swaps a pointer (tests only).
//
// Activations of the integer mat-vec paths: one column of k elements is quantized exactly as
// ggml's x86 CPU backend quantizes it for the weight type's vec_dot_type, into ggml's own block
// layout (act_bytes(at, k) bytes per column, 64-aligned):
//   Q8_0 (Q4_0 Q5_0 Q8_0 IQ4_NL weights): per 32, {fp16 d, int8 qs[32]}, d = fp16(amax/127),
//        qs = round-half-even(x * (127/amax))            (quantize_row_q8_0, AVX2 path)
//   Q8_1 (Q4_1 Q5_1 weights): per 32, {fp16 d, fp16 s, int8 qs[32]}, as Q8_0 and
//        s = fp16(float(amax/127) * sum(qs))              (quantize_row_q8_1, AVX2 path)
//   Q8_K (K-quants, IQ4_XS): per 256, tensor/blocks.h BlockQ8_K (quantize_row_q8_K_ref, which
//        ggml's x86 backend uses too).
// Each weight block then contributes ggml's per-block formula (d_w*d_x*isum, + m_w*s_x for Q8_1;
// super-block d*sumi + dmin*sum(mins*bsums) for Q8_K), accumulated in float.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/cpu_features.h"
#include "gguf/types.h"
#include "tensor/dtype.h"

namespace kiln::kernels::cpu {

inline constexpr int kNumTypes = 40;  // > largest GgmlType id we handle
// The activation type ggml's CPU backend uses for weights of type w (its vec_dot_type, from
// tensor/dtype.h) when that is an 8-bit integer format; else F32 (float weights: dots in float).
inline gguf::GgmlType act_type(gguf::GgmlType w) {
  using T = gguf::GgmlType;
  const tensor::DTypeTraits* tr = tensor::dtype_traits(w);
  const T vt = tr ? tr->vec_dot_type : T::F32;
  return vt == T::Q8_0 || vt == T::Q8_1 || vt == T::Q8_K ? vt : T::F32;
}
// Bytes of one quantized activation column (0 for F32: the float paths need none).
inline size_t act_bytes(gguf::GgmlType at, int64_t k) {
  using T = gguf::GgmlType;
  const size_t b = at == T::Q8_0 ? size_t(k / 32) * 34 : at == T::Q8_1 ? size_t(k / 32) * 36
                   : at == T::Q8_K ? size_t(k / 256) * 292 : 0;
  return (b + 63) & ~size_t(63);
}

// x: k floats -> one activation column of the table slot's type (Q8_0 / Q8_1 / Q8_K).
using QuantizeActFn = void (*)(const float* x, int64_t k, void* act);
// Dots of one weight row (k elements of the table's type) with nc (1..kMaxCols) activation
// columns (of act_type(type)) at act + c*act_stride: out[c] = row . column c.
inline constexpr int kMaxCols = 4;
using VecDotQ8Fn = void (*)(int64_t k, const void* w_row, const void* act, size_t act_stride, int nc, float* out);
// Dots of 8 consecutive weight rows (at w + r*w_stride) with one activation column: out[r] = the
// bits of vec_dot_q8's nc = 1 result for row r.
using VecDotQ8RowsFn = void (*)(int64_t k, const void* w, size_t w_stride, const void* act, float* out);
// The same for nc (2..kMaxCols) columns at act + c*act_stride: out[c*out_stride + r] = the bits of
// vec_dot_q8's nc = 1 result for row r and column c (the rows' codes decoded once for every column).
using VecDotQ8RowsColsFn = void (*)(int64_t k, const void* w, size_t w_stride, const void* act, size_t act_stride,
                                    int nc, float* out, int64_t out_stride);
// Dot of one F32/F16/BF16 row with F32 x.
using DotRowFn = float (*)(const void* w_row, const float* x, int64_t k);
using ToF32Fn = void (*)(const void* src, float* dst, int64_t n);
using DotF32Fn = float (*)(const float* a, const float* b, int64_t n);
using AxpyFn = void (*)(float a, const float* x, float* y, int64_t n);  // y += a * x
using ScaleFn = void (*)(float* y, float a, int64_t n);                  // y *= a
using UnaryFn = void (*)(const float* x, float* y, int64_t n);
using BinaryFn = void (*)(const float* a, const float* b, float* y, int64_t n);
// ggml's F32/F16/BF16 mat-mul (AVX-512 tables only): y[c*y_stride + r] = (weight row at w + r*w_stride)
// . (activation column at act + c*act_stride bytes) for r < nr <= 4, c < nc <= 4. The columns hold the
// weight type's ggml vec_dot_type (F32, F16, BF16: see ggml_float_act). rows4: the weight has a
// multiple of 4 rows; the kernel then takes llamafile's tinyBLAS order when k is a multiple of its
// vector step, else ggml_vec_dot_* order (x86_kernels.inc).
using FloatMmFn = void (*)(int64_t k, const void* w, size_t w_stride, int nr, const void* act, size_t act_stride, int nc,
                           bool rows4, float* y, int64_t y_stride);

// The many-column ("tile") quantized mat-mul (x86 tables: kernels/cpu/tile_avx512.cpp,
// tile_avx2.cpp): 16 weight rows decoded once, then multiplied with every column; each output has
// the bits of the table's vec_dot_q8 entry for the type (weights with a multiple of 8 rows, not experts).
inline constexpr int kTileRows = 16;
struct TileMmArgs {
  int64_t k = 0;
  const uint8_t* w = nullptr;  // the tile's first row; rows w_stride bytes apart
  size_t w_stride = 0;
  int nr = 0;                   // rows in this tile (1..kTileRows)
  const uint8_t* act = nullptr;  // m quantized activation columns (act_type), act_stride bytes apart
  size_t act_stride = 0;
  const uint8_t* side = nullptr;  // their side data (Table::tile_side), side_stride bytes apart
  size_t side_stride = 0;
  int64_t m = 0;
  float* y = nullptr;  // y[c*y_stride + r]: row r of the tile, column c
  int64_t y_stride = 0;
  void* scratch = nullptr;  // tile_scratch_bytes(k), 64-aligned
};
using TileMmFn = void (*)(const TileMmArgs& a);
// One column's side data (tile_side_bytes(w, k)) from its quantized activation.
using TileSideFn = void (*)(int64_t k, const void* act, void* side);
inline size_t tile_side_bytes(gguf::GgmlType w, int64_t k) {
  using T = gguf::GgmlType;
  const size_t b = w == T::Q8_0 ? size_t(k / 32) * 36
                   : w == T::Q4_1 || act_type(w) == T::Q8_0 ? size_t(k / 32) * 8
                   : act_type(w) == T::Q8_K ? size_t(k / 256) * 64 : 0;
  return (b + 63) & ~size_t(63);
}
// Decoded tile of 16 rows: at most 24 bytes per element of a row (Q6_K: 22.5).
inline size_t tile_scratch_bytes(int64_t k) { return size_t(k) * 24 + 64; }

// The gated delta rule's recurrence for state rows [j0, j1) of one head over n_t tokens (AVX-512
// tables: Table::ggml_delta_rows, kernels/cpu/delta_avx512.cpp). Per token t and row j, in order:
// row *= decay[t]; dj = (v_t[j] - ggml_dot_f32(row, k_t)) * beta[t]; row += dj * k_t (axpy);
// out_t[j] = ggml_dot_f32(row, q_t) * qscale — the bits of kernels::gated_delta_rule's table path.
// q, k, v, out point at the head's first element of token 0; the state row j at st + j*S.
struct DeltaRowsArgs {
  float* st = nullptr;
  int64_t S = 0, j0 = 0, j1 = 0, n_t = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  int64_t qk_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* decay = nullptr;  // [n_t] e^g
  const float* beta = nullptr;   // [n_t]
  float* out = nullptr;
  int64_t out_stride = 0;
  float qscale = 1;
  float* const* keep = nullptr;  // [n_t] or nullptr: after token t, rows j0..j1 also to keep[t] + keep_off
  int64_t keep_off = 0;          //   (when keep[t] is not null)
};
using DeltaRowsFn = void (*)(const DeltaRowsArgs& a);

struct Table {
  CpuIsa isa = CpuIsa::Scalar;
  QuantizeActFn quantize_act[kNumTypes] = {};  // indexed by activation type
  VecDotQ8Fn vec_dot_q8[kNumTypes] = {};  // nullptr: dequantize the row and use dot_f32
  // Replaces vec_dot_q8 for a weight matrix whose row count is not a multiple of 8: llama.cpp
  // repacks only such multiples and runs another kernel (another order) on the rest. nullptr: none.
  VecDotQ8Fn vec_dot_q8_rows_not8[kNumTypes] = {};
  // Replaces vec_dot_q8 (for a multiple of 8 rows) for one expert of a stacked expert tensor
  // (llama.cpp's MUL_MAT_ID runs another kernel there). nullptr: none.
  VecDotQ8Fn vec_dot_q8_expert[kNumTypes] = {};
  // vec_dot_q8 (the entry for a multiple of 8 rows) for 8 rows x 1 column at once (out[0..7]),
  // where that is faster (one column: decode). nullptr: none.
  VecDotQ8RowsFn vec_dot_q8_r8[kNumTypes] = {};
  // vec_dot_q8_r8 for 2..kMaxCols columns (where vec_dot_q8_r8 is set; nullptr: none).
  VecDotQ8RowsColsFn vec_dot_q8_r8_cols[kNumTypes] = {};
  // The tile mat-mul and its column side data, by weight type (nullptr: none).
  TileMmFn tile_mm[kNumTypes] = {};
  TileSideFn tile_side[kNumTypes] = {};
  DotRowFn dot_row[kNumTypes] = {};       // F32 / F16 / BF16 only
  ToF32Fn to_f32[kNumTypes] = {};         // every matmul_supported type
  DotF32Fn dot_f32 = nullptr;
  AxpyFn axpy = nullptr;
  ScaleFn scale = nullptr;
  UnaryFn silu = nullptr, sigmoid = nullptr;
  BinaryFn swiglu = nullptr, sigmoid_mul = nullptr;  // silu(a) * b, a * sigmoid(b)
  // ggml's AVX-512 float paths for the "ggml" attention order (AVX-512 tables only; x86_kernels.inc).
  float (*ggml_dot_f16)(const uint16_t* x, const uint16_t* y, int64_t n, bool tiny) = nullptr;
  double (*ggml_softmax_exp)(const float* x, float max, float* y, int64_t n) = nullptr;
  void (*ggml_kqv)(const uint8_t* v, size_t pos_stride, const float* p, int64_t n, int64_t D, bool tiny, float* acc,
                   float* out) = nullptr;
  // ggml_vec_dot_f32's AVX-512 order (the gated delta rule's dots).
  float (*ggml_dot_f32)(const float* x, const float* y, int64_t n) = nullptr;
  // The fused recurrence above for S = 64, 128, 256 (index 0, 1, 2); nullptr: none.
  DeltaRowsFn ggml_delta_rows[3] = {};
  // ggml's ssm_conv for 16 channels: y[c] = fma chain over taps j < K of win[j*16 + c] * w[j*16 + c], from 0.
  void (*ggml_conv_taps16)(const float* win, const float* w, int K, float* y) = nullptr;
  // ggml_conv_taps16 and the table's silu (ggml's: lane-wise on whole 16s) for 16 channels over n_t
  // tokens, the window in registers: x_t / y_t at x + t*xs / y + t*ys (y may be x), w: K rows of 16
  // taps, win: the K-1 oldest inputs, rows of 16 (updated). The bits of the per-token calls.
  void (*ggml_conv_silu16)(const float* x, int64_t xs, const float* w, float* win, float* y, int64_t ys, int64_t n_t,
                           int K) = nullptr;
  // ggml's float mat-mul: by weight type (F32 F16 BF16). ggml_float_act rounds one X column of k
  // floats to F16 / BF16 (nullptr for F32: X is used as it is).
  FloatMmFn ggml_float_mm[kNumTypes] = {};
  QuantizeActFn ggml_float_act[kNumTypes] = {};
  // ggml's flash attention (AVX-512 tables only): the 64 scores of one query against a key tile stored
  // transposed, kt[d*64 + j]: s[j] = one FMA chain over d of q[d]*kt[d*64+j] (simd_gemm's order).
  void (*ggml_fa_scores)(const float* q, const float* kt, int64_t D, float* s) = nullptr;
  // The tiled order's acc += p[j] * v_j for j < nb (v_j = v + j*D, D % 16 == 0): Table::axpy's bits
  // key by key, the accumulator kept in registers (kernels/cpu/attention_avx512.cpp).
  void (*ggml_fa_pv)(const float* p, const float* v, int nb, int64_t D, float* acc) = nullptr;
  // F16 accumulators (x86 tables): y = f16(fma(f32(x), a, f32(y))); y = f16(f32(y) * a). n % 16 == 0.
  void (*mad_f16)(uint16_t* y, const uint16_t* x, float a, int64_t n) = nullptr;
  void (*scale_f16)(uint16_t* y, float a, int64_t n) = nullptr;
};

const Table& table();             // the current table
const Table* table_for(CpuIsa isa);  // nullptr if the CPU lacks it

// Per-ISA fillers (each defined in its own translation unit with its own compile flags).
void fill_generic(Table& t);
void fill_avx2(Table& t);
void fill_avx512(Table& t);
void fill_tile_avx512(Table& t);
void fill_tile_avx2(Table& t);
void fill_delta_avx512(Table& t);
void fill_attention_avx512(Table& t);

inline int type_index(gguf::GgmlType t) { return int(t); }

}  // namespace kiln::kernels::cpu
