// kernels/cuda/deltanet_fused.cu — the fused delta-net launchers of cuda_ops.h for small batches
//   (decode): delta_prep (gates + conv1d_silu + the L2 norms of q and k: one kernel) and
//   gated_delta_norm (the gated delta rule + the gated RMSNorm of its output: one kernel).
// Owns: delta_prep_fused — a block per (head of S channels: q heads, k heads, v heads in channel
//   order; run), blockIdx.y = the run's first token (blocks whose token starts no run return at
//   once), a thread per channel walking the run's tokens in order: the conv window in registers
//   (read from the slot's state at the run's first token, written back at its last), SiLU, and for
//   q/k heads the head's sum of squares by a block reduction per token; the v-head blocks also apply
//   the gates of their head to the run's tokens. Each thread reads and writes only its own channel,
//   so the in-place update of `mixed` needs no barrier between tokens. A decode batch of T slots is
//   T runs of one token: T times the blocks of one walk over T tokens (run 110: 32 slots took 32 us). gated_delta_norm_fused — a
//   block per (v head, token range) holding the whole S x S state of its head in registers (S / 16
//   threads per value column, 16 key rows each), tokens staged 8 at a time in shared memory; per
//   token the recurrence of deltanet.cu (kvm = e^g (M.k), out = (e^g (M.q) + d (k.q)) / sqrt(S),
//   M = e^g M + k d), then the head's RMS over its S outputs (block reduction) and
//   out = o * rms * w * silu(z). Sums in F32 in the GPU's own order.
// Must not: allocate, synchronize or read device memory on the host. The launchers return false
//   (enqueuing nothing) for shapes they do not cover; the caller then runs the unfused ops.
// Threading: launchers only enqueue on L.stream.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/deltanet_common.cuh"
#include "kernels/cuda/invariant.h"
#include "kernels/cuda/row_common.cuh"

