// kernels/cuda/matvec_q8_x.cu — the x side of the int8 mat-vec: quantize_x (F32 x columns -> int8
//   per 32 values with an F32 scale and half sums, in the weight type's x order), produce_x (the op
//   that makes x — add_rms_norm or SwiGLU — and the quantization in one kernel), the workspace
//   layout, which types have the int8 kernel, and the weights' 2-D tensor maps for the bulk kernel's
//   copies (mv_tensor_map: encoded once per weight and shape, kept in a host-side cache under a mutex).
// Owns: the x quantization (matmul_internal.h states it). produce_x: SwiGLU over blocks of 256
//   threads (one element each); add_rms_norm over a cluster of 8 blocks of 128 threads on sm_90+
//   (warp sums exchanged through distributed shared memory), else a block of 1024 threads per
//   column; either way thread i of the 1024 holds elements i + 1024 j in registers (row_common.cuh's
//   row_load order, so each warp holds whole units of 32) and the sums are the row kernels' of
//   fused.cu / elementwise.cu with a 1024-thread block: x is the unfused op's, bit for bit, and the
//   int8 bytes are quantize_x's. KILN_CUDA_PRODUCE_WIDE=0: one 1024-thread block per column for both
//   (comparisons). Must not: allocate device memory or synchronize (the tensor-map cache grows on the
//   host by one entry per distinct weight).
// Threading: the launchers only enqueue on their stream; mv_tensor_map may be called from any thread.
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's types (the function comes from the runtime)
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/dequant_q8.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/row_common.cuh"

