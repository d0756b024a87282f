// tests/kernels/test_cuda_matmul.cpp — the CUDA mat-mul launchers (kernels/cuda/cuda_ops.h: matmul,
// matmul_n, matmul_id, get_rows) for every weight type against a double-precision host reference on the
// host-dequantized weights (tensor::dequantize_row of the tensor::quantize_row bytes).
// Bounds, relative to S = sum_i |w_i x_i| of each output:
//   mat-vec path, F32 x (m <= 16, F32 sums):                 |y - ref| <= 2e-5 * S
//   mat-vec path, int8 x (m <= 16, the types of matvec_q8_supported; x rounded per 32 values to
//     q * d, d = max|x| / 127): against the reference on those rounded x~ (host mirror of the
//     quantizer, bit-exact): |y - ref~| <= 2e-5 * sum|w x~| (int32 sums, F32 scales); against the
//     exact reference: |y - ref| <= sum_i |w_i| d_i / 2 (+ 2e-5 S) always, and for this test's
//     uniform random data |y - ref| <= 5e-2 / sqrt(k) * S (the rounding is a random walk: expected
//     ~5e-3 / sqrt(k) * S per output; the printed table gives the worst sqrt(k) |y - ref| / S).
//   tensor-core path (m > 16): F32 weights (F32 GEMM)       |y - ref| <= 2e-5 * S
//                              other types (W, X in F16):    |y - ref| <= 2e-3 * S  (two F16
//                              roundings, 2^-11 each, plus F32 sums)
//   get_rows: bit-identical to tensor::dequantize_row.
// Launcher-level: the test owns its device buffers, stream, cuBLAS handle and workspace. Without a
// usable GPU every test is skipped with the reason. CudaMatmulBench.Decode (timings, printed, not
// asserted) runs only with KILN_CUDA_BENCH=1. Both mat-vec x paths are tested (detail::set_matvec_x_mode).
#include <gtest/gtest.h>

#if KILN_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf/types.h"
#include "kernel_test_util.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/invariant.h"
#include "kernels/cuda/matmul_internal.h"
#include "tensor/quant.h"

namespace {

using kiln::gguf::GgmlType;
namespace cu = kiln::cuda;
namespace kt = kiln::kernels::testing;

std::string gpu_unavailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  return "";
}
#define KILN_REQUIRE_GPU()                                      \
  if (const std::string why_ = gpu_unavailable(); !why_.empty()) \
  GTEST_SKIP() << why_

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

// A device buffer of n elements of T.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) { ck(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { up(v); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void up(const std::vector<T>& v) { ck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "up"); }
  std::vector<T> down() const {
    std::vector<T> v(n);
    ck(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "down");
    return v;
  }
};

// Stream, cuBLAS handle and a workspace grown on demand (outside the launchers).
struct Gpu {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  int sm = 0, n_sm = 0;
  Gpu() {
    ck(cudaStreamCreate(&stream), "cudaStreamCreate");
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) std::abort();
    cublasSetStream(blas, stream);
    cudaDeviceProp p{};
    ck(cudaGetDeviceProperties(&p, 0), "props");
    sm = cu::code_sm(p.major * 10 + p.minor), n_sm = p.multiProcessorCount;
  }
  ~Gpu() {
    cudaFree(ws);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
  }
  cu::Launch launch(size_t need) {
    if (need > ws_bytes) {
      cudaFree(ws);
      ck(cudaMalloc(&ws, need), "cudaMalloc ws");
      ws_bytes = need;
    }
    cu::Launch L;
    L.stream = stream, L.blas = blas, L.ws = ws, L.ws_bytes = ws_bytes, L.sm = sm, L.n_sm = n_sm;
    return L;
  }
  void sync() { ck(cudaStreamSynchronize(stream), "sync"); }
};

int64_t block_of(GgmlType t) { return kiln::gguf::type_info(t).block_size; }
bool k_type(GgmlType t) { return block_of(t) == 256; }

// n quantized rows (stride bytes apart) and their host dequantization [n][k].
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
  size_t stride = 0;
};
Weights make_weights(GgmlType t, int64_t k, int64_t n, size_t pad, uint32_t seed) {
  Weights w;
  const std::vector<float> f = kt::randv(size_t(k * n), seed);
  w.stride = kiln::tensor::row_size(t, k) + pad;
  w.bytes = kt::weight_rows(t, f.data(), k, n, w.stride, 0x5A);
  w.deq.resize(size_t(k * n));
  for (int64_t r = 0; r < n; ++r)
    kiln::tensor::dequantize_row(t, w.bytes.data() + r * w.stride, w.deq.data() + r * k, k);
  return w;
}

// Largest |y - ref| / S over the outputs of one (row block, column): ref and S in double.
struct ErrAcc {
  double worst = 0;
  void add(float got, const float* w, const float* x, int64_t k) {
    double ref = 0, s = 0;
    for (int64_t i = 0; i < k; ++i) {
      ref += double(w[i]) * double(x[i]);
      s += std::fabs(double(w[i]) * double(x[i]));
    }
    const double e = std::fabs(double(got) - ref) / std::max(s, 1e-30);
    worst = std::max(worst, std::isfinite(got) ? e : 1e30);
  }
};

constexpr double kMvBound = 2e-5, kF32GemmBound = 2e-5, kF16GemmBound = 2e-3;
constexpr double kQ8Rel = 5e-2;  // int8 x: |y - ref| <= kQ8Rel / sqrt(k) * S on uniform random data

