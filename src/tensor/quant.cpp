// tensor/quant.cpp — reference row quantize/dequantize for every supported type, and the
// dtype traits table. Plain scalar code; see tensor/blocks.h for the layouts and
// docs/formats.md for the formulas, the quantizer methods and their measured error.
//
// Floating-point order matters: the dequantizers evaluate each formula with exactly the
// float32 operations and rounding written in blocks.h (e.g. (d * sc) * q - (dmin * mn)), which
// is also what ggml and gguf-py compute, so results agree bit for bit. This file is compiled
// with -ffp-contract=off (src/tensor/CMakeLists.txt) so no multiply-add is fused.
#include "tensor/quant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/fp16.h"
#include "tensor/blocks.h"
#include "tensor/dtype.h"

static_assert(std::endian::native == std::endian::little, "kiln's block code assumes a little-endian host");

namespace kiln::tensor {
namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers

template <class B>
inline B load_block(const void* base, int64_t i) {
  B b;
  std::memcpy(&b, static_cast<const uint8_t*>(base) + i * static_cast<int64_t>(sizeof(B)), sizeof(B));
  return b;
}
template <class B>
inline void store_block(void* base, int64_t i, const B& b) {
  std::memcpy(static_cast<uint8_t*>(base) + i * static_cast<int64_t>(sizeof(B)), &b, sizeof(B));
}

inline float h2f(uint16_t h) { return fp16_to_f32(h); }

// A block scale as fp16 that is always finite: NaN -> 0, beyond the half range -> +-65504.
// (ggml would store inf there; finite input never produces inf/NaN blocks here.)
inline uint16_t scale_to_fp16(float v) {
  if (std::isnan(v)) return 0;
  const uint16_t h = f32_to_fp16(v);
  if ((h & 0x7fff) == 0x7c00) return static_cast<uint16_t>((h & 0x8000) | 0x7bff);
  return h;
}

// Round half to even (ggml's nearest_int) then clamp to [lo, hi]; NaN -> lo. Never UB.
inline int round_clamp(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v > static_cast<float>(hi)) return hi;
  // v is now within [lo, hi] (small): adding 1.5 * 2^23 rounds it to an integer in the low
  // mantissa bits, half to even, without a libm call.
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}
// Round half away from zero (C roundf) then clamp; NaN -> 0.
inline int round_away_clamp(float v, int lo, int hi) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<float>(lo)) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::round(v));
}
// Truncate toward zero then clamp; NaN -> lo.
inline int trunc_clamp(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// Index of the IQ4_NL codebook value nearest to t (ties go to the lower value; NaN -> 0).
int nearest_iq4_slow(float t) {
  if (!(t > kIQ4NLValues[0])) return 0;
  if (t >= kIQ4NLValues[15]) return 15;
  int hi = 1;
  while (kIQ4NLValues[hi] < t) ++hi;
  return (t - kIQ4NLValues[hi - 1] <= kIQ4NLValues[hi] - t) ? hi - 1 : hi;
}
// Codebook values are integers, so every decision boundary (a midpoint) is a multiple of 1/2:
// the answer is constant on each open interval (k/2, (k+1)/2). Tables over k = floor(2t).
struct IQ4Tables {
  uint8_t at[512], inside[512];  // nearest(k/2), nearest(k/2 + 1/4); index k + 256
  IQ4Tables() {
    for (int k = -256; k < 256; ++k) {
      at[k + 256] = static_cast<uint8_t>(nearest_iq4_slow(0.5f * float(k)));
      inside[k + 256] = static_cast<uint8_t>(nearest_iq4_slow(0.5f * float(k) + 0.25f));
    }
  }
};
const IQ4Tables kIQ4Tables;
inline int nearest_iq4(float t) {
  if (!(t > kIQ4NLValues[0])) return 0;
  if (t >= kIQ4NLValues[15]) return 15;
  const float u = 2.0f * t;  // exact; in (-254, 226)
  int k = static_cast<int>(u);
  if (static_cast<float>(k) > u) --k;  // floor
  return u == static_cast<float>(k) ? kIQ4Tables.at[k + 256] : kIQ4Tables.inside[k + 256];
}

// Largest-magnitude element (signed) of x[0..n); 0 when all are zero or NaN. First one wins.
inline float signed_absmax(const float* x, int n) {
  float amax = 0.0f, mx = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) { amax = a; mx = x[i]; }
  }
  return mx;
}

