// kernels/cuda/mma.cuh — warp-level tensor-core building blocks shared by the kernels that use them
//   (mmq.cu, attention_mma.cu, deltanet_chunked.cuh): the F16 m16n8k16 and TF32 m16n8k8 mmas with F32
//   accumulators, ldmatrix loads of F16 fragments from shared memory, and 16-byte cp.async copies that
//   zero-fill what they do not read.
// Must not: be included by code built for architectures below sm_80 without guarding the calls
//   (the wrappers compile to nothing there; kernels that use them check the architecture).
// Threading: warp-synchronous (every lane of the warp executes each call).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda::mma {

// c += a (16x16, row-major fragments) * b (16x8, column fragments); F16 in, F32 accumulators.
__device__ __forceinline__ void m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// c += a (16x8, row-major fragments) * b (8x8, column fragments); TF32 in (tf32_split), F32 accumulators.
// Lane l (g = l / 4, q = l % 4) holds a = {(g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4)}, b = {(q, g),
// (q + 4, g)} and c = {(g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1)} (row, column).
__device__ __forceinline__ void m16n8k8_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// x = hi + lo in TF32 (round to nearest) for products in three TF32 mmas (hi*hi + hi*lo + lo*hi): about
// F32 accuracy (the dropped lo*lo term is ~2^-22 of the product).
__device__ __forceinline__ void tf32_split(float x, uint32_t& hi, uint32_t& lo) {
#if __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
#else
  hi = __float_as_uint(x), lo = 0;
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// 16 bytes global -> shared (L1 bypassed); ok = false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp16_or_zero(uint32_t dst, const void* src, bool ok) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace kiln::cuda::mma
