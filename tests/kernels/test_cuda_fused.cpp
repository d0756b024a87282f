// The CUDA stream's fusions.
// 1. The fused delta-net Stream ops (delta_prep, gated_delta_norm: one kernel each for batches
// of <= 64 tokens, the unfused kernels beyond) against the CPU stream, whose default implementation
// makes the unfused calls the ops are defined as (the CPU's arithmetic). Batches mix slots (runs of
// several tokens, single decode tokens) and follow each other, so conv and recurrent states carry.
// Shapes: S = 128 and 64 (fused), S = 48 (not a fused shape: the unfused CUDA path), and a 70-token
// batch (over the fused kernels' limit). Bounds: the GPU's sums are in its own order; mixed (conv,
// L2 norms) 1e-5 abs, the gates 1e-6 abs, the conv state bit-exact (copies of inputs), the delta
// state and the normed output 1e-4 relative to max(1, max |CPU|) (test_cuda_seq's bound for the
// recurrence, which dominates).
// 2. Deferred x producers: add_rms_norm / in-place SwiGLU followed by the matmul(_n) that reads their
// output run as one producer + quantization kernel; the results (the producer's outputs and y)
// must be bit-identical to the same ops with a synchronize() between them (which launches the
// producer on its own, then quantize_x), for mixed weight types (both int8 x orders and an F32-x
// weight), 1, 3 and 8 columns; an op other than a mat-mul after the producer launches it first.
// Every test skips with the reason when no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kernel_test_util.h"

using namespace kiln;
using namespace kiln::backend;

