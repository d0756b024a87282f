// kernels/cuda/mmq.cu — the quantized mat-mul for small batches (kMmqMinM..kMmqMaxM columns: batched
//   decode): y[:, c] = W x[:, c] on tensor cores, each weight byte read from memory once for all
//   columns.
// Owns: mmq_x_kernel (x to F16 in the weights' "pairs" order, see below), mmq_kernel, and the grouped
//   expert mat-mul mmq_id (matmul_id of a prefill: mmq_id_group_kernel sorts the slots by expert and
//   writes a table of tiles of up to 32 columns of one expert, mmq_id_x_kernel gathers the sorted x
//   columns, mmq_kernel runs one tile per blockIdx.y on that expert's matrix and scatters the columns). A CTA of 8
//   warps takes kMmqRows = 128 rows of W (16 per warp) and all m columns over a range of k (a k split: the plan's
//   nks CTAs per row tile, summed by the last CTA of the tile to arrive, in split order: results do not
//   depend on timing). k advances in steps of 256 elements through a ring of 2-3 shared-memory
//   stages (2 CTAs per SM), each holding the step's bytes of the 128 weight rows (one bulk copy per row on sm_90+,
//   16-byte cp.async copies before; the 16-byte aligned range around the row's bytes) and the step's
//   256 x values of every column as F16. Per 32-element unit a lane (g = lane / 4, t = lane % 4)
//   decodes elements 4t..4t+3 and 16+4t..16+4t+3 of rows g and g + 8 (lane_codes, unit_pairs: codes
//   placed in F16 mantissas, scaled in F16; each (row, unit) scale decoded once per step by one of the
//   4 lanes that use it and shuffled to the others) into the A fragments of two mma.sync m16n8k16 (F16 in, F32
//   accumulators). The k order
//   inside a unit is permuted the same way for both operands: positions 8t..8t+7, as "pairs" (position
//   2i + h holds element i + 16h, the kXPairs order of the int8 path), are the slots lane t holds, so
//   the B fragments of a column are one 16-byte shared-memory read.
// Must not: allocate or synchronize; read outside the 16-byte vectors holding W's rows or the m
//   columns of x. Launched only where mmq_plan(...).ok and the device is sm_80+.
// Threading: the launcher only enqueues on L.stream.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/dequant_q8.cuh"  // q8::iq4_pairs
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matvec.cuh"  // mv_cp16 / commit / wait
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda::detail {
namespace {

constexpr int kRows = int(kMmqRows), kThreads = 2 * kRows;  // a warp per 16 rows
constexpr int kStepK = 256;                // elements of k per stage
constexpr int kXCol = 2 * kStepK + 64;     // bytes of one column's x per stage (+64: no bank conflicts)

template <GgmlType T>
struct Geo {
  using D = dq::Q<T>;
  static constexpr int kUPB = D::kQK / 32;              // units per block
  static constexpr int kRB = D::kBS * kStepK / D::kQK;  // bytes of one row's step
  static constexpr int kVR = (kRB + 15) / 16 + 1;       // 16-byte vectors around them at most
  static constexpr int kSlot = 16 * (kVR | 1);          // an odd number of vectors: row reads hit distinct banks
  static constexpr int kW = kRows * kSlot;
  template <int NT>
  static constexpr int stage() {
    return kW + 8 * NT * kXCol;
  }
  // Stages in the ring: 3 where that still lets 2 CTAs share an SM's 227 KiB, else 2.
  template <int NT>
  static constexpr int stages() {
    return 3 * (stage<NT>() + 8) <= 112 * 1024 ? 3 : 2;
  }
  template <int NT>
  static constexpr int smem() {
    return stages<NT>() * (stage<NT>() + 8);  // + the stages' mbarriers
  }
};

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
__device__ __forceinline__ __half2 as_h2(uint32_t v) { return *reinterpret_cast<const __half2*>(&v); }
__device__ __forceinline__ uint32_t as_u32(__half2 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// lane_codes for the types that are not codebooks: lo = codes of elements 4t..4t+3, hi = 16+4t..19+4t.
template <GgmlType T, int A>
__device__ __forceinline__ void lane_codes_lo_hi(const uint8_t* b, int u, int t, uint32_t& lo, uint32_t& hi) {
  using dq::al;
  using dq::ld_u32;
  constexpr uint32_t k4 = 0x0F0F0F0Fu;
  if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1) {
    constexpr int o = T == GgmlType::Q4_1 ? 4 : 2;  // qs: element j = lo(qs[j]), j + 16 = hi(qs[j])
    const uint32_t q = ld_u32<al(A, 2)>(b + o + 4 * t);
    lo = q & k4, hi = (q >> 4) & k4;
  } else if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
    constexpr int o = T == GgmlType::Q5_1 ? 4 : 2;  // qh (bit i: bit 4 of element i) | qs
    const uint32_t qh = ld_u32<al(A, 2)>(b + o), q = ld_u32<al(A, 2)>(b + o + 4 + 4 * t);
    lo = (q & k4) | dq::spread4(qh >> (4 * t)) << 4, hi = ((q >> 4) & k4) | dq::spread4(qh >> (16 + 4 * t)) << 4;
  } else if constexpr (T == GgmlType::Q8_0) {
    lo = ld_u32<al(A, 2)>(b + 2 + 4 * t) ^ 0x80808080u, hi = ld_u32<al(A, 2)>(b + 18 + 4 * t) ^ 0x80808080u;
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    constexpr int o = T == GgmlType::Q5_K ? 48 : 16;  // qs: unit u = nibble u % 2 of a 32-byte chunk
    const uint8_t* c = b + o + 32 * (u >> 1);
    const int s = 4 * (u & 1);
    lo = (ld_u32<al(A, 4)>(c + 4 * t) >> s) & k4, hi = (ld_u32<al(A, 4)>(c + 16 + 4 * t) >> s) & k4;
    if constexpr (T == GgmlType::Q5_K) {  // qh[32] at 16: bit u of byte l is bit 4 of element l
      lo |= ((ld_u32<al(A, 4)>(b + 16 + 4 * t) >> u) & 0x01010101u) << 4;
      hi |= ((ld_u32<al(A, 4)>(b + 32 + 4 * t) >> u) & 0x01010101u) << 4;
    }
  } else if constexpr (T == GgmlType::Q6_K) {
    const int h = u >> 2, c = u & 3, sl = 4 * (c >> 1), sh = 2 * c;
    const uint8_t* l = b + 64 * h + 32 * (c & 1);
    const uint8_t* q = b + 128 + 32 * h;
    lo = ((ld_u32<al(A, 2)>(l + 4 * t) >> sl) & k4) | ((ld_u32<al(A, 2)>(q + 4 * t) >> sh) & 0x03030303u) << 4;
    hi = ((ld_u32<al(A, 2)>(l + 16 + 4 * t) >> sl) & k4) | ((ld_u32<al(A, 2)>(q + 16 + 4 * t) >> sh) & 0x03030303u) << 4;
  } else {
    static_assert(T == GgmlType::Q4_0, "no lane codes for this type (mmq_type)");
  }
}

// The codes (dq::Q<T>: b = q + kOff) of elements 4t + j and 16 + 4t + j, j = 0..3, of unit u of block
// b — the 8 that lane t needs, no more — as byte pairs: w[0] = (e 4t, e 16+4t, e 4t+1, e 17+4t),
// w[1] = (e 4t+2, e 18+4t, e 4t+3, e 19+4t).
template <GgmlType T, int A>
__device__ __forceinline__ void lane_codes(const uint8_t* b, int u, int t, uint32_t (&w)[2]) {
  if constexpr (T == GgmlType::IQ4_NL || T == GgmlType::IQ4_XS) {
    // qs word t: element 4t + j in the low nibble of byte j, 16 + 4t + j in the high one; the
    // codebook lookup of q8::iq4_pairs yields the pairs order directly (values + 128: the codes).
    const uint32_t q = T == GgmlType::IQ4_XS ? dq::ld_u32<dq::al(A, 4)>(b + 8 + 16 * u + 4 * t)
                                             : dq::ld_u32<dq::al(A, 2)>(b + 2 + 4 * t);
    q8::iq4_pairs(q, w[0], w[1]);
    w[0] ^= 0x80808080u, w[1] ^= 0x80808080u;
  } else {
    uint32_t lo, hi;  // byte j: element 4t + j / 16 + 4t + j
    lane_codes_lo_hi<T, A>(b, u, t, lo, hi);
    w[0] = prmt(lo, hi, 0x5140), w[1] = prmt(lo, hi, 0x7362);
  }
}

// The scale pair (first half, second half of the unit) and offset pair of unit u of block blk,
// rounded to F16.
template <GgmlType T, int A>
__device__ __forceinline__ void unit_scales(const uint8_t* blk, int u, uint32_t& d, uint32_t& m) {
  const dq::Scales s = dq::Q<T>::template scales<A>(blk, u);
  d = as_u32(__floats2half2_rn(s.d[0], s.d[1]));
  m = as_u32(__floats2half2_rn(s.m[0], s.m[1]));
}

// Elements (4t + j, 16 + 4t + j), j = 0..3, of one unit as F16 pairs p[j] from lane_codes' pairs w
// and the unit's scales d, m: each code b placed in the mantissa of 1024 (exact), minus 1024 + kOff
// (exact), times the half's scale (and plus its offset), in F16: d * q (+ m) with d and m rounded to
// F16 first — within two F16 roundings of the host dequantizer's value (dequant_rows rounds once).
template <GgmlType T>
__device__ __forceinline__ void unit_pairs(const uint32_t (&w)[2], uint32_t d, uint32_t m, uint32_t (&p)[4]) {
  constexpr int kOff = dq::Q<T>::kOff;
  const __half2 bias = __float2half2_rn(1024.f + float(kOff));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2 q = __hsub2(as_h2(prmt(w[j >> 1], 0x64646464u, (j & 1) ? 0x4342u : 0x4140u)), bias);
    p[j] = as_u32(dq::Q<T>::kMin ? __hfma2(q, as_h2(d), as_h2(m)) : __hmul2(q, as_h2(d)));
  }
}

