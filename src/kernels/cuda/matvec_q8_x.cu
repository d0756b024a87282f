// kernels/cuda/matvec_q8_x.cu — the x side of the int8 mat-vec: quantize_x (F32 x columns -> int8
//   per 32 values with an F32 scale and half sums, in the weight type's x order), the workspace
//   layout, and which types have the int8 kernel.
// Owns: the x quantization (matmul_internal.h states it). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/dequant_q8.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace kiln::cuda::detail {
namespace {

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

// One warp per 32 values: lane p takes x order position p.
__global__ void quantize_x_kernel(const float* x, int64_t s_outer, int64_t s_inner, int64_t nx, int64_t k,
                                  int64_t total, int layout, int8_t* xq, Q8Meta* meta) {
  q8::pdl_launch_dependents();  // the mat-vec kernel may start its weight prefetch
  q8::pdl_wait();               // x (and the workspace's last reader) are done
  const int lane = threadIdx.x & 31;
  const int64_t nblk = k / 32;
  const int e = layout == q8::kXPairs ? (lane >> 1) + 16 * (lane & 1) : lane;  // element of position lane
  for (int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; b < total;
       b += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t col = b / nblk, blk = b - col * nblk;
    const float* src = x + (col / nx) * s_outer + (col % nx) * s_inner + blk * 32;
    const float v = src[e];
    const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
    int q = 0;
    if (amax > 0.f) q = max(-127, min(127, __float2int_rn(v * (127.f / amax))));
    xq[b * 32 + lane] = int8_t(q);
    const int s0 = __reduce_add_sync(0xffffffffu, lane < 16 ? q : 0);
    const int s1 = __reduce_add_sync(0xffffffffu, lane < 16 ? 0 : q);
    if (lane == 0) meta[b] = {__float_as_uint(amax / 127.f), (uint32_t(s0) & 0xFFFFu) | (uint32_t(s1) << 16)};
  }
}

}  // namespace

size_t q8_x_meta_offset(int64_t k, int64_t ncols) { return align256(size_t(k) * size_t(ncols)); }
size_t q8_x_bytes(int64_t k, int64_t ncols) {
  return q8_x_meta_offset(k, ncols) + align256(size_t(k / 32) * size_t(ncols) * sizeof(Q8Meta));
}

void quantize_x(const float* x, int64_t s_outer, int64_t s_inner, int64_t nx, int64_t k, int64_t ncols, int layout,
                void* ws, bool pdl, cudaStream_t s) {
  const int64_t total = ncols * (k / 32);
  if (total <= 0) return;
  auto* xq = static_cast<int8_t*>(ws);
  auto* meta = reinterpret_cast<Q8Meta*>(static_cast<uint8_t*>(ws) + q8_x_meta_offset(k, ncols));
  const int64_t blocks = std::min<int64_t>((total + 7) / 8, 8192);
  q8::launch(pdl, dim3(unsigned(blocks)), dim3(256), s, quantize_x_kernel, x, s_outer, s_inner, nx, k, total, layout,
             xq, meta);
}

bool matvec_q8_supported(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::IQ4_NL: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::IQ4_XS:
      return true;
    default: return false;
  }
}

int matvec_q8_x_layout(GgmlType t) {
  return t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS ? q8::kXPairs : q8::kXNatural;
}

}  // namespace kiln::cuda::detail
