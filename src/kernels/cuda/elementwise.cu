// kernels/cuda/elementwise.cu — the CUDA elementwise and row ops behind cuda_ops.h: unary,
//   binary (same shape / row broadcast / scalar per row), scale, rms_norm, l2_norm, rope, softmax,
//   hadamard, topk_route, the strided row copy used by Stream::copy, and code_sm.
// Owns: the GPU arithmetic of these ops (semantics: kernels/ops.h). Row reductions sum in F32: each
//   thread over a strided slice of the row, then a fixed warp/block tree (deterministic for a
//   given shape; not the CPU's order). RoPE angles are formed in double once per (token, pair).
// Must not: allocate, synchronize, or read device memory on the host. Launchers only enqueue on
//   L.stream (graph-capturable); argument errors are KILN_CHECK failures before anything is enqueued.
// Threading: launchers are stateless and thread-safe.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/row_common.cuh"

namespace kiln::cuda {
namespace {



// Rows that are one contiguous block become a single row (fewer index computations).
bool contiguous(const Rows& r) { return r.s1 == r.ne0 && (r.n2 == 1 || r.s2 == r.ne0 * r.n1); }
Rows flat(Rows r) {
  r.ne0 *= r.n1 * r.n2;
  r.n1 = r.n2 = 1;
  r.s1 = r.s2 = r.ne0;
  return r;
}

// Elementwise grid: x over ne0 (grid-stride), y over rows (grid-stride).
dim3 ew_grid(const Rows& r) {
  const int64_t bx = (r.ne0 + 255) / 256;
  return dim3(unsigned(bx < (1 << 20) ? bx : (1 << 20)), unsigned(n_rows(r) < kMaxGridY ? n_rows(r) : kMaxGridY));
}

// ---- unary / binary / scale ------------------------------------------------------------------
template <Unary OP>
__global__ void unary_kernel(Rows x, Rows y) {
  pdl::begin();  // pdl.cuh: nothing global before this
  const int64_t nr = x.n1 * x.n2;
  for (int64_t r = blockIdx.y; r < nr; r += gridDim.y) {
    const float* xr = row_ptr(x, r);
    float* yr = row_mut(y, r);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < x.ne0; i += int64_t(gridDim.x) * blockDim.x) {
      const float v = xr[i];
      if constexpr (OP == Unary::Silu) yr[i] = siluf_(v);
      else if constexpr (OP == Unary::Sigmoid) yr[i] = sigmoidf_(v);
      else if constexpr (OP == Unary::Softplus) yr[i] = softplusf_(v);
      else if constexpr (OP == Unary::Gelu) yr[i] = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
      else yr[i] = 0.5f * v * (1.f + erff(v * 0.70710678f));
    }
  }
}

template <Binary OP>
__device__ __forceinline__ float bin_op(float a, float b) {
  if constexpr (OP == Binary::Add) return a + b;
  else if constexpr (OP == Binary::Mul) return a * b;
  else if constexpr (OP == Binary::SwiGlu) return siluf_(a) * b;
  else return a * sigmoidf_(b);
}

// MODE 0: b same shape; 1: b one row broadcast; 2: b one scalar per row.
template <Binary OP, int MODE>
__global__ void binary_kernel(Rows a, Rows b, Rows y) {
  pdl::begin();  // pdl.cuh: nothing global before this
  const int64_t nr = a.n1 * a.n2;
  for (int64_t r = blockIdx.y; r < nr; r += gridDim.y) {
    const float* ar = row_ptr(a, r);
    const float* br = MODE == 1 ? b.p : row_ptr(b, r);
    float* yr = row_mut(y, r);
    const float bs = MODE == 2 ? br[0] : 0.f;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.ne0; i += int64_t(gridDim.x) * blockDim.x)
      yr[i] = bin_op<OP>(ar[i], MODE == 2 ? bs : br[i]);
  }
}

__global__ void scale_kernel(Rows x, float s, Rows y) {
  pdl::begin();  // pdl.cuh: nothing global before this
  const int64_t nr = x.n1 * x.n2;
  for (int64_t r = blockIdx.y; r < nr; r += gridDim.y) {
    const float* xr = row_ptr(x, r);
    float* yr = row_mut(y, r);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < x.ne0; i += int64_t(gridDim.x) * blockDim.x)
      yr[i] = xr[i] * s;
  }
}

