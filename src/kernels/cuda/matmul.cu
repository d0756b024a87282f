// kernels/cuda/matmul.cu — the mat-mul launchers of cuda_ops.h: matmul, matmul_n, matmul_id,
//   get_rows (matmul_supported and the workspace sizes are in workspace.cpp, compiled in every build). matmul_n: one x for up to 4
//   weights (x quantized once per x order; m = 1: one segmented int8 launch per weight type).
// Owns: the choice of path. kMmqMinM..kMmqMaxM columns of a block type (k a multiple of 256, sm_80+,
//   KILN_CUDA_MMQ=0: off): the small-batch tensor-core mat-mul (mmq.cu). Else m <= 16 columns: the fused mat-vec kernels, 8 columns per pass, F32
//   sums — for the types of matvec_q8_supported x is first quantized to int8 per 32 values
//   (quantize_x, into the workspace) and the int8 kernel (matvec_q8.cuh) takes __dp4a sums; the other
//   types, or all with KILN_CUDA_MMV_F32X=1 (or set_matvec_x_mode), use the F32-x kernel (matvec.cuh).
//   On sm_90+ quantize_x and the int8 kernel use programmatic dependent launch (KILN_CUDA_PDL=0: off):
//   the int8 kernel requests its first weight bytes before the stream dependency on the kernels before
//   it is resolved, so W must not be written by the kernels just enqueued before (model weights are
//   constant; expert matrices are addressed only after the wait, their ids come from the router). m > 16 (prefill): tensor cores through cuBLAS — W rows dequantized to F16
//   in chunks of at most 64 MiB (F16 weights are used in place), X columns rounded to F16 in chunks
//   of at most 32 MiB, cublasGemmEx F16 x F16 -> F32 with F32 compute; F32 weights: F32 cublasGemmEx
//   on W and X in place. matmul_id: from kMmqIdMinSlots slots on, for the block types, the grouped
//   tensor-core mat-mul (mmq.cu mmq_id: slots sorted by expert on the device, each expert's matrix
//   read once per tile of up to 32 of its columns); else (decode, other types, --batch-invariant) the
//   mat-vec kernel once per (token, slot) with that slot's expert (the id read on the device). k must be a
//   multiple of 32 and of the type's block size (get_rows: of 8 and the block size). cuBLAS rounds
//   X to F16 on the tensor-core path: |x| above 65504 becomes inf there.
// Must not: allocate, synchronize or read device memory on the host (graph-capturable). cuBLAS is
//   called on L.blas, which the caller bound to L.stream (with its workspace set for capture).
// Threading: launchers are stateless and thread-safe; a Launch belongs to one stream.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/invariant.h"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/workspace.h"

namespace kiln::cuda {
namespace {

using detail::MvArgs;

[[noreturn]] void fail(const char* fn, const char* what, long long a = 0, long long b = 0) {
  std::fprintf(stderr, "kiln::cuda::%s: %s (%lld, %lld)\n", fn, what, a, b);
  std::abort();
}
#define KILN_MM_CHECK(cond, fn, what, a, b) \
  do {                                      \
    if (!(cond)) fail(fn, what, a, b);      \
  } while (0)

using detail::align256;
using detail::block_bytes;
using detail::gemm_plan;
using detail::GemmPlan;
using detail::kMvMaxM;

int64_t block_elems(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return 1;
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::IQ4_XS: return 256;
    default: return 32;
  }
}

std::atomic<int> g_x_mode{0};
std::atomic<int> g_pdl{-1}, g_bulk{-1}, g_tmap{-1}, g_mmq{-1};  // -1: from the environment
bool env_f32x() {
  static const bool on = detail::env_is("KILN_CUDA_MMV_F32X", "1");
  return on;
}
// A switch that is on for sm_`min_sm`+ unless set off by the setter (g) or by NAME=0 in the environment.
bool sm_switch(int sm, int min_sm, const std::atomic<int>& g, bool env_off) {
  const int p = g.load();
  return sm >= min_sm && (p == 1 || (p == -1 && !env_off));
}

void mv_q8(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s) {
  if (!detail::matvec_q8_kquant(t, a, n_grid_y, s) && !detail::matvec_q8_legacy(t, a, n_grid_y, s))
    fail("matmul", "no int8 mat-vec kernel for the weight type", int(t), 0);
}

void mv(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s) {
  if (!detail::matvec_kquant(t, a, n_grid_y, s) && !detail::matvec_legacy(t, a, n_grid_y, s) &&
      !detail::matvec_dense(t, a, n_grid_y, s))
    fail("matmul", "unsupported weight type", int(t), 0);
}

void launched(const char* fn) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kiln::cuda::%s: launch failed: %s\n", fn, cudaGetErrorString(e));
    std::abort();
  }
}

