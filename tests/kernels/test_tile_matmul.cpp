// The x86 tables' many-column ("tile") quantized mat-mul (Table::tile_mm: kernels/cpu/tile_avx512.cpp
// and tile_avx2.cpp): for Q4_0 Q4_1 IQ4_NL Q8_0 Q4_K Q5_K Q6_K IQ4_XS weights, matmul with >= 8
// columns decodes 16 weight rows once and multiplies them with every column. Its outputs must be the
// bits of the table's one-row dot (Table::vec_dot_q8, itself checked against scalar emulations of
// ggml's orders in test_ggml_kquant / test_ggml_repack / test_ggml_order) on the same quantized
// columns, for every shape: odd tile counts (n = 8 mod 16), row counts that are not a multiple of 8
// (types without a rows_not8 entry), k of an odd number of blocks, column counts that are not a
// multiple of the kernels' column chunks, padded strides, 1..3 threads. And it must be accurate: NMSE
// against the exact product of the dequantized weights (the scalar reference, tensor/quant) and the
// dequantized activation columns (double) <= 1e-11. Where the AVX2 table takes the AVX-512 table's
// order (Q5_K Q6_K IQ4_XS Q8_0 Q4_1), the two tables must also give the same bits.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

constexpr GgmlType kTileTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::IQ4_NL, GgmlType::Q8_0, GgmlType::Q4_K,
                                   GgmlType::Q5_K, GgmlType::Q6_K,  GgmlType::IQ4_XS};

// One quantized activation column back to floats (tensor has no Q8_1 dequantizer: d * qs by hand).
void dequantize_act(GgmlType at, const uint8_t* a, float* x, int64_t k) {
  if (at != GgmlType::Q8_1) return tensor::dequantize_row(at, a, x, k);
  for (int64_t b = 0; b < k / 32; ++b) {
    uint16_t h;
    std::memcpy(&h, a + 36 * b, 2);
    const float d = fp16_to_f32(h);
    for (int e = 0; e < 32; ++e) x[32 * b + e] = d * float(int8_t(a[36 * b + 4 + e]));
  }
}

struct Shape {
  int64_t k, n, m;
};

// Y = W X through matmul (threads), and the two oracles. Weights with k values per row, w_stride
// padded by 32 bytes; X and Y columns padded by 8 floats.
void check(GgmlType t, Shape s, int threads, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << gguf::type_name(t) << " k=" << s.k << " n=" << s.n << " m=" << s.m
                                  << " threads=" << threads);
  const cpu::Table& T = cpu::table();
  ASSERT_NE(T.tile_mm[cpu::type_index(t)], nullptr);
  const size_t row = tensor::row_size(t, s.k), wst = row + 32;
  const std::vector<float> wf = randv(size_t(s.k * s.n), seed, -1.f, 1.f);
  const std::vector<uint8_t> w = weight_rows(t, wf.data(), s.k, s.n, wst, 0xa5);
  const int64_t xs = s.k + 8, ys = s.n + 8;
  std::vector<float> x = randv(size_t(xs * s.m), seed + 1, -2.f, 2.f);
  for (int64_t c = 0; c < s.m; c += 5)  // some columns with one large value (coarse activation scales)
    x[size_t(c * xs + (c * 7) % s.k)] = 40.f;
  std::vector<float> y(size_t(ys * s.m), -1.f);
  ThreadPool pool(threads);
  run_matmul(matmul_args(t, w.data(), wst, s.k, s.n, s.m, x.data(), xs, y.data(), ys), pool);

  // Oracle 1: the table's one-row dot on each column (the bits every column count must give).
  const GgmlType at = cpu::act_type(t);
  ActColumns act(T.quantize_act[cpu::type_index(at)], at, s.k, int(s.m), [&](int c) {
    return std::vector<float>(x.begin() + c * xs, x.begin() + c * xs + s.k);
  });
  const cpu::VecDotQ8Fn vd = T.vec_dot_q8[cpu::type_index(t)];
  // Oracle 2: the exact product of the dequantized operands.
  std::vector<float> wd(size_t(s.k * s.n));
  for (int64_t j = 0; j < s.n; ++j) tensor::dequantize_row(t, w.data() + size_t(j) * wst, wd.data() + j * s.k, s.k);
  std::vector<float> got, want;
  int64_t mismatches = 0;
  for (int64_t c = 0; c < s.m; ++c) {
    std::vector<float> xd(size_t(s.k));
    dequantize_act(at, act.col(int(c)), xd.data(), s.k);
    for (int64_t j = 0; j < s.n; ++j) {
      float o;
      vd(s.k, w.data() + size_t(j) * wst, act.col(int(c)), act.stride, 1, &o);
      const float g = y[size_t(c * ys + j)];
      uint32_t gb, ob;
      std::memcpy(&gb, &g, 4);
      std::memcpy(&ob, &o, 4);
      if (gb != ob && ++mismatches <= 5)
        ADD_FAILURE() << "column " << c << " row " << j << ": tile " << g << " vs vec_dot_q8 " << o;
      double ref = 0;
      if (t == GgmlType::Q4_1) {
        // ggml's Q4_1 x Q8_1 formula takes the column's stored s = fp16(d * sum(qs)) for the offset
        // term: exact here with that s, d_w*d_x*sum(q*qx) + m_w*s per block.
        const uint8_t* wr = w.data() + size_t(j) * wst;
        const uint8_t* ac = act.col(int(c));
        for (int64_t b = 0; b < s.k / 32; ++b) {
          const uint8_t* wb = wr + 20 * b;
          const uint8_t* xb = ac + 36 * b;
          uint16_t h[4];
          std::memcpy(h, wb, 4);
          std::memcpy(h + 2, xb, 4);
          int64_t is = 0;
          for (int e = 0; e < 32; ++e) is += int64_t(e < 16 ? wb[4 + e] & 15 : wb[4 + e - 16] >> 4) * int8_t(xb[4 + e]);
          ref += double(fp16_to_f32(h[0])) * fp16_to_f32(h[2]) * double(is) + double(fp16_to_f32(h[1])) * fp16_to_f32(h[3]);
        }
      } else {
        for (int64_t i = 0; i < s.k; ++i) ref += double(wd[size_t(j * s.k + i)]) * xd[size_t(i)];
      }
      got.push_back(g);
      want.push_back(float(ref));
    }
    for (int64_t j = s.n; j < ys; ++j) EXPECT_EQ(y[size_t(c * ys + j)], -1.f) << "padding of column " << c << " written";
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_LE(nmse(got, want), 1e-11);
}