template <Binary OP>
void launch_binary(const Launch& L, Rows a, Rows b, int mode, Rows y) {
  const dim3 g = ew_grid(a);
  if (mode == 0) pdl::launch(L, g, dim3(256), 0, binary_kernel<OP, 0>, a, b, y);
  else if (mode == 1) pdl::launch(L, g, dim3(256), 0, binary_kernel<OP, 1>, a, b, y);
  else pdl::launch(L, g, dim3(256), 0, binary_kernel<OP, 2>, a, b, y);
}

// ---- row reductions: a warp per row (ne0 <= 1024) or a block per row ----------------------------
// y = x * (1/sqrt(sum_sq * inv_n + eps)) * w  (rms_norm: inv_n = 1/ne0; l2_norm: inv_n = 1, no w).
template <int NV, bool WARP>
__global__ void __launch_bounds__(kRowThreads) norm_kernel(Rows x, const float* __restrict__ w, Rows y, float eps, float inv_n) {
  pdl::begin();  // pdl.cuh: nothing global before this
  __shared__ float red[32];
  const int64_t nr = x.n1 * x.n2;
  const int64_t r = WARP ? int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5) : int64_t(blockIdx.x);
  if (r >= nr) return;  // whole warps (WARP) or whole blocks exit together
  const float* xr = row_ptr(x, r);
  float* yr = row_mut(y, r);
  const int64_t i0 = WARP ? (threadIdx.x & 31) : threadIdx.x, step = WARP ? 32 : blockDim.x;
  if constexpr (NV > 0) {
    float v[NV], wv[NV];
    row_load(xr, x.ne0, i0, step, v);
    if (w) row_load(w, x.ne0, i0, step, wv);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) ss = fmaf(v[j], v[j], ss);
    ss = WARP ? warp_sum(ss) : block_sum(ss, red);
    const float sc = 1.f / sqrtf(ss * inv_n + eps);
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] = w ? v[j] * sc * wv[j] : v[j] * sc;
    row_store(yr, x.ne0, i0, step, v);
  } else {
    const float ss = row_sum_sq<WARP>(xr, x.ne0, red);
    const float sc = 1.f / sqrtf(ss * inv_n + eps);
    for (int64_t i = i0; i < x.ne0; i += step) yr[i] = w ? xr[i] * sc * w[i] : xr[i] * sc;
  }
}

template <bool WARP>
__global__ void softmax_kernel(Rows x, float scale) {
  __shared__ float red[32];
  const int64_t nr = x.n1 * x.n2;
  const int64_t r = WARP ? int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5) : int64_t(blockIdx.x);
  if (r >= nr) return;
  float* xr = row_mut(x, r);
  const int64_t i0 = WARP ? (threadIdx.x & 31) : threadIdx.x, step = WARP ? 32 : blockDim.x;
  float mx = -INFINITY;
  for (int64_t i = i0; i < x.ne0; i += step) mx = fmaxf(mx, scale * xr[i]);
  mx = WARP ? warp_max(mx) : block_max(mx, red);
  float s = 0.f;
  for (int64_t i = i0; i < x.ne0; i += step) s += expf(scale * xr[i] - mx);
  s = WARP ? warp_sum(s) : block_sum(s, red);
  const float inv = 1.f / s;
  for (int64_t i = i0; i < x.ne0; i += step) xr[i] = expf(scale * xr[i] - mx) * inv;
}

