// Reference quantize/dequantize (tensor/quant.h, tensor/dtype.h): geometry, exactness where
// the format guarantees it, error bounds on Gaussian data (the bounds are the ones documented
// in docs/formats.md), special inputs, and no NaN/Inf from finite input.
// Bit-exactness against an independent implementation (gguf-py) is tests/py/test_dequant_oracle.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "gguf/types.h"
#include "tensor/blocks.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace {
using kiln::gguf::GgmlType;
using namespace kiln::tensor;

std::vector<GgmlType> all_types() {
  std::vector<GgmlType> v;
  for (const auto& t : all_dtype_traits()) v.push_back(t.type);
  return v;
}
std::vector<GgmlType> block_types() {
  std::vector<GgmlType> v;
  for (const auto& t : all_dtype_traits())
    if (t.block_size > 1) v.push_back(t.type);
  return v;
}
std::string name(GgmlType t) { return std::string(kiln::gguf::type_name(t)); }

// Deterministic standard normal values (Box-Muller on mt19937 bits; no libstdc++ distribution).
std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  auto u01 = [&] { return (static_cast<double>(rng()) + 0.5) / 4294967296.0; };
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(u01())), th = 2.0 * M_PI * u01();
    v[i] = static_cast<float>(r * std::cos(th)) * sigma;
    if (i + 1 < n) v[i + 1] = static_cast<float>(r * std::sin(th)) * sigma;
  }
  return v;
}

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}
std::vector<float> dequantize(GgmlType t, const std::vector<uint8_t>& q, size_t n) {
  EXPECT_EQ(q.size(), row_size(t, static_cast<int64_t>(n)));
  std::vector<float> y(n);
  dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
  return y;
}

// sqrt(mean((y-x)^2)) / sqrt(mean(x^2))
double nrmse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    s += double(x[i]) * x[i];
  }
  return s > 0 ? std::sqrt(e / s) : std::sqrt(e);
}

size_t count_nonfinite(const std::vector<float>& y) {
  size_t c = 0;
  for (float v : y) c += !std::isfinite(v);
  return c;
}

// Documented bounds (docs/formats.md): normalized RMSE of quantize -> dequantize on N(0,1)
// data, 64 Ki values. Measured values are ~10% below these.
const std::map<GgmlType, double> kNrmseBound = {
    {GgmlType::F32, 0.0},       {GgmlType::F16, 3.0e-4},    {GgmlType::BF16, 2.4e-3},
    {GgmlType::Q8_0, 6.0e-3},   {GgmlType::Q8_K, 7.5e-3},   {GgmlType::Q6_K, 1.85e-2},
    {GgmlType::Q5_0, 4.7e-2},   {GgmlType::Q5_1, 4.2e-2},   {GgmlType::Q5_K, 3.9e-2},
    {GgmlType::Q4_0, 9.5e-2},   {GgmlType::Q4_1, 8.6e-2},   {GgmlType::Q4_K, 7.8e-2},
    {GgmlType::IQ4_NL, 8.1e-2}, {GgmlType::IQ4_XS, 8.2e-2}, {GgmlType::Q3_K, 1.58e-1},
    {GgmlType::Q2_K, 2.95e-1},
};

TEST(QuantTraits, TableMatchesGgufGeometry) {
  const std::vector<std::string> expected = {"F32",  "F16",  "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",   "Q2_K",
                                             "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "BF16"};
  std::vector<std::string> got;
  uint32_t prev_id = 0;
  for (const auto& t : all_dtype_traits()) {
    got.emplace_back(t.name);
    const auto& ti = kiln::gguf::type_info(t.type);
    EXPECT_EQ(t.name, ti.name);
    EXPECT_EQ(t.block_size, ti.block_size) << t.name;
    EXPECT_EQ(t.type_size, ti.type_size) << t.name;
    EXPECT_DOUBLE_EQ(t.bits_per_weight, 8.0 * ti.type_size / ti.block_size);
    EXPECT_TRUE(has_reference(t.type));
    EXPECT_EQ(dtype_traits(t.type), &t);
    EXPECT_GE(static_cast<uint32_t>(t.type), prev_id) << "table not in type-id order";
    prev_id = static_cast<uint32_t>(t.type);
    EXPECT_NE(t.dequantize_row, nullptr);
    EXPECT_NE(t.quantize_row, nullptr);
  }
  EXPECT_EQ(got, expected);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::IQ2_XXS, GgmlType::IQ3_S, GgmlType::TQ1_0, GgmlType::MXFP4,
                     GgmlType::I32}) {
    EXPECT_FALSE(has_reference(t)) << name(t);
    EXPECT_EQ(dtype_traits(t), nullptr);
  }
}

