// kernels/cuda/matmul_internal.h — what the mat-mul translation units share: the mat-vec kernel's
//   argument block and its per-type-family launchers (matvec_*.cu), called by matmul.cu.
// Owns: nothing but declarations. Must not: be included outside src/kernels/cuda.
// Threading: the launchers only enqueue on the given stream.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/types.h"

typedef struct CUstream_st* cudaStream_t;

namespace kiln::cuda::detail {

using gguf::GgmlType;

inline constexpr int kMvCols = 8;       // columns of X one mat-vec pass computes
inline constexpr int kMvRowsPerCta = 4;  // weight rows per CTA (matvec.cuh)

// One mat-vec pass: y[:, c] = W x[:, c] for c < m (m <= kMvCols). Expert mode (ids != nullptr): grid
// row s (+ slot0) is slot s = t*K + j of matmul_id: W = w + ids[s] * w_expert_stride, x column
// x + t*x_tok + (nx_one ? 0 : j*x_slot), y column y + t*y_tok + j*y_slot, m = 1.
struct MvArgs {
  const void* w = nullptr;
  size_t w_stride = 0;  // bytes between rows
  int64_t k = 0, n = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;  // floats between columns
  float* y = nullptr;
  int64_t y_stride = 0;
  int m = 1;
  int ks = 4;       // warps splitting one group of rows' k: 1, 2 or 4 (kMvWarps / ks groups per CTA)
  bool xv = false;  // x columns 16-byte aligned (float4 loads)
  const int32_t* ids = nullptr;
  int64_t K = 1, slot0 = 0;
  size_t w_expert_stride = 0;
  int64_t x_slot = 0, x_tok = 0, y_slot = 0, y_tok = 0;
  bool nx_one = true;
};

// Launch over n_grid_y grid rows (1, or the slots of this expert chunk). Each returns false when the
// type is not one of its family.
bool matvec_dense(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);   // F32 F16 BF16
bool matvec_legacy(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);  // Q4_0..Q8_0, IQ4_NL
bool matvec_kquant(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);  // Q2_K..Q6_K, IQ4_XS

// Rows of a weight / table of type t into F32 (half = false) or F16 (half = true) rows of k values:
// output row r (out + r * out_stride elements) = source row (ids ? ids[r] : r) of src (rows
// row_stride bytes apart), r < n_rows. F16 output: out 16-byte aligned, out_stride a multiple of 8.
void dequant_rows(GgmlType t, const void* src, size_t row_stride, int64_t k, const int32_t* ids, int64_t n_rows,
                  void* out, bool half, int64_t out_stride, cudaStream_t s);

}  // namespace kiln::cuda::detail