// X columns [k, mc] (x_stride floats apart) -> contiguous F16 [k, mc].
__global__ void x_to_half_kernel(const float* x, int64_t x_stride, int64_t k, int64_t total, __half* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i / k, e = i - c * k;
    out[i] = __float2half_rn(x[c * x_stride + e]);
  }
}

void gemm_ex(const Launch& L, int64_t nc, int64_t mc, int64_t k, const void* a, cudaDataType at, int64_t lda,
             const void* b, cudaDataType bt, int64_t ldb, float* c, int64_t ldc) {
  const float one = 1.f, zero = 0.f;
  const cublasStatus_t st = cublasGemmEx(L.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(nc), int(mc), int(k), &one, a, at,
                                         int(lda), b, bt, int(ldb), &zero, c, CUDA_R_32F, int(ldc),
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  KILN_MM_CHECK(st == CUBLAS_STATUS_SUCCESS, "matmul", "cublasGemmEx failed (status, rows)", int(st), nc);
}

void gemm(const Launch& L, GgmlType wt, const uint8_t* w, size_t w_stride, int64_t k, int64_t n, const float* x,
          int64_t x_stride, float* y, int64_t y_stride, int64_t m) {
  const GemmPlan p = gemm_plan(wt, k, n, m);
  KILN_MM_CHECK(L.blas != nullptr, "matmul", "no cuBLAS handle in the Launch", m, 0);
  KILN_MM_CHECK(L.ws_bytes >= p.bytes && (p.bytes == 0 || L.ws != nullptr), "matmul",
                "workspace smaller than matmul_workspace (have, need)", (long long)L.ws_bytes, (long long)p.bytes);
  KILN_MM_CHECK(k < INT_MAX && n < INT_MAX && m < INT_MAX && x_stride < INT_MAX && y_stride < INT_MAX &&
                    w_stride / 2 < INT_MAX, "matmul", "dimension too large for cuBLAS (k, n)", k, n);
  if (wt == GgmlType::F32) {
    KILN_MM_CHECK(w_stride % 4 == 0, "matmul", "F32 weight rows not 4-byte aligned", (long long)w_stride, 0);
    gemm_ex(L, n, m, k, w, CUDA_R_32F, int64_t(w_stride / 4), x, CUDA_R_32F, x_stride, y, y_stride);
    return;
  }
  __half* w16 = static_cast<__half*>(L.ws);
  __half* x16 = reinterpret_cast<__half*>(static_cast<uint8_t*>(L.ws) + p.w16_bytes);
  for (int64_t r0 = 0; r0 < n; r0 += p.nc) {
    const int64_t nc = std::min(p.nc, n - r0);
    const void* a = w + size_t(r0) * w_stride;
    int64_t lda = int64_t(w_stride / 2);
    if (p.w16) {
      detail::dequant_rows(wt, a, w_stride, k, nullptr, nc, w16, true, k, L.stream);
      a = w16;
      lda = k;
    } else {
      KILN_MM_CHECK(w_stride % 2 == 0, "matmul", "F16 weight rows not 2-byte aligned", (long long)w_stride, 0);
    }
    for (int64_t c0 = 0; c0 < m; c0 += p.mc) {
      const int64_t mc = std::min(p.mc, m - c0);
      if (p.mc < m || r0 == 0) {
        const int64_t total = k * mc;
        const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 4096));
        x_to_half_kernel<<<blocks, 256, 0, L.stream>>>(x + c0 * x_stride, x_stride, k, total, x16);
      }
      gemm_ex(L, nc, mc, k, a, CUDA_R_16F, lda, x16, CUDA_R_16F, k, y + r0 + c0 * y_stride, y_stride);
    }
  }
}

