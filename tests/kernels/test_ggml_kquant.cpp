// The x86 tables' K-quant / IQ4_XS dots (x86_kernels.inc, KOrder::Tiled and KOrder::Repack; the AVX2
// table for Q4_K (tiled order) Q5_K Q6_K IQ4_XS, the AVX-512 table for all six types)
// against scalar emulations of the float order of llama.cpp's CPU mat-muls for these types:
//  - Q3_K Q5_K Q6_K IQ4_XS: ggml's tiled mat-mul (ggml-cpu/tiled, AVX512-VNNI microkernel):
//    per super-block t = float(sumi) * d_w (- dmin_w * float(summ), fused, for the types with minima),
//    acc = fma(t, d_x, acc);
//  - Q4_K / Q2_K: ggml's repacked gemms (q4_K_8x8_q8_K / q2_K_8x8_q8_K, AVX-512 path): per group of
//    64 (Q4_K: a pair of 32-element sub-blocks) / 128 (Q2_K: 8 sub-blocks of 16) elements
//    acc = fma(float(S), d_w*d_x, acc), accm = fma(float(M), dmin_w*d_x, accm); result acc - accm;
//    matrices whose row count is not a multiple of 8 are not repacked: the tiled order; one expert of
//    a stacked Q4_K expert tensor (llama.cpp's MUL_MAT_ID): the gemv's one step per super-block.
// The emulations decode the weight blocks from their documented layouts (tensor/blocks.h) into
// integer weights, scales and minima, so they share no code with the kernels. Each kernel is checked
// (1) bit for bit against its emulation for 1..4 columns and (2) against a double reference; a
// third test shows the emulated orders are not interchangeable (the bit test would catch a swap).
// This file is compiled without -mfma: every fused operation is an explicit std::fma.
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

// One super-block decoded: element i's value is d * sc[i / sub] * q[i] - dmin * mn[i / sub].
struct KBlock {
  int q[256];
  int sc[16], mn[16];
  int sub;  // sub-block length: 16 or 32
  float d, dmin;
};

size_t block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return sizeof(tensor::BlockQ2_K);
    case GgmlType::Q3_K: return sizeof(tensor::BlockQ3_K);
    case GgmlType::Q4_K: return sizeof(tensor::BlockQ4_K);
    case GgmlType::Q5_K: return sizeof(tensor::BlockQ5_K);
    case GgmlType::Q6_K: return sizeof(tensor::BlockQ6_K);
    default: return sizeof(tensor::BlockIQ4_XS);
  }
}