namespace kiln::cuda::detail {
namespace {

// One warp per 32 values: lane p takes x order position p.
__global__ void quantize_x_kernel(const float* x, int64_t s_outer, int64_t s_inner, int64_t nx, int64_t k,
                                  int64_t total, int layout, int8_t* xq, Q8Meta* meta) {
  q8::pdl_launch_dependents();  // the mat-vec kernel may start its weight prefetch
  q8::pdl_wait();               // x (and the workspace's last reader) are done
  const int lane = threadIdx.x & 31;
  const int64_t nblk = k / 32;
  const int e = layout == q8::kXPairs ? (lane >> 1) + 16 * (lane & 1) : lane;  // element of position lane
  for (int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; b < total;
       b += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t col = b / nblk, blk = b - col * nblk;
    const float* src = x + (col / nx) * s_outer + (col % nx) * s_inner + blk * 32;
    const float v = src[e];
    const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
    int q = 0;
    if (amax > 0.f) q = max(-127, min(127, __float2int_rn(v * (127.f / amax))));
    xq[b * 32 + lane] = int8_t(q);
    const int s0 = __reduce_add_sync(0xffffffffu, lane < 16 ? q : 0);
    const int s1 = __reduce_add_sync(0xffffffffu, lane < 16 ? 0 : q);
    if (lane == 0) meta[b] = {__float_as_uint(amax / 127.f), (uint32_t(s0) & 0xFFFFu) | (uint32_t(s1) << 16)};
  }
}

// Position of element e of a unit in x order `layout` (inverse of quantize_x's element of position).
__device__ __forceinline__ int x_pos(int layout, int e) {
  return layout == q8::kXPairs ? (e < 16 ? 2 * e : 2 * (e - 16) + 1) : e;
}

// Quantizes one unit (the warp's 32 values, lane l holding element l) as quantize_x does into every
// x order of `mask`: unit index b of the workspace.
__device__ __forceinline__ void quantize_unit(float v, int64_t b, int lane, int mask, int8_t* xq0, Q8Meta* meta0,
                                              int8_t* xq1, Q8Meta* meta1) {
  const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
  int q = 0;
  if (amax > 0.f) q = max(-127, min(127, __float2int_rn(v * (127.f / amax))));
#pragma unroll
  for (int layout = 0; layout < 2; ++layout) {
    if (!(mask & (1 << layout))) continue;
    const int pos = x_pos(layout, lane);
    (layout ? xq1 : xq0)[b * 32 + pos] = int8_t(q);
    const bool lo = pos < 16;
    const int s0 = __reduce_add_sync(0xffffffffu, lo ? q : 0), s1 = __reduce_add_sync(0xffffffffu, lo ? 0 : q);
    if (lane == 0) (layout ? meta1 : meta0)[b] = {__float_as_uint(amax / 127.f), (uint32_t(s0) & 0xFFFFu) | (uint32_t(s1) << 16)};
  }
}

// Where a producer writes: x (column c at x + c * x_stride) and, for each x order in mask, its int8
// bytes and unit metadata.
struct XOut {
  float* x;
  int64_t x_stride;
  int mask;
  int8_t* xq0;
  Q8Meta* meta0;
  int8_t* xq1;
  Q8Meta* meta1;
};

// add_rms_norm's first half for thread tid of the 1024-thread layout: v = x + t (stored back into the
// residual row), w's values in wv; returns the thread's sum of squares.
template <int NV>
__device__ __forceinline__ float add_residual(const XProducer& p, int col, int64_t k, int tid, float (&v)[NV],
                                             float (&wv)[NV]) {
  float* xr = row_mut(p.x, col);
  float tv[NV];
  row_load(xr, k, tid, kRowThreads, v);
  row_load(row_mut(p.t, col), k, tid, kRowThreads, tv);
  if (p.w) row_load(p.w, k, tid, kRowThreads, wv);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) v[j] += tv[j], ss = fmaf(v[j], v[j], ss);
  row_store(xr, k, tid, kRowThreads, v);
  return ss;
}
// The normalized x (v * sc, times w when there is one) of thread tid of the 1024-thread layout, stored
// and quantized by units (each warp holds whole units: k % 32 == 0).
template <int NV>
__device__ __forceinline__ void store_normed(float (&v)[NV], const float (&wv)[NV], const float* w, float sc, int col,
                                             int64_t k, int tid, const XOut& o) {
#pragma unroll
  for (int j = 0; j < NV; ++j) v[j] = w ? v[j] * sc * wv[j] : v[j] * sc;
  row_store(o.x + int64_t(col) * o.x_stride, k, tid, kRowThreads, v);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t e0 = int64_t(j) * kRowThreads + (tid & ~31);  // the warp's unit (warp-uniform)
    if (e0 < k) quantize_unit(v[j], int64_t(col) * (k / 32) + e0 / 32, tid & 31, o.mask, o.xq0, o.meta0, o.xq1, o.meta1);
  }
}

template <int NV, XProducer::Kind KIND>
__global__ void __launch_bounds__(kRowThreads) produce_x_kernel(const XProducer p, const XOut o, int64_t k) {
  q8::pdl_launch_dependents();  // the mat-vec kernel may start its weight prefetch
  q8::pdl_wait();               // the inputs (and the workspace's last reader) are done
  __shared__ float red[32];
  const int col = blockIdx.x, tid = threadIdx.x;
  float v[NV], wv[NV];
  if constexpr (KIND == XProducer::Kind::AddRmsNorm) {
    const float ss = block_sum(add_residual(p, col, k, tid, v, wv), red);
    store_normed(v, wv, p.w, 1.f / sqrtf(ss * (1.0f / float(k)) + p.eps), col, k, tid, o);
  } else {
    row_load(o.x + int64_t(col) * o.x_stride, k, tid, kRowThreads, v);
    row_load(row_mut(p.b, col), k, tid, kRowThreads, wv);
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] = siluf_(v[j]) * wv[j];
    store_normed(v, wv, nullptr, 1.f, col, k, tid, o);
  }
}

