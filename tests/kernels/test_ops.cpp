// Dispatched non-matmul ops (every ISA this CPU has) against the scalar references in
// kernels/ref, plus the chunked gated-delta prefill against the token-by-token recurrence.
// Tolerances are NMSE (sum (a-b)^2 / sum b^2): float-only ops differ from the double-accumulating
// references by rounding only, so 1e-9 (values are ~1e-14 in practice).
#include <algorithm>
#include <array>
#include <cstring>

#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {
constexpr double kTol = 1e-9;
}

TEST(Ops, NormsEveryIsa) {
  IsaGuard g;
  ThreadPool pool(3);
  // [ne0, n1, n2] with padded strides: 5 heads of 96 (stride 100), 7 tokens (stride 520).
  const int64_t ne0 = 96, n1 = 5, n2 = 7, s1 = 100, s2 = 520;
  const auto x = randv(size_t(s2 * n2), 1, -3, 3);
  const auto w = randv(size_t(ne0), 2);
  CRows xr{x.data(), ne0, n1, n2, s1, s2};
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    for (int which = 0; which < 3; ++which) {
      std::vector<float> want(x.size(), 0.f), got(x.size(), 0.f);
      Rows wr{want.data(), ne0, n1, n2, s1, s2}, gr{got.data(), ne0, n1, n2, s1, s2};
      if (which == 0) { ref::rms_norm(xr, w.data(), wr, 1e-6f); rms_norm(xr, w.data(), gr, 1e-6f, pool); }
      if (which == 1) { ref::rms_norm(xr, nullptr, wr, 1e-5f); rms_norm(xr, nullptr, gr, 1e-5f, pool); }
      if (which == 2) { ref::l2_norm(xr, wr, 1e-6f); l2_norm(xr, gr, 1e-6f, pool); }
      EXPECT_LE(nmse(got, want), kTol) << "op " << which << " " << isa_name(isa);
    }
  }
  // In place, and l2_norm's eps keeps an all-zero row finite: it stays zero.
  std::vector<float> z(64, 0.f);
  l2_norm(crows3(z.data(), 64), rows3(z.data(), 64), 1e-6f, pool);
  for (float v : z) EXPECT_EQ(v, 0.f);
  std::vector<float> a = randv(256, 3), b = a;
  rms_norm(crows3(a.data(), 64, 4), w.data(), rows3(a.data(), 64, 4), 1e-6f, pool);
  std::vector<float> want(256);
  ref::rms_norm(crows3(b.data(), 64, 4), w.data(), rows3(want.data(), 64, 4), 1e-6f);
  EXPECT_LE(nmse(a, want), kTol);
}

