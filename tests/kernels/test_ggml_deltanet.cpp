// The qwen35 / qwen35moe ops in ggml's order (llama.cpp's CPU backend on AVX-512 hosts):
//  - AVX-512 table entries ggml_dot_f32 (ggml_vec_dot_f32 with GCC's in-order vectorized tail), silu (ggml_vec_silu_f32), sigmoid / sigmoid_mul (scalar libm
//    expf), ggml_conv_taps16 (through conv1d_silu: ssm_conv, an fma per tap from 0);
//  - l2_norm (build_gdn_l2_norm: rms_norm with eps/n, then a scale), softplus, gated_delta_rule
//    (ggml_gated_delta_net's token recurrence), topk_route (soft_max, argsort top-k, renormalisation).
// Each is checked bit for bit against a scalar emulation of ggml's order (explicit lanes, std::fma
// for every fused op) and for accuracy against a double-precision reference. This file is compiled
// without -mfma: no implicit contraction happens here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "ggml_emul.h"
#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

// reduce16, exp_emul, vec_dot_f32_emul (ggml_vec_dot_f32's order), bits: ggml_emul.h.

float silu_lane(float x) { return x / (1.f + exp_emul(0.f - x)); }
void silu_emul(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) y[i + l] = silu_lane(x[i + l]);
  for (; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

struct Avx512Table {
  IsaGuard guard;
  const cpu::Table* t = nullptr;
  Avx512Table() {
    if (set_isa(CpuIsa::Avx512)) t = &cpu::table();
  }
  bool ok() const { return t && t->ggml_dot_f32 && t->ggml_softmax_exp && t->ggml_conv_taps16; }
};
#define REQUIRE_AVX512(T)                                                                                  \
  if ((T).ok()) {                                                                                          \
  } else                                                                                                   \
    GTEST_SKIP() << "no AVX-512: the ggml-order entries (ggml_dot_f32, ggml_conv_taps16, ggml_softmax_exp, AVX-512 " \
                    "silu / sigmoid) exist only on AVX-512 hosts"

// ggml_gated_delta_net (scalar g, K = 1) for one v-head, phase by phase as ggml writes it:
// scale all of M, then all deltas, then all rank-1 updates, then all outputs. M is stored
// transposed: row j = column j.
void delta_emul(const DeltaArgs& a) {
  const int64_t S = a.S;
  const float scale = 1.0f / std::sqrt(float(S));
  std::vector<float> delta(static_cast<size_t>(S));
  for (int64_t h = 0; h < a.Hv; ++h) {
    const int64_t hk = h % a.Hk;
    float* M = a.state + h * S * S;
    for (int64_t t = 0; t < a.n_t; ++t) {
      const float* q = a.q + t * a.qk_stride + hk * S;
      const float* k = a.k + t * a.qk_stride + hk * S;
      const float* v = a.v + t * a.v_stride + h * S;
      const float beta = a.beta[t * a.Hv + h], decay = std::exp(a.g[t * a.Hv + h]);
      for (int64_t i = 0; i < S * S; ++i) M[i] = M[i] * decay;
      for (int64_t j = 0; j < S; ++j) delta[size_t(j)] = (v[j] - vec_dot_f32_emul(M + j * S, k, S)) * beta;
      for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < S; ++i) M[j * S + i] = std::fma(k[i], delta[size_t(j)], M[j * S + i]);
      float* o = a.out + t * a.out_stride + h * S;
      for (int64_t j = 0; j < S; ++j) o[j] = vec_dot_f32_emul(M + j * S, q, S) * scale;
    }
  }
}

}  // namespace

TEST(GgmlDeltaNet, DotF32AccuracyAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  for (int64_t n : {1, 4, 7, 8, 15, 16, 24, 31, 32, 33, 63, 64, 100, 128, 200, 256, 1000}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (auto& v : x) v = d(rng);
      for (auto& v : y) v = d(rng);
      const float got = T.t->ggml_dot_f32(x.data(), y.data(), n);
      ASSERT_EQ(bits(got), bits(vec_dot_f32_emul(x.data(), y.data(), n))) << "n " << n;
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += double(x[size_t(i)]) * y[size_t(i)];
        mag += std::fabs(double(x[size_t(i)]) * y[size_t(i)]);
      }
      ASSERT_LE(std::fabs(got - ref), 2e-7 * mag * std::sqrt(double(n)) + 1e-30) << "n " << n;
    }
  }
}

