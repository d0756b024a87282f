// CPU kernel benchmarks: memory read bandwidth (STREAM-like), quantized mat-vec (decode, batch 1)
// streaming weights from DRAM, and mat-mul at 512 tokens (prefill). See bench/RESULTS.md.
//   KILN_CPU=scalar|avx2|avx512 picks the kernel table; KILN_THREADS the pool size.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;

namespace {

constexpr size_t kReadBytes = size_t(512) << 20;     // bandwidth test buffer, >> L3
constexpr size_t kRotateBytes = size_t(320) << 20;   // weights cycled through by mat-vec, >> L3

void* alloc64(size_t n) {
  void* p = std::aligned_alloc(64, (n + 63) & ~size_t(63));
  if (!p) std::abort();
  return p;
}

__attribute__((target("avx2"))) float read_sum(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0] + out[7];
}

void BM_MemRead(benchmark::State& state) {
  ThreadPool pool(int(state.range(0)));  // 0: every core (or KILN_THREADS)
  const int threads = pool.size();
  const size_t n = kReadBytes / 4;
  auto* buf = static_cast<float*>(alloc64(kReadBytes));
  pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = 1.0f;
  }, 1 << 16);
  std::vector<float> part(static_cast<size_t>(threads));
  for (auto _ : state) {
    pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int tid) { part[size_t(tid)] = read_sum(buf + b, size_t(e - b)); },
                      1 << 16);
    benchmark::DoNotOptimize(part.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kReadBytes));
  state.SetLabel("threads=" + std::to_string(threads));
  std::free(buf);
}

// Quantized weights [k, n]: 64 distinct quantized rows repeated (realistic scales), replicated into
// enough copies that the working set is >> L3, cycled so every call streams from DRAM.
struct Weights {
  GgmlType t;
  int64_t k, n;
  size_t matrix_bytes, row_bytes;
  int copies;
  uint8_t* data;
};
Weights make_weights(GgmlType t, int64_t k, int64_t n, bool rotate) {
  Weights w{t, k, n, 0, tensor::row_size(t, k), 1, nullptr};
  w.matrix_bytes = w.row_bytes * size_t(n);
  w.copies = rotate ? int(std::max<size_t>(1, (kRotateBytes + w.matrix_bytes - 1) / w.matrix_bytes)) : 1;
  w.data = static_cast<uint8_t*>(alloc64(w.matrix_bytes * size_t(w.copies)));
  std::vector<float> f(static_cast<size_t>(k));
  std::vector<uint8_t> proto(w.row_bytes * 64);
  uint32_t s = 12345;
  for (int r = 0; r < 64; ++r) {
    for (auto& x : f) { s = s * 1664525u + 1013904223u; x = float(int32_t(s >> 8) % 2001) / 1000.f - 1.f; }
    tensor::quantize_row(t, f.data(), proto.data() + size_t(r) * w.row_bytes, k);
  }
  for (size_t r = 0; r < size_t(n) * size_t(w.copies); ++r)
    std::memcpy(w.data + r * w.row_bytes, proto.data() + (r % 64) * w.row_bytes, w.row_bytes);
  return w;
}

void run_matmul(benchmark::State& state, GgmlType t, int64_t k, int64_t n, int64_t m, bool rotate) {
  ThreadPool& pool = ThreadPool::global();
  Weights w = make_weights(t, k, n, rotate);
  std::vector<float> x(size_t(k * m)), y(size_t(n * m));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 17) - 8) / 8.f;
  void* ws = alloc64(matmul_workspace(t, k, m, pool.size()) + 64);
  int c = 0;
  for (auto _ : state) {
    MatmulArgs a{t, w.data + w.matrix_bytes * size_t(c), w.row_bytes, k, n, m, x.data(), k, y.data(), n};
    matmul(a, ws, pool);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % w.copies;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(w.matrix_bytes));
  state.counters["GFLOP/s"] =
      benchmark::Counter(double(state.iterations()) * 2.0 * double(k) * double(n) * double(m) * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(gguf::type_name(t)) + " isa=" + std::string(isa_name(current_isa())) +
                 " threads=" + std::to_string(pool.size()));
  std::free(ws);
  std::free(w.data);
}

const GgmlType kMatvecTypes[] = {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::IQ4_XS,
                                 GgmlType::Q5_K, GgmlType::F16,  GgmlType::Q4_1, GgmlType::Q2_K, GgmlType::Q3_K,
                                 GgmlType::Q5_0, GgmlType::Q5_1};

void BM_Matvec(benchmark::State& state) {
  run_matmul(state, kMatvecTypes[state.range(0)], 4096, state.range(1), 1, true);
}
// The vocabulary (output) projection of qwen35-0.8b's shape: k = 1024, n = 248320 rows.
void BM_MatvecVocab(benchmark::State& state) {
  run_matmul(state, kMatvecTypes[state.range(0)], 1024, 248320, 1, true);
}
// The same at a speculative verify step's 2 / 4 rows (range(1) columns).
void BM_VerifyVocab(benchmark::State& state) {
  run_matmul(state, kMatvecTypes[state.range(0)], 1024, 248320, state.range(1), true);
}
// Compute-bound view of the same kernels: 512 rows of k = 4096 (L2-resident, not rotated), so the
// time is the kernel's instruction work, not the memory system's (robust on a shared box).
void BM_MatvecL2(benchmark::State& state) {
  run_matmul(state, kMatvecTypes[state.range(0)], 4096, 512, 1, false);
}
void BM_Matmul512(benchmark::State& state) {
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS};
  run_matmul(state, types[state.range(0)], 4096, 4096, 512, false);
}

}  // namespace

BENCHMARK(BM_MemRead)->Arg(1)->Arg(2)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Matvec)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4096, 12288}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatvecVocab)->DenseRange(0, 11)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_VerifyVocab)->ArgsProduct({benchmark::CreateDenseRange(0, 11, 1), {2, 4}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatvecL2)->DenseRange(0, 11)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul512)->DenseRange(0, 6)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
