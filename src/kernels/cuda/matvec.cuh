// kernels/cuda/matvec.cuh — the fused mat-vec kernel (decode: y = W x for up to 8 columns of x),
//   templated on the weight type, the column count M (1, 2, 4, 8) and the guaranteed row alignment A.
// Owns: the decode hot path. A CTA of 4 warps takes 4 weight rows; its warps split the row's k in
//   "steps" of 1024 elements (warp w takes steps w, w+4, ...). Block types: a warp copies the bytes of
//   its 4 rows' step into shared memory with 16-byte coalesced loads (from the 16-byte aligned address
//   at or below the step's first byte; the next step's loads are issued before the current one is
//   decoded), then lane l decodes unit l (32 elements) of the step for all 4 rows, 8 elements at a
//   time: the codes become exact floats, sum(q * x) per group is scaled by the group's d, and for the
//   types with an offset m, m * sum(x) is added. Dense types (F32 F16 BF16) are read straight from
//   global memory (lane l: elements 256g + 8l of the step). x is read through L1 (float4 when
//   aligned), once per 4 rows. Sums are F32: per lane in k order, then a warp tree, then the 4 warps.
// Must not: allocate or synchronize. Loads may read up to 15 bytes past a row's last byte (inside the
//   same 16-byte aligned segment, so never past an allocation).
// Threading: kernels only.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace kiln::cuda::detail {

inline constexpr int kMvThreads = 128;
inline constexpr int kMvWarps = kMvThreads / 32;

// Step geometry of a block type: 32 units of 32 elements per row per step.
template <GgmlType T>
struct MvGeom {
  using D = dq::Q<T>;
  static constexpr int kUPB = D::kQK / 32;            // units per block
  static constexpr int kSB = (32 / kUPB) * D::kBS;     // bytes of one row's step
  static constexpr int kVPR = (kSB + 30) / 16;         // stage vectors per row (room for misalignment)
  static constexpr int kNL = (kMvRowsPerCta * kVPR + 31) / 32;  // stage vectors per lane
};

__device__ __forceinline__ float mv_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void mv_load_x8(const float* p, bool vec, float v[8]) {
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldg(p + j);
  }
}