struct QArgs {
  const uint8_t* w;
  size_t w_stride;
  int64_t k, n;
  const __half* x16;  // [m][k], pairs order
  int m, nks;         // columns; k splits
  int64_t steps_per;  // steps of 256 per split
  float* y;
  int64_t y_stride;
  float* part;    // [nks][m][n] (nks > 1)
  unsigned* cnt;  // [row tiles] arrivals (zeroed by mmq_x_kernel)
  // Grouped (mmq_id; nks = 1): blockIdx.y is tile i of tiles = {first sorted column, expert << 8 |
  // columns (0: no tile)}; W = w + expert * w_estride, x16 the sorted columns; sorted column c is slot
  // order[c] = t * K + j, written to y + t * y_tok + j * y_slot.
  const int2* tiles = nullptr;
  const int32_t* order = nullptr;
  size_t w_estride = 0;
  int K = 1;
  int64_t y_tok = 0, y_slot = 0;
};

// x columns (x_stride floats apart) -> F16 [m][k] in pairs order; zeroes the n_cnt counters.
__global__ void mmq_x_kernel(const float* x, int64_t x_stride, int64_t k, int64_t m, __half2* out, unsigned* cnt,
                             int64_t n_cnt) {
  pdl::begin();
  const int64_t kp = k / 2, total = kp * m, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t c = i / kp, q = i - c * kp;  // pair q of column c: unit q / 16, elements e and e + 16
    const float* xc = x + c * x_stride + (q >> 4) * 32 + (q & 15);
    out[i] = __floats2half2_rn(xc[0], xc[16]);
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_cnt; i += stride) cnt[i] = 0;
}

