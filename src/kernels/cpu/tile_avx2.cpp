// kernels/cpu/tile_avx2.cpp — the AVX2 table's many-column ("tile") quantized mat-mul:
//   Q4_0 Q4_1 IQ4_NL Q8_0 Q4_K Q5_K Q6_K IQ4_XS weights against ggml-quantized activation columns,
//   with 256-bit integer arithmetic only (vpmaddubsw + vpmaddwd; no VNNI).
// Owns: the AVX2 tile kernels. The tile layout and the threading are those of the AVX-512 tile
//   (tile_avx512.cpp); each output has the bits of the AVX2 table's vec_dot_q8 entry for its type
//   (the same float steps per output; only the exact integer sums are formed differently), so the
//   path is a speed choice and batch invariance holds whichever path runs. The AVX2 table's orders
//   for these types: ggml's tiled mat-mul for Q4_K (every row count) Q5_K Q6_K IQ4_XS, as the
//   AVX-512 table for Q5_K Q6_K IQ4_XS; ggml_vec_dot's one chain of 8 lanes for Q4_0 Q4_1 IQ4_NL
//   Q8_0 (its AVX2 order, held bit-exact by test_ggml_order).
// Must not: change a float step of the orders in x86_kernels.inc; be used where matmul picks another
//   entry than vec_dot_q8 (vec_dot_q8_rows_not8 / vec_dot_q8_expert are other orders).
// Threading: pure functions; each call owns its scratch (one per pool thread, from the workspace).
//
// Layout. A tile is kTileRows = 16 weight rows, decoded once per matmul call into 8-bit codes
// grouped by 4 consecutive elements ("dword groups"): group g is 64 bytes, row r's 4 codes at
// 4r..4r+3, so the 32-byte half h of a group holds rows 8h..8h+7 (one ymm: lane = row). Per-row
// block data (scales, minima) are 16-lane vectors beside the codes, read as two 8-lane halves.
// The two halves are multiplied separately (each output's chain stays in its own lane).
//
// Integer sums without VNNI. vpmaddubsw(codes, x broadcast) gives per row two int16 sums of two
// u8 x s8 products; vpmaddwd then adds the two and applies the row's scale (int16 pair (s, s)) or
// 1. Nothing may saturate at int16 (|x| <= 127, the Q8 quantizers never give -128):
//   - unsigned codes: Q4_1 (0..15, one group per lane of the 8-lane order), Q4_K (0..15: pair sums
//     <= 3810, a sub-block's eight groups summed in int16), Q5_K (0..31: <= 7874, four groups),
//     Q6_K as q + 32 (0..63: <= 16002, two groups; the offset 32 * sum(sc * bsum) is taken out
//     exactly with the column's bsums, side data);
//   - signed values: Q4_0 (-8..7), IQ4_NL / IQ4_XS (-127..113) and Q8_0 (-128..127) as |w|
//     against sign(x, w) (|w| <= 128: pair sums <= 32512), widened to int32 after each group.
// The products are exact; sums of exact int32 lanes are exact in any order (|sums| < 2^31).
#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <utility>

#include "core/fp16.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/tile_common.h"
#include "tensor/blocks.h"

