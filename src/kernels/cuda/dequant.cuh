// kernels/cuda/dequant.cuh — device-side decoding of every weight block type (Q4_0 Q4_1 Q5_0 Q5_1
//   Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS; F32 F16 BF16 are read directly by the kernels).
// Owns: the format facts of tensor/blocks.h restated for the GPU, in one shape for all block types:
//   a block is cut into "units" of 32 consecutive elements, a unit into 4 "groups" of 8; for unit u
//   `scales` gives the scale d and offset m of its two 16-element halves and `codes` gives the 8
//   byte codes of group g, b = q + kOff (0..255), so that element = d * (b - kOff) + m, evaluated
//   as the host reference does (tensor/quant.cpp: one float product, then the added m), so get_rows
//   is exact. Codes to floats: `code_to_float` (exact: 2^23 + b formed in the mantissa, minus
//   2^23 + kOff).
// Must not: allocate or know about launch geometry; pointers are plain byte pointers (global or
//   shared) whose alignment the caller states in the template argument A (bytes, >= 2).
// Threading: pure device functions.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "gguf/types.h"
#include "tensor/blocks.h"

namespace kiln::cuda::dq {

using gguf::GgmlType;

// ---- loads from a pointer whose alignment is at least A bytes ---------------------------------
__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return *p; }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
template <int A>
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  if constexpr (A >= 4) {
    return *reinterpret_cast<const uint32_t*>(p);
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | uint32_t(h[1]) << 16;
  }
}
template <int A>
__device__ __forceinline__ uint2 ld_u64(const uint8_t* p) {
  if constexpr (A >= 8) return *reinterpret_cast<const uint2*>(p);
  else return make_uint2(ld_u32<A>(p), ld_u32<A>(p + 4));
}
// Alignment of p + off when p is A-aligned and off a multiple of `unit` (a power of two).
constexpr int al(int A, int unit) { return A < unit ? A : unit; }

__device__ __forceinline__ float h2f(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }

// Byte j of w, minus off, as an exact float (b and off small integers).
template <int kOff>
__device__ __forceinline__ float code_to_float(uint32_t w, int j) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | unsigned(j))) - (8388608.0f + float(kOff));
}

// The low 4 bits of v spread one per byte: byte j = bit j of v (the products do not overlap).
__device__ __forceinline__ uint32_t spread4(uint32_t v) { return ((v & 15u) * 0x00204081u) & 0x01010101u; }

// 4 codebook lookups: bytes of n are indices 0..15; result bytes are kIQ4NLValues[idx] + 128.
constexpr uint32_t iq4_word(int i) {
  uint32_t w = 0;
  for (int j = 0; j < 4; ++j) w |= uint32_t(uint8_t(tensor::kIQ4NLValues[4 * i + j] + 128)) << (8 * j);
  return w;
}
__device__ __forceinline__ uint32_t iq4_lookup(uint32_t n) {
  constexpr uint32_t T0 = iq4_word(0), T1 = iq4_word(1), T2 = iq4_word(2), T3 = iq4_word(3);
  const uint32_t lo3 = n & 0x07070707u;
  const uint32_t x = lo3 | (lo3 >> 4);           // byte0 = i0 | i1 << 4, byte2 = i2 | i3 << 4
  const uint32_t sel = __byte_perm(x, 0u, 0x4420u);  // nibble j = index j (low 3 bits)
  const uint32_t a = __byte_perm(T0, T1, sel), b = __byte_perm(T2, T3, sel);
  const uint32_t msk = ((n & 0x08080808u) >> 3) * 0xFFu;  // 0xFF in the bytes whose index is >= 8
  return (a & ~msk) | (b & msk);
}

struct Scales {
  float d[2];  // scale of the unit's halves (elements 0..15, 16..31)
  float m[2];  // added offset (kMin types only)
};

// ---- per-type decoders --------------------------------------------------------------------------
// kQK elements and kBS bytes per block; kAlign: the largest power of two (<= 16) dividing kBS, the
// alignment a block start has when the rows are aligned to it.
template <GgmlType T>
struct Q;

template <int kBS_>
constexpr int natural_align() {
  return (kBS_ % 16 == 0) ? 16 : (kBS_ % 8 == 0) ? 8 : (kBS_ % 4 == 0) ? 4 : 2;
}

