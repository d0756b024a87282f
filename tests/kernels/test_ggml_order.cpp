// The "ggml order" kernels (commit e8cf6da) against plain scalar references written here
// (the ones other test_ggml_*.cpp share are in ggml_emul.h):
//  - the AVX-512 table entries ggml_dot_f16 / ggml_softmax_exp / ggml_kqv / swiglu (x86_kernels.inc,
//    KILN_AVX512) and attention with AttnOrder::GgmlVec / GgmlTiny (llama.cpp's non-flash attention);
//  - rms_norm and rope (ggml's scalar arithmetic) and the one-chain legacy integer dots (legacy_nc).
// Each is checked (1) for accuracy against a double-precision reference and (2) bit for bit against a
// scalar emulation of ggml's operation order (explicit lane arrays, std::fma for every fused op).
// This file is compiled without -mfma / -mavx512f: no implicit contraction of a*b+c happens here, and
// the 16-lane reduction is emulated in GCC's _mm512_reduce_add_ps order rather than called.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "ggml_emul.h"
#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"
#include "tensor/blocks.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

// ---- scalar emulations of ggml's AVX-512 arithmetic ----------------------------------------------

// reduce16, reduce8, exp_emul, bits, h2f, f2h: ggml_emul.h.

double softmax_exp_emul(const float* x, float max, float* y, int64_t n) {
  double sum = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) y[i + l] = exp_emul(x[i + l] - max);
    sum += double(reduce16(y + i));
  }
  for (; i < n; ++i) sum += double(y[i] = std::exp(x[i] - max));
  return sum;
}

void swiglu_emul(const float* a, const float* b, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) {
      const float x = a[i + l];
      y[i + l] = (x / (1.f + exp_emul(0.f - x))) * b[i + l];
    }
  for (; i < n; ++i) y[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

float f16_round(float f) { return h2f(f2h(f)); }

// dot_f16_ggml512. tiny (and n % 16 == 0): lane l accumulates l, l+16, ...; otherwise four chains
// over steps of 64, folded (0+2)+(1+3) lane-wise, reduced, the n % 64 tail added in double.
float dot_f16_emul(const uint16_t* x, const uint16_t* y, int64_t n, bool tiny) {
  if (tiny && n % 16 == 0) {
    float acc[16] = {};
    for (int64_t l = 0; l < n; l += 16)
      for (int i = 0; i < 16; ++i) acc[i] = std::fma(h2f(x[l + i]), h2f(y[l + i]), acc[i]);
    return reduce16(acc);
  }
  std::vector<float> xf(static_cast<size_t>(n)), yf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xf[size_t(i)] = h2f(x[i]), yf[size_t(i)] = h2f(y[i]);
  return vec_dot_f16_emul(xf.data(), yf.data(), n);
}

// kqv_ggml512: position j -> lane j % 16 of chain (j / 16) % 4 (vec) or chain 0 (tiny); p == 0 skipped.
void kqv_emul(const uint8_t* v, size_t pos_stride, const float* p, int64_t n, int64_t D, bool tiny, float* out) {
  std::vector<float> acc(size_t(4 * 16 * D), 0.f);
  for (int64_t j = 0; j < n; ++j) {
    if (p[j] == 0.f) continue;
    const int64_t chain = tiny ? 0 : (j / 16) % 4, lane = j % 16;
    const auto* vj = reinterpret_cast<const uint16_t*>(v + size_t(j) * pos_stride);
    float* a = acc.data() + (chain * 16 + lane) * D;
    for (int64_t d = 0; d < D; ++d) a[d] = std::fma(h2f(vj[d]), p[j], a[d]);
  }
  for (int64_t d = 0; d < D; ++d) {
    float lane[16];
    for (int l = 0; l < 16; ++l) {
      auto c = [&](int ch) { return acc[size_t((ch * 16 + l) * D + d)]; };
      lane[l] = tiny ? c(0) : (c(0) + c(2)) + (c(1) + c(3));
    }
    out[d] = reduce16(lane);
  }
}

// ---- helpers ---------------------------------------------------------------------------------
// ulp of the float nearest to v (subnormal spacing 2^-149 at the bottom).
double ulp_of(double v) {
  const float f = std::fabs(float(v));
  return double(std::nextafter(f, INFINITY)) - double(f);
}
std::vector<uint16_t> rand_f16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& h : v) h = f2h(d(rng));
  return v;
}

// Selects the AVX-512 table (if this CPU has it) for the test's duration; the ggml entries are
// null on the AVX2 / scalar tables.
struct Avx512Table {
  IsaGuard guard;
  const cpu::Table* t = nullptr;
  Avx512Table() {
    if (set_isa(CpuIsa::Avx512)) t = &cpu::table();
  }
  bool ok() const { return t && t->ggml_dot_f16 && t->ggml_softmax_exp && t->ggml_kqv && t->swiglu; }
};
#define REQUIRE_AVX512(T)                                                                                \
  if ((T).ok()) {                                                                                          \
  } else                                                                                                   \
    GTEST_SKIP() << "no AVX-512: the ggml-order table entries (ggml_dot_f16, ggml_softmax_exp, " \
                                 "ggml_kqv, AVX-512 swiglu) exist only on AVX-512 hosts"

const int64_t kSizes[] = {1, 15, 16, 64, 100, 256, 1000};

}  // namespace

// ---- exp (through ggml_softmax_exp with max = 0) ----------------------------------------------