// ---- rope ------------------------------------------------------------------------------------
// One block per token: cos/sin of the n_rot/2 angles in shared memory (formed in double), then
// every (head, pair) of the token.
__global__ void rope_kernel(Rows x, const int32_t* __restrict__ pos, int n_rot, bool neox, float freq_base,
                            float freq_scale) {
  pdl::begin();  // pdl.cuh: nothing global before this
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int half = n_rot / 2;
  float* sn = cs + half;
  const int64_t t = blockIdx.x;
  const double p = double(pos[t]) * double(freq_scale);
  const double lb = log2(double(freq_base));
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double theta = p * exp2(-2.0 * double(i) / double(n_rot) * lb);
    double s, c;
    sincos(theta, &s, &c);
    cs[i] = float(c);
    sn[i] = float(s);
  }
  __syncthreads();
  const int64_t off = neox ? half : 1, step = neox ? 1 : 2;
  const int64_t n = x.n1 * half;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t h = e / half;
    const int i = int(e - h * half);
    float* r = x.p + h * x.s1 + t * x.s2 + i * step;
    const float x0 = r[0], x1 = r[off];
    r[0] = fmaf(x0, cs[i], -x1 * sn[i]);
    r[off] = fmaf(x0, sn[i], x1 * cs[i]);
  }
}

// rope_multi: the pair -> (stream, exponent) table from kernels::rope_multi_pair, passed by value.
struct RopeMultiTab {
  int16_t stream[256], expo[256];
};
__global__ void rope_multi_kernel(Rows x, const int32_t* __restrict__ pos, int n_rot, double nd, float freq_base,
                                  float freq_scale, RopeMultiTab tab) {
  pdl::begin();  // pdl.cuh: nothing global before this
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int half = n_rot / 2;
  float* sn = cs + half;
  const int64_t t = blockIdx.x;
  const double lb = log2(double(freq_base));
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double p = double(pos[int64_t(tab.stream[i]) * x.n2 + t]) * double(freq_scale);
    const double theta = p * exp2(-2.0 * double(tab.expo[i]) / nd * lb);
    double s, c;
    sincos(theta, &s, &c);
    cs[i] = float(c);
    sn[i] = float(s);
  }
  __syncthreads();
  const int64_t n = x.n1 * half;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t h = e / half;
    const int i = int(e - h * half);
    float* r = x.p + h * x.s1 + t * x.s2 + i;
    const float x0 = r[0], x1 = r[half];
    r[0] = fmaf(x0, cs[i], -x1 * sn[i]);
    r[half] = fmaf(x0, sn[i], x1 * cs[i]);
  }
}

