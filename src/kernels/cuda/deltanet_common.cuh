// kernels/cuda/deltanet_common.cuh — what the two gated-delta-rule kernels share (deltanet.cu's
//   multi-block recurrence, deltanet_fused.cu's recurrence + gated norm): the argument block and the
//   per-thread pieces of one token's step on 16 key rows of a state column held in registers.
// Owns: GdnK and the step's arithmetic (column dots M.k, M.q and k.q in element order; the update
//   M = e^g M + k d). Internal to src/kernels/cuda (an anonymous namespace: each .cu its own copy).
// Must not: allocate or synchronize. Threading: device functions.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {
namespace {

struct GdnK {
  const float* q;
  int64_t q_s1, q_s2;
  const float* k;
  int64_t k_s1, k_s2;
  const float* v;
  int64_t v_s1, v_s2;
  const float* g;     // [Hv, T]
  const float* beta;  // [Hv, T]
  const int32_t* seq;
  const int32_t* keep;  // nullptr, or per token: the slot that also receives the state after it (-1: none)
  char* st;  // element (i, j, h) of slot s at st + j*nb1 + h*nb2 + s*nb3 + 4i
  size_t nb1, nb2, nb3;
  float* out;
  int64_t o_s1, o_s2;
  int S, Hk, Hv, T, range;
  float qscale;
};

// 16 consecutive state floats at sp (16-byte aligned when VEC) to / from registers.
template <bool VEC>
__device__ __forceinline__ void gdn_load16(const float* sp, float (&M)[16]) {
  if constexpr (VEC) {
#pragma unroll
    for (int e = 0; e < 16; e += 4) {
      const float4 f = *reinterpret_cast<const float4*>(sp + e);
      M[e] = f.x, M[e + 1] = f.y, M[e + 2] = f.z, M[e + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) M[e] = sp[e];
  }
}
template <bool VEC>
__device__ __forceinline__ void gdn_store16(float* sp, const float (&M)[16]) {
  if constexpr (VEC) {
#pragma unroll
    for (int e = 0; e < 16; e += 4) *reinterpret_cast<float4*>(sp + e) = make_float4(M[e], M[e + 1], M[e + 2], M[e + 3]);
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) sp[e] = M[e];
  }
}

// This thread's part of the token's column dots over its 16 key rows (q16, k16: 16-byte aligned
// shared memory): pk = M.k, pq = M.q, kq = k.q, summed in element order.
__device__ __forceinline__ void gdn_dots16(const float (&M)[16], const float* q16, const float* k16, float& pk,
                                           float& pq, float& kq) {
  pk = pq = kq = 0.0f;
#pragma unroll
  for (int e = 0; e < 16; e += 4) {
    const float4 fq = *reinterpret_cast<const float4*>(q16 + e);
    const float4 fk = *reinterpret_cast<const float4*>(k16 + e);
    pk = fmaf(M[e], fk.x, pk), pq = fmaf(M[e], fq.x, pq), kq = fmaf(fk.x, fq.x, kq);
    pk = fmaf(M[e + 1], fk.y, pk), pq = fmaf(M[e + 1], fq.y, pq), kq = fmaf(fk.y, fq.y, kq);
    pk = fmaf(M[e + 2], fk.z, pk), pq = fmaf(M[e + 2], fq.z, pq), kq = fmaf(fk.z, fq.z, kq);
    pk = fmaf(M[e + 3], fk.w, pk), pq = fmaf(M[e + 3], fq.w, pq), kq = fmaf(fk.w, fq.w, kq);
  }
}
// M = e^g M + k d on the 16 rows (k16 as in gdn_dots16).
__device__ __forceinline__ void gdn_update16(float (&M)[16], const float* k16, float dl, float decay) {
#pragma unroll
  for (int e = 0; e < 16; e += 4) {
    const float4 fk = *reinterpret_cast<const float4*>(k16 + e);
    M[e] = fmaf(fk.x, dl, M[e] * decay), M[e + 1] = fmaf(fk.y, dl, M[e + 1] * decay);
    M[e + 2] = fmaf(fk.z, dl, M[e + 2] * decay), M[e + 3] = fmaf(fk.w, dl, M[e + 3] * decay);
  }
}

}  // namespace
}  // namespace kiln::cuda