// Host mirror of detail::quantize_x: x~ = q * d per 32 values (element order; the x order on the
// device does not change the values).
std::vector<float> quantize_x_host(const float* x, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k));
  for (int64_t b = 0; b < k; b += 32) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int i = 0; i < 32; ++i) {
      const float q = amax > 0.f ? std::min(127.f, std::max(-127.f, std::nearbyint(x[b + i] * inv))) : 0.f;
      out[size_t(b + i)] = q * d;
    }
  }
  return out;
}

// The int8-x checks of one output: against x~ (tight), the deterministic rounding bound, and the
// statistical bound; worst values kept for the report.
struct Q8Acc {
  double worst_tilde = 0, worst_det = 0, worst_stat = 0;  // |y-ref~|/S~, |y-ref|/det bound, sqrt(k)|y-ref|/S
  void add(float got, const float* w, const float* x, const float* xt, int64_t k) {
    double ref = 0, reft = 0, s = 0, st = 0, det = 0;
    for (int64_t i = 0; i < k; ++i) {
      ref += double(w[i]) * double(x[i]);
      reft += double(w[i]) * double(xt[i]);
      s += std::fabs(double(w[i]) * double(x[i]));
      st += std::fabs(double(w[i]) * double(xt[i]));
    }
    for (int64_t b = 0; b < k; b += 32) {
      double amax = 0, sw = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[b + i]))), sw += std::fabs(double(w[b + i]));
      det += sw * amax / 254.0;
    }
    if (!std::isfinite(got)) {
      worst_tilde = worst_det = worst_stat = 1e30;
      return;
    }
    const double e = std::fabs(double(got) - ref);
    worst_tilde = std::max(worst_tilde, std::fabs(double(got) - reft) / std::max(st, 1e-30));
    worst_det = std::max(worst_det, e / std::max(det + kMvBound * s, 1e-30));
    worst_stat = std::max(worst_stat, e / std::max(s, 1e-30) * std::sqrt(double(k)));
  }
  void expect() const {
    EXPECT_LE(worst_tilde, kMvBound) << "against the reference on the rounded x";
    EXPECT_LE(worst_det, 1.0) << "|y - ref| / (sum |w| d / 2 + 2e-5 S)";
    EXPECT_LE(worst_stat, kQ8Rel) << "sqrt(k) |y - ref| / S";
  }
};

// Sets the mat-vec x path for one scope.
struct XMode {
  explicit XMode(int m) { cu::detail::set_matvec_x_mode(m); }
  ~XMode() { cu::detail::set_matvec_x_mode(0); }
};

struct Case {
  int64_t k, n;
  std::vector<int64_t> ms;
  size_t pad;        // bytes between rows beyond the row size (0: packed)
  bool odd_x;        // x columns k + 1 floats apart, base not 16-byte aligned (scalar x loads)
};

std::vector<Case> cases_for(GgmlType t) {
  const bool kq = k_type(t);
  const size_t pad = t == GgmlType::F32 ? 4 : 2;
  return {
      {kq ? 768 : 800, 77, {1, 2, 3, 5, 8, 9, 16, 64, 257}, 0, false},
      {kq ? 768 : 800, 77, {1, 3, 9, 64}, pad, true},                    // misaligned rows and x
      {kq ? 1280 : 1056, 1025, {1, 5, 16, 64}, 0, false},
      {kq ? 8448 : 8224, 33, {1, 8, 17}, 0, false},                      // several steps per warp
      // k a multiple of 256 for every type (the small-batch mat-mul, mmq.cu, 8 / 16 / 24 / 32 columns
      // per tile row): k split in 2 with a partial last row tile, misaligned rows and x split and not,
      // k split in 4 (more splits than steps in the ring), one step (no split)
      {2048, 130, {1, 9, 24, 33}, 0, false},  // m = 1: rows 16-byte aligned for every type (tensor-map copies)
      {2048, 130, {20}, pad, true},
      {1024, 130, {12, 32}, pad, true},
      {4096, 70, {1, 16, 17}, 0, false},
      {256, 200, {16, 64}, 0, false},
  };
}

// Whether matmul takes the small-batch mat-mul (mmq.cu) for these shapes on this GPU.
bool uses_mmq(const cu::Launch& L, GgmlType t, int64_t k, int64_t n, int64_t m) {
  return cu::detail::mmq_on(L.sm) && cu::detail::mmq_plan(t, k, n, m).ok;
}

std::map<std::string, std::map<std::string, double>> g_report;  // type -> path -> worst error