TEST(Ops, RopeNeoxNormalPartial) {
  IsaGuard g;
  ThreadPool pool(2);
  const int64_t D = 128, H = 3, T = 9;
  const int32_t pos[T] = {0, 1, 2, 17, 100, 1000, 4095, 32767, 5};
  for (bool neox : {true, false})
    for (int n_rot : {128, 64, 32})
      for (float base : {10000.f, 1e6f})
        for (float fs : {1.f, 0.25f}) {
          RopeParams p{n_rot, neox, base, fs};
          const auto x = randv(size_t(D * H * T), 7);
          std::vector<float> want = x, got = x;
          ref::rope(rows3(want.data(), D, H, T), pos, p);
          rope(rows3(got.data(), D, H, T), pos, p, pool);
          // The reference works in double; the kernel follows ggml (theta by repeated float
          // multiplication), whose angle error grows with the position: ~1e-7 NMSE at 32767.
          EXPECT_LE(nmse(got, want), 1e-6) << "neox " << neox << " n_rot " << n_rot << " base " << base;
          // dims >= n_rot pass through untouched; position 0 is the identity.
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < D; ++i) {
                const size_t o = size_t((t * H + h) * D + i);
                if (i >= n_rot || pos[t] == 0) { ASSERT_EQ(got[o], x[o]); }
              }
        }
  // An independent check of the pairing for NeoX: pair (0, n_rot/2) rotates by pos * scale.
  std::vector<float> v(8, 0.f);
  v[0] = 1.f;
  const int32_t p1[1] = {1};
  rope(rows3(v.data(), 8), p1, RopeParams{4, true, 10000.f, 1.f}, pool);
  EXPECT_NEAR(v[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(v[2], std::sin(1.0), 1e-6);
  std::fill(v.begin(), v.end(), 0.f);
  v[0] = 1.f;
  rope(rows3(v.data(), 8), p1, RopeParams{4, false, 10000.f, 1.f}, pool);
  EXPECT_NEAR(v[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(v[1], std::sin(1.0), 1e-6);
}

// rope_multi: Qwen3.5's IMROPE (text sections interleaved t/h/w) and the Qwen-VL ViT's vision mode
// against the double reference; with every stream at one position IMROPE is rope() bit for bit.
TEST(Ops, RopeMulti) {
  ThreadPool pool(2);
  const int64_t H = 3, T = 7;
  std::vector<int32_t> pos(size_t(4 * T));
  for (int64_t i = 0; i < 4 * T; ++i) pos[size_t(i)] = int32_t((i * 37 + 5) % 300);
  struct Case { RopeParams::Multi m; int64_t D; int n_rot; int s0, s1, s2, s3; };
  const Case cases[] = {{RopeParams::Multi::Imrope, 256, 64, 11, 11, 10, 0}, {RopeParams::Multi::Imrope, 128, 128, 24, 20, 20, 0},
                        {RopeParams::Multi::Vision, 72, 72, 18, 18, 18, 18}, {RopeParams::Multi::Vision, 64, 64, 16, 16, 16, 16}};
  for (const Case& c : cases) {
    RopeParams p{c.n_rot, true, 10000.f, 1.f};
    p.multi = c.m;
    p.sections[0] = c.s0, p.sections[1] = c.s1, p.sections[2] = c.s2, p.sections[3] = c.s3;
    const auto x = randv(size_t(c.D * H * T), 9);
    std::vector<float> want = x, got = x;
    ref::rope_multi(rows3(want.data(), c.D, H, T), pos.data(), p);
    rope_multi(rows3(got.data(), c.D, H, T), pos.data(), p, pool);
    EXPECT_LE(nmse(got, want), 1e-9) << "multi " << int(c.m) << " D " << c.D;
    EXPECT_GT(nmse(got, x), 1e-3) << "rotated";
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = c.n_rot; i < c.D; ++i) ASSERT_EQ(got[size_t(t * H * c.D + i)], x[size_t(t * H * c.D + i)]);
  }
  // Vision: pair 0 uses stream 0 (y), the first pair of section 1 uses stream 1 (x) at exponent 0.
  {
    RopeParams p{8, true, 10000.f, 1.f};
    p.multi = RopeParams::Multi::Vision;
    p.sections[0] = p.sections[1] = p.sections[2] = p.sections[3] = 2;
    std::vector<float> v(8, 0.f);
    v[0] = 1.f, v[2] = 1.f;  // pairs 0 (0,4) and 2 (2,6)
    const int32_t ps[4] = {1, 2, 0, 0};
    rope_multi(rows3(v.data(), 8), ps, p, pool);
    EXPECT_NEAR(v[0], std::cos(1.0), 1e-6);
    EXPECT_NEAR(v[4], std::sin(1.0), 1e-6);
    EXPECT_NEAR(v[2], std::cos(2.0), 1e-6);
    EXPECT_NEAR(v[6], std::sin(2.0), 1e-6);
  }
  // IMROPE with t = h = w = e is NeoX rope, bit for bit.
  {
    RopeParams p{64, true, 1e7f, 1.f};
    p.multi = RopeParams::Multi::Imrope;
    p.sections[0] = 11, p.sections[1] = 11, p.sections[2] = 10;
    std::vector<int32_t> same(size_t(4 * T), 0), one(size_t(T), 0);
    for (int64_t t = 0; t < T; ++t) {
      one[size_t(t)] = int32_t(t * 1000 + 3);
      for (int s = 0; s < 4; ++s) same[size_t(s * T + t)] = one[size_t(t)];
    }
    const auto x = randv(size_t(256 * H * T), 10);
    std::vector<float> a = x, b = x;
    rope_multi(rows3(a.data(), 256, H, T), same.data(), p, pool);
    rope(rows3(b.data(), 256, H, T), one.data(), RopeParams{64, true, 1e7f, 1.f}, pool);
    EXPECT_EQ(a, b);
  }
}

TEST(Ops, Gelu) {
  const auto x = randv(4099, 13, -9, 9);
  std::vector<float> a(x.size()), b(x.size());
  gelu(x.data(), a.data(), int64_t(x.size()));
  ref::gelu(x.data(), b.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-6f * std::fabs(b[i]) + 1e-6f) << x[i];
  gelu_erf(x.data(), a.data(), int64_t(x.size()));
  ref::gelu_erf(x.data(), b.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-6f * std::fabs(b[i]) + 1e-6f) << x[i];
  // Known values: gelu_erf(1) = 0.8413447, the tanh form 0.8411920.
  const float one = 1.f;
  float y = 0;
  gelu_erf(&one, &y, 1);
  EXPECT_NEAR(y, 0.8413447f, 1e-6f);
  gelu(&one, &y, 1);
  EXPECT_NEAR(y, 0.8411920f, 1e-6f);
}

TEST(Ops, SoftmaxAndElementwise) {
  ThreadPool pool(2);
  const int64_t n = 1031;
  const auto x = randv(size_t(n * 3), 11, -8, 8), y2 = randv(size_t(n * 3), 12, -8, 8);
  std::vector<float> want = x, got = x;
  ref::softmax(rows3(want.data(), n, 3), 0.7f);
  softmax(rows3(got.data(), n, 3), 0.7f, pool);
  EXPECT_LE(nmse(got, want), kTol);
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += got[size_t(r * n + i)];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
  using Un = void (*)(const float*, float*, int64_t);
  using Bin = void (*)(const float*, const float*, float*, int64_t);
  // Inputs include the ends of the float exp range and beyond (the SIMD exp clamps there).
  std::vector<float> xs = x, ys = y2;
  for (float v : {0.f, -0.f, 1e-8f, -1e-8f, 20.f, -20.f, 87.f, -87.f, 88.7f, -88.7f, 89.f, -89.f, 100.f, -100.f, 1e4f, -1e4f}) {
    xs.push_back(v);
    ys.push_back(-v * 0.5f);
  }
  const int64_t nn = int64_t(xs.size());
  // Elementwise bound: relative 2e-6 (the SIMD exp is accurate to ~1e-7) or absolute 1e-30.
  // softplus is ggml's logf(1 + expf(x)): rounding 1 + e^x costs up to 2^-24 absolute (1.2e-7 bound).
  auto close = [](const std::vector<float>& got, const std::vector<float>& want, float abs_tol = 1e-30f) {
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 2e-6f * std::fabs(want[i]) + abs_tol)) return ::testing::AssertionFailure() << "i " << i << " got " << got[i] << " want " << want[i];
    return ::testing::AssertionSuccess();
  };
  IsaGuard guard;
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    const std::pair<Un, Un> un[] = {{silu, ref::silu}, {sigmoid, ref::sigmoid}, {softplus, ref::softplus}};
    for (auto [f, r] : un) {
      std::vector<float> a(xs.size()), b(xs.size());
      f(xs.data(), a.data(), nn);
      r(xs.data(), b.data(), nn);
      EXPECT_TRUE(close(a, b, f == softplus ? 1.2e-7f : 1e-30f)) << isa_name(isa);
    }
    const std::pair<Bin, Bin> bin[] = {{swiglu, ref::swiglu}, {sigmoid_mul, ref::sigmoid_mul}, {add, ref::add}, {mul, ref::mul}};
    for (auto [f, r] : bin) {
      std::vector<float> a = xs, b(xs.size());
      f(a.data(), ys.data(), a.data(), nn);  // in place
      r(xs.data(), ys.data(), b.data(), nn);
      EXPECT_TRUE(close(a, b)) << isa_name(isa);
    }
  }
  std::vector<float> a(x.size()), b(x.size());
  scale(x.data(), -1.5f, a.data(), int64_t(x.size()));
  ref::scale(x.data(), -1.5f, b.data(), int64_t(x.size()));
  EXPECT_EQ(a, b);
  // silu(x) = x * sigmoid(x), independently.
  EXPECT_NEAR(a.size(), b.size(), 0);
  float s1;
  const float one = 1.f;
  silu(&one, &s1, 1);
  EXPECT_NEAR(s1, 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
}

