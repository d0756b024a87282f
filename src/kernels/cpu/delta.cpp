// kernels/cpu/delta.cpp — the recurrent ops of kernels/ops.h: conv1d_silu (ggml's ssm_conv + SiLU)
//   and the gated delta rule, as a token recurrence (ggml's order; the AVX-512 table's fused row
//   kernel in delta_avx512.cpp) and in chunked form.
// Threading: channels (conv1d) or v-heads / state rows (delta rule) split across the pool; results
//   never depend on the split.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace kiln::kernels {

using cpu::Table;

namespace {
inline size_t align64(size_t x) { return (x + 63) & ~size_t(63); }
}  // namespace

void conv1d_silu(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t C, int64_t n_t, int d_conv, ThreadPool& pool, float* const* keep) {
  KILN_CHECK(d_conv >= 1 && d_conv <= 8, "conv1d_silu: d_conv {} not in 1..8", d_conv);
  constexpr int kCB = 16;  // channels per inner block (one cache line of x per token)
  const int K = d_conv;
  const Table& T = cpu::table();
  const auto taps16 = T.ggml_conv_taps16;  // AVX-512: ggml's ssm_conv (an fma per tap from 0)
  // ... and fused with silu when that is the table's silu_ggml512 (whose 16-lane step it repeats).
  const auto conv16 = taps16 && T.ggml_conv_silu16 ? T.ggml_conv_silu16 : nullptr;
  // Channel blocks are independent: a dynamic schedule (a thread kept off its core leaves its
  // blocks to the others) cannot change a result.
  const int64_t n_blk = (C + kCB - 1) / kCB;
  // AVX-512, whole blocks: the same steps through Table::ggml_conv_silu16 (window in registers), in
  // tiles of kTT tokens over up to kMB blocks, so that x and y stream row by row (one block over all
  // tokens would walk a 4*C-byte stride through memory).
  constexpr int kMB = 32, kTT = 16;
  const int64_t n_full = conv16 ? C / kCB : 0;
  auto blocks = [&](int64_t b0, int64_t b1, int) {
    alignas(64) float win[8][kCB] = {}, wt[8][kCB] = {}, acc[kCB];
    for (int64_t bb = b0; bb < std::min(b1, n_full); bb += kMB) {
      const int64_t be = std::min({b1, n_full, bb + kMB});
      alignas(64) float wins[kMB][7][kCB], wts[kMB][8][kCB];
      for (int64_t b = bb; b < be; ++b)
        for (int c = 0; c < kCB; ++c) {
          const int64_t ch = b * kCB + c;
          for (int j = 0; j < K; ++j) wts[b - bb][j][c] = w[ch * K + j];
          for (int j = 0; j < K - 1; ++j) wins[b - bb][j][c] = state[ch * (K - 1) + j];
        }
      for (int64_t t0 = 0; t0 < n_t;) {
        // A tile ends at kTT tokens or after a kept token (whose windows are then copied out).
        int64_t t1 = std::min(n_t, t0 + kTT);
        if (keep != nullptr)
          for (int64_t t = t0; t < t1; ++t)
            if (keep[t] != nullptr) {
              t1 = t + 1;
              break;
            }
        for (int64_t b = bb; b < be; ++b)
          conv16(x + t0 * x_stride + b * kCB, x_stride, &wts[b - bb][0][0], &wins[b - bb][0][0], y + t0 * y_stride + b * kCB,
                 y_stride, t1 - t0, K);
        if (keep != nullptr && keep[t1 - 1] != nullptr)
          for (int64_t b = bb; b < be; ++b)
            for (int c = 0; c < kCB; ++c)
              for (int j = 0; j < K - 1; ++j) keep[t1 - 1][(b * kCB + c) * (K - 1) + j] = wins[b - bb][j][c];
        t0 = t1;
      }
      for (int64_t b = bb; b < be; ++b)
        for (int c = 0; c < kCB; ++c)
          for (int j = 0; j < K - 1; ++j) state[(b * kCB + c) * (K - 1) + j] = wins[b - bb][j][c];
    }
    for (int64_t b = std::max(b0, n_full); b < b1; ++b) {
      const int64_t c0 = b * kCB;
      const int nc = int(std::min<int64_t>(kCB, C - c0));
      for (int c = 0; c < nc; ++c) {
        for (int j = 0; j < K; ++j) wt[j][c] = w[(c0 + c) * K + j];
        for (int j = 0; j < K - 1; ++j) win[j][c] = state[(c0 + c) * (K - 1) + j];
      }
      for (int64_t t = 0; t < n_t; ++t) {
        const float* xt = x + t * x_stride + c0;
        float* yt = y + t * y_stride + c0;
        for (int c = 0; c < nc; ++c) win[K - 1][c] = xt[c];  // read before the (possibly aliased) write below
        if (taps16) {
          taps16(&win[0][0], &wt[0][0], K, acc);
          std::memcpy(yt, acc, size_t(nc) * sizeof(float));
        } else {
          for (int c = 0; c < nc; ++c) {
            float s = 0;
            for (int j = 0; j < K; ++j) s += wt[j][c] * win[j][c];
            yt[c] = s;
          }
        }
        for (int j = 0; j < K - 1; ++j)
          for (int c = 0; c < nc; ++c) win[j][c] = win[j + 1][c];
        T.silu(yt, yt, nc);
        if (keep != nullptr && keep[t] != nullptr)
          for (int c = 0; c < nc; ++c)
            for (int j = 0; j < K - 1; ++j) keep[t][(c0 + c) * (K - 1) + j] = win[j][c];
      }
      for (int c = 0; c < nc; ++c)
        for (int j = 0; j < K - 1; ++j) state[(c0 + c) * (K - 1) + j] = win[j][c];
    }
  };
  // A decode step's few channels x one token (microseconds) run on the calling thread: waking the
  // pool would cost about as much.
  if (C * n_t < 16 * 1024) blocks(0, n_blk, 0);
  else pool.parallel_for_dynamic(n_blk, blocks, 1, std::max<int64_t>(1, n_blk / (4 * pool.size())));
}

