// kernels/cuda/attention_mma.cu — the tensor-core path of attention (cuda_ops.h) for prefill-sized
//   batches: flash attention with mma.sync m16n8k16 (F16 in, F32 accumulators) over F16, Q8_0 and
//   Q4_0 caches.
// Owns: attention_mma_tile (whether and with which tile a launch takes this path) and its kernel.
//   A CTA of 4 warps takes 64 query rows — bt consecutive tokens of ONE run times hg query heads of
//   one KV group (hg = the largest power of two dividing the group, bt = 64 / hg) — and every key of
//   its run's slot up to the tile's last position, in tiles of BK keys staged in shared memory as F16
//   (two stages: F16 rows by cp.async, in flight while the other stage is computed; Q8_0 / Q4_0 rows
//   dequantized by the threads, d * q rounded to F16, as they are staged). Each warp
//   holds 16 rows: S = Q K^T from ldmatrix fragments, the causal mask from each row's position (none
//   for an encoder, AttnArgs::causal = false: every key of the slot), the
//   online softmax on the accumulator fragments (scores in log2 units: q is pre-scaled by
//   scale * log2 e, then rounded to F16), P rounded to F16 as the A operand of O += P V (V fragments
//   by ldmatrix.trans), O / l written once. Tiles whose tokens span two runs are left to the CUDA-core
//   kernel (attention.cu), which skips the tiles this path takes (attn_tile_whole, the same test on
//   the device), so a batch may mix both.
//   Head sizes 64, 72 (the vision tower; padded to 80 with zero columns), 128, 256.
//   Long prefixes: a tile's keys split into up to AttnPlan::mma_split ranges (blockIdx.z; mma_splits:
//   ranges of >= kMmaSplitKeys keys), each block writing an unnormalised partial for attn_merge, so a
//   512-token chunk after 200K positions is not ~200 blocks each walking every key.
// Must not: allocate, synchronize, or take F32 caches (those stay on attention.cu).
// Threading: launchers only enqueue on L.stream; the shared-memory attribute set-up is a thread-safe
//   function-local static.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/invariant.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/workspace.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128, kRows = 64;  // 4 warps x 16 query rows
using namespace attn;  // attention_common.cuh: cache codes, AttnIO, the 8-element item loads

// The caches this kernel reads (F16, Q8_0, Q4_0): its cache code, else -1.
int code_of(GgmlType t) { return t == GgmlType::F32 ? -1 : cache_code(t); }

// Eight elements c .. c + 7 (c a multiple of 8) of a Q8_0 / Q4_0 cache row, dequantized, as F16.
__device__ __forceinline__ uint4 dequant8(const CacheArg& cache, const char* row, int c) {
  float f[8];
  convert16(cache.code, fetch16(cache, row, c), c, f);
  return make_uint4(mma::pack_half2(f[0], f[1]), mma::pack_half2(f[2], f[3]), mma::pack_half2(f[4], f[5]),
                    mma::pack_half2(f[6], f[7]));
}

// D the head size; DP = D rounded up to the mma's k of 16 (72 -> 80: the columns past D are zeros in
// Q, K and V and never written out).
template <int D>
struct Geo {
  static constexpr int DP = (D + 15) / 16 * 16;
  static constexpr int BK = D >= 256 ? 32 : 64;  // keys per stage
  static constexpr int LDH = DP + 8;             // halves per shared row (16 bytes of padding: no bank conflicts)
  static constexpr size_t smem = size_t(kRows + 4 * BK) * LDH * sizeof(__half);  // Q, K x 2, V x 2
};

struct MmaArgs : AttnIO {
  int T, Hq, G, hg, bt;
  float qscale;
  int max_split;   // key ranges per tile at most (blockIdx.z; mma_splits decides per tile)
  float *part_o, *part_ml;  // the ranges' partials (max_split > 1), as attn_merge reads them
};