TEST(Ops, TopkRouting) {
  const int64_t E = 64, T = 5;
  const auto l = randv(size_t(E * T), 21, -4, 4);
  for (int k : {1, 8})
    for (bool renorm : {false, true}) {
      std::vector<int32_t> ia(size_t(k * T)), ib(size_t(k * T));
      std::vector<float> wa(size_t(k * T)), wb(size_t(k * T));
      topk_route(l.data(), E, T, k, renorm, 2.5f, ia.data(), wa.data());
      ref::topk_route(l.data(), E, T, k, renorm, 2.5f, ib.data(), wb.data());
      EXPECT_EQ(ia, ib);
      for (size_t i = 0; i < wa.size(); ++i) EXPECT_NEAR(wa[i], wb[i], 1e-6);
      if (renorm)
        for (int64_t t = 0; t < T; ++t) {
          double s = 0;
          for (int i = 0; i < k; ++i) s += wa[size_t(t * k + i)];
          EXPECT_NEAR(s, 2.5, 1e-5);
        }
    }
  // Ties: lower expert id first.
  const float tie[4] = {1.f, 3.f, 3.f, 0.f};
  int32_t id[2];
  float w[2];
  topk_route(tie, 4, 1, 2, true, 1.f, id, w);
  EXPECT_EQ(id[0], 1);
  EXPECT_EQ(id[1], 2);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
}