void gated_delta_rule(const DeltaArgs& a, ThreadPool& pool) {
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  const Table& T = cpu::table();
  const int64_t S = a.S;
  const float qscale = 1.0f / std::sqrt(float(S));
  // ggml's gated_delta_net: its rows are independent, so scale / dot / fma-update / dot per row is
  // its all-rows-per-phase order; the dots in ggml_vec_dot_f32's order where the table has it.
  const int si = S == 64 ? 0 : S == 128 ? 1 : S == 256 ? 2 : -1;
  if (const cpu::DeltaRowsFn rows = si >= 0 && T.ggml_delta_rows[si] && T.ggml_dot_f32 ? T.ggml_delta_rows[si] : nullptr) {
    // Fused (AVX-512): the same per-row steps with each row in registers across a block of tokens.
    // Rows are independent, so work items are (head, 32 rows), dynamically scheduled: the bits do
    // not depend on the split.
    constexpr int64_t kRowsPerItem = 32, kTokBlock = 64;
    const int64_t rpi = std::min<int64_t>(kRowsPerItem, S);
    // A range may span heads (KILN_DYNAMIC_ROWS=0 makes the schedule static): one head at a time.
    auto head_rows = [&](int64_t h, int64_t j0, int64_t j1) {
      const int64_t hk = h % a.Hk;
      alignas(64) float decay[kTokBlock], beta[kTokBlock];
      for (int64_t t0 = 0; t0 < a.n_t; t0 += kTokBlock) {
        const int64_t L = std::min(kTokBlock, a.n_t - t0);
        for (int64_t t = 0; t < L; ++t) {
          decay[t] = std::exp(a.g[(t0 + t) * a.Hv + h]);
          beta[t] = a.beta[(t0 + t) * a.Hv + h];
        }
        cpu::DeltaRowsArgs ra;
        ra.st = a.state + h * S * S;
        ra.S = S;
        ra.j0 = j0;
        ra.j1 = j1;
        ra.n_t = L;
        ra.q = a.q + t0 * a.qk_stride + hk * S;
        ra.k = a.k + t0 * a.qk_stride + hk * S;
        ra.qk_stride = a.qk_stride;
        ra.v = a.v + t0 * a.v_stride + h * S;
        ra.v_stride = a.v_stride;
        ra.decay = decay;
        ra.beta = beta;
        ra.out = a.out + t0 * a.out_stride + h * S;
        ra.out_stride = a.out_stride;
        ra.qscale = qscale;
        ra.keep = a.keep ? a.keep + t0 : nullptr;
        ra.keep_off = h * S * S;
        rows(ra);
      }
    };
    pool.parallel_for_dynamic(a.Hv * S, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1;) {
        const int64_t h = i / S, e = std::min(i1, (h + 1) * S);
        head_rows(h, i - h * S, e - h * S);
        i = e;
      }
    }, rpi, rpi);
    return;
  }
  auto dot = [&T](const float* x, const float* y, int64_t n) {
    return T.ggml_dot_f32 ? T.ggml_dot_f32(x, y, n) : T.dot_f32(x, y, n);
  };
  pool.parallel_for(a.Hv, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hk = h % a.Hk;
      float* st = a.state + h * S * S;
      for (int64_t t = 0; t < a.n_t; ++t) {
        const float* q = a.q + t * a.qk_stride + hk * S;
        const float* k = a.k + t * a.qk_stride + hk * S;
        const float* v = a.v + t * a.v_stride + h * S;
        float* o = a.out + t * a.out_stride + h * S;
        const float decay = std::exp(a.g[t * a.Hv + h]), beta = a.beta[t * a.Hv + h];
        for (int64_t j = 0; j < S; ++j) {
          float* row = st + j * S;  // row j = column j of M: M[i][j] for all i
          T.scale(row, decay, S);
          const float dj = (v[j] - dot(row, k, S)) * beta;
          T.axpy(dj, k, row, S);
          o[j] = dot(row, q, S) * qscale;
        }
        if (a.keep != nullptr && a.keep[t] != nullptr) std::memcpy(a.keep[t] + h * S * S, st, size_t(S * S) * 4);
      }
    }
  });
}

