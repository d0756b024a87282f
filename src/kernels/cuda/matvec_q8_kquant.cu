// kernels/cuda/matvec_q8_kquant.cu — the int8 mat-vec kernel (matvec_q8.cuh) instantiated for
//   Q4_K Q5_K Q6_K IQ4_XS.
// Owns: the k-quant family's int8 launcher (matmul_internal.h). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include "kernels/cuda/matvec_q8.cuh"

namespace kiln::cuda::detail {

bool matvec_q8_kquant(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s) {
  switch (t) {
    case GgmlType::Q4_K: mvq_launch<GgmlType::Q4_K>(a, n_grid_y, s); return true;
    case GgmlType::Q5_K: mvq_launch<GgmlType::Q5_K>(a, n_grid_y, s); return true;
    case GgmlType::Q6_K: mvq_launch<GgmlType::Q6_K>(a, n_grid_y, s); return true;
    case GgmlType::IQ4_XS: mvq_launch<GgmlType::IQ4_XS>(a, n_grid_y, s); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda::detail
