// kernels/cuda/fused.cu — the fused elementwise launchers of cuda_ops.h: delta_gates, rms_norm_gated,
//   add_rms_norm. Each is ONE kernel doing what backend::Stream's comment spells as a sequence of ops
//   (decode runs ~1000 small kernels per token; every launch saved counts).
// Owns: the GPU arithmetic of these fused ops. Row sums in F32 as elementwise.cu's norms: each thread
//   over a strided slice of its row, then a fixed warp / block tree (deterministic for a shape).
// Must not: allocate, synchronize, or read device memory on the host. Launchers only enqueue on
//   L.stream (graph-capturable); argument errors are KILN_CHECK failures before anything is enqueued.
// Threading: launchers are stateless and thread-safe.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/row_common.cuh"

namespace kiln::cuda {
namespace {


// ---- delta_gates: x over ne0 (grid-stride), y over rows (grid-stride) ----------------------------
__global__ void delta_gates_kernel(Rows beta, Rows g, const float* __restrict__ dt_bias, const float* __restrict__ a) {
  const int64_t nr = beta.n1 * beta.n2;
  for (int64_t r = blockIdx.y; r < nr; r += gridDim.y) {
    float* br = row_mut(beta, r);
    float* gr = row_mut(g, r);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < beta.ne0; i += int64_t(gridDim.x) * blockDim.x) {
      br[i] = sigmoidf_(br[i]);
      gr[i] = softplusf_(gr[i] + dt_bias[i]) * a[i];
    }
  }
}

// ---- row norms: KILN_LAUNCH_ROWS forms (row_common.cuh) ----------------------------------------
// x = x * (1/sqrt(mean(x^2) + eps)) * w * silu(z).
template <int NV, bool WARP>
__global__ void __launch_bounds__(kRowThreads) rms_norm_gated_kernel(Rows x, const float* __restrict__ w, Rows z, float eps, float inv_n) {
  pdl::begin();  // pdl.cuh: nothing global before this
  __shared__ float red[32];
  const int64_t nr = x.n1 * x.n2;
  const int64_t r = WARP ? int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5) : int64_t(blockIdx.x);
  if (r >= nr) return;  // whole warps (WARP) or whole blocks exit together
  float* xr = row_mut(x, r);
  const float* zr = row_mut(z, r);
  const int64_t i0 = WARP ? (threadIdx.x & 31) : threadIdx.x, step = WARP ? 32 : blockDim.x;
  if constexpr (NV > 0) {
    float v[NV], zv[NV], wv[NV];
    row_load(xr, x.ne0, i0, step, v);
    row_load(zr, x.ne0, i0, step, zv);
    row_load(w, x.ne0, i0, step, wv);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) ss = fmaf(v[j], v[j], ss);
    ss = WARP ? warp_sum(ss) : block_sum(ss, red);
    const float sc = 1.f / sqrtf(ss * inv_n + eps);
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] = v[j] * sc * wv[j] * siluf_(zv[j]);
    row_store(xr, x.ne0, i0, step, v);
  } else {
    const float ss = row_sum_sq<WARP>(xr, x.ne0, red);
    const float sc = 1.f / sqrtf(ss * inv_n + eps);
    for (int64_t i = i0; i < x.ne0; i += step) xr[i] = xr[i] * sc * w[i] * siluf_(zr[i]);
  }
}

