// kernels/cuda/dequant_q8.cuh — the weight side of the int8 mat-vec (matvec_q8.cuh): for one "unit"
//   (32 weights) of a block held in shared memory, its 32 codes as 8 words of 4 int8 each (for
//   __dp4a against 32 int8 x values) and its scales, for Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL Q4_K Q5_K
//   Q6_K IQ4_XS.
// Owns: the format facts of tensor/blocks.h restated as integer codes. A unit's element e has the
//   code c_e (an int8: the quant, or the IQ4 codebook value) and the unit's value is
//     sum_e w_e x_e = sum over the halves h of d_h * (sum_{e in h} c_e x_e - kOff * sum_{e in h} x_e)
//                     + m * sum_e x_e,
//   with halves h = elements 0..15 / 16..31 in x order (kHalves: two scales d0, d1; else d0 only)
//   and m the block offset (kMin types). "x order" is the order in which the quantizer lays out a
//   unit's 32 x values (kXPairs: position 2i + h holds element i + 16h, which is the order the IQ4
//   codebook lookup produces; else natural). Code words c[j] hold x positions 4j..4j+3.
// Must not: allocate or know about launch geometry (beyond the PDL launch names). Pointers are shared-memory byte pointers whose
//   alignment the caller states in A (bytes, >= 2); runs of words at a 2-byte aligned address are
//   read as the aligned words around them (one word past the run is read) and funnel-shifted.
// Threading: pure device functions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gguf/types.h"
#include "kernels/cuda/pdl.cuh"
#include "tensor/blocks.h"

namespace kiln::cuda::q8 {

using gguf::GgmlType;

inline constexpr int kXNatural = 0, kXPairs = 1;

// Programmatic dependent launch (pdl.cuh), under the names the mat-vec kernels use.
__device__ __forceinline__ void pdl_launch_dependents() { pdl::trigger(); }
__device__ __forceinline__ void pdl_wait() { pdl::wait(); }
template <class... P, class... A>
void launch(bool on, dim3 grid, dim3 block, cudaStream_t s, void (*kernel)(P...), A&&... args) {
  pdl::launch(on, grid, block, 0, s, kernel, static_cast<A&&>(args)...);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t rotl(uint32_t v, uint32_t n) { return __funnelshift_l(v, v, n); }
__device__ __forceinline__ float h2f(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }
__device__ __forceinline__ uint32_t ld16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// N consecutive 32-bit words starting at p (p aligned to A bytes, A >= 2).
template <int A, int N>
__device__ __forceinline__ void words(const uint8_t* p, uint32_t (&o)[N]) {
  if constexpr (A >= 16 && N % 4 == 0) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[j];
      o[4 * j] = v.x, o[4 * j + 1] = v.y, o[4 * j + 2] = v.z, o[4 * j + 3] = v.w;
    }
  } else if constexpr (A >= 8 && N % 2 == 0) {
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[j];
      o[2 * j] = v.x, o[2 * j + 1] = v.y;
    }
  } else if constexpr (A >= 4) {
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = reinterpret_cast<const uint32_t*>(p)[j];
  } else {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(uintptr_t(p) & ~uintptr_t(3));
    const uint32_t sh = uint32_t(uintptr_t(p) & 3) * 8;  // 0 or 16
    uint32_t w[N + 1];
#pragma unroll
    for (int j = 0; j <= N; ++j) w[j] = q[j];
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = __funnelshift_r(w[j], w[j + 1], sh);
  }
}
// Alignment of p + off when p is A-aligned and off a multiple of `unit` (a power of two).
constexpr int al(int A, int unit) { return A < unit ? A : unit; }

// Scales of one unit: value = d0 * (half 0 sum) + d1 * (half 1 sum) + m * sum(x).
struct Sc {
  float d0, d1, m;
};

