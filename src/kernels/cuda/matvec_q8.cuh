// kernels/cuda/matvec_q8.cuh — the int8 mat-vec kernel (decode: y = W x for up to 8 columns of x,
//   x already quantized by quantize_x to int8 with one F32 scale per 32 values), templated on the
//   weight type, the column count M (1, 2, 4, 8) and the guaranteed row alignment A.
// Owns: the decode hot path of the block types of dequant_q8.cuh. Geometry as the F32-x kernel
//   (matvec.cuh): a row group is 4 weight rows, a CTA of 4 warps holds 4 / ks groups, ks warps per
//   group splitting its steps (32 units = 32 x 32 elements of each row). A warp stages its group's
//   step bytes in a ring of 2-3 shared-memory slots with 16-byte cp.async copies: lanes 8r..8r+7 copy
//   row r, 128 contiguous bytes per instruction, from the 16-byte aligned address at or below the
//   row's step start (a row's very first and last vectors are copied 2 bytes at a time, so no byte
//   outside the rows is read). Lane l then decodes unit l of the step for all 4 rows into int8 codes
//   (dequant_q8.cuh) and, per x column, takes __dp4a sums against the unit's 32 int8 x values
//   (two 16-byte loads through L1, shared by the 4 rows): per unit and half an exact int32 sum, then
//   F32: acc += dx * (d * (isum - kOff * xsum) + m * xsum). Sums: F32 per lane in k order, a warp
//   tree, then the ks warps of the group. With programmatic dependent launch (sm_90+) the ring's
//   first steps are requested before waiting for quantize_x (expert mode: after, the ids come from
//   the kernels before). Segmented launches (MvArgs::nseg, matmul_n): the CTAs of up to 4 weights of
//   the same type and x in one grid, each CTA taking its weight, rows and y from the segment table;
//   one column (decode), instantiated apart so the plain kernels keep their registers.
//   BULK (sm_90+, MvArgs::bulk from matvec_bulk(); any row alignment): the same ring, filled
//   by the tensor memory accelerator instead: lanes 0..3 each issue one cp.async.bulk of their row's
//   step (from the 16-byte aligned address at or below its first byte to the one at or above its
//   last: whole aligned vectors, never another page) completing on the slot's mbarrier; the warp
//   waits on the barrier's phase. A step then costs the warp one instruction stream instead of ~100
//   address and copy instructions per lane, and the sums are the same (bit-identical outputs).
//   TM (one column, no experts, rows 16-byte aligned, a step of whole 16-byte vectors — all block
//   types but Q6_K): lane 0 copies the 4 rows' steps as one box of the weight's 2-D tensor map (rows
//   of 8-byte elements; mv_tensor_map) into a slot where they lie back to back; rows past n and bytes
//   past the row end arrive as zeros. One instruction stream of ~30 on one lane instead of four lanes'
//   copies serialized through an elect loop: +0.8 % / +1.5 % tg128 (9B / 27B, H100, run 78).
//   7-8 CTAs (TM launches of IQ4_XS, Q5_K: 7, Q4_K: 8; template argument CPS): 7 or 8 resident CTAs per SM
//   instead of 6, with a ring of 3 stages (Q5_K and Q4_K at 8: 2) so that the CTAs' rings fit the shared
//   memory; the kernel is latency-bound (a warp issues every ~10 cycles, run 75's ncu), so more resident
//   warps hide more of it: +4.0 % tg128 on the 9B at 7 (H100, run 94), +2.7 % on the 27B with Q4_K at 8
//   (run 100); mv_occ says which and KILN_CUDA_MV_OCC forces one. Same sums, bit-identical outputs.
// Must not: allocate or synchronize, or read a byte outside the 16-byte vectors that hold the rows
//   (the copy path reads none outside the rows at all).
// Threading: kernels only.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/dequant_q8.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matvec.cuh"  // kMvThreads, kMvWarps, mv_cp16 / commit / wait, mv_warp_sum

