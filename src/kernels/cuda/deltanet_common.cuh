// kernels/cuda/deltanet_common.cuh — what the two gated-delta-rule kernels share (deltanet.cu's
//   multi-block recurrence, deltanet_fused.cu's recurrence + gated norm): the argument block and the
//   per-thread pieces of one token's step on 16 key rows of a state column held in registers
//   (interleaved rows: gdn_row).
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
  const int32_t* skip = nullptr;  // nullptr, or per token: 1 = its run takes the chunked form (not this kernel)
  char* st;  // element (i, j, h) of slot s at st + j*nb1 + h*nb2 + s*nb3 + 4i
  size_t nb1, nb2, nb3;
  float* out;
  int64_t o_s1, o_s2;
  int S, Hk, Hv, T, range;
  float qscale;
};

// A thread's 16 rows of a state column: 4 runs of 4 consecutive rows, run j at row
// gdn_row<TPC>(gl, j) = 4 gl + 4 TPC j for thread gl of the column's TPC threads. The TPC threads of a
// column thus read consecutive 16-byte pieces of q, k and of the state column: shared-memory reads
// without bank conflicts (rows 16 gl .. 16 gl + 15 put 4 threads on the same banks) and coalesced
// state loads. Runs at or past S are not held (zeros, never stored).
template <int TPC>
__device__ __forceinline__ int gdn_row(int gl, int j) {
  return 4 * gl + 4 * TPC * j;
}

// The thread's 16 state floats of the column starting at col (16-byte aligned when VEC) to / from
// registers.
template <int TPC, bool VEC>
__device__ __forceinline__ void gdn_load16(const float* col, int gl, int S, float (&M)[16]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = gdn_row<TPC>(gl, j);
    if (r >= S) {
      M[4 * j] = M[4 * j + 1] = M[4 * j + 2] = M[4 * j + 3] = 0.0f;
    } else if constexpr (VEC) {
      const float4 f = *reinterpret_cast<const float4*>(col + r);
      M[4 * j] = f.x, M[4 * j + 1] = f.y, M[4 * j + 2] = f.z, M[4 * j + 3] = f.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) M[4 * j + e] = col[r + e];
    }
  }
}
template <int TPC, bool VEC>
__device__ __forceinline__ void gdn_store16(float* col, int gl, int S, const float (&M)[16]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = gdn_row<TPC>(gl, j);
    if (r >= S) continue;
    if constexpr (VEC) {
      *reinterpret_cast<float4*>(col + r) = make_float4(M[4 * j], M[4 * j + 1], M[4 * j + 2], M[4 * j + 3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) col[r + e] = M[4 * j + e];
    }
  }
}

// The token's q and k at this thread's rows (qs, ks: the token's S values in shared memory, 16-byte
// aligned), zeros past S.
template <int TPC>
__device__ __forceinline__ void gdn_qk16(const float* qs, const float* ks, int gl, int S, float (&q)[16],
                                         float (&k)[16]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = gdn_row<TPC>(gl, j);
    float4 fq = make_float4(0.f, 0.f, 0.f, 0.f), fk = fq;
    if (r < S) fq = *reinterpret_cast<const float4*>(qs + r), fk = *reinterpret_cast<const float4*>(ks + r);
    q[4 * j] = fq.x, q[4 * j + 1] = fq.y, q[4 * j + 2] = fq.z, q[4 * j + 3] = fq.w;
    k[4 * j] = fk.x, k[4 * j + 1] = fk.y, k[4 * j + 2] = fk.z, k[4 * j + 3] = fk.w;
  }
}

// This thread's part of the token's column dots over its 16 rows: pk = M.k, pq = M.q, kq = k.q, each
// summed in the thread's row order.
__device__ __forceinline__ void gdn_dots16(const float (&M)[16], const float (&q)[16], const float (&k)[16], float& pk,
                                           float& pq, float& kq) {
  pk = pq = kq = 0.0f;
#pragma unroll
  for (int e = 0; e < 16; ++e) pk = fmaf(M[e], k[e], pk), pq = fmaf(M[e], q[e], pq), kq = fmaf(k[e], q[e], kq);
}
// M = e^g M + k d on the 16 rows.
__device__ __forceinline__ void gdn_update16(float (&M)[16], const float (&k)[16], float dl, float decay) {
#pragma unroll
  for (int e = 0; e < 16; ++e) M[e] = fmaf(k[e], dl, M[e] * decay);
}

}  // namespace
}  // namespace kiln::cuda