// ---------------------------------------------------------------------------------------------
// Sub-block fitting used by the K-quant and IQ4 quantizers (our own method, see formats.md).
// Each tries a small fan of scale candidates, assigns integer levels by rounding, refits the
// scale (and offset) by least squares for those levels, and keeps the lowest squared error.

constexpr int kFitSteps = 10;  // candidates at +-0.1 * k levels, k = -kFitSteps..kFitSteps

// Asymmetric: x ~= s * q - m with q in [0, nmax], s >= 0, m >= 0.
void fit_asym(const float* x, int n, int nmax, float* s_out, float* m_out) {
  float xmin = 0.0f, xmax = 0.0f;
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) continue;
    if (!any) { xmax = x[i]; any = true; }
    xmin = std::min(xmin, x[i]);
    xmax = std::max(xmax, x[i]);
  }
  *s_out = 0.0f;
  *m_out = xmin < 0.0f ? -xmin : 0.0f;
  if (!any || !(xmax > xmin)) return;
  const float range = xmax - xmin;
  double best = std::numeric_limits<double>::infinity();
  int q[kQK_K];
  for (int t = -kFitSteps; t <= kFitSteps; ++t) {
    const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(t)) / range;
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      q[i] = round_clamp((x[i] - xmin) * iscale, 0, nmax);
      sq += q[i];
      sqq += double(q[i]) * q[i];
      sx += x[i];
      sxq += double(x[i]) * q[i];
    }
    // Least squares for x ~= a q + b, then constrain b <= 0 (the format stores m = -b >= 0).
    double a, b;
    const double det = n * sqq - sq * sq;
    if (det > 0) {
      a = (n * sxq - sq * sx) / det;
      b = (sqq * sx - sq * sxq) / det;
    } else {
      a = 0;
      b = sx / n;
    }
    if (b > 0) {
      b = 0;
      a = sqq > 0 ? sxq / sqq : 0;
    }
    if (!(a >= 0)) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = a * q[i] + b - x[i];
      err += e * e;
    }
    if (err < best) {
      best = err;
      *s_out = static_cast<float>(a);
      *m_out = static_cast<float>(-b);
    }
  }
}

// Symmetric: x ~= s * q with q in [nmin, nmax] (nmin < 0 < nmax); s may be negative.
float fit_sym(const float* x, int n, int nmin, int nmax) {
  const float mx = signed_absmax(x, n);
  if (mx == 0.0f || !std::isfinite(mx)) return 0.0f;
  double best = std::numeric_limits<double>::infinity();
  float s_best = 0.0f;
  int q[kQK_K];
  for (int side = 0; side < 2; ++side) {
    // side 0 maps mx to the negative end (nmin), side 1 to the positive end (nmax).
    const float target = side == 0 ? static_cast<float>(nmin) : static_cast<float>(nmax);
    for (int t = -kFitSteps; t <= kFitSteps; ++t) {
      const float mag = std::fabs(target) + 0.1f * static_cast<float>(t);
      if (mag <= 0.5f) continue;
      const float iscale = std::copysign(mag, target) / mx;
      double sxq = 0, sqq = 0;
      for (int i = 0; i < n; ++i) {
        q[i] = round_clamp(x[i] * iscale, nmin, nmax);
        sxq += double(x[i]) * q[i];
        sqq += double(q[i]) * q[i];
      }
      if (sqq <= 0) continue;
      const double a = sxq / sqq;
      double err = 0;
      for (int i = 0; i < n; ++i) {
        const double e = a * q[i] - x[i];
        err += e * e;
      }
      if (err < best) { best = err; s_best = static_cast<float>(a); }
    }
  }
  return s_best;
}

