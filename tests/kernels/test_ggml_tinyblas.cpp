// ggml's F32 / F16 / BF16 weight mat-mul on the AVX-512 table (x86_kernels.inc float_mm_ggml512,
// reached through kernels::matmul) against scalar emulations (here and in ggml_emul.h):
//  - X rounded to the weight type's ggml vec_dot_type (F16 / BF16, nearest even; F32 as is);
//  - llamafile tinyBLAS's order when the weight has a multiple of 4 rows and k is a multiple of its
//    vector step (16; 32 for BF16 through vdpbf16ps), for every column count;
//  - otherwise ggml_vec_dot_f32 / _f16 / _bf16's order (as GCC compiles them).
// Each case is checked bit for bit (memcmp) against the emulation and for accuracy (NMSE) against a
// double-precision product of the same rounded operands. Like test_ggml_order.cpp this file is built
// without -mfma: every fused operation is an explicit std::fma, and the 16-lane reduction is GCC's
// _mm512_reduce_add_ps order emulated.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp16.h"
#include "ggml_emul.h"
#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

bool bf16_dp() { return cpu_features().avx512bf16; }

// reduce16, vec_dot_f32_emul and vec_dot_f16_emul (ggml_vec_dot_f32 / _f16's orders): ggml_emul.h.

// vdpbf16ps, one lane: acc + odd product (rounded), + even product (rounded); denormal inputs read
// as zero, denormal results flushed (probed on the hardware: 3.2M random lanes, normal and tiny).
float ftz(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.f, x) : x; }
float dpbf16_lane(float acc, float w0, float x0, float w1, float x1) {
  const float p0 = ftz(ftz(w0) * ftz(x0)), p1 = ftz(ftz(w1) * ftz(x1));
  return ftz(ftz(ftz(acc) + p1) + p0);
}

