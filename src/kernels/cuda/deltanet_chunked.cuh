// kernels/cuda/deltanet_chunked.cuh — the chunked gated delta rule for long runs (prefill), included by
//   deltanet.cu only: gated_delta takes it for runs of at least max(chunk, kGdnChunk) tokens and the
//   token recurrence for the others.
// Owns: three kernels on the workspace laid out by detail::gdn_chunk_layout (workspace.h).
//   1. plan (one block): finds the runs on the device (block scans over seq), flags the tokens of the
//      long runs (the recurrence skips them), writes the chunk table (chunks of C = 64 tokens from each
//      long run's start, the last one partial) and the run table.
//   2. prep, per (chunk, value head), all chunks at once (nothing here depends on the state): with the
//      chunk's cumulative log-decays G_t (inclusive), A[t][s] = beta_t e^{G_t-G_s} k_t.k_s (s < t),
//      its inverse Tm = (I + A)^-1 (forward substitution, a column per 4 threads) and the output
//      matrix Bm[t][s] = e^{G_t-G_s} q_t.k_s / sqrt(S) (s <= t).
//   3. pass, per (16 value columns, value head, run): the state columns M0 [S][16] in shared memory,
//      the run's chunks in order:
//        R = beta (V - e^G (K M0)),  D = Tm R                          (the chunk's deltas d_t)
//        O = e^G (Q M0) / sqrt(S) + Bm D                               (the outputs)
//        M0 = e^{G_L} M0 + sum_s e^{G_L-G_s} k_s d_s^T                 (the state after the chunk)
//      which is the recurrence's algebra (src/kernels/cpu/delta.cpp's gated_delta_rule_chunked solves
//      the same triangular system by substitution). The products of prep and pass run on tensor cores
//      as 3xTF32 mmas (gdn_tc_mm: F32 operands split into TF32 hi + lo, about F32 accuracy); the
//      substitution and the gates in F32 on CUDA cores. The sums run in a different order from the
//      recurrence's, so the results agree to float rounding, not in bits.
// Must not: allocate or synchronize; it is not taken with keep slots or --batch-invariant (the
//   launcher's rule).
// Threading: launchers only enqueue on L.stream.
#pragma once
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/deltanet_common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/workspace.h"

namespace kiln::cuda {
namespace {

constexpr int kGC = int(detail::kGdnChunk);  // tokens per chunk
constexpr int kGNC = 16;                     // value columns per pass block
constexpr int kPlanThreads = 1024;
constexpr int kPrepThreads = 256;
constexpr int kPassThreads = 128;
constexpr int kGCP = kGC + 1;  // padded row of a [C][C] matrix in shared memory

struct GdnPlanP {
  int32_t *skip, *rs, *rl, *count;
  int4 *chunks, *runs;
  float* mats;
};

GdnPlanP gdn_plan_ptrs(void* ws, const detail::GdnChunkLayout& l) {
  char* b = static_cast<char*>(ws);
  return GdnPlanP{reinterpret_cast<int32_t*>(b + l.skip),   reinterpret_cast<int32_t*>(b + l.rs),
                  reinterpret_cast<int32_t*>(b + l.rl),     reinterpret_cast<int32_t*>(b + l.count),
                  reinterpret_cast<int4*>(b + l.chunks),    reinterpret_cast<int4*>(b + l.runs),
                  reinterpret_cast<float*>(b + l.mats)};
}

// Exclusive block-wide scan of one int per thread under op (identity e); *total = the whole block's.
template <class Op>
__device__ int gdn_block_scan(int v, int e, Op op, int* sh, int* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x = op(y, x);
  }
  if (lane == 31) sh[w] = x;
  __syncthreads();
  if (w == 0) {
    int s = lane < nw ? sh[lane] : e;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s = op(y, s);
    }
    sh[lane] = s;  // inclusive over the warps; sh[31] = the block's total
  }
  __syncthreads();
  int ex = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) ex = e;
  const int r = op(w > 0 ? sh[w - 1] : e, ex);
  *total = sh[31];
  __syncthreads();  // sh is reused by the next scan
  return r;
}

