// kernels/cuda/deltanet.cu — the Gated-DeltaNet sequence ops behind cuda_ops.h: the causal
//   depthwise conv + SiLU with its per-slot input state, and the gated delta rule recurrence.
// Owns: conv1d_silu — a block per 32 channels walks the batch in tiles of 64 tokens staged in
//   shared memory (y may alias x); a run reads its slot's state at its first token and writes the
//   last d_conv-1 inputs back at its last. gated_delta — per (v head, group of value columns j) a
//   block keeps the state columns M[:, j] in registers (16 key rows per thread, interleaved as
//   deltanet_common.cuh's gdn_row says, S/16 threads per column, rounded up to a power of two) and loops over the run's tokens in the kernel, staging 16
//   tokens' q, k, v, g, beta at a time in shared memory (cp.async); the token's two column dots (M.k, M.q) and
//   k.q are one pass and one shuffle tree: kvm = e^g (M.k), out = (e^g (M.q) + d (k.q)) / sqrt(S),
//   M = e^g M + k d (the same values as ops.h's order up to rounding). Runs are found on the device:
//   grid.z splits the batch into token ranges and a block takes every run that starts in its range.
//   chunk > 0: runs of at least max(chunk, 64) tokens take the chunked form instead
//   (deltanet_chunked.cuh; sm_80+, S 32 / 64 / 128, no keep slots, not --batch-invariant).
// Must not: allocate, synchronize or read device memory on the host; argument errors are KILN_CHECK
//   failures before any enqueue.
// Threading: launchers only enqueue on L.stream.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/deltanet_chunked.cuh"
#include "kernels/cuda/deltanet_common.cuh"

namespace kiln::cuda {
namespace {

#define KILN_DN_LAUNCHED(what)                                                                     \
  do {                                                                                             \
    const cudaError_t e_ = cudaGetLastError();                                                     \
    KILN_CHECK(e_ == cudaSuccess, "{}: kernel launch failed: {}", what, cudaGetErrorString(e_));   \
  } while (0)

constexpr int kThreads = 128;
constexpr int64_t kMaxRanges = 64;  // gated_delta: token ranges (grid.z) at most

// ---- conv1d_silu ------------------------------------------------------------------------------

struct ConvK {
  const float* x;
  int64_t xs;
  const float* w;  // [d_conv, C]: row c = the taps of channel c, oldest first
  const int32_t* seq;
  const int32_t* keep;  // nullptr, or per token: the slot that also receives the state after it (-1: none)
  char* st;  // row c of slot s at st + c*nb1 + s*nb3: d_conv-1 floats, oldest first
  size_t nb1, nb3;
  float* y;
  int64_t ys, C, T;
};

// One block per 32 channels (one per lane) walks the batch in tiles of kConvTT tokens: the tile's
// inputs are staged in shared memory (with the previous tile's last d_conv-1 as a halo), then the 8
// warps compute its outputs in parallel, then the run ends leave their states. Every input is read
// before any output of its tile is written, and a slot's state is read (run start) before it is
// written (run end, after a barrier), so y may alias x.
constexpr int kConvCh = 32, kConvWarps = 8, kConvTT = 64;

template <int K>
__global__ void __launch_bounds__(kConvCh * kConvWarps) conv_kernel(const ConvK a) {
  constexpr int H = K - 1;
  __shared__ float xt[kConvTT + H][kConvCh + 1];  // row H + r: token t0 + r; rows 0..H-1: the halo
  __shared__ int sq[kConvTT + H + 1];             // the same rows' slots; row H + n: the token after the tile
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t c = int64_t(blockIdx.x) * kConvCh + lane;
  const bool cok = c < a.C;
  float w[K];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = cok ? a.w[c * K + j] : 0.0f;
  if (tid < H) sq[tid] = -1;  // no token before the batch
  auto state = [&](int slot) { return reinterpret_cast<float*>(a.st + size_t(c) * a.nb1 + size_t(slot) * a.nb3); };
  for (int64_t t0 = 0; t0 < a.T; t0 += kConvTT) {
    const int n = a.T - t0 < kConvTT ? int(a.T - t0) : kConvTT;
#pragma unroll
    for (int i = 0; i < kConvTT / kConvWarps; ++i) {
      const int r = warp + i * kConvWarps;
      if (r < n) xt[H + r][lane] = cok ? a.x[(t0 + r) * a.xs + c] : 0.0f;
    }
    for (int r = tid; r <= n; r += kConvCh * kConvWarps)
      sq[H + r] = r < n ? a.seq[t0 + r] : (t0 + n < a.T ? a.seq[t0 + n] : -1);
    __syncthreads();
    // outputs: tap j of token t is the input m = H - j tokens back; `back` of them are in t's run,
    // the older ones come from the slot's state (index H - (m - back))
#pragma unroll
    for (int i = 0; i < kConvTT / kConvWarps; ++i) {
      const int r = warp + i * kConvWarps;
      if (r >= n || !cok) continue;
      const int sl = sq[H + r];
      int back = 0;
      while (back < H && sq[H + r - back - 1] == sl) ++back;
      float acc = w[K - 1] * xt[H + r][lane];
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const int m = H - j;
        const float v = m <= back ? xt[H + r - m][lane] : state(sl)[H - (m - back)];
        acc = fmaf(w[j], v, acc);
      }
      a.y[(t0 + r) * a.ys + c] = acc / (1.0f + expf(-acc));
    }
    __syncthreads();  // every run start has read its state
    // kept tokens (speculative verification): the state a run ending here would leave, into slot keep[t]
    if (a.keep) {
#pragma unroll
      for (int i = 0; i < kConvTT / kConvWarps; ++i) {
        const int r = warp + i * kConvWarps;
        if (r >= n || !cok) continue;
        const int ks = a.keep[t0 + r];
        if (ks < 0) continue;
        const int sl = sq[H + r];
        int back = 0;
        while (back < H && sq[H + r - back - 1] == sl) ++back;
        const float* sp = state(sl);
        float* kp = state(ks);
#pragma unroll
        for (int j = 0; j < H; ++j) {
          const int m = H - 1 - j;
          kp[j] = m <= back ? xt[H + r - m][lane] : sp[H - (m - back)];
        }
      }
    }
    // run ends: the state becomes the run's last H inputs (older ones from the old state)
#pragma unroll
    for (int i = 0; i < kConvTT / kConvWarps; ++i) {
      const int r = warp + i * kConvWarps;
      if (r >= n || !cok || sq[H + r + 1] == sq[H + r]) continue;
      const int sl = sq[H + r];
      int back = 0;
      while (back < H && sq[H + r - back - 1] == sl) ++back;
      float* sp = state(sl);
      float nv[H];
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const int m = H - 1 - j;
        nv[j] = m <= back ? xt[H + r - m][lane] : sp[H - (m - back)];
      }
#pragma unroll
      for (int j = 0; j < H; ++j) sp[j] = nv[j];
    }
    __syncthreads();
    if (n == kConvTT) {  // the tile's last H tokens become the next tile's halo
      if (warp == 0)
#pragma unroll
        for (int j = 0; j < H; ++j) xt[j][lane] = xt[n + j][lane];
      if (tid < H) sq[tid] = sq[n + tid];
    }
    __syncthreads();
  }
}