// The activation column as ggml's vec_dot_type, read back as floats (exact).
std::vector<float> round_act(GgmlType t, const float* x, int64_t k) {
  std::vector<float> r(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    r[size_t(i)] = t == GgmlType::F16 ? fp16_to_f32(f32_to_fp16(x[i])) : t == GgmlType::BF16 ? bf16_to_f32(f32_to_bf16(x[i])) : x[i];
  return r;
}

// tinyBLAS step KN for the weight type on this host.
int64_t tiny_step(GgmlType t) { return t == GgmlType::BF16 && bf16_dp() ? 32 : 16; }

float tiny_emul(GgmlType t, const float* w, const float* x, int64_t k) {
  float acc[16] = {};
  if (t == GgmlType::BF16 && bf16_dp()) {
    for (int64_t l = 0; l < k; l += 32)
      for (int i = 0; i < 16; ++i) acc[i] = dpbf16_lane(acc[i], w[l + 2 * i], x[l + 2 * i], w[l + 2 * i + 1], x[l + 2 * i + 1]);
  } else {
    for (int64_t l = 0; l < k; l += 16)
      for (int i = 0; i < 16; ++i) acc[i] = std::fma(w[l + i], x[l + i], acc[i]);
  }
  return reduce16(acc);
}

// ggml_vec_dot_bf16: AVX512_BF16: two vdpbf16ps chains over steps of 64; else two FMA chains over
// steps of 32. Each reduced, summed in double, the tail added in double.
float vec_bf16_emul(const float* w, const float* x, int64_t n) {
  float c1[16] = {}, c2[16] = {};
  int64_t i = 0;
  if (bf16_dp()) {
    for (; i + 64 <= n; i += 64)
      for (int l = 0; l < 16; ++l) {
        c1[l] = dpbf16_lane(c1[l], w[i + 2 * l], x[i + 2 * l], w[i + 2 * l + 1], x[i + 2 * l + 1]);
        c2[l] = dpbf16_lane(c2[l], w[i + 32 + 2 * l], x[i + 32 + 2 * l], w[i + 33 + 2 * l], x[i + 33 + 2 * l]);
      }
  } else {
    for (; i + 32 <= n; i += 32)
      for (int l = 0; l < 16; ++l) {
        c1[l] = std::fma(w[i + l], x[i + l], c1[l]);
        c2[l] = std::fma(w[i + 16 + l], x[i + 16 + l], c2[l]);
      }
  }
  double sum = double(reduce16(c1));
  sum += double(reduce16(c2));
  for (; i < n; ++i) sum += double(w[i] * x[i]);
  return float(sum);
}

float vec_emul(GgmlType t, const float* w, const float* x, int64_t n) {
  return t == GgmlType::F32 ? vec_dot_f32_emul(w, x, n) : t == GgmlType::F16 ? vec_dot_f16_emul(w, x, n) : vec_bf16_emul(w, x, n);
}

struct Case {
  GgmlType t;
  int64_t k, n;  // n: weight rows
};

// Runs matmul (AVX-512 table) for m columns at 1 and 2 threads and checks every output against the
// emulation (bit for bit) and the double product of the rounded operands (NMSE <= 1e-10).
void check_case(const Case& c, int64_t m, bool expect_tiny, bool expert = false) {
  const int64_t k = c.k, n = c.n;
  const size_t stride = tensor::row_size(c.t, k) + 64;
  const auto f = randv(size_t(k * n), uint32_t(k * 13 + n), -1.f, 1.f);
  const auto w = weight_rows(c.t, f.data(), k, n, stride, 0xCD);
  std::vector<float> wf(size_t(k * n));  // the stored weights as floats
  for (int64_t j = 0; j < n; ++j) tensor::dequantize_row(c.t, w.data() + stride * size_t(j), wf.data() + k * j, k);
  const int64_t xs = k + 5, ys = n + 3;
  auto x = randv(size_t(xs * m), uint32_t(m * 7 + k), -2.f, 2.f);
  // Large-magnitude spread: a few entries far from the rest make the summation order visible.
  for (size_t i = 0; i < x.size(); i += 37) x[i] *= 300.f;
  std::vector<float> want(size_t(ys * m), 0.f);
  std::vector<double> exact(size_t(ys * m), 0.0);
  for (int64_t col = 0; col < m; ++col) {
    const auto xr = round_act(c.t, x.data() + col * xs, k);
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = wf.data() + k * j;
      want[size_t(col * ys + j)] = expect_tiny ? tiny_emul(c.t, wr, xr.data(), k) : vec_emul(c.t, wr, xr.data(), k);
      double e = 0;
      for (int64_t i = 0; i < k; ++i) e += double(wr[i]) * xr[size_t(i)];
      exact[size_t(col * ys + j)] = e;
    }
  }
  std::vector<float> exact_f(exact.begin(), exact.end());
  AlignedWs ws(matmul_workspace(c.t, k, m, 2));
  ThreadPool p1(1), p2(2);
  for (ThreadPool* pool : {&p1, &p2}) {
    std::vector<float> got(size_t(ys * m), 0.f);
    matmul(matmul_args(c.t, w.data(), stride, k, n, m, x.data(), xs, got.data(), ys, expert), ws.p, *pool);
    for (int64_t col = 0; col < m; ++col)
      for (int64_t j = 0; j < n; ++j) {
        const size_t o = size_t(col * ys + j);
        ASSERT_EQ(std::memcmp(&got[o], &want[o], 4), 0)
            << gguf::type_name(c.t) << " k " << k << " rows " << n << " m " << m << " threads " << pool->size()
            << (expect_tiny ? " tinyBLAS" : " vec_dot") << " column " << col << " row " << j << ": " << got[o]
            << " vs " << want[o] << " (double " << exact[o] << ")";
      }
    for (int64_t col = 0; col < m; ++col)
      for (int64_t j = n; j < ys; ++j) ASSERT_EQ(got[size_t(col * ys + j)], 0.f);  // nothing outside [n, m]
    EXPECT_LE(nmse(got, exact_f), 1e-10) << gguf::type_name(c.t) << " k " << k << " rows " << n << " m " << m;
  }
}

bool have_avx512() { return isa_supported(CpuIsa::Avx512); }

}  // namespace

TEST(GgmlTinyBlas, ActivationRoundingBitExact) {
  if (!have_avx512()) GTEST_SKIP() << "host lacks AVX-512 (F/BW/VL/DQ/VNNI): the ggml float mat-mul is AVX-512 only";
  const cpu::Table* T = cpu::table_for(CpuIsa::Avx512);
  ASSERT_NE(T, nullptr);
  // Ties in both formats, denormals, values that overflow F16, inf, NaN, +-0, then random values;
  // 16-wide bodies and a scalar tail (k = 77).
  std::vector<float> x;
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f801000u, 0x3f803000u, 0x00000001u, 0x80400000u, 0x387fc000u,
                     0x33000000u, 0x477ff000u, 0x477fe000u, 0x7f7fffffu, 0xff800000u, 0x7fc00001u, 0xffbfffffu,
                     0x80000000u, 0x00000000u, 0x7f7f8000u, 0x3f7fffffu})
    x.push_back(bits_to_f32(u));
  const auto r = randv(59, 5, -70000.f, 70000.f);
  x.insert(x.end(), r.begin(), r.end());
  const int64_t k = int64_t(x.size());
  for (int64_t n : {k, int64_t(16), int64_t(5)})
    for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
      ASSERT_NE(T->ggml_float_act[cpu::type_index(t)], nullptr);
      std::vector<uint16_t> got(size_t(n) + 1, 0x5a5a);
      T->ggml_float_act[cpu::type_index(t)](x.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = t == GgmlType::F16 ? f32_to_fp16(x[size_t(i)]) : f32_to_bf16(x[size_t(i)]);
        EXPECT_EQ(got[size_t(i)], want) << gguf::type_name(t) << " n " << n << " x[" << i << "] = " << std::hexfloat
                                        << x[size_t(i)];
      }
      EXPECT_EQ(got[size_t(n)], 0x5a5a) << "wrote past n";
    }
}