KBlock decode(GgmlType t, const uint8_t* b) {
  KBlock r{};
  switch (t) {
    case GgmlType::Q2_K: {  // scales[16] qs[64] d dmin
      r.sub = 16;
      r.d = h2f(ld16(b + 80));
      r.dmin = h2f(ld16(b + 82));
      for (int i = 0; i < 256; ++i) r.q[i] = (b[16 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
      for (int s = 0; s < 16; ++s) {
        r.sc[s] = b[s] & 15;
        r.mn[s] = b[s] >> 4;
      }
      break;
    }
    case GgmlType::Q3_K: {  // hmask[32] qs[64] scales[12] d
      r.sub = 16;
      r.d = h2f(ld16(b + 108));
      for (int i = 0; i < 256; ++i) {
        const int h = i / 128, el = i % 128, kk = el / 32, l = el % 32;
        const int lo = (b[32 + 32 * h + l] >> (2 * kk)) & 3;
        const int hb = (b[l] >> (i / 32)) & 1;
        r.q[i] = (lo | hb << 2) - 4;
      }
      for (int s = 0; s < 16; ++s) r.sc[s] = tensor::get_scale_q3k(s, b + 96) - 32;
      break;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // d dmin scales[12] (qh[32]) qs[128]
      const bool q5 = t == GgmlType::Q5_K;
      r.sub = 32;
      r.d = h2f(ld16(b));
      r.dmin = h2f(ld16(b + 2));
      const uint8_t* qs = b + (q5 ? 48 : 16);
      for (int i = 0; i < 256; ++i) {
        const int c = i / 64, j = i % 64, l = j % 32;
        int q = j < 32 ? qs[32 * c + l] & 15 : qs[32 * c + l] >> 4;
        if (q5) q |= ((b[16 + i % 32] >> (i / 32)) & 1) << 4;
        r.q[i] = q;
      }
      for (int s = 0; s < 8; ++s) tensor::get_scale_min_k4(s, b + 4, &r.sc[s], &r.mn[s]);
      break;
    }
    case GgmlType::Q6_K: {  // ql[128] qh[64] scales[16] d
      r.sub = 16;
      r.d = h2f(ld16(b + 208));
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t* ql = b + 64 * h;
          const int qh = b[128 + 32 * h + l];
          r.q[128 * h + l] = ((ql[l] & 15) | ((qh >> 0) & 3) << 4) - 32;
          r.q[128 * h + l + 32] = ((ql[l + 32] & 15) | ((qh >> 2) & 3) << 4) - 32;
          r.q[128 * h + l + 64] = ((ql[l] >> 4) | ((qh >> 4) & 3) << 4) - 32;
          r.q[128 * h + l + 96] = ((ql[l + 32] >> 4) | ((qh >> 6) & 3) << 4) - 32;
        }
      for (int s = 0; s < 16; ++s) r.sc[s] = int8_t(b[192 + s]);
      break;
    }
    default: {  // IQ4_XS: d scales_h scales_l[4] qs[128]
      r.sub = 32;
      r.d = h2f(ld16(b));
      const int sh = ld16(b + 2);
      for (int s = 0; s < 8; ++s) {
        r.sc[s] = (((b[4 + s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4) - 32;
        for (int j = 0; j < 16; ++j) {
          r.q[32 * s + j] = tensor::kIQ4NLValues[b[8 + 16 * s + j] & 15];
          r.q[32 * s + j + 16] = tensor::kIQ4NLValues[b[8 + 16 * s + j] >> 4];
        }
      }
    }
  }
  return r;
}

enum class Order { Tiled, Repack, Gemv };

// The emulated dot of one weight row (k / 256 blocks) with one Q8_K column; ref/mag: the exact value
// of the same quantized operands in double and the sum of |terms| (for the accuracy bound).
float emul(GgmlType t, Order o, int64_t k, const uint8_t* w, const uint8_t* act, double* ref, double* mag) {
  float acc = 0, accm = 0;
  double r = 0, mg = 0;
  for (int64_t i = 0; i < k / 256; ++i) {
    const KBlock kb = decode(t, w + size_t(i) * block_bytes(t));
    const uint8_t* ab = act + size_t(i) * sizeof(tensor::BlockQ8_K);
    float dx;
    std::memcpy(&dx, ab, 4);
    const auto* qx = reinterpret_cast<const int8_t*>(ab + 4);
    const int nsub = 256 / kb.sub;
    int isum[16] = {}, xsum[16] = {};
    for (int e = 0; e < 256; ++e) {
      isum[e / kb.sub] += kb.q[e] * qx[e];
      xsum[e / kb.sub] += qx[e];
      const double y = double(kb.d) * kb.sc[e / kb.sub] * kb.q[e] - double(kb.dmin) * kb.mn[e / kb.sub];
      r += y * double(dx) * qx[e];
      mg += std::fabs(y * double(dx) * qx[e]);
    }
    int sumi = 0, summ = 0;
    for (int s = 0; s < nsub; ++s) {
      sumi += kb.sc[s] * isum[s];
      summ += kb.mn[s] * xsum[s];
    }
    if (o == Order::Tiled) {
      const float tt = std::fma(-kb.dmin, float(summ), float(sumi) * kb.d);
      acc = std::fma(tt, dx, acc);
    } else if (o == Order::Repack) {  // groups of 64 (Q4_K) / 128 (Q2_K) elements
      const int per = (t == GgmlType::Q2_K ? 128 : 64) / kb.sub;  // sub-blocks per group
      for (int g = 0; g < nsub / per; ++g) {
        int S = 0, M = 0;
        for (int sb = g * per; sb < (g + 1) * per; ++sb) {
          S += kb.sc[sb] * isum[sb];
          M += kb.mn[sb] * xsum[sb];
        }
        acc = std::fma(float(S), kb.d * dx, acc);
        accm = std::fma(float(M), kb.dmin * dx, accm);
      }
    } else {  // ggml's Q4_K / Q2_K gemv: one step per super-block
      acc = std::fma(float(sumi), kb.d * dx, acc);
      accm = std::fma(float(summ), kb.dmin * dx, accm);
    }
  }
  *ref = r;
  *mag = mg;
  return o == Order::Tiled ? acc : acc - accm;
}

struct TypeCase {
  GgmlType t;
  Order o;
};
constexpr TypeCase kCases[] = {{GgmlType::Q2_K, Order::Repack},
                               {GgmlType::Q3_K, Order::Tiled},
                               {GgmlType::Q4_K, Order::Repack},
                               {GgmlType::Q5_K, Order::Tiled},
                               {GgmlType::Q6_K, Order::Tiled},
                               {GgmlType::IQ4_XS, Order::Tiled}};

// A random weight row of k / 256 blocks: random bytes, sane fp16 scales.
std::vector<uint8_t> random_row(GgmlType t, int64_t k, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> ds(0.0005f, 0.02f), dm(0.f, 0.02f);
  const size_t bb = block_bytes(t);
  std::vector<uint8_t> w(size_t(k / 256) * bb);
  for (auto& x : w) x = uint8_t(byte(rng));
  for (int64_t i = 0; i < k / 256; ++i) {
    uint8_t* b = &w[size_t(i) * bb];
    const uint16_t d = f2h(ds(rng)), dmin = f2h(dm(rng));
    switch (t) {
      case GgmlType::Q2_K: std::memcpy(b + 80, &d, 2); std::memcpy(b + 82, &dmin, 2); break;
      case GgmlType::Q3_K: std::memcpy(b + 108, &d, 2); break;
      case GgmlType::Q6_K: std::memcpy(b + 208, &d, 2); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: std::memcpy(b, &d, 2); std::memcpy(b + 2, &dmin, 2); break;
      default: std::memcpy(b, &d, 2);
    }
  }
  return w;
}

// The x86 tables that take llama.cpp's orders for type t: the AVX-512 table for every case, the
// AVX2 table for the types of its tile mat-mul (Q4_K Q5_K Q6_K IQ4_XS; Q2_K / Q3_K keep kiln's
// order there). The scalar table keeps kiln's order.
bool ggml_order_in(CpuIsa isa, GgmlType t) {
  return isa == CpuIsa::Avx512 || (isa == CpuIsa::Avx2 && t != GgmlType::Q2_K && t != GgmlType::Q3_K);
}
// The order a table takes for the case's type: the AVX2 table runs Q4_K in the tiled order for
// every row count (no repacked gemm there: its per-pair float steps slow the decode kernel).
Order table_order(CpuIsa isa, const TypeCase& tc) {
  return isa == CpuIsa::Avx2 && tc.t == GgmlType::Q4_K ? Order::Tiled : tc.o;
}
// Runs body(isa) with each x86 table this host has selected; skips the test where it has none.
template <class F>
void for_x86_tables(F&& body) {
  IsaGuard guard;
  int ran = 0;
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!set_isa(isa)) continue;
    SCOPED_TRACE(isa_name(isa));
    body(isa);
    ++ran;
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (ran == 0) GTEST_SKIP() << "no AVX2: llama.cpp's K-quant orders are x86 table entries";
}

}  // namespace

TEST(GgmlKQuant, DotsBitExactAndAccurate) {
  for_x86_tables([](CpuIsa isa) {
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_K)];
  ASSERT_NE(qa, nullptr);
  for (const TypeCase& tc : kCases) {
    if (!ggml_order_in(isa, tc.t)) continue;
    const cpu::VecDotQ8Fn vd = T.vec_dot_q8[cpu::type_index(tc.t)];
    ASSERT_NE(vd, nullptr) << gguf::type_name(tc.t);
    // Repacked types' matrices of other row counts: the tiled order (checked through matmul below).
    const Order o = table_order(isa, tc);
    EXPECT_EQ(T.vec_dot_q8_rows_not8[cpu::type_index(tc.t)] != nullptr, o == Order::Repack);
    std::mt19937 rng(uint32_t(int(tc.t)) * 7919u);
    for (int64_t k : {256, 512, 768, 2048, 4096}) {
      for (int rep = 0; rep < 8; ++rep) {
        const auto w = random_row(tc.t, k, rng);
        constexpr int kNc = 4;
        const ActColumns act(qa, GgmlType::Q8_K, k, kNc, [&](int c) {
          // Mixed magnitudes so that terms of very different size meet in the float chain.
          auto x = randv(size_t(k), uint32_t(k * 131 + rep * 7 + c), -1.f, 1.f);
          for (size_t e = 0; e < x.size(); e += 97) x[e] *= 40.f;
          return x;
        });
        const size_t ab = act.stride;
        const uint8_t* a0 = act.col(0);
        for (int nc = 1; nc <= kNc; ++nc) {
          float out[cpu::kMaxCols];
          vd(k, w.data(), a0, ab, nc, out);
          for (int c = 0; c < nc; ++c) {
            double ref, mag;
            const float want = emul(tc.t, o, k, w.data(), a0 + size_t(c) * ab, &ref, &mag);
            ASSERT_EQ(bits(out[c]), bits(want)) << gguf::type_name(tc.t) << " k " << k << " rep " << rep << " nc "
                                                << nc << " c " << c << " got " << out[c] << " want " << want;
            ASSERT_LE(std::fabs(out[c] - ref), 1e-5 * mag + 1e-30) << gguf::type_name(tc.t) << " k " << k;
          }
        }
      }
    }
  }
  });
}

