// kernels/cuda/attention.cu — the KV-cache store and flash attention behind cuda_ops.h.
// Owns: kv_store (F32 / F16 / Q8_0 / Q4_0 rows; the quantized types as the reference quantizers in
//   tensor/quant.cpp round them: Q8_0 d = amax/127 and round-half-away, Q4_0 d = signed max / -8 and
//   trunc(x/d + 8.5)), attention (online-softmax flash attention over the same four cache types,
//   dequantized in the kernel; GQA; causal per token from seq/pos on the device, or every key of the
//   slot for an encoder: AttnArgs::causal) and its workspace.
//   Layout of the work: a block takes a tile of bq consecutive tokens (1 when the batch is small, i.e.
//   decode) times hg query heads of one KV group, and one KV range ("split"). Tokens of different
//   slots inside a tile are taken one sub-run at a time. When tiles x head groups alone cannot fill the
//   GPU (decode), the key range is split across blocks (flash-decoding): each writes an unnormalised
//   partial (O, m, l) to the workspace and attn_merge combines them. Scores are in log2 units (q is
//   pre-scaled by scale * log2 e); K/V tiles are staged in shared memory as F32 (for F16 / Q8_0 /
//   Q4_0 caches the global loads of tile n+1 are issued into registers before tile n is computed);
//   sums are F32. Prefill-sized batches over F16 / Q8_0 / Q4_0 caches: the tiles that hold one run go
//   to the tensor-core kernel (attention_mma.cu) and these kernels skip them (attn_tile_whole);
//   decode-sized batches over those caches with head_dim 64 / 128 / 256 go to attention_decode.cu
//   (same plan, same partials for attn_merge).
// Must not: allocate, synchronize or read device memory on the host; rotate (the Hadamard rotation of
//   quantized caches is the caller's). Argument errors are KILN_CHECK failures before any enqueue.
// Threading: launchers only enqueue on L.stream; the one-time shared-memory attribute set-up is a
//   thread-safe function-local static.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/workspace.h"