TEST(GgmlTinyBlas, TinyBlasOrderBitExact) {
  if (!have_avx512()) GTEST_SKIP() << "host lacks AVX-512 (F/BW/VL/DQ/VNNI): the ggml float mat-mul is AVX-512 only";
  IsaGuard g;
  ASSERT_TRUE(set_isa(CpuIsa::Avx512));
  // rows % 4 == 0 and k % step == 0: tinyBLAS for every column count, m = 1 included.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (const Case& c : {Case{t, 256, 24}, Case{t, 64, 4}, Case{t, 576, 12}})
      for (int64_t m : {1, 2, 3, 4, 5, 9}) check_case(c, m, true);
}

TEST(GgmlTinyBlas, VecDotOrderBitExact) {
  if (!have_avx512()) GTEST_SKIP() << "host lacks AVX-512 (F/BW/VL/DQ/VNNI): the ggml float mat-mul is AVX-512 only";
  IsaGuard g;
  ASSERT_TRUE(set_isa(CpuIsa::Avx512));
  // Rows not a multiple of 4, or k not a multiple of the tinyBLAS step: ggml_vec_dot_* order.
  // The k values cover every tail shape of vec_dot_f32 (16s, an 8, scalar FMAs) and n < 64.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    for (int64_t k : {256, 320, 1000, 47, 8, 88})
      for (int64_t m : {1, 3}) check_case(Case{t, k, 37}, m, false);
    for (int64_t k : {200, 72, 1000, 40})  // k % 16 != 0 with rows % 4 == 0
      for (int64_t m : {1, 2}) check_case(Case{t, k, 8}, m, false);
  }
  // MoE experts (MatmulArgs::expert, llama.cpp's mul_mat_id): vec_dot order whatever the shape.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (int64_t m : {1, 2, 5}) check_case(Case{t, 256, 24}, m, false, true);
  // BF16 with vdpbf16ps: k a multiple of 16 but not 32 leaves tinyBLAS (step 32).
  if (bf16_dp()) check_case(Case{GgmlType::BF16, 272, 8}, 2, false);
  else check_case(Case{GgmlType::BF16, 272, 8}, 2, true);
  ASSERT_EQ(tiny_step(GgmlType::F32), 16);
}

TEST(GgmlTinyBlas, ColumnsEqualSingleColumnCalls) {
  if (!have_avx512()) GTEST_SKIP() << "host lacks AVX-512 (F/BW/VL/DQ/VNNI): the ggml float mat-mul is AVX-512 only";
  IsaGuard g;
  ASSERT_TRUE(set_isa(CpuIsa::Avx512));
  ThreadPool p1(1), p2(2);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (int64_t n : {int64_t(40), int64_t(37)}) {  // tinyBLAS and vec_dot orders
      const int64_t k = 512, m_max = 21, xs = k + 8;
      const size_t rs = tensor::row_size(t, k);
      const auto w = weight_rows(t, randv(size_t(k * n), 3).data(), k, n);
      const auto x = randv(size_t(xs * m_max), 9, -3.f, 3.f);
      AlignedWs ws(matmul_workspace(t, k, m_max, 2));
      std::vector<float> solo(size_t(n * m_max));
      for (int64_t c = 0; c < m_max; ++c) {
        MatmulArgs a{t, w.data(), rs, k, n, 1, x.data() + c * xs, k, solo.data() + c * n, n};
        matmul(a, ws.p, p1);
      }
      for (ThreadPool* pool : {&p1, &p2})
        for (int64_t m : {2, 3, 4, 5, 8, 21}) {
          std::vector<float> y(size_t(n * m));
          MatmulArgs a{t, w.data(), rs, k, n, m, x.data() + (m_max - m) * xs, xs, y.data(), n};
          matmul(a, ws.p, *pool);
          ASSERT_EQ(std::memcmp(y.data(), solo.data() + (m_max - m) * n, y.size() * 4), 0)
              << gguf::type_name(t) << " rows " << n << " m " << m << " threads " << pool->size();
        }
    }
}