// k = 1 over a vocabulary-sized row (> 4096 entries: the MTP drafter's argmax): the first maximum
// and its softmax probability.
TEST(Ops, TopkRouteArgmaxOverAVocabulary) {
  const int64_t V = 50000, T = 3;
  auto l = randv(size_t(V * T), 22, -6, 6);
  l[size_t(V + 777)] = 9.f, l[size_t(V + 901)] = 9.f;  // row 1: a tie, the lower id wins
  l[size_t(2 * V + 4242)] = 20.f;                       // row 2: one dominant logit (p near 1)
  std::vector<int32_t> id(static_cast<size_t>(T));
  std::vector<float> w(static_cast<size_t>(T));
  topk_route(l.data(), V, T, 1, false, 1.f, id.data(), w.data());
  for (int64_t t = 0; t < T; ++t) {
    const float* r = l.data() + t * V;
    const int64_t best = std::max_element(r, r + V) - r;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(r[v]) - double(r[best]));
    EXPECT_EQ(id[size_t(t)], int32_t(best)) << t;
    EXPECT_NEAR(w[size_t(t)], 1.0 / sum, 1e-6 / sum) << t;  // the vector exp in float
  }
  EXPECT_EQ(id[1], 777);
}

// top_logits against the reference's stable sort: ties (lower id first), -inf, NaN (last), rows
// longer than a chunk, k = 1 and k = V.
TEST(Ops, TopLogitsMatchesReference) {
  struct Case {
    int64_t V, n;
    int k;
  };
  for (const Case c : {Case{50000, 3, 64}, Case{9000, 2, 1}, Case{300, 4, 300}, Case{5, 1, 3}}) {
    auto l = randv(size_t(c.V * c.n), 31, -5, 5);
    for (int64_t r = 0; r < c.n; ++r) {
      float* row = l.data() + r * c.V;
      for (int64_t i = 0; i < c.V; i += 7) row[i] = float(int(row[i]));  // many equal values
      row[c.V / 2] = row[c.V - 1] = 8.f;                                  // a tie at the top
      if (c.V > 10) row[1] = -INFINITY, row[2] = NAN;
    }
    std::vector<int32_t> ia(size_t(c.k * c.n)), ib(ia.size());
    std::vector<float> va(ia.size()), vb(ia.size());
    top_logits(l.data(), c.V, c.n, c.k, ia.data(), va.data());
    ref::top_logits(l.data(), c.V, c.n, c.k, ib.data(), vb.data());
    EXPECT_EQ(ia, ib) << c.V << " " << c.k;
    for (size_t i = 0; i < va.size(); ++i)
      EXPECT_TRUE(va[i] == vb[i] || (std::isnan(va[i]) && std::isnan(vb[i]))) << i;
    EXPECT_EQ(ia[0], int32_t(c.V / 2)) << c.V;
    if (c.k == c.V && c.V > 10) EXPECT_EQ(ia.back(), 2);  // the NaN last
  }
}

// The skipped blocks (32 entries whose maximum is not above the k-th best so far): a NaN first in a
// block must not hide the larger value after it, at either end of a row.
TEST(Ops, TopLogitsNaNDoesNotHideALargerValue) {
  const int64_t V = 4096;
  std::vector<float> l(size_t(V), 0.f);
  for (int64_t i = 0; i < V; ++i) l[size_t(i)] = float(i % 7) * 0.01f;
  l[640] = NAN, l[641] = 5.f;          // the row's maximum right after a NaN, mid-row
  l[V - 32] = NAN, l[V - 31] = 4.f;    // and in the last block
  int32_t id[2];
  float v[2];
  top_logits(l.data(), V, 1, 2, id, v);
  EXPECT_EQ(id[0], 641);
  EXPECT_EQ(id[1], int32_t(V - 31));
}

namespace {
struct Cache {
  std::vector<uint8_t> k, v;
  KvView kv, vv;
};
Cache make_cache(GgmlType t, int64_t D, int64_t Hkv, int64_t n_kv, uint32_t seed) {
  Cache c;
  const size_t rs = tensor::row_size(t, D);
  const size_t head_stride = rs, pos_stride = rs * size_t(Hkv) + 8;  // padded per position
  c.k.assign(pos_stride * size_t(n_kv), 0);
  c.v.assign(pos_stride * size_t(n_kv), 0);
  const auto kx = randv(size_t(D * Hkv * n_kv), seed), vx = randv(size_t(D * Hkv * n_kv), seed + 1);
  std::vector<int32_t> pos(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < n_kv; ++i) pos[size_t(i)] = int32_t(i);
  kv_store(t, crows3(kx.data(), D, Hkv, n_kv), pos.data(), c.k.data(), pos_stride, head_stride);
  kv_store(t, crows3(vx.data(), D, Hkv, n_kv), pos.data(), c.v.data(), pos_stride, head_stride);
  c.kv = {t, c.k.data(), pos_stride, head_stride, n_kv};
  c.vv = {t, c.v.data(), pos_stride, head_stride, n_kv};
  return c;
}
}  // namespace

