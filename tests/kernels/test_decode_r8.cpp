// The 8-row decode kernels (cpu::Table::vec_dot_q8_r8, AVX-512 table) against the one-row kernel they
// stand for (Table::vec_dot_q8 at one column), bit for bit, for every type that has one: directly
// (8 distinct rows at padded strides, several super-block counts, random bytes so that every code,
// scale and minimum value occurs, quantized rows, and the extreme operands where the integer sums
// are largest), and through kernels::matmul for 1..6 columns with row counts that are not multiples
// of 8 (the last rows then take the one-row kernel) on 1..3 threads. The emulated-order tests
// (test_ggml_kquant.cpp, test_ggml_order.cpp) check the same kernels against ggml's orders.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "core/fp16.h"
#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

// Elements per block, and where a block's fp16 fields (d, and dmin / m) sit.
struct Layout {
  int64_t qk;
  std::vector<size_t> halves;
};
Layout layout(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: return {32, {0}};
    case GgmlType::Q4_1: case GgmlType::Q5_1: return {32, {0, 2}};
    case GgmlType::Q2_K: return {256, {80, 82}};
    case GgmlType::Q3_K: return {256, {108}};
    case GgmlType::Q4_K: case GgmlType::Q5_K: return {256, {0, 2}};
    case GgmlType::Q6_K: return {256, {208}};
    default: return {256, {0}};  // IQ4_XS
  }
}

// A row of k elements: random bytes (kind 0), every byte 0xff (kind 1: codes, scales and minima at
// their largest), or every byte 0x80 / 0x00 alternating by block (kind 2); the fp16 fields set to
// sane random scales (minima / offsets may be negative).
std::vector<uint8_t> random_row(GgmlType t, int64_t k, int kind, std::mt19937& rng) {
  const Layout L = layout(t);
  const size_t bb = tensor::row_size(t, L.qk);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> ds(0.0005f, 0.03f), dm(-0.03f, 0.03f);
  std::vector<uint8_t> w(size_t(k / L.qk) * bb);
  for (size_t e = 0; e < w.size(); ++e)
    w[e] = uint8_t(kind == 0 ? byte(rng) : kind == 1 ? 0xff : (e / bb) % 2 ? 0x80 : 0x00);
  for (int64_t i = 0; i < k / L.qk; ++i)
    for (size_t f = 0; f < L.halves.size(); ++f) {
      const uint16_t h = f32_to_fp16(f == 0 ? ds(rng) : dm(rng));
      std::memcpy(w.data() + size_t(i) * bb + L.halves[f], &h, 2);
    }
  return w;
}

// The activation for a test: random with a few large values (rep % 3 == 0, 1), or whole blocks at
// +-max (rep % 3 == 2: the quantized x at +-127).
std::vector<float> activation(int64_t k, int rep, uint32_t seed) {
  auto x = randv(size_t(k), seed, -1.f, 1.f);
  if (rep % 3 == 2)
    for (size_t e = 0; e < x.size(); ++e) x[e] = (e / 16) % 3 ? 2.f : -2.f;
  else
    for (size_t e = 0; e < x.size(); e += 37) x[e] *= 40.f;
  return x;
}

// The types whose decode goes through an 8-row kernel on the AVX-512 table (a type dropped from the
// table fails here rather than silently losing its speed).
constexpr GgmlType kR8Types[] = {GgmlType::Q4_0,   GgmlType::IQ4_NL, GgmlType::Q4_K, GgmlType::Q6_K,
                                 GgmlType::Q8_0,   GgmlType::Q4_1,   GgmlType::Q5_0, GgmlType::Q5_1,
                                 GgmlType::IQ4_XS, GgmlType::Q5_K,   GgmlType::Q2_K, GgmlType::Q3_K};

TEST(DecodeR8, TableHasEightRowKernels) {
  KILN_REQUIRE_AVX512("the 8-row decode kernels are AVX-512 table entries");
  const cpu::Table& T = cpu::table();
  for (GgmlType t : kR8Types) EXPECT_NE(T.vec_dot_q8_r8[cpu::type_index(t)], nullptr) << gguf::type_name(t);
  // several columns (a verify step's rows): Q4_K, Q6_K, IQ4_XS
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS})
    EXPECT_NE(T.vec_dot_q8_r8_cols[cpu::type_index(t)], nullptr) << gguf::type_name(t);
}

