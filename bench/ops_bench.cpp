// Non-matmul op benchmarks at Qwen3.5-like sizes: attention decode over a 4096-token F16/Q8_0
// cache, gated delta (decode step and 512-token chunked prefill vs recurrence), conv1d.
#include <benchmark/benchmark.h>

#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;

namespace {

std::vector<float> fill(size_t n, float scale) {
  std::vector<float> v(n);
  uint32_t s = 7;
  for (auto& x : v) { s = s * 1664525u + 1013904223u; x = scale * (float(int32_t(s >> 8) % 2001) / 1000.f - 1.f); }
  return v;
}

void BM_AttentionDecode(benchmark::State& state) {
  const GgmlType t = state.range(0) == 0 ? GgmlType::F16 : GgmlType::Q8_0;
  const int64_t D = 256, Hq = 16, Hkv = 2, n_kv = state.range(1);
  const size_t rs = tensor::row_size(t, D);
  std::vector<uint8_t> kc(rs * Hkv * n_kv), vc(rs * Hkv * n_kv);
  const auto kx = fill(size_t(D * Hkv * n_kv), 1.f);
  std::vector<int32_t> pos(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < n_kv; ++i) pos[size_t(i)] = int32_t(i);
  kv_store(t, crows3(kx.data(), D, Hkv, n_kv), pos.data(), kc.data(), rs * Hkv, rs);
  kv_store(t, crows3(kx.data(), D, Hkv, n_kv), pos.data(), vc.data(), rs * Hkv, rs);
  const auto q = fill(size_t(D * Hq), 1.f);
  std::vector<float> out(q.size());
  const int32_t p[1] = {int32_t(n_kv - 1)};
  KvView kv{t, kc.data(), rs * Hkv, rs, n_kv}, vv{t, vc.data(), rs * Hkv, rs, n_kv};
  const AttnParams ap{D, Hq, Hkv, 0.0625f};
  std::vector<uint8_t> ws(attention_workspace(ap, ThreadPool::global().size()));
  for (auto _ : state) attention(crows3(q.data(), D, Hq), p, kv, vv, ap, rows3(out.data(), D, Hq), ws.data(), ThreadPool::global());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * kc.size()));
  state.SetLabel(std::string(gguf::type_name(t)) + " isa=" + std::string(isa_name(current_isa())));
}

void BM_GatedDelta(benchmark::State& state) {
  const int64_t S = 128, Hk = 16, Hv = 32, T = state.range(0);
  const int chunk = int(state.range(1));
  const int64_t tok = 2 * S * Hk + S * Hv;
  auto qkv = fill(size_t(tok * T), 0.1f);
  auto g = fill(size_t(Hv * T), 0.5f);
  for (auto& x : g) x = -std::abs(x);
  auto beta = fill(size_t(Hv * T), 0.4f);
  for (auto& x : beta) x = 0.5f + x;
  auto st = fill(size_t(S * S * Hv), 0.01f);
  std::vector<float> out(size_t(S * Hv * T));
  ThreadPool& pool = ThreadPool::global();
  std::vector<uint8_t> ws(gated_delta_chunked_workspace(S, chunk > 0 ? chunk : 1, pool.size()));
  DeltaArgs a;
  a.q = qkv.data(); a.k = qkv.data() + S * Hk; a.qk_stride = tok; a.v = qkv.data() + 2 * S * Hk; a.v_stride = tok;
  a.g = g.data(); a.beta = beta.data(); a.state = st.data(); a.out = out.data(); a.out_stride = S * Hv;
  a.S = S; a.Hk = Hk; a.Hv = Hv; a.n_t = T;
  for (auto _ : state) {
    if (chunk > 0) gated_delta_rule_chunked(a, chunk, ws.data(), pool);
    else gated_delta_rule(a, pool);
  }
  state.counters["tok/s"] = benchmark::Counter(double(state.iterations() * T), benchmark::Counter::kIsRate);
}

void BM_Conv1d(benchmark::State& state) {
  const int64_t C = 8192, T = state.range(0);
  auto x = fill(size_t(C * T), 1.f), w = fill(size_t(4 * C), 0.5f), st = fill(size_t(3 * C), 1.f);
  for (auto _ : state) conv1d_silu(x.data(), C, w.data(), st.data(), x.data(), C, C, T, 4, ThreadPool::global());
  state.counters["tok/s"] = benchmark::Counter(double(state.iterations() * T), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_AttentionDecode)->ArgsProduct({{0, 1}, {4096}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GatedDelta)->Args({1, 0})->Args({512, 0})->Args({512, 64})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv1d)->Arg(1)->Arg(512)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