namespace {
// Per-thread scratch of the chunked form: KS QS Dl [C, S], KK QK [C, C], G cf [C] floats.
size_t delta_chunk_bytes(int64_t S, int64_t C) { return align64(size_t(3 * C * S + 2 * C * C + 2 * C) * 4); }
}  // namespace

size_t gated_delta_chunked_workspace(int64_t S, int chunk, int n_threads) {
  return size_t(n_threads) * delta_chunk_bytes(S, chunk);
}

// Chunked form. Within a chunk of L tokens with cumulative log-decay G_t (inclusive) and start
// state M0, the deltas solve a unit lower-triangular system and the outputs / final state follow:
//   d_t = beta_t (v_t - e^{G_t} M0^T k_t - sum_{s<t} e^{G_t-G_s} (k_t.k_s) d_s)
//   o_t = (e^{G_t} M0^T q_t + sum_{s<=t} e^{G_t-G_s} (q_t.k_s) d_s) / sqrt(S)
//   M_L = e^{G_L} M0 + sum_s e^{G_L-G_s} k_s d_s^T
void gated_delta_rule_chunked(const DeltaArgs& a, int chunk, void* ws, ThreadPool& pool) {
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule_chunked: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  KILN_CHECK(chunk >= 1 && ws != nullptr, "gated_delta_rule_chunked: chunk {} / workspace", chunk);
  KILN_CHECK(a.keep == nullptr, "gated_delta_rule_chunked: keep states are the recurrence's (gated_delta_rule)");
  const Table& T = cpu::table();
  const int64_t S = a.S, C = chunk;
  const float qscale = 1.0f / std::sqrt(float(S));
  const size_t per = delta_chunk_bytes(S, C);
  pool.parallel_for(a.Hv, [&](int64_t h0, int64_t h1, int tid) {
    float* base = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + size_t(tid) * per);
    float* KS = base;          // [S, C]: row t = M0^T k_t
    float* QS = KS + C * S;    // [S, C]: row t = M0^T q_t
    float* Dl = QS + C * S;    // [S, C]: row t = d_t
    float* KK = Dl + C * S;    // [C, C]: KK[t*C + s] = k_t.k_s
    float* QK = KK + C * C;    // [C, C]
    float* G = QK + C * C;     // [C]
    float* cf = G + C;         // [C]
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hk = h % a.Hk;
      float* st = a.state + h * S * S;
      for (int64_t t0 = 0; t0 < a.n_t; t0 += C) {
        const int64_t L = std::min<int64_t>(C, a.n_t - t0);
        auto qv = [&](int64_t t) { return a.q + (t0 + t) * a.qk_stride + hk * S; };
        auto kv = [&](int64_t t) { return a.k + (t0 + t) * a.qk_stride + hk * S; };
        float gs = 0;
        for (int64_t t = 0; t < L; ++t) G[t] = (gs += a.g[(t0 + t) * a.Hv + h]);
        for (int64_t t = 0; t < L; ++t)
          for (int64_t j = 0; j < S; ++j) {
            KS[t * S + j] = T.dot_f32(st + j * S, kv(t), S);
            QS[t * S + j] = T.dot_f32(st + j * S, qv(t), S);
          }
        for (int64_t t = 0; t < L; ++t)
          for (int64_t s = 0; s <= t; ++s) {
            KK[t * C + s] = T.dot_f32(kv(t), kv(s), S);
            QK[t * C + s] = T.dot_f32(qv(t), kv(s), S);
          }
        for (int64_t t = 0; t < L; ++t) {
          const float beta = a.beta[(t0 + t) * a.Hv + h], eg = std::exp(G[t]);
          const float* v = a.v + (t0 + t) * a.v_stride + h * S;
          float* d = Dl + t * S;
          for (int64_t j = 0; j < S; ++j) d[j] = v[j] - eg * KS[t * S + j];
          for (int64_t s = 0; s < t; ++s) T.axpy(-std::exp(G[t] - G[s]) * KK[t * C + s], Dl + s * S, d, S);
          T.scale(d, beta, S);
          float* o = a.out + (t0 + t) * a.out_stride + h * S;
          for (int64_t j = 0; j < S; ++j) o[j] = eg * QS[t * S + j];
          for (int64_t s = 0; s <= t; ++s) T.axpy(std::exp(G[t] - G[s]) * QK[t * C + s], Dl + s * S, o, S);
          T.scale(o, qscale, S);
        }
        const float eL = std::exp(G[L - 1]);
        for (int64_t s = 0; s < L; ++s) cf[s] = std::exp(G[L - 1] - G[s]);
        for (int64_t j = 0; j < S; ++j) {
          float* row = st + j * S;
          T.scale(row, eL, S);
          for (int64_t s = 0; s < L; ++s) T.axpy(cf[s] * Dl[s * S + j], kv(s), row, S);
        }
      }
    }
  });
}

}  // namespace kiln::kernels
