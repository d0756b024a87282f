// Batch invariance of the dispatched CPU ops: a token's result must be bit-identical whatever else
// shares its call (other columns / queries / rows), whatever its position in the batch, and
// whatever the thread count. The oracle is the op itself called on that token alone (m = 1, one
// query, one row) with one thread; comparisons are memcmp (bit-exact), under every ISA level.
#include <cstring>

#include "kernel_test_util.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// First index where the bits differ (for the failure message).
size_t first_diff(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  return n;
}

}  // namespace

TEST(Invariance, MatmulColumnsEqualSingleColumnCalls) {
  IsaGuard guard;
  ThreadPool p1(1), p2(2);
  const int64_t k = 512, n = 37;  // odd n: uneven row split across threads
  const int64_t ms[] = {2, 3, 5, 17, 64};
  const int64_t m_max = 64, xs = k + 8, ys = n + 3;
  const auto x = randv(size_t(xs * m_max), 7, -3.f, 3.f);
  for (GgmlType t : kMatmulTypes) {
    const size_t rs = tensor::row_size(t, k);
    const auto w = weight_rows(t, randv(size_t(k * n), 3).data(), k, n);
    AlignedWs ws(matmul_workspace(t, k, m_max, 2));
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(set_isa(isa));
      // Oracle: each column alone (m = 1, one thread).
      std::vector<float> solo(size_t(n * m_max));
      for (int64_t c = 0; c < m_max; ++c) {
        MatmulArgs a{t, w.data(), rs, k, n, 1, x.data() + c * xs, k, solo.data() + c * n, n};
        matmul(a, ws.p, p1);
      }
      for (ThreadPool* pool : {&p1, &p2})
        for (int64_t m : ms)
          for (int64_t off : {int64_t(0), m_max - m}) {  // the same columns at different batch positions
            std::vector<float> y(size_t(ys * m), 0.f);
            MatmulArgs a{t, w.data(), rs, k, n, m, x.data() + off * xs, xs, y.data(), ys};
            matmul(a, ws.p, *pool);
            for (int64_t c = 0; c < m; ++c) {
              const float* want = solo.data() + (off + c) * n;
              const float* got = y.data() + c * ys;
              ASSERT_TRUE(same_bits(got, want, size_t(n)))
                  << gguf::type_name(t) << " isa " << isa_name(isa) << " threads " << pool->size() << " m " << m
                  << " column " << c << " row " << first_diff(got, want, size_t(n)) << ": "
                  << got[first_diff(got, want, size_t(n))] << " vs " << want[first_diff(got, want, size_t(n))];
            }
          }
      // m = 1 itself does not depend on the thread count.
      std::vector<float> y(static_cast<size_t>(n));
      MatmulArgs a{t, w.data(), rs, k, n, 1, x.data(), k, y.data(), n};
      matmul(a, ws.p, p2);
      ASSERT_TRUE(same_bits(y.data(), solo.data(), size_t(n))) << gguf::type_name(t) << " isa " << isa_name(isa);
    }
  }
}