// mmq_id, step 1 (one CTA of 1024 threads): counts the S slots per expert, lays the experts' columns
// out in expert order (order[off[e] + i] = the i-th slot routed to e, i in arrival order: each column
// is computed alone, so the results do not depend on it) and writes the tile table: ceil(count / 32)
// tiles per expert, then empty tiles up to max_tiles.
__global__ void __launch_bounds__(1024) mmq_id_group_kernel(const int32_t* ids, int S, int E, int max_tiles,
                                                            int32_t* order, int2* tiles) {
  __shared__ int cnt[kMmqIdMaxExperts], off[kMmqIdMaxExperts], toff[kMmqIdMaxExperts + 1];
  pdl::begin();
  const int tid = threadIdx.x, nt = blockDim.x;
  auto expert = [&](int s) { return min(max(ids[s], 0), E - 1); };
  for (int e = tid; e < E; e += nt) cnt[e] = 0;
  __syncthreads();
  for (int s = tid; s < S; s += nt) atomicAdd(&cnt[expert(s)], 1);
  __syncthreads();
  if (tid == 0) {
    int o = 0, tt = 0;
    for (int e = 0; e < E; ++e) off[e] = o, toff[e] = tt, o += cnt[e], tt += (cnt[e] + int(kMmqMaxM) - 1) / int(kMmqMaxM);
    toff[E] = tt;
  }
  __syncthreads();
  for (int e = tid; e < E; e += nt)
    for (int c0 = 0; c0 < cnt[e]; c0 += int(kMmqMaxM))
      tiles[toff[e] + c0 / int(kMmqMaxM)] = make_int2(off[e] + c0, e << 8 | min(int(kMmqMaxM), cnt[e] - c0));
  for (int i = toff[E] + tid; i < max_tiles; i += nt) tiles[i] = make_int2(0, 0);
  __syncthreads();
  for (int e = tid; e < E; e += nt) cnt[e] = 0;  // now the experts' cursors
  __syncthreads();
  for (int s = tid; s < S; s += nt) {
    const int e = expert(s);
    order[off[e] + atomicAdd(&cnt[e], 1)] = s;
  }
}

