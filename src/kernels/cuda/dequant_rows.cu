// kernels/cuda/dequant_rows.cu — whole rows of any weight type dequantized to F32 (get_rows) or to F16
//   (the tensor-core path's W tiles), one thread per 8 consecutive elements.
// Owns: detail::dequant_rows (matmul_internal.h). F32 output is bit-identical to tensor::dequantize_row
//   (dequant.cuh evaluates the host formulas); F16 output is that value rounded to nearest.
// Must not: allocate or synchronize.
// Threading: the launcher only enqueues on its stream.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace kiln::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

template <GgmlType T, int A, bool kHalf>
__global__ void __launch_bounds__(kThreads)
    dequant_rows_kernel(const uint8_t* src, size_t row_stride, int64_t k, const int32_t* ids, void* out,
                        int64_t out_stride) {
  const int64_t r = blockIdx.y;
  const uint8_t* p = src + size_t(ids ? int64_t(ids[r]) : r) * row_stride;
  for (int64_t e8 = int64_t(blockIdx.x) * kThreads + threadIdx.x; e8 < k / 8; e8 += int64_t(gridDim.x) * kThreads) {
    const int64_t e = e8 * 8;
    float v[8];
    if constexpr (dq::is_dense<T>()) {
      dq::load_dense8<T, A>(p + e * dq::elem_bytes<T>(), v);
    } else {
      using D = dq::Q<T>;
      constexpr int kUPB = D::kQK / 32;
      const int64_t unit = e / 32;
      dq::dequant8<T, A>(p + size_t(unit / kUPB) * D::kBS, int(unit % kUPB), int(e8 & 3), v);
    }
    if constexpr (kHalf) {
      uint32_t h[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __half2 t = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        h[j] = *reinterpret_cast<const uint32_t*>(&t);
      }
      *reinterpret_cast<uint4*>(static_cast<__half*>(out) + r * out_stride + e) = make_uint4(h[0], h[1], h[2], h[3]);
    } else {
      float* o = static_cast<float*>(out) + r * out_stride + e;
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = v[j];
    }
  }
}

template <GgmlType T>
void launch(const void* src, size_t row_stride, int64_t k, const int32_t* ids, int64_t n_rows, void* out, bool half,
            int64_t out_stride, cudaStream_t s) {
  constexpr int kNat = dq::fast_align<T>(), kMinA = dq::min_align<T>();
  const bool nat = ((uintptr_t(src) | row_stride) % kNat) == 0;
  const unsigned gx = unsigned(std::min<int64_t>((k / 8 + kThreads - 1) / kThreads, 1024));
  for (int64_t r0 = 0; r0 < n_rows; r0 += kMaxGridY) {
    const dim3 grid(gx, unsigned(std::min(kMaxGridY, n_rows - r0)));
    const uint8_t* sp = static_cast<const uint8_t*>(src) + (ids ? 0 : size_t(r0) * row_stride);
    const int32_t* ip = ids ? ids + r0 : nullptr;
    if (half) {
      __half* o = static_cast<__half*>(out) + r0 * out_stride;
      if (nat) dequant_rows_kernel<T, kNat, true><<<grid, kThreads, 0, s>>>(sp, row_stride, k, ip, o, out_stride);
      else dequant_rows_kernel<T, kMinA, true><<<grid, kThreads, 0, s>>>(sp, row_stride, k, ip, o, out_stride);
    } else {
      float* o = static_cast<float*>(out) + r0 * out_stride;
      dequant_rows_kernel<T, kMinA, false><<<grid, kThreads, 0, s>>>(sp, row_stride, k, ip, o, out_stride);
    }
  }
}

}  // namespace

void dequant_rows(GgmlType t, const void* src, size_t row_stride, int64_t k, const int32_t* ids, int64_t n_rows,
                  void* out, bool half, int64_t out_stride, cudaStream_t s) {
#define KILN_DQ_CASE(T) \
  case GgmlType::T: return launch<GgmlType::T>(src, row_stride, k, ids, n_rows, out, half, out_stride, s);
  switch (t) {
    KILN_DQ_CASE(F32) KILN_DQ_CASE(F16) KILN_DQ_CASE(BF16) KILN_DQ_CASE(Q4_0) KILN_DQ_CASE(Q4_1)
    KILN_DQ_CASE(Q5_0) KILN_DQ_CASE(Q5_1) KILN_DQ_CASE(Q8_0) KILN_DQ_CASE(Q2_K) KILN_DQ_CASE(Q3_K)
    KILN_DQ_CASE(Q4_K) KILN_DQ_CASE(Q5_K) KILN_DQ_CASE(Q6_K) KILN_DQ_CASE(IQ4_NL) KILN_DQ_CASE(IQ4_XS)
    default: break;
  }
#undef KILN_DQ_CASE
}

}  // namespace kiln::cuda::detail
