// The AVX-512 table's Q4_0 / IQ4_NL dots in the order of llama.cpp's repacked mat-muls
// (x86_kernels.inc, legacy_nc<..., kRepack>). On AVX2 / AVX-512 hosts ggml repacks Q4_0 and IQ4_NL
// weights whose row count is a multiple of 8 (q4_0_8x8_q8_0 / iq4_nl_8x8_q8_0) and runs its gemm
// for groups of 4 columns and its gemv for the rest (and for every routed row of MUL_MAT_ID); both
// compute each output as one chain over the 32-element blocks from 0:
//   acc = fma(float(isum), d_w * d_x, acc)      (isum: the block's exact sum of 32 products)
// Matrices of other row counts are not repacked: ggml_vec_dot / tinyBLAS_Q0's one chain of 8 lanes
// (acc[l] = fma(d_w*d_x, float(isum_l), acc[l]), isum_l = 4 products), then hsum_float_8.
// The emulations decode the blocks from their documented layouts (tensor/blocks.h), sharing no code
// with the kernels. Each kernel is checked bit for bit against its emulation for 1..4 columns and
// against a double reference; matmul is checked for every column count (batch invariance) and both
// row-count classes (one column: also the 8-row decode kernel, Table::vec_dot_q8_r8, with 1 and 2
// threads and row counts 8k for k even and odd); a last test shows the two orders differ on these
// operands.
// This file is compiled without -mfma: every fused operation is an explicit std::fma.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "core/fp16.h"
#include "ggml_emul.h"
#include "kernel_test_util.h"
#include "kernels/cpu/dispatch.h"
#include "tensor/blocks.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::kernels;
using namespace kiln::kernels::testing;

namespace {

// bits, h2f, f2h, ld16: ggml_emul.h.

constexpr size_t kWBlock = 18;  // Q4_0 / IQ4_NL: fp16 d, 16 bytes of nibbles (element i < 16: low nibble of byte i)
constexpr size_t kABlock = 34;  // Q8_0 activation block: fp16 d, 32 int8

// Block i's integer weights.
void decode(GgmlType t, const uint8_t* b, int (&q)[32]) {
  for (int i = 0; i < 32; ++i) {
    const int nib = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
    q[i] = t == GgmlType::Q4_0 ? nib - 8 : tensor::kIQ4NLValues[nib];
  }
}

enum class Order { Repack, OneChain };

// The emulated dot of one row (k / 32 blocks) with one Q8_0 column; ref / mag: the exact value of
// the same quantized operands (double) and the sum of |terms|.
float emul(GgmlType t, Order o, int64_t k, const uint8_t* w, const uint8_t* act, double* ref, double* mag) {
  float acc = 0, lane[8] = {};
  double r = 0, mg = 0;
  for (int64_t i = 0; i < k / 32; ++i) {
    int q[32];
    decode(t, w + size_t(i) * kWBlock, q);
    const float dw = h2f(ld16(w + size_t(i) * kWBlock));
    const uint8_t* a = act + size_t(i) * kABlock;
    const float dx = h2f(ld16(a));
    const auto* qx = reinterpret_cast<const int8_t*>(a + 2);
    int isum = 0, il[8] = {};
    for (int e = 0; e < 32; ++e) {
      isum += q[e] * qx[e];
      il[e / 4] += q[e] * qx[e];
      r += double(dw) * q[e] * double(dx) * qx[e];
      mg += std::fabs(double(dw) * q[e] * double(dx) * qx[e]);
    }
    if (o == Order::Repack) {
      acc = std::fma(float(isum), dw * dx, acc);
    } else {
      for (int l = 0; l < 8; ++l) lane[l] = std::fma(dw * dx, float(il[l]), lane[l]);
    }
  }
  *ref = r;
  *mag = mg;
  if (o == Order::Repack) return acc;
  return reduce8(lane);  // hsum_float_8
}

// A random weight row: random nibbles, sane fp16 scales.
std::vector<uint8_t> random_row(int64_t k, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> ds(0.0005f, 0.05f);
  std::vector<uint8_t> w(size_t(k / 32) * kWBlock);
  for (auto& x : w) x = uint8_t(byte(rng));
  for (int64_t i = 0; i < k / 32; ++i) {
    const uint16_t d = f2h(ds(rng));
    std::memcpy(&w[size_t(i) * kWBlock], &d, 2);
  }
  return w;
}

constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::IQ4_NL};