// Q4_0: d | qs[16]; element j = lo(qs[j]) (j < 16), hi(qs[j-16]); y = d * (q - 8).
template <>
struct Q<GgmlType::Q4_0> {
  static constexpr int kQK = 32, kBS = 18, kOff = 8, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int) {
    const float d = h2f(ld_u16(b));
    return {{d, d}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int, int g) {
    const uint2 v = ld_u64<al(A, 2)>(b + 2 + 8 * (g & 1));
    const int s = 4 * (g >> 1);
    return make_uint2((v.x >> s) & 0x0F0F0F0Fu, (v.y >> s) & 0x0F0F0F0Fu);
  }
};

// Q4_1: d | m | qs[16]; y = d * q + m.
template <>
struct Q<GgmlType::Q4_1> {
  static constexpr int kQK = 32, kBS = 20, kOff = 0, kAlign = natural_align<kBS>();
  static constexpr bool kMin = true;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int) {
    const float d = h2f(ld_u16(b)), m = h2f(ld_u16(b + 2));
    return {{d, d}, {m, m}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int, int g) {
    const uint2 v = ld_u64<al(A, 4)>(b + 4 + 8 * (g & 1));
    const int s = 4 * (g >> 1);
    return make_uint2((v.x >> s) & 0x0F0F0F0Fu, (v.y >> s) & 0x0F0F0F0Fu);
  }
};

// Q5_0 / Q5_1: the Q4 nibbles plus bit 4 of element i = bit i of qh (uint32 LE).
__device__ __forceinline__ uint2 codes_q5(int g, uint2 v, uint32_t qh) {
  const int s = 4 * (g >> 1);
  const uint32_t hb = qh >> (8 * g);
  return make_uint2(((v.x >> s) & 0x0F0F0F0Fu) | spread4(hb) << 4, ((v.y >> s) & 0x0F0F0F0Fu) | spread4(hb >> 4) << 4);
}
template <>
struct Q<GgmlType::Q5_0> {
  static constexpr int kQK = 32, kBS = 22, kOff = 16, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int) {
    const float d = h2f(ld_u16(b));
    return {{d, d}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int, int g) {
    return codes_q5(g, ld_u64<al(A, 2)>(b + 6 + 8 * (g & 1)), ld_u32<al(A, 2)>(b + 2));
  }
};
template <>
struct Q<GgmlType::Q5_1> {
  static constexpr int kQK = 32, kBS = 24, kOff = 0, kAlign = natural_align<kBS>();
  static constexpr bool kMin = true;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int) {
    const float d = h2f(ld_u16(b)), m = h2f(ld_u16(b + 2));
    return {{d, d}, {m, m}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int, int g) {
    return codes_q5(g, ld_u64<al(A, 8)>(b + 8 + 8 * (g & 1)), ld_u32<al(A, 4)>(b + 4));
  }
};

// Q8_0: d | qs[32] int8; codes = qs ^ 0x80 (q + 128).
template <>
struct Q<GgmlType::Q8_0> {
  static constexpr int kQK = 32, kBS = 34, kOff = 128, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int) {
    const float d = h2f(ld_u16(b));
    return {{d, d}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int, int g) {
    const uint2 v = ld_u64<al(A, 2)>(b + 2 + 8 * g);
    return make_uint2(v.x ^ 0x80808080u, v.y ^ 0x80808080u);
  }
};

// IQ4_NL: as Q4_0 with the nibbles mapped through the codebook (codes = value + 128).
template <>
struct Q<GgmlType::IQ4_NL> {
  static constexpr int kQK = 32, kBS = 18, kOff = 128, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int) {
    const float d = h2f(ld_u16(b));
    return {{d, d}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int, int g) {
    const uint2 v = ld_u64<al(A, 2)>(b + 2 + 8 * (g & 1));
    const int s = 4 * (g >> 1);
    return make_uint2(iq4_lookup((v.x >> s) & 0x0F0F0F0Fu), iq4_lookup((v.y >> s) & 0x0F0F0F0Fu));
  }
};

// IQ4_XS: d | scales_h | scales_l[4] | qs[128]; unit u = sub-block u, qs[16u .. 16u+15] as IQ4_NL.
template <>
struct Q<GgmlType::IQ4_XS> {
  static constexpr int kQK = 256, kBS = 136, kOff = 128, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int u) {
    const int ls = int((ld_u8(b + 4 + u / 2) >> (4 * (u & 1))) & 15) | int((ld_u16(b + 2) >> (2 * u)) & 3) << 4;
    const float d = h2f(ld_u16(b)) * float(ls - 32);
    return {{d, d}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int u, int g) {
    const uint2 v = ld_u64<al(A, 8)>(b + 8 + 16 * u + 8 * (g & 1));
    const int s = 4 * (g >> 1);
    return make_uint2(iq4_lookup((v.x >> s) & 0x0F0F0F0Fu), iq4_lookup((v.y >> s) & 0x0F0F0F0Fu));
  }
};