// SwiGLU over many blocks (no row reduction): thread i of block b takes element b * kWideThreads + i of
// column blockIdx.y, so each warp holds one unit as in produce_x_kernel (the same bytes).
constexpr int kWideThreads = 256;
__global__ void __launch_bounds__(kWideThreads) swiglu_x_kernel(const XProducer p, const XOut o, int64_t k) {
  q8::pdl_launch_dependents();
  q8::pdl_wait();
  const int col = blockIdx.y, lane = threadIdx.x & 31;
  const int64_t e = int64_t(blockIdx.x) * kWideThreads + threadIdx.x;
  if (e - lane >= k) return;  // whole warps (k % 32 == 0)
  float* out = o.x + int64_t(col) * o.x_stride;
  const float v = siluf_(out[e]) * row_mut(p.b, col)[e];
  out[e] = v;
  quantize_unit(v, int64_t(col) * (k / 32) + (e - lane) / 32, lane, o.mask, o.xq0, o.meta0, o.xq1, o.meta1);
}

// add_rms_norm over a cluster of kClusterCtas blocks of kRowThreads / kClusterCtas threads (sm_90+):
// thread i of cluster rank r is thread r * (kRowThreads / kClusterCtas) + i of produce_x_kernel's block,
// with the same elements; the warps' sums of squares go to every rank's shared memory in the block's
// order, so the norm (and x, and its bytes) are produce_x_kernel's, bit for bit. Each thread reads and
// writes only its own elements of the residual row.
constexpr int kClusterCtas = 8, kClusterThreads = kRowThreads / kClusterCtas;
template <int NV>
__global__ void __launch_bounds__(kClusterThreads) add_rms_x_cluster_kernel(const XProducer p, const XOut o, int64_t k) {
#if __CUDA_ARCH__ >= 900
  q8::pdl_launch_dependents();
  q8::pdl_wait();
  namespace cg = cooperative_groups;
  __shared__ float red[32];
  const cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank()), col = blockIdx.y, lane = threadIdx.x & 31;
  const int tid = rank * kClusterThreads + int(threadIdx.x);  // the thread of the 1024-thread block
  float v[NV], wv[NV];
  float ss = warp_sum(add_residual(p, col, k, tid, v, wv));
  if (lane == 0)
    for (int r = 0; r < kClusterCtas; ++r) *cl.map_shared_rank(&red[tid >> 5], r) = ss;
  cl.sync();  // every rank's warp sums have landed (and no rank exits while others still write to it)
  ss = warp_sum(red[lane]);
  store_normed(v, wv, p.w, 1.f / sqrtf(ss * (1.0f / float(k)) + p.eps), col, k, tid, o);
#endif
}

using ProduceKernel = void (*)(const XProducer, const XOut, int64_t);
template <XProducer::Kind KIND>
ProduceKernel block_kernel(int64_t nv) {
  return nv <= 1 ? produce_x_kernel<1, KIND> : nv <= 2 ? produce_x_kernel<2, KIND> : nv <= 4 ? produce_x_kernel<4, KIND>
       : nv <= 8 ? produce_x_kernel<8, KIND> : produce_x_kernel<16, KIND>;
}
ProduceKernel cluster_kernel(int64_t nv) {
  return nv <= 1 ? add_rms_x_cluster_kernel<1> : nv <= 2 ? add_rms_x_cluster_kernel<2> : nv <= 4 ? add_rms_x_cluster_kernel<4>
       : nv <= 8 ? add_rms_x_cluster_kernel<8> : add_rms_x_cluster_kernel<16>;
}
// The wide forms (swiglu_x_kernel; add_rms_x_cluster_kernel on sm_90+) unless KILN_CUDA_PRODUCE_WIDE=0
// (comparisons): one block of 1024 threads per column then.
bool wide_on() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_PRODUCE_WIDE");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

}  // namespace

