// kernels/cuda/mmq.cuh — the int8 tensor-core mat-mul for a few columns (batched decode: 9..64
//   columns of x): y = W x with x quantized by quantize_x (int8 per 32 values, one F32 scale and the
//   half sums each), weights decoded to int8 codes by dequant_q8.cuh, products on the tensor cores
//   with mma.sync (m16n8k32 s8, or two m16n8k16 for the types with a scale per half unit), and the
//   unit's scales applied in F32 per (row, column, unit):
//     acc += dx * (d0 * (isum0 - kOff * xsum0) + d1 * (isum1 - kOff * xsum1) + m * xsum)
//   (the identity of dequant_q8.cuh; one isum when the type has one scale per unit).
// Owns: MmqArgs's kernel and launcher template (instantiated by mmq_kquant.cu / mmq_legacy.cu).
//   Geometry: a CTA of 4 warps takes 4 / ks tiles of 16 weight rows; ks warps split a tile's k range
//   in steps of 8 units (256 elements). Per step a warp decodes its tile's 16 rows x 8 units (lane l:
//   unit l % 8 of rows l / 8 + 4i, read straight from global memory) into shared memory (codes
//   swizzled so the fragment loads are free of bank conflicts, and the scales), then per unit and per
//   8 columns takes one tensor-core product and its F32 epilogue. The x fragments and their scales are
//   read through L1. F32 sums per (row, column) in k order per warp, then over the ks warps.
//   Columns are processed NT * 8 at a time (NT = 2, 4 or 8); the launcher loops over column groups.
// Must not: allocate or synchronize, or read a byte outside the weight rows (rows past n repeat row
//   n - 1; their sums are not stored).
// Threading: kernels only.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/dequant_q8.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace kiln::cuda::detail {

__device__ __forceinline__ void mmq_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mmq_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

inline constexpr int kMmqWarps = 4, kMmqThreads = 32 * kMmqWarps, kMmqUnits = 8;

// Word j of a tile row r's 8 code words sits at j ^ 4 for rows 4..7 and 12..15 (mod 8), so that the
// fragment loads (rows g and g + 8 of 8 groups, words t and t + 4) hit 32 different banks.
__device__ __forceinline__ int mmq_swz(int r, int j) { return j ^ (((r >> 2) & 1) << 2); }