// ---- hadamard --------------------------------------------------------------------------------
// One block per n-chunk: load scaled by 1/sqrt(n) into shared memory, butterflies with spans 1, 2,
// 4, ... (the CPU's order), store.
__global__ void hadamard_kernel(Rows x, int64_t n, int64_t chunks_per_row, float sc) {
  extern __shared__ float h[];
  const int64_t c = blockIdx.x;
  const int64_t r = c / chunks_per_row;
  float* p = row_mut(x, r) + (c - r * chunks_per_row) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) h[i] = p[i] * sc;
  for (int64_t len = 1; len < n; len <<= 1) {
    __syncthreads();
    for (int64_t q = threadIdx.x; q < n / 2; q += blockDim.x) {
      const int64_t j = (q / len) * 2 * len + (q % len);
      const float u = h[j], v = h[j + len];
      h[j] = u + v;
      h[j + len] = u - v;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = h[i];
}

// ---- topk_route ------------------------------------------------------------------------------
// One warp per token. Softmax over the experts (max, sum of exp), then k passes: pass i takes the
// largest logit strictly after pass i-1's choice in the order (logit descending, id ascending), so
// ties go to the lower id and nothing needs marking.
__global__ void topk_kernel(const float* __restrict__ logits, int64_t n_expert, int64_t n_tok, int k, bool renorm,
                            float w_scale, int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (t >= n_tok) return;
  const int lane = threadIdx.x & 31;
  const float* l = logits + t * n_expert;
  float mx = -INFINITY;
  for (int64_t e = lane; e < n_expert; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t e = lane; e < n_expert; e += 32) sum += expf(l[e] - mx);
  sum = warp_sum(sum);
  float prev_v = INFINITY;
  int64_t prev_id = -1;
  float ksum = 0.f, my_w = 0.f;
  int32_t my_id = 0;
  for (int i = 0; i < k; ++i) {
    float bv = -INFINITY;
    int64_t bid = INT64_MAX;
    for (int64_t e = lane; e < n_expert; e += 32) {
      const float v = l[e];
      const bool after = v < prev_v || (v == prev_v && e > prev_id);
      if (after && (v > bv || (v == bv && e < bid))) {
        bv = v;
        bid = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int64_t oid = __shfl_xor_sync(0xffffffffu, bid, o);
      if (ov > bv || (ov == bv && oid < bid)) {
        bv = ov;
        bid = oid;
      }
    }
    if (bid == INT64_MAX) bid = prev_id + 1;  // only NaNs left: keep ids valid
    const float w = expf(bv - mx) / sum;
    ksum += w;
    if (lane == i % 32) {  // lane i%32 owns slot i (k <= 32 checked by the launcher)
      my_w = w;
      my_id = int32_t(bid);
    }
    prev_v = bv;
    prev_id = bid;
  }
  if (lane < k) {
    ids[t * k + lane] = my_id;
    weights[t * k + lane] = (renorm ? my_w / ksum : my_w) * w_scale;
  }
}

// k = 1 over long rows (a drafter's greedy token over the vocabulary): a block of kTop1Threads per
// token in one pass — each thread keeps its running (max, sum of exp) and its best (value, id), the
// block merges them — instead of one warp re-reading the row three times.
constexpr int kTop1Threads = 1024;
constexpr int64_t kTop1MinExperts = 4096;
__global__ void __launch_bounds__(kTop1Threads) top1_kernel(const float* __restrict__ logits, int64_t n_expert,
                                                            bool renorm, float w_scale, int32_t* __restrict__ ids,
                                                            float* __restrict__ weights) {
  __shared__ float sm_m[kTop1Threads / 32], sm_s[kTop1Threads / 32], sm_bv[kTop1Threads / 32];
  __shared__ int64_t sm_bi[kTop1Threads / 32];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* l = logits + t * n_expert;
  float m = -INFINITY, sum = 0.f, bv = -INFINITY;
  int64_t bid = INT64_MAX;
  // (m, sum) absorbs x: the running max and the sum of exp relative to it.
  auto absorb = [](float& m, float& sum, float om, float os) {
    if (om == -INFINITY) return;
    if (om > m) {
      sum = sum * expf(m - om) + os;
      m = om;
    } else {
      sum += os * expf(om - m);
    }
  };
  auto better = [](float v, int64_t e, float bv, int64_t bid) { return v > bv || (v == bv && e < bid); };
  for (int64_t e = tid; e < n_expert; e += kTop1Threads) {
    const float v = l[e];
    if (v > m) {
      sum = sum * expf(m - v) + 1.f;
      m = v;
    } else {
      sum += expf(v - m);
    }
    if (better(v, e, bv, bid)) bv = v, bid = e;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bid, o);
    absorb(m, sum, om, os);
    if (better(ov, oi, bv, bid)) bv = ov, bid = oi;
  }
  if (lane == 0) sm_m[warp] = m, sm_s[warp] = sum, sm_bv[warp] = bv, sm_bi[warp] = bid;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kTop1Threads / 32; ++w) {
      absorb(m, sum, sm_m[w], sm_s[w]);
      if (better(sm_bv[w], sm_bi[w], bv, bid)) bv = sm_bv[w], bid = sm_bi[w];
    }
    if (bid == INT64_MAX) bid = 0;  // only NaNs: keep the id valid
    const float w = expf(bv - m) / sum;
    ids[t] = int32_t(bid);
    weights[t] = (renorm ? 1.f : w) * w_scale;
  }
}

// ---- strided row copy ------------------------------------------------------------------------
template <class U>
__global__ void copy_rows_kernel(char* dst, size_t d0, size_t d1, size_t d2, const char* src, size_t s0, size_t s1,
                                 size_t s2, int64_t units, int64_t ne0, int64_t ne1, int64_t nr) {
  for (int64_t r = blockIdx.y; r < nr; r += gridDim.y) {
    const int64_t i0 = r % ne0, rest = r / ne0, i1 = rest % ne1, i2 = rest / ne1;
    U* d = reinterpret_cast<U*>(dst + i0 * d0 + i1 * d1 + i2 * d2);
    const U* s = reinterpret_cast<const U*>(src + i0 * s0 + i1 * s1 + i2 * s2);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < units; i += int64_t(gridDim.x) * blockDim.x)
      d[i] = s[i];
  }
}

}  // namespace