// mmq_id, step 2: the sorted columns of x to F16 [S][k] in pairs order (mmq_x_kernel's layout).
__global__ void mmq_id_x_kernel(const float* x, int64_t x_slot, int64_t x_tok, bool nx_one, int K,
                                const int32_t* order, int64_t k, int64_t S, __half2* out) {
  pdl::begin();
  const int64_t kp = k / 2, total = kp * S, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t c = i / kp, q = i - c * kp;
    const int s = order[c], t = s / K, j = s - t * K;
    const float* xc = x + t * x_tok + (nx_one ? 0 : j * x_slot) + (q >> 4) * 32 + (q & 15);
    out[i] = __floats2half2_rn(xc[0], xc[16]);
  }
}

template <GgmlType T, int A, int NT, bool BULK>
__global__ void __launch_bounds__(kThreads, 2) mmq_kernel(const QArgs a) {
  using G = Geo<T>;
  using D = dq::Q<T>;
  constexpr int kStage = G::template stage<NT>(), kStages = G::template stages<NT>();
  extern __shared__ __align__(128) uint8_t sm[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + kStages * kStage);
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = blockIdx.x, row0 = tile * kRows;
  const int64_t s0 = int64_t(a.tiles ? 0 : blockIdx.y) * a.steps_per, s1 = min(a.k / kStepK, s0 + a.steps_per);
  const int nst = int(s1 - s0);
  if constexpr (BULK) {
    if (tid == 0) {
      for (int i = 0; i < kStages; ++i) mb_init(smem_addr(&bars[i]), kThreads);
      mb_init_fence();
    }
    __syncthreads();
  }
  pdl::begin();
  const uint8_t* w = a.w;
  const __half* x16 = a.x16;
  int m = a.m;
  int64_t c0 = 0;  // grouped: the tile's first sorted column
  if (a.tiles != nullptr) {
    const int2 td = a.tiles[blockIdx.y];
    m = td.y & 0xFF;
    if (m == 0) return;  // the whole CTA: no tile here
    c0 = td.x;
    w += size_t(td.y >> 8) * a.w_estride;
    x16 += c0 * a.k;
  }

  // The 16-byte aligned range around row r's bytes of step s.
  auto row_src = [&](int64_t r, int64_t s) { return w + size_t(min(r, a.n - 1)) * a.w_stride + size_t(s) * G::kRB; };
  auto issue = [&](int64_t s, int slot) {
    uint8_t* st = sm + slot * kStage;
    if constexpr (BULK) {
      const uint32_t bar = smem_addr(&bars[slot]);
      if (tid < kRows) {
        const uintptr_t p = uintptr_t(row_src(row0 + tid, s));
        const uintptr_t lo = p & ~uintptr_t(15), hi = (p + G::kRB + 15) & ~uintptr_t(15);
        mb_bulk_load(bar, smem_addr(st + tid * G::kSlot), reinterpret_cast<const void*>(lo), uint32_t(hi - lo));
      } else if (tid - kRows < m) {
        const int c = tid - kRows;
        mb_bulk_load(bar, smem_addr(st + G::kW + c * kXCol), x16 + int64_t(c) * a.k + s * kStepK, 2 * kStepK);
      } else {
        mb_arrive(bar);
      }
    } else {
      for (int i = tid; i < kRows * G::kVR; i += kThreads) {
        const int r = i / G::kVR, v = i - r * G::kVR;
        const uintptr_t p = uintptr_t(row_src(row0 + r, s));
        const uintptr_t lo = (p & ~uintptr_t(15)) + 16 * v;
        if (lo < p + G::kRB) mv_cp16(st + r * G::kSlot + 16 * v, reinterpret_cast<const void*>(lo));
      }
      for (int i = tid; i < m * (2 * kStepK / 16); i += kThreads) {
        const int c = i / (2 * kStepK / 16), v = i - c * (2 * kStepK / 16);
        mv_cp16(st + G::kW + c * kXCol + 16 * v, x16 + int64_t(c) * a.k + s * kStepK + 8 * v);
      }
      mv_cp_commit();
    }
  };
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    if (i < nst) issue(s0 + i, i);
    else if constexpr (!BULK) mv_cp_commit();  // one group per stage, so the waits below count right
  }

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int wr = (tid >> 5) * 16 + g;  // this lane's rows: wr, wr + 8 of the tile
  for (int i = 0; i < nst; ++i) {
    const int slot = i % kStages;
    if constexpr (BULK) {
      mb_wait(smem_addr(&bars[slot]), uint32_t(i / kStages) & 1u);
    } else {
      mv_cp_wait<kStages - 1>();
      __syncthreads();
    }
    const uint8_t* st = sm + slot * kStage;
    const int64_t s = s0 + i;
    const uint8_t* r0 = st + wr * G::kSlot + (uintptr_t(row_src(row0 + wr, s)) & 15);
    const uint8_t* r8 = st + (wr + 8) * G::kSlot + (uintptr_t(row_src(row0 + wr + 8, s)) & 15);
    const uint8_t* xs = st + G::kW + 16 * t;
    // Scales once per (row, unit) of the step: lane t decodes units 2t, 2t + 1 of rows wr and wr + 8;
    // the 4 lanes of the row group share them by shuffles below.
    uint32_t sd[2][2], sm_[2][2];  // [row wr / wr + 8][unit 2t / 2t + 1]
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int u = 2 * t + q;
      unit_scales<T, A>(r0 + (u / G::kUPB) * D::kBS, u % G::kUPB, sd[0][q], sm_[0][q]);
      unit_scales<T, A>(r8 + (u / G::kUPB) * D::kBS, u % G::kUPB, sd[1][q], sm_[1][q]);
    }