// Through kernels::matmul: every column of a batch gets the bits of the emulated order, whatever the
// batch size (1, 3, 4 columns: the kernel groups of 4 and their remainders; 9, 21: the tile mat-mul). A Q4_K / Q2_K matrix
// whose row count is not a multiple of 8 is not repacked by ggml: it takes the tiled order. One
// expert of a stacked Q4_K expert tensor (MatmulArgs::expert, llama.cpp's MUL_MAT_ID) takes the
// repacked gemv's order.
TEST(GgmlKQuant, MatmulColumnsFollowTheManyColumnOrder) {
  for_x86_tables([](CpuIsa isa) {
  ThreadPool pool(2);
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_K)];
  for (const TypeCase& tc : kCases) {
    if (!ggml_order_in(isa, tc.t)) continue;
    for (const auto& [n, expert] : {std::pair<int64_t, bool>{24, false}, {12, false}, {24, true}, {12, true}}) {
      const Order o = table_order(isa, tc);
      const Order order = n % 8 != 0 && o == Order::Repack          ? Order::Tiled
                          : expert && o == Order::Repack && tc.t == GgmlType::Q4_K ? Order::Gemv
                                                                                    : o;
      std::mt19937 rng(uint32_t(int(tc.t)) * 104729u + uint32_t(n));
      const int64_t k = 512;
      std::vector<uint8_t> w;
      for (int64_t j = 0; j < n; ++j) {
        const auto row = random_row(tc.t, k, rng);
        w.insert(w.end(), row.begin(), row.end());
      }
      const size_t wstride = w.size() / size_t(n);
      for (int64_t m : {1, 3, 4, 9, 21}) {  // 9, 21: the tile mat-mul (x86 tables)
        const auto x = randv(size_t(k * m), uint32_t(m * 17 + int(tc.t)), -3.f, 3.f);
        std::vector<float> y(size_t(n * m));
        run_matmul(matmul_args(tc.t, w.data(), wstride, k, n, m, x.data(), k, y.data(), n, expert), pool);
        AlignedWs col(cpu::act_bytes(GgmlType::Q8_K, k));
        for (int64_t t = 0; t < m; ++t) {
          qa(x.data() + t * k, k, col.p);
          for (int64_t j = 0; j < n; ++j) {
            double ref, mag;
            const float want =
                emul(tc.t, order, k, w.data() + size_t(j) * wstride, static_cast<uint8_t*>(col.p), &ref, &mag);
            ASSERT_EQ(bits(y[size_t(t * n + j)]), bits(want))
                << gguf::type_name(tc.t) << " n " << n << " expert " << expert << " m " << m << " t " << t
                << " j " << j;
          }
        }
      }
    }
  }
  });
}