TEST(GgmlOrder, ExpAccuracyAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  // Dense sweep of [-80, 80] plus random points; n a multiple of 16 so every element takes the
  // AVX-512 path (the tail uses libm expf).
  std::vector<float> x;
  for (int i = 0; i <= 16000; ++i) x.push_back(-80.f + 160.f * float(i) / 16000.f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-80.f, 80.f);
  while (x.size() % 16 != 0 || x.size() < 20000) x.push_back(d(rng));
  const int64_t n = int64_t(x.size());
  std::vector<float> y(x.size()), ye(x.size());
  const double s = T.t->ggml_softmax_exp(x.data(), 0.f, y.data(), n);
  const double se = softmax_exp_emul(x.data(), 0.f, ye.data(), n);
  double worst = 0, worst_ulp = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(y[size_t(i)]), bits(ye[size_t(i)])) << "exp bit-exact, x = " << x[size_t(i)];
    const double ref = std::exp(double(x[size_t(i)]));
    // "2 ulp relative": |error| <= 2 * FLT_EPSILON * |exp(x)|. (Measured in ulps of the result's own
    // binade, ggml's polynomial reaches ~2.1 ulp just above a power of two, e.g. x = -47.54.)
    const double e = std::fabs(double(y[size_t(i)]) - ref) / ref;
    worst = std::max(worst, e / FLT_EPSILON);
    worst_ulp = std::max(worst_ulp, std::fabs(double(y[size_t(i)]) - ref) / ulp_of(ref));
    ASSERT_LE(e, 2.0 * FLT_EPSILON) << "exp within 2 ulp relative, x = " << x[size_t(i)] << " got " << y[size_t(i)]
                                    << " want " << ref;
  }
  std::printf("exp on [-80, 80]: max relative error %.3f * FLT_EPSILON, %.3f ulp of the result\n", worst, worst_ulp);
  EXPECT_EQ(s, se) << "softmax sum (per 16 lanes in float, then double)";

  // Underflow / overflow edges: exactly 0 for x <= -104 and -inf; +inf above the float range.
  std::vector<float> z = {-104.f, -104.5f, -110.f, -130.f, -150.f, -200.f, -1e6f, -1e30f, -INFINITY, -FLT_MAX,
                          -103.9f, -100.f, -87.5f, 88.5f, 89.f, 100.f, 200.f, INFINITY, 0.f, -0.f};
  while (z.size() % 16 != 0) z.push_back(1.f);
  std::vector<float> zy(z.size()), zye(z.size());
  T.t->ggml_softmax_exp(z.data(), 0.f, zy.data(), int64_t(z.size()));
  softmax_exp_emul(z.data(), 0.f, zye.data(), int64_t(z.size()));
  for (size_t i = 0; i < z.size(); ++i) {
    EXPECT_EQ(bits(zy[i]), bits(zye[i])) << "x = " << z[i];
    if (z[i] <= -104.f) {
      EXPECT_EQ(bits(zy[i]), 0u) << "exp(" << z[i] << ") must be +0";
    }
    if (z[i] >= 89.f) {
      EXPECT_EQ(zy[i], INFINITY) << "x = " << z[i];
    }
  }
  for (size_t i = 10; i <= 13; ++i) {  // -103.9 .. 88.5: subnormal to near FLT_MAX, still accurate
    const double ref = std::exp(double(z[i]));
    EXPECT_LE(std::fabs(double(zy[i]) - ref), std::max(2.0 * FLT_EPSILON * ref, 0x1p-149)) << "x = " << z[i];
  }
  EXPECT_EQ(zy[18], 1.f);
  EXPECT_EQ(zy[19], 1.f);
}

TEST(GgmlOrder, SoftmaxExpSizesAndTail) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> d(-30.f, 5.f);
  for (int64_t n : kSizes) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng);
    if (n > 3) x[2] = -INFINITY;  // masked position
    const float mx = *std::max_element(x.begin(), x.end());
    std::vector<float> y(static_cast<size_t>(n)), ye(static_cast<size_t>(n));
    const double s = T.t->ggml_softmax_exp(x.data(), mx, y.data(), n);
    const double se = softmax_exp_emul(x.data(), mx, ye.data(), n);
    double ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(bits(y[size_t(i)]), bits(ye[size_t(i)])) << "n " << n << " i " << i;
      const double r = std::exp(double(x[size_t(i)] - mx));  // the kernel rounds x - max to float first
      ref += r;
      EXPECT_LE(std::fabs(y[size_t(i)] - r), 2.0 * FLT_EPSILON * r) << "n " << n << " i " << i;
    }
    EXPECT_EQ(s, se) << "n " << n;
    EXPECT_NEAR(s, ref, 1e-6 * ref) << "n " << n;
  }
}

// ---- swiglu ------------------------------------------------------------------------------------

TEST(GgmlOrder, SwigluAccuracyAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> da(-20.f, 20.f), db(-3.f, 3.f);
  for (int64_t n : kSizes) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)), y(static_cast<size_t>(n)), ye(static_cast<size_t>(n));
    for (auto& v : a) v = da(rng);
    for (auto& v : b) v = db(rng);
    T.t->swiglu(a.data(), b.data(), y.data(), n);
    swiglu_emul(a.data(), b.data(), ye.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(y[size_t(i)]), bits(ye[size_t(i)])) << "n " << n << " i " << i << " a " << a[size_t(i)];
      const double x = a[size_t(i)], r = x / (1.0 + std::exp(-x)) * double(b[size_t(i)]);
      ASSERT_LE(std::fabs(y[size_t(i)] - r), 1e-6 * std::fabs(r)) << "n " << n << " a " << x;
    }
    // In place (y aliases a) gives the same bits.
    std::vector<float> a2 = a;
    T.t->swiglu(a2.data(), b.data(), a2.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(a2[size_t(i)]), bits(ye[size_t(i)]));
  }
  // Extremes: exp(-x) overflowing to inf gives -0 * b, exp underflowing gives x * b.
  std::vector<float> a = {-100.f, -89.f, -88.f, 88.f, 104.f, 200.f, -1e30f, 1e30f, 0.f, -0.f, 1e-30f, -1e-30f,
                          50.f, -50.f, 3.f, -3.f};
  std::vector<float> b(a.size(), 1.5f), y(a.size()), ye(a.size());
  T.t->swiglu(a.data(), b.data(), y.data(), int64_t(a.size()));
  swiglu_emul(a.data(), b.data(), ye.data(), int64_t(a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(bits(y[i]), bits(ye[i])) << "a = " << a[i];
    EXPECT_FALSE(std::isnan(y[i])) << "a = " << a[i];
  }
  EXPECT_EQ(y[5], 200.f * 1.5f);
}

// ---- F16 dots ----------------------------------------------------------------------------------

TEST(GgmlOrder, DotF16AccuracyAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(4);
  for (int64_t n : {1, 15, 16, 48, 64, 100, 128, 256, 1000, 4096}) {
    const auto x = rand_f16(size_t(n), rng, -2.f, 2.f), y = rand_f16(size_t(n), rng, -2.f, 2.f);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double p = double(h2f(x[size_t(i)])) * h2f(y[size_t(i)]);
      ref += p;
      mag += std::fabs(p);
    }
    for (bool tiny : {false, true}) {
      const float got = T.t->ggml_dot_f16(x.data(), y.data(), n, tiny);
      const float want = dot_f16_emul(x.data(), y.data(), n, tiny);
      EXPECT_EQ(bits(got), bits(want)) << "n " << n << " tiny " << tiny << " got " << got << " want " << want;
      EXPECT_LE(std::fabs(got - ref), 1e-5 * mag) << "n " << n << " tiny " << tiny;
    }
  }
}