// ---- gated delta rule -------------------------------------------------------------------------

// grid (column blocks, Hv, token ranges). TPC threads per value column j, each with key rows
// gdn_row(gl, 0..3) + 0..3 of M[:, j] in registers. The run's inputs are staged kCh tokens at a time
// in shared memory (all loads of a chunk in flight together), then the recurrence walks them.
constexpr int kCh = 16;
constexpr int kMaxS = 256;

template <int TPC, bool VEC>
__global__ void __launch_bounds__(kThreads) gdn_kernel(const GdnK a) {
  constexpr int CPB = kThreads / TPC;
  __shared__ __align__(16) float qs[kCh][kMaxS], ks[kCh][kMaxS];
  __shared__ float vs[kCh][CPB], gs[kCh], bs[kCh];
  __shared__ int ss[kCh];
  const int tid = threadIdx.x, gl = tid % TPC, S = a.S;
  const int col0 = blockIdx.x * CPB, col = col0 + tid / TPC, h = blockIdx.y, hk = h % a.Hk;
  const bool col_ok = col < S;
  const int tb = blockIdx.z * a.range, te = min(a.T, tb + a.range);
  for (int ts = tb; ts < te; ++ts) {
    const int slot = a.seq[ts];
    if (ts > 0 && a.seq[ts - 1] == slot) continue;  // not the first token of a run
    if (a.skip && a.skip[ts]) continue;              // a long run: the chunked kernels take it
    float* sp = reinterpret_cast<float*>(a.st + size_t(col_ok ? col : 0) * a.nb1 + size_t(h) * a.nb2 +
                                         size_t(slot) * a.nb3);
    float M[16] = {};
    if (col_ok) gdn_load16<TPC, VEC>(sp, gl, S, M);
    for (int t0 = ts;; t0 += kCh) {
      const int n = min(kCh, a.T - t0);
      // asynchronous copies (cp.async on sm_80+): every load of the chunk in flight at once
      for (int idx = tid; idx < n * S; idx += kThreads) {
        const int u = idx / S, i = idx - u * S;
        __pipeline_memcpy_async(&qs[u][i], a.q + int64_t(t0 + u) * a.q_s2 + int64_t(hk) * a.q_s1 + i, sizeof(float));
        __pipeline_memcpy_async(&ks[u][i], a.k + int64_t(t0 + u) * a.k_s2 + int64_t(hk) * a.k_s1 + i, sizeof(float));
      }
      for (int idx = tid; idx < n * CPB; idx += kThreads) {
        const int u = idx / CPB, j = idx - u * CPB;
        if (col0 + j < S)
          __pipeline_memcpy_async(&vs[u][j], a.v + int64_t(t0 + u) * a.v_s2 + int64_t(h) * a.v_s1 + col0 + j,
                                  sizeof(float));
        else
          vs[u][j] = 0.0f;
      }
      if (tid < n) {
        __pipeline_memcpy_async(&gs[tid], a.g + int64_t(t0 + tid) * a.Hv + h, sizeof(float));
        __pipeline_memcpy_async(&bs[tid], a.beta + int64_t(t0 + tid) * a.Hv + h, sizeof(float));
        __pipeline_memcpy_async(&ss[tid], a.seq + t0 + tid, sizeof(int));
      }
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();
      int u = 0;
      for (; u < n && ss[u] == slot; ++u) {
        float pk = 0.0f, pq = 0.0f, kq = 0.0f;
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
        const float dl = (vs[u][tid / TPC] - decay * pk) * bs[u];
        const float o = (decay * pq + dl * kq) * a.qscale;
        gdn_update16(M, kr, dl, decay);
        if (gl == 0 && col_ok) a.out[int64_t(t0 + u) * a.o_s2 + int64_t(h) * a.o_s1 + col] = o;
        if (a.keep && col_ok) {  // speculative verification: this token's state into its keep slot
          const int kslot = a.keep[t0 + u];
          if (kslot >= 0)
            gdn_store16<TPC, VEC>(reinterpret_cast<float*>(a.st + size_t(col) * a.nb1 + size_t(h) * a.nb2 + size_t(kslot) * a.nb3), gl, S, M);
        }
      }
      __syncthreads();  // the chunk is consumed before the next one is staged
      if (u < kCh) break;  // the run (or the batch) ended inside this chunk
    }
    if (col_ok) gdn_store16<TPC, VEC>(sp, gl, S, M);
  }
}