#pragma unroll 1
    for (int u2 = 0; u2 < kStepK / 64; ++u2) {
      const int src = (lane & ~3) | u2;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int u = 2 * u2 + q;
        uint32_t w0[2], w8[2], p0[4], p8[4];
        lane_codes<T, A>(r0 + (u / G::kUPB) * D::kBS, u % G::kUPB, t, w0);
        lane_codes<T, A>(r8 + (u / G::kUPB) * D::kBS, u % G::kUPB, t, w8);
        const uint32_t d0 = __shfl_sync(0xFFFFFFFFu, sd[0][q], src), d8 = __shfl_sync(0xFFFFFFFFu, sd[1][q], src);
        uint32_t m0 = 0, m8 = 0;
        if constexpr (D::kMin) {
          m0 = __shfl_sync(0xFFFFFFFFu, sm_[0][q], src), m8 = __shfl_sync(0xFFFFFFFFu, sm_[1][q], src);
        }
        unit_pairs<T>(w0, d0, m0, p0);
        unit_pairs<T>(w8, d8, m8, p8);
        const uint32_t f0[4] = {p0[0], p8[0], p0[1], p8[1]}, f1[4] = {p0[2], p8[2], p0[3], p8[3]};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const int c = min(8 * j + g, m - 1);
          const uint4 xv = *reinterpret_cast<const uint4*>(xs + c * kXCol + 64 * u);
          mma::m16n8k16(acc[j], f0, xv.x, xv.y);
          mma::m16n8k16(acc[j], f1, xv.z, xv.w);
        }
      }
    }
    __syncthreads();  // every warp is done with the slot
    if (i + kStages < nst) issue(s + kStages, slot);
    else if constexpr (!BULK) mv_cp_commit();
  }

  // acc[j][e]: row row0 + wr + 8 (e >> 1), column 8j + 2t + (e & 1).
  if (a.tiles != nullptr) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + wr + 8 * (e >> 1);
        const int col = 8 * j + 2 * t + (e & 1);
        if (row >= a.n || col >= m) continue;
        const int sl = a.order[c0 + col], tk = sl / a.K;
        a.y[tk * a.y_tok + (sl - tk * a.K) * a.y_slot + row] = acc[j][e];
      }
    return;
  }
  const bool split = a.nks > 1;
  float* out = split ? a.part + int64_t(blockIdx.y) * a.m * a.n : a.y;
  const int64_t ostride = split ? a.n : a.y_stride;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + wr + 8 * (e >> 1);
      const int col = 8 * j + 2 * t + (e & 1);
      if (row < a.n && col < a.m) out[int64_t(col) * ostride + row] = acc[j][e];
    }
  if (!split) return;
  __shared__ unsigned last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&a.cnt[tile], 1u) == unsigned(a.nks - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = tid; i < kRows * a.m; i += kThreads) {
    const int c = i / kRows;
    const int64_t row = row0 + (i - c * kRows);
    if (row >= a.n) continue;
    float v = 0.f;
    for (int q = 0; q < a.nks; ++q) v += __ldcg(a.part + (int64_t(q) * a.m + c) * a.n + row);
    a.y[int64_t(c) * a.y_stride + row] = v;
  }
}

