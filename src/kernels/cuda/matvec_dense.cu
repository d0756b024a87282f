// kernels/cuda/matvec_dense.cu — the mat-vec kernel (matvec.cuh) instantiated for F32 F16 BF16.
// Owns: the dense family's launcher (matmul_internal.h). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include "kernels/cuda/matvec.cuh"

namespace kiln::cuda::detail {

bool matvec_dense(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s) {
  switch (t) {
    case GgmlType::F32: mv_launch<GgmlType::F32>(a, n_grid_y, s); return true;
    case GgmlType::F16: mv_launch<GgmlType::F16>(a, n_grid_y, s); return true;
    case GgmlType::BF16: mv_launch<GgmlType::BF16>(a, n_grid_y, s); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda::detail