TEST(QuantTraits, VecDotTypes) {
  for (const auto& t : all_dtype_traits()) {
    GgmlType want;
    switch (t.type) {
      case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: want = t.type; break;
      case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: want = GgmlType::Q8_0; break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: want = GgmlType::Q8_1; break;  // ggml: d and s = d*sum(q)
      default: want = GgmlType::Q8_K; break;
    }
    EXPECT_EQ(t.vec_dot_type, want) << t.name;
    // The activation type's block must tile the weight type's block.
    EXPECT_EQ(t.block_size % kiln::gguf::type_info(t.vec_dot_type).block_size, 0u) << t.name;
  }
}

TEST(QuantTraits, RowSize) {
  EXPECT_EQ(row_size(GgmlType::Q4_K, 4096), 16u * 144u);
  EXPECT_EQ(row_size(GgmlType::Q8_0, 64), 68u);
  EXPECT_EQ(row_size(GgmlType::F16, 3), 6u);
  EXPECT_EQ(row_size(GgmlType::IQ2_XXS, 512), 132u);  // geometry is known for every ggml type
  EXPECT_EQ(row_size(GgmlType::Q6_K, 0), 0u);
}

TEST(QuantTraitsDeathTest, RowNotAMultipleOfBlock) {
  std::vector<float> x(48);
  std::vector<uint8_t> q(64);
  EXPECT_DEATH(quantize_row(GgmlType::Q4_0, x.data(), q.data(), 48), "block size");
  EXPECT_DEATH(dequantize_row(GgmlType::IQ2_XXS, q.data(), x.data(), 256), "no reference");
}

TEST(Quant, GaussianErrorBounds) {
  const size_t n = 65536;
  const auto x = gaussian(n, 1234);
  for (GgmlType t : all_types()) {
    const auto y = dequantize(t, quantize(t, x), n);
    const double e = nrmse(x, y);
    EXPECT_LE(e, kNrmseBound.at(t)) << name(t);
    EXPECT_EQ(count_nonfinite(y), 0u) << name(t);
    std::printf("  %-7s nrmse %.5f (bound %.5f)\n", name(t).c_str(), e, kNrmseBound.at(t));
  }
}

TEST(Quant, ErrorBoundsHoldAcrossScales) {
  // The formats are scale-invariant as long as the fp16 block scales stay normal halves.
  const size_t n = 8192;
  for (float sigma : {1e-2f, 3e2f}) {
    const auto x = gaussian(n, 77, sigma);
    for (GgmlType t : all_types()) {
      const auto y = dequantize(t, quantize(t, x), n);
      EXPECT_LE(nrmse(x, y), kNrmseBound.at(t) * 1.15) << name(t) << " sigma " << sigma;
      EXPECT_EQ(count_nonfinite(y), 0u) << name(t);
    }
  }
}

TEST(Quant, ExtremeMagnitudesStayFinite) {
  // Far outside the fp16 scale range block types saturate or flush, but never emit NaN/Inf.
  const size_t n = 1024;
  for (float sigma : {1e-30f, 1e-8f, 1e8f, 1e30f}) {
    const auto x = gaussian(n, 5, sigma);
    for (GgmlType t : block_types()) {
      const auto q = quantize(t, x);
      EXPECT_EQ(count_nonfinite(dequantize(t, q, n)), 0u) << name(t) << " sigma " << sigma;
    }
  }
  // BF16 keeps the f32 exponent range.
  const auto x = gaussian(n, 6, 1e30f);
  EXPECT_LE(nrmse(x, dequantize(GgmlType::BF16, quantize(GgmlType::BF16, x), n)), kNrmseBound.at(GgmlType::BF16));
}

TEST(Quant, AllZeros) {
  const std::vector<float> x(512, 0.0f);
  for (GgmlType t : all_types()) {
    const auto y = dequantize(t, quantize(t, x), x.size());
    for (float v : y) ASSERT_EQ(v, 0.0f) << name(t);
  }
}

TEST(Quant, ConstantRows) {
  // Every format represents a constant block up to the fp16 rounding of its scale (as long
  // as that scale is a normal half: Q6_K's is ~max|x|/4096, so |c| >= 0.25 here).
  for (float c : {0.37f, -2.5f, 1000.0f, -0.3f}) {
    const std::vector<float> x(512, c);
    for (GgmlType t : all_types()) {
      const auto y = dequantize(t, quantize(t, x), x.size());
      const double tol = t == GgmlType::BF16 ? 4e-3 : 1.5e-3;
      for (float v : y) ASSERT_NEAR(v, c, std::fabs(c) * tol) << name(t) << " c=" << c;
    }
  }
}

