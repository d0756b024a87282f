// Dispatched matmul / get_rows (every weight type x every ISA this CPU has) against the scalar
// reference (kernels/ref: dequantize the row with tensor's reference, dot in double), and, for the
// integer paths, against a second oracle: dequantized weights . activations quantized the way
// ggml's x86 CPU backend quantizes them (written here, scalar), summed in double.
#include <algorithm>
#include <cstring>

#include "core/fp16.h"

#include "kernel_test_util.h"
#include "kernels/ref/ref.h"
#include "tensor/blocks.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Tolerance (NMSE vs the exact product of the dequantized weights). Float weights: only the
// summation order differs. Quantized weights: the fast paths quantize X to 8 bits per 32
// (relative error ~ 1/254 per element): measured NMSE ~1.2e-5 for every type, bound 1e-4
// (test-backend-ops uses 5e-4).
double tolerance(GgmlType t) { return is_float(t) ? 1e-10 : 1e-4; }
// The AVX-512 table multiplies F16 / BF16 weights as ggml does, with X rounded to F16 / BF16 first
// (relative error <= 2^-11 / 2^-8 per element): measured NMSE vs the exact product ~1e-7 (F16) and
// ~5e-6 (BF16); against the product with the rounded X only the summation order differs (1e-10).
bool rounds_x(GgmlType t, CpuIsa isa) { return isa == CpuIsa::Avx512 && (t == GgmlType::F16 || t == GgmlType::BF16); }
double rounded_x_tolerance(GgmlType t) { return t == GgmlType::F16 ? 1e-6 : 1e-4; }
// Against the ggml-activation oracle only the float accumulation order differs: measured NMSE
// ~1e-14; one activation rounded differently per block (e.g. half away from zero instead of half
// to even, or an fp32 instead of an fp16 scale) gives >= ~1e-8.
constexpr double kGgmlActTolerance = 1e-11;

// ggml's vec_dot_type for each weight type.
GgmlType act_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: return GgmlType::Q8_1;
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: return GgmlType::Q8_0;
    default: return GgmlType::Q8_K;
  }
}

// Round half to even, independently of the FPU mode.
double round_even(double v) {
  const double f = std::floor(v), r = v - f;
  if (r > 0.5) return f + 1;
  if (r < 0.5) return f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

// One column quantized as ggml does for activation type at, returned dequantized (xq[i] = d * q[i],
// double) plus, for Q8_1, the per-32 s = fp16(d * sum q) ggml uses for the weight offset term.
// Q8_0/Q8_1 follow ggml's AVX2 quantize_row_q8_0/q8_1: d = fp16(amax/127), multiplier 127/amax,
// half to even. Q8_K: ggml's reference (tensor's quantize_row, which ggml's x86 backend also uses).
void ggml_quantize(GgmlType at, const float* x, int64_t k, std::vector<double>& xq, std::vector<double>& s) {
  xq.assign(size_t(k), 0.0);
  s.assign(size_t(k / 32), 0.0);
  if (at == GgmlType::Q8_K) {
    std::vector<tensor::BlockQ8_K> b(size_t(k / 256));
    tensor::quantize_row(GgmlType::Q8_K, x, b.data(), k);
    for (int64_t i = 0; i < k; ++i) xq[size_t(i)] = double(b[size_t(i / 256)].d) * b[size_t(i / 256)].qs[i % 256];
    return;
  }
  for (int64_t blk = 0; blk < k / 32; ++blk) {
    const float* xb = x + 32 * blk;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    const double dh = fp16_to_f32(f32_to_fp16(d));
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = int(round_even(double(xb[i] * id)));
      sum += q;
      xq[size_t(32 * blk + i)] = dh * q;
    }
    s[size_t(blk)] = fp16_to_f32(f32_to_fp16(d * float(sum)));
  }
}