// Codebook: x ~= s * kIQ4NLValues[k] for one block of n (= 32) values.
float fit_iq4(const float* x, int n) {
  const float mx = signed_absmax(x, n);
  if (mx == 0.0f || !std::isfinite(mx)) return 0.0f;
  double best = std::numeric_limits<double>::infinity();
  float s_best = 0.0f;
  for (int side = 0; side < 2; ++side) {
    const float target = side == 0 ? static_cast<float>(kIQ4NLValues[0]) : static_cast<float>(kIQ4NLValues[15]);
    for (int t = -kFitSteps; t <= kFitSteps; ++t) {
      const float iscale = (target + std::copysign(1.0f, target) * static_cast<float>(t)) / mx;
      double sxv = 0, svv = 0;
      int k[kQK];
      for (int i = 0; i < n; ++i) {
        k[i] = nearest_iq4(x[i] * iscale);
        const double v = kIQ4NLValues[k[i]];
        sxv += x[i] * v;
        svv += v * v;
      }
      const double a = sxv / svv;  // svv > 0: the codebook has no zero
      double err = 0;
      for (int i = 0; i < n; ++i) {
        const double e = a * kIQ4NLValues[k[i]] - x[i];
        err += e * e;
      }
      if (err < best) { best = err; s_best = static_cast<float>(a); }
    }
  }
  return s_best;
}

// Quantizes signed sub-block scales s[0..ns) to integers in [lmin, lmax] with one fp16 super
// scale (the largest-magnitude scale maps to lmin). Returns the stored fp16 super scale.
uint16_t quantize_sym_scales(const float* s, int ns, int lmin, int lmax, int* l) {
  const float smax = signed_absmax(s, ns);
  if (smax == 0.0f) {
    for (int j = 0; j < ns; ++j) l[j] = 0;
    return 0;
  }
  const float iscale = static_cast<float>(lmin) / smax;
  for (int j = 0; j < ns; ++j) l[j] = round_clamp(iscale * s[j], lmin, lmax);
  return scale_to_fp16(1.0f / iscale);
}

// Quantizes non-negative sub-block values v[0..ns) to [0, lmax] with one fp16 super scale.
uint16_t quantize_pos_scales(const float* v, int ns, int lmax, int* l) {
  float vmax = 0.0f;
  for (int j = 0; j < ns; ++j) vmax = std::max(vmax, v[j]);
  const uint16_t dh = scale_to_fp16(vmax / static_cast<float>(lmax));
  const float d = h2f(dh);
  for (int j = 0; j < ns; ++j) l[j] = d > 0.0f ? round_clamp(v[j] / d, 0, lmax) : 0;
  return dh;
}

// Levels for x given the final (dequantization-exact) scale S and offset M: x ~= S q - M.
inline int level_asym(float x, float S, float M, int nmax) {
  return S > 0.0f ? round_clamp((x + M) / S, 0, nmax) : 0;
}
inline int level_sym(float x, float S, int nmin, int nmax) {
  return S != 0.0f ? round_clamp(x / S, nmin, nmax) : 0;
}
inline int index_iq4(float x, float S) { return S != 0.0f ? nearest_iq4(x / S) : 0; }

// Q4_K / Q5_K scale packing (see BlockQ4_K; get_scale_min_k4 unpacks).
inline void pack_scale_min_k4(const int* sc, const int* mn, uint8_t* q) {
  for (int s = 0; s < 4; ++s) {
    q[s] = static_cast<uint8_t>((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    q[s + 4] = static_cast<uint8_t>((mn[s] & 63) | ((mn[s + 4] >> 4) << 6));
    q[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0xF) | ((mn[s + 4] & 0xF) << 4));
  }
}

// Q3_K 6-bit scale packing (see BlockQ3_K; get_scale_q3k unpacks).
inline void pack_scales_q3k(const int* S, uint8_t* sc) {
  std::memset(sc, 0, 12);
  for (int s = 0; s < 16; ++s) {
    const int v = S[s] & 63;
    if (s < 8) sc[s] |= static_cast<uint8_t>(v & 0xF);
    else sc[s - 8] |= static_cast<uint8_t>((v & 0xF) << 4);
    sc[8 + s % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (s / 4)));
  }
}