namespace kiln::cuda::detail {

// Step geometry of a block type for the int8 kernel. TM (tensor-map copies): the 4 rows' steps back to
// back (rows 16-byte aligned), a slot a multiple of 128 bytes.
template <GgmlType T, bool TM = false, int CPS = 0>
struct MvqGeom {
  using D = q8::U<T>;
  static constexpr int kUPB = D::kQK / 32;                // units per block
  static constexpr int kSB = (32 / kUPB) * D::kBS;         // bytes of one row's step
  static constexpr bool kTmOk = kSB % 16 == 0;             // a step is whole 16-byte vectors (not Q6_K)
  static constexpr int kVPR = TM ? kSB / 16 : (kSB + 15) / 16 + 1;  // vectors per row slot (+1 when misaligned)
  static constexpr int kLV = (kVPR + 7) / 8;               // vectors per lane (8 lanes per row)
  // Vectors per stage (+1: room for the word reads; TM: rounded up to 128 bytes).
  static constexpr int kSV = TM ? (kMvRowsPerCta * kVPR + 1 + 7) / 8 * 8 : kMvRowsPerCta * kVPR + 1;
  // Ring of steps per warp (the 6-CTA kernels): as many (2..4) as fit the 46 KiB of static shared memory.
  static constexpr int kStages6 = kMvWarps * 4 * kSV * 16 <= 46 * 1024 ? 4 : kMvWarps * 3 * kSV * 16 <= 46 * 1024 ? 3 : 2;
  // CPS > 6 resident CTAs per SM (the one-column tensor-map kernels of IQ4_XS / Q4_K / Q5_K run at 7): 3
  // stages, 2 where 3 do not fit CPS CTAs in 227 KiB.
  static constexpr int kStages =
      CPS <= 6 ? kStages6 : CPS * (kMvWarps * 3 * kSV * 16 + 1024) <= 227 * 1024 ? 3 : 2;
  static_assert(D::kBS / kUPB >= 16, "a unit must hold at least 16 bytes (interior-step vectors stay in the row)");
};

__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) { return __dp4a(int(a), int(b), c); }

// The CTA's weight: the launch's own, or in a segmented launch the segment whose CTAs hold blockIdx.x
// (segments in CTA order; compile-time indices, so the table stays in parameter space).
struct MvSegSel {
  const uint8_t* w;
  size_t w_stride;
  int64_t n;
  float* y;
  int64_t y_stride, bx;
  int idx;  // the segment (0 in a plain launch)
};
__device__ __forceinline__ MvSegSel mv_seg(const MvArgs& a) {
  MvSegSel r{static_cast<const uint8_t*>(a.w), a.w_stride, a.n, a.y, a.y_stride, int64_t(blockIdx.x), 0};
  if (a.nseg > 0) {
#pragma unroll
    for (int i = 0; i < kMvMaxSeg; ++i)
      if (i < a.nseg && int64_t(blockIdx.x) >= a.seg[i].cta0)
        r = {static_cast<const uint8_t*>(a.seg[i].w), a.seg[i].w_stride, a.seg[i].n, a.seg[i].y, a.seg[i].y_stride,
             int64_t(blockIdx.x) - a.seg[i].cta0, i};
  }
  return r;
}

// The tensor maps of a TM launch, one per segment (kernel parameter space: __grid_constant__).
template <bool TM>
struct MvTm {
  int unused;
};
template <>
struct MvTm<true> {
  CUtensorMap m[kMvMaxSeg];
};

