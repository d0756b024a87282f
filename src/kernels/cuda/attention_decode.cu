// kernels/cuda/attention_decode.cu — attention for decode-sized batches (one token per block, the
//   plan's bq == 1) over F16 / Q8_0 / Q4_0 caches with head_dim 64, 128 or 256.
// Owns: attention_decode. A block of 8 warps takes one token, the plan's hg q heads of one KV head
//   and one split of the keys; each warp takes batches of keys. A key's row is read by D / 8 lanes,
//   8 consecutive elements each (one 16-byte load of an F16 row, attention_common.cuh's fetch16 for
//   the quantized ones), straight from global memory into registers, so a warp step covers 256 / D
//   keys and the q rows of all hg heads stay in registers. The partial dot products of a batch (steps
//   x heads) are summed across the row's lanes by a transposed butterfly (each level halves the
//   values a lane keeps: about one shuffle per value instead of five), leaving every lane the score
//   of one (key, head); the online softmax then runs per head on those lanes, and each probability
//   is broadcast to the lanes that hold the key's V elements. Scores in log2 units (q pre-scaled);
//   sums in F32. At the end the warps' (m, l, O) are combined in shared memory, and the block writes
//   the output (one split) or its split's unnormalised partial for attn_merge (attention.cu).
// Must not: allocate, synchronize or read device memory on the host. Keys past a token's position
//   are never loaded (no NaN of an unwritten cache row reaches the sums).
// Threading: the launcher only enqueues on L.stream; the one-time shared-memory attribute set-up is
//   a thread-safe function-local static.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

using namespace attn;

constexpr int kDecWarps = 8, kDecThreads = 32 * kDecWarps;

template <int D, int HG>
constexpr size_t dec_smem() {
  return size_t(kDecWarps) * (size_t(HG) * D + 3 * HG) * sizeof(float);
}

// D: head_dim; HG: q heads of the block rounded up to a power of two (heads >= p.hg idle).
template <int D, int HG>
__global__ void __launch_bounds__(kDecThreads, HG >= 8 ? 1 : 2) attn_decode_kernel(const AttnK p) {
  constexpr int LPK = D / 8;                   // lanes per key row
  constexpr int KPS = 32 / LPK;                // keys per warp step
  constexpr int NB = (LPK / HG < 16 / HG ? LPK / HG : 16 / HG) < 4 ? (LPK / HG < 16 / HG ? LPK / HG : 16 / HG) : 4;  // steps per batch (N <= 16)
  constexpr int N = NB * HG;                   // values a lane reduces per batch
  constexpr int SPAN = LPK / N;                // lanes holding the same reduced value
  constexpr int BATCH = KPS * NB;              // keys per warp batch
  static_assert(HG <= LPK && N <= LPK && (N & (N - 1)) == 0);
  pdl::begin();  // pdl.cuh: nothing global before this
  extern __shared__ __align__(16) float sm[];
  float* acc_s = sm;                              // [warps][HG][D]
  float* m_s = acc_s + kDecWarps * HG * D;        // [warps][HG]
  float* l_s = m_s + kDecWarps * HG;              // [warps][HG]
  float* w_s = l_s + kDecWarps * HG;              // [warps][HG]: weight of each warp's partial

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = blockIdx.x, h0 = blockIdx.y * p.hg, split = blockIdx.z;
  const int kvh = h0 / p.G;
  const int grp = lane / LPK, li = lane % LPK, e0 = li * 8;
  const int my_idx = li / SPAN, my_h = my_idx % HG, my_j = my_idx / HG;  // the (step, head) this lane scores
  const int slot = p.seq[t];
  const int kv_lo = split * p.chunk, kv_hi = min(kv_lo + p.chunk, attn_last(p, t) + 1);

  float q[HG][8];
#pragma unroll
  for (int h = 0; h < HG; ++h) {
    const float* src = p.q + int64_t(t) * p.q_s2 + int64_t(h0 + (h < p.hg ? h : 0)) * p.q_s1 + e0;
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] = src[e] * p.qscale;
  }
  float acc[HG][8], m[HG];