TEST(Quant, SingleOutlier) {
  // One large value per 256: it is reproduced within 10% and nothing else blows up.
  auto x = gaussian(1024, 9);
  for (size_t i = 37; i < x.size(); i += 256) x[i] = (i % 512 == 37) ? 100.0f : -100.0f;
  for (GgmlType t : all_types()) {
    const auto y = dequantize(t, quantize(t, x), x.size());
    EXPECT_EQ(count_nonfinite(y), 0u) << name(t);
    for (size_t i = 0; i < x.size(); ++i) {
      if (i % 256 == 37) EXPECT_NEAR(y[i], x[i], 10.0) << name(t) << " outlier " << i;
      else EXPECT_LE(std::fabs(y[i]), 110.0f) << name(t) << " at " << i;
    }
  }
}

TEST(Quant, NonFiniteInputDoesNotPoisonBlockTypes) {
  // Garbage in (NaN/Inf) must not crash or produce NaN/Inf blocks in the quantized types.
  auto x = gaussian(512, 11);
  x[3] = NAN;
  x[300] = INFINITY;
  x[301] = -INFINITY;
  for (GgmlType t : block_types()) {
    const auto y = dequantize(t, quantize(t, x), x.size());
    EXPECT_EQ(count_nonfinite(y), 0u) << name(t);
  }
}

TEST(Quant, F32Exact) {
  auto x = gaussian(256, 3);
  x[0] = NAN;
  x[1] = -INFINITY;
  x[2] = -0.0f;
  x[3] = 1e-45f;
  const auto q = quantize(GgmlType::F32, x);
  ASSERT_EQ(std::memcmp(q.data(), x.data(), q.size()), 0);
  const auto y = dequantize(GgmlType::F32, q, x.size());
  ASSERT_EQ(std::memcmp(y.data(), x.data(), q.size()), 0);
}

TEST(Quant, F16AndBF16ExactOnRepresentableValues) {
  // Every finite half / bfloat16 bit pattern survives dequantize -> quantize unchanged.
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
    std::vector<uint8_t> q;
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint16_t v = static_cast<uint16_t>(h);
      const bool finite = t == GgmlType::F16 ? (v & 0x7c00) != 0x7c00 : (v & 0x7f80) != 0x7f80;
      if (!finite) continue;
      q.push_back(static_cast<uint8_t>(v & 0xff));
      q.push_back(static_cast<uint8_t>(v >> 8));
    }
    const size_t n = q.size() / 2;
    const auto y = dequantize(t, q, n);
    EXPECT_EQ(quantize(t, y), q) << name(t);
  }
  // F16 rounds to nearest even and overflows to inf like IEEE.
  const std::vector<float> x = {1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, 65520.0f, 65519.0f};
  const auto y = dequantize(GgmlType::F16, quantize(GgmlType::F16, x), x.size());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f + 4.0f / 2048.0f);
  EXPECT_TRUE(std::isinf(y[2]));
  EXPECT_EQ(y[3], 65504.0f);
}

// Types whose quantizer maps its own output back to the same bytes: quantize(dequantize(q)) == q.
// Holds by construction for the max-scaled formats; the search-based K/IQ quantizers refit
// scales and are not idempotent (documented in docs/formats.md).
TEST(Quant, IdempotentOnOwnOutput) {
  const size_t n = 16384;
  const auto x = gaussian(n, 21);
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0}) {
    const auto q = quantize(t, x);
    const auto q2 = quantize(t, dequantize(t, q, n));
    EXPECT_EQ(q2, q) << name(t);
  }
  // Q8_K keeps its f32 d = 1/iscale unrounded, so d may move by an ulp; the levels may not.
  const auto q = quantize(GgmlType::Q8_K, x);
  const auto q2 = quantize(GgmlType::Q8_K, dequantize(GgmlType::Q8_K, q, n));
  ASSERT_EQ(q.size(), q2.size());
  for (size_t b = 0; b < q.size(); b += sizeof(BlockQ8_K)) {
    ASSERT_EQ(std::memcmp(q.data() + b + 4, q2.data() + b + 4, sizeof(BlockQ8_K) - 4), 0) << "block " << b / 292;
    float d1, d2;
    std::memcpy(&d1, q.data() + b, 4);
    std::memcpy(&d2, q2.data() + b, 4);
    EXPECT_NEAR(d2, d1, std::fabs(d1) * 1e-6);
  }
}