// y[c * y_stride + j] = row j . column c with ggml's activations; Q4_1 / Q5_1 take the offset term
// m_w * s_x per block (ggml's formula) instead of m_w * sum(xq).
void ggml_act_matmul(const MatmulArgs& a, std::vector<double>& y) {
  const GgmlType at = act_type(a.wt);
  const bool q81 = at == GgmlType::Q8_1;
  const size_t moff = 2;  // BlockQ4_1 / BlockQ5_1: fp16 d, fp16 m
  y.assign(size_t(a.m * a.y_stride), 0.0);
  std::vector<float> row(size_t(a.k));
  std::vector<double> xq, s;
  for (int64_t c = 0; c < a.m; ++c) {
    ggml_quantize(at, a.x + c * a.x_stride, a.k, xq, s);
    for (int64_t j = 0; j < a.n; ++j) {
      const auto* wr = static_cast<const uint8_t*>(a.w) + size_t(j) * a.w_stride;
      tensor::dequantize_row(a.wt, wr, row.data(), a.k);
      const size_t bsz = q81 ? tensor::row_size(a.wt, 32) : 0;
      double acc = 0;
      for (int64_t b = 0; b < a.k / 32; ++b) {
        double m = 0, dot = 0, sx = 0;
        if (q81) {
          uint16_t h;
          std::memcpy(&h, wr + size_t(b) * bsz + moff, 2);
          m = fp16_to_f32(h);
        }
        for (int i = 0; i < 32; ++i) {
          dot += double(row[size_t(32 * b + i)]) * xq[size_t(32 * b + i)];
          sx += xq[size_t(32 * b + i)];
        }
        acc += q81 ? dot - m * sx + m * s[size_t(b)] : dot;
      }
      y[size_t(c * a.y_stride + j)] = acc;
    }
  }
}

std::vector<uint8_t> make_weights(GgmlType t, int64_t k, int64_t n, size_t stride, uint32_t seed) {
  std::vector<uint8_t> w(stride * size_t(n), 0xAB);  // padding bytes between rows are garbage
  const auto f = randv(size_t(k * n), seed);
  for (int64_t j = 0; j < n; ++j) {
    if (t == GgmlType::F32) std::memcpy(w.data() + stride * j, f.data() + k * j, size_t(k) * 4);
    else tensor::quantize_row(t, f.data() + k * j, w.data() + stride * size_t(j), k);
  }
  return w;
}

void check_matmul(GgmlType t, int64_t k, int64_t n, int64_t m, ThreadPool& pool, const std::vector<float>* xin = nullptr) {
  const size_t rs = tensor::row_size(t, k);
  const size_t stride = rs + 16;  // rows not packed: exercises w_stride
  const auto w = make_weights(t, k, n, stride, uint32_t(k * 7 + n));
  const int64_t xs = k + 3, ys = n + 5;
  const auto x = xin ? *xin : randv(size_t(xs * m), uint32_t(m + 11));
  MatmulArgs a{t, w.data(), stride, k, n, m, x.data(), xs, nullptr, ys};
  std::vector<float> want(size_t(ys * m), 0.f), got(size_t(ys * m), 0.f);
  a.y = want.data();
  ref::matmul(a);
  std::vector<double> want_ggml;
  std::vector<float> want_ggml_f;
  // F16 / BF16 weights: the product with X rounded to the weight type (ggml's vec_dot_type).
  std::vector<float> want_rx;
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    std::vector<float> xr(x);
    for (float& v : xr) v = t == GgmlType::F16 ? fp16_to_f32(f32_to_fp16(v)) : bf16_to_f32(f32_to_bf16(v));
    want_rx.assign(size_t(ys * m), 0.f);
    MatmulArgs ar = a;
    ar.x = xr.data();
    ar.y = want_rx.data();
    ref::matmul(ar);
  }
  if (!is_float(t)) {
    ggml_act_matmul(a, want_ggml);
    want_ggml_f.assign(want_ggml.begin(), want_ggml.end());
  }
  AlignedWs ws(matmul_workspace(t, k, m, pool.size()));
  for (CpuIsa isa : isas()) {
    ASSERT_TRUE(set_isa(isa));
    std::fill(got.begin(), got.end(), 0.f);
    a.y = got.data();
    matmul(a, ws.p, pool);
    const double e = nmse(got, want);
    if (!xin) {
      EXPECT_LE(e, rounds_x(t, isa) ? rounded_x_tolerance(t) : tolerance(t))
          << gguf::type_name(t) << " isa " << isa_name(isa) << " k " << k << " n " << n << " m " << m;
    }
    if (rounds_x(t, isa)) {
      EXPECT_LE(nmse(got, want_rx), tolerance(t))
          << "vs X rounded to " << gguf::type_name(t) << ": isa " << isa_name(isa) << " k " << k << " n " << n << " m " << m;
    }
    // The SIMD ISAs take the integer path for every quantized type (Scalar dequantizes).
    if (!is_float(t) && isa != CpuIsa::Scalar) {
      const double eg = nmse(got, want_ggml_f);
      EXPECT_LE(eg, kGgmlActTolerance) << "vs ggml activations: " << gguf::type_name(t) << " isa " << isa_name(isa)
                                       << " k " << k << " n " << n << " m " << m;
    }
    // Nothing written outside the [n, m] window (the y_stride padding stays 0).
    for (int64_t c = 0; c < m; ++c)
      for (int64_t j = n; j < ys; ++j) ASSERT_EQ(got[size_t(c * ys + j)], 0.f);
  }
}

}  // namespace

