// kernels/cpu/tile_avx512.cpp — the AVX-512 table's many-column ("tile") quantized mat-mul:
//   Q4_0 Q4_1 IQ4_NL Q8_0 Q4_K Q5_K Q6_K IQ4_XS weights against ggml-quantized activation columns.
// Owns: the tile layout (16 weight rows decoded once into vpdpbusd order), the per-column side data
//   (activation scales and offset sums; the Q8_1 / Q8_K layouts, which the AVX2 tile reads too, in
//   tile_common.h with the helpers both tiles share), and the kernels that multiply a decoded tile
//   with many columns. The results are the bits of the table's vec_dot_q8 entry for each type (the same
//   per-output float chains; only the exact integer sums are formed differently), so the tile path
//   is a speed choice, never a numerical one: matmul may take it for any column count.
// Must not: change any float step of the orders documented in x86_kernels.inc / docs/kernels.md;
//   be used where matmul picks another entry than vec_dot_q8 (vec_dot_q8_rows_not8 for Q4_0 /
//   IQ4_NL / Q4_K matrices whose row count is not a multiple of 8, vec_dot_q8_expert for Q4_K
//   experts): those are other orders.
// Threading: pure functions; each call owns its scratch (one per pool thread, from the workspace).
//
// Layout. A tile is kTileRows = 16 consecutive weight rows. Its elements are decoded once (per
// matmul call) into unsigned 8-bit codes, grouped by 4 consecutive elements ("dword groups"): group
// g of the tile is 64 bytes, row r's 4 codes at bytes 4r..4r+3, so one zmm holds one group of all
// 16 rows and vpdpbusd against the column's 4 activation bytes (broadcast) adds each row's 4
// products to its own int32 lane: lane = row. Per-row block data (scales, minima) are stored as
// 16-lane vectors beside the codes. Codes are the weights plus an offset where they are signed
// (Q4_0: +8, IQ4_NL / IQ4_XS / Q8_0: +128); the offset times the column's element sums (side data,
// precomputed once per matmul) is taken out exactly in int32.
//
// Float steps, per output (lane = row, one vector per column), as the vec_dot_q8 entries:
//   Q4_0 IQ4_NL (ggml's repacked gemm): acc = fma(float(isum), d_w*d_x, acc) per block.
//   Q8_0 Q4_1 (ggml_vec_dot, one chain of 8 lanes): lane l of the block = the products of elements
//        4l..4l+3: acc_l = fma(d_w*d_x, float(isum_l), acc_l); hsum_float_8's tree; + corr (Q4_1:
//        corr = fma(m_w, s_x, corr) per block; Q8_0: 0).
//   Q4_K (ggml's repacked gemm): per pair of sub-blocks acc = fma(float(S), d_w*d_x, acc),
//        accm = fma(float(M), dmin_w*d_x, accm); acc - accm.
//   Q5_K Q6_K IQ4_XS (ggml's tiled mat-mul): t = float(sumi)*d_w (Q5_K: fnmadd dmin_w*float(summ)),
//        acc = fma(t, d_x, acc) per super-block.
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

inline __m512i ldz(const uint8_t* p) { return _mm512_load_si512(p); }
inline __m512i bcast(const uint8_t* p) { return _mm512_set1_epi32(ld32(p)); }

inline __m256i iq4nl_u8() {  // IQ4_NL values + 128, as unsigned codes
  const __m128i t = _mm_xor_si128(load128(kIQ4NLValues), _mm_set1_epi8(char(0x80)));
  return _mm256_setr_m128i(t, t);
}

// tmp: R rows of U codes (row stride U) -> U/4 groups of 64 bytes (row r at 4r) at out.
inline void transpose_rows(const uint8_t* tmp, int U, uint8_t* out) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(U / 4));
  for (int g = 0; g < U / 4; ++g)
    _mm512_store_si512(out + 64 * g, _mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(g)), tmp, 4));
}
inline __mmask16 row_mask(int nr) { return __mmask16((1u << nr) - 1); }