template <GgmlType T, int A, int NT, bool BULK>
void launch_kernel(const Launch& L, const QArgs& q, dim3 grid) {
  constexpr int smem = Geo<T>::template smem<NT>();
  static const bool attr_set =
      cudaFuncSetAttribute(mmq_kernel<T, A, NT, BULK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
      cudaSuccess;
  (void)attr_set;
  pdl::launch(L, grid, dim3(kThreads), smem, mmq_kernel<T, A, NT, BULK>, q);
}

template <GgmlType T>
void launch_t(const Launch& L, const QArgs& q, dim3 grid, bool bulk) {
  constexpr int kNat = dq::fast_align<T>();
  const bool nat = ((uintptr_t(q.w) | q.w_stride | q.w_estride) % kNat) == 0;
  auto go = [&](auto a_tag, auto b_tag) {
    constexpr int A = decltype(a_tag)::value;
    constexpr bool B = decltype(b_tag)::value;
    if (q.m <= 16) launch_kernel<T, A, 2, B>(L, q, grid);
    else if (q.m <= 24) launch_kernel<T, A, 3, B>(L, q, grid);
    else launch_kernel<T, A, 4, B>(L, q, grid);
  };
  auto with_bulk = [&](auto a_tag) {
    if (bulk) go(a_tag, std::true_type{});
    else go(a_tag, std::false_type{});
  };
  if (nat) with_bulk(std::integral_constant<int, kNat>{});
  else with_bulk(std::integral_constant<int, dq::min_align<T>()>{});
}

bool launch_type(const Launch& L, GgmlType t, const QArgs& q, dim3 grid) {
  const bool bulk = matvec_bulk(L.sm);
  switch (t) {
    case GgmlType::Q4_0: launch_t<GgmlType::Q4_0>(L, q, grid, bulk); break;
    case GgmlType::Q4_1: launch_t<GgmlType::Q4_1>(L, q, grid, bulk); break;
    case GgmlType::Q5_0: launch_t<GgmlType::Q5_0>(L, q, grid, bulk); break;
    case GgmlType::Q5_1: launch_t<GgmlType::Q5_1>(L, q, grid, bulk); break;
    case GgmlType::Q8_0: launch_t<GgmlType::Q8_0>(L, q, grid, bulk); break;
    case GgmlType::IQ4_NL: launch_t<GgmlType::IQ4_NL>(L, q, grid, bulk); break;
    case GgmlType::Q4_K: launch_t<GgmlType::Q4_K>(L, q, grid, bulk); break;
    case GgmlType::Q5_K: launch_t<GgmlType::Q5_K>(L, q, grid, bulk); break;
    case GgmlType::Q6_K: launch_t<GgmlType::Q6_K>(L, q, grid, bulk); break;
    case GgmlType::IQ4_XS: launch_t<GgmlType::IQ4_XS>(L, q, grid, bulk); break;
    default: return false;  // mmq_plan / mmq_id_plan admit only the types above
  }
  return true;
}

}  // namespace