// The reason a host without AVX-512 skips these tests.
constexpr const char* kNoAvx512 =
    "llama.cpp's repacked Q4_0 / IQ4_NL order is reproduced only in the "
    "AVX-512 table (the AVX2 and scalar tables keep ggml_vec_dot's / kiln's order)";

}  // namespace

TEST(GgmlRepack, DotsBitExactAndAccurate) {
  KILN_REQUIRE_AVX512(kNoAvx512);
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_0)];
  ASSERT_NE(qa, nullptr);
  for (GgmlType t : kTypes) {
    for (const auto& [vd, o] : {std::pair{T.vec_dot_q8[cpu::type_index(t)], Order::Repack},
                                std::pair{T.vec_dot_q8_rows_not8[cpu::type_index(t)], Order::OneChain}}) {
      ASSERT_NE(vd, nullptr) << gguf::type_name(t);
      std::mt19937 rng(uint32_t(int(t)) * 7919u + uint32_t(o));
      for (int64_t k : {32, 64, 128, 160, 512, 2048, 4096}) {
        for (int rep = 0; rep < 8; ++rep) {
          const auto w = random_row(k, rng);
          constexpr int kNc = 4;
          const ActColumns act(qa, GgmlType::Q8_0, k, kNc, [&](int c) {
            // Mixed magnitudes so that terms of very different size meet in the float chain.
            auto x = randv(size_t(k), uint32_t(k * 131 + rep * 7 + c), -1.f, 1.f);
            for (size_t e = 0; e < x.size(); e += 37) x[e] *= 40.f;
            return x;
          });
          const size_t ab = act.stride;
          const uint8_t* a0 = act.col(0);
          for (int nc = 1; nc <= kNc; ++nc) {
            float out[cpu::kMaxCols];
            vd(k, w.data(), a0, ab, nc, out);
            for (int c = 0; c < nc; ++c) {
              double ref, mag;
              const float want = emul(t, o, k, w.data(), a0 + size_t(c) * ab, &ref, &mag);
              ASSERT_EQ(bits(out[c]), bits(want)) << gguf::type_name(t) << " order " << int(o) << " k " << k << " rep "
                                                  << rep << " nc " << nc << " c " << c << " got " << out[c]
                                                  << " want " << want;
              ASSERT_LE(std::fabs(out[c] - ref), 1e-5 * mag + 1e-30) << gguf::type_name(t) << " k " << k;
            }
          }
        }
      }
    }
  }
}