// ---- side data: per column, from its quantized activation (act_type's layout) ----
// Q8_0 activations (34-byte blocks): Q4_0 / IQ4_NL: {float d_x, int32 -off*sum(qs)} per block;
// Q8_0 weights: {float d_x, int32 -128*sum(qs[4l..4l+3]) for l < 8} per block.
template <int kOff>
void side_q8_0_sum(int64_t k, const void* act, void* side) {
  const auto* a = static_cast<const uint8_t*>(act);
  auto* s = static_cast<uint8_t*>(side);
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* ab = a + size_t(b) * 34;
    int sum = 0;
    for (int e = 0; e < 32; ++e) sum += int8_t(ab[2 + e]);
    const float dx = h2f(ld16(ab));
    const int32_t off = -kOff * sum;
    std::memcpy(s + 8 * b, &dx, 4);
    std::memcpy(s + 8 * b + 4, &off, 4);
  }
}
void side_q8_0_lanes(int64_t k, const void* act, void* side) {
  const auto* a = static_cast<const uint8_t*>(act);
  auto* s = static_cast<uint8_t*>(side);
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* ab = a + size_t(b) * 34;
    const float dx = h2f(ld16(ab));
    std::memcpy(s + 36 * b, &dx, 4);
    for (int l = 0; l < 8; ++l) {
      int sum = 0;
      for (int e = 0; e < 4; ++e) sum += int8_t(ab[2 + 4 * l + e]);
      const int32_t off = -128 * sum;
      std::memcpy(s + 36 * b + 4 + 4 * l, &off, 4);
    }
  }
}