#pragma unroll
  for (int h = 0; h < HG; ++h) {
    m[h] = -INFINITY;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.f;
  }
  float l_own = 0.f;  // the sum of the probabilities this lane computed (head my_h)

  const char* kb = p.k.p + size_t(kvh) * p.k.nb1 + size_t(slot) * p.k.nb3;
  const char* vb = p.v.p + size_t(kvh) * p.v.nb1 + size_t(slot) * p.v.nb3;
  for (int b0 = kv_lo + warp * BATCH; b0 < kv_hi; b0 += kDecWarps * BATCH) {
    uint4 kr[NB], vr[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const int key = b0 + j * KPS + grp;
      kr[j] = vr[j] = make_uint4(0u, 0u, 0u, 0u);
      if (key < kv_hi) {
        kr[j] = fetch16(p.k, kb + size_t(key) * p.k.nb2, e0);
        vr[j] = fetch16(p.v, vb + size_t(key) * p.v.nb2, e0);
      }
    }
    // Partial scores s[j * HG + h] over this lane's 8 elements.
    float s[N];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      float kf[8];
      convert16(p.k.code, kr[j], e0, kf);
#pragma unroll
      for (int h = 0; h < HG; ++h) {
        float a0 = q[h][0] * kf[0], a1 = q[h][1] * kf[1];
#pragma unroll
        for (int e = 2; e < 8; e += 2) a0 = fmaf(q[h][e], kf[e], a0), a1 = fmaf(q[h][e + 1], kf[e + 1], a1);
        s[j * HG + h] = a0 + a1;
      }
    }
    // Transposed butterfly over the row's lanes: at offset o a lane keeps the half of its values
    // selected by its bit o and adds the partner's copy of that half.
#pragma unroll
    for (int n = N, o = LPK / 2; n > 1; n >>= 1, o >>= 1) {
      const bool up = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < n / 2; ++i) {
        const float send = up ? s[i] : s[i + n / 2];
        const float keep = up ? s[i + n / 2] : s[i];
        s[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
      }
    }
#pragma unroll
    for (int o = SPAN / 2; o > 0; o >>= 1) s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
    const bool valid = b0 + my_j * KPS + grp < kv_hi && my_h < p.hg;
    const float sc = valid ? s[0] : -INFINITY;
    // The batch's max per head: over the steps (top bits of the row's lane) and the key groups.
    float bm = sc;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      if (o >= LPK || o >= LPK / NB) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
    float corr[HG], m_mine = 0.f, c_mine = 1.f;
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const float mn = fmaxf(m[h], __shfl_sync(0xffffffffu, bm, h * SPAN));
      corr[h] = mn == -INFINITY ? 1.f : exp2f(m[h] - mn);
      m[h] = mn;
      if (h == my_h) m_mine = mn, c_mine = corr[h];
    }
    const float pr = sc == -INFINITY ? 0.f : exp2f(sc - m_mine);
    l_own = fmaf(l_own, c_mine, pr);
#pragma unroll
    for (int h = 0; h < HG; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] *= corr[h];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      float vf[8];
      convert16(p.v.code, vr[j], e0, vf);  // zero for keys past kv_hi (vr zeroed: F16 0, Q8_0 / Q4_0 d = 0)
#pragma unroll
      for (int h = 0; h < HG; ++h) {
        const float ph = __shfl_sync(0xffffffffu, pr, grp * LPK + (j * HG + h) * SPAN);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(ph, vf[e], acc[h][e]);
      }
    }
  }
  // The warp's l per head (its lanes' sums over steps and key groups) and O (over key groups).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    if (o >= LPK || o >= LPK / NB) l_own += __shfl_xor_sync(0xffffffffu, l_own, o);
#pragma unroll
  for (int o = 16; o >= LPK; o >>= 1)