// Resident CTAs per SM the kernel is built for (registers): the bulk kernel's ring fills 6 CTAs' worth
// of shared memory (mvq_go asks for the largest carveout).
// CPS > 0: an instance built for CPS resident CTAs (launch bounds; the ring as MvqGeom says).
template <int M, bool BULK, int CPS = 0>
inline constexpr int kMvqCtasPerSm = CPS > 0 ? CPS : BULK && M <= 2 ? 6 : M <= 2 ? 4 : 3;
// Resident CTAs per SM of the one-column tensor-map launches of type T: Q4_K 8 (rings of 2 stages, 62
// registers), IQ4_XS and Q5_K 7 (3 / 2 stages). Run 94 (H100, 9B IQ4_XS tg128, alternating): 6 -> 7 CTAs
// 338.1 / 341.6 -> 352.7 / 354.5 t/s (+4.0 %); run 100 (H100, alternating x 2): 8 CTAs for every type
// gave the 27B Q4_K_M 123.1 / 123.3 -> 126.5 / 126.4 t/s (+2.7 %) and the 9B IQ4_XS 356.3 / 355.9 ->
// 354.6 / 354.4 (-0.5 %), so 8 is Q4_K's alone. KILN_CUDA_MV_OCC=6 / 7 / 8 forces one count for the
// types that have it (6: every type; 8: IQ4_XS and Q4_K, Q5_K would spill and stays at 7), for A/B runs.
inline int mv_occ_env() {
  static const int n = env_is("KILN_CUDA_MV_OCC", "6")   ? 6
                       : env_is("KILN_CUDA_MV_OCC", "7") ? 7
                       : env_is("KILN_CUDA_MV_OCC", "8") ? 8
                                                         : 0;
  return n;
}
template <GgmlType T>
int mv_occ() {
  const int e = mv_occ_env();
  return e > 0 ? e : T == GgmlType::Q4_K ? 8 : 7;
}

template <GgmlType T, int M, int A, bool SEG = false, bool BULK = false, bool TM = false, int CPS = 0>
__global__ void __launch_bounds__(kMvThreads, kMvqCtasPerSm<M, BULK, CPS>)
    matvec_q8_kernel(const MvArgs a, const __grid_constant__ MvTm<TM> tm) {
  static_assert(!TM || (BULK && MvqGeom<T, true>::kTmOk), "tensor-map copies: bulk, steps of whole 16-byte vectors");
  constexpr int R = kMvRowsPerCta;
  using D = q8::U<T>;
  using G = MvqGeom<T, TM, CPS>;
  constexpr int S = G::kStages;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int64_t k = a.k;
  const int8_t* xq = a.xq;
  const uint2* xs = static_cast<const uint2*>(a.xs);
  float* y = a.y;
  // SEG (segmented launch): the start reads the CTA's segment; the stores select it again, so nothing
  // extra lives through the loop. Without SEG the code is the plain launch's.
  size_t w_stride = a.w_stride;
  int64_t n = a.n, bx = blockIdx.x;
  int seg_idx = 0;
  if constexpr (SEG) {
    const MvSegSel sg = mv_seg(a);
    w = sg.w, w_stride = sg.w_stride, n = sg.n, bx = sg.bx, seg_idx = sg.idx;
  }
  q8::pdl_launch_dependents();
  if (a.ids != nullptr) {
    q8::pdl_wait();  // the expert ids come from the kernels before
    const int64_t s = a.slot0 + blockIdx.y, t = s / a.K, j = s - t * a.K;
    w += size_t(a.ids[s]) * a.w_expert_stride;
    const int64_t col = a.nx_one ? t : s;
    xq += col * k, xs += col * (k / 32);
    y += t * a.y_tok + j * a.y_slot;
  }
  const int ks = a.ks, kpart = wid % ks;
  const int64_t row0 = bx * (R * (kMvWarps / ks)) + (wid / ks) * R;
  const int64_t nunits = k / 32, nsteps = (nunits + 31) / 32;
  const int64_t rowbytes = (k / D::kQK) * D::kBS;

  __shared__ alignas(128) uint4 ring[kMvWarps][S][G::kSV];
  __shared__ uint64_t mbar[BULK ? kMvWarps : 1][BULK ? S : 1];  // BULK: slot s of warp w is full
  if constexpr (BULK) {
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < S; ++i) mb_init(smem_addr(&mbar[wid][i]), TM ? 1 : R);  // one arrival per copy
    mb_init_fence();
    __syncwarp();
  }
  uint32_t phase = 0;  // BULK: bit i = parity of slot i's next fill
  uintptr_t rbase[R];  // row starts (rows past n repeat row n - 1; their sums are not stored)
