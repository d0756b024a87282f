// tensor/blocks.h — the exact byte layout of every quantized GGUF block type kiln supports.
// Owns: one POD struct per block type, matching ggml's layout byte for byte (checked by
//   static_assert on sizeof and offsetof), plus the IQ4_NL codebook. Every struct comment gives
//   the bit layout and the reconstruction formula; docs/formats.md has the long version.
// Must not: contain code beyond trivial accessors (the packed-scale getters); quantize/dequantize
//   live in tensor/quant.cpp.
// Threading: plain data.
//
// Conventions used in the comments:
//   y[i]      the reconstructed float for element i of the block (0-based, in memory order)
//   fp16(h)   an IEEE half stored little-endian (core/fp16.h converts it)
//   lo(b)/hi(b)  the low / high nibble of byte b
//   All multi-byte fields are little-endian. Structs only hold bytes and uint16 halves (and the
//   f32 / int16 fields of Q8_K), so a block may start at any 2-byte (Q8_K: 4-byte) boundary.
//   Code that may see unaligned data copies a block out with memcpy first.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln::tensor {

inline constexpr int kQK = 32;    // elements per block of the legacy types and IQ4_NL
inline constexpr int kQK_K = 256; // elements per super-block of the K-quants, IQ4_XS, Q8_K
inline constexpr int kKScaleSize = 12;  // packed 6-bit scales+mins of Q4_K/Q5_K