// mode 1: F32 x everywhere; mode 2: int8 x for the types that have it (only their m <= 16 runs).
void every_type(int mode) {
  Gpu gpu;
  XMode xm(mode);
  uint32_t seed = 1;
  for (GgmlType t : kt::kMatmulTypes) {
    const std::string tn(kiln::gguf::type_name(t));
    SCOPED_TRACE(tn + (mode == 2 ? " int8 x" : " F32 x"));
    ASSERT_TRUE(cu::matmul_supported(t));
    const bool q8 = mode == 2 && cu::detail::matvec_q8_supported(t);
    if (mode == 2 && !q8) continue;
    for (const Case& c : cases_for(t)) {
      const Weights w = make_weights(t, c.k, c.n, c.pad, seed++);
      Dev<uint8_t> dw(w.bytes);
      for (int64_t m : c.ms) {
        cu::Launch L = gpu.launch(cu::matmul_workspace(t, c.k, c.n, m));
        const bool mmq = uses_mmq(L, t, c.k, c.n, m);
        if (q8 && (m > 16 || mmq)) continue;  // int8 x only on the mat-vec path
        SCOPED_TRACE("k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) + " m=" + std::to_string(m) +
                     (c.pad ? " padded rows" : "") + (c.odd_x ? " odd x stride" : "") + (mmq ? " mmq" : ""));
        const int64_t xs = c.odd_x ? c.k + 1 : c.k + 4, ys = c.n + 3, xoff = c.odd_x ? 1 : 0;
        const std::vector<float> x = kt::randv(size_t(xs * m + xoff), seed++);
        Dev<float> dx(x);
        Dev<float> dy(size_t(ys * m));
        cu::matmul(L, t, dw.p, w.stride, c.k, c.n, dx.p + xoff, xs, dy.p, ys, m);
        gpu.sync();
        const std::vector<float> y = dy.down();
        ErrAcc err;
        Q8Acc qa;
        for (int64_t col = 0; col < m; ++col) {
          const float* xc = x.data() + xoff + col * xs;
          const std::vector<float> xt = q8 ? quantize_x_host(xc, c.k) : std::vector<float>();
          for (int64_t r = 0; r < c.n; ++r) {
            if (q8) qa.add(y[size_t(col * ys + r)], w.deq.data() + r * c.k, xc, xt.data(), c.k);
            else err.add(y[size_t(col * ys + r)], w.deq.data() + r * c.k, xc, c.k);
          }
        }
        if (q8) {
          qa.expect();
          auto& rep = g_report[tn];
          rep["q8_tilde"] = std::max(rep["q8_tilde"], qa.worst_tilde);
          rep["q8_det"] = std::max(rep["q8_det"], qa.worst_det);
          rep["q8_stat"] = std::max(rep["q8_stat"], qa.worst_stat);
          continue;
        }
        const bool mv = m <= 16 && !mmq;
        const double bound = mv ? kMvBound : (t == GgmlType::F32 ? kF32GemmBound : kF16GemmBound);
        EXPECT_LE(err.worst, bound);
        double& rep = g_report[tn][mv ? "matvec" : mmq ? "mmq" : "gemm"];
        rep = std::max(rep, err.worst);
      }
    }
  }
}

TEST(CudaMatmul, EveryTypeEveryPath) {
  KILN_REQUIRE_GPU();
  every_type(1);
  every_type(2);
  std::printf("\nworst |y - ref| / sum|w x| per type (bounds: matvec F32 x %.0e, gemm and mmq %.0e F16 / %.0e F32)\n"
              "int8 x: against x~ (bound %.0e), |y - ref| / deterministic bound (<= 1), sqrt(k) |y - ref| / S "
              "(bound %.0e)\n", kMvBound, kF16GemmBound, kF32GemmBound, kMvBound, kQ8Rel);
  for (auto& [tn, m] : g_report) {
    std::printf("  %-7s matvec %.2e  gemm %.2e  mmq %.2e", tn.c_str(), m["matvec"], m["gemm"], m["mmq"]);
    if (m.count("q8_tilde"))
      std::printf("  int8 x: x~ %.2e  det %.3f  stat %.2e", m["q8_tilde"], m["q8_det"], m["q8_stat"]);
    std::printf("\n");
  }
}

// The small-batch mat-mul's (and the mat-vec's) shared-memory ring filled with cp.async instead of
// bulk copies, as on sm_80 / sm_89: the same cases and bounds.
TEST(CudaMatmul, EveryTypeWithoutBulkCopies) {
  KILN_REQUIRE_GPU();
  cu::detail::set_matvec_bulk(false);
  every_type(1);
  cu::detail::set_matvec_bulk(true);
}

// The one-column bulk mat-vec with its per-row bulk copies where the tensor-map copies would be taken
// (rows 16-byte aligned; KILN_CUDA_MV_TMAP=0): the same cases and bounds.
TEST(CudaMatmul, EveryTypeWithoutTensorMaps) {
  KILN_REQUIRE_GPU();
  cu::detail::set_matvec_tmap(false);
  every_type(2);
  cu::detail::set_matvec_tmap(true);
}

// Three int8-x mat-vecs enqueued back to back on one workspace (quantize_x of the next call must not
// overwrite x while the previous kernel reads it, also with programmatic dependent launch).
TEST(CudaMatmul, BackToBackSharedWorkspace) {
  KILN_REQUIRE_GPU();
  Gpu gpu;
  const GgmlType t = GgmlType::Q4_K;
  const int64_t k = 4096, n = 4099;
  const Weights w = make_weights(t, k, n, 0, 77);
  Dev<uint8_t> dw(w.bytes);
  const int64_t ms[3] = {1, 3, 1};
  std::vector<std::vector<float>> xs;
  std::vector<Dev<float>*> dx, dy;
  size_t need = 0;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(kt::randv(size_t(k * ms[i]), 300 + i));
    dx.push_back(new Dev<float>(xs.back()));
    dy.push_back(new Dev<float>(size_t(n * ms[i])));
    need = std::max(need, cu::matmul_workspace(t, k, n, ms[i]));
  }
  cu::Launch L = gpu.launch(need);
  for (int i = 0; i < 3; ++i) cu::matmul(L, t, dw.p, w.stride, k, n, dx[i]->p, k, dy[i]->p, n, ms[i]);
  gpu.sync();
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("call " + std::to_string(i));
    const std::vector<float> y = dy[i]->down();
    Q8Acc qa;
    for (int64_t c = 0; c < ms[i]; ++c) {
      const float* xc = xs[i].data() + c * k;
      const std::vector<float> xt = quantize_x_host(xc, k);
      for (int64_t r = 0; r < n; ++r) qa.add(y[size_t(c * n + r)], w.deq.data() + r * k, xc, xt.data(), k);
    }
    qa.expect();
    delete dx[i];
    delete dy[i];
  }
}