// The emulated orders do differ from one another on these operands, so the bit tests above would
// notice a kernel that summed in another order (e.g. Q4_K in the gemv's per-super-block steps, or
// the tiled types in the repacked gemm's pair steps).
TEST(GgmlKQuant, OrdersDiffer) {
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::Q5_K}) {
    std::mt19937 rng(uint32_t(int(t)) * 31u);
    const int64_t k = 2048;
    AlignedWs col(cpu::act_bytes(GgmlType::Q8_K, k));
    int differ_rt = 0, differ_rg = 0;
    for (int rep = 0; rep < 64; ++rep) {
      const auto w = random_row(t, k, rng);
      const auto x = randv(size_t(k), uint32_t(rep + 1000 * int(t)), -1.f, 1.f);
      tensor::quantize_row(GgmlType::Q8_K, x.data(), col.p, k);  // the Q8_K activation quantizer's reference
      double ref, mag;
      const auto* a = static_cast<const uint8_t*>(col.p);
      const float rp = emul(t, Order::Repack, k, w.data(), a, &ref, &mag);
      differ_rt += bits(rp) != bits(emul(t, Order::Tiled, k, w.data(), a, &ref, &mag));
      differ_rg += bits(rp) != bits(emul(t, Order::Gemv, k, w.data(), a, &ref, &mag));
    }
    EXPECT_GT(differ_rt, 8) << gguf::type_name(t);
    EXPECT_GT(differ_rg, 8) << gguf::type_name(t);
  }
}

