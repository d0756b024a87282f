// kernels/cuda/attention_common.cuh — what the attention kernels of attention.cu (CUDA cores,
//   prefill and fallback), attention_decode.cu (decode) and attention_mma.cu (tensor cores) share: the
//   cache codes and arguments (CacheArg, cache_arg), the rows every kernel reads and writes (AttnIO),
//   the CUDA-core kernels' arguments (AttnK: the work layout of workspace.h's AttnPlan, split-KV
//   partials) and the 8-element cache item loads and conversions.
// Must not: launch anything. Threading: device functions and plain structs.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/workspace.h"

namespace kiln::cuda::attn {

// Cache element types as the kernels see them.
enum CacheCode : int { kF32 = 0, kF16 = 1, kQ8 = 2, kQ4 = 3 };

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float half_bits_to_float(unsigned short b) { return __half2float(__ushort_as_half(b)); }
struct CacheArg {
  const char* p;
  int code;
  int vec;  // rows 16-byte aligned: F32 / F16 elements by 16-byte loads
  size_t nb1, nb2, nb3;
};

// What every attention kernel reads and writes: q rows, the output rows, per-token slots and positions,
// and the two caches.
struct AttnIO {
  const float* q;
  int64_t q_s1, q_s2;
  float* out;
  int64_t o_s1, o_s2;
  const int32_t* seq;
  const int32_t* pos;
  CacheArg k, v;
  int last_all;  // >= 0: not causal, every token's last key (n_ctx - 1; pos is not read); -1: causal
};

// The last key position token t attends to.
__device__ __forceinline__ int attn_last(const AttnIO& p, int t) { return p.last_all >= 0 ? p.last_all : p.pos[t]; }

// Key ranges of a tensor-core tile whose keys are [0, kv_hi), at most max_split (AttnPlan::mma_split):
// ranges of at least kMmaSplitKeys keys (workspace.h). The kernel and attn_merge both decide by it.
__device__ __forceinline__ int mma_splits(int kv_hi, int max_split) {
  return max(1, min(max_split, kv_hi / detail::kMmaSplitKeys));
}

struct AttnK : AttnIO {
  int D, T, Hq, G, hg, bq;
  float qscale;  // scale * log2(e)
  int n_split, chunk;
  float* part_o;   // [n_split][T][Hq][D] (n_split > 1)
  float* part_ml;  // [n_split][T][Hq][2]: m (log2 units), l
  int mma_bt;      // > 0: tiles of this many tokens within one run are the tensor-core kernel's
  int mma_split;   // with mma_bt: its tiles' key ranges at most (mma_splits; 1: it wrote the outputs)
};

inline int cache_code(gguf::GgmlType t) {
  switch (t) {
    case gguf::GgmlType::F32: return kF32;
    case gguf::GgmlType::F16: return kF16;
    case gguf::GgmlType::Q8_0: return kQ8;
    case gguf::GgmlType::Q4_0: return kQ4;
    default: return -1;
  }
}
inline CacheArg cache_arg(const SeqMem& m) {
  CacheArg c;
  c.p = static_cast<const char*>(m.p);
  c.code = cache_code(m.type);
  c.nb1 = m.nb1, c.nb2 = m.nb2, c.nb3 = m.nb3;
  c.vec = ((reinterpret_cast<uintptr_t>(m.p) | m.nb1 | m.nb2 | m.nb3) % 16) == 0;
  return c;
}

// One item = eight consecutive elements e..e+7 of a cache row (e a multiple of 8). A tile is
// fetched whole (global loads into registers) before any item is converted, so all its loads are in
// flight at once. F16 / Q8_0 / Q4_0 items fit 16 bytes (F16: 8 halves; Q8_0 / Q4_0: x, y = the 8 quant
// bytes (Q4_0: the 8 bytes holding the nibbles), z = d); F32 items take two float4.
__device__ __forceinline__ uint4 fetch16(const CacheArg& c, const char* __restrict__ row, int e) {
  if (c.code == kF16) {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row) + e;
    if (c.vec) return *reinterpret_cast<const uint4*>(p);
    return make_uint4(p[0] | uint32_t(p[1]) << 16, p[2] | uint32_t(p[3]) << 16, p[4] | uint32_t(p[5]) << 16,
                      p[6] | uint32_t(p[7]) << 16);
  }
  // Q8_0 / Q4_0: blocks of 34 / 18 bytes, only 2-byte aligned: 16-bit loads.
  const bool q8 = c.code == kQ8;
  const int eb = e & 31;
  const unsigned short* blk = reinterpret_cast<const unsigned short*>(row + size_t(e >> 5) * (q8 ? 34 : 18));
  const unsigned short* qs = blk + 1 + ((q8 ? eb : (eb & 15)) >> 1);
  return make_uint4(uint32_t(qs[0]) | uint32_t(qs[1]) << 16, uint32_t(qs[2]) | uint32_t(qs[3]) << 16, blk[0], 0u);
}
__device__ __forceinline__ void convert16(int code, const uint4& r, int e, float f[8]) {
  if (code == kF16) {
    f[0] = half_bits_to_float(r.x & 0xffff), f[1] = half_bits_to_float(r.x >> 16);
    f[2] = half_bits_to_float(r.y & 0xffff), f[3] = half_bits_to_float(r.y >> 16);
    f[4] = half_bits_to_float(r.z & 0xffff), f[5] = half_bits_to_float(r.z >> 16);
    f[6] = half_bits_to_float(r.w & 0xffff), f[7] = half_bits_to_float(r.w >> 16);
  } else if (code == kQ8) {
    const float d = half_bits_to_float((unsigned short)r.z);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = d * float(int8_t(((j < 4 ? r.x : r.y) >> (8 * (j & 3))) & 0xff));
  } else {
    const float d = half_bits_to_float((unsigned short)r.z);
    const int sh = (e & 31) >= 16 ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = d * float(int(((j < 4 ? r.x : r.y) >> (8 * (j & 3) + sh)) & 0xf) - 8);
  }
}
}  // namespace kiln::cuda::attn

namespace kiln::cuda::detail {
// Decode-sized batches (plan bq == 1, no tensor-core tiles) over F16 / Q8_0 / Q4_0 caches with
// head_dim 64 / 128 / 256 and at most 8 q heads per block: launches attention_decode.cu's kernel (its
// output, or the splits' partials for attn_merge) and returns true; false: nothing enqueued.
// KILN_CUDA_ATTN_DEC=0 turns it off (comparisons).
bool attention_decode(const Launch& L, const attn::AttnK& p, const AttnPlan& pl);
}  // namespace kiln::cuda::detail