// F16: both caches F16 (every row by cp.async; the codes are not read), else per cache by its code.
template <int D, bool F16>
__global__ void __launch_bounds__(kThreads) attn_mma_kernel(const MmaArgs p) {
  pdl::begin();  // pdl.cuh: nothing global before this
  constexpr int BK = Geo<D>::BK, LDH = Geo<D>::LDH, DP = Geo<D>::DP, NT = BK / 8, ND = DP / 8;
  extern __shared__ __align__(16) __half smh[];
  __half* Qs = smh;                // [kRows][LDH]
  __half* Ks = Qs + kRows * LDH;   // [2][BK][LDH]
  __half* Vs = Ks + 2 * BK * LDH;  // [2][BK][LDH]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int t0 = blockIdx.x * p.bt, t1 = min(p.T, t0 + p.bt);
  if (!attn_tile_whole(p.seq, p.T, t0, p.bt)) return;  // the CUDA-core kernel takes this tile
  const int slot = p.seq[t0], h0 = blockIdx.y * p.hg;
  const int64_t kvh = h0 / p.G;
  const int kv_end = attn_last(p, t1 - 1) + 1;  // positions increase along a run
  // This block's key range: split blockIdx.z of the tile's ranges (mma_splits), BK-aligned.
  const int ns = mma_splits(kv_end, p.max_split), split = blockIdx.z;
  if (split >= ns) return;
  const int chunk = ns == 1 ? kv_end : ((kv_end + ns - 1) / ns + BK - 1) / BK * BK;
  const int kv_lo = split * chunk, kv_hi = min(kv_end, kv_lo + chunk);
  const char* kb = p.k.p + size_t(kvh) * p.k.nb1 + size_t(slot) * p.k.nb3;
  const char* vb = p.v.p + size_t(kvh) * p.v.nb1 + size_t(slot) * p.v.nb3;

  // One tile of one cache into a stage; rows past the run's last position are zeros (never garbage).
  auto load_one = [&](const CacheArg& cache, const char* base, __half* dst_stage, int k0) {
    for (int i = tid; i < BK * (DP / 8); i += kThreads) {
      const int row = i / (DP / 8), c = (i % (DP / 8)) * 8;
      const bool ok = k0 + row < kv_hi && c < D;
      const char* src = base + size_t(ok ? k0 + row : 0) * cache.nb2;
      __half* dst = dst_stage + row * LDH + c;
      if (F16 || cache.code == kF16) mma::cp16_or_zero(mma::smem_u32(dst), src + size_t(c) * 2, ok);
      else *reinterpret_cast<uint4*>(dst) = ok ? dequant8(cache, src, c) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto load_kv = [&](int stage, int k0) {
    load_one(p.k, kb, Ks + stage * BK * LDH, k0);
    load_one(p.v, vb, Vs + stage * BK * LDH, k0);
    mma::cp_commit();
  };
  const int n_tiles = kv_hi > kv_lo ? (kv_hi - kv_lo + BK - 1) / BK : 0;
  if (n_tiles > 0) load_kv(0, kv_lo);

  // Q rows (row r: token t0 + r / hg, head h0 + r % hg), pre-scaled, as F16; rows past the tile: 0.
  for (int i = tid; i < kRows * (DP / 8); i += kThreads) {
    const int r = i / (DP / 8), c = (i % (DP / 8)) * 8, t = t0 + r / p.hg;
    uint4 h = make_uint4(0u, 0u, 0u, 0u);
    if (t < t1 && c < D) {
      const float* src = p.q + int64_t(t) * p.q_s2 + int64_t(h0 + r % p.hg) * p.q_s1 + c;
      const float s = p.qscale;
      h = make_uint4(mma::pack_half2(src[0] * s, src[1] * s), mma::pack_half2(src[2] * s, src[3] * s),
                     mma::pack_half2(src[4] * s, src[5] * s), mma::pack_half2(src[6] * s, src[7] * s));
    }
    *reinterpret_cast<uint4*>(Qs + r * LDH + c) = h;
  }
  // This lane's two rows (g and g + 8 of the warp's 16): their positions, -1 past the tile.
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const int rp0 = t0 + r0 / p.hg < t1 ? attn_last(p, t0 + r0 / p.hg) : -1;
  const int rp1 = t0 + r1 / p.hg < t1 ? attn_last(p, t0 + r1 / p.hg) : -1;
  const bool warp_live = __any_sync(0xffffffffu, rp0 >= 0 || rp1 >= 0);

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // l: this lane's partial row sums

  for (int it = 0; it < n_tiles; ++it) {
    const int s = it & 1, k0 = kv_lo + it * BK;
    if (it + 1 < n_tiles) {
      load_kv(s ^ 1, k0 + BK);  // the other stage was consumed before the previous iteration's barrier
      mma::cp_wait<1>();
    } else {
      mma::cp_wait<0>();
    }
    __syncthreads();
    if (warp_live) {
      float sc[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_x4(a, mma::smem_u32(Qs + (warp * 16 + (lane & 15)) * LDH + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int j = 0; j < NT; j += 2) {  // key tiles j, j + 1 from one ldmatrix
          uint32_t b[4];
          const int key = j * 8 + (lane & 7) + ((lane >> 4) << 3);
          mma::ldsm_x4(b, mma::smem_u32(Ks + (s * BK + key) * LDH + kk * 16 + ((lane >> 3) & 1) * 8));
          mma::m16n8k16(sc[j], a, b[0], b[1]);
          mma::m16n8k16(sc[j + 1], a, b[2], b[3]);
        }
      }
      // Causal mask (keys past a row's position, including every key past kv_hi), online softmax.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = k0 + j * 8 + 2 * t4 + e;
          if (key > rp0) sc[j][e] = -INFINITY;
          if (key > rp1) sc[j][2 + e] = -INFINITY;
          mx0 = fmaxf(mx0, sc[j][e]);
          mx1 = fmaxf(mx1, sc[j][2 + e]);
        }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
      }
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float c0 = mn0 == -INFINITY ? 1.f : exp2f(m0 - mn0), c1 = mn1 == -INFINITY ? 1.f : exp2f(m1 - mn1);
      float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[j][e] = mn0 == -INFINITY ? 0.f : exp2f(sc[j][e] - mn0);
          sc[j][2 + e] = mn1 == -INFINITY ? 0.f : exp2f(sc[j][2 + e] - mn1);
          ls0 += sc[j][e];
          ls1 += sc[j][2 + e];
        }
      l0 = l0 * c0 + ls0, l1 = l1 * c1 + ls1;
      m0 = mn0, m1 = mn1;
#pragma unroll
      for (int n = 0; n < ND; ++n) o[n][0] *= c0, o[n][1] *= c0, o[n][2] *= c1, o[n][3] *= c1;
      // O += P V: P's accumulator layout is the A fragment of keys 16 kk .. 16 kk + 15.
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const uint32_t a[4] = {mma::pack_half2(sc[2 * kk][0], sc[2 * kk][1]), mma::pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                               mma::pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               mma::pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int dn = 0; dn < DP / 16; ++dn) {  // column tiles 2 dn, 2 dn + 1 from one ldmatrix
          uint32_t b[4];
          mma::ldsm_x4_t(b, mma::smem_u32(Vs + (s * BK + key) * LDH + dn * 16 + (lane >> 4) * 8));
          mma::m16n8k16(o[2 * dn], a, b[0], b[1]);
          mma::m16n8k16(o[2 * dn + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is free for the copies two tiles on
  }

#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r1 : r0;
    if ((half ? rp1 : rp0) < 0) continue;
    const float l = half ? l1 : l0;
    const int t = t0 + r / p.hg, h = h0 + r % p.hg;
    if (ns == 1) {  // the outputs
      const float inv = l > 0.f ? 1.f / l : 0.f;
      float* dst = p.out + int64_t(t) * p.o_s2 + int64_t(h) * p.o_s1 + 2 * t4;
#pragma unroll
      for (int n = 0; n < ND; ++n)
        if (n * 8 < D) *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    } else {  // this range's unnormalised partial, its max (log2 units) and sum
      const int64_t prow = (int64_t(split) * p.T + t) * p.Hq + h;
      float* dst = p.part_o + prow * D + 2 * t4;
#pragma unroll
      for (int n = 0; n < ND; ++n)
        if (n * 8 < D) *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
      if (t4 == 0) p.part_ml[prow * 2] = half ? m1 : m0, p.part_ml[prow * 2 + 1] = l;
    }
  }
}

template <int D, bool F16>
void launch_one(const Launch& L, const MmaArgs& a, dim3 grid) {
  static const bool attr_set = cudaFuncSetAttribute(attn_mma_kernel<D, F16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    int(Geo<D>::smem)) == cudaSuccess;
  KILN_CHECK(attr_set, "attention (tensor cores): {} bytes of shared memory refused (head_dim {})", Geo<D>::smem, D);
  pdl::launch(L, grid, dim3(kThreads), Geo<D>::smem, attn_mma_kernel<D, F16>, a);
}
template <int D>
void launch(const Launch& L, const MmaArgs& a, dim3 grid) {
  if (a.k.code == kF16 && a.v.code == kF16) launch_one<D, true>(L, a, grid);
  else launch_one<D, false>(L, a, grid);
}

// F16 rows go by 16-byte cp.async; quantized rows are read 2 bytes at a time (blocks of 34 / 18 bytes).
bool aligned(const SeqMem& m) {
  return ((reinterpret_cast<uintptr_t>(m.p) | m.nb1 | m.nb2 | m.nb3) % (m.type == GgmlType::F16 ? 16 : 2)) == 0;
}

}  // namespace

int attention_mma_tile(const Launch& L, const AttnArgs& a, GgmlType kt, GgmlType vt, int64_t T) {
  if (T <= detail::kAttnDecodeTokens || batch_invariant() || L.sm < 80 || code_of(kt) < 0 || code_of(vt) < 0) return 0;
  if (a.head_dim != 64 && a.head_dim != 72 && a.head_dim != 128 && a.head_dim != 256) return 0;
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0) return 0;
  static const bool off = [] {  // KILN_CUDA_ATTN_MMA=0: the CUDA-core kernel only (comparisons); read once
    const char* env = std::getenv("KILN_CUDA_ATTN_MMA");
    return env != nullptr && std::strcmp(env, "0") == 0;
  }();
  if (off) return 0;
  const int64_t G = a.n_head / a.n_head_kv, hg = std::min<int64_t>(G & -G, kRows);
  const detail::AttnPlan pl = detail::attn_make_plan(a.head_dim, a.n_head, a.n_head_kv, T, 1);
  const int bt = int(kRows / hg);
  return bt % pl.bq == 0 ? bt : 0;  // the CUDA-core kernel's tiles must not straddle two of these
}

namespace detail {

int attention_mma(const Launch& L, Rows q, const int32_t* seq, const int32_t* pos, const SeqMem& k, const SeqMem& v,
                  const AttnArgs& a, Rows out, int max_split, float* part_o, float* part_ml) {
  const int64_t T = q.n2;
  const int bt = attention_mma_tile(L, a, k.type, v.type, T);
  if (bt == 0 || !aligned(k) || !aligned(v)) return 0;
  MmaArgs m;
  m.q = q.p, m.q_s1 = q.s1, m.q_s2 = q.s2;
  m.out = out.p, m.o_s1 = out.s1, m.o_s2 = out.s2;
  m.seq = seq, m.pos = pos;
  m.k = cache_arg(k), m.v = cache_arg(v);
  m.last_all = a.causal ? -1 : int(k.ne2 - 1);
  m.T = int(T), m.Hq = int(a.n_head), m.G = int(a.n_head / a.n_head_kv), m.hg = kRows / bt, m.bt = bt;
  m.qscale = a.scale * 1.4426950408889634f;
  m.max_split = part_o && part_ml ? std::max(1, max_split) : 1;
  m.part_o = part_o, m.part_ml = part_ml;
  const dim3 grid(unsigned((T + bt - 1) / bt), unsigned(a.n_head / m.hg), unsigned(m.max_split));
  switch (a.head_dim) {
    case 64: launch<64>(L, m, grid); break;
    case 72: launch<72>(L, m, grid); break;  // the Qwen3.5 / Qwen3-VL vision tower (1152 / 16)
    case 128: launch<128>(L, m, grid); break;
    default: launch<256>(L, m, grid); break;
  }
  const cudaError_t e = cudaGetLastError();
  KILN_CHECK(e == cudaSuccess, "attention (tensor cores): kernel launch failed: {}", cudaGetErrorString(e));
  return bt;
}

}  // namespace detail
}  // namespace kiln::cuda