// ---------------------------------------------------------------------------------------------
// Plain types

void dequant_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, size_t(n) * 4); }
void quant_f32(const float* x, void* dst, int64_t n) { std::memcpy(dst, x, size_t(n) * 4); }

template <float (*to_f32)(uint16_t)>
void dequant_16(const void* src, float* y, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = to_f32(h);
  }
}
template <uint16_t (*from_f32)(float)>
void quant_16(const float* x, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = from_f32(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}
void dequant_f16(const void* src, float* y, int64_t n) { dequant_16<fp16_to_f32>(src, y, n); }
void quant_f16(const float* x, void* dst, int64_t n) { quant_16<f32_to_fp16>(x, dst, n); }
void dequant_bf16(const void* src, float* y, int64_t n) { dequant_16<bf16_to_f32>(src, y, n); }
void quant_bf16(const float* x, void* dst, int64_t n) { quant_16<f32_to_bf16>(x, dst, n); }

// ---------------------------------------------------------------------------------------------
// Legacy 32-element types. The quantizers are ggml's reference algorithm (a format fact that
// gguf-py also reproduces), so the oracle test compares them bit for bit.

inline uint32_t load_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Q4_0 Q4_1 Q5_0 Q5_1: 4-bit q (plus a fifth bit in qh for Q5_*), symmetric y = d * (q - 2^(bits-1))
// or, with a minimum m (Q4_1 Q5_1), y = d * q + m.
template <class B>
constexpr bool kHasMin = requires(B b) { b.m; };
template <class B>
constexpr bool kHasQh = requires(B b) { b.qh; };

template <class B>
void dequant_legacy(const void* src, float* y, int64_t n) {
  constexpr int kOff = kHasQh<B> ? 16 : 8;  // symmetric types only
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const auto blk = load_block<B>(src, b);
    const float d = h2f(blk.d);
    [[maybe_unused]] float m = 0.0f;
    if constexpr (kHasMin<B>) m = h2f(blk.m);
    uint32_t qh = 0;
    if constexpr (kHasQh<B>) qh = load_u32(blk.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | int((qh >> j) & 1) << 4;
      const int q1 = (blk.qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      if constexpr (kHasMin<B>) {
        y[j] = d * static_cast<float>(q0) + m;
        y[j + 16] = d * static_cast<float>(q1) + m;
      } else {
        y[j] = d * static_cast<float>(q0 - kOff);
        y[j + 16] = d * static_cast<float>(q1 - kOff);
      }
    }
  }
}
template <class B>
void quant_legacy(const float* x, void* dst, int64_t n) {
  constexpr int kMax = kHasQh<B> ? 31 : 15;
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    B blk{};
    int q[kQK];
    if constexpr (kHasMin<B>) {
      float mn = std::numeric_limits<float>::max(), mx = -std::numeric_limits<float>::max();
      for (int j = 0; j < kQK; ++j) {
        mn = std::min(mn, x[j]);
        mx = std::max(mx, x[j]);
      }
      const float d = (mx - mn) / static_cast<float>(kMax);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      blk.d = scale_to_fp16(d);
      blk.m = scale_to_fp16(mn);
      for (int j = 0; j < kQK; ++j) q[j] = trunc_clamp((x[j] - mn) * id + 0.5f, 0, kMax);
    } else {
      constexpr float kHalf = static_cast<float>(kMax / 2 + 1);  // 8 or 16
      const float d = signed_absmax(x, kQK) / -kHalf;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      blk.d = scale_to_fp16(d);
      // (x*id) + 8.5 as two float roundings: ggml's C reference without FMA contraction and
      // gguf-py 0.19. (An FMA-contracted ggml build can differ when the sum lands within an ulp
      // of an integer; both are valid blocks. The oracle test counts such elements.)
      for (int j = 0; j < kQK; ++j) q[j] = trunc_clamp(x[j] * id + (kHalf + 0.5f), 0, kMax);
    }
    for (int j = 0; j < kQK / 2; ++j) blk.qs[j] = static_cast<uint8_t>((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
    if constexpr (kHasQh<B>) {
      uint32_t qh = 0;
      for (int j = 0; j < kQK; ++j) qh |= uint32_t(q[j] >> 4) << j;
      store_u32(blk.qh, qh);
    }
    store_block(dst, b, blk);
  }
}

void dequant_q8_0(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const auto blk = load_block<BlockQ8_0>(src, b);
    const float d = h2f(blk.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(blk.qs[j]) * d;
  }
}
void quant_q8_0(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    BlockQ8_0 blk{};
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    blk.d = scale_to_fp16(d);
    for (int j = 0; j < kQK; ++j) blk.qs[j] = static_cast<int8_t>(round_away_clamp(x[j] * id, -127, 127));
    store_block(dst, b, blk);
  }
}

// ---------------------------------------------------------------------------------------------
// IQ4_NL / IQ4_XS

void dequant_iq4_nl(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const auto blk = load_block<BlockIQ4_NL>(src, b);
    const float d = h2f(blk.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kIQ4NLValues[blk.qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kIQ4NLValues[blk.qs[j] >> 4]);
    }
  }
}
void quant_iq4_nl(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    BlockIQ4_NL blk{};
    blk.d = scale_to_fp16(fit_iq4(x, kQK));
    const float d = h2f(blk.d);
    for (int j = 0; j < kQK / 2; ++j)
      blk.qs[j] = static_cast<uint8_t>(index_iq4(x[j], d) | index_iq4(x[j + 16], d) << 4);
    store_block(dst, b, blk);
  }
}