bool mmq(const Launch& L, GgmlType t, const uint8_t* w, size_t w_stride, int64_t k, int64_t n, const float* x,
         int64_t x_stride, float* y, int64_t y_stride, int64_t m) {
  const MmqPlan p = mmq_plan(t, k, n, m);
  if (!p.ok || !mmq_on(L.sm) || L.ws == nullptr || L.ws_bytes < p.bytes) return false;
  auto* base = static_cast<uint8_t*>(L.ws);
  auto* x16 = reinterpret_cast<__half*>(base);
  auto* part = reinterpret_cast<float*>(base + p.part_off);
  auto* cnt = reinterpret_cast<unsigned*>(base + p.cnt_off);
  const int64_t tiles = (n + kRows - 1) / kRows;
  const int64_t pairs = k / 2 * m;
  pdl::launch(L, dim3(unsigned(std::min<int64_t>((pairs + 255) / 256, 1024))), dim3(256), 0, mmq_x_kernel, x, x_stride,
              k, m, reinterpret_cast<__half2*>(x16), cnt, p.nks > 1 ? tiles : int64_t(0));
  const QArgs q{w, w_stride, k, n, x16, int(m), p.nks, p.steps_per, y, y_stride, part, cnt};
  return launch_type(L, t, q, dim3(unsigned(tiles), unsigned(p.nks)));
}

bool mmq_id(const Launch& L, GgmlType t, const uint8_t* w, size_t w_stride, size_t w_estride, int64_t n_expert,
            int64_t k, int64_t n, const float* x, int64_t nx, int64_t x_slot, int64_t x_tok, const int32_t* ids,
            int64_t K, int64_t T, float* y, int64_t y_slot, int64_t y_tok) {
  const int64_t S = K * T;
  const MmqIdPlan p = mmq_id_plan(t, k, n, S);
  const int64_t max_tiles = mmq_id_max_tiles(S, n_expert);
  if (!p.ok || n_expert < 1 || n_expert > kMmqIdMaxExperts || max_tiles > 65535 || !mmq_on(L.sm) ||
      L.ws == nullptr || L.ws_bytes < p.bytes)
    return false;
  auto* base = static_cast<uint8_t*>(L.ws);
  auto* x16 = reinterpret_cast<__half*>(base);
  auto* order = reinterpret_cast<int32_t*>(base + p.order_off);
  auto* tiles = reinterpret_cast<int2*>(base + p.tile_off);
  pdl::launch(L, dim3(1), dim3(1024), 0, mmq_id_group_kernel, ids, int(S), int(n_expert), int(max_tiles), order, tiles);
  const int64_t pairs = k / 2 * S;
  pdl::launch(L, dim3(unsigned(std::min<int64_t>((pairs + 255) / 256, 2048))), dim3(256), 0, mmq_id_x_kernel, x, x_slot,
              x_tok, nx == 1, int(K), static_cast<const int32_t*>(order), k, S, reinterpret_cast<__half2*>(x16));
  QArgs q{w, w_stride, k, n, x16, int(kMmqMaxM), 1, k / kStepK, y, 0, nullptr, nullptr};
  q.tiles = tiles, q.order = order, q.w_estride = w_estride, q.K = int(K), q.y_tok = y_tok, q.y_slot = y_slot;
  return launch_type(L, t, q, dim3(unsigned((n + kRows - 1) / kRows), unsigned(max_tiles)));
}

}  // namespace kiln::cuda::detail