// IQ4 codebook lookup of the 8 nibbles of one qs word w (byte j: element j low, element j + 16
// high): r0 = values of elements (j0, j0+16, j0+1, j0+17), r1 = (j0+2, j0+18, j0+3, j0+19) where j0
// is the word's first byte, i.e. the kXPairs order.
constexpr uint32_t iq4_word(int i) {
  uint32_t w = 0;
  for (int j = 0; j < 4; ++j) w |= uint32_t(uint8_t(tensor::kIQ4NLValues[4 * i + j])) << (8 * j);
  return w;
}
// The codebook's words T0 and T2 held in registers for a whole kernel (T1 and T3 are prmt's immediate
// operand): loaded once at the kernel's start, so that the compiler cannot fold them back into
// constants, which it re-materialises before every lookup (one move per prmt).
struct Tab {
  uint32_t t0, t2;
};
__device__ const uint32_t kIq4TabWords[2] = {iq4_word(0), iq4_word(2)};
__device__ __forceinline__ Tab iq4_tab() { return {__ldg(&kIq4TabWords[0]), __ldg(&kIq4TabWords[1])}; }
__device__ __forceinline__ void iq4_pairs(uint32_t w, uint32_t& r0, uint32_t& r1, const Tab& t) {
  constexpr uint32_t T1 = iq4_word(1), T3 = iq4_word(3);
  const uint32_t s = w & 0x77777777u, s1 = s >> 16;  // low 3 bits of each index as prmt selectors
  const uint32_t w4 = w << 4;
  // 0xFF in the bytes whose index has bit 3 set (prmt replicating the sign of the selected byte).
  const uint32_t m0 = prmt(w4, w, 0xD9C8u), m1 = prmt(w4, w, 0xFBEAu);
  const uint32_t a0 = prmt(t.t0, T1, s), b0 = prmt(t.t2, T3, s), a1 = prmt(t.t0, T1, s1), b1 = prmt(t.t2, T3, s1);
  r0 = (a0 & ~m0) | (b0 & m0);
  r1 = (a1 & ~m1) | (b1 & m1);
}
__device__ __forceinline__ void iq4_pairs(uint32_t w, uint32_t& r0, uint32_t& r1) {
  iq4_pairs(w, r0, r1, Tab{iq4_word(0), iq4_word(2)});
}

template <GgmlType T>
struct U;  // per-type unit decoder: kQK, kBS, kAlign, kOff, kHalves, kMin, kX, decode<A>(b, sub, c, sc)

template <int kBS_>
constexpr int natural_align() {
  return (kBS_ % 16 == 0) ? 16 : (kBS_ % 8 == 0) ? 8 : (kBS_ % 4 == 0) ? 4 : 2;
}