// Dense weights whose k is a multiple of 8 but not of 32 (Qwen3.5's vision FFN: 1152 -> 4304 -> 1152):
// the cuBLAS path, also with the batch-invariant switch on, against the double reference.
TEST(CudaMatmul, DenseOddK) {
  KILN_REQUIRE_GPU();
  Gpu gpu;
  uint32_t seed = 9000;
  for (bool inv : {false, true}) {
    cu::set_batch_invariant(inv);
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
      for (int64_t k : {int64_t(4304), int64_t(1000)}) {
        const int64_t n = 77, m = 40;
        SCOPED_TRACE(std::string(kiln::gguf::type_name(t)) + " k=" + std::to_string(k) + (inv ? " invariant" : ""));
        ASSERT_TRUE(cu::detail::gemm_any_k(t, k, m));
        const Weights w = make_weights(t, k, n, 0, seed++);
        const std::vector<float> x = kt::randv(size_t(k * m), seed++);
        Dev<uint8_t> dw(w.bytes);
        Dev<float> dx(x), dy(size_t(n * m));
        cu::Launch L = gpu.launch(cu::matmul_workspace(t, k, n, m));
        cu::matmul(L, t, dw.p, w.stride, k, n, dx.p, k, dy.p, n, m);
        gpu.sync();
        const std::vector<float> y = dy.down();
        ErrAcc err;
        for (int64_t c = 0; c < m; ++c)
          for (int64_t r = 0; r < n; ++r) err.add(y[size_t(c * n + r)], w.deq.data() + r * k, x.data() + c * k, k);
        EXPECT_LE(err.worst, t == GgmlType::F32 ? kF32GemmBound : kF16GemmBound);
      }
    }
  }
  cu::set_batch_invariant(false);
}

TEST(CudaMatmul, ExpertsAnyTokenCount) {
  KILN_REQUIRE_GPU();
  Gpu gpu;
  const int64_t E = 5, n = 77, K = 3, T = 7;
  double worst_all = 0;
  Q8Acc q8_all;
  for (int mode : {1, 2}) {
    XMode xm(mode);
    uint32_t seed = 1000;
    for (GgmlType t : kt::kMatmulTypes) {
      const std::string tn(kiln::gguf::type_name(t));
      SCOPED_TRACE(tn + (mode == 2 ? " int8 x" : " F32 x"));
      const bool q8 = mode == 2 && cu::detail::matvec_q8_supported(t);
      if (mode == 2 && !q8) continue;
      const int64_t k = k_type(t) ? 512 : 96;
      const Weights w = make_weights(t, k, n * E, 0, seed++);  // experts stacked: expert e = rows [e n, (e+1) n)
      Dev<uint8_t> dw(w.bytes);
      std::mt19937 rng(seed++);
      std::vector<int32_t> ids(size_t(K * T));
      for (auto& v : ids) v = int32_t(rng() % E);
      Dev<int32_t> dids(ids);
      for (int64_t nx : {int64_t(1), K}) {
        SCOPED_TRACE("nx=" + std::to_string(nx));
        const int64_t x_slot = k + 4, x_tok = nx * x_slot, y_slot = n + 3, y_tok = K * y_slot;
        const std::vector<float> x = kt::randv(size_t(x_tok * T), seed++);
        Dev<float> dx(x);
        Dev<float> dy(size_t(y_tok * T));
        cu::Launch L = gpu.launch(cu::matmul_id_workspace(t, k, n, K * T));
        cu::matmul_id(L, t, dw.p, w.stride, w.stride * size_t(n), E, k, n, dx.p, nx, x_slot, x_tok, dids.p, K, T, dy.p,
                      y_slot, y_tok);
        gpu.sync();
        const std::vector<float> y = dy.down();
        ErrAcc err;
        Q8Acc qa;
        for (int64_t tk = 0; tk < T; ++tk)
          for (int64_t j = 0; j < K; ++j) {
            const int64_t e = ids[size_t(tk * K + j)];
            const float* xc = x.data() + tk * x_tok + (nx == 1 ? 0 : j * x_slot);
            const std::vector<float> xt = q8 ? quantize_x_host(xc, k) : std::vector<float>();
            for (int64_t r = 0; r < n; ++r) {
              const float got = y[size_t(tk * y_tok + j * y_slot + r)];
              if (q8) qa.add(got, w.deq.data() + (e * n + r) * k, xc, xt.data(), k);
              else err.add(got, w.deq.data() + (e * n + r) * k, xc, k);
            }
          }
        if (q8) {
          qa.expect();
          q8_all.worst_tilde = std::max(q8_all.worst_tilde, qa.worst_tilde);
          q8_all.worst_det = std::max(q8_all.worst_det, qa.worst_det);
          q8_all.worst_stat = std::max(q8_all.worst_stat, qa.worst_stat);
        } else {
          EXPECT_LE(err.worst, kMvBound);
          worst_all = std::max(worst_all, err.worst);
        }
      }
    }
  }
  std::printf("matmul_id: F32 x: worst |y - ref| / sum|w x| over all types %.2e (bound %.0e); int8 x: x~ %.2e, "
              "det %.3f, stat %.2e\n", worst_all, kMvBound, q8_all.worst_tilde, q8_all.worst_det, q8_all.worst_stat);
}