namespace kiln::cuda {
namespace {

using namespace attn;  // attention_common.cuh

#define KILN_ATTN_LAUNCHED(what)                                                                   \
  do {                                                                                             \
    const cudaError_t e_ = cudaGetLastError();                                                     \
    KILN_CHECK(e_ == cudaSuccess, "{}: kernel launch failed: {}", what, cudaGetErrorString(e_));   \
  } while (0)

constexpr int kThreads = 128;        // every attention block
// The work layout's constants (kernels/cuda/workspace.h: shared with attention_workspace).
constexpr int64_t kMaxSplit = detail::kAttnMaxSplit;
constexpr float kLog2e = 1.4426950408889634f;

// tensor/quant.cpp's scale_to_fp16: NaN -> 0, overflow saturates to the largest finite half.
__device__ __forceinline__ unsigned short scale_to_half_bits(float v) {
  if (isnan(v)) return 0;
  unsigned short h = __half_as_ushort(__float2half_rn(v));
  if ((h & 0x7fff) == 0x7c00) h = (unsigned short)((h & 0x8000) | 0x7bff);
  return h;
}

// ---- kv_store ---------------------------------------------------------------------------------

struct StoreArgs {
  const float* x;
  int64_t x_s1, x_s2, D, Hkv;
  const int32_t* seq;
  const int32_t* pos;
  char* c;
  int code;
  size_t nb1, nb2, nb3;
};

// One block per (token, kv head) row; Q8_0/Q4_0: one warp per 32-element block.
__global__ void __launch_bounds__(kThreads) kv_store_kernel(const StoreArgs a) {
  pdl::begin();  // pdl.cuh: nothing global before this
  const int64_t t = blockIdx.x / a.Hkv, h = blockIdx.x % a.Hkv;
  const float* src = a.x + h * a.x_s1 + t * a.x_s2;
  char* dst = a.c + size_t(h) * a.nb1 + size_t(a.pos[t]) * a.nb2 + size_t(a.seq[t]) * a.nb3;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (a.code == kF32) {
    for (int64_t i = tid; i < a.D; i += kThreads) reinterpret_cast<float*>(dst)[i] = src[i];
  } else if (a.code == kF16) {
    for (int64_t i = tid; i < a.D; i += kThreads) reinterpret_cast<__half*>(dst)[i] = __float2half_rn(src[i]);
  } else if (a.code == kQ8) {
    for (int64_t b = warp; b < a.D / 32; b += kThreads / 32) {
      const float v = src[b * 32 + lane];
      const float d = warp_max(fabsf(v)) / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const float z = __fmul_rn(v, id);
      const int q = isnan(z) ? 0 : z <= -127.0f ? -127 : z >= 127.0f ? 127 : int(roundf(z));
      char* blk = dst + b * 34;
      blk[2 + lane] = char(q);
      if (lane == 0) *reinterpret_cast<unsigned short*>(blk) = scale_to_half_bits(d);
    }
  } else {
    for (int64_t b = warp; b < a.D / 32; b += kThreads / 32) {
      const float v = src[b * 32 + lane];
      // The element of largest magnitude, the first one on ties (signed_absmax).
      float am = fabsf(v);
      if (isnan(am)) am = 0.0f;
      int idx = lane;
      for (int o = 16; o > 0; o >>= 1) {
        const float am2 = __shfl_xor_sync(0xffffffffu, am, o);
        const int idx2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (am2 > am || (am2 == am && idx2 < idx)) { am = am2; idx = idx2; }
      }
      const float vmax = __shfl_sync(0xffffffffu, v, idx);
      const float mx = am > 0.0f ? vmax : 0.0f;
      const float d = mx / -8.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const float z = __fadd_rn(__fmul_rn(v, id), 8.5f);
      const int q = !(z >= 0.0f) ? 0 : z >= 15.0f ? 15 : int(z);
      const int hi = __shfl_down_sync(0xffffffffu, q, 16);
      char* blk = dst + b * 18;
      if (lane < 16) blk[2 + lane] = char(q | (hi << 4));
      if (lane == 0) *reinterpret_cast<unsigned short*>(blk) = scale_to_half_bits(d);
    }
  }
}

// ---- attention --------------------------------------------------------------------------------

__device__ __forceinline__ void store8(float* dst, const float f[8]) {
  float4* o = reinterpret_cast<float4*>(dst);
  o[0] = make_float4(f[0], f[1], f[2], f[3]);
  o[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// Item `it` of this thread in a [BK][DM] tile: row (key) and first element.
template <int DM>
__device__ __forceinline__ void item_pos(int it, int& row, int& e) {
  const int idx = threadIdx.x + it * kThreads;
  row = idx / (DM / 8), e = (idx % (DM / 8)) * 8;
}

// Keys k0..k0+BK-1 of one (kv head, slot) into dst [BK][DM+4] as floats; rows >= kv_hi and columns
// >= D are zero (no NaN from unwritten cache rows reaches the P.V sums).
template <int DM, int BK>
__device__ __forceinline__ void load_one(const CacheArg& c, const char* base, int k0, int kv_hi, int D, float* dst) {
  constexpr int LD = DM + 4, NIT = BK * (DM / 8) / kThreads;
  static_assert(BK * (DM / 8) % kThreads == 0);
  if (c.code == kF32) {
    float4 ra[NIT], rb[NIT];
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      int row, e;
      item_pos<DM>(it, row, e);
      if (k0 + row < kv_hi && e < D) {
        const float* p = reinterpret_cast<const float*>(base + size_t(k0 + row) * c.nb2) + e;
        if (c.vec) {
          ra[it] = *reinterpret_cast<const float4*>(p), rb[it] = *reinterpret_cast<const float4*>(p + 4);
        } else {
          ra[it] = make_float4(p[0], p[1], p[2], p[3]), rb[it] = make_float4(p[4], p[5], p[6], p[7]);
        }
      }
    }
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      int row, e;
      item_pos<DM>(it, row, e);
      const bool ok = k0 + row < kv_hi && e < D;
      float4* o = reinterpret_cast<float4*>(dst + row * LD + e);
      o[0] = ok ? ra[it] : make_float4(0.f, 0.f, 0.f, 0.f);
      o[1] = ok ? rb[it] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  } else {
    uint4 r[NIT];
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      int row, e;
      item_pos<DM>(it, row, e);
      if (k0 + row < kv_hi && e < D) r[it] = fetch16(c, base + size_t(k0 + row) * c.nb2, e);
    }
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
      int row, e;
      item_pos<DM>(it, row, e);
      float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (k0 + row < kv_hi && e < D) convert16(c.code, r[it], e, f);
      store8(dst + row * LD + e, f);
    }
  }
}

// The K and V tiles of 16-bit-or-narrower types: fetch_kv issues the global loads of both tiles
// into registers (the kernel fetches tile n+1 before it computes tile n), store_kv converts them
// into shared memory. F32 (or either F32) caches take load_one per tile, unpipelined.
template <int DM, int BK>
struct KvRegs {
  static constexpr int NIT = BK * (DM / 8) / kThreads;
  uint4 k[NIT], v[NIT];
};
template <int DM, int BK>
__device__ __forceinline__ void fetch_kv(const CacheArg& k, const char* kb, const CacheArg& v, const char* vb, int k0,
                                         int kv_hi, int D, KvRegs<DM, BK>& r) {
#pragma unroll
  for (int it = 0; it < KvRegs<DM, BK>::NIT; ++it) {
    int row, e;
    item_pos<DM>(it, row, e);
    if (k0 + row < kv_hi && e < D) {
      r.k[it] = fetch16(k, kb + size_t(k0 + row) * k.nb2, e);
      r.v[it] = fetch16(v, vb + size_t(k0 + row) * v.nb2, e);
    }
  }
}
template <int DM, int BK>
__device__ __forceinline__ void store_kv(int kcode, int vcode, int k0, int kv_hi, int D, const KvRegs<DM, BK>& r,
                                         float* ks, float* vs) {
  constexpr int LD = DM + 4;
#pragma unroll
  for (int it = 0; it < KvRegs<DM, BK>::NIT; ++it) {
    int row, e;
    item_pos<DM>(it, row, e);
    const bool ok = k0 + row < kv_hi && e < D;
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (ok) convert16(kcode, r.k[it], e, f);
    store8(ks + row * LD + e, f);
    if (ok) convert16(vcode, r.v[it], e, f);
    store8(vs + row * LD + e, f);
  }
}

template <int DM, int BK, int RM>
constexpr size_t attn_smem() {
  return size_t(RM * (DM + 4) + 2 * BK * (DM + 4) + RM * BK) * sizeof(float);
}

// grid (tiles, head groups, splits). Block: the rows r = i*hg + j (token ta+i, q head hg0+j) of each
// sub-run of its tile, keys [split*chunk, min(+chunk, max pos + 1)).
template <int DM, int BK, int RM>
__global__ void __launch_bounds__(kThreads) attn_kernel(const AttnK p) {
  pdl::begin();  // pdl.cuh: nothing global before this
  constexpr int LD = DM + 4;
  static_assert(RM % 4 == 0 && RM <= 16);
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;             // [RM][LD] q rows, pre-scaled
  float* Ks = Qs + RM * LD;   // [BK][LD]
  float* Vs = Ks + BK * LD;   // [BK][LD]
  float* Ps = Vs + BK * LD;   // [RM][BK] scores, then probabilities
  __shared__ float corr_s[RM], l_s[RM], m_s[RM];
  __shared__ int rpos_s[RM];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t_begin = blockIdx.x * p.bq, t_end = min(p.T, t_begin + p.bq);
  if (p.mma_bt > 0 && attn_tile_whole(p.seq, p.T, t_begin / p.mma_bt * p.mma_bt, p.mma_bt)) return;
  const int h0 = blockIdx.y * p.hg;
  const int64_t kvh = h0 / p.G;
  const int split = blockIdx.z;

  // score phase: thread = (key kk, row group rg)
  constexpr int NRG = kThreads / BK, RPT = (RM + NRG - 1) / NRG;
  const int kk = tid % BK, rg = tid / BK;
  // P.V phase: thread = (columns cd + j*TD, rows rg2 + i*NRG2)
  constexpr int TD = DM < 128 ? DM : 128, CPT = DM / TD, NRG2 = kThreads / TD, RPT2 = RM / NRG2;
  static_assert(RM % NRG2 == 0);
  const int cd = tid % TD, rg2 = tid / TD;
  constexpr int RW = RM / 4;  // softmax rows per warp

  for (int ta = t_begin; ta < t_end;) {
    const int slot = p.seq[ta];
    int tb = ta + 1;
    while (tb < t_end && p.seq[tb] == slot) ++tb;
    const int nrow = (tb - ta) * p.hg;
    int pmax = 0;
    for (int t = ta; t < tb; ++t) pmax = max(pmax, attn_last(p, t));
    const int kv_lo = split * p.chunk, kv_hi = min(kv_lo + p.chunk, pmax + 1);

    {  // q rows (all loads in flight before the stores)
      constexpr int QIT = (RM * (DM / 4) + kThreads - 1) / kThreads;
      float4 qv[QIT];
#pragma unroll
      for (int it = 0; it < QIT; ++it) {
        const int idx = tid + it * kThreads, r = idx / (DM / 4), e = (idx % (DM / 4)) * 4;
        qv[it] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (idx < RM * (DM / 4) && r < nrow && e < p.D) {
          const int t = ta + r / p.hg, h = h0 + r % p.hg;
          const float* src = p.q + int64_t(t) * p.q_s2 + int64_t(h) * p.q_s1 + e;
          qv[it] = make_float4(src[0], src[1], src[2], src[3]);
        }
      }
#pragma unroll
      for (int it = 0; it < QIT; ++it) {
        const int idx = tid + it * kThreads, r = idx / (DM / 4), e = (idx % (DM / 4)) * 4;
        if (idx < RM * (DM / 4))
          *reinterpret_cast<float4*>(Qs + r * LD + e) =
              make_float4(qv[it].x * p.qscale, qv[it].y * p.qscale, qv[it].z * p.qscale, qv[it].w * p.qscale);
      }
    }
    if (tid < RM) rpos_s[tid] = tid < nrow ? attn_last(p, ta + tid / p.hg) : -1;

    float m_r[RW], l_r[RW];
#pragma unroll
    for (int i = 0; i < RW; ++i) m_r[i] = -INFINITY, l_r[i] = 0.0f;
    float acc[RPT2][CPT];
#pragma unroll
    for (int i = 0; i < RPT2; ++i)
#pragma unroll
      for (int j = 0; j < CPT; ++j) acc[i][j] = 0.0f;

    const char* kb = p.k.p + size_t(kvh) * p.k.nb1 + size_t(slot) * p.k.nb3;
    const char* vb = p.v.p + size_t(kvh) * p.v.nb1 + size_t(slot) * p.v.nb3;
    const bool narrow = p.k.code != kF32 && p.v.code != kF32;
    KvRegs<DM, BK> kvr;
    if (narrow && kv_lo < kv_hi) fetch_kv<DM, BK>(p.k, kb, p.v, vb, kv_lo, kv_hi, p.D, kvr);
    for (int k0 = kv_lo; k0 < kv_hi; k0 += BK) {
      __syncthreads();  // Qs / rpos_s written; the previous tile's Ks / Vs / Ps consumed
      if (narrow) {
        store_kv<DM, BK>(p.k.code, p.v.code, k0, kv_hi, p.D, kvr, Ks, Vs);
        if (k0 + BK < kv_hi) fetch_kv<DM, BK>(p.k, kb, p.v, vb, k0 + BK, kv_hi, p.D, kvr);  // in flight meanwhile
      } else {
        load_one<DM, BK>(p.k, kb, k0, kv_hi, p.D, Ks);
        load_one<DM, BK>(p.v, vb, k0, kv_hi, p.D, Vs);
      }
      __syncthreads();
      {  // scores s[r][kk] = q_r . k_kk, four partial sums per row (short FMA chains)
        float4 s[RPT];
#pragma unroll
        for (int i = 0; i < RPT; ++i) s[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        const float* kr = Ks + kk * LD;
#pragma unroll 4
        for (int d = 0; d < DM; d += 4) {
          const float4 kv = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
          for (int i = 0; i < RPT; ++i) {
            const int r = rg + i * NRG;
            if (r < RM && r < nrow) {
              const float4 qv = *reinterpret_cast<const float4*>(Qs + r * LD + d);
              s[i].x = fmaf(qv.x, kv.x, s[i].x);
              s[i].y = fmaf(qv.y, kv.y, s[i].y);
              s[i].z = fmaf(qv.z, kv.z, s[i].z);
              s[i].w = fmaf(qv.w, kv.w, s[i].w);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
          const int r = rg + i * NRG;
          if (r < RM && r < nrow) Ps[r * BK + kk] = (s[i].x + s[i].y) + (s[i].z + s[i].w);
        }
      }
      __syncthreads();
      // online softmax, one warp per row
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const int r = warp + 4 * i;
        if (r >= nrow) continue;
        constexpr int KPL = (BK + 31) / 32;
        float sv[KPL], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < KPL; ++j) {
          const int k = lane + 32 * j;
          const bool ok = k < BK && k0 + k < kv_hi && k0 + k <= rpos_s[r];
          sv[j] = ok ? Ps[r * BK + k] : -INFINITY;
          mx = fmaxf(mx, sv[j]);
        }
        const float m_new = fmaxf(m_r[i], warp_max(mx));
        float c = 1.0f, sum = 0.0f;
        if (m_new != -INFINITY) {
          c = exp2f(m_r[i] - m_new);
#pragma unroll
          for (int j = 0; j < KPL; ++j) sum += (sv[j] = exp2f(sv[j] - m_new));
        } else {
#pragma unroll
          for (int j = 0; j < KPL; ++j) sv[j] = 0.0f;
        }
        sum = warp_sum(sum);
        l_r[i] = l_r[i] * c + sum;
        m_r[i] = m_new;
#pragma unroll
        for (int j = 0; j < KPL; ++j)
          if (lane + 32 * j < BK) Ps[r * BK + lane + 32 * j] = sv[j];
        if (lane == 0) corr_s[r] = c;
      }
      __syncthreads();
      // acc = acc * corr + P . V
#pragma unroll
      for (int i = 0; i < RPT2; ++i) {
        const int r = rg2 + i * NRG2;
        if (r < nrow) {
          const float c = corr_s[r];
#pragma unroll
          for (int j = 0; j < CPT; ++j) acc[i][j] *= c;
        }
      }
      const int kn = min(BK, kv_hi - k0);
      for (int k = 0; k < kn; k += 4) {
        float v[4][CPT];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int j = 0; j < CPT; ++j) v[u][j] = Vs[(k + u) * LD + cd + j * TD];
#pragma unroll
        for (int i = 0; i < RPT2; ++i) {
          const int r = rg2 + i * NRG2;
          if (r < nrow) {
            const float4 pp = *reinterpret_cast<const float4*>(Ps + r * BK + k);
#pragma unroll
            for (int j = 0; j < CPT; ++j)
              acc[i][j] = fmaf(pp.w, v[3][j], fmaf(pp.z, v[2][j], fmaf(pp.y, v[1][j], fmaf(pp.x, v[0][j], acc[i][j]))));
          }
        }
      }
    }

    // the softmax warps publish m, l of their rows; the P.V owners write out / the partials
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      const int r = warp + 4 * i;
      if (r < nrow && lane == 0) m_s[r] = m_r[i], l_s[r] = l_r[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RPT2; ++i) {
      const int r = rg2 + i * NRG2;
      if (r >= nrow) continue;
      const int t = ta + r / p.hg, h = h0 + r % p.hg;
      if (p.n_split == 1) {
        const float inv = l_s[r] > 0.0f ? 1.0f / l_s[r] : 0.0f;
        float* o = p.out + int64_t(t) * p.o_s2 + int64_t(h) * p.o_s1;
#pragma unroll
        for (int j = 0; j < CPT; ++j)
          if (cd + j * TD < p.D) o[cd + j * TD] = acc[i][j] * inv;
      } else {
        const int64_t prow = (int64_t(split) * p.T + t) * p.Hq + h;
        float* o = p.part_o + prow * p.D;
#pragma unroll
        for (int j = 0; j < CPT; ++j)
          if (cd + j * TD < p.D) o[cd + j * TD] = acc[i][j];
        if (cd == 0) p.part_ml[prow * 2] = m_s[r], p.part_ml[prow * 2 + 1] = l_s[r];
      }
    }
    __syncthreads();  // before the next sub-run rewrites Qs / m_s / l_s
    ta = tb;
  }
}

// grid (token x q head, column groups of 32): out = sum_s w_s O_s / sum_s w_s l_s with
// w_s = 2^(m_s - max m). Lanes take columns, the 8 warps take every 8th split (loads in flight
// together), then the warps' sums are added.
constexpr int kMergeThreads = 256;
static_assert(kMaxSplit <= kMergeThreads);
__global__ void __launch_bounds__(kMergeThreads) attn_merge(const AttnK p) {
  pdl::begin();  // pdl.cuh: nothing global before this
  constexpr int NW = kMergeThreads / 32;
  __shared__ float w_s[kMaxSplit], red[NW], acc_s[NW][33];
  const int64_t row = blockIdx.x, t = row / p.Hq, h = row % p.Hq, rows = int64_t(p.T) * p.Hq;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The row's splits: the tensor-core tile's key ranges (mma_splits of its keys) or this file's.
  int ns = p.n_split;
  if (p.mma_bt > 0) {
    const int t0 = int(t) / p.mma_bt * p.mma_bt;
    if (attn_tile_whole(p.seq, p.T, t0, p.mma_bt)) ns = mma_splits(attn_last(p, min(p.T, t0 + p.mma_bt) - 1) + 1, p.mma_split);
  }
  if (ns == 1) return;  // that kernel wrote the row itself
  float m = -INFINITY, l = 0.0f;
  if (tid < ns) {
    const float* ml = p.part_ml + (tid * rows + row) * 2;
    l = ml[1];
    if (l > 0.0f) m = ml[0];
  }
  float mx = warp_max(m);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
#pragma unroll
  for (int i = 1; i < NW; ++i) mx = fmaxf(mx, red[i]);
  const float w = l > 0.0f ? exp2f(m - mx) : 0.0f;
  if (tid < kMaxSplit) w_s[tid] = w;
  __syncthreads();  // red[] read by all before it is reused
  float lsum = warp_sum(w * l);
  if (lane == 0) red[warp] = lsum;
  __syncthreads();
  lsum = 0.0f;
#pragma unroll
  for (int i = 0; i < NW; ++i) lsum += red[i];
  const int d = blockIdx.y * 32 + lane;
  float a = 0.0f;
  if (d < p.D) {
#pragma unroll 4
    for (int s = warp; s < ns; s += NW) a = fmaf(w_s[s], p.part_o[(s * rows + row) * p.D + d], a);
  }
  acc_s[warp][lane] = a;
  __syncthreads();
  if (warp == 0 && d < p.D) {
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < NW; ++i) o += acc_s[i][lane];
    p.out[t * p.o_s2 + h * p.o_s1 + d] = lsum > 0.0f ? o / lsum : 0.0f;
  }
}

