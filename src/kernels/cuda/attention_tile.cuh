// kernels/cuda/attention_tile.cuh — what attention.cu (CUDA cores) and attention_mma.cu (tensor
//   cores) share to split one batch between them: the device test of which tiles the tensor-core
//   kernel takes, and its launcher.
// Threading: attn_tile_whole is a block-wide barrier (every thread of the block must call it).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"

namespace kiln::cuda {

// Whether tokens [t0, min(T, t0 + bt)) all belong to seq[t0]'s run (bt <= blockDim.x): the tiles the
// tensor-core kernel takes. Positions along a run increase, so one slot means one run.
__device__ __forceinline__ bool attn_tile_whole(const int32_t* seq, int T, int t0, int bt) {
  const int t = t0 + int(threadIdx.x);
  const bool same = int(threadIdx.x) >= bt || t >= T || seq[t] == seq[t0];
  return __syncthreads_and(same) != 0;
}

namespace detail {
// Launches the tensor-core kernel over the tiles it takes when attention_mma_tile allows it for this
// launch (and the caches are 16-byte aligned); returns its tile in tokens, 0 when it did not launch.
// max_split > 1: a tile with enough keys (mma_splits) splits them into ranges whose unnormalised
// partials go to part_o [split][T][Hq][D] / part_ml [split][T][Hq][2] for attn_merge (attention.cu).
int attention_mma(const Launch& L, Rows q, const int32_t* seq, const int32_t* pos, const SeqMem& k, const SeqMem& v,
                  const AttnArgs& a, Rows out, int max_split, float* part_o, float* part_ml);
}  // namespace detail

}  // namespace kiln::cuda