// The x86 tables this host has (the tile mat-mul is an entry of both).
std::vector<CpuIsa> tile_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::Avx2, CpuIsa::Avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

TEST(TileMatmul, BitsOfTheOneRowDotEveryTypeAndShape) {
  IsaGuard guard;
  if (tile_isas().empty()) GTEST_SKIP() << "no AVX2: the tile mat-mul is an x86 table entry";
  const Shape shapes[] = {{256, 16, 8}, {512, 40, 13}, {768, 24, 33}, {1024, 8, 9}, {256, 72, 67}, {2048, 32, 17}};
  // Row counts that are not a multiple of 8 (a last tile of 5 or 11 rows; only the types whose
  // matrices of such row counts still take vec_dot_q8), k of an odd number of 32-element blocks.
  const Shape ragged[] = {{512, 13, 11}, {256, 27, 20}, {768, 5, 8}};
  const Shape odd_k[] = {{96, 24, 10}, {352, 40, 9}, {32, 16, 12}};
  for (CpuIsa isa : tile_isas()) {
    ASSERT_TRUE(set_isa(isa));
    SCOPED_TRACE(isa_name(isa));
    uint32_t seed = 1;
    for (GgmlType t : kTileTypes) {
      for (const Shape& s : shapes)
        for (int threads : {1, 2, 3}) check(t, s, threads, seed++);
      if (!cpu::table().vec_dot_q8_rows_not8[cpu::type_index(t)])
        for (const Shape& s : ragged)
          for (int threads : {1, 2}) check(t, s, threads, seed++);
      if (gguf::type_info(t).block_size == 32)
        for (const Shape& s : odd_k)
          for (int threads : {1, 3}) check(t, s, threads, seed++);
    }
  }
}

TEST(TileMatmul, Avx2TableGivesTheAvx512TablesBits) {
  // For Q5_K Q6_K IQ4_XS (ggml's tiled order) and Q8_0 Q4_1 (ggml_vec_dot's 8 lanes) both tables take
  // the same order (the AVX2 table through vpmaddubsw + vpmaddwd, the AVX-512 one through vpdpbusd):
  // the same float steps on the same exact integer sums, so the same bits, on the tile path (m = 24,
  // 9) and on the 1..4-column kernels (m = 3). (Q4_0 IQ4_NL Q4_K: other orders on the two tables.)
  IsaGuard guard;
  if (!isa_supported(CpuIsa::Avx512)) GTEST_SKIP() << "no AVX-512: nothing to compare the AVX2 table with";
  for (GgmlType t : {GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::Q8_0, GgmlType::Q4_1}) {
    SCOPED_TRACE(gguf::type_name(t));
    for (const Shape& s : {Shape{512, 48, 24}, Shape{1024, 40, 3}, Shape{256, 16, 9}}) {
      const std::vector<float> wf = randv(size_t(s.k * s.n), 91 + uint32_t(s.n), -1.f, 1.f);
      const std::vector<uint8_t> w = weight_rows(t, wf.data(), s.k, s.n);
      std::vector<float> x = randv(size_t(s.k * s.m), 92 + uint32_t(s.m), -2.f, 2.f);
      x[7] = 50.f;
      ThreadPool pool(2);
      auto run = [&](CpuIsa isa) {
        EXPECT_TRUE(set_isa(isa));
        std::vector<float> y(size_t(s.n * s.m));
        run_matmul(matmul_args(t, w.data(), tensor::row_size(t, s.k), s.k, s.n, s.m, x.data(), s.k, y.data(), s.n), pool);
        return y;
      };
      const std::vector<float> a = run(CpuIsa::Avx2), b = run(CpuIsa::Avx512);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "k " << s.k << " n " << s.n << " m " << s.m;
    }
  }
}