TEST(GgmlOrder, DotF16OrdersDiffer) {
  // The two orders must give different bits on some inputs (otherwise the bit-exact test above
  // could not tell them apart), and the emulation must track the kernel on each.
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(5);
  int differ = 0;
  for (int rep = 0; rep < 50; ++rep) {
    const int64_t n = 256;
    const auto x = rand_f16(size_t(n), rng, -4.f, 4.f), y = rand_f16(size_t(n), rng, -4.f, 4.f);
    const float v = T.t->ggml_dot_f16(x.data(), y.data(), n, false), t = T.t->ggml_dot_f16(x.data(), y.data(), n, true);
    differ += bits(v) != bits(t);
    ASSERT_EQ(bits(v), bits(dot_f16_emul(x.data(), y.data(), n, false)));
    ASSERT_EQ(bits(t), bits(dot_f16_emul(x.data(), y.data(), n, true)));
  }
  EXPECT_GT(differ, 5);
}

// ---- kqv ---------------------------------------------------------------------------------------

TEST(GgmlOrder, KqvAccuracyAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> dp(0.f, 1.f);
  for (int64_t D : {16, 64, 128}) {
    for (int64_t n : kSizes) {
      const int64_t ld = D + 16;  // halves between positions (row padding)
      const auto v = rand_f16(size_t(n * ld), rng, -2.f, 2.f);
      std::vector<float> p(static_cast<size_t>(n));
      for (auto& x : p) x = f16_round(dp(rng) / float(n));
      if (n > 5) { p[1] = 0.f; p[4] = 0.f; }
      std::vector<float> acc(size_t(4 * 16 * D), 123.f);  // garbage: the kernel clears it
      for (bool tiny : {false, true}) {
        std::vector<float> out(static_cast<size_t>(D)), want(static_cast<size_t>(D));
        T.t->ggml_kqv(reinterpret_cast<const uint8_t*>(v.data()), size_t(ld) * 2, p.data(), n, D, tiny, acc.data(),
                      out.data());
        kqv_emul(reinterpret_cast<const uint8_t*>(v.data()), size_t(ld) * 2, p.data(), n, D, tiny, want.data());
        for (int64_t d = 0; d < D; ++d) {
          double ref = 0, mag = 0;
          for (int64_t j = 0; j < n; ++j) {
            const double t = double(p[size_t(j)]) * h2f(v[size_t(j * ld + d)]);
            ref += t;
            mag += std::fabs(t);
          }
          ASSERT_EQ(bits(out[size_t(d)]), bits(want[size_t(d)])) << "D " << D << " n " << n << " tiny " << tiny << " d " << d;
          ASSERT_LE(std::fabs(out[size_t(d)] - ref), 1e-5 * mag) << "D " << D << " n " << n << " d " << d;
        }
      }
    }
  }
}

// ---- attention GgmlVec / GgmlTiny ----------------------------------------------------------------

namespace {
struct AttnCase {
  int64_t D, n_head, n_head_kv, n_kv;
  std::vector<int32_t> pos;
};

// ops.cpp's attention_ggml per (token, head), with the emulated kernels.
void attention_ggml_emul(const std::vector<float>& q, const std::vector<int32_t>& pos, const uint8_t* kd,
                         const uint8_t* vd, size_t pos_stride, size_t head_stride, const AttnParams& p,
                         std::vector<float>& out) {
  const int64_t D = p.head_dim, group = p.n_head / p.n_head_kv;
  const bool tiny = p.order == AttnOrder::GgmlTiny;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < p.n_head; ++h) {
      const int64_t hk = h / group, n = int64_t(pos[t]) + 1, n16 = (n + 15) / 16 * 16;
      std::vector<uint16_t> qh(static_cast<size_t>(D));
      for (int64_t i = 0; i < D; ++i) qh[size_t(i)] = f2h(q[size_t((int64_t(t) * p.n_head + h) * D + i)]);
      std::vector<float> sc(static_cast<size_t>(n16), -INFINITY), ex(static_cast<size_t>(n16));
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const auto* kj = reinterpret_cast<const uint16_t*>(kd + size_t(j) * pos_stride + size_t(hk) * head_stride);
        sc[size_t(j)] = dot_f16_emul(kj, qh.data(), D, tiny) * p.scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      const double sum = softmax_exp_emul(sc.data(), mx, ex.data(), n16);
      const float inv = float(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) ex[size_t(j)] = f16_round(ex[size_t(j)] * inv);
      kqv_emul(vd + size_t(hk) * head_stride, pos_stride, ex.data(), n, D, tiny,
               out.data() + (int64_t(t) * p.n_head + h) * D);
    }
}
}  // namespace