TEST(Quant, RequantizationIsStableForAllTypes) {
  // Even where bytes may change, re-quantizing a dequantized row must not lose accuracy
  // beyond the type's own error bound (the values are already on/near the grid).
  const size_t n = 16384;
  const auto x = gaussian(n, 22);
  for (GgmlType t : all_types()) {
    const auto y = dequantize(t, quantize(t, x), n);
    const auto y2 = dequantize(t, quantize(t, y), n);
    EXPECT_LE(nrmse(y, y2), kNrmseBound.at(t) * 0.5) << name(t);
  }
}

TEST(Quant, Q8_0OfQuantizedDataIsExact) {
  // Blocks built from integer levels (one +-127 per block) round-trip bit-exactly.
  std::mt19937 rng(4);
  std::vector<uint8_t> q(row_size(GgmlType::Q8_0, 32 * 64));
  for (size_t b = 0; b < 64; ++b) {
    BlockQ8_0 blk{};
    blk.d = kiln::f32_to_fp16(std::ldexp(1.0f + float(rng() % 1024) / 1024.0f, int(rng() % 20) - 12));
    for (int j = 0; j < 32; ++j) blk.qs[j] = static_cast<int8_t>(int(rng() % 255) - 127);
    blk.qs[rng() % 32] = (rng() & 1) ? 127 : -127;
    std::memcpy(q.data() + b * sizeof(blk), &blk, sizeof(blk));
  }
  const auto y = dequantize(GgmlType::Q8_0, q, 32 * 64);
  EXPECT_EQ(quantize(GgmlType::Q8_0, y), q);
}

TEST(Quant, Q8_KLayoutAndBsums) {
  static_assert(offsetof(BlockQ8_K, qs) == 4 && offsetof(BlockQ8_K, bsums) == 260);
  auto x = gaussian(512, 8);
  x[100] = -5.0f;  // the signed largest magnitude maps to exactly -127 * d ... with d < 0
  const auto q = quantize(GgmlType::Q8_K, x);
  for (int b = 0; b < 2; ++b) {
    BlockQ8_K blk;
    std::memcpy(&blk, q.data() + b * sizeof(blk), sizeof(blk));
    float amax = 0, mx = 0;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[256 * b + j]) > amax) { amax = std::fabs(x[256 * b + j]); mx = x[256 * b + j]; }
    for (int j = 0; j < 256; ++j) {
      ASSERT_LE(std::abs(int(blk.qs[j])), 127);
      if (x[256 * b + j] == mx) EXPECT_EQ(blk.qs[j], -127);
    }
    EXPECT_FLOAT_EQ(blk.d, mx / -127.0f);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += blk.qs[16 * g + j];
      EXPECT_EQ(blk.bsums[g], s) << "block " << b << " group " << g;
    }
    const auto y = dequantize(GgmlType::Q8_K, std::vector<uint8_t>(q.begin() + b * 292, q.begin() + (b + 1) * 292), 256);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], blk.d * float(blk.qs[j]));
  }
}

TEST(Quant, QuantizerUsesFullLevelRange) {
  // Sanity that scale packing round-trips: on Gaussian data every 4/5/6-bit field and every
  // codebook index is used somewhere (a packing bug usually pins bits to 0).
  const auto x = gaussian(256 * 64, 31);
  for (GgmlType t : {GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    const auto q = quantize(t, x);
    const size_t off = t == GgmlType::IQ4_NL ? 2 : 8, bsz = t == GgmlType::IQ4_NL ? 18 : 136;
    std::vector<int> seen(16, 0);
    for (size_t b = 0; b < q.size() / bsz; ++b)
      for (size_t j = off; j < bsz; ++j) {
        seen[q[b * bsz + j] & 15]++;
        seen[q[b * bsz + j] >> 4]++;
      }
    for (int k = 0; k < 16; ++k) EXPECT_GT(seen[k], 0) << name(t) << " index " << k;
  }
}

TEST(Quant, ElementCountNotOne) {
  // Multi-block rows are independent blocks: quantizing a row equals quantizing its blocks.
  const auto x = gaussian(1024, 41);
  for (GgmlType t : all_types()) {
    const auto whole = quantize(t, x);
    const uint32_t bs = kiln::gguf::type_info(t).block_size;
    std::vector<uint8_t> parts;
    for (size_t i = 0; i < x.size(); i += bs) {
      const auto p = quantize(t, std::vector<float>(x.begin() + i, x.begin() + i + bs));
      parts.insert(parts.end(), p.begin(), p.end());
    }
    EXPECT_EQ(whole, parts) << name(t);
  }
}

}  // namespace
