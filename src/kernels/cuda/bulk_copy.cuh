// kernels/cuda/bulk_copy.cuh — mbarrier and bulk-copy (tensor memory accelerator) primitives for
//   the kernels that stage weights in shared memory rings (matvec_q8.cuh BULK, mmq.cu).
// Owns: the inline PTX of mbarrier init / arrive / wait and cp.async.bulk global -> shared. sm_90+
//   only: on older architectures the bodies are empty and the callers must not take these paths.
// Must not: know about launch geometry.
// Threading: device functions; a barrier's arrival count is the caller's contract.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mb_init(uint32_t bar, int count) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mb_init_fence() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Arrives on the barrier, expecting `bytes` more of transfer, and copies `bytes` (a multiple of 16)
// from the 16-byte aligned global address src to shared address dst, completing on the barrier.
__device__ __forceinline__ void mb_bulk_load(uint32_t bar, uint32_t dst, const void* src, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "fence.proxy.async.shared::cta;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %3;\n"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%1], [%2], %3, [%0];" ::"r"(bar),
      "r"(dst), "l"(src), "r"(bytes)
      : "memory");
#endif
}
// Arrives on the barrier expecting `bytes`, and copies the box at element coordinates (c0, c1) of the
// 2-D tensor map `map` (a __grid_constant__ kernel parameter) to shared address dst (128-byte aligned),
// completing on the barrier; elements outside the tensor are zeros (and count in `bytes`).
__device__ __forceinline__ void mb_tensor_load_2d(uint32_t bar, uint32_t dst, const void* map, int c0, int c1,
                                                  uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "fence.proxy.async.shared::cta;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %5;\n"
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%1], [%2, {%3, %4}], [%0];" ::"r"(bar),
      "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bytes)
      : "memory");
#endif
}
__device__ __forceinline__ void mb_wait(uint32_t bar, uint32_t parity) {
#if __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
}
// Arrives on the barrier without a transfer.
__device__ __forceinline__ void mb_arrive(uint32_t bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}

}  // namespace kiln::cuda::detail