// matmul_id of a prefill (at least kMmqIdMinSlots slots): the grouped tensor-core path (mmq.cu
// mmq_id) for every block type — skewed routing (one expert takes about half the slots: several
// 32-column tiles; a quarter of the experts get none), nx = 1 and K, a partial last row tile, padded
// rows — against the double reference with the F16 bound of the tensor-core paths; every output
// written (y starts as NaN); the same call again gives the same bits after the routing of another
// call in between.
TEST(CudaMatmul, ExpertsGrouped) {
  KILN_REQUIRE_GPU();
  Gpu gpu;
  if (!cu::detail::mmq_on(gpu.sm)) GTEST_SKIP() << "the small-batch mat-mul is off here (sm < 80 or KILN_CUDA_MMQ=0)";
  const int64_t E = 40, n = 200, K = 8, T = 24, k = 512;
  ASSERT_GE(K * T, cu::detail::kMmqIdMinSlots);
  double worst_all = 0;
  uint32_t seed = 7000;
  int types = 0;
  for (GgmlType t : kt::kMatmulTypes) {
    if (!cu::detail::mmq_type(t)) continue;
    ASSERT_TRUE(cu::detail::mmq_id_plan(t, k, n, K * T).ok);
    ++types;
    const std::string tn(kiln::gguf::type_name(t));
    SCOPED_TRACE(tn);
    const size_t pad = types % 2 == 0 ? size_t(kiln::gguf::type_info(t).type_size) : 0;  // misaligned expert rows
    const Weights w = make_weights(t, k, n * E, pad, seed++);
    Dev<uint8_t> dw(w.bytes);
    std::mt19937 rng(seed++);
    std::vector<int32_t> ids(size_t(K * T)), other(size_t(K * T));
    for (auto& v : ids) v = rng() % 2 ? 3 : int32_t(rng() % 30);
    for (auto& v : other) v = int32_t(rng() % E);
    Dev<int32_t> dids(ids), dother(other);
    for (int64_t nx : {int64_t(1), K}) {
      SCOPED_TRACE("nx=" + std::to_string(nx));
      const int64_t x_slot = k + 4, x_tok = nx * x_slot, y_slot = n + 3, y_tok = K * y_slot;
      const std::vector<float> x = kt::randv(size_t(x_tok * T), seed++);
      Dev<float> dx(x);
      const std::vector<float> nan(size_t(y_tok * T), std::nanf(""));
      Dev<float> dy(nan), dy2(nan), dy3(nan);
      cu::Launch L = gpu.launch(cu::matmul_id_workspace(t, k, n, K * T));
      const size_t ws = w.stride * size_t(n);
      cu::matmul_id(L, t, dw.p, w.stride, ws, E, k, n, dx.p, nx, x_slot, x_tok, dids.p, K, T, dy.p, y_slot, y_tok);
      cu::matmul_id(L, t, dw.p, w.stride, ws, E, k, n, dx.p, nx, x_slot, x_tok, dother.p, K, T, dy3.p, y_slot, y_tok);
      cu::matmul_id(L, t, dw.p, w.stride, ws, E, k, n, dx.p, nx, x_slot, x_tok, dids.p, K, T, dy2.p, y_slot, y_tok);
      gpu.sync();
      const std::vector<float> y = dy.down(), y2 = dy2.down();
      ErrAcc err;
      int64_t differ = 0;
      for (int64_t tk = 0; tk < T; ++tk)
        for (int64_t j = 0; j < K; ++j) {
          const int64_t e = ids[size_t(tk * K + j)];
          const float* xc = x.data() + tk * x_tok + (nx == 1 ? 0 : j * x_slot);
          for (int64_t r = 0; r < n; ++r) {
            const size_t i = size_t(tk * y_tok + j * y_slot + r);
            err.add(y[i], w.deq.data() + (e * n + r) * k, xc, k);
            differ += std::memcmp(&y[i], &y2[i], sizeof(float)) != 0;
          }
        }
      EXPECT_LE(err.worst, kF16GemmBound);
      EXPECT_EQ(differ, 0) << "outputs that differ between two identical calls";
      worst_all = std::max(worst_all, err.worst);
    }
  }
  EXPECT_EQ(types, 10);
  std::printf("matmul_id grouped (%lld slots over %lld experts): worst |y - ref| / sum|w x| %.2e (bound %.0e)\n",
              (long long)(K * T), (long long)E, worst_all, kF16GemmBound);
}