namespace kiln::kernels::cpu {
namespace {

using namespace kiln::tensor;
using gguf::GgmlType;

inline float ldf(const void* p) { float v; std::memcpy(&v, p, 4); return v; }
inline __m256i ldy(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 ldyf(const uint8_t* p) { return _mm256_load_ps(reinterpret_cast<const float*>(p)); }
inline __m256i bcast(const uint8_t* p) { return _mm256_set1_epi32(ld32(p)); }

inline __m256i iq4nl_values() {
  const __m128i t = load128(kIQ4NLValues);
  return _mm256_setr_m128i(t, t);
}

// tmp: R rows of U codes (row stride U, U % 32 == 0) -> U/4 groups of 64 bytes (row r at 4r) at out:
// 8x8 transposes of dwords.
inline void transpose_rows(const uint8_t* tmp, int U, uint8_t* out) {
  for (int h = 0; h < 2; ++h)
    for (int g0 = 0; g0 < U / 4; g0 += 8) {
      __m256i r[8];
      for (int i = 0; i < 8; ++i) r[i] = load256(tmp + size_t(8 * h + i) * size_t(U) + 4 * g0);
      const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
      const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
      const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
      const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
      const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
      const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
      const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
      const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
      // u_j: rows 0..3 (u4+j: rows 4..7) of group g0+j in the low 128 bits, of group g0+4+j in the high.
      const __m256i c[8] = {_mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
                            _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
                            _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
                            _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31)};
      for (int i = 0; i < 8; ++i)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 64 * size_t(g0 + i) + 32 * h), c[i]);
    }
}


// Rows 8h..8h+7 of y's column (c0 + c) from the 8 lanes of v (only rows < nr).
inline void store_rows(const TileMmArgs& a, int h, int64_t col, __m256 v) {
  float* y = a.y + col * a.y_stride + 8 * h;
  const int n = a.nr - 8 * h;
  if (n >= 8) {
    _mm256_storeu_ps(y, v);
    return;
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int r = 0; r < n; ++r) y[r] = t[r];
}

// ---- 32-element block types ----
// Scratch: codes [nb][8 groups][64], then d_w [nb][16] floats, then (Q4_1) m_w [nb][16].
// Side data per block, in tile_side_bytes' strides: Q4_0 / IQ4_NL {float d_x, unused}; Q8_0
// {float d_x, unused[32]}; Q4_1 {float d_x, float s_x}.
enum class Blk { Q4_0, IQ4_NL, Q8_0, Q4_1 };
template <Blk B>
void decode_blk(const TileMmArgs& a, uint8_t* codes, float* dw) {
  const int64_t nb = a.k / 32;
  constexpr size_t kBytes = B == Blk::Q8_0 ? sizeof(BlockQ8_0) : B == Blk::Q4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  float* mw = dw + 16 * nb;
  alignas(64) uint8_t tmp[R * 32];
  const __m256i tbl = iq4nl_values();
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      if (r >= a.nr) {
        std::memset(tmp + 32 * r, 0, 32);
        dw[16 * b + r] = 0;
        if constexpr (B == Blk::Q4_1) mw[16 * b + r] = 0;
        continue;
      }
      const uint8_t* blk = a.w + size_t(r) * a.w_stride + size_t(b) * kBytes;
      __m256i q;
      if constexpr (B == Blk::Q4_0) q = _mm256_sub_epi8(unpack_nibbles(blk + 2), _mm256_set1_epi8(8));
      if constexpr (B == Blk::IQ4_NL) q = _mm256_shuffle_epi8(tbl, unpack_nibbles(blk + 2));
      if constexpr (B == Blk::Q8_0) q = load256(blk + 2);
      if constexpr (B == Blk::Q4_1) {
        q = unpack_nibbles(blk + 4);
        mw[16 * b + r] = h2f(ld16(blk + 2));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 32 * r), q);
      dw[16 * b + r] = h2f(ld16(blk));
    }
    transpose_rows(tmp, 32, codes + size_t(b) * 512);
  }
}