#pragma unroll
  for (int r = 0; r < R; ++r) rbase[r] = uintptr_t(w) + size_t(min(row0 + r, n - 1)) * w_stride;
  // The copying lane's row and first vector (BULK: lane r < R copies row r).
  const int cr = lane >> 3, cv = lane & 7;
  const uintptr_t cbase = uintptr_t(w) + size_t(min(row0 + (BULK ? lane % R : cr), n - 1)) * w_stride;

  // Start the copy of step s into ring slot `slot`: vector v (= cv + 8i) of the copying row's step,
  // from the aligned address at or below its first byte, to ring slot vector cr * kVPR + v.
  auto issue = [&](int64_t s, int slot) {
    if constexpr (TM) {
      // Lane 0: the 4 rows' steps as one box of the weight's tensor map (rows past n read as zeros).
      if (s < nsteps && lane == 0) {
        mb_tensor_load_2d(smem_addr(&mbar[wid][slot]), smem_addr(&ring[wid][slot][0]), &tm.m[seg_idx],
                          int(s * (G::kSB / 8)), int(row0), uint32_t(R * G::kSB));
      }
      return;
    }
    if constexpr (BULK) {
      // Lane r < R: row r's step, from its aligned-down start to its aligned-up end (<= kVPR vectors).
      if (s < nsteps && lane < R) {
        const uintptr_t p = cbase + uintptr_t(s) * G::kSB;
        const uintptr_t a0 = p & ~uintptr_t(15);
        const uint32_t len = uint32_t(min(int64_t(G::kSB), rowbytes - s * G::kSB));
        mb_bulk_load(smem_addr(&mbar[wid][slot]), smem_addr(&ring[wid][slot][lane * G::kVPR]),
                     reinterpret_cast<const void*>(a0), (uint32_t(p - a0) + len + 15u) & ~15u);
      }
      return;
    }
    if (s < nsteps) {
      const uintptr_t p = cbase + uintptr_t(s) * G::kSB;
      const uintptr_t a0 = p & ~uintptr_t(15);
      const int64_t len = min(int64_t(G::kSB), rowbytes - s * G::kSB);
      const int nv = int((p - a0 + uintptr_t(len) + 15) >> 4);
      uint4* dst = &ring[wid][slot][cr * G::kVPR];
      if (s != 0 && s != nsteps - 1) {
        // Interior step: every vector lies inside the row (the step before and after hold >= 16 bytes).
#pragma unroll
        for (int i = 0; i < G::kLV; ++i) {
          const int v = cv + 8 * i;
          if (v < nv) mv_cp16(dst + v, reinterpret_cast<const void*>(a0 + 16 * uintptr_t(v)));
        }
      } else {
        const uintptr_t rs = cbase, re = cbase + uintptr_t(rowbytes);
#pragma unroll
        for (int i = 0; i < G::kLV; ++i) {
          const int v = cv + 8 * i;
          if (v < nv) {
            const uintptr_t vs = a0 + 16 * uintptr_t(v);
            if (vs >= rs && vs + 16 <= re) {
              mv_cp16(dst + v, reinterpret_cast<const void*>(vs));
            } else {
              const uintptr_t lo = vs < rs ? rs : vs, hi = vs + 16 > re ? re : vs + 16;
              for (uintptr_t q = lo; q < hi; q += 2)
                *reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(dst + v) + (q - vs)) =
                    *reinterpret_cast<const uint16_t*>(q);
            }
          }
        }
      }
    }
    mv_cp_commit();  // an empty group past the end keeps the wait counts uniform
  };

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < M; ++c) acc[r][c] = 0.f;
  const int blk = lane / G::kUPB, sub = lane % G::kUPB;
  q8::Tab tab{};  // the IQ4 codebook words in registers (dequant_q8.cuh)
  if constexpr (D::kX == q8::kXPairs) tab = q8::iq4_tab();