// The tail order matters: the same numbers through a plain fma chain differ somewhere.
TEST(GgmlDeltaNet, DotF32TailIsNotAnFmaChain) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  int differ = 0;
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<float> x(32), y(32);
    for (auto& v : x) v = d(rng);
    for (auto& v : y) v = d(rng);
    float f = 0;
    for (int i = 0; i < 32; ++i) f = std::fma(x[size_t(i)], y[size_t(i)], f);
    differ += bits(f) != bits(T.t->ggml_dot_f32(x.data(), y.data(), 32));
  }
  EXPECT_GT(differ, 0);
}

TEST(GgmlDeltaNet, SiluSigmoidAccuracyAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-30.f, 30.f);
  for (int64_t n : {1, 15, 16, 32, 100, 256}) {
    std::vector<float> x(static_cast<size_t>(n)), b(static_cast<size_t>(n)), y(static_cast<size_t>(n)), ye(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng);
    for (auto& v : b) v = d(rng);
    T.t->silu(x.data(), y.data(), n);
    silu_emul(x.data(), ye.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = size_t(i);
      ASSERT_EQ(bits(y[u]), bits(ye[u])) << "silu n " << n << " i " << i;
      const double r = double(x[u]) / (1.0 + std::exp(-double(x[u])));
      ASSERT_LE(std::fabs(y[u] - r), 1e-6 * std::fabs(r) + 1e-30);
    }
    T.t->sigmoid(x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = size_t(i);
      ASSERT_EQ(bits(y[u]), bits(1.0f / (1.0f + std::exp(-x[u]))));
      ASSERT_LE(std::fabs(y[u] - 1.0 / (1.0 + std::exp(-double(x[u])))), 1e-7);
    }
    T.t->sigmoid_mul(b.data(), x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = size_t(i);
      ASSERT_EQ(bits(y[u]), bits(b[u] * (1.0f / (1.0f + std::exp(-x[u])))));
    }
  }
}

TEST(GgmlDeltaNet, L2NormAndSoftplusBitExact) {
  ThreadPool pool(2);
  for (int64_t n : {16, 32, 100, 128}) {
    const int64_t rows = 6;
    auto x = randv(size_t(n * rows), uint32_t(n), -2.f, 2.f);
    for (int64_t i = 0; i < n; ++i) x[size_t(5 * n + i)] = 0.f;  // an all-zero row: eps keeps it finite
    for (float eps : {1e-6f, 1e-5f}) {
      std::vector<float> y(x.size());
      l2_norm(crows3(x.data(), n, rows), rows3(y.data(), n, rows), eps, pool);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.data() + r * n;
        double sumd;
        const double sum = sum_sq_emul(xr, n, &sumd);
        const float mean = float(sum / double(n));
        const float s = 1.0f / std::sqrt(mean + eps / float(n)), post = 1.0f / std::sqrt(float(n));
        for (int64_t i = 0; i < n; ++i) {
          const float want = (xr[i] * s) * post, g = y[size_t(r * n + i)];
          ASSERT_EQ(bits(g), bits(want)) << "n " << n << " r " << r << " i " << i;
          ASSERT_FALSE(std::isnan(g));
          if (r < 5) {
            const double ref = double(xr[i]) / std::sqrt(sumd + double(eps));
            ASSERT_LE(std::fabs(g - ref), 1e-6 * std::fabs(ref) + 1e-30) << "n " << n;
          }
        }
      }
    }
  }
  const std::vector<float> xs = {-100.f, -20.f, -3.f, -0.5f, 0.f, 0.5f, 3.f, 19.9f, 20.f, 20.5f, 80.f};
  std::vector<float> y(xs.size());
  softplus(xs.data(), y.data(), int64_t(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = xs[i] > 20.f ? xs[i] : std::log(1.0f + std::exp(xs[i]));
    EXPECT_EQ(bits(y[i]), bits(want)) << xs[i];
    const double ref = std::log1p(std::exp(double(xs[i])));
    EXPECT_LE(std::fabs(y[i] - ref), 2e-7 * std::max(1.0, ref) + 1e-7 * std::fabs(ref) + 1e-38) << xs[i];
  }
}