namespace kiln::cuda {
namespace {

constexpr int64_t kFusedMaxT = 64;  // batches up to this many tokens take the fused kernels

// ---- delta_prep ---------------------------------------------------------------------------------
struct PrepK {
  float* x;  // mixed: channel c of token t at x[t * xs + c]
  int64_t xs;
  const float* w;  // conv taps [K, C], oldest first
  const int32_t* seq;
  const int32_t* keep;  // nullptr, or per token: the slot that also receives the state after it (-1: none)
  char* st;  // conv state row c of slot s at st + c * nb1 + s * nb3 (K - 1 floats, oldest first)
  size_t nb1, nb3;
  Rows beta, g;  // [Hv, T]
  const float* dt_bias;
  const float* a;
  int Hk, T;
  float eps;
};

template <int K>
__global__ void delta_prep_kernel(const PrepK p) {
  pdl::begin();  // pdl.cuh: nothing global before this
  constexpr int H = K - 1;
  __shared__ float red[32];
  const int grp = blockIdx.x, tid = threadIdx.x, t0 = blockIdx.y;
  const int s = p.seq[t0];
  if (t0 > 0 && p.seq[t0 - 1] == s) return;  // not a run's first token (uniform per block)
  int t1 = t0 + 1;                              // the run: tokens t0 .. t1 - 1 of slot s
  while (t1 < p.T && p.seq[t1] == s) ++t1;
  const bool qk = grp < 2 * p.Hk;  // uniform per block
  const int64_t c = int64_t(grp) * blockDim.x + tid;
  if (!qk) {  // gates of v head h for the run's tokens
    const int h = grp - 2 * p.Hk;
    for (int t = t0 + tid; t < t1; t += blockDim.x) {
      float* br = row_mut(p.beta, t) + h;
      float* gr = row_mut(p.g, t) + h;
      *br = sigmoidf_(*br);
      *gr = softplusf_(*gr + p.dt_bias[h]) * p.a[h];
    }
  }
  float wk[K], win[H];
#pragma unroll
  for (int j = 0; j < K; ++j) wk[j] = p.w[c * K + j];
  float* sp = reinterpret_cast<float*>(p.st + size_t(c) * p.nb1 + size_t(s) * p.nb3);
#pragma unroll
  for (int j = 0; j < H; ++j) win[j] = sp[j];
  for (int t = t0; t < t1; ++t) {
    const float xv = p.x[int64_t(t) * p.xs + c];
    float acc = wk[K - 1] * xv;
#pragma unroll
    for (int j = 0; j < H; ++j) acc = fmaf(wk[j], win[j], acc);
    float y = acc / (1.0f + expf(-acc));
#pragma unroll
    for (int j = 0; j + 1 < H; ++j) win[j] = win[j + 1];
    win[H - 1] = xv;
    if (p.keep && p.keep[t] >= 0) {  // speculative verification: this token's state into its keep slot
      float* kp = reinterpret_cast<float*>(p.st + size_t(c) * p.nb1 + size_t(p.keep[t]) * p.nb3);
#pragma unroll
      for (int j = 0; j < H; ++j) kp[j] = win[j];
    }
    if (t + 1 == t1)
#pragma unroll
      for (int j = 0; j < H; ++j) sp[j] = win[j];
    if (qk) {
      const float ss = block_sum(y * y, red);
      y *= 1.f / sqrtf(ss + p.eps);
    }
    p.x[int64_t(t) * p.xs + c] = y;
  }
}

// ---- gated_delta_norm ---------------------------------------------------------------------------
struct GdnNormK {
  GdnK r;  // the recurrence's arguments (deltanet_common.cuh); r.range is 1
  const float* z;
  int64_t z_s1, z_s2;
  const float* nw;  // [S]
  float eps;
};

constexpr int kGnCh = 8;  // tokens staged at a time

template <int S, bool VEC>
__global__ void __launch_bounds__(S * S / 16) gdn_norm_kernel(const GdnNormK a) {
  pdl::begin();  // pdl.cuh: nothing global before this
  constexpr int TPC = S / 16;
  constexpr int NT = S * TPC;
  __shared__ __align__(16) float qs[kGnCh][S], ks[kGnCh][S];
  __shared__ float vs[kGnCh][S], zs[kGnCh][S], gs[kGnCh], bs[kGnCh], red[32];
  __shared__ int ss[kGnCh];
  const int tid = threadIdx.x, gl = tid % TPC, col = tid / TPC, h = blockIdx.x, hk = h % a.r.Hk;
  const float wn = a.nw[col];
  const int tb = blockIdx.y * a.r.range, te = min(a.r.T, tb + a.r.range);
  for (int ts = tb; ts < te; ++ts) {
    const int slot = a.r.seq[ts];
    if (ts > 0 && a.r.seq[ts - 1] == slot) continue;  // not the first token of a run
    float* sp = reinterpret_cast<float*>(a.r.st + size_t(col) * a.r.nb1 + size_t(h) * a.r.nb2 + size_t(slot) * a.r.nb3);
    float M[16];
    gdn_load16<TPC, VEC>(sp, gl, S, M);
    for (int t0 = ts;; t0 += kGnCh) {
      const int n = min(kGnCh, a.r.T - t0);
      for (int idx = tid; idx < n * S; idx += NT) {
        const int u = idx / S, i = idx - u * S;
        const int64_t t = t0 + u;
        qs[u][i] = a.r.q[t * a.r.q_s2 + int64_t(hk) * a.r.q_s1 + i];
        ks[u][i] = a.r.k[t * a.r.k_s2 + int64_t(hk) * a.r.k_s1 + i];
        vs[u][i] = a.r.v[t * a.r.v_s2 + int64_t(h) * a.r.v_s1 + i];
        zs[u][i] = a.z[t * a.z_s2 + int64_t(h) * a.z_s1 + i];
      }
      if (tid < n) {
        gs[tid] = a.r.g[int64_t(t0 + tid) * a.r.Hv + h];
        bs[tid] = a.r.beta[int64_t(t0 + tid) * a.r.Hv + h];
        ss[tid] = a.r.seq[t0 + tid];
      }
      __syncthreads();
      int u = 0;
      for (; u < n && ss[u] == slot; ++u) {  // uniform: every thread reads the same ss[u]
        float pk, pq, kq;
        float qr[16], kr[16];
        gdn_qk16<TPC>(qs[u], ks[u], gl, S, qr, kr);
        gdn_dots16(M, qr, kr, pk, pq, kq);
#pragma unroll
        for (int o = TPC / 2; o > 0; o >>= 1) {
          pk += __shfl_xor_sync(0xffffffffu, pk, o);
          pq += __shfl_xor_sync(0xffffffffu, pq, o);
          kq += __shfl_xor_sync(0xffffffffu, kq, o);
        }
        const float decay = expf(gs[u]);
        const float dl = (vs[u][col] - decay * pk) * bs[u];
        const float o = (decay * pq + dl * kq) * a.r.qscale;
        gdn_update16(M, kr, dl, decay);
        if (a.r.keep) {  // speculative verification: this token's state into its keep slot (uniform branch)
          const int kslot = a.r.keep[t0 + u];
          if (kslot >= 0)
            gdn_store16<TPC, VEC>(reinterpret_cast<float*>(a.r.st + size_t(col) * a.r.nb1 + size_t(h) * a.r.nb2 +
                                                           size_t(kslot) * a.r.nb3), gl, S, M);
        }
        // The gated RMSNorm of the head's S outputs of this token.
        const float sq = block_sum(gl == 0 ? o * o : 0.0f, red);
        const float sc = 1.f / sqrtf(sq * (1.0f / float(S)) + a.eps);
        if (gl == 0) a.r.out[int64_t(t0 + u) * a.r.o_s2 + int64_t(h) * a.r.o_s1 + col] = o * sc * wn * siluf_(zs[u][col]);
      }
      __syncthreads();  // the chunk is consumed before the next one is staged
      if (u < kGnCh) break;  // the run (or the batch) ended inside this chunk
    }
    gdn_store16<TPC, VEC>(sp, gl, S, M);
  }
}

}  // namespace

bool delta_prep_fused(const Launch& L, float* x, int64_t x_stride, int64_t S, int64_t Hk, int64_t Hv, const float* w,
                      int d_conv, const int32_t* seq, SeqMem state, Rows beta, Rows g, const float* dt_bias,
                      const float* a, float eps, int64_t T, const int32_t* keep) {
  if (T == 0) return true;
  if (T > kFusedMaxT || batch_invariant() || d_conv != 4 || S % 32 != 0 || S > 1024 || state.type != GgmlType::F32) return false;
  const int64_t C = (2 * Hk + Hv) * S;
  KILN_CHECK(state.ne0 == d_conv - 1 && state.ne1 == C, "delta_prep: conv state [{}, {}], expected [{}, {}]", state.ne0,
             state.ne1, d_conv - 1, C);
  KILN_CHECK(beta.ne0 == Hv && g.ne0 == Hv && n_rows(beta) == T && n_rows(g) == T, "delta_prep: beta/g [{}, {}]", Hv, T);
  PrepK p{x, x_stride, w, seq, keep, static_cast<char*>(state.p), state.nb1, state.nb3, beta, g, dt_bias, a, int(Hk), int(T),
          eps};
  pdl::launch(L, dim3(unsigned(2 * Hk + Hv), unsigned(T)), dim3(unsigned(S)), 0, delta_prep_kernel<4>, p);
  KILN_CUDA_LAUNCHED("delta_prep");
  return true;
}

bool gated_delta_norm_fused(const Launch& L, Rows q, Rows k, Rows v, const float* g, const float* beta,
                            const int32_t* seq, SeqMem state, Rows out, const float* norm_w, Rows z, float eps,
                            const int32_t* keep) {
  const int64_t T = v.n2, S = v.ne0, Hv = v.n1, Hk = q.n1;
  if (T == 0) return true;
  if (T > kFusedMaxT || batch_invariant() || (S != 64 && S != 128) || state.type != GgmlType::F32) return false;
  KILN_CHECK(q.ne0 == S && k.ne0 == S && k.n1 == Hk && Hk > 0 && Hv % Hk == 0 && q.n2 == T && k.n2 == T,
             "gated_delta_norm: q/k [{}, {}, {}] do not fit v [{}, {}, {}]", q.ne0, q.n1, q.n2, S, Hv, T);
  KILN_CHECK(out.ne0 == S && out.n1 == Hv && out.n2 == T && z.ne0 == S && z.n1 == Hv && z.n2 == T,
             "gated_delta_norm: out / z shape");
  KILN_CHECK(state.ne0 == S && state.ne1 == S && state.ne2 == Hv, "gated_delta_norm: state must be F32 [S, S, Hv]");
  GdnNormK a;
  GdnK& b = a.r;
  b.q = q.p, b.q_s1 = q.s1, b.q_s2 = q.s2;
  b.k = k.p, b.k_s1 = k.s1, b.k_s2 = k.s2;
  b.v = v.p, b.v_s1 = v.s1, b.v_s2 = v.s2;
  b.g = g, b.beta = beta, b.seq = seq, b.keep = keep;
  b.st = static_cast<char*>(state.p), b.nb1 = state.nb1, b.nb2 = state.nb2, b.nb3 = state.nb3;
  b.out = out.p, b.o_s1 = out.s1, b.o_s2 = out.s2;
  b.S = int(S), b.Hk = int(Hk), b.Hv = int(Hv), b.T = int(T), b.range = 1;
  b.qscale = float(1.0 / std::sqrt(double(S)));
  a.z = z.p, a.z_s1 = z.s1, a.z_s2 = z.s2;
  a.nw = norm_w;
  a.eps = eps;
  const bool vec = reinterpret_cast<uintptr_t>(state.p) % 16 == 0 && state.nb1 % 16 == 0 && state.nb2 % 16 == 0 &&
                   state.nb3 % 16 == 0;
  const dim3 grid{unsigned(Hv), unsigned(T)};
  if (S == 64 && vec) pdl::launch(L, grid, dim3(64 * 64 / 16), 0, gdn_norm_kernel<64, true>, a);
  else if (S == 64) pdl::launch(L, grid, dim3(64 * 64 / 16), 0, gdn_norm_kernel<64, false>, a);
  else if (vec) pdl::launch(L, grid, dim3(128 * 128 / 16), 0, gdn_norm_kernel<128, true>, a);
  else pdl::launch(L, grid, dim3(128 * 128 / 16), 0, gdn_norm_kernel<128, false>, a);
  KILN_CUDA_LAUNCHED("gated_delta_norm");
  return true;
}

}  // namespace kiln::cuda
