// kernels/cuda/matvec_kquant.cu — the mat-vec kernel (matvec.cuh) instantiated for Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS.
// Owns: the kquant family's launcher (matmul_internal.h). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include "kernels/cuda/matvec.cuh"

namespace kiln::cuda::detail {

bool matvec_kquant(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s) {
  switch (t) {
    case GgmlType::Q2_K: mv_launch<GgmlType::Q2_K>(a, n_grid_y, s); return true;
    case GgmlType::Q3_K: mv_launch<GgmlType::Q3_K>(a, n_grid_y, s); return true;
    case GgmlType::Q4_K: mv_launch<GgmlType::Q4_K>(a, n_grid_y, s); return true;
    case GgmlType::Q5_K: mv_launch<GgmlType::Q5_K>(a, n_grid_y, s); return true;
    case GgmlType::Q6_K: mv_launch<GgmlType::Q6_K>(a, n_grid_y, s); return true;
    case GgmlType::IQ4_XS: mv_launch<GgmlType::IQ4_XS>(a, n_grid_y, s); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda::detail