// ggml_vec_dot's one chain of 8 lanes per output (the AVX2 table's order for these four types):
// lane l of a block = the products of elements 4l..4l+3, acc_l = fma(d_w*d_x, float(isum_l), acc_l),
// hsum_float_8's tree at the end, + corr (Q4_1: corr = fma(m_w, s_x, corr) per block; else 0).
template <Blk B>
void tile_blk(const TileMmArgs& a) {
  const int64_t nb = a.k / 32;
  auto* codes = static_cast<uint8_t*>(a.scratch);
  auto* dw = reinterpret_cast<float*>(codes + size_t(nb) * 512);
  decode_blk<B>(a, codes, dw);
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr bool kQ41 = B == Blk::Q4_1;  // unsigned codes; the others signed values (|w| vs sign(x, w))
  constexpr size_t kAB = kQ41 ? 36 : 34, kSB = B == Blk::Q8_0 ? 36 : 8;  // activation block, side block
  for (int h = 0; h < 2 && 8 * h < a.nr; ++h) {
    const uint8_t* ch = codes + 32 * h;
    const float* dh = dw + 8 * h;
    const float* mh = dw + 16 * nb + 8 * h;
    over_columns<2>(a.m, [&]<int NC>(int64_t c0) {
      __m256 acc[NC][8], corr[NC];
      for (int c = 0; c < NC; ++c) {
        corr[c] = _mm256_setzero_ps();
        for (int l = 0; l < 8; ++l) acc[c][l] = _mm256_setzero_ps();
      }
      const uint8_t* xq = a.act + size_t(c0) * a.act_stride + (kQ41 ? 4 : 2);
      const uint8_t* sd = a.side + size_t(c0) * a.side_stride;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* wb = ch + size_t(b) * 512;
        const __m256 d8 = _mm256_load_ps(dh + 16 * b);
        __m256 dd[NC];
        for (int c = 0; c < NC; ++c) dd[c] = _mm256_mul_ps(d8, _mm256_set1_ps(ldf(sd + size_t(c) * a.side_stride + size_t(b) * kSB)));
        for (int l = 0; l < 8; ++l) {
          const __m256i w = ldy(wb + 64 * l);
          const __m256i wa = kQ41 ? w : _mm256_abs_epi8(w);
          for (int c = 0; c < NC; ++c) {
            __m256i x = bcast(xq + size_t(c) * a.act_stride + size_t(b) * kAB + 4 * l);
            if constexpr (!kQ41) x = _mm256_sign_epi8(x, w);
            const __m256i is = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, x), ones);
            acc[c][l] = _mm256_fmadd_ps(dd[c], _mm256_cvtepi32_ps(is), acc[c][l]);
          }
        }
        if constexpr (kQ41) {
          const __m256 m8 = _mm256_load_ps(mh + 16 * b);
          for (int c = 0; c < NC; ++c)
            corr[c] = _mm256_fmadd_ps(m8, _mm256_set1_ps(ldf(sd + size_t(c) * a.side_stride + size_t(b) * 8 + 4)), corr[c]);
        }
      }
      for (int c = 0; c < NC; ++c) {
        const __m256* v = acc[c];  // hsum_float_8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then + corr
        const __m256 e = _mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6]));
        const __m256 o = _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7]));
        store_rows(a, h, c0 + c, _mm256_add_ps(_mm256_add_ps(e, o), corr[c]));
      }
    });
  }
}

// ---- super-block types (Q8_K columns) ----
// Scratch per super-block: codes [64 groups][64] (4096 bytes), then kVecs(T) 16-lane row vectors:
// d_w, dmin_w (or unused), then
//   Q4_K Q5_K: sc16[8] (int16 pairs (sc, sc)), mnpair[4] (int16 pairs (mn[2j], mn[2j+1]))
//   Q6_K: sc16[16], scpair[8] (int16 pairs (sc[2j], sc[2j+1]))
//   IQ4_XS: ls16[8] (int16 pairs (ls - 32, ls - 32))
// Side data: tile_avx512.cpp's Q8_K layout, 64 bytes per super-block {float d_x, pad[3],
// uint32 bs32[4], uint32 bs16[8]} (int16 pairs of the activation's sub-block sums).
enum class Sup { Q4_K, Q5_K, Q6_K, IQ4_XS };
template <Sup S> constexpr int kNsub = S == Sup::Q6_K ? 16 : 8;  // scaled sub-blocks per super-block
template <Sup S> constexpr int kVecs = 2 + kNsub<S> + (S == Sup::IQ4_XS ? 0 : kNsub<S> / 2);
template <Sup S> constexpr size_t kSupBytes = 4096 + size_t(kVecs<S>) * 64;
template <Sup S> constexpr size_t kWBytes = S == Sup::Q4_K ? sizeof(BlockQ4_K) : S == Sup::Q5_K ? sizeof(BlockQ5_K)
                                           : S == Sup::Q6_K ? sizeof(BlockQ6_K) : sizeof(BlockIQ4_XS);