template <int TPC>
void launch_gdn(const GdnK& k, bool vec, dim3 grid, cudaStream_t st) {
  if (vec) gdn_kernel<TPC, true><<<grid, kThreads, 0, st>>>(k);
  else gdn_kernel<TPC, false><<<grid, kThreads, 0, st>>>(k);
}

}  // namespace

void conv1d_silu(const Launch& L, const float* x, int64_t x_stride, const float* w, int d_conv, int64_t C,
                 const int32_t* seq, SeqMem state, float* y, int64_t y_stride, int64_t T, const int32_t* keep) {
  if (T == 0 || C == 0) return;
  KILN_CHECK(d_conv >= 2 && d_conv <= 8, "conv1d_silu: d_conv {} (supported 2..8)", d_conv);
  KILN_CHECK(state.type == GgmlType::F32 && state.ne0 == d_conv - 1 && state.ne1 == C,
             "conv1d_silu: state must be F32 [{}, {}] (got [{}, {}])", d_conv - 1, C, state.ne0, state.ne1);
  ConvK a{x, x_stride, w, seq, keep, static_cast<char*>(state.p), state.nb1, state.nb3, y, y_stride, C, T};
  const unsigned blocks = unsigned((C + kConvCh - 1) / kConvCh);
  switch (d_conv) {
    case 2: conv_kernel<2><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
    case 3: conv_kernel<3><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
    case 4: conv_kernel<4><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
    case 5: conv_kernel<5><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
    case 6: conv_kernel<6><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
    case 7: conv_kernel<7><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
    default: conv_kernel<8><<<blocks, kConvCh * kConvWarps, 0, L.stream>>>(a); break;
  }
  KILN_DN_LAUNCHED("conv1d_silu");
}