// One block: thread i owns tokens [i*per, (i+1)*per).
__global__ void __launch_bounds__(kPlanThreads) gdn_plan_kernel(const int32_t* seq, int T, int cmin, GdnPlanP p) {
  __shared__ int sh[32];
  const int per = (T + kPlanThreads - 1) / kPlanThreads;
  const int a = min(T, int(threadIdx.x) * per), b = min(T, a + per);
  auto starts = [&](int t) { return t == 0 || seq[t] != seq[t - 1]; };
  int last = -1, tot = 0;
  for (int t = a; t < b; ++t)
    if (starts(t)) last = t;
  int cur = gdn_block_scan(last, -1, [](int x, int y) { return max(x, y); }, sh, &tot);
  for (int t = a; t < b; ++t) {
    if (starts(t)) cur = t;
    p.rs[t] = cur;
  }
  for (int t = a; t < b; ++t)
    if (t == T - 1 || seq[t + 1] != seq[t]) p.rl[p.rs[t]] = t - p.rs[t] + 1;
  __syncthreads();  // every run length written
  int nc = 0, nr = 0;
  for (int t = a; t < b; ++t) {
    const int s = p.rs[t];
    const bool ch = p.rl[s] >= cmin;
    p.skip[t] = ch;
    nc += ch && (t - s) % kGC == 0;
    nr += ch && t == s;
  }
  int n_chunks = 0, n_runs = 0;
  int c = gdn_block_scan(nc, 0, [](int x, int y) { return x + y; }, sh, &n_chunks);
  int r = gdn_block_scan(nr, 0, [](int x, int y) { return x + y; }, sh, &n_runs);
  for (int t = a; t < b; ++t) {
    const int s = p.rs[t], n = p.rl[s];
    if (n < cmin || (t - s) % kGC != 0) continue;
    if (t == s) p.runs[r++] = make_int4(c, (n + kGC - 1) / kGC, seq[t], 0);
    p.chunks[c++] = make_int4(t, min(kGC, s + n - t), 0, 0);
  }
  if (threadIdx.x == 0) p.count[0] = n_chunks, p.count[1] = n_runs;
}

// The kernels' arguments: the recurrence's (deltanet_common.cuh) and the plan in the workspace.
struct GdnChunkK {
  GdnK a;
  GdnPlanP p;
  bool vec;  // q, k and v rows and their strides 16-byte aligned (16-byte staging copies)
};

// ---- tensor cores: the prep's two products and the pass's five as 3xTF32 mmas (mma.cuh; about F32 accuracy).
constexpr int kMP = kGNC + 8;  // padded row of M0 [S][16] and of R / D / Dt [C][16] (B operands)
constexpr int kTP = kGC + 4;   // padded row of Tm / Bm [C][C] (A operands)
template <int S>
constexpr int gdn_tc_kp() {  // padded row of q / k [C][S] (A operands, and B of the state update)
  return S + 4;
}
template <int S>
constexpr int gdn_tc_x() {  // floats of the region that holds Q, then Tm and Bm
  return kGC * gdn_tc_kp<S>() > 2 * kGC * kTP ? kGC * gdn_tc_kp<S>() : 2 * kGC * kTP;
}
template <int S>
constexpr size_t gdn_pass_tc_smem() {
  return size_t(S * kMP + kGC * gdn_tc_kp<S>() + gdn_tc_x<S>() + 3 * kGC * kMP + 2 * kGC) * sizeof(float);
}

// c[nt] += A B on the warp's 16 x 8 NT tile over k in [k0, k1) (multiples of 8); A(r, k) for the tile's rows
// r = 0..15 and B(k, n) read through the accessors. Fragment e of c[nt]: row g + 8 (e / 2), column
// 8 nt + 2 q + e % 2 (g = lane / 4, q = lane % 4).
template <int NT, class FA, class FB>
__device__ __forceinline__ void gdn_tc_mm(float (&c)[NT][4], int k0, int k1, FA A, FB B) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  for (int k = k0; k < k1; k += 8) {
    uint32_t ah[4], al[4];
    mma::tf32_split(A(g, k + q), ah[0], al[0]);
    mma::tf32_split(A(g + 8, k + q), ah[1], al[1]);
    mma::tf32_split(A(g, k + q + 4), ah[2], al[2]);
    mma::tf32_split(A(g + 8, k + q + 4), ah[3], al[3]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bh0, bl0, bh1, bl1;
      mma::tf32_split(B(k + q, 8 * nt + g), bh0, bl0);
      mma::tf32_split(B(k + q + 4, 8 * nt + g), bh1, bl1);
      mma::m16n8k8_tf32(c[nt], al, bh0, bh1);
      mma::m16n8k8_tf32(c[nt], ah, bl0, bl1);
      mma::m16n8k8_tf32(c[nt], ah, bh0, bh1);
    }
  }
}

template <int S>
constexpr size_t gdn_prep_smem() {
  return size_t(2 * kGC * gdn_tc_kp<S>() + 2 * kGC * kGCP + 2 * kGC) * sizeof(float);
}