TEST(DecodeR8, KernelMatchesOneRowKernelBitExact) {
  KILN_REQUIRE_AVX512("the 8-row decode kernels are AVX-512 table entries");
  const cpu::Table& T = cpu::table();
  int tested = 0;
  for (GgmlType t : kMatmulTypes) {
    const int ti = cpu::type_index(t);
    const cpu::VecDotQ8RowsFn r8 = T.vec_dot_q8_r8[ti];
    if (!r8) continue;
    const cpu::VecDotQ8Fn vd = T.vec_dot_q8[ti];
    ASSERT_NE(vd, nullptr) << gguf::type_name(t);
    const GgmlType at = cpu::act_type(t);
    const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(at)];
    ASSERT_NE(qa, nullptr);
    std::mt19937 rng(uint32_t(ti) * 2246822519u + 1u);
    const int64_t qk = layout(t).qk;
    std::vector<int64_t> ks = {256, 512, 1280, 4096};
    if (qk == 32) ks.insert(ks.begin(), {32, 96});
    for (int64_t k : ks) {
      for (int rep = 0; rep < 9; ++rep) {
        const size_t rb = tensor::row_size(t, k), stride = rb + size_t(rep % 4) * 16;  // padded rows too
        std::vector<uint8_t> w(stride * 8 + 64, 0x5a);
        for (int r = 0; r < 8; ++r) {
          std::vector<uint8_t> row;
          if (rep == 3 || rep == 4) {  // quantized from floats: the codes a real model has
            const auto f = randv(size_t(k), uint32_t(k * 31 + rep * 8 + r), -1.f, 1.f);
            row = weight_rows(t, f.data(), k, 1);
          } else {
            row = random_row(t, k, rep == 5 || rep == 8 ? 1 + r % 2 : 0, rng);
          }
          std::memcpy(w.data() + size_t(r) * stride, row.data(), rb);
        }
        const auto x = activation(k, rep, uint32_t(k * 977 + rep + 100 * ti));
        AlignedWs col(cpu::act_bytes(at, k));
        qa(x.data(), k, col.p);
        float out[8];
        r8(k, w.data(), stride, col.p, out);
        for (int r = 0; r < 8; ++r) {
          float want;
          vd(k, w.data() + size_t(r) * stride, col.p, 0, 1, &want);
          ASSERT_EQ(f32_to_bits(out[r]), f32_to_bits(want)) << gguf::type_name(t) << " k " << k << " rep " << rep << " row " << r
                                              << " got " << out[r] << " want " << want;
        }
      }
    }
    ++tested;
  }
  EXPECT_GE(tested, int(std::size(kR8Types)));
}