// The work layout (kernels/cuda/workspace.cpp), a function of (args, n_tok, n_kv) only, so that
// attention_workspace and the launcher agree.
using Plan = detail::AttnPlan;
Plan make_plan(const AttnArgs& a, int64_t T, int64_t n_kv) {
  return detail::attn_make_plan(a.head_dim, a.n_head, a.n_head_kv, T, n_kv);
}
void set_splits(Plan& pl, int64_t n_kv, int64_t ns) { detail::attn_set_splits(pl, n_kv, ns); }
size_t part_bytes(const AttnArgs& a, int64_t T, int n_split) {
  return detail::attn_part_bytes(a.head_dim, a.n_head, T, n_split);
}

template <int DM, int BK, int RM>
void launch_attn(const AttnK& k, const Plan& pl, const Launch& L) {
  constexpr size_t smem = attn_smem<DM, BK, RM>();
  static const bool attr_set = [] {
    return cudaFuncSetAttribute(attn_kernel<DM, BK, RM>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) ==
           cudaSuccess;
  }();
  KILN_CHECK(attr_set, "attention: {} bytes of shared memory refused (head_dim {})", smem, DM);
  pdl::launch(L, dim3(unsigned(pl.tiles), unsigned(pl.groups), unsigned(pl.n_split)), dim3(kThreads), smem,
              attn_kernel<DM, BK, RM>, k);
}