void unary(const Launch& L, Unary op, Rows x, Rows y) {
  check_rows(x, "unary x");
  check_rows(y, "unary y");
  check_same(x, y, "unary");
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  if (contiguous(x) && contiguous(y)) x = flat(x), y = flat(y);
  const dim3 g = ew_grid(x);
  switch (op) {
    case Unary::Silu: pdl::launch(L, g, dim3(256), 0, unary_kernel<Unary::Silu>, x, y); break;
    case Unary::Sigmoid: pdl::launch(L, g, dim3(256), 0, unary_kernel<Unary::Sigmoid>, x, y); break;
    case Unary::Softplus: pdl::launch(L, g, dim3(256), 0, unary_kernel<Unary::Softplus>, x, y); break;
    case Unary::Gelu: pdl::launch(L, g, dim3(256), 0, unary_kernel<Unary::Gelu>, x, y); break;
    case Unary::GeluErf: pdl::launch(L, g, dim3(256), 0, unary_kernel<Unary::GeluErf>, x, y); break;
  }
  KILN_CUDA_LAUNCHED("unary");
}

void binary(const Launch& L, Binary op, Rows a, Rows b, int b_mode, Rows y) {
  check_rows(a, "binary a");
  check_rows(b, "binary b");
  check_rows(y, "binary y");
  check_same(a, y, "binary a/y");
  KILN_CHECK(b_mode >= 0 && b_mode <= 2, "binary: b_mode {} (0 same shape, 1 row, 2 scalar per row)", b_mode);
  if (b_mode == 0) check_same(a, b, "binary a/b");
  if (b_mode == 1) KILN_CHECK(b.ne0 == a.ne0, "binary: broadcast row of {} for rows of {}", b.ne0, a.ne0);
  if (b_mode == 2)
    KILN_CHECK(b.ne0 == 1 && b.n1 == a.n1 && b.n2 == a.n2, "binary: per-row scalars [{} {} {}] for rows [{} {}]", b.ne0,
               b.n1, b.n2, a.n1, a.n2);
  if (a.ne0 == 0 || n_rows(a) == 0) return;
  if (b_mode == 0 && contiguous(a) && contiguous(b) && contiguous(y)) a = flat(a), b = flat(b), y = flat(y);
  switch (op) {
    case Binary::Add: launch_binary<Binary::Add>(L, a, b, b_mode, y); break;
    case Binary::Mul: launch_binary<Binary::Mul>(L, a, b, b_mode, y); break;
    case Binary::SwiGlu: launch_binary<Binary::SwiGlu>(L, a, b, b_mode, y); break;
    case Binary::SigmoidMul: launch_binary<Binary::SigmoidMul>(L, a, b, b_mode, y); break;
  }
  KILN_CUDA_LAUNCHED("binary");
}

void scale(const Launch& L, Rows x, float s, Rows y) {
  check_rows(x, "scale x");
  check_rows(y, "scale y");
  check_same(x, y, "scale");
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  if (contiguous(x) && contiguous(y)) x = flat(x), y = flat(y);
  pdl::launch(L, ew_grid(x), dim3(256), 0, scale_kernel, x, s, y);
  KILN_CUDA_LAUNCHED("scale");
}

void rms_norm(const Launch& L, Rows x, const float* w, Rows y, float eps) {
  check_rows(x, "rms_norm x");
  check_rows(y, "rms_norm y");
  check_same(x, y, "rms_norm");
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  KILN_LAUNCH_ROWS(L, x.ne0, n_rows(x), norm_kernel, x, w, y, eps, 1.0f / float(x.ne0));
  KILN_CUDA_LAUNCHED("rms_norm");
}

void l2_norm(const Launch& L, Rows x, Rows y, float eps) {
  check_rows(x, "l2_norm x");
  check_rows(y, "l2_norm y");
  check_same(x, y, "l2_norm");
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  KILN_LAUNCH_ROWS(L, x.ne0, n_rows(x), norm_kernel, x, static_cast<const float*>(nullptr), y, eps, 1.0f);
  KILN_CUDA_LAUNCHED("l2_norm");
}