// ---- 32-element block types: Q4_0 / IQ4_NL (repacked gemm order), Q8_0 / Q4_1 (one chain of 8
// lanes; Q4_1 plus ggml's offset chain corr = fma(m_w, s_x, corr), added after the reduction) ----
// Scratch: codes [nb][8 groups][64], then d_w [nb][16] floats, then (Q4_1) m_w [nb][16].
enum class Blk { Q4_0, IQ4_NL, Q8_0, Q4_1 };
template <Blk B>
void decode_blk(const TileMmArgs& a, uint8_t* codes, float* dw) {
  const int64_t nb = a.k / 32;
  constexpr size_t kBytes = B == Blk::Q8_0 ? sizeof(BlockQ8_0) : B == Blk::Q4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  float* mw = dw + 16 * nb;
  alignas(64) uint8_t tmp[R * 32];
  const __m256i tbl = iq4nl_u8(), flip = _mm256_set1_epi8(char(0x80));
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
      if constexpr (B == Blk::Q4_0) q = unpack_nibbles(blk + 2);
      if constexpr (B == Blk::IQ4_NL) q = _mm256_shuffle_epi8(tbl, unpack_nibbles(blk + 2));
      if constexpr (B == Blk::Q8_0) q = _mm256_xor_si256(load256(blk + 2), flip);
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

template <Blk B>
void tile_blk(const TileMmArgs& a) {
  const int64_t nb = a.k / 32;
  auto* codes = static_cast<uint8_t*>(a.scratch);
  auto* dw = reinterpret_cast<float*>(codes + size_t(nb) * 512);
  decode_blk<B>(a, codes, dw);
  const __mmask16 mask = row_mask(a.nr);
  if constexpr (B == Blk::Q4_0 || B == Blk::IQ4_NL) {
    over_columns<8>(a.m, [&]<int NC>(int64_t c0) {
      __m512 acc[NC];
      for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
      const uint8_t* xq = a.act + size_t(c0) * a.act_stride + 2;
      const uint8_t* sd = a.side + size_t(c0) * a.side_stride;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* wb = codes + size_t(b) * 512;
        const __m512i w0 = ldz(wb), w1 = ldz(wb + 64), w2 = ldz(wb + 128), w3 = ldz(wb + 192), w4 = ldz(wb + 256),
                      w5 = ldz(wb + 320), w6 = ldz(wb + 384), w7 = ldz(wb + 448);
        const __m512 d16 = _mm512_load_ps(dw + 16 * b);
        for (int c = 0; c < NC; ++c) {
          const uint8_t* x = xq + size_t(c) * a.act_stride + size_t(b) * 34;
          const uint8_t* s = sd + size_t(c) * a.side_stride + size_t(b) * 8;
          __m512i is = _mm512_set1_epi32(ld32(s + 4));
          is = _mm512_dpbusd_epi32(is, w0, bcast(x));
          is = _mm512_dpbusd_epi32(is, w1, bcast(x + 4));
          is = _mm512_dpbusd_epi32(is, w2, bcast(x + 8));
          is = _mm512_dpbusd_epi32(is, w3, bcast(x + 12));
          is = _mm512_dpbusd_epi32(is, w4, bcast(x + 16));
          is = _mm512_dpbusd_epi32(is, w5, bcast(x + 20));
          is = _mm512_dpbusd_epi32(is, w6, bcast(x + 24));
          is = _mm512_dpbusd_epi32(is, w7, bcast(x + 28));
          float dx;
          std::memcpy(&dx, s, 4);
          acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(d16, _mm512_set1_ps(dx)), acc[c]);
        }
      }
      for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(a.y + (c0 + c) * a.y_stride, mask, acc[c]);
    });
  } else {
    constexpr bool kQ41 = B == Blk::Q4_1;
    constexpr size_t kAB = kQ41 ? 36 : 34, kSB = kQ41 ? 8 : 36;  // activation block, side block
    const float* mw = dw + 16 * nb;
    over_columns<2>(a.m, [&]<int NC>(int64_t c0) {
      __m512 acc[NC][8], corr[NC];
      for (int c = 0; c < NC; ++c) {
        corr[c] = _mm512_setzero_ps();
        for (int l = 0; l < 8; ++l) acc[c][l] = _mm512_setzero_ps();
      }
      const uint8_t* xq = a.act + size_t(c0) * a.act_stride + (kQ41 ? 4 : 2);
      const uint8_t* sd = a.side + size_t(c0) * a.side_stride;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* wb = codes + size_t(b) * 512;
        const __m512 d16 = _mm512_load_ps(dw + 16 * b);
        for (int c = 0; c < NC; ++c) {
          const uint8_t* x = xq + size_t(c) * a.act_stride + size_t(b) * kAB;
          const uint8_t* s = sd + size_t(c) * a.side_stride + size_t(b) * kSB;
          float dx;
          std::memcpy(&dx, s, 4);
          const __m512 dd = _mm512_mul_ps(d16, _mm512_set1_ps(dx));
          for (int l = 0; l < 8; ++l) {
            const __m512i init = kQ41 ? _mm512_setzero_si512() : _mm512_set1_epi32(ld32(s + 4 + 4 * l));
            const __m512i is = _mm512_dpbusd_epi32(init, ldz(wb + 64 * l), bcast(x + 4 * l));
            acc[c][l] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(is), acc[c][l]);
          }
          if constexpr (kQ41) {
            float sx;
            std::memcpy(&sx, s + 4, 4);
            corr[c] = _mm512_fmadd_ps(_mm512_load_ps(mw + 16 * b), _mm512_set1_ps(sx), corr[c]);
          }
        }
      }
      for (int c = 0; c < NC; ++c) {
        const __m512* v = acc[c];  // hsum_float_8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then + 0
        const __m512 e = _mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6]));
        const __m512 o = _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7]));
        _mm512_mask_storeu_ps(a.y + (c0 + c) * a.y_stride, mask, _mm512_add_ps(_mm512_add_ps(e, o), corr[c]));
      }
    });
  }
}