TEST(GgmlOrder, AttentionVsStreamingAndBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  ThreadPool pool(2);
  const AttnCase cases[] = {
      {16, 2, 1, 40, {0, 14, 15, 39}},
      {64, 4, 2, 300, {0, 1, 63, 64, 99, 255, 299}},
      {128, 4, 4, 130, {129, 7}},
  };
  std::mt19937 rng(7);
  for (const auto& c : cases) {
    const int64_t D = c.D, nt = int64_t(c.pos.size());
    const size_t head_stride = size_t(D) * 2, pos_stride = size_t(c.n_head_kv) * head_stride + 32;
    std::vector<uint8_t> kc(pos_stride * size_t(c.n_kv)), vc(pos_stride * size_t(c.n_kv));
    std::uniform_real_distribution<float> dk(-1.5f, 1.5f);
    for (int64_t j = 0; j < c.n_kv; ++j)
      for (int64_t h = 0; h < c.n_head_kv; ++h)
        for (int64_t i = 0; i < D; ++i) {
          const uint16_t a = f2h(dk(rng)), b = f2h(dk(rng));
          std::memcpy(&kc[size_t(j) * pos_stride + size_t(h) * head_stride + size_t(i) * 2], &a, 2);
          std::memcpy(&vc[size_t(j) * pos_stride + size_t(h) * head_stride + size_t(i) * 2], &b, 2);
        }
    const auto q = randv(size_t(D * c.n_head * nt), uint32_t(D + nt), -2.f, 2.f);
    const KvView kv{GgmlType::F16, kc.data(), pos_stride, head_stride, c.n_kv};
    const KvView vv{GgmlType::F16, vc.data(), pos_stride, head_stride, c.n_kv};
    ASSERT_TRUE(attention_ggml_supported(GgmlType::F16, GgmlType::F16, D));
    AttnParams p{D, c.n_head, c.n_head_kv, 1.f / std::sqrt(float(D))};
    std::vector<float> streaming(q.size());
    attention(crows3(q.data(), D, c.n_head, nt), c.pos.data(), kv, vv, p, rows3(streaming.data(), D, c.n_head, nt), pool);
    for (AttnOrder o : {AttnOrder::GgmlVec, AttnOrder::GgmlTiny}) {
      p.order = o;
      std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
      attention(crows3(q.data(), D, c.n_head, nt), c.pos.data(), kv, vv, p, rows3(got.data(), D, c.n_head, nt), pool);
      attention_ggml_emul(q, c.pos, kc.data(), vc.data(), pos_stride, head_stride, p, want);
      double maxd = 0;
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_EQ(bits(got[i]), bits(want[i])) << "D " << D << " order " << int(o) << " i " << i;
        maxd = std::max(maxd, double(std::fabs(got[i] - streaming[i])));
      }
      EXPECT_LE(maxd, 2e-3) << "vs the default (Flash) order, D " << D << " order " << int(o);
    }
  }
}

// ---- rms_norm ------------------------------------------------------------------------------------

TEST(GgmlOrder, RmsNormBitExact) {
  ThreadPool pool(2);
  for (int64_t n : {1, 15, 64, 100, 256, 4096}) {
    const int64_t rows = 5;
    const auto x = randv(size_t(n * rows), uint32_t(n), -3.f, 3.f), w = randv(size_t(n), uint32_t(n + 1), 0.5f, 1.5f);
    for (float eps : {1e-6f, 1e-5f}) {
      for (bool with_w : {true, false}) {
        std::vector<float> y(x.size()), yi = x;
        rms_norm(crows3(x.data(), n, rows), with_w ? w.data() : nullptr, rows3(y.data(), n, rows), eps, pool);
        rms_norm(crows3(yi.data(), n, rows), with_w ? w.data() : nullptr, rows3(yi.data(), n, rows), eps, pool);
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x.data() + r * n;
          double sumd;
          const double sum = sum_sq_emul(xr, n, &sumd);
          const float mean = float(sum / double(n));
          const float s = 1.0f / std::sqrt(mean + eps);
          const double sd = 1.0 / std::sqrt(sumd / double(n) + double(eps));
          for (int64_t i = 0; i < n; ++i) {
            const float want = with_w ? (xr[i] * s) * w[size_t(i)] : xr[i] * s;
            const float g = y[size_t(r * n + i)];
            ASSERT_EQ(bits(g), bits(want)) << "n " << n << " r " << r << " i " << i;
            ASSERT_EQ(bits(yi[size_t(r * n + i)]), bits(want)) << "in place, n " << n;
            const double ref = double(xr[i]) * sd * (with_w ? double(w[size_t(i)]) : 1.0);
            ASSERT_LE(std::fabs(g - ref), 1e-6 * std::fabs(ref) + 1e-30) << "n " << n;
          }
        }
      }
    }
  }
}

// ---- rope ----------------------------------------------------------------------------------------

TEST(GgmlOrder, RopeBitExact) {
  ThreadPool pool(2);
  const std::vector<int32_t> pos = {0, 1, 2, 17, 100, 1000, 4095, 32767};
  struct Case { int64_t hd; int n_rot; bool neox; float base, fscale; };
  const Case cases[] = {{64, 64, true, 10000.f, 1.f}, {64, 64, false, 10000.f, 1.f}, {128, 64, true, 500000.f, 0.25f},
                        {80, 32, false, 1e6f, 1.f},     {16, 16, true, 10000.f, 2.f}};
  for (const auto& c : cases) {
    const int64_t nh = 3, nt = int64_t(pos.size());
    const auto x0 = randv(size_t(c.hd * nh * nt), uint32_t(c.hd + c.n_rot), -2.f, 2.f);
    std::vector<float> x = x0;
    RopeParams rp;
    rp.n_rot = c.n_rot;
    rp.neox = c.neox;
    rp.freq_base = c.base;
    rp.freq_scale = c.fscale;
    rope(rows3(x.data(), c.hd, nh, nt), pos.data(), rp, pool);
    const int half = c.n_rot / 2;
    const float theta_scale = std::pow(c.base, -2.0f / float(c.n_rot));
    for (int64_t t = 0; t < nt; ++t) {
      std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
      std::vector<double> csd(static_cast<size_t>(half)), snd(static_cast<size_t>(half));
      float theta = float(pos[size_t(t)]);
      for (int i = 0; i < half; ++i) {
        cs[size_t(i)] = std::cos(c.fscale * theta);
        sn[size_t(i)] = std::sin(c.fscale * theta);
        theta *= theta_scale;
        const double thd = double(pos[size_t(t)]) * c.fscale * std::pow(double(c.base), -2.0 * i / c.n_rot);
        csd[size_t(i)] = std::cos(thd);
        snd[size_t(i)] = std::sin(thd);
      }
      for (int64_t h = 0; h < nh; ++h) {
        const float* r0 = x0.data() + (t * nh + h) * c.hd;
        const float* r = x.data() + (t * nh + h) * c.hd;
        const int64_t off = c.neox ? half : 1, step = c.neox ? 1 : 2;
        for (int i = 0; i < half; ++i) {
          const int64_t e = i * step;
          const float a = r0[e], b = r0[e + off];
          const float w0 = std::fma(a, cs[size_t(i)], -(b * sn[size_t(i)]));
          const float w1 = std::fma(a, sn[size_t(i)], b * cs[size_t(i)]);
          ASSERT_EQ(bits(r[e]), bits(w0)) << "hd " << c.hd << " neox " << c.neox << " pos " << pos[size_t(t)] << " i " << i;
          ASSERT_EQ(bits(r[e + off]), bits(w1)) << "hd " << c.hd << " neox " << c.neox << " pos " << pos[size_t(t)];
          // Accuracy vs double angles: the repeated float product drifts by ~i ulp of theta.
          const double tol = 1e-5 + 4e-7 * (1 + i) * std::fabs(double(pos[size_t(t)]) * c.fscale) * (std::fabs(a) + std::fabs(b));
          EXPECT_NEAR(r[e], a * csd[size_t(i)] - b * snd[size_t(i)], tol);
          EXPECT_NEAR(r[e + off], a * snd[size_t(i)] + b * csd[size_t(i)], tol);
        }
        for (int64_t d = c.n_rot; d < c.hd; ++d) {
          ASSERT_EQ(bits(r[d]), bits(r0[d])) << "pass-through dim " << d;
        }
      }
    }
  }
}