#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(kpart + int64_t(i) * ks, i);
  q8::pdl_wait();  // the weights are constant; x (quantize_x) and y are touched only after this
  int slot = 0;
  for (int64_t s = kpart; s < nsteps; s += ks) {
    if constexpr (BULK) {
      mb_wait(smem_addr(&mbar[wid][slot]), (phase >> slot) & 1u);  // this step's rows have landed
      phase ^= 1u << slot;
    } else {
      mv_cp_wait<S - 2>();  // this step's group has landed (S - 2 younger ones may be in flight)
    }
    __syncwarp();
    issue(s + int64_t(S - 1) * ks, slot == 0 ? S - 1 : slot - 1);  // into the slot decoded last
    const int64_t u = s * 32 + lane;
    if (u < nunits) {
      const uint8_t* st = reinterpret_cast<const uint8_t*>(ring[wid][slot]);
      // x column c of this unit: 32 int8 values, the scale and the half sums.
      struct X {
        uint32_t v[8];
        float d;
        int s0, s1;
      };
      auto load_x = [&](int c, X& x) {
        const int cc = c < a.m ? c : a.m - 1;
        const uint4* xp = reinterpret_cast<const uint4*>(xq + cc * k + u * 32);
        const uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        const uint2 meta = __ldg(xs + cc * (k / 32) + u);
        x = {{x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w}, __uint_as_float(meta.x), int(int16_t(meta.y & 0xFFFFu)),
             int(meta.y) >> 16};
      };
      auto decode = [&](int r, uint32_t (&cw)[8], q8::Sc& sc) {
        const int o = TM ? 0 : int((rbase[r] + uintptr_t(s) * G::kSB) & 15);
        D::template decode<A>(st + r * G::kVPR * 16 + o + blk * D::kBS, sub, cw, sc, tab);
      };
      // acc[r][c] += unit value of row r against x column c (the same arithmetic in both orders below).
      auto dot = [&](int r, int c, const uint32_t (&cw)[8], const q8::Sc& sc, const X& x) {
        float v;
        if constexpr (D::kHalves) {
          int i0 = -D::kOff * x.s0, i1 = -D::kOff * x.s1;
#pragma unroll
          for (int j = 0; j < 4; ++j) i0 = dp4a(cw[j], x.v[j], i0), i1 = dp4a(cw[j + 4], x.v[j + 4], i1);
          v = fmaf(sc.d1, float(i1), sc.d0 * float(i0));
        } else {
          int i0 = -D::kOff * (x.s0 + x.s1);
#pragma unroll
          for (int j = 0; j < 8; ++j) i0 = dp4a(cw[j], x.v[j], i0);
          v = sc.d0 * float(i0);
          if constexpr (D::kMin) v = fmaf(sc.m, float(x.s0 + x.s1), v);
        }
        acc[r][c] = fmaf(x.d, v, acc[r][c]);
      };
      if constexpr (M <= 2) {
        // Few columns: x first, then one row's codes at a time (fewer live registers).
        X x[M];
#pragma unroll
        for (int c = 0; c < M; ++c) load_x(c, x[c]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          uint32_t cw[8];
          q8::Sc sc = {};
          decode(r, cw, sc);
#pragma unroll
          for (int c = 0; c < M; ++c) dot(r, c, cw, sc, x[c]);
        }
      } else {
        // More columns: every row's codes, then one x column at a time.
        uint32_t cw[R][8];
        q8::Sc sc[R] = {};
#pragma unroll
        for (int r = 0; r < R; ++r) decode(r, cw[r], sc[r]);
#pragma unroll
        for (int c = 0; c < M; ++c) {
          X x;
          load_x(c, x);
#pragma unroll
          for (int r = 0; r < R; ++r) dot(r, c, cw[r], sc[r], x);
        }
      }
    }
    __syncwarp();  // every lane is done with this slot before it is refilled
    slot = slot == S - 1 ? 0 : slot + 1;
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
    const int c = idx % M;
    if constexpr (SEG) {
      const MvSegSel se = mv_seg(a);
      const int64_t row = se.bx * (R * (kMvWarps / ks)) + grp * R + idx / M;
      if (row < se.n && c < a.m) se.y[c * se.y_stride + row] = v;
    } else {
      const int64_t row = int64_t(blockIdx.x) * (R * (kMvWarps / ks)) + grp * R + idx / M;
      if (row < a.n && c < a.m) y[c * a.y_stride + row] = v;
    }
  }
}