TEST(Matmul, EveryTypeEveryIsaMatVec) {
  IsaGuard g;
  ThreadPool pool(3);
  for (GgmlType t : kMatmulTypes) check_matmul(t, 512, 37, 1, pool);  // 37 rows: uneven thread split
}

TEST(Matmul, EveryTypeEveryIsaSmallBatch) {
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : kMatmulTypes) check_matmul(t, 768, 19, 5, pool);
}

TEST(Matmul, ManyTokens513) {
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16}) check_matmul(t, 256, 24, 513, pool);
}

TEST(Matmul, SingleRowAndSingleBlockFewColumns) {
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : kMatmulTypes)
    for (int64_t m : {1, 2, 3, 4}) check_matmul(t, 256, 1, m, pool);  // every column-group width
}

TEST(Matmul, OddBlockCountLegacyTypes) {
  // 11 blocks of 32: the kernels' two-chain unrolling leaves a tail block.
  IsaGuard g;
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::IQ4_NL})
    for (int64_t m : {1, 2, 3}) check_matmul(t, 352, 13, m, pool);
}

TEST(Matmul, ActivationTiesRoundHalfToEven) {
  // Blocks whose max |x| is 127 (multiplier exactly 1) and whose other entries are +-(j + 0.5): every
  // activation is a rounding tie; half to even (ggml) and half away from zero differ on half of them.
  IsaGuard g;
  ThreadPool pool(2);
  const int64_t k = 512, m = 2, xs = k + 3;
  std::vector<float> x(size_t(xs * m), 0.f);
  for (int64_t c = 0; c < m; ++c)
    for (int64_t i = 0; i < k; ++i)
      x[size_t(c * xs + i)] = i % 32 == 5 ? 127.f : float((i * 7 + c) % 41 - 20) + (i % 2 ? 0.5f : -0.5f);
  for (GgmlType t : kMatmulTypes)
    if (!is_float(t)) check_matmul(t, k, 9, m, pool, &x);
}

TEST(GetRows, EveryTypeEveryIsa) {
  IsaGuard g;
  ThreadPool pool(3);
  const int64_t k = 256, n_rows = 11;
  const int32_t ids[] = {3, 0, 10, 3, 7};
  for (GgmlType t : kMatmulTypes) {
    const size_t rs = tensor::row_size(t, k);
    const auto w = make_weights(t, k, n_rows, rs, 9);
    std::vector<float> want(5 * k), got(5 * k);
    ref::get_rows(t, w.data(), rs, n_rows, k, ids, 5, want.data(), k);
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(set_isa(isa));
      get_rows(t, w.data(), rs, n_rows, k, ids, 5, got.data(), k, pool);
      EXPECT_EQ(got, want) << gguf::type_name(t) << " " << isa_name(isa);  // dequantization is exact
    }
  }
}
