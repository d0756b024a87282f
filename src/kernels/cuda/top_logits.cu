// kernels/cuda/top_logits.cu — top_logits on the GPU: the k largest logits of each row (sampling
//   from a row's top candidates, so that a step downloads k ids and values per row instead of the
//   whole vocabulary).
// Owns: the two-pass selection. Each (value, id) becomes one 64-bit key whose descending order is
//   top_logits' order (the float's order-preserving bits, NaN lowest, then ~id so ties put the lower
//   id first); pass 1 sorts chunks of kChunk keys per CTA in shared memory (bitonic) and keeps each
//   chunk's first k, pass 2 sorts a row's n_chunks * k survivors and writes the first k. Exact: the
//   result is the reference's (kernels::ref::top_logits), bit for bit.
// Must not: allocate (the survivors live in the Launch workspace: top_logits_workspace) or sync.
// Threading: the launcher only enqueues on L.stream (graph-capturable).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/row_common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kChunk = kTopLogitsChunk;  // keys per pass-1 CTA (32 KiB of shared memory)
constexpr int kPass2MaxKeys = 16384; // survivors one pass-2 CTA sorts (128 KiB)
constexpr int kThreads1 = 512, kThreads2 = 1024;

__device__ __forceinline__ uint64_t top_key(float v, uint32_t id) {
  uint32_t u = __float_as_uint(v);
  u = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(u) << 32) | uint32_t(~id);
}
__device__ __forceinline__ float key_value(uint64_t key) {
  const uint32_t u = uint32_t(key >> 32);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// Sorts s[0, n) descending (n a power of two) with the whole block.
__device__ void sort_desc(uint64_t* s, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = threadIdx.x; t < n / 2; t += blockDim.x) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const uint64_t a = s[i], b = s[j];
        if (((i & size) == 0) == (a < b)) {  // descending where (i & size) == 0, ascending elsewhere
          s[i] = b;
          s[j] = a;
        }
      }
    }
  __syncthreads();
}

// grid (n_chunks, n): chunk c of row r -> its k best keys at ws[(r * n_chunks + c) * k].
__global__ void __launch_bounds__(kThreads1) top_pass1(const float* __restrict__ logits, int64_t V, int k,
                                                       int n_chunks, uint64_t* __restrict__ ws) {
  __shared__ uint64_t s[kChunk];
  pdl::begin();
  const int64_t r = blockIdx.y, base = int64_t(blockIdx.x) * kChunk;
  const float* l = logits + r * V;
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int64_t e = base + i;
    s[i] = e < V ? top_key(l[e], uint32_t(e)) : 0;  // 0: below every real key
  }
  sort_desc(s, kChunk);
  uint64_t* out = ws + (r * n_chunks + blockIdx.x) * int64_t(k);
  for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = s[i];
}

// grid n: row r's n_chunks * k survivors (padded to n2, a power of two) -> ids / vals [k].
__global__ void __launch_bounds__(kThreads2) top_pass2(const uint64_t* __restrict__ ws, int k, int n_keys, int n2,
                                                       int32_t* __restrict__ ids, float* __restrict__ vals) {
  extern __shared__ uint64_t s2[];
  pdl::begin();
  const int64_t r = blockIdx.x;
  const uint64_t* in = ws + r * n_keys;
  for (int i = threadIdx.x; i < n2; i += blockDim.x) s2[i] = i < n_keys ? in[i] : 0;
  sort_desc(s2, n2);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    ids[r * k + i] = int32_t(~uint32_t(s2[i]));
    vals[r * k + i] = key_value(s2[i]);
  }
}

int pass2_keys(int64_t V, int k, int* n_chunks) {
  *n_chunks = int((V + kChunk - 1) / kChunk);
  int n2 = 1;
  while (n2 < *n_chunks * k) n2 <<= 1;
  return n2;
}

}  // namespace

void top_logits(const Launch& L, const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals) {
  KILN_CHECK(k >= 1 && k <= V && k <= kMaxTopLogits, "top_logits: k {} vs V {} (k <= {})", k, V, kMaxTopLogits);
  KILN_CHECK(logits && ids && vals, "top_logits: null pointer");
  if (n == 0) return;
  int n_chunks = 0;
  const int n2 = pass2_keys(V, k, &n_chunks);
  KILN_CHECK(n2 <= kPass2MaxKeys, "top_logits: {} rows of {} entries keep {} candidates per row (at most {})", n, V,
             int64_t(n_chunks) * k, kPass2MaxKeys);
  KILN_CHECK(n <= 65535, "top_logits: {} rows (at most 65535)", n);
  KILN_CHECK(L.ws_bytes >= top_logits_workspace(V, n, k), "top_logits: workspace of {} bytes, {} needed", L.ws_bytes,
             top_logits_workspace(V, n, k));
  auto* ws = static_cast<uint64_t*>(L.ws);
  pdl::launch(L, dim3(unsigned(n_chunks), unsigned(n)), dim3(kThreads1), 0, top_pass1, logits, V, k, n_chunks, ws);
  KILN_CUDA_LAUNCHED("top_logits pass 1");
  static const bool attr_set = cudaFuncSetAttribute(top_pass2, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    int(kPass2MaxKeys * sizeof(uint64_t))) == cudaSuccess;
  KILN_CHECK(attr_set, "top_logits: {} bytes of shared memory refused", kPass2MaxKeys * sizeof(uint64_t));
  pdl::launch(L, dim3(unsigned(n)), dim3(kThreads2), size_t(n2) * sizeof(uint64_t), top_pass2,
              static_cast<const uint64_t*>(ws), k, n_chunks * k, n2, ids, vals);
  KILN_CUDA_LAUNCHED("top_logits pass 2");
}

}  // namespace kiln::cuda
