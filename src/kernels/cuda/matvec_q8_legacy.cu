// kernels/cuda/matvec_q8_legacy.cu — the int8 mat-vec kernel (matvec_q8.cuh) instantiated for
//   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL.
// Owns: the legacy family's int8 launcher (matmul_internal.h). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include "kernels/cuda/matvec_q8.cuh"

namespace kiln::cuda::detail {

bool matvec_q8_legacy(GgmlType t, const MvArgs& a, int n_grid_y, cudaStream_t s) {
  switch (t) {
    case GgmlType::Q4_0: mvq_launch<GgmlType::Q4_0>(a, n_grid_y, s); return true;
    case GgmlType::Q4_1: mvq_launch<GgmlType::Q4_1>(a, n_grid_y, s); return true;
    case GgmlType::Q5_0: mvq_launch<GgmlType::Q5_0>(a, n_grid_y, s); return true;
    case GgmlType::Q5_1: mvq_launch<GgmlType::Q5_1>(a, n_grid_y, s); return true;
    case GgmlType::Q8_0: mvq_launch<GgmlType::Q8_0>(a, n_grid_y, s); return true;
    case GgmlType::IQ4_NL: mvq_launch<GgmlType::IQ4_NL>(a, n_grid_y, s); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda::detail