void rope_multi(const Launch& L, Rows x, const int32_t* pos, const kernels::RopeParams& p) {
  check_rows(x, "rope_multi x");
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0 && p.n_rot <= 512, "rope_multi: n_rot {} vs head_dim {}",
             p.n_rot, x.ne0);
  KILN_CHECK(p.multi != kernels::RopeParams::Multi::None, "rope_multi: RopeParams::multi is None");
  KILN_CHECK(pos != nullptr, "rope_multi: pos is null");
  if (n_rows(x) == 0) return;
  RopeMultiTab tab{};
  for (int i = 0; i < p.n_rot / 2; ++i) {
    int s = 0, e = 0;
    kernels::rope_multi_pair(p, i, s, e);
    tab.stream[i] = int16_t(s);
    tab.expo[i] = int16_t(e);
  }
  const double nd = p.multi == kernels::RopeParams::Multi::Vision ? p.n_rot / 2 : p.n_rot;
  const int64_t work = x.n1 * (p.n_rot / 2);
  const int threads = work >= 256 ? 256 : work > 64 ? 128 : 64;
  pdl::launch(L, dim3(unsigned(x.n2)), dim3(threads), size_t(p.n_rot) * sizeof(float), rope_multi_kernel, x, pos, p.n_rot,
              nd, p.freq_base, p.freq_scale, tab);
  KILN_CUDA_LAUNCHED("rope_multi");
}

void rope(const Launch& L, Rows x, const int32_t* pos, const kernels::RopeParams& p) {
  check_rows(x, "rope x");
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0, "rope: n_rot {} vs head_dim {}", p.n_rot, x.ne0);
  KILN_CHECK(size_t(p.n_rot) * 4 <= 48 * 1024, "rope: n_rot {} too large", p.n_rot);
  KILN_CHECK(pos != nullptr, "rope: pos is null");
  if (n_rows(x) == 0) return;
  const int64_t work = x.n1 * (p.n_rot / 2);
  const int threads = work >= 256 ? 256 : work > 64 ? 128 : 64;
  pdl::launch(L, dim3(unsigned(x.n2)), dim3(threads), size_t(p.n_rot) * sizeof(float), rope_kernel, x, pos, p.n_rot,
              p.neox, p.freq_base, p.freq_scale);
  KILN_CUDA_LAUNCHED("rope");
}

void softmax(const Launch& L, Rows x, float scale) {
  check_rows(x, "softmax x");
  if (x.ne0 == 0 || n_rows(x) == 0) return;
  launch_rows(L, x.ne0, n_rows(x), softmax_kernel<true>, softmax_kernel<false>, x, scale);
  KILN_CUDA_LAUNCHED("softmax");
}

void hadamard(const Launch& L, Rows x, int64_t n) {
  check_rows(x, "hadamard x");
  KILN_CHECK(n > 0 && (n & (n - 1)) == 0 && x.ne0 % n == 0, "hadamard: chunk {} of rows of {}", n, x.ne0);
  KILN_CHECK(n <= 8192, "hadamard: chunk {} larger than 8192", n);
  if (n == 1 || x.ne0 == 0 || n_rows(x) == 0) return;  // H_1 = [1]
  const int64_t cpr = x.ne0 / n;
  const int threads = n / 2 >= 256 ? 256 : int(n / 2 < 32 ? 32 : n / 2);
  hadamard_kernel<<<unsigned(n_rows(x) * cpr), threads, size_t(n) * sizeof(float), L.stream>>>(
      x, n, cpr, 1.0f / sqrtf(float(n)));
  KILN_CUDA_LAUNCHED("hadamard");
}