// Launches a kernel instance; for a bulk one, first asks (once) for the shared-memory carveout that lets
// kMvqCtasPerSm CTAs reside.
template <bool TM, typename K>
void mvq_go(bool bulk, const MvArgs& a, const MvTm<TM>& tm, dim3 grid, cudaStream_t s, K kernel) {
  if (bulk) {
    static const bool once = (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   int(cudaSharedmemCarveoutMaxShared)),
                              true);
    (void)once;
  }
  q8::launch(a.pdl, grid, dim3(kMvThreads), s, kernel, a, tm);
}
template <typename K>
void mvq_go(bool bulk, const MvArgs& a, dim3 grid, cudaStream_t s, K kernel) {
  mvq_go(bulk, a, MvTm<false>{}, grid, s, kernel);
}

template <GgmlType T, int A, bool BULK>
void mvq_launch_m(const MvArgs& a, dim3 grid, cudaStream_t s) {
  if (a.m <= 1) mvq_go(BULK, a, grid, s, matvec_q8_kernel<T, 1, A, false, BULK>);
  else if (a.m <= 2) mvq_go(BULK, a, grid, s, matvec_q8_kernel<T, 2, A, false, BULK>);
  else if (a.m <= 4) mvq_go(BULK, a, grid, s, matvec_q8_kernel<T, 4, A, false, BULK>);
  else mvq_go(BULK, a, grid, s, matvec_q8_kernel<T, 8, A, false, BULK>);
}
template <GgmlType T, int A>
void mvq_launch_m(const MvArgs& a, dim3 grid, cudaStream_t s) {
  if (a.bulk) mvq_launch_m<T, A, true>(a, grid, s);
  else mvq_launch_m<T, A, false>(a, grid, s);
}

// The tensor maps of a one-column bulk launch (segments, or the one weight), or false when a weight's
// rows do not allow one (then the per-row copies are used): rows 16-byte aligned, whole 8-byte elements.
template <GgmlType T>
bool mvq_tmaps(const MvArgs& a, MvTm<true>& tm) {
  using G = MvqGeom<T, true>;
  if (!G::kTmOk || !a.tmap || a.m != 1 || a.ids != nullptr) return false;
  const int64_t rowbytes = (a.k / q8::U<T>::kQK) * q8::U<T>::kBS;
  if (rowbytes % 8 != 0) return false;
  const int nw = a.nseg > 0 ? a.nseg : 1;
  for (int i = 0; i < nw; ++i) {
    const void* w = a.nseg > 0 ? a.seg[i].w : a.w;
    const size_t stride = a.nseg > 0 ? a.seg[i].w_stride : a.w_stride;
    const int64_t n = a.nseg > 0 ? a.seg[i].n : a.n;
    if ((uintptr_t(w) | stride) % 16 != 0 || n <= 0) return false;
    const void* map = mv_tensor_map(w, uint64_t(rowbytes / 8), uint64_t(n), stride, uint32_t(G::kSB / 8),
                                    uint32_t(kMvRowsPerCta));
    if (map == nullptr) return false;
    std::memcpy(&tm.m[i], map, sizeof(CUtensorMap));
  }
  return true;
}