// matmul_n: up to 4 weights sharing one x, against the same reference and bounds as matmul, per
// weight: mixes of types (one segmented int8 launch of 4 of one type; two x orders (IQ4_* pairs vs
// natural) on one workspace; int8 types mixed with F32-x types; legacy types), n = 1..4 (prefixes
// of each mix), m = 1, 3, 8, 9, 16 (two column passes) and 40 (tensor cores), misaligned rows on
// one weight (the segmented launch's alignment falls back), odd x strides, a distinct y stride per
// weight; outputs outside each y (the gaps between columns) must keep their sentinel. Both x modes,
// and programmatic dependent launch on and off.
TEST(CudaMatmul, MatmulNSharedX) {
  KILN_REQUIRE_GPU();
  Gpu gpu;
  struct Mix {
    GgmlType t[4];
    int64_t n[4];
    size_t pad[4];
  };
  const Mix mixes[] = {
      {{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K}, {77, 5, 1025, 33}, {0, 0, 0, 0}},
      {{GgmlType::IQ4_XS, GgmlType::Q4_K, GgmlType::IQ4_XS, GgmlType::Q6_K}, {64, 130, 7, 96}, {0, 0, 2, 0}},
      {{GgmlType::Q8_0, GgmlType::F16, GgmlType::Q8_0, GgmlType::F32}, {48, 33, 1, 50}, {2, 0, 0, 4}},
      {{GgmlType::Q5_0, GgmlType::IQ4_NL, GgmlType::Q4_0, GgmlType::Q5_K}, {9, 40, 300, 21}, {0, 0, 0, 0}},
  };
  const float kSentinel = 1234.5f;
  uint32_t seed = 5000;
  double worst_f32 = 0;
  Q8Acc q8_all;
  for (int mode : {1, 2, 3}) {  // F32 x; int8 x; int8 x without programmatic dependent launch
    XMode xm(mode == 3 ? 2 : mode);
    cu::detail::set_matvec_pdl(mode != 3);
    for (int64_t k : {int64_t(768), int64_t(4352)}) {
      for (const Mix& mix : mixes) {
        Weights w[4] = {make_weights(mix.t[0], k, mix.n[0], mix.pad[0], seed++),
                        make_weights(mix.t[1], k, mix.n[1], mix.pad[1], seed++),
                        make_weights(mix.t[2], k, mix.n[2], mix.pad[2], seed++),
                        make_weights(mix.t[3], k, mix.n[3], mix.pad[3], seed++)};
        std::vector<Dev<uint8_t>*> dw;
        for (const Weights& x : w) dw.push_back(new Dev<uint8_t>(x.bytes));
        for (int64_t m : {int64_t(1), int64_t(3), int64_t(8), int64_t(9), int64_t(16), int64_t(40)}) {
          if (k > 1000 && m != 1 && m != 9 && m != 40) continue;
          const bool odd_x = m == 3 || m == 9;
          const int64_t xs = odd_x ? k + 1 : k + 4, xoff = odd_x ? 1 : 0;
          const std::vector<float> x = kt::randv(size_t(xs * m + xoff), seed++);
          Dev<float> dx(x);
          for (int nw = 1; nw <= 4; ++nw) {
            SCOPED_TRACE("mode " + std::to_string(mode) + " k=" + std::to_string(k) + " m=" + std::to_string(m) +
                         " n_w=" + std::to_string(nw) + " first type " + std::string(kiln::gguf::type_name(mix.t[0])));
            std::vector<Dev<float>*> dy;
            cu::MatmulW ws[4];
            size_t need = 0;
            for (int i = 0; i < nw; ++i) {
              const int64_t ys = mix.n[i] + 3 + i;
              dy.push_back(new Dev<float>(std::vector<float>(size_t(ys * m), kSentinel)));
              ws[i] = cu::MatmulW{mix.t[i], dw[size_t(i)]->p, w[i].stride, mix.n[i], dy.back()->p, ys};
              need = std::max(need, cu::matmul_workspace(mix.t[i], k, mix.n[i], m));
            }
            cu::Launch L = gpu.launch(need);
            cu::matmul_n(L, ws, nw, k, dx.p + xoff, xs, m);
            gpu.sync();
            for (int i = 0; i < nw; ++i) {
              const std::vector<float> y = dy[size_t(i)]->down();
              const int64_t ys = ws[i].y_stride, n = mix.n[i];
              const bool mmq = uses_mmq(L, mix.t[i], k, n, m);
              const bool q8 = mode >= 2 && m <= 16 && !mmq && cu::detail::matvec_q8_supported(mix.t[i]);
              ErrAcc err;
              Q8Acc qa;
              int64_t touched = 0;
              for (int64_t col = 0; col < m; ++col) {
                const float* xc = x.data() + xoff + col * xs;
                const std::vector<float> xt = q8 ? quantize_x_host(xc, k) : std::vector<float>();
                for (int64_t r = 0; r < ys; ++r) {
                  const float got = y[size_t(col * ys + r)];
                  if (r >= n) {
                    touched += got != kSentinel;
                    continue;
                  }
                  if (q8) qa.add(got, w[i].deq.data() + r * k, xc, xt.data(), k);
                  else err.add(got, w[i].deq.data() + r * k, xc, k);
                }
              }
              EXPECT_EQ(touched, 0) << "weight " << i << ": writes outside its rows";
              if (q8) {
                qa.expect();
                q8_all.worst_tilde = std::max(q8_all.worst_tilde, qa.worst_tilde);
                q8_all.worst_det = std::max(q8_all.worst_det, qa.worst_det);
                q8_all.worst_stat = std::max(q8_all.worst_stat, qa.worst_stat);
              } else {
                const bool mv = m <= 16 && !mmq;
                const double bound = mv ? kMvBound : (mix.t[i] == GgmlType::F32 ? kF32GemmBound : kF16GemmBound);
                EXPECT_LE(err.worst, bound) << "weight " << i << " (" << kiln::gguf::type_name(mix.t[i]) << ")"
                                            << (mmq ? " mmq" : "");
                if (mv) worst_f32 = std::max(worst_f32, err.worst);
              }
            }
            for (auto* p : dy) delete p;
          }
        }
        for (auto* p : dw) delete p;
      }
    }
  }
  cu::detail::set_matvec_pdl(true);
  std::printf("matmul_n: mat-vec F32 x worst |y - ref| / sum|w x| %.2e (bound %.0e); int8 x: x~ %.2e (bound %.0e), "
              "det %.3f (<= 1), stat %.2e (bound %.0e)\n",
              worst_f32, kMvBound, q8_all.worst_tilde, kMvBound, q8_all.worst_det, q8_all.worst_stat, kQ8Rel);
}