template <int DM, int BK>
void launch_rm(const AttnK& k, const Plan& pl, const Launch& L) {
  if (pl.rm == 4) launch_attn<DM, BK, 4>(k, pl, L);
  else if (pl.rm == 8) launch_attn<DM, BK, 8>(k, pl, L);
  else if constexpr (DM < 512) launch_attn<DM, BK, 16>(k, pl, L);
}

void check_cache(const char* what, const SeqMem& m, int64_t D) {
  const int code = cache_code(m.type);
  KILN_CHECK(code >= 0, "{}: cache type {} is not F32/F16/Q8_0/Q4_0", what, int(m.type));
  KILN_CHECK(m.ne0 == D, "{}: cache row of {} elements, head_dim {}", what, m.ne0, D);
  KILN_CHECK(code <= kF16 || D % 32 == 0, "{}: quantized cache needs head_dim % 32 == 0 (got {})", what, D);
  KILN_CHECK(((reinterpret_cast<uintptr_t>(m.p) | m.nb1 | m.nb2 | m.nb3) % (code == kF32 ? 4 : 2)) == 0,
             "{}: cache rows misaligned", what);
}

}  // namespace

void kv_store(const Launch& L, Rows x, const int32_t* seq, const int32_t* pos, SeqMem cache) {
  const int64_t T = x.n2;
  if (T == 0 || x.n1 == 0) return;
  check_cache("kv_store", cache, x.ne0);
  KILN_CHECK(x.n1 == cache.ne1, "kv_store: {} heads into a cache of {}", x.n1, cache.ne1);
  StoreArgs a{x.p, x.s1, x.s2, x.ne0, x.n1, seq, pos, static_cast<char*>(cache.p), cache_code(cache.type),
              cache.nb1, cache.nb2, cache.nb3};
  pdl::launch(L, dim3(unsigned(T * x.n1)), dim3(kThreads), 0, kv_store_kernel, a);
  KILN_ATTN_LAUNCHED("kv_store");
}