// Through matmul (1..6 columns): row counts that are not multiples of 8, 1..3 threads. Each output is
// the one-row kernel's for its row and column (the one matmul picks for the matrix: vec_dot_q8_rows_not8 where
// the row count is not a multiple of 8 and the type has one).
TEST(DecodeR8, MatmulFewColumnsMatchOneRowKernel) {
  KILN_REQUIRE_AVX512("the 8-row decode kernels are AVX-512 table entries");
  const cpu::Table& T = cpu::table();
  for (GgmlType t : kMatmulTypes) {
    const int ti = cpu::type_index(t);
    if (!T.vec_dot_q8_r8[ti]) continue;
    const GgmlType at = cpu::act_type(t);
    const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(at)];
    std::mt19937 rng(uint32_t(ti) * 97u + 5u);
    for (int64_t k : {256, 1536}) {
      for (int64_t n : {8, 13, 29, 40, 67}) {
        const size_t rb = tensor::row_size(t, k), stride = rb + (n % 2 ? 32 : 0);
        std::vector<uint8_t> w(stride * size_t(n));
        for (int64_t j = 0; j < n; ++j) {
          const auto row = random_row(t, k, j % 7 == 3 ? 1 : 0, rng);
          std::memcpy(w.data() + size_t(j) * stride, row.data(), rb);
        }
        // m columns (the several-column 8-row kernel where the type has one, else two columns the
        // 8-row kernel once per column and more the m-column vec_dot_q8; 6 = 4 + 2): each output the
        // one-row kernel's bits for its row and column.
        for (int64_t m : {1, 2, 3, 4, 6}) {
          std::vector<float> x;
          for (int64_t c = 0; c < m; ++c) {
            const auto xc = activation(k, int(n + c), uint32_t(k + n + 7 * c));
            x.insert(x.end(), xc.begin(), xc.end());
          }
          AlignedWs col(cpu::act_bytes(at, k));
          const cpu::VecDotQ8Fn vd = n % 8 && T.vec_dot_q8_rows_not8[ti] ? T.vec_dot_q8_rows_not8[ti] : T.vec_dot_q8[ti];
          std::vector<float> want(static_cast<size_t>(m * n));
          for (int64_t c = 0; c < m; ++c) {
            qa(x.data() + c * k, k, col.p);
            for (int64_t j = 0; j < n; ++j) vd(k, w.data() + size_t(j) * stride, col.p, 0, 1, &want[size_t(c * n + j)]);
          }
          for (int threads = 1; threads <= 3; ++threads) {
            ThreadPool pool(threads);
            std::vector<float> y(size_t(m * n), -1.f);
            run_matmul(matmul_args(t, w.data(), stride, k, n, m, x.data(), k, y.data(), n), pool);
            for (int64_t i = 0; i < m * n; ++i)
              ASSERT_EQ(f32_to_bits(y[size_t(i)]), f32_to_bits(want[size_t(i)]))
                  << gguf::type_name(t) << " k " << k << " n " << n << " m " << m << " threads " << threads << " row "
                  << i % n << " column " << i / n;
          }
        }
      }
    }
  }
}

// The kernels read nothing past a block's end: 8 packed rows whose last byte is the last byte before
// a PROT_NONE page (an over-read faults), and whose first byte starts a page (no read before it).
TEST(DecodeR8, ReadsOnlyTheRows) {
  KILN_REQUIRE_AVX512("the 8-row decode kernels are AVX-512 table entries");
  const cpu::Table& T = cpu::table();
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  for (GgmlType t : kMatmulTypes) {
    const int ti = cpu::type_index(t);
    const cpu::VecDotQ8RowsFn r8 = T.vec_dot_q8_r8[ti];
    if (!r8) continue;
    const GgmlType at = cpu::act_type(t);
    std::mt19937 rng(uint32_t(ti) + 11u);
    for (int64_t k : {256, 768}) {
      const size_t rb = tensor::row_size(t, k), bytes = rb * 8;
      const size_t span = (bytes + page - 1) / page * page;
      auto* map = static_cast<uint8_t*>(mmap(nullptr, span + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      ASSERT_NE(map, MAP_FAILED);
      ASSERT_EQ(mprotect(map, page, PROT_NONE), 0);
      ASSERT_EQ(mprotect(map + page + span, page, PROT_NONE), 0);
      for (int pass = 0; pass < 2; ++pass) {
        uint8_t* w = pass == 0 ? map + page + span - bytes : map + page;  // ends at the guard / starts after one
        for (int r = 0; r < 8; ++r) {
          const auto row = random_row(t, k, 0, rng);
          std::memcpy(w + size_t(r) * rb, row.data(), rb);
        }
        const auto x = activation(k, pass, uint32_t(k + ti));
        AlignedWs col(cpu::act_bytes(at, k));
        T.quantize_act[cpu::type_index(at)](x.data(), k, col.p);
        float out[8];
        r8(k, w, rb, col.p, out);
        for (int r = 0; r < 8; ++r) {
          float want;
          T.vec_dot_q8[ti](k, w + size_t(r) * rb, col.p, 0, 1, &want);
          ASSERT_EQ(f32_to_bits(out[r]), f32_to_bits(want)) << gguf::type_name(t) << " k " << k << " row " << r;
        }
      }
      munmap(map, span + 2 * page);
    }
  }
}

}  // namespace
