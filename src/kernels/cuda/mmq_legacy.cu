// kernels/cuda/mmq_legacy.cu — the int8 tensor-core mat-mul (mmq.cuh) instantiated for
//   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL.
// Owns: the legacy family's launcher (matmul_internal.h). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include "kernels/cuda/mmq.cuh"

namespace kiln::cuda::detail {

bool mmq_legacy(GgmlType t, const MmqArgs& a, cudaStream_t s) {
  switch (t) {
    case GgmlType::Q4_0: mmq_launch<GgmlType::Q4_0>(a, s); return true;
    case GgmlType::Q4_1: mmq_launch<GgmlType::Q4_1>(a, s); return true;
    case GgmlType::Q5_0: mmq_launch<GgmlType::Q5_0>(a, s); return true;
    case GgmlType::Q5_1: mmq_launch<GgmlType::Q5_1>(a, s); return true;
    case GgmlType::Q8_0: mmq_launch<GgmlType::Q8_0>(a, s); return true;
    case GgmlType::IQ4_NL: mmq_launch<GgmlType::IQ4_NL>(a, s); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda::detail