// ---- super-block types (Q8_K columns) ----
// Scratch per super-block: codes [64 groups][64] (4096 bytes), then the row vectors of kVecs(T)
// 16-lane entries: d_w, dmin_w (or unused), then per type:
//   Q4_K Q5_K: sc[8] (int32), mnpair[4] (int16 pairs (mn[2j], mn[2j+1]))      -> 2 + 12 vectors
//   Q6_K: sc[16], scpair[8]                                                   -> 2 + 24
//   IQ4_XS: ls[8] (ls - 32), lspair[4]                                        -> 2 + 12
enum class Sup { Q4_K, Q5_K, Q6_K, IQ4_XS };
template <Sup S> constexpr int kNsub = S == Sup::Q6_K ? 16 : 8;  // scaled sub-blocks per super-block
template <Sup S> constexpr int kVecs = 2 + kNsub<S> + kNsub<S> / 2;
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
    for (int s = 0; s < 8; ++s) v[2 + s] = uint32_t(sc[s]);
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
    for (int s = 0; s < 16; ++s) v[2 + s] = uint32_t(int32_t(b->scales[s]));
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
    int ls[8];
    for (int s = 0; s < 8; ++s) ls[s] = int(((sl >> (4 * s)) & 15) | (((sh >> (2 * s)) & 3) << 4)) - 32;
    for (int s = 0; s < 8; ++s) v[2 + s] = uint32_t(ls[s]);
    for (int j = 0; j < 4; ++j) v[10 + j] = pair16(ls[2 * j], ls[2 * j + 1]);
    const __m256i tbl = iq4nl_u8();
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

// The exact integer sum of one scaled sub-block of n dword groups (codes at w, column bytes at x).
template <int N>
inline __m512i sub_isum(const uint8_t* w, const uint8_t* x) {
  __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ldz(w), bcast(x));
  for (int g = 1; g < N; ++g) is = _mm512_dpbusd_epi32(is, ldz(w + 64 * g), bcast(x + 4 * g));
  return is;
}