void attention(const Launch& L, Rows q, const int32_t* seq, const int32_t* pos, SeqMem k, SeqMem v, const AttnArgs& a,
               Rows out) {
  const int64_t T = q.n2, D = a.head_dim;
  if (T == 0) return;
  KILN_CHECK(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0, "attention: n_head {} n_head_kv {}",
             a.n_head, a.n_head_kv);
  KILN_CHECK(D > 0 && D <= 512 && D % 8 == 0, "attention: head_dim {} (need a multiple of 8, <= 512)", D);
  KILN_CHECK(q.ne0 == D && q.n1 == a.n_head && out.ne0 == D && out.n1 == a.n_head && out.n2 == T,
             "attention: q / out shapes do not match head_dim {} x n_head {} x {} tokens", D, a.n_head, T);
  check_cache("attention K", k, D);
  check_cache("attention V", v, D);
  KILN_CHECK(k.ne1 == a.n_head_kv && v.ne1 == a.n_head_kv, "attention: caches of {} / {} heads, n_head_kv {}", k.ne1,
             v.ne1, a.n_head_kv);
  const int64_t n_kv = std::max<int64_t>(1, a.n_kv_max > 0 && a.causal ? std::min(a.n_kv_max, k.ne2) : k.ne2);
  Plan pl = make_plan(a, T, n_kv);
  // A smaller workspace than attention_workspace asked for: as many splits as fit.
  while (pl.part_splits() > 1 && (L.ws == nullptr || L.ws_bytes < part_bytes(a, T, pl.part_splits()))) {
    if (pl.mma_split > 1) --pl.mma_split;
    else set_splits(pl, n_kv, pl.n_split - 1);
  }
  float* part_o = static_cast<float*>(L.ws);
  float* part_ml = pl.part_splits() > 1
                       ? reinterpret_cast<float*>(static_cast<char*>(L.ws) +
                                                  (size_t(pl.part_splits()) * size_t(T) * size_t(a.n_head) * size_t(D) * 4 + 255) /
                                                      256 * 256)
                       : nullptr;
  AttnK p;
  // The tiles of whole runs, on tensor cores (their key ranges' partials in the same layout).
  p.mma_bt = detail::attention_mma(L, q, seq, pos, k, v, a, out, pl.mma_split, part_o, part_ml);
  p.mma_split = pl.mma_split;
  p.q = q.p, p.q_s1 = q.s1, p.q_s2 = q.s2;
  p.out = out.p, p.o_s1 = out.s1, p.o_s2 = out.s2;
  p.seq = seq, p.pos = pos;
  p.k = cache_arg(k), p.v = cache_arg(v);
  p.last_all = a.causal ? -1 : int(k.ne2 - 1);
  p.D = int(D), p.T = int(T), p.Hq = int(a.n_head), p.G = int(a.n_head / a.n_head_kv), p.hg = pl.hg, p.bq = pl.bq;
  p.qscale = a.scale * kLog2e;
  p.n_split = pl.n_split, p.chunk = int(pl.chunk);
  p.part_o = part_o;
  p.part_ml = part_ml;
  if (!detail::attention_decode(L, p, pl)) {
    switch (pl.dm) {
      case 64: launch_rm<64, 64>(p, pl, L); break;
      case 128: launch_rm<128, 32>(p, pl, L); break;
      case 256: launch_rm<256, 32>(p, pl, L); break;
      default: launch_rm<512, 16>(p, pl, L); break;
    }
  }
  KILN_ATTN_LAUNCHED("attention");
  if (pl.n_split > 1 || (p.mma_bt > 0 && pl.mma_split > 1)) {
    pdl::launch(L, dim3(unsigned(T * a.n_head), unsigned((D + 31) / 32)), dim3(kMergeThreads), 0, attn_merge, p);
    KILN_ATTN_LAUNCHED("attention merge");
  }
}

}  // namespace kiln::cuda
