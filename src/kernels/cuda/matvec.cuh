// kernels/cuda/matvec.cuh — the fused mat-vec kernel (decode: y = W x for up to 8 columns of x),
//   templated on the weight type, the column count M (1, 2, 4, 8) and the guaranteed row alignment A.
// Owns: the decode hot path. A row group is 4 weight rows; its k is cut in "steps" of 1024 elements.
//   A CTA of 4 warps holds 4 / ks groups, ks warps per group splitting its steps (warp part p takes
//   steps p, p+ks, ...; ks = 1, 2, 4 is chosen by the launcher from n and the GPU's size). Block
//   types: a warp copies its group's step bytes into a ring of 2-3 shared-memory slots with 16-byte
//   cp.async copies (coalesced, from the 16-byte aligned address at or below the step's first byte),
//   the next steps in flight while one is decoded; lane l decodes unit l (32 elements) of the step
//   for all 4 rows, 8 elements at a time: the codes become exact floats, sum(q * x) per group is
//   scaled by the group's d, and for the types with an offset m, m * sum(x) is added. Dense types
//   (F32 F16 BF16) are read straight from global memory (lane l: elements 256g + 8l of the step).
//   x is read through L1 (float4 when aligned), once per 4 rows. Sums are F32: per lane in k order,
//   then a warp tree, then the ks warps of the group.
// Must not: allocate or synchronize, or read a byte outside the weight rows (a row's first and last
//   16-byte vectors are copied 2 bytes at a time).
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
  // Ring of steps in flight per warp: 3 when the CTA's ring fits the 48 KiB of static shared memory.
  static constexpr int kStages = kMvWarps * 3 * kMvRowsPerCta * kVPR * 16 <= 46 * 1024 ? 3 : 2;
};

// 16-byte global -> shared copy that bypasses L1 (cp.async, sm_80+), and its group fences.
__device__ __forceinline__ void mv_cp16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(unsigned(__cvta_generic_to_shared(smem))),
               "l"(gmem));
#else
  *static_cast<uint4*>(smem) = __ldcs(static_cast<const uint4*>(gmem));