// Picks the alignment variant: the type's natural one when the rows (and experts) allow it; one-column
// bulk launches whose rows allow it take the tensor-map copies.
template <GgmlType T>
void mvq_launch(const MvArgs& a, int n_grid_y, cudaStream_t s) {
  constexpr int kNat = q8::U<T>::kAlign;
  constexpr bool k7Ctas = T == GgmlType::IQ4_XS || T == GgmlType::Q4_K || T == GgmlType::Q5_K;
  constexpr bool k8Ctas = T == GgmlType::IQ4_XS || T == GgmlType::Q4_K;
  const int64_t rows_per_cta = kMvRowsPerCta * (kMvWarps / a.ks);
  MvTm<true> tm;
  bool use_tm = false;
  if constexpr (MvqGeom<T, true>::kTmOk) use_tm = mvq_tmaps<T>(a, tm);
  if (a.nseg > 0) {  // segmented (matmul_n, m = 1): CTAs of the segments in order; the alignment all allow
    MvArgs b = a;
    int64_t ctas = 0;
    uintptr_t bits = 0;
    for (int i = 0; i < b.nseg; ++i) {
      b.seg[i].cta0 = ctas;
      ctas += (b.seg[i].n + rows_per_cta - 1) / rows_per_cta;
      bits |= uintptr_t(b.seg[i].w) | uintptr_t(b.seg[i].w_stride);
    }
    const dim3 grid{unsigned(ctas), unsigned(n_grid_y)};
    if constexpr (MvqGeom<T, true>::kTmOk) {
      if constexpr (k8Ctas) {
        if (use_tm && mv_occ<T>() == 8) return mvq_go(true, b, tm, grid, s, matvec_q8_kernel<T, 1, kNat, true, true, true, 8>);
      }
      if constexpr (k7Ctas) {
        if (use_tm && mv_occ<T>() >= 7) return mvq_go(true, b, tm, grid, s, matvec_q8_kernel<T, 1, kNat, true, true, true, 7>);
      }
      if (use_tm) return mvq_go(true, b, tm, grid, s, matvec_q8_kernel<T, 1, kNat, true, true, true>);
    }
    if constexpr (kNat > 2) {
      if (bits % kNat == 0)
        return b.bulk ? mvq_go(true, b, grid, s, matvec_q8_kernel<T, 1, kNat, true, true>)
                      : mvq_go(false, b, grid, s, matvec_q8_kernel<T, 1, kNat, true>);
    }
    return b.bulk ? mvq_go(true, b, grid, s, matvec_q8_kernel<T, 1, 2, true, true>)
                  : mvq_go(false, b, grid, s, matvec_q8_kernel<T, 1, 2, true>);
  }
  const dim3 grid(unsigned((a.n + rows_per_cta - 1) / rows_per_cta), unsigned(n_grid_y));
  if constexpr (MvqGeom<T, true>::kTmOk) {
    if constexpr (k8Ctas) {
      if (use_tm && mv_occ<T>() == 8) return mvq_go(true, a, tm, grid, s, matvec_q8_kernel<T, 1, kNat, false, true, true, 8>);
    }
    if constexpr (k7Ctas) {
      if (use_tm && mv_occ<T>() >= 7) return mvq_go(true, a, tm, grid, s, matvec_q8_kernel<T, 1, kNat, false, true, true, 7>);
    }
    if (use_tm) return mvq_go(true, a, tm, grid, s, matvec_q8_kernel<T, 1, kNat, false, true, true>);
  }
  const uintptr_t bits = uintptr_t(a.w) | uintptr_t(a.w_stride) | uintptr_t(a.ids ? a.w_expert_stride : 0);
  if constexpr (kNat > 2) {
    if (bits % kNat == 0) return mvq_launch_m<T, kNat>(a, grid, s);
  }
  mvq_launch_m<T, 2>(a, grid, s);
}

}  // namespace kiln::cuda::detail