TEST(Ops, KvStoreMatchesReference) {
  const int64_t D = 64, H = 2, T = 3;
  const auto x = randv(size_t(D * H * T), 4);
  const int32_t pos[T] = {2, 0, 1};
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    const size_t rs = tensor::row_size(t, D);
    std::vector<uint8_t> a(rs * H * T), b(rs * H * T);
    kv_store(t, crows3(x.data(), D, H, T), pos, a.data(), rs * H, rs);
    ref::kv_store(t, crows3(x.data(), D, H, T), pos, b.data(), rs * H, rs);
    // Q8_0 rows are written by the table's activation quantizer (ggml's SIMD quantize_row_q8_0).
    const cpu::QuantizeActFn q8 = cpu::table().quantize_act[cpu::type_index(GgmlType::Q8_0)];
    if (t == GgmlType::Q8_0 && q8)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t h = 0; h < H; ++h) q8(x.data() + (i * H + h) * D, D, b.data() + size_t(pos[i] * H + h) * rs);
    EXPECT_EQ(a, b);
    // Round trip through dequantization is close to the input (independent check of the layout).
    std::vector<float> back(static_cast<size_t>(D));
    tensor::dequantize_row(t, a.data() + rs * H * 2 + rs, back.data(), D);  // pos 2, head 1 = token 0 head 1
    EXPECT_LT(nmse(back.data(), x.data() + D, size_t(D)), t == GgmlType::Q4_0 ? 1e-2 : 1e-4);
  }
}

TEST(Ops, AttentionEveryCacheTypeEveryIsa) {
  IsaGuard g;
  ThreadPool pool(3);
  struct Case { int64_t D, Hq, Hkv, n_kv; std::vector<int32_t> pos; };
  std::vector<int32_t> prefill;
  for (int i = 0; i < 37; ++i) prefill.push_back(63 + i);  // continuing a prompt: 37 new tokens
  const Case cases[] = {
      {64, 8, 2, 100, {99}},          // decode, GQA 4
      {128, 4, 4, 70, {0}},           // first token: attends to itself only
      {64, 8, 2, 100, prefill},       // many tokens
      {32, 24, 2, 200, {199, 150}},   // group of 12 > the 8-head tile
      {64, 2, 1, 1000, {999}},        // one work item: keys split across threads (flash-decoding)
      {64, 2, 1, 300, {130}},         // split with a final partial tile, keys past pos unused
  };
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0})
    for (const auto& c : cases) {
      const Cache cache = make_cache(t, c.D, c.Hkv, c.n_kv, 31);
      const int64_t T = int64_t(c.pos.size());
      const auto q = randv(size_t(c.D * c.Hq * T), 41, -2, 2);
      AttnParams p{c.D, c.Hq, c.Hkv, 1.f / std::sqrt(float(c.D))};
      std::vector<float> want(q.size()), got(q.size());
      std::vector<uint8_t> ws(attention_workspace(p, pool.size()));
      ref::attention(crows3(q.data(), c.D, c.Hq, T), c.pos.data(), cache.kv, cache.vv, p, rows3(want.data(), c.D, c.Hq, T));
      // Tables with llama.cpp's flash-attention order round q to Q8_0 for quantized keys (as ggml
      // does): their reference sees that rounded q.
      std::vector<float> q8(q.size()), want8(q.size());
      const bool qk = t == GgmlType::Q8_0 || t == GgmlType::Q4_0;
      for (CpuIsa isa : isas()) {
        ASSERT_TRUE(set_isa(isa));
        const cpu::Table& tab = cpu::table();
        const bool rounds_q = qk && tab.ggml_fa_scores && c.D % 16 == 0;
        if (rounds_q) {
          std::vector<uint8_t> blk(tensor::row_size(GgmlType::Q8_0, c.D));
          for (size_t r = 0; r < q.size(); r += size_t(c.D)) {
            tab.quantize_act[cpu::type_index(GgmlType::Q8_0)](q.data() + r, c.D, blk.data());
            tensor::dequantize_row(GgmlType::Q8_0, blk.data(), q8.data() + r, c.D);
          }
          ref::attention(crows3(q8.data(), c.D, c.Hq, T), c.pos.data(), cache.kv, cache.vv, p,
                         rows3(want8.data(), c.D, c.Hq, T));
        }
        std::fill(got.begin(), got.end(), 0.f);
        attention(crows3(q.data(), c.D, c.Hq, T), c.pos.data(), cache.kv, cache.vv, p, rows3(got.data(), c.D, c.Hq, T),
                  ws.data(), pool);
        EXPECT_LE(nmse(got, rounds_q ? want8 : want), kTol) << gguf::type_name(t) << " D " << c.D << " T " << T << " "
                                                           << isa_name(isa);
      }
    }
}

TEST(Ops, AttentionFirstTokenReturnsItsValue) {
  // Independent of the reference: with one visible key, the output is that key's value row.
  ThreadPool pool(2);
  const Cache c = make_cache(GgmlType::F32, 64, 1, 4, 5);
  const auto q = randv(64 * 2, 6);
  const int32_t pos[1] = {0};
  std::vector<float> out(128);
  attention(crows3(q.data(), 64, 2), pos, c.kv, c.vv, AttnParams{64, 2, 1, 0.125f}, rows3(out.data(), 64, 2), nullptr,
            pool);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(out[size_t(h * 64 + i)], reinterpret_cast<const float*>(c.v.data())[i]);
}