template <Sup S>
void tile_sup(const TileMmArgs& a) {
  const int64_t ns = a.k / 256;
  auto* base = static_cast<uint8_t*>(a.scratch);
  decode_sup<S>(a, base);
  const __mmask16 mask = row_mask(a.nr);
  constexpr int kG = 256 / kNsub<S> / 4;  // dword groups per scaled sub-block (8, Q6_K 4)
  over_columns<4>(a.m, [&]<int NC>(int64_t c0) {
    __m512 acc[NC], accm[NC];
    for (int c = 0; c < NC; ++c) acc[c] = accm[c] = _mm512_setzero_ps();
    const uint8_t* xa = a.act + size_t(c0) * a.act_stride;
    const uint8_t* sd = a.side + size_t(c0) * a.side_stride;
    for (int64_t i = 0; i < ns; ++i) {
      const uint8_t* wb = base + size_t(i) * kSupBytes<S>;
      const auto* vv = reinterpret_cast<const float*>(wb + 4096);
      const __m512i* vi = reinterpret_cast<const __m512i*>(wb + 4096);
      const __m512 d16 = _mm512_load_ps(vv);
      float dx[NC];
      for (int c = 0; c < NC; ++c) std::memcpy(&dx[c], sd + size_t(c) * a.side_stride + size_t(i) * kQ8KSide, 4);
      const uint8_t* xq[NC];
      for (int c = 0; c < NC; ++c) xq[c] = xa + size_t(c) * a.act_stride + size_t(i) * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs);
      const uint8_t* sv[NC];
      for (int c = 0; c < NC; ++c) sv[c] = sd + size_t(c) * a.side_stride + size_t(i) * kQ8KSide;
      if constexpr (S == Sup::Q4_K) {
        const __m512 m16 = _mm512_load_ps(vv + 16);
        for (int j = 0; j < 4; ++j) {
          const __m512i sc0 = _mm512_load_si512(vi + 2 + 2 * j), sc1 = _mm512_load_si512(vi + 3 + 2 * j);
          const __m512i mnp = _mm512_load_si512(vi + 10 + j);
          __m512i Sj[NC];
          for (int c = 0; c < NC; ++c) Sj[c] = _mm512_mullo_epi32(sub_isum<8>(wb + 64 * 16 * j, xq[c] + 64 * j), sc0);
          for (int c = 0; c < NC; ++c)
            Sj[c] = _mm512_add_epi32(Sj[c], _mm512_mullo_epi32(sub_isum<8>(wb + 64 * (16 * j + 8), xq[c] + 64 * j + 32), sc1));
          for (int c = 0; c < NC; ++c) {
            const __m512 vdx = _mm512_set1_ps(dx[c]);
            const __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mnp, bcast(sv[c] + 16 + 4 * j));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Sj[c]), _mm512_mul_ps(d16, vdx), acc[c]);
            accm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(m16, vdx), accm[c]);
          }
        }
      } else {
        __m512i sumi[NC];
        for (int c = 0; c < NC; ++c) sumi[c] = _mm512_setzero_si512();
        for (int s = 0; s < kNsub<S>; ++s) {
          const __m512i sc = _mm512_load_si512(vi + 2 + s);
          for (int c = 0; c < NC; ++c)
            sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(sub_isum<kG>(wb + 64 * kG * s, xq[c] + 4 * kG * s), sc));
        }
        for (int c = 0; c < NC; ++c) {
          const __m512 vdx = _mm512_set1_ps(dx[c]);
          if constexpr (S == Sup::Q5_K) {
            __m512i summ = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) summ = _mm512_dpwssd_epi32(summ, _mm512_load_si512(vi + 10 + j), bcast(sv[c] + 16 + 4 * j));
            const __m512 t = _mm512_fnmadd_ps(_mm512_load_ps(vv + 16), _mm512_cvtepi32_ps(summ),
                                              _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[c]), d16));
            acc[c] = _mm512_fmadd_ps(t, vdx, acc[c]);
          } else {
            // the codes' offset: Q6_K 32 * sum sc*bsum16, IQ4_XS 128 * sum ls*bsum32
            constexpr int kP = kNsub<S> / 2, kSh = S == Sup::Q6_K ? 5 : 7, kOff = S == Sup::Q6_K ? 32 : 16;
            __m512i o = _mm512_setzero_si512();
            for (int j = 0; j < kP; ++j) o = _mm512_dpwssd_epi32(o, _mm512_load_si512(vi + 2 + kNsub<S> + j), bcast(sv[c] + kOff + 4 * j));
            const __m512i si = _mm512_sub_epi32(sumi[c], _mm512_slli_epi32(o, kSh));
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(si), d16), vdx, acc[c]);
          }
        }
      }
    }
    for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(a.y + (c0 + c) * a.y_stride, mask, S == Sup::Q4_K ? _mm512_sub_ps(acc[c], accm[c]) : acc[c]);
  });
}

}  // namespace

void fill_tile_avx512(Table& t) {
  auto set = [&t](GgmlType w, TileSideFn side, TileMmFn mm) {
    t.tile_side[type_index(w)] = side;
    t.tile_mm[type_index(w)] = mm;
  };
  set(GgmlType::Q4_0, side_q8_0_sum<8>, tile_blk<Blk::Q4_0>);
  set(GgmlType::IQ4_NL, side_q8_0_sum<128>, tile_blk<Blk::IQ4_NL>);
  set(GgmlType::Q8_0, side_q8_0_lanes, tile_blk<Blk::Q8_0>);
  set(GgmlType::Q4_1, side_q8_1, tile_blk<Blk::Q4_1>);
  set(GgmlType::Q4_K, side_q8_k, tile_sup<Sup::Q4_K>);
  set(GgmlType::Q5_K, side_q8_k, tile_sup<Sup::Q5_K>);
  set(GgmlType::Q6_K, side_q8_k, tile_sup<Sup::Q6_K>);
  set(GgmlType::IQ4_XS, side_q8_k, tile_sup<Sup::IQ4_XS>);
}

}  // namespace kiln::kernels::cpu
