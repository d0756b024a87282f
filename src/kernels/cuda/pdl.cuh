// kernels/cuda/pdl.cuh — programmatic dependent launch (sm_90+): a stream's next kernel may be
//   launched while this one runs, and waits on the device for this one's results.
// Owns: the protocol every kernel launched through pdl::launch follows: pdl::begin() (or pdl::wait())
//   before its first global memory access, read or write, so an early-launched kernel touches nothing
//   until its predecessor has completed (and, by induction, every kernel before it); pdl::trigger()
//   lets the next kernel launch once every CTA of this one has started. Kernels not launched this way
//   pass through begin() at once (no-ops before sm_90).
// Must not: launch a kernel through pdl::launch that reads or writes global memory before pdl::wait().
// Threading: the launchers only enqueue on the given stream.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_ops.h"

namespace kiln::cuda {
namespace detail {
bool matvec_pdl(int sm);  // matmul_internal.h: on for sm_90+ unless KILN_CUDA_PDL=0
bool pdl_all();           // also for the kernels launched here, unless KILN_CUDA_PDL_ALL=0 (matmul.cu)
}  // namespace detail

namespace pdl {

__device__ __forceinline__ void trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The first statement of a PDL-launched kernel that needs its inputs at once.
__device__ __forceinline__ void begin() {
  trigger();
  wait();
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic stream serialization when `on`.
template <class... P, class... A>
void launch(bool on, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void (*kernel)(P...), A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at, cfg.numAttrs = on ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<A&&>(args)...);
}
// The same on L.stream, with PDL where the device and the switches allow it.
template <class... P, class... A>
void launch(const Launch& L, dim3 grid, dim3 block, size_t smem, void (*kernel)(P...), A&&... args) {
  launch(detail::matvec_pdl(L.sm) && detail::pdl_all(), grid, block, smem, L.stream, kernel, static_cast<A&&>(args)...);
}

}  // namespace pdl
}  // namespace kiln::cuda