TEST(Ops, Conv1dSiluStateCarriesAcrossCalls) {
  ThreadPool pool(3);
  // C = 50: three whole 16-channel blocks (the AVX-512 fused kernel) and a partial one; C = 1040, T = 40:
  // several of the fused path's 16-token x 32-block tiles.
  for (auto [C, T, xs] : {std::array<int64_t, 3>{50, 7, 53}, {1040, 40, 1043}}) {
    const int K = 4;
    const auto x = randv(size_t(xs * T), 51), w = randv(size_t(K * C), 52), st0 = randv(size_t((K - 1) * C), 53);
    std::vector<float> st_ref = st0, y_ref(size_t(xs * T), 0.f);
    ref::conv1d_silu(x.data(), xs, w.data(), st_ref.data(), y_ref.data(), xs, C, T, K);
    // One call, separate output.
    std::vector<float> st = st0, y(size_t(xs * T), 0.f);
    conv1d_silu(x.data(), xs, w.data(), st.data(), y.data(), xs, C, T, K, pool);
    EXPECT_LE(nmse(y, y_ref), kTol);
    EXPECT_EQ(st, st_ref);
    // Two calls (3 + T - 3 tokens), in place.
    std::vector<float> st2 = st0, xy = x;
    conv1d_silu(xy.data(), xs, w.data(), st2.data(), xy.data(), xs, C, 3, K, pool);
    conv1d_silu(xy.data() + 3 * xs, xs, w.data(), st2.data(), xy.data() + 3 * xs, xs, C, T - 3, K, pool);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(xy[size_t(t * xs + c)], y_ref[size_t(t * xs + c)], 1e-5);
    EXPECT_EQ(st2, st_ref);
    // Independent spot check: channel 0, token 0 = silu(w . [state, x0]).
    double s = 0;
    for (int j = 0; j < K - 1; ++j) s += double(w[size_t(j)]) * st0[size_t(j)];
    s += double(w[K - 1]) * x[0];
    EXPECT_NEAR(y[0], s / (1 + std::exp(-s)), 1e-6);
  }
}

// Keep states: one call writing the state after each kept token equals, bit for bit, one-token calls
// with a copy after each kept token (in place, as the model runs it); unkept buffers stay untouched.
// T = 20 spans the fused path's 16-token tiles; C = 1040 / 50 as above (whole and partial blocks).
TEST(Ops, Conv1dSiluKeepStatesEqualOneTokenCalls) {
  IsaGuard g;
  ThreadPool pool(3);
  for (auto [C, T] : {std::array<int64_t, 2>{1040, 20}, {50, 5}}) {
    const int K = 4;
    const size_t n_st = size_t((K - 1) * C);
    const auto x = randv(size_t(C * T), 54), w = randv(size_t(K * C), 55), st0 = randv(n_st, 56);
    std::vector<bool> kept(static_cast<size_t>(T), false);
    for (int64_t t : {int64_t(0), int64_t(2), T - 2}) kept[size_t(t)] = true;
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(set_isa(isa));
      std::vector<float> st1 = st0, y1 = x;
      std::vector<std::vector<float>> want(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        conv1d_silu(y1.data() + t * C, C, w.data(), st1.data(), y1.data() + t * C, C, C, 1, K, pool);
        if (kept[size_t(t)]) want[size_t(t)] = st1;
      }
      std::vector<std::vector<float>> bufs(static_cast<size_t>(T), std::vector<float>(n_st, -7.f));
      std::vector<float*> keep(static_cast<size_t>(T), nullptr);
      for (int64_t t = 0; t < T; ++t)
        if (kept[size_t(t)]) keep[size_t(t)] = bufs[size_t(t)].data();
      std::vector<float> st = st0, y = x;
      conv1d_silu(y.data(), C, w.data(), st.data(), y.data(), C, C, T, K, pool, keep.data());
      const std::string what = std::string(isa_name(isa)) + " C " + std::to_string(C);
      EXPECT_EQ(0, std::memcmp(y.data(), y1.data(), y.size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(st.data(), st1.data(), n_st * 4)) << what;
      for (int64_t t = 0; t < T; ++t) {
        if (kept[size_t(t)]) EXPECT_EQ(0, std::memcmp(bufs[size_t(t)].data(), want[size_t(t)].data(), n_st * 4)) << what << " token " << t;
        else
          for (float v : bufs[size_t(t)]) ASSERT_EQ(v, -7.f) << what << " token " << t;
      }
      EXPECT_NE(bufs[0], st0) << what;  // the kept state moved on from the start
    }
  }
}