// ---- legacy one-chain integer dots (legacy_nc) -----------------------------------------------------

namespace {
// Integer weight values of one 32-element legacy block (ggml's layouts) and its fp16 d / m.
struct LegacyInfo { GgmlType t; size_t bytes; bool q81; };
void decode_block(GgmlType t, const uint8_t* b, int (&q)[32], float& d, float& m) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  d = h2f(h);
  m = 0;
  auto nib = [](const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; };
  switch (t) {
    case GgmlType::Q4_0: for (int i = 0; i < 32; ++i) q[i] = nib(b + 2, i) - 8; break;
    case GgmlType::IQ4_NL: for (int i = 0; i < 32; ++i) q[i] = tensor::kIQ4NLValues[nib(b + 2, i)]; break;
    case GgmlType::Q8_0: for (int i = 0; i < 32; ++i) q[i] = int8_t(b[2 + i]); break;
    case GgmlType::Q4_1:
      std::memcpy(&h, b + 2, 2);
      m = h2f(h);
      for (int i = 0; i < 32; ++i) q[i] = nib(b + 4, i);
      break;
    case GgmlType::Q5_0: case GgmlType::Q5_1: {
      const size_t o = t == GgmlType::Q5_0 ? 2 : 4;
      if (t == GgmlType::Q5_1) { std::memcpy(&h, b + 2, 2); m = h2f(h); }
      uint32_t qh;
      std::memcpy(&qh, b + o, 4);
      for (int i = 0; i < 32; ++i) q[i] = (nib(b + o + 4, i) | int((qh >> i) & 1) << 4) - (t == GgmlType::Q5_0 ? 16 : 0);
      break;
    }
    default: FAIL() << "not a legacy type";
  }
}

// ggml's one-chain order: per block, 8 int32 lanes of 4 consecutive products, acc[l] = fma(dw*dx,
// float(isum_l), acc[l]); hsum_float_8; + the offset chain corr = fma(m_w, s_x, corr) block by block.
void legacy_emul(GgmlType t, size_t wbytes, bool q81, int64_t k, const uint8_t* w, const uint8_t* act, double* ref,
                 double* mag, float* out) {
  const size_t ab = q81 ? 36 : 34, aq = q81 ? 4 : 2;
  float acc[8] = {}, corr = 0;
  double r = 0, mg = 0;
  for (int64_t i = 0; i < k / 32; ++i) {
    int q[32];
    float dw, mw;
    decode_block(t, w + size_t(i) * wbytes, q, dw, mw);
    const uint8_t* a = act + size_t(i) * ab;
    uint16_t h;
    std::memcpy(&h, a, 2);
    const float dx = h2f(h);
    std::memcpy(&h, a + 2, 2);
    const float sx = q81 ? h2f(h) : 0.f;
    const auto* qx = reinterpret_cast<const int8_t*>(a + aq);
    const float scale = dw * dx;
    for (int l = 0; l < 8; ++l) {
      int isum = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) {
        isum += q[e] * qx[e];
        mg += std::fabs(double(dw) * q[e] * double(dx) * qx[e]);
      }
      acc[l] = std::fma(scale, float(isum), acc[l]);
      r += double(dw) * double(dx) * isum;
    }
    if (q81) {
      corr = std::fma(mw, sx, corr);
      r += double(mw) * sx;
      mg += std::fabs(double(mw) * sx);
    }
  }
  *out = reduce8(acc) + corr;
  *ref = r;
  *mag = mg;
}
}  // namespace

TEST(GgmlOrder, LegacyOneChainDotsBitExact) {
  IsaGuard g;
  const LegacyInfo types[] = {{GgmlType::Q4_0, 18, false}, {GgmlType::Q4_1, 20, true}, {GgmlType::Q5_0, 22, false},
                              {GgmlType::Q5_1, 24, true},  {GgmlType::Q8_0, 34, false}, {GgmlType::IQ4_NL, 18, false}};
  int tested = 0;
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!set_isa(isa)) continue;
    const cpu::Table& T = cpu::table();
    for (const auto& ty : types) {
      const GgmlType at = cpu::act_type(ty.t);
      const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(at)];
      // AVX-512: Q4_0 / IQ4_NL matrices of 8k rows take ggml's repacked order (test_ggml_repack.cpp);
      // the one chain is their entry for other row counts.
      const cpu::VecDotQ8Fn not8 = T.vec_dot_q8_rows_not8[cpu::type_index(ty.t)];
      const cpu::VecDotQ8Fn vd = not8 ? not8 : T.vec_dot_q8[cpu::type_index(ty.t)];
      if (!qa || !vd) continue;
      ASSERT_EQ(ty.q81, at == GgmlType::Q8_1);
      std::mt19937 rng(uint32_t(int(ty.t) * 31 + int(isa)));
      std::uniform_int_distribution<int> byte(0, 255);
      std::uniform_real_distribution<float> ds(0.001f, 0.05f), dm(-0.1f, 0.1f);
      for (int64_t k : {32, 64, 96, 256, 352, 1024}) {
        // Weight row: random quant bytes, sane fp16 scales (and offsets for Q4_1 / Q5_1).
        std::vector<uint8_t> w(size_t(k / 32) * ty.bytes);
        for (auto& b : w) b = uint8_t(byte(rng));
        for (int64_t i = 0; i < k / 32; ++i) {
          const uint16_t d = f2h(ds(rng)), m = f2h(dm(rng));
          std::memcpy(&w[size_t(i) * ty.bytes], &d, 2);
          if (ty.q81) std::memcpy(&w[size_t(i) * ty.bytes + 2], &m, 2);
        }
        const int nc = 4;
        const ActColumns act(qa, at, k, nc,
                             [&](int c) { return randv(size_t(k), uint32_t(k * 10 + c + int(ty.t)), -2.f, 2.f); });
        const size_t ab = act.stride;  // stride between columns
        const uint8_t* a0 = act.col(0);
        for (int ncols = 1; ncols <= nc; ++ncols) {
          float out[cpu::kMaxCols];
          vd(k, w.data(), a0, ab, ncols, out);
          for (int c = 0; c < ncols; ++c) {
            double ref, mag;
            float want;
            legacy_emul(ty.t, ty.bytes, ty.q81, k, w.data(), a0 + size_t(c) * ab, &ref, &mag, &want);
            ASSERT_EQ(bits(out[c]), bits(want)) << gguf::type_name(ty.t) << " isa " << isa_name(isa) << " k " << k
                                                << " nc " << ncols << " c " << c << " got " << out[c] << " want " << want;
            ASSERT_LE(std::fabs(out[c] - ref), 1e-5 * mag) << gguf::type_name(ty.t) << " k " << k;
          }
        }
      }
      ++tested;
    }
  }
  if (tested == 0) GTEST_SKIP() << "no AVX2 / AVX-512: the integer legacy dots exist only in the x86 tables";
}