// k-split of the mat-vec kernel: whole rows per warp (ks = 1) when there are >= 24 row groups per SM,
// else 2 warps per group while that gives >= 12 warps per SM, else 4 (never more warps than the group
// has steps of 1024 elements). Measured on an H200 (132 SMs, test_cuda_matmul's bench): n = 248320
// is fastest at ks = 1, n = 12288 and n = 4096 (k = 4096 / 12288) at ks = 2.
int mv_ks(const Launch& L, int64_t k, int64_t n, int64_t n_grid_y) {
  const int64_t groups = (n + detail::kMvRowsPerCta - 1) / detail::kMvRowsPerCta * n_grid_y;
  const int64_t n_sm = L.n_sm > 0 ? L.n_sm : 132;
  int ks = groups >= 24 * n_sm ? 1 : (2 * groups >= 12 * n_sm ? 2 : 4);
  const int64_t nsteps = (k + 1023) / 1024;
  while (ks > 1 && ks > nsteps) ks /= 2;
  return ks;
}

}  // namespace

namespace detail {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
void set_matvec_x_mode(int mode) { g_x_mode.store(mode); }
void set_matvec_bulk(bool on) { g_bulk.store(on ? 1 : 0); }
bool matvec_bulk(int sm) {
  static const bool env_off = env_is("KILN_CUDA_MV_BULK", "0");
  return sm_switch(sm, 90, g_bulk, env_off);
}
void set_matvec_tmap(bool on) { g_tmap.store(on ? 1 : 0); }
bool matvec_tmap(int sm) {
  static const bool env_off = env_is("KILN_CUDA_MV_TMAP", "0");
  return matvec_bulk(sm) && sm_switch(sm, 90, g_tmap, env_off);
}
void set_matvec_pdl(bool on) { g_pdl.store(on ? 1 : 0); }
bool matvec_pdl(int sm) {
  static const bool env_off = env_is("KILN_CUDA_PDL", "0");
  return sm_switch(sm, 90, g_pdl, env_off);
}
void set_mmq(bool on) { g_mmq.store(on ? 1 : 0); }
bool mmq_on(int sm) {
  static const bool env_off = env_is("KILN_CUDA_MMQ", "0");
  return sm_switch(sm, 80, g_mmq, env_off);
}
bool pdl_all() {
  static const bool off = env_is("KILN_CUDA_PDL_ALL", "0");
  return !off;
}
bool matvec_uses_q8(GgmlType t) {
  const int mode = g_x_mode.load();
  return matvec_q8_supported(t) && (mode == 2 || (mode == 0 && !env_f32x()));
}
}  // namespace detail