namespace {
struct DeltaData {
  int64_t S, Hk, Hv, T, qk_stride, v_stride;
  std::vector<float> qkv, g, beta, state0;
  DeltaArgs args(float* state, float* out) const {
    DeltaArgs a;
    a.q = qkv.data();
    a.k = qkv.data() + S * Hk;
    a.qk_stride = qk_stride;
    a.v = qkv.data() + 2 * S * Hk;
    a.v_stride = v_stride;
    a.g = g.data();
    a.beta = beta.data();
    a.state = state;
    a.out = out;
    a.out_stride = S * Hv;
    a.S = S; a.Hk = Hk; a.Hv = Hv; a.n_t = T;
    return a;
  }
};
// Laid out like the conv output: per token [q (Hk heads) | k (Hk heads) | v (Hv heads)].
DeltaData make_delta(int64_t S, int64_t Hk, int64_t Hv, int64_t T, uint32_t seed) {
  DeltaData d{S, Hk, Hv, T, 2 * S * Hk + S * Hv, 2 * S * Hk + S * Hv, {}, {}, {}, {}};
  d.qkv = randv(size_t(d.qk_stride * T), seed);
  ThreadPool pool(1);
  for (int64_t t = 0; t < T; ++t) {  // L2-normalise q and k heads, as the model does
    float* base = d.qkv.data() + t * d.qk_stride;
    ref::l2_norm(crows3(base, S, 2 * Hk), rows3(base, S, 2 * Hk), 1e-6f);
  }
  d.g = randv(size_t(Hv * T), seed + 1, -1.5f, -0.01f);  // log decay <= 0
  d.beta = randv(size_t(Hv * T), seed + 2, 0.05f, 0.95f);
  d.state0 = randv(size_t(S * S * Hv), seed + 3, -0.3f, 0.3f);
  return d;
}
}  // namespace

TEST(Ops, GatedDeltaRecurrentEveryIsa) {
  IsaGuard g;
  ThreadPool pool(3);
  // Hv = 3 * Hk: v-head h uses q/k head h % Hk. S = 64 / 128 / 256 take the AVX-512 table's fused row
  // kernel (Table::ggml_delta_rows; 150 tokens: several of its 64-token blocks), S = 40 the loop.
  for (auto [S, Hk, Hv, T] : {std::array<int64_t, 4>{64, 2, 6, 9}, {128, 2, 4, 150}, {256, 1, 2, 70}, {40, 1, 3, 5}}) {
    const auto d = make_delta(S, Hk, Hv, T, 61);
    std::vector<float> st_ref = d.state0, out_ref(size_t(d.S * d.Hv * d.T));
    ref::gated_delta_rule(d.args(st_ref.data(), out_ref.data()));
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(set_isa(isa));
      std::vector<float> st = d.state0, out(out_ref.size());
      gated_delta_rule(d.args(st.data(), out.data()), pool);
      EXPECT_LE(nmse(out, out_ref), 1e-9) << isa_name(isa) << " S " << S;
      EXPECT_LE(nmse(st, st_ref), 1e-9) << isa_name(isa) << " S " << S;
    }
  }
}

