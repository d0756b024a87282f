// kernels/cuda/matmul_internal.h — what the mat-mul translation units share: the mat-vec kernel's
//   argument block and its per-type-family launchers (matvec_*.cu), called by matmul.cu.
// Owns: nothing but declarations. Must not: be included outside src/kernels/cuda.
// Threading: the launchers only enqueue on the given stream.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/types.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/workspace.h"  // Q8Meta, q8_x_bytes, matvec_q8_supported

typedef struct CUstream_st* cudaStream_t;

namespace kiln::cuda::detail {

using gguf::GgmlType;

// Whether the environment variable NAME is set to VALUE (the measurement and fallback switches).
bool env_is(const char* name, const char* value);

inline constexpr int kMvCols = 8;       // columns of X one mat-vec pass computes
inline constexpr int kMvRowsPerCta = 4;  // weight rows per CTA (matvec.cuh)
inline constexpr int kMvMaxSeg = 4;      // weights of one segmented int8 launch (matmul_n)

// One weight of a segmented int8 mat-vec launch: CTAs [cta0, next segment's cta0) compute y = W x
// for this weight's n rows (cta0 is filled by the launcher, mvq_launch).
struct MvSeg {
  const void* w = nullptr;
  size_t w_stride = 0;
  int64_t n = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  int64_t cta0 = 0;
};

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
  // int8-x kernel (matvec_q8.cuh) only: x quantized by quantize_x — xq [columns][k] int8, xs
  // [columns][k / 32] of {F32 scale bits, half sums} (Q8Meta); columns 0..m-1 of this pass (expert
  // mode: column nx_one ? t : slot).
  const int8_t* xq = nullptr;
  const void* xs = nullptr;
  bool pdl = false;  // launched with programmatic dependent launch (sm_90+; after quantize_x)
  bool bulk = false;  // stage the weights with bulk copies (tensor memory accelerator, sm_90+)
  bool tmap = false;  // bulk, one column, no experts: one tensor-map box per step where the rows allow
  // int8-x kernel only, m = 1, not with expert mode: nseg > 0 replaces w / w_stride / n / y /
  // y_stride by seg[0..nseg) (all of the launch's weight type, all with the same x), CTAs mapped to
  // segments in order (matmul_n: one launch for several weights).
  int nseg = 0;
  MvSeg seg[kMvMaxSeg];
};

// A 2-D tensor map of rows of 8-byte elements for the bulk int8 mat-vec's copies (one box = box_cols
// elements of box_rows rows): base and stride 16-byte aligned, box_cols * 8 a multiple of 16. Encoded
// once per distinct argument set and kept for the process (a host-side cache; the pointer is stable);
// nullptr when the driver refuses it (the per-row copies are used then). Any thread.
const void* mv_tensor_map(const void* base, uint64_t row_elems, uint64_t rows, uint64_t stride_bytes, uint32_t box_cols,
                          uint32_t box_rows);

// Launch over n_grid_y grid rows (1, or the slots of this expert chunk). Each returns false when the
// type is not one of its family.
bool matvec_dense(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);   // F32 F16 BF16
bool matvec_legacy(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);  // Q4_0..Q8_0, IQ4_NL
bool matvec_kquant(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);  // Q2_K..Q6_K, IQ4_XS

// ---- the int8-x mat-vec (matvec_q8.cuh, matvec_q8_*.cu) ----------------------------------------
int matvec_q8_x_layout(GgmlType t);    // the x order the type's codes use (dequant_q8.cuh kX)
bool matvec_q8_legacy(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);  // Q4_0..Q8_0, IQ4_NL
bool matvec_q8_kquant(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s);  // Q4_K Q5_K Q6_K IQ4_XS
// Quantizes ncols columns of k floats (column c at x + (c / nx) * s_outer + (c % nx) * s_inner) per
// 32 values: d = max|x| / 127, q = round(x / d) (round half to even of x * (127 / max|x|)), in the
// given x order; ws 16-byte aligned.
// pdl: launched with programmatic dependent launch (the kernel waits for its predecessor's results
// before touching memory and lets the mat-vec kernel after it start its weight prefetch early).
void quantize_x(const float* x, int64_t s_outer, int64_t s_inner, int64_t nx, int64_t k, int64_t ncols, int layout,
                void* ws, bool pdl, cudaStream_t s);