__device__ __forceinline__ float mv_sum8(const float v[8]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
__device__ __forceinline__ float mv_dot8(const float q[8], const float x[8]) {
  float t = q[0] * x[0];
#pragma unroll
  for (int j = 1; j < 8; ++j) t = fmaf(q[j], x[j], t);
  return t;
}
template <int kOff>
__device__ __forceinline__ void mv_codes(uint2 cd, float q[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) q[j] = dq::code_to_float<kOff>(j < 4 ? cd.x : cd.y, j & 3);
}

template <GgmlType T, int M, int A>
__global__ void __launch_bounds__(kMvThreads, M <= 2 ? 5 : (M <= 4 ? 3 : 2)) matvec_kernel(const MvArgs a) {
  constexpr int R = kMvRowsPerCta;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const float* x = a.x;
  float* y = a.y;
  if (a.ids != nullptr) {
    const int64_t s = a.slot0 + blockIdx.y, t = s / a.K, j = s - t * a.K;
    w += size_t(a.ids[s]) * a.w_expert_stride;
    x += t * a.x_tok + (a.nx_one ? 0 : j * a.x_slot);
    y += t * a.y_tok + j * a.y_slot;
  }
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const float* xc[M];
#pragma unroll
  for (int c = 0; c < M; ++c) xc[c] = x + int64_t(c < a.m ? c : a.m - 1) * a.x_stride;
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < M; ++c) acc[r][c] = 0.f;

  if constexpr (dq::is_dense<T>()) {
    constexpr int EB = dq::elem_bytes<T>();
    const uint8_t* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = w + size_t(min(row0 + r, a.n - 1)) * a.w_stride;
    const int64_t nsteps = (a.k + 1023) / 1024;
    for (int64_t s = wid; s < nsteps; s += kMvWarps) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const int64_t e = s * 1024 + g * 256 + lane * 8;
        if (e < a.k) {
          float wv[R][8];
#pragma unroll
          for (int r = 0; r < R; ++r) dq::load_dense8<T, A>(rows[r] + e * EB, wv[r]);
#pragma unroll
          for (int c = 0; c < M; ++c) {
            float xv[8];
            mv_load_x8(xc[c] + e, a.xv, xv);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[r][c] = fmaf(wv[r][j], xv[j], acc[r][c]);
          }
        }
      }
    }
  } else {
    using D = dq::Q<T>;
    using G = MvGeom<T>;
    __shared__ uint4 stage[kMvWarps][R * G::kVPR];
    uint4* st = stage[wid];
    const int64_t nunits = a.k / 32, nsteps = (nunits + 31) / 32;
    const int64_t rowbytes = (a.k / D::kQK) * D::kBS;
    uint4 pf[G::kNL];
    // The loads of step s: flat vector f = lane + 32i is vector v of row r (f = r*kVPR + v).
    auto issue = [&](int64_t s) {
      const int64_t b0 = s * G::kSB;
      const int64_t len = min(int64_t(G::kSB), rowbytes - b0);
#pragma unroll
      for (int i = 0; i < G::kNL; ++i) {
        const int f = lane + 32 * i;
        const int r = f / G::kVPR, v = f - r * G::kVPR;
        if (r < R) {
          const uintptr_t p = uintptr_t(w) + size_t(min(row0 + r, a.n - 1)) * a.w_stride + size_t(b0);
          const uintptr_t a0 = p & ~uintptr_t(15);
          const int nv = int((p + size_t(len) - a0 + 15) >> 4);
          if (v < nv) pf[i] = __ldcs(reinterpret_cast<const uint4*>(a0) + v);
        }
      }
    };
    int64_t s = wid;
    if (s < nsteps) issue(s);
    for (; s < nsteps; s += kMvWarps) {
#pragma unroll
      for (int i = 0; i < G::kNL; ++i)
        if (lane + 32 * i < R * G::kVPR) st[lane + 32 * i] = pf[i];
      __syncwarp();
      if (s + kMvWarps < nsteps) issue(s + kMvWarps);
      const int64_t u = s * 32 + lane;
      if (u < nunits) {
        const int blk = lane / G::kUPB, sub = lane % G::kUPB;
        const uint8_t* bp[R];
        dq::Scales sc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uintptr_t p = uintptr_t(w) + size_t(min(row0 + r, a.n - 1)) * a.w_stride + size_t(s * G::kSB);
          bp[r] = reinterpret_cast<const uint8_t*>(st + r * G::kVPR) + (p & 15) + blk * D::kBS;
          sc[r] = D::template scales<A>(bp[r], sub);
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          if constexpr (M <= 2) {
            // Few columns: x of the group in registers, one row's codes at a time.
            float xv[M][8], sx[M];
#pragma unroll
            for (int c = 0; c < M; ++c) {
              mv_load_x8(xc[c] + u * 32 + g * 8, a.xv, xv[c]);
              if constexpr (D::kMin) sx[c] = mv_sum8(xv[c]);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
              float q[8];
              mv_codes<D::kOff>(D::template codes<A>(bp[r], sub, g), q);
#pragma unroll
              for (int c = 0; c < M; ++c) {
                acc[r][c] = fmaf(sc[r].d[g >> 1], mv_dot8(q, xv[c]), acc[r][c]);
                if constexpr (D::kMin) acc[r][c] = fmaf(sc[r].m[g >> 1], sx[c], acc[r][c]);
              }
            }
          } else {
            // Many columns: all rows' codes of the group in registers, one x column at a time.
            float q[R][8];
#pragma unroll
            for (int r = 0; r < R; ++r) mv_codes<D::kOff>(D::template codes<A>(bp[r], sub, g), q[r]);
#pragma unroll
            for (int c = 0; c < M; ++c) {
              float xv[8];
              mv_load_x8(xc[c] + u * 32 + g * 8, a.xv, xv);
              float sx = 0.f;
              if constexpr (D::kMin) sx = mv_sum8(xv);
#pragma unroll
              for (int r = 0; r < R; ++r) {
                acc[r][c] = fmaf(sc[r].d[g >> 1], mv_dot8(q[r], xv), acc[r][c]);
                if constexpr (D::kMin) acc[r][c] = fmaf(sc[r].m[g >> 1], sx, acc[r][c]);
              }
            }
          }
        }
      }
      __syncwarp();
    }
  }

  __shared__ float red[kMvWarps][R * M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < M; ++c) {
      const float v = mv_warp_sum(acc[r][c]);
      if (lane == 0) red[wid][r * M + c] = v;
    }
  __syncthreads();
  if (threadIdx.x < R * M) {
    const int r = threadIdx.x / M, c = threadIdx.x % M;
    float v = red[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < kMvWarps; ++i) v += red[i][threadIdx.x];
    const int64_t row = row0 + r;
    if (row < a.n && c < a.m) y[c * a.y_stride + row] = v;
  }
}

template <GgmlType T, int A>
void mv_launch_m(const MvArgs& a, dim3 grid, cudaStream_t s) {
  if (a.m <= 1) matvec_kernel<T, 1, A><<<grid, kMvThreads, 0, s>>>(a);
  else if (a.m <= 2) matvec_kernel<T, 2, A><<<grid, kMvThreads, 0, s>>>(a);
  else if (a.m <= 4) matvec_kernel<T, 4, A><<<grid, kMvThreads, 0, s>>>(a);
  else matvec_kernel<T, 8, A><<<grid, kMvThreads, 0, s>>>(a);
}

// Picks the alignment variant: the type's natural one when the rows (and experts) allow it.
template <GgmlType T>
void mv_launch(const MvArgs& a, int n_grid_y, cudaStream_t s) {
  constexpr int kNat = dq::fast_align<T>(), kMinA = dq::min_align<T>();
  const dim3 grid(unsigned((a.n + kMvRowsPerCta - 1) / kMvRowsPerCta), unsigned(n_grid_y));
  const uintptr_t bits = uintptr_t(a.w) | uintptr_t(a.w_stride) | uintptr_t(a.ids ? a.w_expert_stride : 0);
  if constexpr (kNat > kMinA) {
    if (bits % kNat == 0) return mv_launch_m<T, kNat>(a, grid, s);
  }
  mv_launch_m<T, kMinA>(a, grid, s);
}

}  // namespace kiln::cuda::detail