#pragma unroll
    for (int h = 0; h < HG; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
#pragma unroll
  for (int h = 0; h < HG; ++h) {
    const float lh = __shfl_sync(0xffffffffu, l_own, h * SPAN);
    if (lane == 0) m_s[warp * HG + h] = m[h], l_s[warp * HG + h] = lh;
    if (grp == 0) {
      float4* dst = reinterpret_cast<float4*>(acc_s + (warp * HG + h) * D + e0);
      dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
    }
  }
  __syncthreads();
  // The block's (M, L) per head and each warp's weight 2^(m_w - M).
  __shared__ float M_s[HG], L_s[HG];
  if (threadIdx.x < HG) {
    const int h = threadIdx.x;
    float M = -INFINITY;
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, m_s[w * HG + h]);
    float Ls = 0.f;
    for (int w = 0; w < kDecWarps; ++w) {
      const float wt = M == -INFINITY || m_s[w * HG + h] == -INFINITY ? 0.f : exp2f(m_s[w * HG + h] - M);
      w_s[w * HG + h] = wt;
      Ls = fmaf(wt, l_s[w * HG + h], Ls);
    }
    M_s[h] = M, L_s[h] = Ls;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < p.hg * D; idx += kDecThreads) {
    const int h = idx / D, d = idx % D;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) o = fmaf(w_s[w * HG + h], acc_s[(w * HG + h) * D + d], o);
    if (p.n_split == 1) {
      p.out[int64_t(t) * p.o_s2 + int64_t(h0 + h) * p.o_s1 + d] = L_s[h] > 0.f ? o / L_s[h] : 0.f;
    } else {
      const int64_t prow = (int64_t(split) * p.T + t) * p.Hq + h0 + h;
      p.part_o[prow * p.D + d] = o;
      if (d == 0) p.part_ml[prow * 2] = M_s[h], p.part_ml[prow * 2 + 1] = L_s[h];
    }
  }
}

template <int D, int HG>
void launch(const Launch& L, const AttnK& p, dim3 grid) {
  constexpr size_t smem = dec_smem<D, HG>();
  static const bool attr_set = cudaFuncSetAttribute(attn_decode_kernel<D, HG>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) == cudaSuccess;
  KILN_CHECK(attr_set, "attention (decode): {} bytes of shared memory refused (head_dim {})", smem, D);
  pdl::launch(L, grid, dim3(kDecThreads), smem, attn_decode_kernel<D, HG>, p);
}
template <int D>
void launch_hg(const Launch& L, const AttnK& p, dim3 grid, int hg) {
  if (hg == 1) launch<D, 1>(L, p, grid);
  else if (hg == 2) launch<D, 2>(L, p, grid);
  else if (hg <= 4) launch<D, 4>(L, p, grid);
  else launch<D, 8>(L, p, grid);
}

}  // namespace

namespace detail {

bool attention_decode(const Launch& L, const attn::AttnK& p, const AttnPlan& pl) {
  static const bool off = [] {  // KILN_CUDA_ATTN_DEC=0: the general kernel (comparisons); read once
    const char* e = std::getenv("KILN_CUDA_ATTN_DEC");
    return e != nullptr && std::strcmp(e, "0") == 0;
  }();
  if (off || pl.bq != 1 || p.mma_bt > 0 || p.k.code == kF32 || p.v.code == kF32) return false;
  if ((p.D != 64 && p.D != 128 && p.D != 256) || p.hg > 8) return false;
  const dim3 grid(unsigned(pl.tiles), unsigned(pl.groups), unsigned(pl.n_split));
  switch (p.D) {
    case 64: launch_hg<64>(L, p, grid, p.hg); break;
    case 128: launch_hg<128>(L, p, grid, p.hg); break;
    default: launch_hg<256>(L, p, grid, p.hg); break;
  }
  return true;
}

}  // namespace detail
}  // namespace kiln::cuda