TEST(TileMatmul, BatchInvariantAcrossTheThreshold) {
  // The same column gives the same bits alone (m = 1, the one-row / 8-row kernels), in a batch of 4
  // (1..4-column kernels) and in a batch of 8 and 29 (the tile path).
  IsaGuard guard;
  if (tile_isas().empty()) GTEST_SKIP() << "no AVX2: the tile mat-mul is an x86 table entry";
  for (CpuIsa isa : tile_isas())
  for (GgmlType t : kTileTypes) {
    ASSERT_TRUE(set_isa(isa));
    SCOPED_TRACE(::testing::Message() << gguf::type_name(t) << " " << isa_name(isa));
    const int64_t k = 512, n = 48;
    const std::vector<float> wf = randv(size_t(k * n), 77, -1.f, 1.f);
    const std::vector<uint8_t> w = weight_rows(t, wf.data(), k, n);
    const std::vector<float> x = randv(size_t(k * 29), 78, -1.f, 1.f);
    ThreadPool pool(2);
    auto run = [&](int64_t m) {
      std::vector<float> y(size_t(n * m));
      run_matmul(matmul_args(t, w.data(), tensor::row_size(t, k), k, n, m, x.data(), k, y.data(), n), pool);
      return y;
    };
    const std::vector<float> y1 = run(1), y4 = run(4), y8 = run(8), y29 = run(29);
    EXPECT_EQ(0, std::memcmp(y1.data(), y29.data(), size_t(n) * 4));
    EXPECT_EQ(0, std::memcmp(y4.data(), y29.data(), size_t(4 * n) * 4));
    EXPECT_EQ(0, std::memcmp(y8.data(), y29.data(), size_t(8 * n) * 4));
  }
}

}  // namespace

namespace {

// The SIMD Q8_K activation quantizer (x86 tables) against tensor's scalar reference (ggml's
// quantize_row_q8_K_ref): every byte, on random blocks and on blocks built for the edge cases
// (halves that round to even, a largest |x| that occurs with both signs, zeros, NaN, infinities).
TEST(QuantizeQ8K, SimdBitsOfTheReference) {
  IsaGuard guard;
  std::vector<std::vector<float>> blocks;
  for (uint32_t s = 0; s < 40; ++s) blocks.push_back(randv(256, 900 + s, -3.f, 3.f));
  std::vector<float> b(256);
  for (int i = 0; i < 256; ++i) b[size_t(i)] = float(i % 41 - 20) + 0.5f;  // iscale = 127/20.5... and exact halves below
  blocks.push_back(b);
  for (int i = 0; i < 256; ++i) b[size_t(i)] = float(i % 255 - 127) * 0.5f;
  b[7] = -127.f;  // mx = -127: iscale = 1, every x.5 is a tie
  blocks.push_back(b);
  b.assign(256, 0.25f);
  b[3] = 2.f;
  b[9] = -2.f;  // the first of equal |x| decides the sign
  blocks.push_back(b);
  b[3] = -2.f;
  b[9] = 2.f;
  blocks.push_back(b);
  blocks.emplace_back(256, 0.f);
  b = randv(256, 5);
  b[17] = std::nanf("");
  blocks.push_back(b);
  b[40] = INFINITY;
  blocks.push_back(b);
  b = randv(256, 6);
  b[100] = -INFINITY;
  blocks.push_back(b);
  std::vector<float> x;
  for (const auto& v : blocks) x.insert(x.end(), v.begin(), v.end());
  const int64_t k = int64_t(x.size());
  std::vector<uint8_t> want(tensor::row_size(GgmlType::Q8_K, k));
  tensor::quantize_row(GgmlType::Q8_K, x.data(), want.data(), k);
  if (!isa_supported(CpuIsa::Avx2)) GTEST_SKIP() << "no AVX2: the SIMD quantizer is an x86 table entry";
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!set_isa(isa)) continue;
    SCOPED_TRACE(isa_name(isa));
    std::vector<uint8_t> got(want.size(), 0xcd);
    cpu::table().quantize_act[cpu::type_index(GgmlType::Q8_K)](x.data(), k, got.data());
    for (size_t blk = 0; blk < blocks.size(); ++blk)
      EXPECT_EQ(0, std::memcmp(got.data() + blk * 292, want.data() + blk * 292, 292)) << "block " << blk;
  }
}

}  // namespace