// Q4_0: d | qs[16]; element j = lo(qs[j]), j + 16 = hi(qs[j]); w = d * (q - 8).
template <>
struct U<GgmlType::Q4_0> {
  static constexpr int kQK = 32, kBS = 18, kAlign = natural_align<kBS>(), kOff = 8, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = false;
  template <int A>
  __device__ static void decode(const uint8_t* b, int, uint32_t (&c)[8], Sc& s, const Tab&) {
    uint32_t q[4];
    words<al(A, 2), 4>(b + 2, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = q[j] & 0x0F0F0F0Fu, c[j + 4] = (q[j] >> 4) & 0x0F0F0F0Fu;
    s.d0 = h2f(ld16(b));
  }
};
// Q4_1: d | m | qs[16]; w = d * q + m.
template <>
struct U<GgmlType::Q4_1> {
  static constexpr int kQK = 32, kBS = 20, kAlign = natural_align<kBS>(), kOff = 0, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = true;
  template <int A>
  __device__ static void decode(const uint8_t* b, int, uint32_t (&c)[8], Sc& s, const Tab&) {
    uint32_t q[4];
    words<al(A, 4), 4>(b + 4, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = q[j] & 0x0F0F0F0Fu, c[j + 4] = (q[j] >> 4) & 0x0F0F0F0Fu;
    s.d0 = h2f(ld16(b)), s.m = h2f(ld16(b + 2));
  }
};
// Q5_0 / Q5_1: the Q4 nibbles plus bit 4 of element i = bit i of qh (uint32 LE).
__device__ __forceinline__ uint32_t spread4(uint32_t v) { return ((v & 15u) * 0x00204081u) & 0x01010101u; }
__device__ __forceinline__ void codes_q5(const uint32_t (&q)[4], uint32_t qh, uint32_t (&c)[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    c[j] = (q[j] & 0x0F0F0F0Fu) | spread4(qh >> (4 * j)) << 4;
    c[j + 4] = ((q[j] >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * j)) << 4;
  }
}
template <>
struct U<GgmlType::Q5_0> {
  static constexpr int kQK = 32, kBS = 22, kAlign = natural_align<kBS>(), kOff = 16, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = false;
  template <int A>
  __device__ static void decode(const uint8_t* b, int, uint32_t (&c)[8], Sc& s, const Tab&) {
    uint32_t v[5];  // qh | qs[16]
    words<al(A, 2), 5>(b + 2, v);
    codes_q5({v[1], v[2], v[3], v[4]}, v[0], c);
    s.d0 = h2f(ld16(b));
  }
};
template <>
struct U<GgmlType::Q5_1> {
  static constexpr int kQK = 32, kBS = 24, kAlign = natural_align<kBS>(), kOff = 0, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = true;
  template <int A>
  __device__ static void decode(const uint8_t* b, int, uint32_t (&c)[8], Sc& s, const Tab&) {
    uint32_t v[5];  // qh | qs[16]
    words<al(A, 4), 5>(b + 4, v);
    codes_q5({v[1], v[2], v[3], v[4]}, v[0], c);
    s.d0 = h2f(ld16(b)), s.m = h2f(ld16(b + 2));
  }
};
// Q8_0: d | qs[32] int8.
template <>
struct U<GgmlType::Q8_0> {
  static constexpr int kQK = 32, kBS = 34, kAlign = natural_align<kBS>(), kOff = 0, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = false;
  template <int A>
  __device__ static void decode(const uint8_t* b, int, uint32_t (&c)[8], Sc& s, const Tab&) {
    words<al(A, 2), 8>(b + 2, c);
    s.d0 = h2f(ld16(b));
  }
};
// IQ4_NL: d | qs[16], nibbles as Q4_0 mapped through the codebook (kXPairs order).
template <>
struct U<GgmlType::IQ4_NL> {
  static constexpr int kQK = 32, kBS = 18, kAlign = natural_align<kBS>(), kOff = 0, kX = kXPairs;
  static constexpr bool kHalves = false, kMin = false;
  template <int A>
  __device__ static void decode(const uint8_t* b, int, uint32_t (&c)[8], Sc& s, const Tab& tab) {
    uint32_t q[4];
    words<al(A, 2), 4>(b + 2, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) iq4_pairs(q[j], c[2 * j], c[2 * j + 1], tab);
    s.d0 = h2f(ld16(b));
  }
};
// IQ4_XS: d | scales_h | scales_l[4] | qs[128]; unit u = qs[16u..16u+15] as IQ4_NL, scale
// d * (ls - 32) with ls = scales_l nibble u | 2 bits u of scales_h << 4.
template <>
struct U<GgmlType::IQ4_XS> {
  static constexpr int kQK = 256, kBS = 136, kAlign = natural_align<kBS>(), kOff = 0, kX = kXPairs;
  static constexpr bool kHalves = false, kMin = false;
  template <int A>
  __device__ static void decode(const uint8_t* b, int u, uint32_t (&c)[8], Sc& s, const Tab& tab) {
    uint32_t h[2], q[4];
    words<al(A, 8), 2>(b, h);
    words<al(A, 8), 4>(b + 8 + 16 * u, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) iq4_pairs(q[j], c[2 * j], c[2 * j + 1], tab);
    const int ls = int((h[1] >> (4 * u)) & 15u) | int((h[0] >> (16 + 2 * u)) & 3u) << 4;
    s.d0 = h2f(h[0] & 0xFFFFu) * float(ls - 32);
  }
};
// Q4_K / Q5_K header: d | dmin | scales[12]; sub-block u's 6-bit scale sc and min mn; w = (d sc) q - (dmin mn).
__device__ __forceinline__ void scales_k45(const uint32_t (&h)[4], int u, Sc& s) {
  const uint32_t sh = 8u * uint32_t(u & 3);
  const uint32_t a0 = h[1] >> sh, a1 = h[2] >> sh, a2 = h[3] >> sh;
  uint32_t sc, mn;
  if (u < 4) {
    sc = a0 & 63u, mn = a1 & 63u;
  } else {
    sc = (a2 & 15u) | ((a0 >> 2) & 0x30u), mn = ((a2 >> 4) & 15u) | ((a1 >> 2) & 0x30u);
  }
  s.d0 = h2f(h[0] & 0xFFFFu) * float(sc);
  s.m = -(h2f(h[0] >> 16) * float(mn));
}
// Q4_K: unit u = nibble u%2 of qs[32(u/2) + l], l = 0..31.
template <>
struct U<GgmlType::Q4_K> {
  static constexpr int kQK = 256, kBS = 144, kAlign = natural_align<kBS>(), kOff = 0, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = true;
  template <int A>
  __device__ static void decode(const uint8_t* b, int u, uint32_t (&c)[8], Sc& s, const Tab&) {
    uint32_t h[4];
    words<A, 4>(b, h);
    words<A, 8>(b + 16 + 32 * (u >> 1), c);
    const uint32_t sh = 4u * uint32_t(u & 1);
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = (c[j] >> sh) & 0x0F0F0F0Fu;
    scales_k45(h, u, s);
  }
};
// Q5_K: d | dmin | scales[12] | qh[32] | qs[128]; as Q4_K plus bit 4 = bit u of qh[l].
template <>
struct U<GgmlType::Q5_K> {
  static constexpr int kQK = 256, kBS = 176, kAlign = natural_align<kBS>(), kOff = 0, kX = kXNatural;
  static constexpr bool kHalves = false, kMin = true;
  template <int A>
  __device__ static void decode(const uint8_t* b, int u, uint32_t (&c)[8], Sc& s, const Tab&) {
    uint32_t h[4], qh[8];
    words<A, 4>(b, h);
    words<A, 8>(b + 16, qh);
    words<A, 8>(b + 48 + 32 * (u >> 1), c);
    const uint32_t sh = 4u * uint32_t(u & 1), rot = uint32_t(4 - u) & 31u;  // bit u -> bit 4 of each byte
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = ((c[j] >> sh) & 0x0F0F0F0Fu) | (rotl(qh[j], rot) & 0x10101010u);
    scales_k45(h, u, s);
  }
};
// Q6_K: ql[128] | qh[64] | scales[16] (int8) | d. Unit u: half hh = u/4, quarter q = u%4:
// L = (ql[64hh + 32(q&1) + l] >> 4(q>>1)) & 15 | ((qh[32hh + l] >> 2q) & 3) << 4, w = d * sc * (L - 32)
// with sc = scales[2u] for l < 16, scales[2u + 1] for l >= 16.
template <>
struct U<GgmlType::Q6_K> {
  static constexpr int kQK = 256, kBS = 210, kAlign = natural_align<kBS>(), kOff = 32, kX = kXNatural;
  static constexpr bool kHalves = true, kMin = false;
  template <int A>
  __device__ static void decode(const uint8_t* b, int u, uint32_t (&c)[8], Sc& s, const Tab&) {
    const int hh = u >> 2, q = u & 3;
    uint32_t qh[8];
    words<al(A, 16), 8>(b + 64 * hh + 32 * (q & 1), c);
    words<al(A, 16), 8>(b + 128 + 32 * hh, qh);
    const uint32_t sh = 4u * uint32_t(q >> 1), rot = uint32_t(4 - 2 * q) & 31u;  // bits 2q, 2q+1 -> 4, 5
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = ((c[j] >> sh) & 0x0F0F0F0Fu) | (rotl(qh[j], rot) & 0x30303030u);
    const uint32_t sc = ld16(b + 192 + 2 * u);
    const float d = h2f(ld16(b + 208));
    s.d0 = d * float(int8_t(sc & 0xFFu));
    s.d1 = d * float(int8_t(sc >> 8));
  }
};

template <GgmlType T>
constexpr bool has_unit() {
  return T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q5_0 || T == GgmlType::Q5_1 ||
         T == GgmlType::Q8_0 || T == GgmlType::IQ4_NL || T == GgmlType::IQ4_XS || T == GgmlType::Q4_K ||
         T == GgmlType::Q5_K || T == GgmlType::Q6_K;
}

}  // namespace kiln::cuda::q8
