// core/fp16.h — scalar IEEE half and bfloat16 conversions (round to nearest even), exact.
// These are the reference conversions; SIMD paths must agree bit for bit.
#pragma once
#include <cstdint>
#include <cstring>

namespace kiln {

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return bits_to_f32(sign);
    // subnormal: normalise
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
    mant &= 0x3ff;
    return bits_to_f32(sign | uint32_t(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | mant << 13);
  return bits_to_f32(sign | (exp + 112) << 23 | mant << 13);
}

inline uint16_t f32_to_fp16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  const uint32_t absu = u & 0x7fffffff;
  if (absu >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 | ((absu >> 13) & 0x3ff) : 0));
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520 -> inf
  if (absu < 0x38800000u) {                                 // below smallest normal half: subnormal or zero
    const uint32_t shift = 126 - (absu >> 23);             // 14 + (113 - e)
    if (shift > 24) return uint16_t(sign);
    const uint32_t m = (absu & 0x7fffff) | 0x800000;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((absu - 0x38000000u) >> 13);
  const uint32_t rem = absu & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return uint16_t(sign | r);
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

}  // namespace kiln