// Q4_0 — 32 weights, 18 bytes, 4.5 bpw. Symmetric 4-bit.
//   byte 0..1   d (fp16)
//   byte 2..17  qs[16]: qs[j] = q[j] | q[j+16] << 4      (j = 0..15)
//   y[i] = d * (q[i] - 8)
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1 — 32 weights, 20 bytes, 5.0 bpw. Asymmetric 4-bit.
//   byte 0..1 d (fp16) | byte 2..3 m (fp16) | byte 4..19 qs[16] as in Q4_0
//   y[i] = d * q[i] + m
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0 — 32 weights, 22 bytes, 5.5 bpw. Symmetric 5-bit.
//   byte 0..1 d (fp16) | byte 2..5 qh (uint32 LE): bit i = bit 4 of q[i] | byte 6..21 qs[16]:
//   qs[j] = (q[j] & 15) | (q[j+16] & 15) << 4
//   y[i] = d * (q[i] - 16)
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1 — 32 weights, 24 bytes, 6.0 bpw. Asymmetric 5-bit.
//   byte 0..1 d | byte 2..3 m | byte 4..7 qh | byte 8..23 qs   (as Q5_0)
//   y[i] = d * q[i] + m
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q8_0 — 32 weights, 34 bytes, 8.5 bpw. Symmetric 8-bit (also the activation type for the
// 32-element weight types).
//   byte 0..1 d (fp16) | byte 2..33 qs[32] (int8)
//   y[i] = d * qs[i]
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// IQ4_NL — 32 weights, 18 bytes, 4.5 bpw. 4-bit indices into a fixed non-linear codebook.
//   byte 0..1 d (fp16) | byte 2..17 qs[16]: qs[j] = k[j] | k[j+16] << 4
//   y[i] = d * kIQ4NLValues[k[i]]
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// The IQ4_NL / IQ4_XS codebook (a constant of the format, ggml's kvalues_iq4nl). Sorted.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Q2_K — 256 weights, 84 bytes, 2.625 bpw. 16 sub-blocks of 16, 2-bit q, 4-bit scale and min.
//   byte 0..15   scales[16]: scales[s] = sc[s] | mn[s] << 4    (sub-block s = 0..15)
//   byte 16..79  qs[64]: two halves of 128 weights; in half h, byte qs[32h + l] (l = 0..31) holds
//                4 crumbs: bits 2k..2k+1 = q[128h + 32k + l]   (k = 0..3)
//   byte 80..81  d (fp16) | byte 82..83 dmin (fp16)
//   element i is in sub-block s = i / 16;   y[i] = (d * sc[s]) * q[i] - (dmin * mn[s])
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(offsetof(BlockQ2_K, d) == 80);

// Q3_K — 256 weights, 110 bytes, 3.4375 bpw. 16 sub-blocks of 16, 3-bit q, signed 6-bit scales.
//   byte 0..31    hmask[32]: bit k of hmask[l] = bit 2 of L[32k + l]   (k = 0..7, l = 0..31)
//   byte 32..95   qs[64]: low 2 bits of L, packed like Q2_K's qs
//   byte 96..107  scales[12]: 16 six-bit values S[s] (s = 0..15):
//                   low 4 bits: s < 8 ? lo(scales[s]) : hi(scales[s - 8])
//                   high 2 bits: bits 2*(s/4)..2*(s/4)+1 of scales[8 + s%4]
//   byte 108..109 d (fp16)
//   L = q + 4 in 0..7, q in -4..3;  y[i] = (d * (S[i/16] - 32)) * q[i]
//   (ggml writes it as ((qs >> shift) & 3) - (hmask bit ? 0 : 4).)
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(offsetof(BlockQ3_K, d) == 108);
// S[s] (0..63) from BlockQ3_K::scales.
inline int get_scale_q3k(int s, const uint8_t* scales) {
  const int lo = s < 8 ? (scales[s] & 0xF) : (scales[s - 8] >> 4);
  const int hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return lo | hi << 4;
}

// Q4_K — 256 weights, 144 bytes, 4.5 bpw. 8 sub-blocks of 32, 4-bit q, 6-bit scale and min.
//   byte 0..1 d (fp16) | byte 2..3 dmin (fp16)
//   byte 4..15 scales[12]: 8 six-bit scales sc[s] and mins mn[s]:
//     s < 4:  sc[s] = scales[s] & 63            mn[s] = scales[s+4] & 63
//     s >= 4: sc[s] = lo(scales[s+4]) | (scales[s-4] >> 6) << 4
//             mn[s] = hi(scales[s+4]) | (scales[s]   >> 6) << 4
//   byte 16..143 qs[128]: in chunk c (c = 0..3, 64 weights), byte qs[32c + l] (l = 0..31) =
//                q[64c + l] | q[64c + 32 + l] << 4
//   y[i] = (d * sc[i/32]) * q[i] - (dmin * mn[i/32])
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);
// sc[s] and mn[s] (0..63) from BlockQ4_K::scales / BlockQ5_K::scales.
inline void get_scale_min_k4(int s, const uint8_t* q, int* sc, int* mn) {
  if (s < 4) {
    *sc = q[s] & 63;
    *mn = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
    *mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

// Q5_K — 256 weights, 176 bytes, 5.5 bpw. As Q4_K plus a fifth bit per weight.
//   byte 0..1 d | 2..3 dmin | 4..15 scales (as Q4_K) | 16..47 qh[32] | 48..175 qs[128] (as Q4_K)
//   bit 4 of q[32s + l] (s = 0..7, l = 0..31) is bit s of qh[l]
//   y[i] = (d * sc[i/32]) * q[i] - (dmin * mn[i/32]),  q in 0..31
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K — 256 weights, 210 bytes, 6.5625 bpw. 16 sub-blocks of 16, 6-bit q, int8 scales.
//   byte 0..127   ql[128]: low 4 bits.  byte 128..191 qh[64]: high 2 bits.
//   byte 192..207 scales[16] (int8).  byte 208..209 d (fp16).
//   Two halves h = 0..1 of 128 weights; inside half h, for l = 0..31, with ql' = ql + 64h,
//   qh' = qh + 32h, and L = q + 32 (0..63):
//     L[128h + l]      = lo(ql'[l])      | ((qh'[l] >> 0) & 3) << 4
//     L[128h + l + 32] = lo(ql'[l + 32]) | ((qh'[l] >> 2) & 3) << 4
//     L[128h + l + 64] = hi(ql'[l])      | ((qh'[l] >> 4) & 3) << 4
//     L[128h + l + 96] = hi(ql'[l + 32]) | ((qh'[l] >> 6) & 3) << 4
//   y[i] = (d * scales[i/16]) * (L[i] - 32)
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(offsetof(BlockQ6_K, d) == 208);

// IQ4_XS — 256 weights, 136 bytes, 4.25 bpw. 8 sub-blocks of 32 codebook indices, 6-bit scales.
//   byte 0..1 d (fp16) | byte 2..3 scales_h (uint16 LE) | byte 4..7 scales_l[4] | byte 8..135 qs
//   ls[s] = ((scales_l[s/2] >> 4*(s%2)) & 15) | ((scales_h >> 2s) & 3) << 4     (s = 0..7)
//   qs[16s + j] = k[32s + j] | k[32s + j + 16] << 4                            (j = 0..15)
//   y[i] = (d * (ls[i/32] - 32)) * kIQ4NLValues[k[i]]
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Q8_K — 256 values, 292 bytes. Activation type for the K-quants and IQ4_XS (never a weight).
//   byte 0..3 d (f32) | byte 4..259 qs[256] (int8) | byte 260..291 bsums[16] (int16):
//   bsums[g] = sum of qs[16g .. 16g+15]
//   y[i] = d * qs[i]
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace kiln::tensor