TEST(GgmlDeltaNet, ConvSiluBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  ThreadPool pool(2);
  // C % 16 == 0 blocks take the fused conv + silu kernel (Table::ggml_conv_silu16), K 2..4, in
  // tiles of 16 tokens over up to 32 blocks (n_t 37, C 1040: several of each).
  for (auto [C, K] : {std::pair<int64_t, int>{16, 4}, {40, 4}, {256, 4}, {48, 2}, {32, 3}, {1040, 4}}) {
    const int64_t n_t = 37;
    const auto x = randv(size_t(C * n_t), uint32_t(C), -2.f, 2.f), w = randv(size_t(C * K), uint32_t(C + 1));
    const auto st0 = randv(size_t(C * (K - 1)), uint32_t(C + 2));
    std::vector<float> st = st0, st_e = st0, y(x.size()), ye(x.size());
    conv1d_silu(x.data(), C, w.data(), st.data(), y.data(), C, C, n_t, K, pool);
    for (int64_t c = 0; c < C; ++c) {
      std::vector<float> win(static_cast<size_t>(K));
      for (int j = 0; j < K - 1; ++j) win[size_t(j)] = st_e[size_t(c * (K - 1) + j)];
      for (int64_t t = 0; t < n_t; ++t) {
        win[size_t(K - 1)] = x[size_t(t * C + c)];
        float s = 0;
        for (int j = 0; j < K; ++j) s = std::fma(win[size_t(j)], w[size_t(c * K + j)], s);
        ye[size_t(t * C + c)] = s;
        for (int j = 0; j < K - 1; ++j) win[size_t(j)] = win[size_t(j + 1)];
      }
      for (int j = 0; j < K - 1; ++j) st_e[size_t(c * (K - 1) + j)] = win[size_t(j)];
    }
    // silu per block of 16 channels (ggml: per row of C, the C % 16 tail with libm; the same split).
    for (int64_t t = 0; t < n_t; ++t) silu_emul(ye.data() + t * C, ye.data() + t * C, C);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(ye[i])) << "C " << C << " i " << i;
    // Accuracy: the conv and silu in double.
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < n_t; ++t) {
        double s = 0;
        for (int j = 0; j < K; ++j) {
          const int64_t tt = t - (K - 1) + j;  // input time of tap j
          const double xin = tt >= 0 ? double(x[size_t(tt * C + c)]) : double(st0[size_t(c * (K - 1) + (K - 1 + tt))]);
          s += xin * w[size_t(c * K + j)];
        }
        const double r = s / (1.0 + std::exp(-s));
        ASSERT_LE(std::fabs(y[size_t(t * C + c)] - r), 2e-6 * (std::fabs(r) + 1.0)) << "C " << C;
      }
    for (size_t i = 0; i < st.size(); ++i) ASSERT_EQ(bits(st[i]), bits(st_e[i]));
  }
}

TEST(GgmlDeltaNet, GatedDeltaRuleBitExactAndAccurate) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  ThreadPool pool(3);
  // S = 64 / 128 / 256 take the fused row kernel (Table::ggml_delta_rows); n_t = 150 spans several
  // of its 64-token blocks.
  for (auto [S, n_t] : {std::pair<int64_t, int64_t>{32, 7}, {128, 7}, {40, 7}, {64, 150}, {128, 150}, {256, 70}}) {
    const int64_t Hk = 2, Hv = 4, kd = S * Hk, conv = 2 * kd + S * Hv;
    auto mixed = randv(size_t(conv * n_t), uint32_t(S), -1.f, 1.f);
    // L2-normalised q, k as the model feeds them.
    for (int64_t t = 0; t < n_t; ++t)
      for (int64_t h = 0; h < 2 * Hk; ++h) {
        float* r = mixed.data() + t * conv + h * S;
        double ss = 0;
        for (int64_t i = 0; i < S; ++i) ss += double(r[i]) * r[i];
        for (int64_t i = 0; i < S; ++i) r[i] = float(r[i] / std::sqrt(ss));
      }
    const auto g = randv(size_t(Hv * n_t), uint32_t(S + 1), -2.f, -0.01f);
    const auto beta = randv(size_t(Hv * n_t), uint32_t(S + 2), 0.05f, 0.95f);
    const auto st0 = randv(size_t(Hv * S * S), uint32_t(S + 3), -0.5f, 0.5f);
    std::vector<float> st = st0, st_e = st0, out(size_t(Hv * S * n_t)), out_e(out.size());
    DeltaArgs a;
    a.q = mixed.data();
    a.k = mixed.data() + kd;
    a.qk_stride = conv;
    a.v = mixed.data() + 2 * kd;
    a.v_stride = conv;
    a.g = g.data();
    a.beta = beta.data();
    a.out_stride = Hv * S;
    a.S = S;
    a.Hk = Hk;
    a.Hv = Hv;
    a.n_t = n_t;
    DeltaArgs ae = a;
    a.state = st.data();
    a.out = out.data();
    ae.state = st_e.data();
    ae.out = out_e.data();
    gated_delta_rule(a, pool);
    delta_emul(ae);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(bits(out[i]), bits(out_e[i])) << "S " << S << " out " << i;
    for (size_t i = 0; i < st.size(); ++i) ASSERT_EQ(bits(st[i]), bits(st_e[i])) << "S " << S << " state " << i;
    // Accuracy: the same recurrence in double.
    std::vector<double> M(st0.begin(), st0.end());
    double max_err = 0, max_ref = 0;
    for (int64_t h = 0; h < Hv; ++h) {
      double* m = M.data() + h * S * S;
      for (int64_t t = 0; t < n_t; ++t) {
        const float* q = a.q + t * conv + (h % Hk) * S;
        const float* k = a.k + t * conv + (h % Hk) * S;
        const float* v = a.v + t * conv + h * S;
        const double dec = std::exp(double(g[size_t(t * Hv + h)])), b = beta[size_t(t * Hv + h)];
        for (int64_t j = 0; j < S; ++j) {
          double* row = m + j * S;
          double kd2 = 0;
          for (int64_t i = 0; i < S; ++i) kd2 += (row[i] *= dec) * k[i];
          const double dj = (v[j] - kd2) * b;
          double o = 0;
          for (int64_t i = 0; i < S; ++i) o += (row[i] += k[i] * dj) * q[i];
          o /= std::sqrt(double(S));
          max_err = std::max(max_err, std::fabs(o - out[size_t(t * Hv * S + h * S + j)]));
          max_ref = std::max(max_ref, std::fabs(o));
        }
      }
    }
    EXPECT_LE(max_err, 1e-5 * max_ref) << "S " << S;
  }
}