// Through kernels::matmul: every column of a batch gets the bits of the emulated order whatever the
// batch size (1, 3, 4, 9 columns: llama.cpp's gemm groups of 4 and its gemv remainder share the
// order), for plain and expert weights (the repack's MUL_MAT_ID: the gemv per routed row). A matrix
// whose row count is not a multiple of 8 is not repacked by ggml: the one-chain order.
TEST(GgmlRepack, MatmulColumnsFollowTheRepackedOrder) {
  KILN_REQUIRE_AVX512(kNoAvx512);
  ThreadPool pool(2);
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_0)];
  for (GgmlType t : kTypes) {
    for (const auto& [n, expert] :
         {std::pair<int64_t, bool>{24, false}, {12, false}, {24, true}, {12, true}, {40, false}}) {
      const Order order = n % 8 == 0 ? Order::Repack : Order::OneChain;
      std::mt19937 rng(uint32_t(int(t)) * 104729u + uint32_t(n));
      const int64_t k = 128;
      std::vector<uint8_t> w;
      for (int64_t j = 0; j < n; ++j) {
        const auto row = random_row(k, rng);
        w.insert(w.end(), row.begin(), row.end());
      }
      const size_t wstride = w.size() / size_t(n);
      for (int64_t m : {1, 3, 4, 9}) {
        const auto x = randv(size_t(k * m), uint32_t(m * 17 + int(t)), -3.f, 3.f);
        std::vector<float> y(size_t(n * m));
        run_matmul(matmul_args(t, w.data(), wstride, k, n, m, x.data(), k, y.data(), n, expert), pool);
        AlignedWs col(cpu::act_bytes(GgmlType::Q8_0, k));
        for (int64_t c = 0; c < m; ++c) {
          qa(x.data() + c * k, k, col.p);
          for (int64_t j = 0; j < n; ++j) {
            double ref, mag;
            const float want = emul(t, order, k, w.data() + size_t(j) * wstride, static_cast<uint8_t*>(col.p), &ref, &mag);
            ASSERT_EQ(bits(y[size_t(c * n + j)]), bits(want))
                << gguf::type_name(t) << " n " << n << " expert " << expert << " m " << m << " col " << c << " j " << j;
          }
        }
      }
    }
  }
}

// The 8-row decode kernel (Table::vec_dot_q8_r8: rows in lanes, block sums formed from unsigned
// weight codes and x's sums) against the emulated repacked order, row by row, bit for bit: 8
// distinct rows at a padded stride, k of even and odd block counts, and the extreme operands (every
// weight at its most negative code, x at +-127) where the offset trick's integers are largest.
TEST(GgmlRepack, EightRowDecodeKernelBitExact) {
  KILN_REQUIRE_AVX512(kNoAvx512);
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_0)];
  for (GgmlType t : kTypes) {
    const cpu::VecDotQ8RowsFn r8 = T.vec_dot_q8_r8[cpu::type_index(t)];
    ASSERT_NE(r8, nullptr) << gguf::type_name(t);
    std::mt19937 rng(uint32_t(int(t)) * 2654435761u);
    for (int64_t k : {32, 96, 128, 160, 1024, 4096}) {
      for (int rep = 0; rep < 6; ++rep) {
        const size_t rb = size_t(k / 32) * kWBlock, stride = rb + size_t(rep % 3) * 18;  // padded rows too
        std::vector<uint8_t> w(stride * 8 + 64);
        for (int r = 0; r < 8; ++r) {
          auto row = random_row(k, rng);
          if (rep == 5 && r % 2 == 0) std::fill(row.begin(), row.end(), uint8_t(0));  // q = -8 / -127 ...
          if (rep == 5 && r % 2 == 0)
            for (int64_t i = 0; i < k / 32; ++i) {  // ... with a sane scale
              const uint16_t d = f2h(0.01f * float(r + 1));
              std::memcpy(&row[size_t(i) * kWBlock], &d, 2);
            }
          std::memcpy(w.data() + size_t(r) * stride, row.data(), rb);
        }
        auto x = randv(size_t(k), uint32_t(k * 977 + rep), -1.f, 1.f);
        if (rep == 5)
          for (size_t e = 0; e < x.size(); ++e) x[e] = (e / 32) % 2 ? -2.f : 2.f;  // whole blocks at +-127
        else
          for (size_t e = 0; e < x.size(); e += 29) x[e] *= 50.f;
        AlignedWs col(cpu::act_bytes(GgmlType::Q8_0, k));
        qa(x.data(), k, col.p);
        float out[8];
        r8(k, w.data(), stride, col.p, out);
        for (int r = 0; r < 8; ++r) {
          double ref, mag;
          const float want = emul(t, Order::Repack, k, w.data() + size_t(r) * stride, static_cast<uint8_t*>(col.p), &ref, &mag);
          ASSERT_EQ(bits(out[r]), bits(want)) << gguf::type_name(t) << " k " << k << " rep " << rep << " row " << r
                                              << " got " << out[r] << " want " << want;
          ASSERT_LE(std::fabs(out[r] - ref), 1e-5 * mag + 1e-30) << gguf::type_name(t) << " k " << k;
        }
      }
    }
  }
}