TEST(CudaMatmul, GetRowsExact) {
  KILN_REQUIRE_GPU();
  Gpu gpu;
  uint32_t seed = 2000;
  const int64_t rows = 50, n = 37;
  for (GgmlType t : kt::kMatmulTypes) {
    const std::string tn(kiln::gguf::type_name(t));
    SCOPED_TRACE(tn);
    for (size_t pad : {size_t(0), size_t(t == GgmlType::F32 ? 4 : 2)}) {
      const int64_t k = k_type(t) ? 768 : 288;
      const Weights w = make_weights(t, k, rows, pad, seed++);
      Dev<uint8_t> dw(w.bytes);
      std::mt19937 rng(seed++);
      std::vector<int32_t> ids(n);
      for (auto& v : ids) v = int32_t(rng() % rows);
      ids[0] = rows - 1;
      Dev<int32_t> dids(ids);
      const int64_t os = k + 3;
      Dev<float> dout(size_t(os * n));
      cu::Launch L = gpu.launch(0);
      cu::get_rows(L, t, dw.p, w.stride, k, dids.p, n, dout.p, os);
      gpu.sync();
      const std::vector<float> out = dout.down();
      int64_t bad = 0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < k; ++i) {
          const float want = w.deq[size_t(ids[r] * k + i)], got = out[size_t(r * os + i)];
          if (std::memcmp(&want, &got, 4) != 0 && !(want == 0.f && got == 0.f)) ++bad;
        }
      EXPECT_EQ(bad, 0) << "elements differing from tensor::dequantize_row (pad " << pad << ")";
    }
  }
}