TEST(Invariance, AttentionQueriesEqualSingleQueryCalls) {
  IsaGuard guard;
  ThreadPool p1(1), p2(2), p3(3);
  // Long enough for several fixed key chunks, a partial last chunk, GQA groups > the 8-head tile.
  struct Case { int64_t D, Hq, Hkv, n_kv; };
  const Case cases[] = {{64, 4, 2, 600}, {32, 12, 1, 300}};
  for (GgmlType kt : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0})
    for (const Case& c : cases) {
      const size_t rs = tensor::row_size(kt, c.D), pos_stride = rs * size_t(c.Hkv);
      std::vector<uint8_t> kc(pos_stride * size_t(c.n_kv)), vc(pos_stride * size_t(c.n_kv));
      const auto kx = randv(size_t(c.D * c.Hkv * c.n_kv), 11, -2, 2), vx = randv(size_t(c.D * c.Hkv * c.n_kv), 12);
      std::vector<int32_t> all(size_t(c.n_kv));
      for (int64_t i = 0; i < c.n_kv; ++i) all[size_t(i)] = int32_t(i);
      kv_store(kt, crows3(kx.data(), c.D, c.Hkv, c.n_kv), all.data(), kc.data(), pos_stride, rs);
      kv_store(kt, crows3(vx.data(), c.D, c.Hkv, c.n_kv), all.data(), vc.data(), pos_stride, rs);
      const KvView kv{kt, kc.data(), pos_stride, rs, c.n_kv}, vv{kt, vc.data(), pos_stride, rs, c.n_kv};
      const AttnParams p{c.D, c.Hq, c.Hkv, 1.f / std::sqrt(float(c.D))};
      // Queries: a prefill-like run (consecutive positions crossing chunk boundaries) plus scattered ones.
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < 12; ++i) pos.push_back(int32_t(c.n_kv - 12 + i));
      for (int32_t ps : {0, 1, 63, 64, 255, 256, 257, 511}) if (ps < c.n_kv) pos.push_back(ps);
      const int64_t T = int64_t(pos.size()), qn = c.D * c.Hq;
      const auto q = randv(size_t(qn * T), 13, -2, 2);
      AlignedWs ws(attention_workspace(p, 3));
      for (CpuIsa isa : isas()) {
        ASSERT_TRUE(set_isa(isa));
        std::vector<float> solo(size_t(qn * T));
        for (int64_t t = 0; t < T; ++t)
          attention(crows3(q.data() + t * qn, c.D, c.Hq, 1), &pos[size_t(t)], kv, vv, p,
                    rows3(solo.data() + t * qn, c.D, c.Hq, 1), nullptr, p1);
        for (ThreadPool* pool : {&p1, &p2, &p3})
          for (void* w : {static_cast<void*>(nullptr), ws.p}) {
            // The whole batch; with 2 threads and a workspace also each query alone (decode: its key chunks
            // are spread across the threads).
            std::vector<float> out(size_t(qn * T));
            attention(crows3(q.data(), c.D, c.Hq, T), pos.data(), kv, vv, p, rows3(out.data(), c.D, c.Hq, T), w, *pool);
            ASSERT_TRUE(same_bits(out.data(), solo.data(), out.size()))
                << gguf::type_name(kt) << " D " << c.D << " isa " << isa_name(isa) << " threads " << pool->size()
                << " ws " << (w != nullptr) << " at " << first_diff(out.data(), solo.data(), out.size());
            if (pool != &p2 || w == nullptr) continue;
            for (int64_t t = 0; t < T; ++t) {
              std::vector<float> one(static_cast<size_t>(qn));
              attention(crows3(q.data() + t * qn, c.D, c.Hq, 1), &pos[size_t(t)], kv, vv, p,
                        rows3(one.data(), c.D, c.Hq, 1), w, *pool);
              ASSERT_TRUE(same_bits(one.data(), solo.data() + t * qn, size_t(qn)))
                  << gguf::type_name(kt) << " D " << c.D << " isa " << isa_name(isa) << " threads " << pool->size()
                  << " ws " << (w != nullptr) << " pos " << pos[size_t(t)];
            }
          }
      }
    }
}

TEST(Invariance, ElementwiseDoesNotDependOnLength) {
  // The flat ops run over [width, n_tokens]: an element's value must not depend on whether it
  // falls in a SIMD body or a tail, i.e. on the total length.
  IsaGuard guard;
  const int64_t n = 61;
  const auto a = randv(size_t(n), 21, -9, 9), b = randv(size_t(n), 22, -9, 9);
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    std::vector<float> full(static_cast<size_t>(n)), part(static_cast<size_t>(n));
    using Un = void (*)(const float*, float*, int64_t);
    using Bin = void (*)(const float*, const float*, float*, int64_t);
    for (auto [name, f] : {std::pair<const char*, Un>{"sigmoid", sigmoid}, {"softplus", softplus}}) {
      f(a.data(), full.data(), n);
      for (int64_t i = 0; i < n; ++i) f(a.data() + i, part.data() + i, 1);
      EXPECT_TRUE(same_bits(full.data(), part.data(), size_t(n))) << name << " " << isa_name(isa);
    }
    for (auto [name, f] : {std::pair<const char*, Bin>{"sigmoid_mul", sigmoid_mul}, {"add", add}, {"mul", mul}}) {
      f(a.data(), b.data(), full.data(), n);
      for (int64_t i = 0; i < n; i += 5) f(a.data() + i, b.data() + i, part.data() + i, std::min<int64_t>(5, n - i));
      EXPECT_TRUE(same_bits(full.data(), part.data(), size_t(n))) << name << " " << isa_name(isa);
    }
    // swiglu and silu are ggml's row ops (AVX-512: its vector exp on the 16-wide body, libm expf on
    // the n % 16 tail), so the models call them one row at a time; an element depends only on its
    // place in the row: pieces cut at multiples of 16 give the same bits.
    swiglu(a.data(), b.data(), full.data(), n);
    for (int64_t i = 0; i < n; i += 16) swiglu(a.data() + i, b.data() + i, part.data() + i, std::min<int64_t>(16, n - i));
    EXPECT_TRUE(same_bits(full.data(), part.data(), size_t(n))) << "swiglu " << isa_name(isa);
    silu(a.data(), full.data(), n);
    for (int64_t i = 0; i < n; i += 16) silu(a.data() + i, part.data() + i, std::min<int64_t>(16, n - i));
    EXPECT_TRUE(same_bits(full.data(), part.data(), size_t(n))) << "silu " << isa_name(isa);
  }
}