void produce_x(const XProducer& pre, float* x, int64_t x_stride, int64_t k, int64_t m, int mask, void* ws, int sm,
               bool pdl, cudaStream_t s) {
  KILN_CHECK(produce_ok(k, m), "produce_x: k {} m {} (k a multiple of 32 up to {}, 1 <= m <= 8)", k, m, kProduceMaxK);
  const size_t bytes = q8_x_bytes(k, m);
  auto* b0 = static_cast<uint8_t*>(ws);
  auto* b1 = b0 + bytes;
  auto* xq0 = reinterpret_cast<int8_t*>(b0);
  auto* xq1 = reinterpret_cast<int8_t*>(b1);
  auto* m0 = reinterpret_cast<Q8Meta*>(b0 + q8_x_meta_offset(k, m));
  auto* m1 = reinterpret_cast<Q8Meta*>(b1 + q8_x_meta_offset(k, m));
  const int64_t nv = (k + kRowThreads - 1) / kRowThreads;
  const bool add = pre.kind == XProducer::Kind::AddRmsNorm, wide = wide_on();
  cudaLaunchConfig_t cfg = {};
  cfg.stream = s;
  cudaLaunchAttribute at[2];
  int na = 0;
  if (pdl) {
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na++].val.programmaticStreamSerializationAllowed = 1;
  }
  ProduceKernel kern;
  if (wide && !add) {
    kern = swiglu_x_kernel;
    cfg.gridDim = dim3(unsigned((k + kWideThreads - 1) / kWideThreads), unsigned(m)), cfg.blockDim = dim3(kWideThreads);
  } else if (wide && sm >= 90) {
    kern = cluster_kernel(nv);
    cfg.gridDim = dim3(kClusterCtas, unsigned(m)), cfg.blockDim = dim3(kClusterThreads);
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na++].val.clusterDim = {unsigned(kClusterCtas), 1, 1};
  } else {
    kern = add ? block_kernel<XProducer::Kind::AddRmsNorm>(nv) : block_kernel<XProducer::Kind::SwiGlu>(nv);
    cfg.gridDim = dim3(unsigned(m)), cfg.blockDim = dim3(kRowThreads);
  }
  cfg.attrs = at, cfg.numAttrs = unsigned(na);
  cudaLaunchKernelEx(&cfg, kern, pre, XOut{x, x_stride, mask, xq0, m0, xq1, m1}, k);
}

void quantize_x(const float* x, int64_t s_outer, int64_t s_inner, int64_t nx, int64_t k, int64_t ncols, int layout,
                void* ws, bool pdl, cudaStream_t s) {
  const int64_t total = ncols * (k / 32);
  if (total <= 0) return;
  auto* xq = static_cast<int8_t*>(ws);
  auto* meta = reinterpret_cast<Q8Meta*>(static_cast<uint8_t*>(ws) + q8_x_meta_offset(k, ncols));
  const int64_t blocks = std::min<int64_t>((total + 7) / 8, 8192);
  q8::launch(pdl, dim3(unsigned(blocks)), dim3(256), s, quantize_x_kernel, x, s_outer, s_inner, nx, k, total, layout,
             xq, meta);
}

const void* mv_tensor_map(const void* base, uint64_t row_elems, uint64_t rows, uint64_t stride_bytes, uint32_t box_cols,
                          uint32_t box_rows) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                              const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<Encode>(fn);
  }();
  if (encode == nullptr) return nullptr;
  using Key = std::tuple<uintptr_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t>;
  struct Entry {
    CUtensorMap map;
    bool ok;
  };
  static std::mutex mu;
  static std::map<Key, Entry> cache;  // never erased: node addresses stay valid
  const std::lock_guard<std::mutex> lock(mu);
  const Key key{uintptr_t(base), row_elems, rows, stride_bytes, box_cols, box_rows};
  auto it = cache.find(key);
  if (it == cache.end()) {
    Entry e{};
    const cuuint64_t dims[2] = {row_elems, rows}, strides[1] = {stride_bytes};
    const cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
    e.ok = encode(&e.map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, const_cast<void*>(base), dims, strides, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    it = cache.emplace(key, e).first;
  }
  return it->second.ok ? &it->second.map : nullptr;
}

int matvec_q8_x_layout(GgmlType t) {
  return t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS ? q8::kXPairs : q8::kXNatural;
}

}  // namespace kiln::cuda::detail