namespace {

std::vector<float> rnd(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The same host data as a tensor on two devices.
struct Pair {
  std::unique_ptr<Buffer> cb, gb;
  Tensor c, g;
  size_t bytes = 0;
};
template <class T>
Pair both(Stream& cs, Stream& gs, const std::vector<T>& v, GgmlType type, std::array<int64_t, 4> ne) {
  Pair p;
  p.bytes = v.size() * sizeof(T);
  p.cb = cs.device().alloc(p.bytes);
  p.gb = gs.device().alloc(p.bytes);
  p.c = Tensor::make(p.cb.get(), 0, type, ne);
  p.g = Tensor::make(p.gb.get(), 0, type, ne);
  cs.upload(p.c, v.data(), p.bytes);
  gs.upload(p.g, v.data(), p.bytes);
  return p;
}
std::vector<float> host(Stream& st, const Tensor& t, size_t bytes) {
  std::vector<float> v(bytes / 4);
  st.download(v.data(), t, bytes);
  st.synchronize();
  return v;
}
// max |a - b| / max(1, max |b|) when rel, else max |a - b|.
double err(const std::vector<float>& a, const std::vector<float>& b, bool rel) {
  double e = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(double(a[i]) - b[i])), m = std::max(m, std::fabs(double(b[i])));
  return rel ? e / std::max(1.0, m) : e;
}

Tensor heads(const Tensor& mixed, int64_t off_ch, int64_t S, int64_t H) {
  Tensor t = mixed;
  t.offset += size_t(off_ch) * 4;
  t.ne = {S, H, mixed.ne[1], 1};
  t.nb = {4, size_t(S) * 4, mixed.nb[1], mixed.nb[1] * size_t(mixed.ne[1])};
  return t;
}

TEST(CudaDeltaNet, FusedOpsMatchTheCpuStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no usable CUDA device: " << cuda_unavailable_reason();
  auto cpu = make_cpu_device(2);
  auto cs = cpu->create_stream();
  auto gs = cuda_device(0).create_stream();
  struct Case {
    int64_t S, Hk, Hv;
  };
  for (const Case cc : {Case{128, 2, 4}, Case{64, 1, 3}, Case{48, 1, 2}}) {
    const int64_t S = cc.S, Hk = cc.Hk, Hv = cc.Hv, C = (2 * Hk + Hv) * S, n_slot = 4, K = 4;
    std::mt19937 rng(uint32_t(S + Hk + Hv));
    Pair conv_w = both(*cs, *gs, rnd(size_t(K * C), rng, -0.6f, 0.6f), GgmlType::F32, {K, C, 1, 1});
    Pair conv_st = both(*cs, *gs, rnd(size_t((K - 1) * C * n_slot), rng, -1, 1), GgmlType::F32, {K - 1, C, 1, n_slot});
    Pair ssm_st = both(*cs, *gs, rnd(size_t(S * S * Hv * n_slot), rng, -0.1f, 0.1f), GgmlType::F32, {S, S, Hv, n_slot});
    Pair dt = both(*cs, *gs, rnd(size_t(Hv), rng, -1, 1), GgmlType::F32, {Hv, 1, 1, 1});
    Pair a = both(*cs, *gs, rnd(size_t(Hv), rng, -2, -0.1f), GgmlType::F32, {Hv, 1, 1, 1});
    Pair nw = both(*cs, *gs, rnd(size_t(S), rng, 0.5f, 1.5f), GgmlType::F32, {S, 1, 1, 1});
    // (slot, tokens) runs per batch; the last batch is over the fused limit of 64 tokens.
    for (const auto& spec : std::vector<std::vector<std::pair<int, int>>>{
             {{0, 1}}, {{0, 1}, {1, 1}, {2, 1}, {3, 1}}, {{2, 5}, {0, 1}, {3, 3}}, {{1, 40}, {3, 30}}}) {
      std::vector<int32_t> seq;
      for (auto [slot, n] : spec) seq.insert(seq.end(), size_t(n), slot);
      const int64_t T = int64_t(seq.size());
      Pair sq = both(*cs, *gs, seq, GgmlType::I32, {T, 1, 1, 1});
      Pair mixed = both(*cs, *gs, rnd(size_t(C * T), rng, -2, 2), GgmlType::F32, {C, T, 1, 1});
      Pair beta = both(*cs, *gs, rnd(size_t(Hv * T), rng, -3, 3), GgmlType::F32, {Hv, T, 1, 1});
      Pair g = both(*cs, *gs, rnd(size_t(Hv * T), rng, -3, 3), GgmlType::F32, {Hv, T, 1, 1});
      Pair z = both(*cs, *gs, rnd(size_t(S * Hv * T), rng, -3, 3), GgmlType::F32, {S, Hv, T, 1});
      Pair out = both(*cs, *gs, std::vector<float>(size_t(S * Hv * T), 0.f), GgmlType::F32, {S, Hv, T, 1});
      for (int dev = 0; dev < 2; ++dev) {
        Stream& st = dev ? *gs : *cs;
        auto pick = [&](const Pair& p) -> const Tensor& { return dev ? p.g : p.c; };
        st.delta_prep(pick(mixed), S, Hk, pick(conv_w), pick(sq), pick(conv_st), pick(beta), pick(g), pick(dt), pick(a),
                      1e-6f);
        const Tensor& m = pick(mixed);
        st.gated_delta_norm(heads(m, 0, S, Hk), heads(m, Hk * S, S, Hk), heads(m, 2 * Hk * S, S, Hv), pick(g),
                            pick(beta), pick(sq), pick(ssm_st), pick(out), 0, pick(nw), pick(z), 1e-6f);
      }
      auto cmp = [&](const Pair& p, double bound, bool rel, const char* what) {
        const double e = err(host(*gs, p.g, p.bytes), host(*cs, p.c, p.bytes), rel);
        std::printf("[ bound ] S=%3lld T=%3lld %-10s %s err %.2e (bound %.0e)\n", (long long)S, (long long)T, what,
                    rel ? "rel" : "abs", e, bound);
        EXPECT_LE(e, bound) << what << " S=" << S << " T=" << T;
      };
      cmp(mixed, 1e-5, false, "mixed");
      cmp(beta, 1e-6, false, "beta");
      cmp(g, 1e-6, false, "g");
      cmp(conv_st, 0, false, "conv state");
      cmp(out, 1e-4, true, "out");
      cmp(ssm_st, 1e-4, true, "ssm state");
    }
  }
}

// One CUDA run of: add_rms_norm(x, t, w, cur); matmul_n(W, Y, cur) (or SwiGLU(cur, b) in place then
// matmul(W0, cur, Y0)); `split` puts a synchronize() between them. Returns x, cur and the Y's.
struct ProdRun {
  std::vector<std::vector<float>> outs;
};
ProdRun producer_run(Stream& st, Device& dev, bool swiglu, bool split, int64_t k, int64_t m,
                     const std::vector<Tensor>& W, const std::vector<int64_t>& ns, uint32_t seed) {
  std::mt19937 rng(seed);
  auto mk = [&](std::vector<std::unique_ptr<Buffer>>& keep, const std::vector<float>& v, std::array<int64_t, 4> ne) {
    keep.push_back(dev.alloc(v.size() * 4));
    Tensor t = Tensor::make(keep.back().get(), 0, GgmlType::F32, ne);
    st.upload(t, v.data(), v.size() * 4);
    return t;
  };
  std::vector<std::unique_ptr<Buffer>> keep;
  const Tensor x = mk(keep, rnd(size_t(k * m), rng, -2, 2), {k, m, 1, 1});
  const Tensor t = mk(keep, rnd(size_t(k * m), rng, -2, 2), {k, m, 1, 1});
  const Tensor b = mk(keep, rnd(size_t(k * m), rng, -2, 2), {k, m, 1, 1});
  const Tensor w = mk(keep, rnd(size_t(k), rng, 0.5f, 1.5f), {k, 1, 1, 1});
  const Tensor cur = mk(keep, rnd(size_t(k * m), rng, -2, 2), {k, m, 1, 1});
  std::vector<Tensor> Y;
  for (int64_t n : ns) Y.push_back(mk(keep, std::vector<float>(size_t(n * m), 0.f), {n, m, 1, 1}));
  size_t wsb = 0;
  for (const Tensor& wt : W) wsb = std::max(wsb, st.matmul_workspace(wt.type, k, wt.ne[1], m));
  st.reserve_workspace(wsb);
  if (swiglu) st.binary(Binary::SwiGlu, cur, b, cur);
  else st.add_rms_norm(x, t, &w, cur, 1e-6f);
  if (split) st.synchronize();
  if (swiglu) st.matmul(W[0], cur, Y[0]);
  else st.matmul_n(W.data(), Y.data(), int(W.size()), cur);
  ProdRun r;
  for (const Tensor& o : std::vector<Tensor>{x, cur})
    r.outs.push_back(host(st, o, size_t(o.n_elements()) * 4));
  for (const Tensor& o : Y) r.outs.push_back(host(st, o, size_t(o.n_elements()) * 4));
  return r;
}

TEST(CudaFused, DeferredProducersMatchTheUnfusedOps) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no usable CUDA device: " << cuda_unavailable_reason();
  Device& dev = cuda_device(0);
  auto st = dev.create_stream();
  const GgmlType types[3] = {GgmlType::Q5_K, GgmlType::IQ4_XS, GgmlType::F32};
  for (int64_t k : {int64_t(2048), int64_t(4096), int64_t(12288)}) {  // 12288: SwiGLU's 12 values per thread
    const std::vector<int64_t> ns = {96, 40, 7};
    std::vector<std::unique_ptr<Buffer>> wb;
    std::vector<Tensor> W;
    std::mt19937 rng{uint32_t(k)};
    for (int i = 0; i < 3; ++i) {
      const auto f = rnd(size_t(k * ns[size_t(i)]), rng, -1, 1);
      const auto bytes = kiln::kernels::testing::weight_rows(types[i], f.data(), k, ns[size_t(i)]);
      wb.push_back(dev.alloc(bytes.size()));
      W.push_back(Tensor::make(wb.back().get(), 0, types[i], {k, ns[size_t(i)], 1, 1}));
      st->upload(W.back(), bytes.data(), bytes.size());
    }
    for (int64_t m : {int64_t(1), int64_t(3), int64_t(8)})
      for (bool swiglu : {false, true}) {
        const std::vector<Tensor> Ws = swiglu ? std::vector<Tensor>{W[1]} : W;
        const std::vector<int64_t> nws = swiglu ? std::vector<int64_t>{ns[1]} : ns;
        const uint32_t seed = uint32_t(k + m * 7 + swiglu);
        const ProdRun fused = producer_run(*st, dev, swiglu, false, k, m, Ws, nws, seed);
        const ProdRun plain = producer_run(*st, dev, swiglu, true, k, m, Ws, nws, seed);
        ASSERT_EQ(fused.outs.size(), plain.outs.size());
        for (size_t i = 0; i < fused.outs.size(); ++i)
          EXPECT_EQ(fused.outs[i], plain.outs[i]) << (swiglu ? "swiglu" : "add_rms_norm") << " k=" << k << " m=" << m
                                                  << " output " << i << " (0 x, 1 cur, then y of each weight)";
        std::printf("[ fused ] %-12s k=%lld m=%lld: %zu outputs bit-identical to the unfused ops\n",
                    swiglu ? "swiglu" : "add_rms_norm", (long long)k, (long long)m, fused.outs.size());
      }
  }
  // A deferred producer followed by something else than its mat-mul runs first (in stream order).
  std::mt19937 rng(9);
  const int64_t k = 256;
  auto xb = dev.alloc(k * 4), tb = dev.alloc(k * 4), yb = dev.alloc(k * 4);
  const Tensor x = Tensor::make(xb.get(), 0, GgmlType::F32, {k, 1, 1, 1}), t = Tensor::make(tb.get(), 0, GgmlType::F32, {k, 1, 1, 1}),
               y = Tensor::make(yb.get(), 0, GgmlType::F32, {k, 1, 1, 1});
  const auto xv = rnd(size_t(k), rng, -1, 1), tv = rnd(size_t(k), rng, -1, 1);
  st->upload(x, xv.data(), k * 4);
  st->upload(t, tv.data(), k * 4);
  st->add_rms_norm(x, t, nullptr, y, 1e-6f);
  st->scale(y, 2.f, y);  // must see the normed y
  const auto got = host(*st, y, k * 4);
  double ss = 0;
  for (int64_t i = 0; i < k; ++i) ss += double(xv[size_t(i)] + tv[size_t(i)]) * (xv[size_t(i)] + tv[size_t(i)]);
  const double sc = 1.0 / std::sqrt(ss / double(k) + 1e-6);
  double e = 0;
  for (int64_t i = 0; i < k; ++i) e = std::max(e, std::fabs(got[size_t(i)] - 2.0 * (xv[size_t(i)] + tv[size_t(i)]) * sc));
  EXPECT_LE(e, 1e-5) << "add_rms_norm then scale";
}

}  // namespace