void dequant_iq4_xs(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const auto blk = load_block<BlockIQ4_XS>(src, b);
    const float d = h2f(blk.d);
    for (int s = 0; s < 8; ++s) {
      const int ls = ((blk.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((blk.scales_h >> (2 * s)) & 3) << 4;
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* qs = blk.qs + 16 * s;
      float* ys = y + 32 * s;
      for (int j = 0; j < 16; ++j) {
        ys[j] = dl * static_cast<float>(kIQ4NLValues[qs[j] & 0xF]);
        ys[j + 16] = dl * static_cast<float>(kIQ4NLValues[qs[j] >> 4]);
      }
    }
  }
}
void quant_iq4_xs(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockIQ4_XS blk{};
    float s[8];
    for (int j = 0; j < 8; ++j) s[j] = fit_iq4(x + 32 * j, 32);
    int l[8];
    blk.d = quantize_sym_scales(s, 8, -32, 31, l);
    const float d = h2f(blk.d);
    for (int j = 0; j < 8; ++j) {
      const int ls = l[j] + 32;
      blk.scales_l[j / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (j % 2)));
      blk.scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * j));
      const float S = d * static_cast<float>(l[j]);
      const float* xs = x + 32 * j;
      for (int i = 0; i < 16; ++i)
        blk.qs[16 * j + i] = static_cast<uint8_t>(index_iq4(xs[i], S) | index_iq4(xs[i + 16], S) << 4);
    }
    store_block(dst, b, blk);
  }
}

// ---------------------------------------------------------------------------------------------
// K-quants

void dequant_q2_k(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const auto blk = load_block<BlockQ2_K>(src, b);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    float dl[16], ml[16];
    for (int s = 0; s < 16; ++s) {
      dl[s] = d * static_cast<float>(blk.scales[s] & 0xF);
      ml[s] = dmin * static_cast<float>(blk.scales[s] >> 4);
    }
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * h + 32 * k + l;
          const int q = (blk.qs[32 * h + l] >> (2 * k)) & 3;
          y[i] = dl[i / 16] * static_cast<float>(q) - ml[i / 16];
        }
  }
}
void quant_q2_k(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ2_K blk{};
    float s[16], m[16];
    for (int j = 0; j < 16; ++j) fit_asym(x + 16 * j, 16, 3, &s[j], &m[j]);
    int sc[16], mn[16];
    blk.d = quantize_pos_scales(s, 16, 15, sc);
    blk.dmin = quantize_pos_scales(m, 16, 15, mn);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    int q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      blk.scales[j] = static_cast<uint8_t>(sc[j] | mn[j] << 4);
      const float S = d * static_cast<float>(sc[j]), M = dmin * static_cast<float>(mn[j]);
      for (int i = 0; i < 16; ++i) q[16 * j + i] = level_asym(x[16 * j + i], S, M, 3);
    }
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        int v = 0;
        for (int k = 0; k < 4; ++k) v |= q[128 * h + 32 * k + l] << (2 * k);
        blk.qs[32 * h + l] = static_cast<uint8_t>(v);
      }
    store_block(dst, b, blk);
  }
}