void matmul(const Launch& L, GgmlType wt, const void* w, size_t w_stride, int64_t k, int64_t n, const float* x,
            int64_t x_stride, float* y, int64_t y_stride, int64_t m, const XProducer* pre) {
  KILN_MM_CHECK(matmul_supported(wt), "matmul", "unsupported weight type", int(wt), 0);
  const bool any_k = detail::gemm_any_k(wt, k, m);  // cuBLAS only (workspace.h)
  KILN_MM_CHECK(k > 0 && k % block_elems(wt) == 0 && (k % 32 == 0 || any_k), "matmul",
                "k must be a positive multiple of the block size and of 32 (of 8 for F32/F16/BF16 weights and more "
                "than 16 columns) (k, block)", k, block_elems(wt));
  KILN_MM_CHECK(n >= 0 && m >= 0, "matmul", "negative n or m", n, m);
  if (n == 0 || m == 0) return;
  KILN_MM_CHECK(w_stride >= size_t(k / block_elems(wt)) * block_bytes(wt), "matmul", "w_stride below the row size",
                (long long)w_stride, k);
  KILN_MM_CHECK(m == 1 || (x_stride >= k && y_stride >= n), "matmul", "column strides too small (x, y)", x_stride,
                y_stride);
  const bool inv = batch_invariant();  // every m on the mat-vec path (invariant.h)
  const bool q8 = (m <= kMvMaxM || inv) && detail::matvec_uses_q8(wt);
  const int layout = detail::matvec_q8_x_layout(wt);
  if (pre) {  // x made (and, for the int8 path, quantized in the weight's x order) by one kernel
    KILN_MM_CHECK(produce_ok(k, m), "matmul", "an x producer needs k <= kProduceMaxK and m <= 8 (k, m)", k, m);
    KILN_MM_CHECK(!q8 || (L.ws != nullptr && L.ws_bytes >= 2 * detail::q8_x_bytes(k, m)), "matmul",
                  "workspace smaller than matmul_workspace (have, need)", (long long)L.ws_bytes,
                  (long long)(2 * detail::q8_x_bytes(k, m)));
    detail::produce_x(*pre, const_cast<float*>(x), x_stride, k, m, q8 ? 1 << layout : 0, L.ws, L.sm,
                      detail::matvec_pdl(L.sm), L.stream);
  }
  if (!inv && m >= detail::kMmqMinM &&
      detail::mmq(L, wt, static_cast<const uint8_t*>(w), w_stride, k, n, x, x_stride, y, y_stride, m)) {
    launched("matmul");
    return;
  }
  if ((!inv || any_k) && m > kMvMaxM) {
    gemm(L, wt, static_cast<const uint8_t*>(w), w_stride, k, n, x, x_stride, y, y_stride, m);
    launched("matmul");
    return;
  }
  const int8_t* xq = nullptr;           // quantized x [m][k] in the workspace (int8 path)
  const detail::Q8Meta* xmeta = nullptr;  // its scales and half sums [m][k / 32]
  if (q8 && pre) {
    const auto* base = static_cast<const uint8_t*>(L.ws) + size_t(layout) * detail::q8_x_bytes(k, m);
    xq = reinterpret_cast<const int8_t*>(base);
    xmeta = reinterpret_cast<const detail::Q8Meta*>(base + detail::q8_x_meta_offset(k, m));
  } else if (q8) {
    xq = static_cast<const int8_t*>(L.ws);
    xmeta = reinterpret_cast<const detail::Q8Meta*>(static_cast<const uint8_t*>(L.ws) + detail::q8_x_meta_offset(k, m));
    const size_t need = detail::q8_x_bytes(k, m);
    KILN_MM_CHECK(L.ws != nullptr && L.ws_bytes >= need, "matmul",
                  "workspace smaller than matmul_workspace (have, need)", (long long)L.ws_bytes, (long long)need);
    detail::quantize_x(x, x_stride, 0, 1, k, m, detail::matvec_q8_x_layout(wt), L.ws, detail::matvec_pdl(L.sm),
                       L.stream);
  }
  for (int64_t c0 = 0; c0 < m; c0 += detail::kMvCols) {
    MvArgs a;
    a.w = w, a.w_stride = w_stride, a.k = k, a.n = n;
    a.x = x + c0 * x_stride, a.x_stride = x_stride, a.y = y + c0 * y_stride, a.y_stride = y_stride;
    a.m = int(std::min<int64_t>(detail::kMvCols, m - c0));
    a.xv = rows_vec16(a.x, a.m > 1 ? x_stride : 0, 0);
    a.ks = mv_ks(L, k, n, 1);
    if (q8) {
      a.xq = xq + c0 * k, a.xs = xmeta + c0 * (k / 32), a.pdl = detail::matvec_pdl(L.sm);
      a.bulk = detail::matvec_bulk(L.sm), a.tmap = detail::matvec_tmap(L.sm);
      mv_q8(wt, a, 1, L.stream);
    } else {
      mv(wt, a, 1, L.stream);
    }
  }
  launched("matmul");
}