// One float from global to shared memory asynchronously (cp.async on sm_80+): a stage's copies are all
// in flight together; the caller commits and waits (gdn_stage_wait).
__device__ __forceinline__ void gdn_cp(float* dst, const float* src) { __pipeline_memcpy_async(dst, src, sizeof(float)); }
__device__ __forceinline__ void gdn_stage_wait() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
}

// Rows t < n of a chunk (cols floats from src + t stride) into dst [C][P], zeros for t >= n: padded rows, so
// the products read them down a column and along a row without bank conflicts. Asynchronous copies of 16
// bytes when vec (the rows 16-byte aligned, cols and P multiples of 4), else of 4; the caller commits.
template <int NT>
__device__ __forceinline__ void gdn_stage_rows(float* dst, int P, const float* src, int64_t stride, int n, int cols,
                                               bool vec) {
  const int w = vec ? 4 : 1, per = cols / w;
  for (int idx = threadIdx.x; idx < kGC * per; idx += NT) {
    const int t = idx / per, i = (idx - t * per) * w;
    float* d = dst + t * P + i;
    if (t < n) __pipeline_memcpy_async(d, src + int64_t(t) * stride + i, size_t(w) * sizeof(float));
    else for (int e = 0; e < w; ++e) d[e] = 0.0f;
  }
}
// The chunk's rows of k and q (key head hk) into [C][P].
template <int S, int NT, int P>
__device__ __forceinline__ void gdn_stage_qk(const GdnK& a, int t0, int n, int hk, float* sK, float* sQ, bool vec) {
  gdn_stage_rows<NT>(sK, P, a.k + int64_t(t0) * a.k_s2 + int64_t(hk) * a.k_s1, a.k_s2, n, S, vec);
  gdn_stage_rows<NT>(sQ, P, a.q + int64_t(t0) * a.q_s2 + int64_t(hk) * a.q_s1, a.q_s2, n, S, vec);
}

template <int S>
__global__ void __launch_bounds__(kPrepThreads) gdn_prep_kernel(const GdnChunkK ck) {
  const GdnK& a = ck.a;
  const GdnPlanP& p = ck.p;
  extern __shared__ float smf[];
  constexpr int KP = gdn_tc_kp<S>();
  const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  if (c >= p.count[0]) return;
  const int4 ch = p.chunks[c];
  const int t0 = ch.x, n = ch.y, hk = h % a.Hk;
  float* sK = smf;             // [C][S+1]
  float* sQ = sK + kGC * KP;   // [C][S+1]
  float* sA = sQ + kGC * KP;   // [C][C+1]: A, strictly lower
  float* sT = sA + kGC * kGCP;  // [C][C+1]: (I + A)^-1
  float* sG = sT + kGC * kGCP;  // [C]: cumulative log-decay (inclusive)
  float* sB = sG + kGC;         // [C]: beta
  gdn_stage_qk<S, kPrepThreads, KP>(a, t0, n, hk, sK, sQ, ck.vec);
  if (tid < kGC) {
    if (tid < n) {
      gdn_cp(&sB[tid], a.beta + int64_t(t0 + tid) * a.Hv + h);
      gdn_cp(&sG[tid], a.g + int64_t(t0 + tid) * a.Hv + h);
    } else {
      sB[tid] = sG[tid] = 0.0f;
    }
  }
  gdn_stage_wait();
  if (tid < 32) {  // inclusive prefix sum of the 64 log-decays, two per lane
    const float x0 = sG[2 * tid], x1 = sG[2 * tid + 1];
    float s = x0 + x1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, s, o);
      if (tid >= o) s += y;
    }
    sG[2 * tid] = s - x1, sG[2 * tid + 1] = s;
  }
  __syncthreads();
  float* mt = p.mats + (size_t(c) * size_t(a.Hv) + size_t(h)) * size_t(detail::kGdnMatFloats);
  float* gBm = mt + kGC * kGC;
  // A[t][s] and Bm[t][s] from k_t.k_s and q_t.k_s
  auto put = [&](int t, int s, float kk, float qk) {
    const bool in = s <= t && t < n;
    const float dec = in ? expf(sG[t] - sG[s]) : 0.0f;
    sA[t * kGCP + s] = in && s < t ? sB[t] * dec * kk : 0.0f;
    gBm[t * kGC + s] = in ? a.qscale * dec * qk : 0.0f;
  };
  {  // warp w: rows 16 (w % 4) .., columns 32 (w / 4) ..
    const int w = tid >> 5, g = (tid & 31) >> 2, q2 = 2 * (tid & 3), tr = 16 * (w & 3), n0 = 32 * (w >> 2);
    float kk[4][4] = {}, qk[4][4] = {};
    auto Kt = [&](int k, int s) { return sK[(n0 + s) * KP + k]; };
    gdn_tc_mm<4>(kk, 0, S, [&](int r, int k) { return sK[(tr + r) * KP + k]; }, Kt);
    gdn_tc_mm<4>(qk, 0, S, [&](int r, int k) { return sQ[(tr + r) * KP + k]; }, Kt);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) put(tr + g + 8 * (e >> 1), n0 + 8 * nt + q2 + (e & 1), kk[nt][e], qk[nt][e]);
  }
  __syncthreads();
  {  // (I + A) Tm = I by forward substitution: column j by 4 threads (terms s = j + part + 4m), row by row
    const int j = tid >> 2, part = tid & 3;
    for (int t = 0; t < kGC; ++t) {
      float acc = 0.0f;
      for (int s = j + part; s < t; s += 4) acc = fmaf(sA[t * kGCP + s], sT[s * kGCP + j], acc);
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      if (part == 0) sT[t * kGCP + j] = (t == j ? 1.0f : 0.0f) - acc;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kGC * kGC; idx += kPrepThreads) mt[idx] = sT[(idx / kGC) * kGCP + idx % kGC];
  if (tid < kGC) mt[2 * kGC * kGC + tid] = sG[tid];
}