// One row's super-block: codes[256] in element order; v[e] = the row's entry e of the kVecs vectors.
template <Sup S>
inline void decode_sup_row(const uint8_t* blk, uint8_t* codes, uint32_t* v) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  if constexpr (S == Sup::Q4_K || S == Sup::Q5_K) {
    const float d = h2f(ld16(blk)), dmin = h2f(ld16(blk + 2));
    std::memcpy(&v[0], &d, 4);
    std::memcpy(&v[1], &dmin, 4);
    int sc[8], mn[8];
    for (int s = 0; s < 8; ++s) get_scale_min_k4(s, blk + 4, &sc[s], &mn[s]);
    for (int s = 0; s < 8; ++s) v[2 + s] = pair16(sc[s], sc[s]);
    for (int j = 0; j < 4; ++j) v[10 + j] = pair16(mn[2 * j], mn[2 * j + 1]);
    const uint8_t* qs = blk + (S == Sup::Q5_K ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (S == Sup::Q5_K) qh = load256(blk + offsetof(BlockQ5_K, qh));
    const __m256i one = _mm256_set1_epi8(1);
    for (int ch = 0; ch < 4; ++ch) {
      const __m256i raw = load256(qs + 32 * ch);
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (S == Sup::Q5_K) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * ch), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * ch + 1), one), 4));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 64 * ch), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 64 * ch + 32), hi);
    }
  } else if constexpr (S == Sup::Q6_K) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
    const float d = h2f(ld16(&b->d));
    std::memcpy(&v[0], &d, 4);
    v[1] = 0;
    for (int s = 0; s < 16; ++s) v[2 + s] = pair16(b->scales[s], b->scales[s]);
    for (int j = 0; j < 8; ++j) v[18 + j] = pair16(b->scales[2 * j], b->scales[2 * j + 1]);
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b->ql + 64 * h;
      const __m256i qh = load256(b->qh + 32 * h), ql0 = load256(ql), ql1 = load256(ql + 32);
      __m256i L[4];
      L[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
      L[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
      L[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
      L[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
      for (int ch = 0; ch < 4; ++ch) _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 32 * (4 * h + ch)), L[ch]);
    }
  } else {
    const auto* b = reinterpret_cast<const BlockIQ4_XS*>(blk);
    const float d = h2f(ld16(&b->d));
    std::memcpy(&v[0], &d, 4);
    v[1] = 0;
    uint32_t sl;
    std::memcpy(&sl, b->scales_l, 4);
    const uint32_t sh = ld16(&b->scales_h);
    for (int s = 0; s < 8; ++s) {
      const int ls = int(((sl >> (4 * s)) & 15) | (((sh >> (2 * s)) & 3) << 4)) - 32;
      v[2 + s] = pair16(ls, ls);
    }
    const __m256i tbl = iq4nl_values();
    for (int s = 0; s < 8; ++s)
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 32 * s), _mm256_shuffle_epi8(tbl, unpack_nibbles(b->qs + 16 * s)));
  }
}

template <Sup S>
void decode_sup(const TileMmArgs& a, uint8_t* base) {
  const int64_t ns = a.k / 256;
  alignas(64) uint8_t tmp[R * 256];
  alignas(64) uint32_t vec[R][kVecs<S>];
  for (int64_t i = 0; i < ns; ++i) {
    for (int r = 0; r < R; ++r) {
      if (r >= a.nr) {
        std::memset(tmp + 256 * r, 0, 256);
        std::memset(vec[r], 0, sizeof(vec[r]));
        continue;
      }
      decode_sup_row<S>(a.w + size_t(r) * a.w_stride + size_t(i) * kWBytes<S>, tmp + 256 * r, vec[r]);
    }
    uint8_t* o = base + size_t(i) * kSupBytes<S>;
    transpose_rows(tmp, 256, o);
    auto* ov = reinterpret_cast<uint32_t*>(o + 4096);
    for (int e = 0; e < kVecs<S>; ++e)
      for (int r = 0; r < R; ++r) ov[16 * e + r] = vec[r][e];
  }
}