// Q2_K: scales[16] | qs[64] | d | dmin. Unit u: half h = u/4, crumb k = u%4 of qs[32h + l].
// Sub-block s = 2u + t: y = (d * lo(scales[s])) * q - (dmin * hi(scales[s])).
template <>
struct Q<GgmlType::Q2_K> {
  static constexpr int kQK = 256, kBS = 84, kOff = 0, kAlign = natural_align<kBS>();
  static constexpr bool kMin = true;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int u) {
    const float d = h2f(ld_u16(b + 80)), dmin = h2f(ld_u16(b + 82));
    const uint32_t s0 = ld_u8(b + 2 * u), s1 = ld_u8(b + 2 * u + 1);
    return {{d * float(s0 & 15), d * float(s1 & 15)}, {-(dmin * float(s0 >> 4)), -(dmin * float(s1 >> 4))}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int u, int g) {
    const uint2 v = ld_u64<al(A, 8)>(b + 16 + 32 * (u >> 2) + 8 * g);
    const int s = 2 * (u & 3);
    return make_uint2((v.x >> s) & 0x03030303u, (v.y >> s) & 0x03030303u);
  }
};

// Q3_K: hmask[32] | qs[64] | scales[12] | d. L = crumb (as Q2_K) | (bit u of hmask[l]) << 2,
// q = L - 4; y = (d * (S[s] - 32)) * q with the packed 6-bit S.
template <>
struct Q<GgmlType::Q3_K> {
  static constexpr int kQK = 256, kBS = 110, kOff = 4, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  __device__ static int scale6(const uint8_t* sc, int s) {
    const int lo = s < 8 ? int(ld_u8(sc + s) & 15) : int(ld_u8(sc + s - 8) >> 4);
    const int hi = int(ld_u8(sc + 8 + (s & 3)) >> (2 * (s >> 2))) & 3;
    return lo | hi << 4;
  }
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int u) {
    const float d = h2f(ld_u16(b + 108));
    return {{d * float(scale6(b + 96, 2 * u) - 32), d * float(scale6(b + 96, 2 * u + 1) - 32)}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int u, int g) {
    const uint2 v = ld_u64<al(A, 8)>(b + 32 + 32 * (u >> 2) + 8 * g);
    const uint2 h = ld_u64<al(A, 8)>(b + 8 * g);
    const int s = 2 * (u & 3);
    return make_uint2(((v.x >> s) & 0x03030303u) | ((h.x >> u) & 0x01010101u) << 2,
                      ((v.y >> s) & 0x03030303u) | ((h.y >> u) & 0x01010101u) << 2);
  }
};

// Q4_K / Q5_K: d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128]. Unit u = sub-block u: nibble u%2
// of qs[32(u/2) + l]; Q5_K: bit 4 = bit u of qh[l]. y = (d * sc[u]) * q - (dmin * mn[u]).
__device__ __forceinline__ Scales scales_k45(const uint8_t* b, int u) {
  const float d = h2f(ld_u16(b)), dmin = h2f(ld_u16(b + 2));
  const uint8_t* q = b + 4;
  int sc, mn;
  if (u < 4) {
    sc = int(ld_u8(q + u) & 63);
    mn = int(ld_u8(q + u + 4) & 63);
  } else {
    sc = int(ld_u8(q + u + 4) & 15) | int(ld_u8(q + u - 4) >> 6) << 4;
    mn = int(ld_u8(q + u + 4) >> 4) | int(ld_u8(q + u) >> 6) << 4;
  }
  const float dl = d * float(sc), ml = -(dmin * float(mn));
  return {{dl, dl}, {ml, ml}};
}
template <>
struct Q<GgmlType::Q4_K> {
  static constexpr int kQK = 256, kBS = 144, kOff = 0, kAlign = natural_align<kBS>();
  static constexpr bool kMin = true;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int u) {
    return scales_k45(b, u);
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int u, int g) {
    const uint2 v = ld_u64<al(A, 8)>(b + 16 + 32 * (u >> 1) + 8 * g);
    const int s = 4 * (u & 1);
    return make_uint2((v.x >> s) & 0x0F0F0F0Fu, (v.y >> s) & 0x0F0F0F0Fu);
  }
};
template <>
struct Q<GgmlType::Q5_K> {
  static constexpr int kQK = 256, kBS = 176, kOff = 0, kAlign = natural_align<kBS>();
  static constexpr bool kMin = true;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int u) {
    return scales_k45(b, u);
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int u, int g) {
    const uint2 v = ld_u64<al(A, 8)>(b + 48 + 32 * (u >> 1) + 8 * g);
    const uint2 h = ld_u64<al(A, 8)>(b + 16 + 8 * g);
    const int s = 4 * (u & 1);
    return make_uint2(((v.x >> s) & 0x0F0F0F0Fu) | ((h.x >> u) & 0x01010101u) << 4,
                      ((v.y >> s) & 0x0F0F0F0Fu) | ((h.y >> u) & 0x01010101u) << 4);
  }
};