// Where a block's fp16 d (and dmin) sit: offset, bytes.
std::pair<size_t, size_t> d_field(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return {80, 4};
    case GgmlType::Q3_K: return {108, 2};
    case GgmlType::Q6_K: return {208, 2};
    case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 4};
    default: return {0, 2};
  }
}

// The 8-row decode kernels (Table::vec_dot_q8_r8, AVX-512 table) against the emulated order of the
// table's vec_dot_q8 entry, row by row, bit for bit: 8 distinct rows at a padded stride, several
// block counts, mixed-magnitude activations, and the extreme operands (every weight code and scale
// at its largest, x at +-127) where the integer sums are largest.
TEST(GgmlKQuant, EightRowDecodeKernelBitExact) {
  KILN_REQUIRE_AVX512("the 8-row K-quant decode kernels are AVX-512 table entries");
  const cpu::Table& T = cpu::table();
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(GgmlType::Q8_K)];
  int tested = 0;
  for (const TypeCase& tc : kCases) {
    const cpu::VecDotQ8RowsFn r8 = T.vec_dot_q8_r8[cpu::type_index(tc.t)];
    if (!r8) continue;
    ++tested;
    std::mt19937 rng(uint32_t(int(tc.t)) * 2654435761u);
    const size_t bb = block_bytes(tc.t);
    for (int64_t k : {256, 512, 768, 1024, 4096}) {
      for (int rep = 0; rep < 6; ++rep) {
        const size_t rb = size_t(k / 256) * bb, stride = rb + size_t(rep % 3) * 32;  // padded rows too
        std::vector<uint8_t> w(stride * 8 + 64);
        for (int r = 0; r < 8; ++r) {
          auto row = random_row(tc.t, k, rng);
          if (rep == 5 && r % 2 == 0)  // every code / scale / minimum byte 0xff, the fp16 d / dmin kept
            for (int64_t i = 0; i < k / 256; ++i) {
              uint8_t* b = &row[size_t(i) * bb];
              const auto [off, n] = d_field(tc.t);
              uint8_t keep[4];
              std::memcpy(keep, b + off, n);
              std::memset(b, 0xff, bb);
              std::memcpy(b + off, keep, n);
            }
          std::memcpy(w.data() + size_t(r) * stride, row.data(), rb);
        }
        auto x = randv(size_t(k), uint32_t(k * 977 + rep), -1.f, 1.f);
        if (rep == 5)
          for (size_t e = 0; e < x.size(); ++e) x[e] = (e / 16) % 3 ? 2.f : -2.f;  // whole groups at +-127
        else
          for (size_t e = 0; e < x.size(); e += 29) x[e] *= 50.f;
        AlignedWs col(cpu::act_bytes(GgmlType::Q8_K, k));
        qa(x.data(), k, col.p);
        float out[8];
        r8(k, w.data(), stride, col.p, out);
        for (int r = 0; r < 8; ++r) {
          double ref, mag;
          const float want = emul(tc.t, tc.o, k, w.data() + size_t(r) * stride, static_cast<uint8_t*>(col.p), &ref, &mag);
          ASSERT_EQ(bits(out[r]), bits(want)) << gguf::type_name(tc.t) << " k " << k << " rep " << rep << " row " << r
                                              << " got " << out[r] << " want " << want;
        }
      }
    }
  }
  EXPECT_GT(tested, 0);
}