// sc * (the exact sum of n dword groups) for 8 rows and NC columns, added to sum[c]: codes at w
// (one group every 64 bytes), column c's bytes at x[c] (4 per group). Unsigned codes whose pair
// sums fit kRun at a time in int16 are summed in int16 kRun groups at a time; signed values
// (kSigned) go as |w| against sign(x, w), widened after each group.
template <int NC, int N, int kRun, bool kSigned>
inline void scaled_sums(const uint8_t* w, const uint8_t* const* x, __m256i sc, __m256i* sum) {
  if constexpr (kSigned) {
    for (int g = 0; g < N; ++g) {
      const __m256i v = ldy(w + 64 * g), va = _mm256_abs_epi8(v);
      for (int c = 0; c < NC; ++c)
        sum[c] = _mm256_add_epi32(sum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(va, _mm256_sign_epi8(bcast(x[c] + 4 * g), v)), sc));
    }
  } else {
    for (int g0 = 0; g0 < N; g0 += kRun) {
      __m256i s16[NC];
      {
        const __m256i v = ldy(w + 64 * g0);
        for (int c = 0; c < NC; ++c) s16[c] = _mm256_maddubs_epi16(v, bcast(x[c] + 4 * g0));
      }
      for (int g = g0 + 1; g < g0 + kRun; ++g) {
        const __m256i v = ldy(w + 64 * g);
        for (int c = 0; c < NC; ++c) s16[c] = _mm256_add_epi16(s16[c], _mm256_maddubs_epi16(v, bcast(x[c] + 4 * g)));
      }
      for (int c = 0; c < NC; ++c) sum[c] = _mm256_add_epi32(sum[c], _mm256_madd_epi16(s16[c], sc));
    }
  }
}

