// The fused delta-net Stream ops on CUDA (delta_prep, gated_delta_norm: one kernel each for batches
// of <= 64 tokens, the unfused kernels beyond) against the CPU stream, whose default implementation
// makes the unfused calls the ops are defined as (the CPU's arithmetic). Batches mix slots (runs of
// several tokens, single decode tokens) and follow each other, so conv and recurrent states carry.
// Shapes: S = 128 and 64 (fused), S = 48 (not a fused shape: the unfused CUDA path), and a 70-token
// batch (over the fused kernels' limit). Bounds: the GPU's sums are in its own order; mixed (conv,
// L2 norms) 1e-5 abs, the gates 1e-6 abs, the conv state bit-exact (copies of inputs), the delta
// state and the normed output 1e-4 relative to max(1, max |CPU|) (test_cuda_seq's bound for the
// recurrence, which dominates). Skips with the reason when no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.h"

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

}  // namespace