#endif
}
__device__ __forceinline__ void mv_cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void mv_cp_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

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
__global__ void __launch_bounds__(kMvThreads, M == 1 ? 6 : (M == 2 ? 5 : (M == 4 ? 4 : 3))) matvec_kernel(const MvArgs a) {
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
  // ks warps share a group of R rows and split its k; the CTA holds kMvWarps / ks groups.
  const int ks = a.ks, kpart = wid % ks;
  const int64_t row0 = int64_t(blockIdx.x) * (R * (kMvWarps / ks)) + (wid / ks) * R;
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
    for (int64_t s = kpart; s < nsteps; s += ks) {
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
    constexpr int S = G::kStages, SV = R * G::kVPR;  // stages, vectors per stage
    __shared__ uint4 ring[kMvWarps][S][SV];
    const int64_t nunits = a.k / 32, nsteps = (nunits + 31) / 32;
    const int64_t rowbytes = (a.k / D::kQK) * D::kBS;
    uintptr_t rbase[R];  // row starts (rows past n repeat row n - 1; their sums are not stored)
#pragma unroll
    for (int r = 0; r < R; ++r) rbase[r] = uintptr_t(w) + size_t(min(row0 + r, a.n - 1)) * a.w_stride;
    // Start the copy of step s into ring slot `slot`: flat vector f = lane + 32i is vector v of row r
    // (f = r * kVPR + v), read from the 16-byte aligned address at or below the row's step start.
    // A row's very first and last vectors are copied 2 bytes at a time, only the row's own bytes,
    // so no byte outside the rows is read (the other vectors' extra bytes belong to the same row).
    auto issue = [&](int64_t s, int slot) {
      if (s < nsteps) {
        const int64_t b0 = s * G::kSB;
        const int64_t len = min(int64_t(G::kSB), rowbytes - b0);
        const bool first = s == 0, last = s == nsteps - 1;
#pragma unroll
        for (int i = 0; i < G::kNL; ++i) {
          const int f = lane + 32 * i;
          const int r = f / G::kVPR, v = f - r * G::kVPR;
          if (r < R) {
            const uintptr_t p = uintptr_t(w) + size_t(min(row0 + r, a.n - 1)) * a.w_stride + size_t(b0);
            const uintptr_t e = p + size_t(len), a0 = p & ~uintptr_t(15);
            const uintptr_t vs = a0 + 16 * uintptr_t(v);
            if (vs < e) {
              uint4* dst = &ring[wid][slot][f];
              if ((first && vs < p) || (last && vs + 16 > e)) {
                const uintptr_t lo = vs < p ? p : vs, hi = vs + 16 > e ? e : vs + 16;
                for (uintptr_t q = lo; q < hi; q += 2)
                  *reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(dst) + (q - vs)) =
                      *reinterpret_cast<const uint16_t*>(q);
              } else {
                mv_cp16(dst, reinterpret_cast<const void*>(vs));
              }
            }
          }
        }
      }
      mv_cp_commit();  // an empty group past the end keeps the wait counts uniform
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(kpart + int64_t(i) * ks, i);
    int slot = 0;
    for (int64_t s = kpart; s < nsteps; s += ks) {
      mv_cp_wait<S - 2>();  // this step's group has landed (S - 2 younger ones may be in flight)
      __syncwarp();
      issue(s + int64_t(S - 1) * ks, slot == 0 ? S - 1 : slot - 1);  // into the slot decoded last
      const uint4* st = ring[wid][slot];
      const int64_t u = s * 32 + lane;
      if (u < nunits) {
        const int blk = lane / G::kUPB, sub = lane % G::kUPB;
        const uint8_t* bp[R];
        dq::Scales sc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uintptr_t p = rbase[r] + size_t(s * G::kSB);
          bp[r] = reinterpret_cast<const uint8_t*>(st + r * G::kVPR) + (p & 15) + blk * D::kBS;
          sc[r] = D::template scales<A>(bp[r], sub);
        }
        if constexpr (M <= 2) {
          // Few columns: x of the group in registers, one row's codes at a time.
#pragma unroll
          for (int g = 0; g < 4; ++g) {
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
          }
        } else {
          // Many columns: all rows' codes of the group in registers, one x column at a time; the group
          // loop is kept rolled to bound the registers.
#pragma unroll 1
          for (int g = 0; g < 4; ++g) {
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
                const float d = g >= 2 ? sc[r].d[1] : sc[r].d[0];
                acc[r][c] = fmaf(d, mv_dot8(q[r], xv), acc[r][c]);
                if constexpr (D::kMin) acc[r][c] = fmaf(g >= 2 ? sc[r].m[1] : sc[r].m[0], sx, acc[r][c]);
              }
            }
          }
        }
      }
      __syncwarp();  // every lane is done with this slot before it is refilled
      slot = slot == S - 1 ? 0 : slot + 1;
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
  if (threadIdx.x < (kMvWarps / ks) * R * M) {
    const int grp = threadIdx.x / (R * M), idx = threadIdx.x % (R * M);
    float v = red[grp * ks][idx];
    for (int i = 1; i < ks; ++i) v += red[grp * ks + i][idx];
    const int64_t row = int64_t(blockIdx.x) * (R * (kMvWarps / ks)) + grp * R + idx / M;
    const int c = idx % M;
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
  const int64_t rows_per_cta = kMvRowsPerCta * (kMvWarps / a.ks);
  const dim3 grid(unsigned((a.n + rows_per_cta - 1) / rows_per_cta), unsigned(n_grid_y));
  const uintptr_t bits = uintptr_t(a.w) | uintptr_t(a.w_stride) | uintptr_t(a.ids ? a.w_expert_stride : 0);
  if constexpr (kNat > kMinA) {
    if (bits % kNat == 0) return mv_launch_m<T, kNat>(a, grid, s);
  }
  mv_launch_m<T, kMinA>(a, grid, s);
}

}  // namespace kiln::cuda::detail