// Keep states (a speculative verify step): one call over T tokens writing the state after each kept
// token must give, bit for bit, the outputs, final state and kept states of T one-token calls with a
// copy after each kept token; unkept tokens' buffers stay untouched. S = 128 / 64 take the AVX-512
// fused row kernel (streamed stores: the 64-byte aligned keep buffers; +16 floats: unaligned ones),
// S = 40 the loop; the double reference's kept states are its state rounded after the token.
TEST(Ops, GatedDeltaKeepStatesEqualOneTokenCalls) {
  IsaGuard g;
  ThreadPool pool(3);
  for (auto [S, Hk, Hv, T] : {std::array<int64_t, 4>{128, 2, 4, 4}, {64, 1, 3, 5}, {40, 1, 2, 4}}) {
    const auto d = make_delta(S, Hk, Hv, T, 83);
    const size_t n_st = size_t(S * S * Hv);
    const std::vector<bool> kept = {true, false, true, true, false};  // per token
    for (size_t off : {size_t(0), size_t(16)})
      for (CpuIsa isa : isas()) {
        ASSERT_TRUE(set_isa(isa));
        // One-token calls, copying after each kept token.
        std::vector<float> st1 = d.state0, out1(size_t(S * Hv * T));
        std::vector<std::vector<float>> want(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          DeltaArgs a = d.args(st1.data(), out1.data() + t * S * Hv);
          a.q += t * d.qk_stride, a.k += t * d.qk_stride, a.v += t * d.v_stride;
          a.g += t * Hv, a.beta += t * Hv, a.n_t = 1;
          gated_delta_rule(a, pool);
          if (kept[size_t(t)]) want[size_t(t)] = st1;
        }
        // One call with keep pointers into 64-byte aligned buffers (+ off floats).
        std::vector<std::vector<float>> bufs(static_cast<size_t>(T));
        std::vector<float*> keep(size_t(T), nullptr);
        for (int64_t t = 0; t < T; ++t) {
          bufs[size_t(t)].assign(n_st + 16 + 64, -7.f);
          float* base = bufs[size_t(t)].data();
          base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64 / 4;
          if (kept[size_t(t)]) keep[size_t(t)] = base + off;
        }
        std::vector<float> st = d.state0, out(out1.size());
        DeltaArgs a = d.args(st.data(), out.data());
        a.keep = keep.data();
        gated_delta_rule(a, pool);
        const std::string what = std::string(isa_name(isa)) + " S " + std::to_string(S) + " off " + std::to_string(off);
        EXPECT_EQ(0, std::memcmp(out.data(), out1.data(), out.size() * 4)) << what;
        EXPECT_EQ(0, std::memcmp(st.data(), st1.data(), n_st * 4)) << what;
        for (int64_t t = 0; t < T; ++t) {
          if (kept[size_t(t)]) {
            EXPECT_EQ(0, std::memcmp(keep[size_t(t)], want[size_t(t)].data(), n_st * 4)) << what << " token " << t;
          } else {
            for (float v : bufs[size_t(t)]) ASSERT_EQ(v, -7.f) << what << " token " << t << " was not kept";
          }
        }
      }
    // The reference's kept states: its state after the token (the last kept token's = the final state).
    std::vector<float> st_ref = d.state0, out_ref(size_t(S * Hv * T));
    std::vector<std::vector<float>> kbuf(size_t(T), std::vector<float>(n_st, 0.f));
    std::vector<float*> keep(size_t(T), nullptr);
    for (int64_t t = 0; t < T; ++t)
      if (kept[size_t(t)]) keep[size_t(t)] = kbuf[size_t(t)].data();
    DeltaArgs a = d.args(st_ref.data(), out_ref.data());
    a.keep = keep.data();
    ref::gated_delta_rule(a);
    int64_t last = -1;
    for (int64_t t = 0; t < T; ++t)
      if (kept[size_t(t)]) last = t;
    ASSERT_GE(last, 0);
    if (last == T - 1) EXPECT_EQ(kbuf[size_t(last)], st_ref) << "S " << S;
    EXPECT_NE(kbuf[0], d.state0) << "S " << S;
  }
}

TEST(Ops, GatedDeltaSingleStepByHand) {
  // S = 2, one head, zero state: M = k d^T with d = v * beta; out = M^T q / sqrt(2).
  const float qkv[6] = {1.f, 0.f, 0.6f, 0.8f, 2.f, -1.f};  // q, k, v
  const float gl[1] = {-0.5f}, beta[1] = {0.5f};
  float st[4] = {0, 0, 0, 0}, out[2];
  DeltaArgs a;
  a.q = qkv; a.k = qkv + 2; a.v = qkv + 4; a.qk_stride = 6; a.v_stride = 6;
  a.g = gl; a.beta = beta; a.state = st; a.out = out; a.out_stride = 2;
  a.S = 2; a.Hk = 1; a.Hv = 1; a.n_t = 1;
  ThreadPool pool(1);
  gated_delta_rule(a, pool);
  // d = (1, -0.5); M[i][j] = k[i] d[j]; out[j] = sum_i M[i][j] q[i] / sqrt(2) = k[0] d[j] / sqrt(2)
  EXPECT_NEAR(out[0], 0.6 * 1.0 / std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(out[1], 0.6 * -0.5 / std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(st[0 * 2 + 1], 0.8 * 1.0, 1e-6);  // state[j*S + i] = M[i][j]: j = 0, i = 1
  EXPECT_NEAR(st[1 * 2 + 0], 0.6 * -0.5, 1e-6);
}

TEST(Ops, GatedDeltaChunkedEqualsRecurrent) {
  IsaGuard g;
  ThreadPool pool(3);
  for (int64_t T : {1, 64, 150}) {
    const auto d = make_delta(128, 2, 4, T, 71 + uint32_t(T));
    std::vector<float> st_rec = d.state0, out_rec(size_t(d.S * d.Hv * T));
    gated_delta_rule(d.args(st_rec.data(), out_rec.data()), pool);
    for (int chunk : {64, 16}) {
      std::vector<uint8_t> ws(gated_delta_chunked_workspace(d.S, chunk, pool.size()));
      for (CpuIsa isa : isas()) {
        ASSERT_TRUE(set_isa(isa));
        std::vector<float> st = d.state0, out(out_rec.size());
        gated_delta_rule_chunked(d.args(st.data(), out.data()), chunk, ws.data(), pool);
        EXPECT_LE(nmse(out, out_rec), 1e-9) << "T " << T << " chunk " << chunk << " " << isa_name(isa);
        EXPECT_LE(nmse(st, st_rec), 1e-9) << "T " << T << " chunk " << chunk << " " << isa_name(isa);
      }
    }
  }
}