void gated_delta(const Launch& L, Rows q, Rows k, Rows v, const float* g, const float* beta, const int32_t* seq,
                 SeqMem state, Rows out, int chunk, const int32_t* keep) {
  const int64_t T = v.n2, S = v.ne0, Hv = v.n1, Hk = q.n1;
  if (T == 0) return;
  KILN_CHECK(S >= 16 && S <= 256 && S % 16 == 0, "gated_delta: S {} (supported: multiples of 16 up to 256)", S);
  KILN_CHECK(q.ne0 == S && k.ne0 == S && k.n1 == Hk && Hk > 0 && Hv % Hk == 0 && q.n2 == T && k.n2 == T,
             "gated_delta: q/k [{}, {}, {}] do not fit v [{}, {}, {}]", q.ne0, q.n1, q.n2, S, Hv, T);
  KILN_CHECK(out.ne0 == S && out.n1 == Hv && out.n2 == T, "gated_delta: out shape");
  KILN_CHECK(state.type == GgmlType::F32 && state.ne0 == S && state.ne1 == S && state.ne2 == Hv,
             "gated_delta: state must be F32 [S, S, Hv]");
  GdnK a;
  a.q = q.p, a.q_s1 = q.s1, a.q_s2 = q.s2;
  a.k = k.p, a.k_s1 = k.s1, a.k_s2 = k.s2;
  a.v = v.p, a.v_s1 = v.s1, a.v_s2 = v.s2;
  a.g = g, a.beta = beta, a.seq = seq, a.keep = keep;
  a.st = static_cast<char*>(state.p), a.nb1 = state.nb1, a.nb2 = state.nb2, a.nb3 = state.nb3;
  a.out = out.p, a.o_s1 = out.s1, a.o_s2 = out.s2;
  a.S = int(S), a.Hk = int(Hk), a.Hv = int(Hv), a.T = int(T);
  a.qscale = float(1.0 / std::sqrt(double(S)));
  // Runs of at least max(chunk, 64) tokens: the chunked form (deltanet_chunked.cuh), planned on the
  // device first; the recurrence below skips their tokens.
  const detail::GdnChunkLayout cl = !keep && L.sm >= 80 && gated_delta_workspace(S, Hv, chunk, T) > 0
                                        ? detail::gdn_chunk_layout(Hv, T)
                                        : detail::GdnChunkLayout{};
  GdnPlanP plan{};
  if (cl.nr_max > 0) {
    KILN_CHECK(L.ws && L.ws_bytes >= cl.bytes, "gated_delta (chunked): workspace of {} bytes needed, {} given",
               cl.bytes, L.ws_bytes);
    plan = gdn_plan_ptrs(L.ws, cl);
    gdn_plan_kernel<<<1, kPlanThreads, 0, L.stream>>>(seq, int(T), std::max(chunk, kGC), plan);
    KILN_DN_LAUNCHED("gated_delta (chunk plan)");
    a.skip = plan.skip;
  }
  const int64_t ranges = std::min<int64_t>(T, kMaxRanges);
  a.range = int((T + ranges - 1) / ranges);
  const bool vec = reinterpret_cast<uintptr_t>(state.p) % 16 == 0 && state.nb1 % 16 == 0 && state.nb2 % 16 == 0 &&
                   state.nb3 % 16 == 0;
  int tpc = 1;
  while (tpc * 16 < S) tpc *= 2;
  const dim3 grid(unsigned((S + kThreads / tpc - 1) / (kThreads / tpc)), unsigned(Hv),
                  unsigned((T + a.range - 1) / a.range));
  switch (tpc) {
    case 1: launch_gdn<1>(a, vec, grid, L.stream); break;
    case 2: launch_gdn<2>(a, vec, grid, L.stream); break;
    case 4: launch_gdn<4>(a, vec, grid, L.stream); break;
    case 8: launch_gdn<8>(a, vec, grid, L.stream); break;
    default: launch_gdn<16>(a, vec, grid, L.stream); break;
  }
  KILN_DN_LAUNCHED("gated_delta");
  if (cl.nr_max > 0) {
    const GdnChunkK ck{a, plan,
                       rows_vec16(q.p, q.s1, q.s2) && rows_vec16(k.p, k.s1, k.s2) && rows_vec16(v.p, v.s1, v.s2)};
    switch (S) {
      case 32: gdn_chunked_launch<32>(ck, cl, L.stream); break;
      case 64: gdn_chunked_launch<64>(ck, cl, L.stream); break;
      default: gdn_chunked_launch<128>(ck, cl, L.stream); break;
    }
    KILN_DN_LAUNCHED("gated_delta (chunked)");
  }
}

}  // namespace kiln::cuda