template <Sup S>
void tile_sup(const TileMmArgs& a) {
  const int64_t ns = a.k / 256;
  auto* base = static_cast<uint8_t*>(a.scratch);
  decode_sup<S>(a, base);
  constexpr int kG = 256 / kNsub<S> / 4;  // dword groups per scaled sub-block (8, Q6_K 4)
  // groups whose int16 pair sums add without saturating: codes <= 15: 8, <= 31: 4, <= 63: 2
  constexpr int kRun = S == Sup::Q4_K ? 8 : S == Sup::Q5_K ? 4 : 2;
  for (int h = 0; h < 2 && 8 * h < a.nr; ++h) {
    over_columns<4>(a.m, [&]<int NC>(int64_t c0) {
      __m256 acc[NC];
      for (int c = 0; c < NC; ++c) acc[c] = _mm256_setzero_ps();
      const uint8_t* xa = a.act + size_t(c0) * a.act_stride;
      const uint8_t* sd = a.side + size_t(c0) * a.side_stride;
      for (int64_t i = 0; i < ns; ++i) {
        const uint8_t* wb = base + size_t(i) * kSupBytes<S> + 32 * h;
        const uint8_t* vb = wb + 4096;  // row vector e: vb + 64 * e
        const __m256 d8 = ldyf(vb);
        float dx[NC];
        const uint8_t* xq[NC];
        const uint8_t* sv[NC];
        for (int c = 0; c < NC; ++c) {
          sv[c] = sd + size_t(c) * a.side_stride + size_t(i) * kQ8KSide;
          dx[c] = ldf(sv[c]);
          xq[c] = xa + size_t(c) * a.act_stride + size_t(i) * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs);
        }
        // ggml's tiled mat-mul: t = float(sumi) * d_w (Q4_K / Q5_K: minus dmin_w * float(summ),
        // fused), acc = fma(t, d_x, acc) per super-block.
        __m256i sumi[NC];
        for (int c = 0; c < NC; ++c) sumi[c] = _mm256_setzero_si256();
        for (int s = 0; s < kNsub<S>; ++s) {
          const uint8_t* xs[NC];
          for (int c = 0; c < NC; ++c) xs[c] = xq[c] + 4 * kG * s;
          scaled_sums<NC, kG, kRun, S == Sup::IQ4_XS>(wb + 64 * kG * s, xs, ldy(vb + 64 * (2 + s)), sumi);
        }
        for (int c = 0; c < NC; ++c) {
          const __m256 vdx = _mm256_set1_ps(dx[c]);
          if constexpr (S == Sup::Q4_K || S == Sup::Q5_K) {
            __m256i summ = _mm256_setzero_si256();
            for (int j = 0; j < 4; ++j)
              summ = _mm256_add_epi32(summ, _mm256_madd_epi16(ldy(vb + 64 * (10 + j)), bcast(sv[c] + 16 + 4 * j)));
            const __m256 t = _mm256_fnmadd_ps(ldyf(vb + 64), _mm256_cvtepi32_ps(summ),
                                              _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[c]), d8));
            acc[c] = _mm256_fmadd_ps(t, vdx, acc[c]);
          } else {
            __m256i si = sumi[c];
            if constexpr (S == Sup::Q6_K) {  // the codes' offset: 32 * sum over sub-blocks of sc * bsum
              __m256i o = _mm256_setzero_si256();
              for (int j = 0; j < 8; ++j)
                o = _mm256_add_epi32(o, _mm256_madd_epi16(ldy(vb + 64 * (18 + j)), bcast(sv[c] + 32 + 4 * j)));
              si = _mm256_sub_epi32(si, _mm256_slli_epi32(o, 5));
            }
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(si), d8), vdx, acc[c]);
          }
        }
      }
      for (int c = 0; c < NC; ++c) store_rows(a, h, c0 + c, acc[c]);
    });
  }
}

// Q8_0 columns: d_x per side block of kStride bytes (tile_side_bytes' layout: 36 bytes for Q8_0
// weights, 8 for Q4_0 / IQ4_NL; the rest is the AVX-512 tile's and unused here).
template <size_t kStride>
void side_q8_0_d(int64_t k, const void* act, void* side) {
  const auto* a = static_cast<const uint8_t*>(act);
  auto* s = static_cast<uint8_t*>(side);
  for (int64_t b = 0; b < k / 32; ++b) {
    const float dx = h2f(ld16(a + size_t(b) * 34));
    std::memcpy(s + kStride * b, &dx, 4);
  }
}

}  // namespace

void fill_tile_avx2(Table& t) {
  auto set = [&t](GgmlType w, TileSideFn side, TileMmFn mm) {
    t.tile_side[type_index(w)] = side;
    t.tile_mm[type_index(w)] = mm;
  };
  set(GgmlType::Q4_0, side_q8_0_d<8>, tile_blk<Blk::Q4_0>);
  set(GgmlType::IQ4_NL, side_q8_0_d<8>, tile_blk<Blk::IQ4_NL>);
  set(GgmlType::Q8_0, side_q8_0_d<36>, tile_blk<Blk::Q8_0>);
  set(GgmlType::Q4_1, side_q8_1, tile_blk<Blk::Q4_1>);
  set(GgmlType::Q4_K, side_q8_k, tile_sup<Sup::Q4_K>);
  set(GgmlType::Q5_K, side_q8_k, tile_sup<Sup::Q5_K>);
  set(GgmlType::Q6_K, side_q8_k, tile_sup<Sup::Q6_K>);
  set(GgmlType::IQ4_XS, side_q8_k, tile_sup<Sup::IQ4_XS>);
}

}  // namespace kiln::kernels::cpu