// The 8-row decode kernels of the one-chain types (Table::vec_dot_q8_r8 where vec_dot_q8 is the one
// chain: Q8_0 and Q4_1 on the AVX-512 table) against legacy_emul, row by row, bit for bit: 8 distinct
// rows at padded strides, several block counts, and the extreme operands (Q8_0 weights at -128 / 127,
// x at +-127) where the integer lanes are largest.
TEST(GgmlOrder, LegacyOneChainEightRowKernelBitExact) {
  KILN_REQUIRE_AVX512("the 8-row one-chain decode kernels are AVX-512 table entries");
  const LegacyInfo types[] = {{GgmlType::Q4_0, 18, false}, {GgmlType::Q4_1, 20, true}, {GgmlType::Q5_0, 22, false},
                              {GgmlType::Q5_1, 24, true},  {GgmlType::Q8_0, 34, false}, {GgmlType::IQ4_NL, 18, false}};
  const cpu::Table& T = cpu::table();
  int tested = 0;
  for (const auto& ty : types) {
    const int ti = cpu::type_index(ty.t);
    // only where the 8-row kernel stands for the one chain (Q4_0 / IQ4_NL's is the repacked order)
    if (!T.vec_dot_q8_r8[ti] || T.vec_dot_q8_rows_not8[ti]) continue;
    const GgmlType at = cpu::act_type(ty.t);
    const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(at)];
    ASSERT_NE(qa, nullptr);
    std::mt19937 rng(uint32_t(int(ty.t) * 977));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> ds(0.001f, 0.05f), dm(-0.1f, 0.1f);
    for (int64_t k : {32, 64, 96, 256, 352, 1024, 4096}) {
      for (int rep = 0; rep < 5; ++rep) {
        const size_t rb = size_t(k / 32) * ty.bytes, stride = rb + size_t(rep % 3) * 2;
        std::vector<uint8_t> w(stride * 8 + 64);
        for (int r = 0; r < 8; ++r) {
          uint8_t* row = w.data() + size_t(r) * stride;
          for (size_t e = 0; e < rb; ++e) row[e] = uint8_t(rep == 4 ? (r % 2 ? 0x80 : 0x7f) : byte(rng));
          for (int64_t i = 0; i < k / 32; ++i) {
            const uint16_t d = f2h(ds(rng)), m = f2h(dm(rng));
            std::memcpy(row + size_t(i) * ty.bytes, &d, 2);
            if (ty.q81) std::memcpy(row + size_t(i) * ty.bytes + 2, &m, 2);
          }
        }
        auto x = randv(size_t(k), uint32_t(k * 13 + rep + int(ty.t)), -2.f, 2.f);
        if (rep == 4)
          for (size_t e = 0; e < x.size(); ++e) x[e] = (e / 8) % 2 ? 2.f : -2.f;
        AlignedWs col(cpu::act_bytes(at, k));
        qa(x.data(), k, col.p);
        float out[8];
        T.vec_dot_q8_r8[ti](k, w.data(), stride, col.p, out);
        for (int r = 0; r < 8; ++r) {
          double ref, mag;
          float want;
          legacy_emul(ty.t, ty.bytes, ty.q81, k, w.data() + size_t(r) * stride, static_cast<uint8_t*>(col.p), &ref,
                      &mag, &want);
          ASSERT_EQ(bits(out[r]), bits(want)) << gguf::type_name(ty.t) << " k " << k << " rep " << rep << " row " << r
                                              << " got " << out[r] << " want " << want;
        }
      }
    }
    ++tested;
  }
  EXPECT_GE(tested, 2);
}

// ---- flash attention (llama.cpp's CPU flash_attn_ext orders) --------------------------------------