// x += t; y = x * (1/sqrt(mean(x^2) + eps)) * w. Each thread re-reads only the x elements it wrote
// itself (same i0 / step in both passes), so no barrier is needed between them; y may be x or t
// for the same reason.
template <int NV, bool WARP>
__global__ void __launch_bounds__(kRowThreads) add_rms_norm_kernel(Rows x, Rows t, const float* __restrict__ w, Rows y, float eps, float inv_n) {
  pdl::begin();  // pdl.cuh: nothing global before this
  __shared__ float red[32];
  const int64_t nr = x.n1 * x.n2;
  const int64_t r = WARP ? int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5) : int64_t(blockIdx.x);
  if (r >= nr) return;
  float* xr = row_mut(x, r);
  const float* tr = row_mut(t, r);
  float* yr = row_mut(y, r);
  const int64_t i0 = WARP ? (threadIdx.x & 31) : threadIdx.x, step = WARP ? 32 : blockDim.x;
  float ss = 0.f;
  if constexpr (NV > 0) {
    float v[NV], tv[NV], wv[NV];
    row_load(xr, x.ne0, i0, step, v);
    row_load(tr, x.ne0, i0, step, tv);
    if (w) row_load(w, x.ne0, i0, step, wv);
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] += tv[j], ss = fmaf(v[j], v[j], ss);
    row_store(xr, x.ne0, i0, step, v);
    ss = WARP ? warp_sum(ss) : block_sum(ss, red);
    const float sc = 1.f / sqrtf(ss * inv_n + eps);
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] = w ? v[j] * sc * wv[j] : v[j] * sc;
    row_store(yr, x.ne0, i0, step, v);
  } else {
    for (int64_t i = i0; i < x.ne0; i += step) {
      const float v = xr[i] + tr[i];
      xr[i] = v;
      ss = fmaf(v, v, ss);
    }
    ss = WARP ? warp_sum(ss) : block_sum(ss, red);
    const float sc = 1.f / sqrtf(ss * inv_n + eps);
    for (int64_t i = i0; i < x.ne0; i += step) yr[i] = w ? xr[i] * sc * w[i] : xr[i] * sc;
  }
}

}  // namespace

void delta_gates(const Launch& L, Rows beta, Rows g, const float* dt_bias, const float* a) {
  check_rows(beta, "delta_gates beta");
  check_rows(g, "delta_gates g");
  check_same(beta, g, "delta_gates beta/g");
  KILN_CHECK(dt_bias != nullptr && a != nullptr, "delta_gates: null dt_bias or a");
  if (beta.ne0 == 0 || n_rows(beta) == 0) return;
  const int64_t bx = (beta.ne0 + 255) / 256, nr = n_rows(beta);
  const dim3 grid(unsigned(bx < (1 << 20) ? bx : (1 << 20)), unsigned(nr < kMaxGridY ? nr : kMaxGridY));
  delta_gates_kernel<<<grid, 256, 0, L.stream>>>(beta, g, dt_bias, a);
  KILN_CUDA_LAUNCHED("delta_gates");
}

void rms_norm_gated(const Launch& L, Rows x, const float* w, Rows z, float eps) {
  check_rows(x, "rms_norm_gated x");
  check_rows(z, "rms_norm_gated z");
  check_same(x, z, "rms_norm_gated x/z");
  KILN_CHECK(w != nullptr, "rms_norm_gated: null weight");
  KILN_CHECK(n_rows(x) < (int64_t(1) << 31), "rms_norm_gated: {} rows", n_rows(x));
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  KILN_LAUNCH_ROWS(L, x.ne0, n_rows(x), rms_norm_gated_kernel, x, w, z, eps, 1.0f / float(x.ne0));
  KILN_CUDA_LAUNCHED("rms_norm_gated");
}

void add_rms_norm(const Launch& L, Rows x, Rows t, const float* w, Rows y, float eps) {
  check_rows(x, "add_rms_norm x");
  check_rows(t, "add_rms_norm t");
  check_rows(y, "add_rms_norm y");
  check_same(x, t, "add_rms_norm x/t");
  check_same(x, y, "add_rms_norm x/y");
  KILN_CHECK(n_rows(x) < (int64_t(1) << 31), "add_rms_norm: {} rows", n_rows(x));
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  KILN_LAUNCH_ROWS(L, x.ne0, n_rows(x), add_rms_norm_kernel, x, t, w, y, eps, 1.0f / float(x.ne0));
  KILN_CUDA_LAUNCHED("add_rms_norm");
}

}  // namespace kiln::cuda