void dequant_q3_k(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const auto blk = load_block<BlockQ3_K>(src, b);
    const float d = h2f(blk.d);
    float dl[16];
    for (int s = 0; s < 16; ++s) dl[s] = d * static_cast<float>(get_scale_q3k(s, blk.scales) - 32);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * h + 32 * k + l;
          const int lo = (blk.qs[32 * h + l] >> (2 * k)) & 3;
          const int hb = (blk.hmask[l] >> (4 * h + k)) & 1;
          y[i] = dl[i / 16] * static_cast<float>(lo - (hb ? 0 : 4));
        }
  }
}
void quant_q3_k(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ3_K blk{};
    float s[16];
    for (int j = 0; j < 16; ++j) s[j] = fit_sym(x + 16 * j, 16, -4, 3);
    int l[16];
    blk.d = quantize_sym_scales(s, 16, -32, 31, l);
    const float d = h2f(blk.d);
    int S6[16];
    int L[kQK_K];
    for (int j = 0; j < 16; ++j) {
      S6[j] = l[j] + 32;
      const float S = d * static_cast<float>(l[j]);
      for (int i = 0; i < 16; ++i) L[16 * j + i] = level_sym(x[16 * j + i], S, -4, 3) + 4;
    }
    pack_scales_q3k(S6, blk.scales);
    for (int h = 0; h < 2; ++h)
      for (int l2 = 0; l2 < 32; ++l2) {
        int v = 0;
        for (int k = 0; k < 4; ++k) {
          const int Li = L[128 * h + 32 * k + l2];
          v |= (Li & 3) << (2 * k);
          if (Li & 4) blk.hmask[l2] |= static_cast<uint8_t>(1u << (4 * h + k));
        }
        blk.qs[32 * h + l2] = static_cast<uint8_t>(v);
      }
    store_block(dst, b, blk);
  }
}