namespace {
// One cache of n_kv positions x n_head_kv heads of type t, filled through kv_store.
struct FaCache {
  std::vector<uint8_t> data;
  KvView view;
};
FaCache fa_cache(GgmlType t, int64_t D, int64_t Hkv, int64_t n_kv, std::mt19937& rng) {
  FaCache c;
  const size_t rs = tensor::row_size(t, D), pos_stride = rs * size_t(Hkv) + 16;
  c.data.assign(pos_stride * size_t(n_kv), 0);
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<float> x(static_cast<size_t>(D * Hkv * n_kv));
  for (auto& v : x) v = d(rng);
  std::vector<int32_t> pos(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < n_kv; ++i) pos[size_t(i)] = int32_t(i);
  kv_store(t, crows3(x.data(), D, Hkv, n_kv), pos.data(), c.data.data(), pos_stride, rs);
  c.view = {t, c.data.data(), pos_stride, rs, n_kv};
  return c;
}
const uint8_t* fa_row(const KvView& v, int64_t j, int64_t hk) {
  return static_cast<const uint8_t*>(v.data) + size_t(j) * v.pos_stride + size_t(hk) * v.head_stride;
}
std::vector<float> fa_row_f32(const KvView& v, int64_t j, int64_t hk, int64_t D) {
  std::vector<float> r(static_cast<size_t>(D));
  tensor::dequantize_row(v.type, fa_row(v, j, hk), r.data(), D);
  return r;
}

// ggml_compute_forward_flash_attn_ext_tiled for one query row (F16/F32 K and V): 64-key tiles, each
// score one FMA chain over d, ggml's soft_max per tile, acc += p * v one FMA per key.
void fa_tiled_emul(const float* q, const KvView& kv, const KvView& vv, int64_t hk, int64_t n, int64_t D, float scale,
                   float* out) {
  float M = -INFINITY, S = 0;
  std::vector<float> acc(static_cast<size_t>(D), 0.f);
  for (int64_t j0 = 0; j0 < n; j0 += 64) {
    float s[64], p[64];
    for (int jj = 0; jj < 64; ++jj) {
      if (j0 + jj >= n) { s[jj] = -INFINITY; continue; }
      const auto k = fa_row_f32(kv, j0 + jj, hk, D);
      float a = 0;
      for (int64_t d = 0; d < D; ++d) a = std::fma(k[size_t(d)], q[d], a);
      s[jj] = a * scale;
    }
    float tmax = -INFINITY;
    for (float v : s) tmax = std::max(tmax, v);
    const float mnew = std::max(M, tmax);
    if (mnew > M) {
      const float ms = std::exp(M - mnew);
      for (auto& a : acc) a *= ms;
      S *= ms;
    }
    M = mnew;
    S = float(double(S) + softmax_exp_emul(s, mnew, p, 64));
    for (int jj = 0; jj < 64 && j0 + jj < n; ++jj) {
      const auto v = fa_row_f32(vv, j0 + jj, hk, D);
      for (int64_t d = 0; d < D; ++d) acc[size_t(d)] = std::fma(p[jj], v[size_t(d)], acc[size_t(d)]);
    }
  }
  const float inv = 1.0f / S;
  for (int64_t d = 0; d < D; ++d) out[d] = acc[size_t(d)] * inv;
}

// ggml_compute_forward_flash_attn_ext_f16_one_chunk for one query row (quantized K): q in K's dot
// type, online softmax key by key, F16 accumulator for F16 V. The dots themselves are the table's
// one-chain entries (checked on their own by LegacyOneChainDotsBitExact / DotF16AccuracyAndBitExact).
void fa_per_key_emul(const cpu::Table& T, const float* q, const KvView& kv, const KvView& vv, int64_t hk, int64_t n,
                     int64_t D, float scale, float* out) {
  std::vector<uint8_t> qq(tensor::row_size(GgmlType::Q8_0, D) + size_t(2 * D));
  std::vector<uint16_t> qh(static_cast<size_t>(D));
  if (kv.type == GgmlType::F16)
    for (int64_t i = 0; i < D; ++i) qh[size_t(i)] = f2h(q[i]);
  else
    T.quantize_act[cpu::type_index(GgmlType::Q8_0)](q, D, qq.data());
  float M = -INFINITY, S = 0;
  std::vector<float> acc(static_cast<size_t>(D), 0.f);
  std::vector<uint16_t> acc16(static_cast<size_t>(D), 0);
  for (int64_t j = 0; j < n; ++j) {
    float s;
    if (kv.type == GgmlType::F16)
      s = dot_f16_emul(reinterpret_cast<const uint16_t*>(fa_row(kv, j, hk)), qh.data(), D, false);
    else  // ggml_vec_dot's one chain (the cache is not repacked): rows_not8 where the table has one
      (T.vec_dot_q8_rows_not8[cpu::type_index(kv.type)] ? T.vec_dot_q8_rows_not8[cpu::type_index(kv.type)]
                                                        : T.vec_dot_q8[cpu::type_index(kv.type)])(D, fa_row(kv, j, hk),
                                                                                                 qq.data(), 0, 1, &s);
    s *= scale;
    float ms = 1, vs = 1;
    if (s > M) {
      ms = std::exp(M - s);
      M = s;
      for (int64_t d = 0; d < D; ++d) {
        acc[size_t(d)] *= ms;
        acc16[size_t(d)] = f2h(h2f(acc16[size_t(d)]) * ms);
      }
    } else {
      vs = std::exp(s - M);
    }
    if (vv.type == GgmlType::F16) {
      const auto* v = reinterpret_cast<const uint16_t*>(fa_row(vv, j, hk));
      for (int64_t d = 0; d < D; ++d) acc16[size_t(d)] = f2h(std::fma(h2f(v[d]), vs, h2f(acc16[size_t(d)])));
    } else {
      const auto v = fa_row_f32(vv, j, hk, D);
      for (int64_t d = 0; d < D; ++d) acc[size_t(d)] = std::fma(v[size_t(d)], vs, acc[size_t(d)]);
    }
    S = std::fma(S, ms, vs);
  }
  const float inv = 1.0f / S;
  for (int64_t d = 0; d < D; ++d) out[d] = (vv.type == GgmlType::F16 ? h2f(acc16[size_t(d)]) : acc[size_t(d)]) * inv;
}

// Softmax attention of one query row in double, on the cache's dequantized rows (q optionally
// rounded first, as the per-key order does).
void fa_double(const float* q, const KvView& kv, const KvView& vv, int64_t hk, int64_t n, int64_t D, float scale,
               double* out) {
  std::vector<double> s(static_cast<size_t>(n));
  double mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const auto k = fa_row_f32(kv, j, hk, D);
    double a = 0;
    for (int64_t d = 0; d < D; ++d) a += double(k[size_t(d)]) * q[d];
    s[size_t(j)] = a * scale;
    mx = std::max(mx, s[size_t(j)]);
  }
  double sum = 0;
  for (auto& v : s) sum += (v = std::exp(v - mx));
  for (int64_t d = 0; d < D; ++d) out[d] = 0;
  for (int64_t j = 0; j < n; ++j) {
    const auto v = fa_row_f32(vv, j, hk, D);
    for (int64_t d = 0; d < D; ++d) out[d] += s[size_t(j)] / sum * v[size_t(d)];
  }
}
}  // namespace

