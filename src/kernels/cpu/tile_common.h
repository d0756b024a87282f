// kernels/cpu/tile_common.h — what the AVX2 and AVX-512 tile mat-muls (tile_avx2.cpp,
//   tile_avx512.cpp) share: small loaders, the nibble unpacking, the column loop, and the per-column
//   side data of Q8_1 and Q8_K activations (the layouts both tiles read).
// Must not: be included anywhere else, or give anything external linkage: the two translation
//   units are compiled for different instruction sets, so each gets its own copy (an unnamed
//   namespace) instead of one inline definition the linker could share between them.
// Threading: pure functions.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/dispatch.h"
#include "tensor/blocks.h"

namespace kiln::kernels::cpu {
namespace {

constexpr int R = kTileRows;  // 16
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t ld16(const void* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline int32_t ld32(const void* p) { int32_t v; std::memcpy(&v, p, 4); return v; }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline uint32_t pair16(int lo, int hi) { return uint32_t(uint16_t(int16_t(lo))) | uint32_t(uint16_t(int16_t(hi))) << 16; }

// 16 packed bytes -> 32 nibbles: low nibbles (elements 0..15) then high (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i raw = load128(qs), m4 = _mm_set1_epi8(0x0f);
  return _mm256_setr_m128i(_mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
}

// Runs body.template operator()<NC>(c0) over the m columns in chunks of kNC, then the remainder.
template <int kNC, class B>
inline void over_columns(int64_t m, B&& body) {
  int64_t c = 0;
  for (; c + kNC <= m; c += kNC) body.template operator()<kNC>(c);
  const int rest = int(m - c);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? (body.template operator()<I + 1>(c), 0) : 0), ...);
  }(std::make_integer_sequence<int, kNC - 1>{});
}

// Q8_1 activations (36-byte blocks: fp16 d, fp16 s, qs) for Q4_1 weights: {float d_x, float s_x}.
inline void side_q8_1(int64_t k, const void* act, void* side) {
  const auto* a = static_cast<const uint8_t*>(act);
  auto* s = static_cast<uint8_t*>(side);
  for (int64_t b = 0; b < k / 32; ++b) {
    const float v[2] = {h2f(ld16(a + size_t(b) * 36)), h2f(ld16(a + size_t(b) * 36 + 2))};
    std::memcpy(s + 8 * b, v, 8);
  }
}
// Q8_K activations: per super-block 64 bytes {float d_x, pad[3], uint32 bs32[4], uint32 bs16[8]}:
// bs32[j] = the int16 pair (sum of sub-block 2j's 32 qs, of 2j+1's), bs16[j] = (bsums[2j], bsums[2j+1]).
constexpr size_t kQ8KSide = 64;
inline void side_q8_k(int64_t k, const void* act, void* side) {
  const auto* a = static_cast<const tensor::BlockQ8_K*>(act);
  auto* s = static_cast<uint8_t*>(side);
  for (int64_t i = 0; i < k / 256; ++i) {
    uint8_t* o = s + size_t(i) * kQ8KSide;
    std::memset(o, 0, kQ8KSide);
    std::memcpy(o, &a[i].d, 4);
    const int16_t* bs = a[i].bsums;
    for (int j = 0; j < 4; ++j) {
      const uint32_t v = pair16(bs[4 * j] + bs[4 * j + 1], bs[4 * j + 2] + bs[4 * j + 3]);
      std::memcpy(o + 16 + 4 * j, &v, 4);
    }
    for (int j = 0; j < 8; ++j) {
      const uint32_t v = pair16(bs[2 * j], bs[2 * j + 1]);
      std::memcpy(o + 32 + 4 * j, &v, 4);
    }
  }
}

}  // namespace
}  // namespace kiln::kernels::cpu
