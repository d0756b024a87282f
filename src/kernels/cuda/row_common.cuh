// kernels/cuda/row_common.cuh — device helpers shared by the row-op launchers (elementwise.cu,
//   fused.cu): the launch check, warp / block reductions, the activation functions and row addressing
//   of cuda::Rows, argument checks. Internal to src/kernels/cuda (an anonymous namespace: each .cu
//   gets its own copy).
// Must not: allocate or synchronize.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

#define KILN_CUDA_LAUNCHED(what)                                                                          \
  do {                                                                                                  \
    const cudaError_t e_ = cudaGetLastError();                                                          \
    KILN_CHECK(e_ == cudaSuccess, "{}: kernel launch failed: {} ({})", what, cudaGetErrorName(e_),      \
               cudaGetErrorString(e_));                                                                 \
  } while (0)

constexpr int kMaxGridY = 65535;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum / max (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `red` is 32 floats of shared memory; the call begins and ends with a barrier, so it can be reused.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.f;
  return warp_sum(v);
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : -INFINITY;
  return warp_max(v);
}

__device__ __forceinline__ float sigmoidf_(float v) { return 1.f / (1.f + expf(-v)); }
__device__ __forceinline__ float siluf_(float v) { return v / (1.f + expf(-v)); }
__device__ __forceinline__ float softplusf_(float v) { return v > 20.f ? v : log1pf(expf(v)); }

__device__ __forceinline__ const float* row_ptr(const Rows& r, int64_t row) {
  const int64_t i1 = row % r.n1, i2 = row / r.n1;
  return r.p + i1 * r.s1 + i2 * r.s2;
}
__device__ __forceinline__ float* row_mut(const Rows& r, int64_t row) {
  const int64_t i1 = row % r.n1, i2 = row / r.n1;
  return r.p + i1 * r.s1 + i2 * r.s2;
}

void check_rows(const Rows& r, const char* what) {
  KILN_CHECK(r.p != nullptr && r.ne0 >= 0 && r.n1 >= 0 && r.n2 >= 0, "{}: bad rows (null or negative shape)", what);
}
void check_same(const Rows& a, const Rows& b, const char* what) {
  KILN_CHECK(a.ne0 == b.ne0 && a.n1 == b.n1 && a.n2 == b.n2, "{}: shape mismatch [{} {} {}] vs [{} {} {}]", what,
             a.ne0, a.n1, a.n2, b.ne0, b.n1, b.n2);
}
int64_t n_rows(const Rows& r) { return r.n1 * r.n2; }

// ---- row reductions: a warp per row (ne0 <= 1024) or a block per row ----
// Rows per block in the warp-per-row form.
constexpr int kWarpRows = 4;
int block_threads(int64_t ne0) { return ne0 <= 4096 ? 256 : ne0 <= 16384 ? 512 : 1024; }

// Sum of squares of row xr (n floats), by a warp (WARP) or the whole block.
template <bool WARP>
__device__ float row_sum_sq(const float* xr, int64_t n, float* red) {
  float s = 0.f;
  if constexpr (WARP) {
    for (int64_t i = threadIdx.x & 31; i < n; i += 32) s = fmaf(xr[i], xr[i], s);
    return warp_sum(s);
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
    return block_sum(s, red);
  }
}

// Launches a row kernel: the warp-per-row form (kWarpRows rows per block) up to 1024 columns, else
// a block per row.
template <class K, class... A>
void launch_rows(const Launch& L, int64_t ne0, int64_t nr, K warp_kernel, K block_kernel, A... args) {
  if (ne0 <= 1024) {
    warp_kernel<<<unsigned((nr + kWarpRows - 1) / kWarpRows), 32 * kWarpRows, 0, L.stream>>>(args...);
  } else {
    block_kernel<<<unsigned(nr), block_threads(ne0), 0, L.stream>>>(args...);
  }
}

// ---- register-held rows (norm kernels) ----
// A row kernel K<NV, WARP>: WARP = a warp per row (kWarpRows rows per block), else a block of
// kRowThreads per row. NV > 0: each thread holds its NV elements i0 + j * step in registers, so a
// pass issues all its loads at once and later passes re-read nothing (a strided loop whose stores
// may alias its next loads runs one memory latency per iteration); NV = 0: a plain loop (rows wider
// than kRowThreads * 16).
constexpr int kRowThreads = 1024;
template <int NV>
__device__ __forceinline__ void row_load(const float* p, int64_t n, int64_t i0, int64_t step, float (&v)[NV]) {
#pragma unroll
  for (int j = 0; j < NV; ++j) v[j] = i0 + j * step < n ? p[i0 + j * step] : 0.f;
}
template <int NV>
__device__ __forceinline__ void row_store(float* p, int64_t n, int64_t i0, int64_t step, const float (&v)[NV]) {
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if (i0 + j * step < n) p[i0 + j * step] = v[j];
}
// Launches K<NV, WARP>(args...) with the form and NV that fit rows of ne0 (programmatic dependent
// launch where on: K starts with pdl::begin()).
#define KILN_LAUNCH_ROWS(L, ne0, nr, K, ...)                                                                   \
  do {                                                                                                        \
    const int64_t ne0_ = (ne0), nr_ = (nr);                                                                   \
    const dim3 wg_{unsigned((nr_ + kWarpRows - 1) / kWarpRows)}, wt_{32 * kWarpRows}, bg_{unsigned(nr_)},    \
        bt_{unsigned(kRowThreads)};                                                                           \
    if (ne0_ <= 128) pdl::launch((L), wg_, wt_, 0, K<4, true>, __VA_ARGS__);                                  \
    else if (ne0_ <= 256) pdl::launch((L), wg_, wt_, 0, K<8, true>, __VA_ARGS__);                             \
    else if (ne0_ <= 1024) pdl::launch((L), wg_, wt_, 0, K<32, true>, __VA_ARGS__);                           \
    else if (ne0_ <= 4 * kRowThreads) pdl::launch((L), bg_, bt_, 0, K<4, false>, __VA_ARGS__);                \
    else if (ne0_ <= 8 * kRowThreads) pdl::launch((L), bg_, bt_, 0, K<8, false>, __VA_ARGS__);                \
    else if (ne0_ <= 16 * kRowThreads) pdl::launch((L), bg_, bt_, 0, K<16, false>, __VA_ARGS__);              \
    else pdl::launch((L), bg_, bt_, 0, K<0, false>, __VA_ARGS__);                                             \
  } while (0)

}  // namespace
}  // namespace kiln::cuda
