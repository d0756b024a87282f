// kernels/cuda/mmq_kquant.cu — the int8 tensor-core mat-mul (mmq.cuh) instantiated for
//   Q4_K Q5_K Q6_K IQ4_XS.
// Owns: the k-quant family's launcher (matmul_internal.h). Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include "kernels/cuda/mmq.cuh"

namespace kiln::cuda::detail {

bool mmq_kquant(GgmlType t, const MmqArgs& a, cudaStream_t s) {
  switch (t) {
    case GgmlType::Q4_K: mmq_launch<GgmlType::Q4_K>(a, s); return true;
    case GgmlType::Q5_K: mmq_launch<GgmlType::Q5_K>(a, s); return true;
    case GgmlType::Q6_K: mmq_launch<GgmlType::Q6_K>(a, s); return true;
    case GgmlType::IQ4_XS: mmq_launch<GgmlType::IQ4_XS>(a, s); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda::detail