template <GgmlType T, int NT, int A>
__global__ void __launch_bounds__(kMmqThreads, NT <= 4 ? 4 : 3) mmq_kernel(const MmqArgs a) {
  using D = q8::U<T>;
  constexpr int kUPB = D::kQK / 32;  // units per block
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ks = a.ks, kpart = wid % ks, tile = wid / ks;
  const int64_t row0 = (int64_t(blockIdx.x) * (kMmqWarps / ks) + tile) * 16;
  const int64_t k = a.k, nunits = k / 32, nsteps = (nunits + kMmqUnits - 1) / kMmqUnits;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int8_t* xq = a.xq;
  const uint2* xs = static_cast<const uint2*>(a.xs);

  __shared__ uint32_t codes[kMmqWarps][kMmqUnits][16][8];  // per warp: unit, tile row, code word (swizzled)
  __shared__ float4 scl[kMmqWarps][kMmqUnits][16];         // d0, d1, m - kOff * ..., unused
  __shared__ float red[kMmqWarps][16][NT * 8 + 1];

  // This lane's decode jobs: unit (lane % 8) of tile rows lane / 8 + 4i.
  const int du = lane & 7, dr0 = lane >> 3;
  const uint8_t* drow[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = min(row0 + dr0 + 4 * i, a.n - 1);
    drow[i] = w + size_t(r) * a.w_stride;
  }
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  q8::pdl_wait();  // x comes from quantize_x just before
  for (int64_t s = kpart; s < nsteps; s += ks) {
    // Decode 16 rows x 8 units into shared memory (all loads first, then the stores).
    const int64_t U = s * kMmqUnits + du;
    if (U < nunits) {
      const int64_t blk = U / kUPB;
      const int sub = int(U - blk * kUPB);
      uint32_t cw[4][8];
      q8::Sc sc[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sc[i] = {};
        D::template decode<A>(drow[i] + size_t(blk) * D::kBS, sub, cw[i], sc[i]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = dr0 + 4 * i;
        uint32_t* dst = codes[wid][du][r];
        const int o = mmq_swz(r, 0);  // 0 or 4: the two halves of the row swap places
        *reinterpret_cast<uint4*>(dst + o) = make_uint4(cw[i][0], cw[i][1], cw[i][2], cw[i][3]);
        *reinterpret_cast<uint4*>(dst + (o ^ 4)) = make_uint4(cw[i][4], cw[i][5], cw[i][6], cw[i][7]);
        const float m = D::kMin ? sc[i].m : 0.f;
        scl[wid][du][r] = make_float4(sc[i].d0, D::kHalves ? sc[i].d1 : 0.f, m, 0.f);
      }
    }
    __syncwarp();
    const int nu = int(min(int64_t(kMmqUnits), nunits - s * kMmqUnits));
    for (int u = 0; u < nu; ++u) {
      const int64_t Ug = s * kMmqUnits + u;
      const uint32_t* cg = codes[wid][u][g];
      const uint32_t* cg8 = codes[wid][u][g + 8];
      const int sw = mmq_swz(g, 0);  // rows g and g + 8 share the swizzle
      const uint32_t a0 = cg[t ^ sw], a1 = cg8[t ^ sw], a2 = cg[(t + 4) ^ sw], a3 = cg8[(t + 4) ^ sw];
      const float4 sg = scl[wid][u][g], sg8 = scl[wid][u][g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        // Columns of this lane's fragments (B: column g of the group of 8; C: columns 2t, 2t + 1),
        // past m: the last column (computed, not stored).
        const int8_t* xb = xq + int64_t(min(nt * 8 + g, a.m - 1)) * k + Ug * 32 + 4 * t;
        const uint32_t b0 = __ldg(reinterpret_cast<const uint32_t*>(xb));
        const uint32_t b1 = __ldg(reinterpret_cast<const uint32_t*>(xb + 16));
        float dx[2], f0[2], f1[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint2 meta = __ldg(xs + int64_t(min(nt * 8 + 2 * t + j, a.m - 1)) * nunits + Ug);
          dx[j] = __uint_as_float(meta.x);
          f0[j] = float(int(int16_t(meta.y & 0xFFFFu)));
          f1[j] = float(int(meta.y) >> 16);
        }
        if constexpr (D::kHalves) {
          int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
          mmq_k16(c0, a0, a1, b0);
          mmq_k16(c1, a2, a3, b1);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float4& sr = e < 2 ? sg : sg8;
            const int j = e & 1;
            const float v = fmaf(sr.x, float(c0[e]) - float(D::kOff) * f0[j], sr.y * (float(c1[e]) - float(D::kOff) * f1[j]));
            acc[nt][e] = fmaf(dx[j], v, acc[nt][e]);
          }
        } else {
          int c[4] = {0, 0, 0, 0};
          mmq_k32(c, a0, a1, a2, a3, b0, b1);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float4& sr = e < 2 ? sg : sg8;
            const int j = e & 1;
            const float fx = f0[j] + f1[j];
            float v = sr.x * (float(c[e]) - float(D::kOff) * fx);
            if constexpr (D::kMin) v = fmaf(sr.z, fx, v);
            acc[nt][e] = fmaf(dx[j], v, acc[nt][e]);
          }
        }
      }
    }
    __syncwarp();  // every lane is done with this step's codes before the next decode
  }

  // Sums over the ks warps of a tile, then the stores (C element e: row g + 8 (e >= 2), column 2t + (e & 1)).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[wid][g + 8 * (e >> 1)][nt * 8 + 2 * t + (e & 1)] = acc[nt][e];
  __syncthreads();
  constexpr int kCells = 16 * NT * 8;
  for (int idx = threadIdx.x; idx < (kMmqWarps / ks) * kCells; idx += kMmqThreads) {
    const int tl = idx / kCells, cell = idx - tl * kCells, r = cell / (NT * 8), c = cell - r * (NT * 8);
    float v = red[tl * ks][r][c];
    for (int i = 1; i < ks; ++i) v += red[tl * ks + i][r][c];
    const int64_t row = (int64_t(blockIdx.x) * (kMmqWarps / ks) + tl) * 16 + r;
    if (row < a.n && c < a.m) a.y[int64_t(c) * a.y_stride + row] = v;
  }
}

template <GgmlType T, int A>
void mmq_launch_nt(const MmqArgs& a, cudaStream_t s) {
  const int64_t tiles_per_cta = kMmqWarps / a.ks;
  const dim3 grid(unsigned((a.n + 16 * tiles_per_cta - 1) / (16 * tiles_per_cta))), block(kMmqThreads);
  if (a.m <= 16) q8::launch(a.pdl, grid, block, s, mmq_kernel<T, 2, A>, a);
  else if (a.m <= 32) q8::launch(a.pdl, grid, block, s, mmq_kernel<T, 4, A>, a);
  else q8::launch(a.pdl, grid, block, s, mmq_kernel<T, 8, A>, a);
}

// The type's natural alignment variant when the rows allow it, else 2-byte reads.
template <GgmlType T>
void mmq_launch(const MmqArgs& a, cudaStream_t s) {
  constexpr int kNat = q8::U<T>::kAlign;
  if constexpr (kNat > 2) {
    if ((uintptr_t(a.w) | uintptr_t(a.w_stride)) % kNat == 0) return mmq_launch_nt<T, kNat>(a, s);
  }
  mmq_launch_nt<T, 2>(a, s);
}

}  // namespace kiln::cuda::detail