template <int S>
__global__ void __launch_bounds__(kPassThreads) gdn_pass_tc_kernel(const GdnChunkK ck) {
  const GdnK& a = ck.a;
  const GdnPlanP& p = ck.p;
  extern __shared__ float smf[];
  constexpr int KP = gdn_tc_kp<S>(), NC = kGNC;
  const int run = blockIdx.z, h = blockIdx.y, col0 = blockIdx.x * NC, tid = threadIdx.x;
  if (run >= p.count[1]) return;
  const int4 rd = p.runs[run];
  const int hk = h % a.Hk, tr = 16 * (tid >> 5), g = (tid & 31) >> 2, q2 = 2 * (tid & 3);
  float* sM = smf;                  // [S][kMP]: M0[:, col0 ..]
  float* sK = sM + S * kMP;         // [C][KP]
  float* sX = sK + kGC * KP;        // Q [C][KP], then Tm and Bm [C][kTP]
  float* sR = sX + gdn_tc_x<S>();   // [C][kMP]: v, then R
  float* sD = sR + kGC * kMP;       // [C][kMP]: D
  float* sDt = sD + kGC * kMP;      // [C][kMP]: e^{G_L-G_s} D
  float* sG = sDt + kGC * kMP;      // [C]
  float* sB = sG + kGC;             // [C]
  float* sTm = sX;
  float* sBm = sX + kGC * kTP;
  char* stc = a.st + size_t(h) * a.nb2 + size_t(rd.z) * a.nb3;
  auto scol = [&](int j) { return reinterpret_cast<float*>(stc + size_t(col0 + j) * a.nb1); };
  for (int idx = tid; idx < S * NC; idx += kPassThreads) {
    const int j = idx / S, i = idx - j * S;
    gdn_cp(&sM[i * kMP + j], scol(j) + i);  // waited for with the first chunk's stage
  }
  // The fragment's rows t (e / 2 = 0, 1) and columns j (e % 2) in the warp's [C][16] tile.
  auto frow = [&](int e) { return tr + g + 8 * (e >> 1); };
  auto fcol = [&](int nt, int e) { return 8 * nt + q2 + (e & 1); };
  for (int c = rd.x; c < rd.x + rd.y; ++c) {
    const int4 ch = p.chunks[c];
    const int t0 = ch.x, n = ch.y;
    const float* mt = p.mats + (size_t(c) * size_t(a.Hv) + size_t(h)) * size_t(detail::kGdnMatFloats);
    __syncthreads();  // the previous chunk is done with sK, sX, sR, sD and has updated sM
    gdn_stage_qk<S, kPassThreads, KP>(a, t0, n, hk, sK, sX, ck.vec);
    gdn_stage_rows<kPassThreads>(sR, kMP, a.v + int64_t(t0) * a.v_s2 + int64_t(h) * a.v_s1 + col0, a.v_s2, n, NC,
                                 ck.vec);
    if (tid < kGC) {
      gdn_cp(&sG[tid], mt + 2 * kGC * kGC + tid);
      if (tid < n) gdn_cp(&sB[tid], a.beta + int64_t(t0 + tid) * a.Hv + h);
      else sB[tid] = 0.0f;
    }
    gdn_stage_wait();
    auto Mb = [&](int k, int j) { return sM[k * kMP + j]; };
    float o[2][4] = {}, km[2][4] = {};
    gdn_tc_mm<2>(o, 0, S, [&](int r, int k) { return sX[(tr + r) * KP + k]; }, Mb);  // Q M0
    __syncthreads();  // every warp is done with Q: Tm and Bm take its place while K M0 is formed
    gdn_stage_rows<kPassThreads>(sTm, kTP, mt, kGC, kGC, kGC, true);  // the workspace's rows are 16-byte aligned
    gdn_stage_rows<kPassThreads>(sBm, kTP, mt + kGC * kGC, kGC, kGC, kGC, true);
    __pipeline_commit();
    gdn_tc_mm<2>(km, 0, S, [&](int r, int k) { return sK[(tr + r) * KP + k]; }, Mb);  // K M0
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // R = beta (V - e^G K M0) (in place of V), O = e^G (Q M0) / sqrt(S)
      const int t = frow(e);
      const float eg = expf(sG[t]);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float& rv = sR[t * kMP + fcol(nt, e)];
        rv = t < n ? sB[t] * (rv - eg * km[nt][e]) : 0.0f;
        o[nt][e] *= a.qscale * eg;
      }
    }
    __pipeline_wait_prior(0);
    __syncthreads();  // Tm and Bm have landed; every row of R is written
    const float GL = sG[n - 1];
    {  // D = Tm R (Tm is lower triangular: the warp's rows need s < tr + 16)
      float d[2][4] = {};
      gdn_tc_mm<2>(d, 0, tr + 16, [&](int r, int k) { return sTm[(tr + r) * kTP + k]; },
                   [&](int k, int j) { return sR[k * kMP + j]; });
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = frow(e);
        const float w = t < n ? expf(GL - sG[t]) : 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int j = fcol(nt, e);
          sD[t * kMP + j] = d[nt][e], sDt[t * kMP + j] = w * d[nt][e];
        }
      }
    }
    __syncthreads();
    // O += Bm D (Bm lower triangular), stored for the chunk's tokens
    gdn_tc_mm<2>(o, 0, tr + 16, [&](int r, int k) { return sBm[(tr + r) * kTP + k]; },
                 [&](int k, int j) { return sD[k * kMP + j]; });
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int t = frow(e);
      if (t >= n) continue;
      float* op = a.out + int64_t(t0 + t) * a.o_s2 + int64_t(h) * a.o_s1 + col0;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) op[fcol(nt, e)] = o[nt][e], op[fcol(nt, e + 1)] = o[nt][e + 1];
    }
    {  // M0 = e^{G_L} M0 + K^T Dt on the warp's row tiles i0 (rows of K past n are zeros)
      const float eL = expf(GL);
      const int kn = (n + 7) & ~7;
      for (int i0 = tr; i0 < S; i0 += 64) {
        float* mp = sM + (i0 - tr) * kMP;  // fragment (nt, e) at mp[frow(e) * kMP + fcol(nt, e)]
        float m[2][4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) m[nt][e] = eL * mp[frow(e) * kMP + fcol(nt, e)];
        gdn_tc_mm<2>(m, 0, kn, [&](int r, int k) { return sK[k * KP + i0 + r]; },
                     [&](int k, int j) { return sDt[k * kMP + j]; });
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) mp[frow(e) * kMP + fcol(nt, e)] = m[nt][e];
      }
    }
  }
  __syncthreads();
  for (int idx = tid; idx < S * NC; idx += kPassThreads) {
    const int j = idx / S, i = idx - j * S;
    scol(j)[i] = sM[i * kMP + j];
  }
}

template <int S>
void gdn_chunked_launch(const GdnChunkK& ck, const detail::GdnChunkLayout& l, cudaStream_t st) {
  static const bool attr =
      cudaFuncSetAttribute(gdn_prep_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(gdn_prep_smem<S>())) ==
          cudaSuccess &&
      cudaFuncSetAttribute(gdn_pass_tc_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(gdn_pass_tc_smem<S>())) == cudaSuccess;
  KILN_CHECK(attr, "gated_delta (chunked): {} / {} bytes of shared memory refused (S {})", gdn_prep_smem<S>(),
             gdn_pass_tc_smem<S>(), S);
  const dim3 pgrid(unsigned(l.nc_max), unsigned(ck.a.Hv)), grid(unsigned(S / kGNC), unsigned(ck.a.Hv), unsigned(l.nr_max));
  gdn_prep_kernel<S><<<pgrid, kPrepThreads, gdn_prep_smem<S>(), st>>>(ck);
  gdn_pass_tc_kernel<S><<<grid, kPassThreads, gdn_pass_tc_smem<S>(), st>>>(ck);
}

}  // namespace
}  // namespace kiln::cuda