TEST(GgmlDeltaNet, TopkRouteBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  for (int64_t X : {4, 8, 60, 256}) {
    const int k = X >= 8 ? 8 : 2;
    const int64_t n_tok = 5;
    const auto logits = randv(size_t(X * n_tok), uint32_t(X), -4.f, 4.f);
    for (float w_scale : {1.0f, 2.5f}) {
      for (bool renorm : {true, false}) {
        std::vector<int32_t> ids(size_t(k * n_tok));
        std::vector<float> wts(ids.size());
        topk_route(logits.data(), X, n_tok, k, renorm, w_scale, ids.data(), wts.data());
        for (int64_t t = 0; t < n_tok; ++t) {
          const float* l = logits.data() + t * X;
          float mx = -INFINITY;
          for (int64_t e = 0; e < X; ++e) mx = std::max(mx, l[e]);
          std::vector<float> p(static_cast<size_t>(X));
          double sum = 0;
          int64_t e = 0;
          for (; e + 16 <= X; e += 16) {
            for (int i = 0; i < 16; ++i) p[size_t(e + i)] = exp_emul(l[e + i] - mx);
            sum += double(reduce16(p.data() + e));
          }
          for (; e < X; ++e) sum += double(p[size_t(e)] = std::exp(l[e] - mx));
          const float inv = float(1.0 / sum);
          for (auto& v : p) v *= inv;
          std::vector<int32_t> order(static_cast<size_t>(X));
          for (int64_t i = 0; i < X; ++i) order[size_t(i)] = int32_t(i);
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
          double ws = 0;
          for (int i = 0; i < k; ++i) ws += double(p[size_t(order[size_t(i)])]);
          const float wsum = std::max(float(ws), 6.103515625e-5f);
          double exact_sum = 0;
          for (int64_t i = 0; i < X; ++i) exact_sum += std::exp(double(l[i]) - mx);
          for (int i = 0; i < k; ++i) {
            const int32_t id = order[size_t(i)];
            ASSERT_EQ(ids[size_t(t * k + i)], id) << "X " << X << " t " << t << " rank " << i;
            float w = p[size_t(id)];
            if (renorm) w = w / wsum;
            if (w_scale != 1.0f) w *= w_scale;
            ASSERT_EQ(bits(wts[size_t(t * k + i)]), bits(w)) << "X " << X << " t " << t << " rank " << i;
            const double pr = std::exp(double(l[id]) - mx) / exact_sum;
            if (!renorm) {
              EXPECT_LE(std::fabs(wts[size_t(t * k + i)] - pr * w_scale), 1e-6 * pr * w_scale);
            }
          }
        }
      }
    }
  }
}