// Q4_K / Q5_K: y = (d * sc) * q - (dmin * mn) per sub-block of 32, q 4 bits plus, for Q5_K, a fifth
// bit in qh.
template <class B>
void dequant_k45(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const auto blk = load_block<B>(src, b);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    for (int c = 0; c < 4; ++c) {
      int sc0, mn0, sc1, mn1;
      get_scale_min_k4(2 * c, blk.scales, &sc0, &mn0);
      get_scale_min_k4(2 * c + 1, blk.scales, &sc1, &mn1);
      const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
      const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
      const uint8_t* qs = blk.qs + 32 * c;
      float* yc = y + 64 * c;
      for (int l = 0; l < 32; ++l) {
        int q0 = qs[l] & 0xF, q1 = qs[l] >> 4;
        if constexpr (kHasQh<B>) {
          q0 |= ((blk.qh[l] >> (2 * c)) & 1) << 4;
          q1 |= ((blk.qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        yc[l] = d0 * static_cast<float>(q0) - m0;
        yc[l + 32] = d1 * static_cast<float>(q1) - m1;
      }
    }
  }
}
template <class B>
void quant_k45(const float* x, void* dst, int64_t n) {
  constexpr int kMax = kHasQh<B> ? 31 : 15;
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    B blk{};
    float s[8], m[8];
    for (int j = 0; j < 8; ++j) fit_asym(x + 32 * j, 32, kMax, &s[j], &m[j]);
    int sc[8], mn[8];
    blk.d = quantize_pos_scales(s, 8, 63, sc);
    blk.dmin = quantize_pos_scales(m, 8, 63, mn);
    pack_scale_min_k4(sc, mn, blk.scales);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    int q[kQK_K];
    for (int j = 0; j < 8; ++j) {
      const float S = d * static_cast<float>(sc[j]), M = dmin * static_cast<float>(mn[j]);
      for (int i = 0; i < 32; ++i) q[32 * j + i] = level_asym(x[32 * j + i], S, M, kMax);
    }
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
        blk.qs[32 * c + l] = static_cast<uint8_t>((q0 & 0xF) | (q1 & 0xF) << 4);
        if constexpr (kHasQh<B>) blk.qh[l] |= static_cast<uint8_t>(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
      }
    store_block(dst, b, blk);
  }
}

void dequant_q6_k(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const auto blk = load_block<BlockQ6_K>(src, b);
    const float d = h2f(blk.d);
    float dl[16];
    for (int s = 0; s < 16; ++s) dl[s] = d * static_cast<float>(blk.scales[s]);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      float* yh = y + 128 * h;
      const float* dh = dl + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int L0 = (ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4;
        const int L1 = (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4;
        const int L2 = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
        const int L3 = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        yh[l] = dh[l / 16] * static_cast<float>(L0 - 32);
        yh[l + 32] = dh[l / 16 + 2] * static_cast<float>(L1 - 32);
        yh[l + 64] = dh[l / 16 + 4] * static_cast<float>(L2 - 32);
        yh[l + 96] = dh[l / 16 + 6] * static_cast<float>(L3 - 32);
      }
    }
  }
}
void quant_q6_k(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ6_K blk{};
    float s[16];
    for (int j = 0; j < 16; ++j) s[j] = fit_sym(x + 16 * j, 16, -32, 31);
    int l[16];
    blk.d = quantize_sym_scales(s, 16, -128, 127, l);
    const float d = h2f(blk.d);
    int L[kQK_K];
    for (int j = 0; j < 16; ++j) {
      blk.scales[j] = static_cast<int8_t>(l[j]);
      const float S = d * static_cast<float>(l[j]);
      for (int i = 0; i < 16; ++i) L[16 * j + i] = level_sym(x[16 * j + i], S, -32, 31) + 32;
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = blk.ql + 64 * h;
      uint8_t* qh = blk.qh + 32 * h;
      const int* Lh = L + 128 * h;
      for (int l2 = 0; l2 < 32; ++l2) {
        const int L0 = Lh[l2], L1 = Lh[l2 + 32], L2 = Lh[l2 + 64], L3 = Lh[l2 + 96];
        ql[l2] = static_cast<uint8_t>((L0 & 0xF) | (L2 & 0xF) << 4);
        ql[l2 + 32] = static_cast<uint8_t>((L1 & 0xF) | (L3 & 0xF) << 4);
        qh[l2] = static_cast<uint8_t>((L0 >> 4) | (L1 >> 4) << 2 | (L2 >> 4) << 4 | (L3 >> 4) << 6);
      }
    }
    store_block(dst, b, blk);
  }
}

// Q8_K: ggml's reference algorithm (the CPU kernels' activation quantizer must match it).
void dequant_q8_k(const void* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const auto blk = load_block<BlockQ8_K>(src, b);
    for (int j = 0; j < kQK_K; ++j) y[j] = blk.d * static_cast<float>(blk.qs[j]);
  }
}
void quant_q8_k(const float* x, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ8_K blk{};
    const float mx = signed_absmax(x, kQK_K);
    if (mx != 0.0f && std::isfinite(mx)) {
      const float iscale = -127.0f / mx;
      for (int j = 0; j < kQK_K; ++j) blk.qs[j] = static_cast<int8_t>(round_clamp(iscale * x[j], -127, 127));
      for (int g = 0; g < kQK_K / 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += blk.qs[16 * g + j];
        blk.bsums[g] = static_cast<int16_t>(sum);
      }
      blk.d = 1.0f / iscale;
    }
    store_block(dst, b, blk);
  }
}

// ---------------------------------------------------------------------------------------------
// The table