TEST(GgmlOrder, FlashAttentionOrdersBitExact) {
  Avx512Table T;
  REQUIRE_AVX512(T);
  ASSERT_NE(T.t->ggml_fa_scores, nullptr);
  ThreadPool pool(2);
  std::mt19937 rng(11);
  struct Case { GgmlType k, v; int64_t D, Hq, Hkv, n_kv; std::vector<int32_t> pos; };
  const Case cases[] = {
      {GgmlType::F16, GgmlType::F16, 64, 4, 2, 200, {0, 1, 63, 64, 65, 130, 199}},  // tiled, partial tiles
      {GgmlType::F32, GgmlType::F32, 128, 2, 1, 100, {0, 99}},                      // tiled, F32 cache
      {GgmlType::F16, GgmlType::F16, 32, 24, 2, 256, {255, 3}},                      // tiled, 12 heads > 8-head group
      {GgmlType::Q8_0, GgmlType::Q8_0, 64, 4, 2, 150, {0, 17, 149}},                 // per key, F32 accumulator
      {GgmlType::Q4_0, GgmlType::Q4_0, 128, 2, 2, 90, {5, 89}},
      {GgmlType::Q8_0, GgmlType::F16, 64, 4, 1, 120, {0, 50, 119}},                  // per key, F16 accumulator
      {GgmlType::F16, GgmlType::Q4_0, 64, 2, 1, 70, {69}},                           // per key, F16 keys
      {GgmlType::F16, GgmlType::Q8_0, 512, 2, 1, 40, {39}},                          // head_dim 512 (the limit)
      {GgmlType::F16, GgmlType::F16, 512, 2, 1, 70, {69}},
  };
  for (const auto& c : cases) {
    const FaCache kc = fa_cache(c.k, c.D, c.Hkv, c.n_kv, rng), vc = fa_cache(c.v, c.D, c.Hkv, c.n_kv, rng);
    const int64_t nt = int64_t(c.pos.size()), group = c.Hq / c.Hkv;
    std::uniform_real_distribution<float> dq(-2.f, 2.f);
    std::vector<float> q(size_t(c.D * c.Hq * nt));
    for (auto& v : q) v = dq(rng);
    const AttnParams p{c.D, c.Hq, c.Hkv, 1.f / std::sqrt(float(c.D))};
    std::vector<float> got(q.size(), NAN);
    std::vector<uint8_t> ws(attention_workspace(p, pool.size()));
    attention(crows3(q.data(), c.D, c.Hq, nt), c.pos.data(), kc.view, vc.view, p, rows3(got.data(), c.D, c.Hq, nt),
              ws.data(), pool);
    const bool tiled = c.k == c.v && (c.k == GgmlType::F16 || c.k == GgmlType::F32);
    double err = 0, ref2 = 0;
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t h = 0; h < c.Hq; ++h) {
        const float* qr = q.data() + (t * c.Hq + h) * c.D;
        const int64_t n = c.pos[size_t(t)] + 1;
        std::vector<float> want(size_t(c.D));
        if (tiled) fa_tiled_emul(qr, kc.view, vc.view, h / group, n, c.D, p.scale, want.data());
        else fa_per_key_emul(*T.t, qr, kc.view, vc.view, h / group, n, c.D, p.scale, want.data());
        std::vector<double> exact(size_t(c.D));
        fa_double(qr, kc.view, vc.view, h / group, n, c.D, p.scale, exact.data());
        for (int64_t d = 0; d < c.D; ++d) {
          const float g = got[size_t((t * c.Hq + h) * c.D + d)];
          ASSERT_EQ(bits(g), bits(want[size_t(d)])) << gguf::type_name(c.k) << "/" << gguf::type_name(c.v) << " D " << c.D << " t "
                                                    << t << " h " << h << " d " << d;
          err += (g - exact[size_t(d)]) * (g - exact[size_t(d)]);
          ref2 += exact[size_t(d)] * exact[size_t(d)];
        }
      }
    // Accuracy against the exact softmax on the same cache rows (q unrounded): F32 paths at float
    // noise; q rounded to Q8_0 / F16 and an F16 accumulator cost ~1e-5 / ~1e-6 relative energy.
    const double tol = tiled ? 1e-10 : c.v == GgmlType::F16 || c.k != GgmlType::F16 ? 3e-5 : 1e-6;
    EXPECT_LE(err / ref2, tol) << gguf::type_name(c.k) << "/" << gguf::type_name(c.v) << " D " << c.D;
  }
}

// ---- Walsh-Hadamard rotation ------------------------------------------------------------------------

namespace {
// H_2m [a; b] = [H_m a + H_m b; H_m a - H_m b], on x already scaled by 1/sqrt(n).
void fwht_recursive(float* x, int64_t n) {
  if (n == 1) return;
  const int64_t h = n / 2;
  fwht_recursive(x, h);
  fwht_recursive(x + h, h);
  for (int64_t i = 0; i < h; ++i) {
    const float u = x[i], v = x[i + h];
    x[i] = u + v;
    x[i + h] = u - v;
  }
}
}  // namespace

TEST(GgmlOrder, HadamardBitExactOrthonormalInvolution) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3.f, 3.f);
  for (int64_t n : {64, 128, 256}) {
    const int64_t ne0 = 2 * n, n1 = 3, n2 = 2, s1 = ne0 + 8, s2 = 3 * s1 + 4;  // strided rows, 2 chunks each
    std::vector<float> x(static_cast<size_t>(s2 * n2)), y;
    for (auto& v : x) v = d(rng);
    y = x;
    hadamard(Rows{y.data(), ne0, n1, n2, s1, s2}, n, pool);
    // Sylvester H_n in double: H[i][j] = (-1)^popcount(i & j) / sqrt(n).
    double err = 0, ref2 = 0;
    for (int64_t t = 0; t < n2; ++t)
      for (int64_t h = 0; h < n1; ++h)
        for (int64_t c = 0; c < ne0; c += n) {
          const float* xr = x.data() + t * s2 + h * s1 + c;
          const float* yr = y.data() + t * s2 + h * s1 + c;
          std::vector<float> e(xr, xr + n);
          const float sc = 1.0f / std::sqrt(float(n));
          for (auto& v : e) v *= sc;
          fwht_recursive(e.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(bits(yr[i]), bits(e[size_t(i)])) << "n " << n << " i " << i;
            double r = 0;
            for (int64_t j = 0; j < n; ++j) r += (__builtin_popcountll(uint64_t(i & j)) & 1 ? -1.0 : 1.0) * xr[j];
            r /= std::sqrt(double(n));
            err += (yr[i] - r) * (yr[i] - r);
            ref2 += r * r;
          }
        }
    EXPECT_LE(err / ref2, 1e-12) << "n " << n;
    // Padding between rows is untouched; applying the rotation twice gives the input back.
    EXPECT_EQ(bits(y[size_t(ne0)]), bits(x[size_t(ne0)]));
    hadamard(Rows{y.data(), ne0, n1, n2, s1, s2}, n, pool);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5f * (1 + std::fabs(x[i])));
  }
}