// Q6_K: ql[128] | qh[64] | scales[16] (int8) | d. Unit u: half h = u/4, quarter c = u%4:
// L = (ql[64h + 32(c&1) + l] >> 4(c>>1)) & 15 | ((qh[32h + l] >> 2c) & 3) << 4, q = L - 32;
// y = (d * scales[s]) * q for sub-block s = 2u + t.
template <>
struct Q<GgmlType::Q6_K> {
  static constexpr int kQK = 256, kBS = 210, kOff = 32, kAlign = natural_align<kBS>();
  static constexpr bool kMin = false;
  template <int A>
  __device__ static Scales scales(const uint8_t* b, int u) {
    const float d = h2f(ld_u16(b + 208));
    const float s0 = float(int8_t(ld_u8(b + 192 + 2 * u))), s1 = float(int8_t(ld_u8(b + 193 + 2 * u)));
    return {{d * s0, d * s1}, {0.f, 0.f}};
  }
  template <int A>
  __device__ static uint2 codes(const uint8_t* b, int u, int g) {
    const int h = u >> 2, c = u & 3;
    const uint2 l = ld_u64<al(A, 8)>(b + 64 * h + 32 * (c & 1) + 8 * g);
    const uint2 q = ld_u64<al(A, 8)>(b + 128 + 32 * h + 8 * g);
    const int sl = 4 * (c >> 1), sh = 2 * c;
    return make_uint2(((l.x >> sl) & 0x0F0F0F0Fu) | ((q.x >> sh) & 0x03030303u) << 4,
                      ((l.y >> sl) & 0x0F0F0F0Fu) | ((q.y >> sh) & 0x03030303u) << 4);
  }
};

// Element j (0..7) of group g of unit u, exactly as the host dequantizer computes it.
template <GgmlType T, int A>
__device__ __forceinline__ void dequant8(const uint8_t* blk, int u, int g, float out[8]) {
  using D = Q<T>;
  const Scales s = D::template scales<A>(blk, u);
  const uint2 c = D::template codes<A>(blk, u, g);
  const float d = s.d[g >> 1];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float q = code_to_float<D::kOff>(j < 4 ? c.x : c.y, j & 3);
    if constexpr (D::kMin) out[j] = __fadd_rn(__fmul_rn(d, q), s.m[g >> 1]);
    else out[j] = __fmul_rn(d, q);
  }
}

// ---- the dense types ---------------------------------------------------------------------------
template <GgmlType T>
constexpr bool is_dense() {
  return T == GgmlType::F32 || T == GgmlType::F16 || T == GgmlType::BF16;
}
template <GgmlType T>
constexpr int elem_bytes() {
  return T == GgmlType::F32 ? 4 : 2;
}
// The alignment (bytes) the kernels' fast variant wants of row starts: 16 for the dense types (16-byte
// loads), the natural block alignment for the block types.
template <GgmlType T>
constexpr int fast_align() {
  if constexpr (is_dense<T>()) return 16;
  else return Q<T>::kAlign;
}
// The least alignment rows of T can have.
template <GgmlType T>
constexpr int min_align() {
  return T == GgmlType::F32 ? 4 : 2;
}
__device__ __forceinline__ float bf2f(uint32_t h) { return __uint_as_float(h << 16); }

// 8 consecutive dense elements at p (p aligned to A bytes; A >= the element size).
template <GgmlType T, int A>
__device__ __forceinline__ void load_dense8(const uint8_t* p, float out[8]) {
  if constexpr (T == GgmlType::F32) {
    if constexpr (A >= 16) {
      const float4 a = __ldcs(reinterpret_cast<const float4*>(p)), b = __ldcs(reinterpret_cast<const float4*>(p + 16));
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = reinterpret_cast<const float*>(p)[j];
    }
  } else {
    uint32_t w[4];
    if constexpr (A >= 16) {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = ld_u32<A>(p + 4 * j);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (T == GgmlType::F16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
        out[2 * j] = f.x, out[2 * j + 1] = f.y;
      } else {
        out[2 * j] = bf2f(w[j] & 0xFFFFu), out[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
      }
    }
  }
}

}  // namespace kiln::cuda::dq