void matmul_n(const Launch& L, const MatmulW* ws, int n_w, int64_t k, const float* x, int64_t x_stride, int64_t m,
              const XProducer* pre) {
  KILN_MM_CHECK(ws != nullptr && n_w >= 1 && n_w <= detail::kMvMaxSeg, "matmul_n", "1..4 weights (n_w, max)", n_w,
                detail::kMvMaxSeg);
  KILN_MM_CHECK(k > 0 && k % 32 == 0 && m >= 0, "matmul_n", "k must be a positive multiple of 32 (k, m)", k, m);
  for (int i = 0; i < n_w; ++i) {
    const MatmulW& W = ws[i];
    KILN_MM_CHECK(matmul_supported(W.wt), "matmul_n", "unsupported weight type (type, index)", int(W.wt), i);
    KILN_MM_CHECK(k % block_elems(W.wt) == 0, "matmul_n", "k not a multiple of the block size (k, block)", k,
                  block_elems(W.wt));
    KILN_MM_CHECK(W.n >= 0, "matmul_n", "negative n (n, index)", W.n, i);
    KILN_MM_CHECK(W.n == 0 || W.w_stride >= size_t(k / block_elems(W.wt)) * block_bytes(W.wt), "matmul_n",
                  "w_stride below the row size", (long long)W.w_stride, k);
    KILN_MM_CHECK(m <= 1 || (x_stride >= k && W.y_stride >= W.n), "matmul_n", "column strides too small (x, y)",
                  x_stride, W.y_stride);
  }
  if (m == 0) return;
  // With a producer: x first, quantized in every x order an int8 weight here reads (both regions).
  int pre_mask = 0;
  if (pre) {
    KILN_MM_CHECK(produce_ok(k, m), "matmul_n", "an x producer needs k <= kProduceMaxK and m <= 8 (k, m)", k, m);
    for (int i = 0; i < n_w; ++i)
      if (ws[i].n > 0 && detail::matvec_uses_q8(ws[i].wt)) pre_mask |= 1 << detail::matvec_q8_x_layout(ws[i].wt);
    KILN_MM_CHECK(pre_mask == 0 || (L.ws != nullptr && L.ws_bytes >= 2 * detail::q8_x_bytes(k, m)), "matmul_n",
                  "workspace smaller than matmul_workspace (have, need)", (long long)L.ws_bytes,
                  (long long)(2 * detail::q8_x_bytes(k, m)));
    detail::produce_x(*pre, const_cast<float*>(x), x_stride, k, m, pre_mask, L.ws, L.sm, detail::matvec_pdl(L.sm),
                      L.stream);
  }
  bool done[detail::kMvMaxSeg] = {};
  const bool inv = batch_invariant();  // invariant.h: per weight, every m on the mat-vec path
  // Large m (every weight), empty weights, the F32-x types and the small-batch mat-mul's weights: one
  // matmul each (on the mat-vec path the F32-x kernel reads no workspace, so the int8 weights'
  // quantized x below is not disturbed; the others run before it is made).
  for (int i = 0; i < n_w; ++i) {
    const MatmulW& W = ws[i];
    const bool mmq = !inv && m >= detail::kMmqMinM && detail::mmq_on(L.sm) && detail::mmq_plan(W.wt, k, W.n, m).ok;
    if (W.n == 0 || (m > kMvMaxM && !inv) || !detail::matvec_uses_q8(W.wt) || mmq) {
      if (W.n > 0) matmul(L, W.wt, W.w, W.w_stride, k, W.n, x, x_stride, W.y, W.y_stride, m);
      done[i] = true;
    }
  }
  const bool pdl = detail::matvec_pdl(L.sm);
  for (int i = 0; i < n_w; ++i) {
    if (done[i]) continue;
    // x quantized once for every remaining weight whose type reads x in this order.
    const int layout = detail::matvec_q8_x_layout(ws[i].wt);
    const uint8_t* base = static_cast<const uint8_t*>(L.ws);
    if (pre_mask & (1 << layout)) {
      base += size_t(layout) * detail::q8_x_bytes(k, m);  // quantized by produce_x above
    } else {
      const size_t need = detail::q8_x_bytes(k, m);
      KILN_MM_CHECK(L.ws != nullptr && L.ws_bytes >= need, "matmul_n",
                    "workspace smaller than matmul_workspace (have, need)", (long long)L.ws_bytes, (long long)need);
      detail::quantize_x(x, x_stride, 0, 1, k, m, layout, L.ws, pdl, L.stream);
    }
    const auto* xq = reinterpret_cast<const int8_t*>(base);
    const auto* xmeta = reinterpret_cast<const detail::Q8Meta*>(base + detail::q8_x_meta_offset(k, m));
    for (int j = i; j < n_w; ++j) {
      if (done[j] || detail::matvec_q8_x_layout(ws[j].wt) != layout) continue;
      // One launch for weight j and every later one of its type.
      const GgmlType t = ws[j].wt;
      int seg[detail::kMvMaxSeg], nseg = 0;
      int64_t rows = 0;
      for (int q = j; q < n_w; ++q)
        if (!done[q] && ws[q].wt == t) seg[nseg++] = q, rows += ws[q].n, done[q] = true;
      MvArgs a;
      a.k = k, a.x = x, a.x_stride = x_stride, a.xq = xq, a.xs = xmeta, a.pdl = pdl;
      a.bulk = detail::matvec_bulk(L.sm), a.tmap = detail::matvec_tmap(L.sm);
      if (m == 1 && !inv) {  // decode: one segmented launch (its own kernel instances, one column)
        a.w = ws[seg[0]].w, a.w_stride = ws[seg[0]].w_stride, a.n = ws[seg[0]].n, a.y = ws[seg[0]].y;
        a.y_stride = ws[seg[0]].y_stride, a.m = 1, a.xv = rows_vec16(x, 0, 0), a.ks = mv_ks(L, k, rows, 1);
        a.nseg = nseg;
        for (int e = 0; e < nseg; ++e) {
          const MatmulW& W = ws[seg[e]];
          a.seg[e].w = W.w, a.seg[e].w_stride = W.w_stride, a.seg[e].n = W.n;
          a.seg[e].y = W.y, a.seg[e].y_stride = W.y_stride;
        }
        mv_q8(t, a, 1, L.stream);
        continue;
      }
      // Several columns: the plain kernel per weight and pass of 8 columns, on the x quantized above.
      for (int e = 0; e < nseg; ++e) {
        const MatmulW& W = ws[seg[e]];
        for (int64_t c0 = 0; c0 < m; c0 += detail::kMvCols) {
          a.w = W.w, a.w_stride = W.w_stride, a.n = W.n;
          a.x = x + c0 * x_stride, a.y = W.y + c0 * W.y_stride, a.y_stride = W.y_stride;
          a.m = int(std::min<int64_t>(detail::kMvCols, m - c0));
          a.xv = rows_vec16(a.x, a.m > 1 ? x_stride : 0, 0);
          a.ks = mv_ks(L, k, W.n, 1);
          a.xq = xq + c0 * k, a.xs = xmeta + c0 * (k / 32);
          mv_q8(t, a, 1, L.stream);
        }
      }
    }
  }
  launched("matmul_n");
}