TEST(Invariance, RowOpsEqualSingleRowCalls) {
  IsaGuard guard;
  ThreadPool p1(1), p2(2);
  const int64_t ne0 = 100, rows = 300;  // enough rows for the row split to use both threads
  const auto x = randv(size_t(ne0 * rows), 31, -4, 4), w = randv(size_t(ne0), 32);
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = int32_t(7 * i + 3);
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    for (ThreadPool* pool : {&p1, &p2}) {
      std::vector<float> all(x.size()), one(x.size());
      rms_norm(crows3(x.data(), ne0, rows), w.data(), rows3(all.data(), ne0, rows), 1e-6f, *pool);
      for (int64_t r = 0; r < rows; ++r)
        rms_norm(crows3(x.data() + r * ne0, ne0), w.data(), rows3(one.data() + r * ne0, ne0), 1e-6f, p1);
      EXPECT_TRUE(same_bits(all.data(), one.data(), all.size())) << "rms_norm " << isa_name(isa);
      l2_norm(crows3(x.data(), ne0, rows), rows3(all.data(), ne0, rows), 1e-6f, *pool);
      for (int64_t r = 0; r < rows; ++r) l2_norm(crows3(x.data() + r * ne0, ne0), rows3(one.data() + r * ne0, ne0), 1e-6f, p1);
      EXPECT_TRUE(same_bits(all.data(), one.data(), all.size())) << "l2_norm " << isa_name(isa);
      all = x;
      one = x;
      softmax(rows3(all.data(), ne0, rows), 0.7f, *pool);
      for (int64_t r = 0; r < rows; ++r) softmax(rows3(one.data() + r * ne0, ne0), 0.7f, p1);
      EXPECT_TRUE(same_bits(all.data(), one.data(), all.size())) << "softmax " << isa_name(isa);
      // rope: rows are [ne0 = head_dim, 3 heads, 100 tokens]
      all = x;
      one = x;
      const RopeParams rp{64, true, 10000.f, 1.f};
      rope(rows3(all.data(), ne0, 3, 100), pos.data(), rp, *pool);
      for (int64_t t = 0; t < 100; ++t) rope(rows3(one.data() + t * 3 * ne0, ne0, 3, 1), &pos[size_t(t)], rp, p1);
      EXPECT_TRUE(same_bits(all.data(), one.data(), all.size())) << "rope " << isa_name(isa);
    }
  }
}

TEST(Invariance, GatedDeltaRuleChunksOfOneEqualWholeRun) {
  // The recurrence is what the model runs for every run length: a run processed at once must
  // leave the same outputs and state as the same tokens fed one call at a time, any thread count.
  IsaGuard guard;
  ThreadPool p1(1), p2(2);
  const int64_t S = 32, Hk = 2, Hv = 4, n_t = 9, qs = 2 * S * Hk + S * Hv;
  const auto qkv = randv(size_t(qs * n_t), 41), g0 = randv(size_t(Hv * n_t), 42, -1.f, 0.f),
             beta = randv(size_t(Hv * n_t), 43, 0.f, 1.f), st0 = randv(size_t(S * S * Hv), 44, -0.1f, 0.1f);
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    for (ThreadPool* pool : {&p1, &p2}) {
      std::vector<float> st_a = st0, st_b = st0, out_a(size_t(S * Hv * n_t)), out_b(out_a.size());
      auto args = [&](int64_t t0, int64_t nt, float* st, float* out) {
        DeltaArgs a;
        a.q = qkv.data() + t0 * qs;
        a.k = a.q + S * Hk;
        a.qk_stride = qs;
        a.v = a.q + 2 * S * Hk;
        a.v_stride = qs;
        a.g = g0.data() + t0 * Hv;
        a.beta = beta.data() + t0 * Hv;
        a.state = st;
        a.out = out + t0 * S * Hv;
        a.out_stride = S * Hv;
        a.S = S;
        a.Hk = Hk;
        a.Hv = Hv;
        a.n_t = nt;
        return a;
      };
      gated_delta_rule(args(0, n_t, st_a.data(), out_a.data()), *pool);
      for (int64_t t = 0; t < n_t; ++t) gated_delta_rule(args(t, 1, st_b.data(), out_b.data()), p1);
      EXPECT_TRUE(same_bits(out_a.data(), out_b.data(), out_a.size())) << isa_name(isa);
      EXPECT_TRUE(same_bits(st_a.data(), st_b.data(), st_a.size())) << isa_name(isa);
    }
  }
}