void topk_route(const Launch& L, const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm,
                float w_scale, int32_t* ids, float* weights) {
  KILN_CHECK(k >= 1 && k <= n_expert && k <= 32, "topk_route: k {} vs n_expert {} (k <= 32)", k, n_expert);
  KILN_CHECK(logits && ids && weights, "topk_route: null pointer");
  if (n_tok == 0) return;
  if (k == 1 && n_expert >= kTop1MinExperts)
    top1_kernel<<<unsigned(n_tok), kTop1Threads, 0, L.stream>>>(logits, n_expert, renorm, w_scale, ids, weights);
  else
    topk_kernel<<<unsigned((n_tok + kWarpRows - 1) / kWarpRows), 32 * kWarpRows, 0, L.stream>>>(
        logits, n_expert, n_tok, k, renorm, w_scale, ids, weights);
  KILN_CUDA_LAUNCHED("topk_route");
}

void copy_rows(const Launch& L, void* dst, const size_t dst_nb[3], const void* src, const size_t src_nb[3],
               size_t row_bytes, const int64_t ne[3]) {
  const int64_t nr = ne[0] * ne[1] * ne[2];
  if (row_bytes == 0 || nr == 0) return;
  KILN_CHECK(dst && src && ne[0] > 0 && ne[1] > 0 && ne[2] > 0, "copy_rows: null pointer or bad shape");
  // One cudaMemcpyAsync when both sides are one contiguous span.
  auto dense = [&](const size_t nb[3]) {
    return (ne[0] == 1 || nb[0] == row_bytes) && (ne[1] == 1 || nb[1] == row_bytes * size_t(ne[0])) &&
           (ne[2] == 1 || nb[2] == row_bytes * size_t(ne[0] * ne[1]));
  };
  if (dense(dst_nb) && dense(src_nb)) {
    if (dst == src) return;
    const cudaError_t e = cudaMemcpyAsync(dst, src, row_bytes * size_t(nr), cudaMemcpyDeviceToDevice, L.stream);
    KILN_CHECK(e == cudaSuccess, "copy_rows: cudaMemcpyAsync failed: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    return;
  }
  // The widest unit that every address and stride is a multiple of.
  uintptr_t all = uintptr_t(dst) | uintptr_t(src) | row_bytes;
  for (int d = 0; d < 3; ++d) all |= dst_nb[d] | src_nb[d];
  const size_t u = (all % 16 == 0) ? 16 : (all % 8 == 0) ? 8 : (all % 4 == 0) ? 4 : (all % 2 == 0) ? 2 : 1;
  const int64_t units = int64_t(row_bytes / u);
  const int64_t bx = (units + 255) / 256;
  const dim3 g(unsigned(bx < (1 << 20) ? bx : (1 << 20)), unsigned(nr < kMaxGridY ? nr : kMaxGridY));
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#define KILN_COPY(U) \
  copy_rows_kernel<U><<<g, 256, 0, L.stream>>>(d, dst_nb[0], dst_nb[1], dst_nb[2], s, src_nb[0], src_nb[1], src_nb[2], units, ne[0], ne[1], nr)
  switch (u) {
    case 16: KILN_COPY(int4); break;
    case 8: KILN_COPY(int2); break;
    case 4: KILN_COPY(int); break;
    case 2: KILN_COPY(short); break;
    default: KILN_COPY(char); break;
  }
#undef KILN_COPY
  KILN_CUDA_LAUNCHED("copy_rows");
}

__global__ void busy_wait_kernel(int64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(2000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (int64_t(t - t0) < ns);
}

void busy_wait(const Launch& L, int64_t us) {
  busy_wait_kernel<<<1, 1, 0, L.stream>>>(us * 1000);
  KILN_CUDA_LAUNCHED("busy_wait");
}

int code_sm(int device_sm) {
  // The virtual architecture of the code the runtime picked for the current device: 90 for sm_90a
  // code on a Hopper card, 86 when a build for 86 runs there (its compute_86 PTX, JIT-compiled).
  cudaFuncAttributes a{};
  int sm = device_sm;
  if (cudaFuncGetAttributes(&a, busy_wait_kernel) == cudaSuccess && a.ptxVersion > 0) sm = std::min(sm, a.ptxVersion);
  if (const char* e = std::getenv("KILN_CUDA_SM"); e != nullptr && std::atoi(e) > 0) sm = std::min(sm, std::atoi(e));
  return sm;
}

}  // namespace kiln::cuda