void matmul_id(const Launch& L, GgmlType wt, const void* w, size_t w_stride, size_t w_expert_stride, int64_t n_expert,
               int64_t k, int64_t n, const float* x, int64_t nx, int64_t x_slot, int64_t x_tok, const int32_t* ids,
               int64_t K, int64_t T, float* y, int64_t y_slot, int64_t y_tok) {
  KILN_MM_CHECK(matmul_supported(wt), "matmul_id", "unsupported weight type", int(wt), 0);
  KILN_MM_CHECK(k > 0 && k % block_elems(wt) == 0 && k % 32 == 0, "matmul_id",
                "k must be a positive multiple of the block size and of 32 (k, block)", k, block_elems(wt));
  KILN_MM_CHECK(nx == 1 || nx == K, "matmul_id", "nx must be 1 or K (nx, K)", nx, K);
  KILN_MM_CHECK(w_stride >= size_t(k / block_elems(wt)) * block_bytes(wt), "matmul_id",
                "w_stride below the row size", (long long)w_stride, k);
  if (n <= 0 || K <= 0 || T <= 0) return;
  const bool inv = batch_invariant();  // invariant.h: the k-split from (k, n) alone; no grouping
  if (!inv && detail::mmq_id(L, wt, static_cast<const uint8_t*>(w), w_stride, w_expert_stride, n_expert, k, n, x, nx,
                             x_slot, x_tok, ids, K, T, y, y_slot, y_tok)) {
    launched("matmul_id");
    return;
  }
  MvArgs a;
  a.w = w, a.w_stride = w_stride, a.k = k, a.n = n, a.x = x, a.y = y, a.m = 1;
  a.xv = rows_vec16(x, x_tok, nx == 1 ? 0 : x_slot);
  a.ids = ids, a.K = K, a.w_expert_stride = w_expert_stride;
  a.x_slot = x_slot, a.x_tok = x_tok, a.y_slot = y_slot, a.y_tok = y_tok, a.nx_one = nx == 1;
  const bool q8 = detail::matvec_uses_q8(wt);
  if (q8) {
    const int64_t ncols = T * nx;
    const size_t need = detail::q8_x_bytes(k, ncols);
    KILN_MM_CHECK(L.ws != nullptr && L.ws_bytes >= need, "matmul_id",
                  "workspace smaller than matmul_id_workspace (have, need)", (long long)L.ws_bytes, (long long)need);
    detail::quantize_x(x, x_tok, x_slot, nx, k, ncols, detail::matvec_q8_x_layout(wt), L.ws, detail::matvec_pdl(L.sm),
                       L.stream);
    a.pdl = detail::matvec_pdl(L.sm), a.bulk = detail::matvec_bulk(L.sm);
    a.xq = static_cast<const int8_t*>(L.ws);
    a.xs = static_cast<const uint8_t*>(L.ws) + detail::q8_x_meta_offset(k, ncols);
  }
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t s0 = 0; s0 < K * T; s0 += kMaxGridY) {
    a.slot0 = s0;
    a.ks = mv_ks(L, k, n, inv ? 1 : std::min(kMaxGridY, K * T - s0));
    if (q8) mv_q8(wt, a, int(std::min(kMaxGridY, K * T - s0)), L.stream);
    else mv(wt, a, int(std::min(kMaxGridY, K * T - s0)), L.stream);
  }
  launched("matmul_id");
}

void get_rows(const Launch& L, GgmlType t, const void* table, size_t row_stride, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride) {
  KILN_MM_CHECK(matmul_supported(t), "get_rows", "unsupported table type", int(t), 0);
  KILN_MM_CHECK(k > 0 && k % block_elems(t) == 0 && k % 8 == 0, "get_rows",
                "k must be a positive multiple of the block size and of 8 (k, block)", k, block_elems(t));
  if (n <= 0) return;
  detail::dequant_rows(t, table, row_stride, k, ids, n, out, false, out_stride, L.stream);
  launched("get_rows");
}

}  // namespace kiln::cuda