// Runs *pre (cuda_ops.h XProducer), writing its output x (m columns of k floats, column c at
// x + c * x_stride), and for each x order L in `mask` (bit L) quantizes x as quantize_x does into
// ws + L * q8_x_bytes(k, m) (the same bytes quantize_x would write). produce_ok(k, m) must hold.
// sm: the device's compute capability * 10 + minor (sm_90+: add_rms_norm over a cluster of blocks).
void produce_x(const XProducer& pre, float* x, int64_t x_stride, int64_t k, int64_t m, int mask, void* ws, int sm,
               bool pdl, cudaStream_t s);
// Which x the mat-vec path uses: 0 = the default (int8 x for the types above, unless the environment
// has KILN_CUDA_MMV_F32X=1), 1 = F32 x always, 2 = int8 x where supported. For tests and fidelity
// comparisons; not meant to change while launches are being enqueued on other threads.
void set_matvec_x_mode(int mode);
// Programmatic dependent launch of quantize_x and the int8 kernel on sm_90+: on unless the
// environment has KILN_CUDA_PDL=0 or set_matvec_pdl(false) (tests, timing comparisons).
void set_matvec_pdl(bool on);
bool matvec_pdl(int sm);
// Bulk-copy staging of the int8 kernel's weights (matvec_q8.cuh BULK) on sm_90+: on unless the
// environment has KILN_CUDA_MV_BULK=0 or set_matvec_bulk(false) (tests, timing comparisons).
void set_matvec_bulk(bool on);
bool matvec_bulk(int sm);
// Whether one-column bulk launches take tensor-map copies where the rows allow (MvArgs::tmap): with
// bulk copies, unless the environment has KILN_CUDA_MV_TMAP=0 or set_matvec_tmap(false).
void set_matvec_tmap(bool on);
bool matvec_tmap(int sm);
bool matvec_uses_q8(GgmlType t);  // whether matmul's / matmul_id's mat-vec path takes int8 x for t now

// The small-batch quantized mat-mul (mmq.cu): y = W x for kMmqMinM..kMmqMaxM columns when
// mmq_plan(t, k, n, m).ok, the device is sm_80+ and the switch is on; false (nothing enqueued)
// otherwise. Uses the workspace as mmq_plan lays it out.
bool mmq(const Launch& L, GgmlType t, const uint8_t* w, size_t w_stride, int64_t k, int64_t n, const float* x,
         int64_t x_stride, float* y, int64_t y_stride, int64_t m);
// The grouped expert mat-mul (mmq.cu; matmul_id's arguments, see cuda_ops.h): when mmq_id_plan(t, k,
// n, K * T).ok, n_expert <= kMmqIdMaxExperts and the small-batch mat-mul is on; false (nothing
// enqueued) otherwise. Each column's sums are those of one mmq column (F16 x, F32 accumulation).
bool mmq_id(const Launch& L, GgmlType t, const uint8_t* w, size_t w_stride, size_t w_estride, int64_t n_expert,
            int64_t k, int64_t n, const float* x, int64_t nx, int64_t x_slot, int64_t x_tok, const int32_t* ids,
            int64_t K, int64_t T, float* y, int64_t y_slot, int64_t y_tok);
// On for sm_80+ unless the environment has KILN_CUDA_MMQ=0 or set_mmq(false) (tests, comparisons).
void set_mmq(bool on);
bool mmq_on(int sm);

// Rows of a weight / table of type t into F32 (half = false) or F16 (half = true) rows of k values:
// output row r (out + r * out_stride elements) = source row (ids ? ids[r] : r) of src (rows
// row_stride bytes apart), r < n_rows. F16 output: out 16-byte aligned, out_stride a multiple of 8.
void dequant_rows(GgmlType t, const void* src, size_t row_stride, int64_t k, const int32_t* ids, int64_t n_rows,
                  void* out, bool half, int64_t out_stride, cudaStream_t s);

}  // namespace kiln::cuda::detail