// ---- timing (KILN_CUDA_BENCH=1) -------------------------------------------------------------------
// Per type and shape: the mat-vec path's time per call (the int8 path's includes quantize_x) and the
// weight bytes it streams per second, F32 x, int8 x, and int8 x without programmatic dependent
// launch, m = 1, 2, 4, 8; the int8 kernel alone at each
// k-split (m = 1); a device-to-device copy for the memory ceiling. KILN_CUDA_BENCH_GEMM=1 adds the
// tensor-core path (m = 512, 2048).
TEST(CudaMatmulBench, Decode) {
  const char* on = std::getenv("KILN_CUDA_BENCH");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "timing only with KILN_CUDA_BENCH=1";
  KILN_REQUIRE_GPU();
  const char* gemm_env = std::getenv("KILN_CUDA_BENCH_GEMM");
  const bool gemm = gemm_env != nullptr && std::string(gemm_env) == "1";
  Gpu gpu;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto elapsed = [&](int reps, auto&& body) {
    for (int i = 0; i < 2; ++i) body(i);
    cudaEventRecord(e0, gpu.stream);
    for (int i = 0; i < reps; ++i) body(i);
    cudaEventRecord(e1, gpu.stream);
    gpu.sync();
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return double(ms) * 1e-3 / reps;
  };
  // Random bytes, 32 MiB repeated (timing only: the arithmetic's speed does not depend on the values).
  const size_t pat = size_t(32) << 20;
  std::vector<uint8_t> host(pat);
  uint64_t st = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < pat; i += 8) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    std::memcpy(host.data() + i, &st, 8);
  }
  {
    const size_t cb = size_t(1) << 30;
    Dev<uint8_t> a(cb), b(cb);
    const double sec = elapsed(10, [&](int) { cudaMemcpyAsync(b.p, a.p, cb, cudaMemcpyDeviceToDevice, gpu.stream); });
    std::printf("BENCH copy 1 GiB device to device: %.1f GB/s (read + write)\n", 2.0 * double(cb) / sec * 1e-9);
  }
  struct Shape {
    int64_t k, n;
  };
  const Shape shapes[] = {{4096, 12288}, {12288, 4096}, {4096, 248320}};
  const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::IQ4_NL,
                            GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16};
  std::printf("BENCH %-6s %5s %6s %2s | %9s %7s | %9s %7s | %9s %7s | %s\n", "type", "k", "n", "m", "F32x us", "GB/s",
              "int8x us", "GB/s", "no PDL us", "GB/s", "int8 kernel alone (m=1) per k-split");
  for (GgmlType t : types)
    for (const Shape& s : shapes) {
      const bool vocab = s.n > 100000;
      const size_t rb = kiln::tensor::row_size(t, s.k), bytes = rb * size_t(s.n);
      // Copies enough to exceed L2 several times.
      const int copies = int(std::max<size_t>(1, (size_t(400) << 20) / bytes + 1));
      std::vector<Dev<uint8_t>*> ws;
      for (int i = 0; i < copies; ++i) {
        ws.push_back(new Dev<uint8_t>(bytes));
        for (size_t o = 0; o < bytes; o += pat)
          ck(cudaMemcpy(ws.back()->p + o, host.data(), std::min(pat, bytes - o), cudaMemcpyHostToDevice), "fill");
      }
      const int64_t mmax = gemm && !vocab ? 2048 : 32;
      const std::vector<float> xh = kt::randv(size_t(s.k * mmax), 3);
      Dev<float> x(xh);
      Dev<float> y(size_t(s.n * mmax));
      const int reps = vocab ? 20 : 100;
      auto time_it = [&](int64_t m, int r) {
        cu::Launch L = gpu.launch(cu::matmul_workspace(t, s.k, s.n, m));
        return elapsed(r, [&](int i) { cu::matmul(L, t, ws[i % copies]->p, rb, s.k, s.n, x.p, s.k, y.p, s.n, m); });
      };
      const char* tn = kiln::gguf::type_name(t).data();
      const bool q8 = cu::detail::matvec_q8_supported(t);
      for (int64_t m : {1, 2, 4, 8}) {
        double sec[3] = {0, 0, 0};  // F32 x, int8 x, int8 x without programmatic dependent launch
        for (int mode : {1, 2, 3}) {
          if (mode >= 2 && !q8) continue;
          XMode xm(mode == 3 ? 2 : mode);
          if (mode == 3) cu::detail::set_matvec_pdl(false);
          sec[mode - 1] = time_it(m, reps);
          if (mode == 3) cu::detail::set_matvec_pdl(true);
        }
        std::printf("BENCH %-6s %5lld %6lld %2lld | %9.2f %7.1f", tn, (long long)s.k, (long long)s.n, (long long)m,
                    sec[0] * 1e6, double(bytes) / sec[0] * 1e-9);
        if (q8)
          std::printf(" | %9.2f %7.1f | %9.2f %7.1f", sec[1] * 1e6, double(bytes) / sec[1] * 1e-9, sec[2] * 1e6,
                      double(bytes) / sec[2] * 1e-9);
        if (q8 && m == 1) {
          // The int8 kernel alone at each k-split (the launcher picks one from n and the GPU's size).
          namespace dt = cu::detail;
          cu::Launch L = gpu.launch(cu::matmul_workspace(t, s.k, s.n, 1));
          dt::quantize_x(x.p, s.k, 0, 1, s.k, 1, dt::matvec_q8_x_layout(t), L.ws, false, gpu.stream);
          std::printf(" |");
          for (int ks : {1, 2, 4}) {
            dt::MvArgs a;
            a.w_stride = rb, a.k = s.k, a.n = s.n, a.x = x.p, a.x_stride = s.k, a.y = y.p, a.y_stride = s.n;
            a.m = 1, a.ks = ks, a.xv = true, a.bulk = dt::matvec_bulk(gpu.sm);
            a.xq = static_cast<const int8_t*>(L.ws);
            a.xs = static_cast<const uint8_t*>(L.ws) + dt::q8_x_meta_offset(s.k, 1);
            const double t1 = elapsed(reps, [&](int i) {
              a.w = ws[i % copies]->p;
              if (!dt::matvec_q8_kquant(t, a, 1, gpu.stream)) dt::matvec_q8_legacy(t, a, 1, gpu.stream);
            });
            std::printf(" ks%d %.2f us %.0f GB/s", ks, t1 * 1e6, double(bytes) / t1 * 1e-9);
          }
        }
        std::printf("\n");
      }
      // Batched decode: the small-batch mat-mul (mmq.cu) against the paths before it (two int8 mat-vec
      // passes up to 16 columns, else W dequantized to F16 for cuBLAS).
      if (cu::detail::mmq_plan(t, s.k, s.n, 16).ok)
        for (int64_t m : {9, 16, 24, 32}) {
          double sec[3];  // before, mmq with bulk copies, mmq with cp.async (the sm_80 / sm_89 ring)
          for (int v : {1, 2, 0}) {
            cu::detail::set_mmq(v != 0);
            cu::detail::set_matvec_bulk(v != 2);
            sec[v] = time_it(m, vocab ? 5 : 20);
          }
          cu::detail::set_mmq(true);
          cu::detail::set_matvec_bulk(true);
          std::printf("BENCH batched %-6s %5lld %6lld m=%-3lld | mmq %8.2f us %7.1f GB/s | cp.async %8.2f us | before "
                      "%8.2f us %7.1f GB/s | %.2fx\n",
                      tn, (long long)s.k, (long long)s.n, (long long)m, sec[1] * 1e6, double(bytes) / sec[1] * 1e-9,
                      sec[2] * 1e6, sec[0] * 1e6, double(bytes) / sec[0] * 1e-9, sec[0] / sec[1]);
        }
      if (gemm && !vocab)
        for (int64_t m : {512, 2048}) {
          const double sec = time_it(m, 5);
          std::printf("BENCH %-6s k=%-5lld n=%-6lld m=%-4lld %8.2f us  %7.1f TFLOP/s\n", tn, (long long)s.k,
                      (long long)s.n, (long long)m, sec * 1e6, 2.0 * double(s.k) * double(s.n) * double(m) / sec * 1e-12);
        }
      for (auto* p : ws) delete p;
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

#else  // !KILN_HAVE_CUDA

TEST(CudaMatmul, NotBuilt) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF or no nvcc)"; }

#endif