// Decode (one column) through kernels::matmul with 1 and 2 threads: every row gets the emulated
// order's bits, for row counts 8k with k even and odd (the 8-row kernel; thread ranges are whole
// groups of 8) and for row counts that are not multiples of 8 (the one-chain order); the batch of 5 columns (a gemm group of 4 + one column) gives the
// same bits for every column (batch invariance).
TEST(GgmlRepack, DecodeMatvecRowCountsAndThreads) {
  KILN_REQUIRE_AVX512(kNoAvx512);
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_0)];
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (GgmlType t : kTypes) {
      for (int64_t n : {8, 16, 24, 40, 56, 64, 72, 136, 12, 20, 36}) {
        const Order order = n % 8 == 0 ? Order::Repack : Order::OneChain;
        std::mt19937 rng(uint32_t(int(t)) * 7u + uint32_t(n) * 1009u + uint32_t(threads));
        const int64_t k = n % 3 == 0 ? 160 : 256;
        std::vector<uint8_t> w;
        for (int64_t j = 0; j < n; ++j) {
          const auto row = random_row(k, rng);
          w.insert(w.end(), row.begin(), row.end());
        }
        const size_t wstride = w.size() / size_t(n);
        for (int64_t m : {1, 5}) {
          const auto x = randv(size_t(k * m), uint32_t(n * 31 + m), -2.f, 2.f);
          std::vector<float> y(size_t(n * m));
          AlignedWs ws(matmul_workspace(t, k, m, pool.size()));
          MatmulArgs args;
          args.wt = t;
          args.w = w.data();
          args.w_stride = wstride;
          args.k = k;
          args.n = n;
          args.m = m;
          args.x = x.data();
          args.x_stride = k;
          args.y = y.data();
          args.y_stride = n;
          matmul(args, ws.p, pool);
          AlignedWs col(cpu::act_bytes(GgmlType::Q8_0, k));
          for (int64_t c = 0; c < m; ++c) {
            qa(x.data() + c * k, k, col.p);
            for (int64_t j = 0; j < n; ++j) {
              double ref, mag;
              const float want =
                  emul(t, order, k, w.data() + size_t(j) * wstride, static_cast<uint8_t*>(col.p), &ref, &mag);
              ASSERT_EQ(bits(y[size_t(c * n + j)]), bits(want)) << gguf::type_name(t) << " threads " << threads << " n "
                                                                << n << " m " << m << " col " << c << " j " << j;
            }
          }
        }
      }
    }
  }
}

// The two emulated orders differ on these operands, so the bit tests above would notice a kernel
// that summed in the other order.
TEST(GgmlRepack, OrdersDiffer) {
  for (GgmlType t : kTypes) {
    std::mt19937 rng(uint32_t(int(t)) * 31u);
    const int64_t k = 1024;
    std::vector<uint8_t> col(cpu::act_bytes(GgmlType::Q8_0, k));
    int differ = 0;
    for (int rep = 0; rep < 64; ++rep) {
      const auto w = random_row(k, rng);
      const auto x = randv(size_t(k), uint32_t(rep + 1000 * int(t)), -1.f, 1.f);
      tensor::quantize_row(GgmlType::Q8_0, x.data(), col.data(), k);
      double ref, mag;
      differ += bits(emul(t, Order::Repack, k, w.data(), col.data(), &ref, &mag)) !=
                bits(emul(t, Order::OneChain, k, w.data(), col.data(), &ref, &mag));
    }
    EXPECT_GT(differ, 8) << gguf::type_name(t);
  }
}