constexpr DTypeTraits row(GgmlType t, std::string_view name, uint32_t bs, uint32_t ts, GgmlType vdt,
                          DequantizeRowFn dq, QuantizeRowFn q) {
  return DTypeTraits{t, name, bs, ts, 8.0 * ts / bs, vdt, dq, q};
}

using T = GgmlType;
constexpr std::array<DTypeTraits, 16> kTraits = {{
    row(T::F32, "F32", 1, 4, T::F32, dequant_f32, quant_f32),
    row(T::F16, "F16", 1, 2, T::F16, dequant_f16, quant_f16),
    row(T::Q4_0, "Q4_0", 32, 18, T::Q8_0, dequant_legacy<BlockQ4_0>, quant_legacy<BlockQ4_0>),
    row(T::Q4_1, "Q4_1", 32, 20, T::Q8_1, dequant_legacy<BlockQ4_1>, quant_legacy<BlockQ4_1>),
    row(T::Q5_0, "Q5_0", 32, 22, T::Q8_0, dequant_legacy<BlockQ5_0>, quant_legacy<BlockQ5_0>),
    row(T::Q5_1, "Q5_1", 32, 24, T::Q8_1, dequant_legacy<BlockQ5_1>, quant_legacy<BlockQ5_1>),
    row(T::Q8_0, "Q8_0", 32, 34, T::Q8_0, dequant_q8_0, quant_q8_0),
    row(T::Q2_K, "Q2_K", 256, 84, T::Q8_K, dequant_q2_k, quant_q2_k),
    row(T::Q3_K, "Q3_K", 256, 110, T::Q8_K, dequant_q3_k, quant_q3_k),
    row(T::Q4_K, "Q4_K", 256, 144, T::Q8_K, dequant_k45<BlockQ4_K>, quant_k45<BlockQ4_K>),
    row(T::Q5_K, "Q5_K", 256, 176, T::Q8_K, dequant_k45<BlockQ5_K>, quant_k45<BlockQ5_K>),
    row(T::Q6_K, "Q6_K", 256, 210, T::Q8_K, dequant_q6_k, quant_q6_k),
    row(T::Q8_K, "Q8_K", 256, 292, T::Q8_K, dequant_q8_k, quant_q8_k),
    row(T::IQ4_NL, "IQ4_NL", 32, 18, T::Q8_0, dequant_iq4_nl, quant_iq4_nl),
    row(T::IQ4_XS, "IQ4_XS", 256, 136, T::Q8_K, dequant_iq4_xs, quant_iq4_xs),
    row(T::BF16, "BF16", 1, 2, T::BF16, dequant_bf16, quant_bf16),
}};

}  // namespace

const DTypeTraits* dtype_traits(GgmlType t) {
  for (const auto& r : kTraits)
    if (r.type == t) return &r;
  return nullptr;
}

std::span<const DTypeTraits> all_dtype_traits() { return kTraits; }

bool has_reference(GgmlType t) { return dtype_traits(t) != nullptr; }

size_t row_size(GgmlType t, int64_t n) {
  const auto& ti = gguf::type_info(t);
  KILN_CHECK(n >= 0 && n % ti.block_size == 0, "row_size: {} elements is not a multiple of {}'s block size {}", n,
             ti.name, ti.block_size);
  return static_cast<size_t>(n / ti.block_size) * ti.type_size;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  const DTypeTraits* tr = dtype_traits(t);
  KILN_CHECK(tr != nullptr, "dequantize_row: no reference dequantizer for {}", gguf::type_name(t));
  KILN_CHECK(n >= 0 && n % tr->block_size == 0, "dequantize_row: {} elements is not a multiple of {}'s block size {}",
             n, tr->name, tr->block_size);
  tr->dequantize_row(src, dst, n);
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  const DTypeTraits* tr = dtype_traits(t);
  KILN_CHECK(tr != nullptr, "quantize_row: no reference quantizer for {}", gguf::type_name(t));
  KILN_CHECK(n >= 0 && n % tr->block_size == 0, "quantize_row: {} elements is not a multiple of {}'s block size {}",
             n, tr->name, tr->block_size);
  tr->quantize_row(src, dst, n);
}

}  // namespace kiln::tensor
