// tests/kernels/test_cuda_seq.cpp — the CUDA sequence ops (cuda::kv_store, attention, conv1d_silu,
//   gated_delta) at launcher level against the CPU ops (kernels::*, called per run exactly as the
//   model calls them) and the scalar references (kernels::ref::*, double sums).
// Batches mix slots: prefill runs (fresh and continuing a long history, >= 3000 positions) with
//   single decode tokens; a second call continues every slot (caches / conv / delta states carried).
// Bounds (max abs error; "rel" = divided by max(1, max |reference|)):
//   kv_store: the cache bytes equal the reference quantizers' (tensor/quant.cpp) exactly.
//   attention vs ref::attention on the same cache: 1e-4 rel (2e-3 on the tensor-core path: F16 operands).
//     vs kernels::attention: 2e-3 (F32/F16 K
//     and V) or 3e-2 (quantized K or V: the CPU rounds q to Q8_0 for quantized K, accumulates in F16
//     for F16 V with quantized K, and its Q8_0 store rounds differently from the reference).
//   conv1d_silu: y 1e-5 abs vs ref and CPU; the states bit-exact (they are copies).
//   gated_delta: out and state 1e-4 rel vs ref and the CPU op (runs of >= 64 tokens: the chunked form;
//   its device plan's chunk and run counts exact).
// KILN_CUDA_BENCH=1: prints timings (decode attention 4K / 32K, 512-token prefill chunks at 0 / 7.5K / 31.5K,
//   gated_delta).
// Skips (GTEST_SKIP with the reason) when cudaGetDeviceCount fails or finds no device.
#include <gtest/gtest.h>

#if KILN_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/workspace.h"
#include "kernels/ops.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

namespace kiln {
namespace {

using gguf::GgmlType;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

std::string gpu_skip_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  return "";
}

struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { ck(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  void up(const void* h, size_t bytes) { ck(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice), "upload"); }
  void down(void* h, size_t bytes) const { ck(cudaMemcpy(h, p, bytes, cudaMemcpyDeviceToHost), "download"); }
  template <class T>
  void up(const std::vector<T>& v) { up(v.data(), v.size() * sizeof(T)); }
  template <class T>
  void down(std::vector<T>& v) const { down(v.data(), v.size() * sizeof(T)); }
};

std::vector<float> randv(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct MaxErr {
  double err = 0, ref = 0;
  void add(double got, double want) {
    err = std::max(err, std::fabs(got - want));
    ref = std::max(ref, std::fabs(want));
  }
  double rel() const { return err / std::max(1.0, ref); }
};

// A batch: runs (slot, n tokens) in order, each continuing at its slot's next position.
struct Batch {
  struct Run {
    int slot, t0, n, pos0;
  };
  std::vector<Run> runs;
  std::vector<int32_t> seq, pos;
  int T() const { return int(seq.size()); }
};
Batch make_batch(const std::vector<std::pair<int, int>>& spec, std::vector<int>& next_pos) {
  Batch b;
  for (auto [slot, n] : spec) {
    b.runs.push_back({slot, b.T(), n, next_pos[size_t(slot)]});
    for (int i = 0; i < n; ++i) {
      b.seq.push_back(slot);
      b.pos.push_back(next_pos[size_t(slot)]++);
    }
  }
  return b;
}

class CudaSeq : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = gpu_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ck(cudaStreamCreate(&stream_), "cudaStreamCreate");
    int dev = 0, major = 0, minor = 0;
    ck(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&L.n_sm, cudaDevAttrMultiProcessorCount, dev);
    L.sm = cuda::code_sm(major * 10 + minor);
    L.stream = stream_;
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void sync() { ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  cudaStream_t stream_ = nullptr;
  cuda::Launch L;
  ThreadPool pool_{0};
};

// ---- attention + kv_store -----------------------------------------------------------------------

struct AttnCase {
  int64_t D, Hq, Hkv;
  GgmlType kt, vt;
  int q_mult = 1;       // q head stride in units of D (2: the gated-attention layout q|gate)
  bool pass_nkv = true; // false: n_kv_max = 0 (the cache length)
  int64_t n_ctx = 3200;
};

std::string case_name(const AttnCase& c) {
  return "D=" + std::to_string(c.D) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " K=" +
         std::string(gguf::type_name(c.kt)) + " V=" + std::string(gguf::type_name(c.vt));
}

bool quantized(GgmlType t) { return t == GgmlType::Q8_0 || t == GgmlType::Q4_0; }

void attn_case(const AttnCase& c, cuda::Launch L, cudaStream_t st, ThreadPool& pool) {
  SCOPED_TRACE(case_name(c));
  const int n_slot = 5;
  const int64_t D = c.D, Hq = c.Hq, Hkv = c.Hkv, kvw = D * Hkv;
  const size_t rk = tensor::row_size(c.kt, D), rv = tensor::row_size(c.vt, D);
  const size_t knb2 = rk * size_t(Hkv), vnb2 = rv * size_t(Hkv);
  const size_t knb3 = knb2 * size_t(c.n_ctx), vnb3 = vnb2 * size_t(c.n_ctx);
  std::mt19937 rng(uint32_t(D * 131 + Hq * 7 + Hkv + int(c.kt) * 1000 + int(c.vt) * 10000));
  std::vector<int> hist = {3000, 2950, 0, 17, 1200};
  if (c.n_ctx < 3200) hist = {int(c.n_ctx) - 120, 600, 0, 17, 300};

  // Identical histories in all three caches (reference quantizer).
  std::vector<uint8_t> kc_ref(knb3 * n_slot), vc_ref(vnb3 * n_slot);
  for (int s = 0; s < n_slot; ++s) {
    const int n = hist[size_t(s)];
    if (n == 0) continue;
    std::vector<int32_t> pos(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) pos[size_t(i)] = i;
    const auto kx = randv(size_t(kvw * n), rng, -1, 1), vx = randv(size_t(kvw * n), rng, -1, 1);
    kernels::ref::kv_store(c.kt, kernels::crows3(kx.data(), D, Hkv, n), pos.data(), kc_ref.data() + s * knb3, knb2, rk);
    kernels::ref::kv_store(c.vt, kernels::crows3(vx.data(), D, Hkv, n), pos.data(), vc_ref.data() + s * vnb3, vnb2, rv);
  }
  std::vector<uint8_t> kc_cpu = kc_ref, vc_cpu = vc_ref;
  DevBuf kd(kc_ref.size()), vd(vc_ref.size());
  kd.up(kc_ref);
  vd.up(vc_ref);
  const cuda::SeqMem kmem{kd.p, c.kt, D, Hkv, c.n_ctx, rk, knb2, knb3};
  const cuda::SeqMem vmem{vd.p, c.vt, D, Hkv, c.n_ctx, rv, vnb2, vnb3};

  kernels::AttnParams ap;
  ap.head_dim = D, ap.n_head = Hq, ap.n_head_kv = Hkv, ap.scale = 1.0f / std::sqrt(float(D));
  cuda::AttnArgs aa;
  aa.head_dim = D, aa.n_head = Hq, aa.n_head_kv = Hkv, aa.scale = ap.scale;

  std::vector<int> next = hist;
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 1}, {1, 40}, {2, 70}, {3, 1}, {4, 5}},  // 117 tokens: prefill tiles, mixed runs
      {{0, 1}, {1, 1}, {2, 3}, {3, 1}, {4, 1}},    // 7 tokens: decode blocks, split keys
      {{1, 130}, {3, 2}},                          // a long run after a long history: whole tensor-core tiles
  };
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    SCOPED_TRACE("batch " + std::to_string(bi));
    const Batch b = make_batch(batches[bi], next);
    const int T = b.T();
    const int64_t q_s1 = c.q_mult * D, q_s2 = q_s1 * Hq;
    const auto q = randv(size_t(q_s2 * T), rng, -3, 3);
    const auto kx = randv(size_t(kvw * T), rng, -1, 1), vx = randv(size_t(kvw * T), rng, -1, 1);

    // GPU
    DevBuf qd(q.size() * 4), kxd(kx.size() * 4), vxd(vx.size() * 4), sd(size_t(T) * 4), pd(size_t(T) * 4),
        od(size_t(D * Hq * T) * 4);
    qd.up(q), kxd.up(kx), vxd.up(vx), sd.up(b.seq), pd.up(b.pos);
    int32_t pmax = 0;
    for (int32_t p : b.pos) pmax = std::max(pmax, p);
    aa.n_kv_max = c.pass_nkv ? pmax + 1 : 0;
    const size_t wsb = cuda::attention_workspace(aa, T);
    DevBuf ws(wsb);
    L.ws = wsb ? ws.p : nullptr;
    L.ws_bytes = wsb;
    cuda::kv_store(L, cuda::Rows{kxd.as<float>(), D, Hkv, T, D, kvw}, sd.as<int32_t>(), pd.as<int32_t>(), kmem);
    cuda::kv_store(L, cuda::Rows{vxd.as<float>(), D, Hkv, T, D, kvw}, sd.as<int32_t>(), pd.as<int32_t>(), vmem);
    cuda::attention(L, cuda::Rows{qd.as<float>(), D, Hq, T, q_s1, q_s2}, sd.as<int32_t>(), pd.as<int32_t>(), kmem, vmem,
                    aa, cuda::Rows{od.as<float>(), D, Hq, T, D, D * Hq});
    ck(cudaStreamSynchronize(st), "attention");
    std::vector<float> out_gpu(size_t(D * Hq * T));
    od.down(out_gpu);

    // CPU ops and references, per run as the model calls them
    std::vector<float> out_cpu(out_gpu.size()), out_ref(out_gpu.size());
    for (const auto& r : b.runs) {
      const int32_t* pos = b.pos.data() + r.t0;
      for (int which = 0; which < 2; ++which) {
        uint8_t* kb = (which ? kc_ref : kc_cpu).data() + size_t(r.slot) * knb3;
        uint8_t* vb = (which ? vc_ref : vc_cpu).data() + size_t(r.slot) * vnb3;
        const kernels::CRows kr(kx.data() + r.t0 * kvw, D, Hkv, r.n, D, kvw), vr(vx.data() + r.t0 * kvw, D, Hkv, r.n, D, kvw);
        if (which) {
          kernels::ref::kv_store(c.kt, kr, pos, kb, knb2, rk);
          kernels::ref::kv_store(c.vt, vr, pos, vb, vnb2, rv);
        } else {
          kernels::kv_store(c.kt, kr, pos, kb, knb2, rk);
          kernels::kv_store(c.vt, vr, pos, vb, vnb2, rv);
          const kernels::KvView kv{c.kt, kb, knb2, rk, r.pos0 + r.n}, vv{c.vt, vb, vnb2, rv, r.pos0 + r.n};
          kernels::attention(kernels::CRows(q.data() + r.t0 * q_s2, D, Hq, r.n, q_s1, q_s2), pos, kv, vv, ap,
                             kernels::Rows{out_cpu.data() + r.t0 * D * Hq, D, Hq, r.n, D, D * Hq}, pool);
        }
      }
    }
    pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) {
        const int slot = b.seq[size_t(t)];
        const kernels::KvView kv{c.kt, kc_ref.data() + size_t(slot) * knb3, knb2, rk, b.pos[size_t(t)] + 1};
        const kernels::KvView vv{c.vt, vc_ref.data() + size_t(slot) * vnb3, vnb2, rv, b.pos[size_t(t)] + 1};
        kernels::ref::attention(kernels::CRows(q.data() + t * q_s2, D, Hq, 1, q_s1, q_s2), &b.pos[size_t(t)], kv, vv,
                                ap, kernels::Rows{out_ref.data() + t * D * Hq, D, Hq, 1, D, D * Hq});
      }
    });

    // the caches: byte-equal to the reference quantizers' rows
    std::vector<uint8_t> kg(kc_ref.size()), vg(vc_ref.size());
    kd.down(kg), vd.down(vg);
    size_t kbad = 0, vbad = 0;
    for (size_t i = 0; i < kg.size(); ++i) kbad += kg[i] != kc_ref[i];
    for (size_t i = 0; i < vg.size(); ++i) vbad += vg[i] != vc_ref[i];
    EXPECT_EQ(kbad, 0u) << "K cache bytes differing from ref::kv_store";
    EXPECT_EQ(vbad, 0u) << "V cache bytes differing from ref::kv_store";

    MaxErr e_ref, e_cpu;
    for (size_t i = 0; i < out_gpu.size(); ++i) {
      e_ref.add(out_gpu[i], out_ref[i]);
      e_cpu.add(out_gpu[i], out_cpu[i]);
    }
    // The tensor-core path (whole-run tiles of prefill-sized batches over F16 / Q8_0 / Q4_0 caches)
    // rounds q, the probabilities and dequantized cache values to F16: 2e-3 of the largest output
    // against the double-sum reference.
    const int mma_bt = cuda::attention_mma_tile(L, aa, c.kt, c.vt, T);
    const double cpu_bound = quantized(c.kt) || quantized(c.vt) ? 3e-2 : 2e-3;
    EXPECT_LE(e_ref.rel(), mma_bt ? 2e-3 : 1e-4) << "vs ref::attention";
    EXPECT_LE(e_cpu.err, cpu_bound) << "vs kernels::attention";
    std::printf("[attn] %-40s batch %zu T=%3d splits-ws=%8zu B mma tile %2d  max|err| vs ref %.2e (max|ref| %.3f)  vs cpu %.2e\n",
                case_name(c).c_str(), bi, T, wsb, mma_bt, e_ref.err, e_ref.ref, e_cpu.err);
  }
}

TEST_F(CudaSeq, AttentionMixedBatches) {
  const AttnCase cases[] = {
      {128, 8, 2, GgmlType::F32, GgmlType::F32},
      {128, 8, 2, GgmlType::F16, GgmlType::F16, 1, false},
      {128, 8, 2, GgmlType::Q8_0, GgmlType::Q8_0},
      {128, 8, 2, GgmlType::Q4_0, GgmlType::Q4_0},
      {64, 4, 4, GgmlType::F16, GgmlType::F16},      // GQA 1
      {64, 32, 32, GgmlType::F16, GgmlType::Q4_0},   // GQA 1, enough blocks: no key split
      {64, 16, 2, GgmlType::Q8_0, GgmlType::F16},    // GQA 8, mixed cache types
      {256, 16, 4, GgmlType::F16, GgmlType::F16, 2}, // Qwen3.5 gated attention (q head stride 2D)
      {256, 16, 4, GgmlType::Q4_0, GgmlType::Q4_0, 2},
      {256, 4, 4, GgmlType::F32, GgmlType::Q8_0},    // GQA 1
      {256, 32, 4, GgmlType::Q8_0, GgmlType::Q4_0},  // GQA 8
      {256, 24, 4, GgmlType::F16, GgmlType::F16, 2}, // Qwen3.5-27B gated attention: GQA 6 (decode: 8 rows, 2 idle)
      {128, 28, 4, GgmlType::Q8_0, GgmlType::Q8_0},  // GQA 7
      {80, 6, 2, GgmlType::F16, GgmlType::F16},      // head_dim not a power of two (F16 only)
      {72, 16, 16, GgmlType::F16, GgmlType::F16},    // the vision tower's heads (tensor cores: padded to 80)
      {72, 8, 2, GgmlType::F16, GgmlType::F16},      // GQA 4 (Q8_0 / Q4_0 rows need head_dim % 32 == 0)
      {96, 12, 4, GgmlType::Q8_0, GgmlType::Q8_0},
      {512, 8, 2, GgmlType::F16, GgmlType::Q8_0, 1, true, 1024},
  };
  for (const auto& c : cases) attn_case(c, L, stream_, pool_);
}

// An encoder's attention (AttnArgs::causal = false, the vision tower): runs of whole slots, every
// token attending to all n_ctx keys of its slot; pos holds garbage (not read). Against the scalar
// reference with each token's last key at n_ctx - 1; the tensor-core path (whole-run tiles of F16 /
// quantized caches, head_dim 64 / 72 / 128 / 256) rounds to F16 as in the causal test.
TEST_F(CudaSeq, AttentionNotCausal) {
  struct Case {
    int64_t D, H;
    GgmlType t;
    int n, slots;
  };
  const Case cases[] = {
      {72, 16, GgmlType::F16, 560, 1},  // the 9B / 27B tower: tensor cores
      {72, 16, GgmlType::F16, 300, 2},  // two images in one call
      {72, 16, GgmlType::F16, 40, 1},   // a small image: the decode-sized kernel
      {72, 16, GgmlType::F32, 200, 1},  // CUDA cores
      {64, 12, GgmlType::F16, 256, 1},  // the 0.8B tower
      {16, 4, GgmlType::F16, 320, 1},   // the tiny HF fixture's heads (CUDA cores)
      {16, 4, GgmlType::F32, 24, 1},
  };
  for (const auto& c : cases) {
    const std::string name = "D=" + std::to_string(c.D) + " H=" + std::to_string(c.H) + " " +
                             std::string(gguf::type_name(c.t)) + " n=" + std::to_string(c.n) + " x" + std::to_string(c.slots);
    SCOPED_TRACE(name);
    std::mt19937 rng(uint32_t(c.D * 7 + c.n + c.slots));
    const int64_t D = c.D, H = c.H, n_ctx = c.n, T = int64_t(c.n) * c.slots;
    const size_t rs = tensor::row_size(c.t, D), nb2 = rs * size_t(H), nb3 = nb2 * size_t(n_ctx);
    std::vector<int32_t> seq(static_cast<size_t>(T)), pos(seq.size()), kpos(seq.size());
    for (int64_t t = 0; t < T; ++t) {
      seq[size_t(t)] = int32_t(t / c.n);
      kpos[size_t(t)] = int32_t(t % c.n);
      pos[size_t(t)] = int32_t(-1000 - t);  // not read when not causal
    }
    const auto q = randv(size_t(D * H * T), rng, -3, 3), kx = randv(size_t(D * H * T), rng, -1, 1),
               vx = randv(size_t(D * H * T), rng, -1, 1);
    DevBuf qd(q.size() * 4), kxd(kx.size() * 4), vxd(vx.size() * 4), sd(size_t(T) * 4), pd(size_t(T) * 4),
        kpd(size_t(T) * 4), od(q.size() * 4), kd(nb3 * size_t(c.slots)), vd(nb3 * size_t(c.slots));
    qd.up(q), kxd.up(kx), vxd.up(vx), sd.up(seq), pd.up(pos), kpd.up(kpos);
    const cuda::SeqMem kmem{kd.p, c.t, D, H, n_ctx, rs, nb2, nb3}, vmem{vd.p, c.t, D, H, n_ctx, rs, nb2, nb3};
    cuda::AttnArgs aa;
    aa.head_dim = D, aa.n_head = aa.n_head_kv = H, aa.scale = 1.0f / std::sqrt(float(D));
    aa.n_kv_max = n_ctx;
    aa.causal = false;
    const size_t wsb = cuda::attention_workspace(aa, T);
    DevBuf ws(wsb);
    L.ws = wsb ? ws.p : nullptr;
    L.ws_bytes = wsb;
    cuda::kv_store(L, cuda::Rows{kxd.as<float>(), D, H, T, D, D * H}, sd.as<int32_t>(), kpd.as<int32_t>(), kmem);
    cuda::kv_store(L, cuda::Rows{vxd.as<float>(), D, H, T, D, D * H}, sd.as<int32_t>(), kpd.as<int32_t>(), vmem);
    cuda::attention(L, cuda::Rows{qd.as<float>(), D, H, T, D, D * H}, sd.as<int32_t>(), pd.as<int32_t>(), kmem, vmem, aa,
                    cuda::Rows{od.as<float>(), D, H, T, D, D * H});
    sync();
    std::vector<float> got(q.size());
    od.down(got);

    // Reference: the caches by the reference quantizer, every token's last key at n_ctx - 1.
    std::vector<uint8_t> kc(nb3 * size_t(c.slots)), vc(kc.size());
    std::vector<float> want(q.size());
    const kernels::AttnParams ap{D, H, H, aa.scale};
    const std::vector<int32_t> last(size_t(c.n), int32_t(n_ctx - 1));
    for (int s = 0; s < c.slots; ++s) {
      const int64_t t0 = int64_t(s) * c.n;
      kernels::ref::kv_store(c.t, kernels::crows3(kx.data() + t0 * D * H, D, H, c.n), kpos.data() + t0, kc.data() + s * nb3, nb2, rs);
      kernels::ref::kv_store(c.t, kernels::crows3(vx.data() + t0 * D * H, D, H, c.n), kpos.data() + t0, vc.data() + s * nb3, nb2, rs);
    }
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) {
        const size_t s = size_t(seq[size_t(t)]);
        const kernels::KvView kv{c.t, kc.data() + s * nb3, nb2, rs, n_ctx}, vv{c.t, vc.data() + s * nb3, nb2, rs, n_ctx};
        kernels::ref::attention(kernels::CRows(q.data() + t * D * H, D, H, 1, D, D * H), last.data(), kv, vv, ap,
                                kernels::Rows{want.data() + t * D * H, D, H, 1, D, D * H});
      }
    });
    MaxErr e;
    for (size_t i = 0; i < got.size(); ++i) e.add(got[i], want[i]);
    const int mma_bt = cuda::attention_mma_tile(L, aa, c.t, c.t, T);
    EXPECT_LE(e.rel(), mma_bt ? 2e-3 : 1e-4);
    std::printf("[attn-enc] %-28s T=%4lld mma tile %2d  max|err| vs ref %.2e (max|ref| %.3f)\n", name.c_str(),
                (long long)T, mma_bt, e.err, e.ref);
  }
}

// ---- conv1d_silu ------------------------------------------------------------------------------

TEST_F(CudaSeq, Conv1dSiluStateAcrossCalls) {
  struct Case {
    int64_t C;
    int K;
    bool in_place;
    int64_t pad;
  };
  for (const Case cs : {Case{1000, 4, true, 0}, Case{67, 3, false, 5}, Case{8192, 4, true, 8}}) {
    SCOPED_TRACE("C=" + std::to_string(cs.C) + " d_conv=" + std::to_string(cs.K));
    const int n_slot = 4, K = cs.K;
    const int64_t C = cs.C, xs = C + cs.pad;
    std::mt19937 rng(uint32_t(C + K));
    const auto w = randv(size_t(C * K), rng, -1, 1);
    std::vector<float> st_ref = randv(size_t(n_slot * C * (K - 1)), rng, -1, 1), st_cpu = st_ref;
    DevBuf wd(w.size() * 4), std_(st_ref.size() * 4);
    wd.up(w), std_.up(st_ref);
    const cuda::SeqMem smem{std_.p, GgmlType::F32, K - 1, C, 1, size_t(K - 1) * 4, size_t(K - 1) * 4 * size_t(C),
                            size_t(K - 1) * 4 * size_t(C)};
    std::vector<int> next(n_slot, 0);
    // the third batch crosses the kernel's 64-token tiles inside runs (a 2-token run across one)
    for (const auto& spec : std::vector<std::vector<std::pair<int, int>>>{{{2, 37}, {0, 1}, {3, 2}, {1, 9}},
                                                                          {{0, 1}, {1, 1}, {2, 1}, {3, 5}},
                                                                          {{0, 3}, {1, 60}, {2, 2}, {3, 70}}}) {
      const Batch b = make_batch(spec, next);
      const int T = b.T();
      const auto x = randv(size_t(xs * T), rng, -1, 1);
      DevBuf xd(x.size() * 4), yd(x.size() * 4), sd(size_t(T) * 4);
      xd.up(x), sd.up(b.seq);
      float* y = cs.in_place ? xd.as<float>() : yd.as<float>();
      cuda::conv1d_silu(L, xd.as<float>(), xs, wd.as<float>(), K, C, sd.as<int32_t>(), smem, y, xs, T);
      sync();
      std::vector<float> yg(x.size()), sg(st_ref.size());
      (cs.in_place ? xd : yd).down(yg);
      std_.down(sg);
      std::vector<float> y_ref(x.size()), y_cpu(x.size());
      for (const auto& r : b.runs) {
        kernels::ref::conv1d_silu(x.data() + r.t0 * xs, xs, w.data(), st_ref.data() + r.slot * C * (K - 1),
                                  y_ref.data() + r.t0 * xs, xs, C, r.n, K);
        std::vector<float> xc(x.begin() + r.t0 * xs, x.begin() + (r.t0 + r.n) * xs);  // in place, as the model
        kernels::conv1d_silu(xc.data(), xs, w.data(), st_cpu.data() + r.slot * C * (K - 1), xc.data(), xs, C, r.n, K,
                             pool_);
        std::copy(xc.begin(), xc.end(), y_cpu.begin() + r.t0 * xs);
      }
      MaxErr er, ec;
      for (int t = 0; t < T; ++t)
        for (int64_t ch = 0; ch < C; ++ch) {
          const size_t i = size_t(t * xs + ch);
          er.add(yg[i], y_ref[i]);
          ec.add(yg[i], y_cpu[i]);
        }
      EXPECT_LE(er.err, 1e-5);
      EXPECT_LE(ec.err, 1e-5);
      EXPECT_EQ(sg, st_ref) << "conv state";
      EXPECT_EQ(sg, st_cpu) << "conv state vs CPU op";
      std::printf("[conv] C=%5lld d_conv=%d T=%3d max|err| vs ref %.2e  vs cpu %.2e\n", (long long)C, K, T, er.err,
                  ec.err);
    }
  }
}

// ---- gated delta rule ---------------------------------------------------------------------------

TEST_F(CudaSeq, GatedDeltaStateAcrossCalls) {
  struct Case {
    int64_t S, Hk, Hv, pad;
  };
  for (const Case cs : {Case{128, 4, 8, 0}, Case{64, 2, 6, 0}, Case{48, 1, 3, 1}, Case{256, 2, 4, 0},
                        Case{16, 4, 4, 0}, Case{32, 1, 2, 3}}) {
    const int64_t S = cs.S, Hk = cs.Hk, Hv = cs.Hv, kd = S * Hk, conv = 2 * kd + S * Hv + cs.pad;
    SCOPED_TRACE("S=" + std::to_string(S) + " Hk=" + std::to_string(Hk) + " Hv=" + std::to_string(Hv));
    const int n_slot = 4;
    const size_t st_n = size_t(S * S * Hv);
    std::mt19937 rng(uint32_t(S * 7 + Hk * 3 + Hv));
    std::vector<float> st_ref = randv(st_n * n_slot, rng, -0.1f, 0.1f), st_cpu = st_ref;
    DevBuf std_(st_ref.size() * 4);
    std_.up(st_ref);
    const cuda::SeqMem smem{std_.p, GgmlType::F32, S, S, Hv, size_t(S) * 4, size_t(S * S) * 4, st_n * 4};
    std::vector<int> next(n_slot, 0);
    // Runs of >= 64 tokens take the chunked form (S 32 / 64 / 128 on sm_80+): one full chunk and a
    // partial one (70), three chunks (150), exactly one (64); the others the recurrence.
    for (const auto& spec : std::vector<std::vector<std::pair<int, int>>>{{{1, 33}, {0, 1}, {3, 70}, {2, 2}},
                                                                          {{0, 1}, {1, 1}, {2, 1}, {3, 4}},
                                                                          {{0, 150}, {2, 64}, {1, 5}, {3, 63}}}) {
      const Batch b = make_batch(spec, next);
      const int T = b.T();
      std::vector<float> mixed = randv(size_t(conv * T), rng, -1, 1);
      for (int t = 0; t < T; ++t)  // q, k heads L2-normalised, as the model feeds them
        for (int64_t h = 0; h < 2 * Hk; ++h) {
          float* r = mixed.data() + t * conv + h * S;
          double s = 0;
          for (int64_t i = 0; i < S; ++i) s += double(r[i]) * r[i];
          for (int64_t i = 0; i < S; ++i) r[i] = float(r[i] / std::sqrt(s));
        }
      const auto g = randv(size_t(Hv * T), rng, -2.0f, -0.01f), beta = randv(size_t(Hv * T), rng, 0.05f, 0.95f);
      DevBuf md(mixed.size() * 4), gd(g.size() * 4), bd(beta.size() * 4), sd(size_t(T) * 4), od(size_t(S * Hv * T) * 4);
      md.up(mixed), gd.up(g), bd.up(beta), sd.up(b.seq);
      float* m = md.as<float>();
      cuda::Launch Lw = L;
      DevBuf ws(cuda::gated_delta_workspace(S, Hv, 64, T));
      Lw.ws = ws.p, Lw.ws_bytes = ws.n;
      cuda::gated_delta(Lw, cuda::Rows{m, S, Hk, T, S, conv}, cuda::Rows{m + kd, S, Hk, T, S, conv},
                        cuda::Rows{m + 2 * kd, S, Hv, T, S, conv}, gd.as<float>(), bd.as<float>(), sd.as<int32_t>(), smem,
                        cuda::Rows{od.as<float>(), S, Hv, T, S, S * Hv}, 64);
      sync();
      int want_chunks = 0, want_runs = 0;
      for (const auto& r : b.runs)
        if (r.n >= 64) want_chunks += (r.n + 63) / 64, ++want_runs;
      if (L.sm >= 80 && cuda::detail::gdn_chunk_s(S) && want_runs > 0) {  // the device plan found them
        int32_t cnt[2] = {-1, -1};
        ck(cudaMemcpy(cnt, static_cast<char*>(ws.p) + cuda::detail::gdn_chunk_layout(Hv, T).count, sizeof cnt,
                      cudaMemcpyDeviceToHost),
           "count");
        EXPECT_EQ(cnt[0], want_chunks) << "chunks";
        EXPECT_EQ(cnt[1], want_runs) << "chunked runs";
      }
      std::vector<float> og(size_t(S * Hv * T)), sg(st_ref.size());
      od.down(og), std_.down(sg);
      std::vector<float> o_ref(og.size()), o_cpu(og.size());
      for (const auto& r : b.runs)
        for (int which = 0; which < 2; ++which) {
          kernels::DeltaArgs a;
          a.q = mixed.data() + r.t0 * conv;
          a.k = a.q + kd;
          a.qk_stride = conv;
          a.v = a.q + 2 * kd;
          a.v_stride = conv;
          a.g = g.data() + r.t0 * Hv;
          a.beta = beta.data() + r.t0 * Hv;
          a.state = (which ? st_ref : st_cpu).data() + size_t(r.slot) * st_n;
          a.out = (which ? o_ref : o_cpu).data() + r.t0 * S * Hv;
          a.out_stride = S * Hv;
          a.S = S, a.Hk = Hk, a.Hv = Hv, a.n_t = r.n;
          if (which) kernels::ref::gated_delta_rule(a);
          else kernels::gated_delta_rule(a, pool_);
        }
      MaxErr eo_ref, eo_cpu, es_ref, es_cpu;
      for (size_t i = 0; i < og.size(); ++i) eo_ref.add(og[i], o_ref[i]), eo_cpu.add(og[i], o_cpu[i]);
      for (size_t i = 0; i < sg.size(); ++i) es_ref.add(sg[i], st_ref[i]), es_cpu.add(sg[i], st_cpu[i]);
      EXPECT_LE(eo_ref.rel(), 1e-4) << "out vs ref";
      EXPECT_LE(eo_cpu.rel(), 1e-4) << "out vs cpu";
      EXPECT_LE(es_ref.rel(), 1e-4) << "state vs ref";
      EXPECT_LE(es_cpu.rel(), 1e-4) << "state vs cpu";
      std::printf("[gdn ] S=%3lld Hk=%lld Hv=%lld T=%2d out max|err| vs ref %.2e vs cpu %.2e (max|ref| %.3f); "
                  "state vs ref %.2e vs cpu %.2e (max %.3f)\n",
                  (long long)S, (long long)Hk, (long long)Hv, T, eo_ref.err, eo_cpu.err, eo_ref.ref, es_ref.err,
                  es_cpu.err, es_ref.ref);
    }
  }
}

// ---- timings (KILN_CUDA_BENCH=1) ---------------------------------------------------------------

template <class F>
double time_us(cudaStream_t st, int iters, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a, st);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b, st);
  ck(cudaEventSynchronize(b), "bench");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return double(ms) * 1000.0 / iters;
}

TEST_F(CudaSeq, BenchTimings) {
  const char* env = std::getenv("KILN_CUDA_BENCH");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "timings only with KILN_CUDA_BENCH=1";
  const double peak_bw = 4.8e12;  // H200 HBM3e, nominal
  std::mt19937 rng(7);
  {  // attention: Qwen3.5-9B gated attention, head_dim 256, 16 q heads / 4 kv heads
    const int64_t D = 256, Hq = 16, Hkv = 4, n_ctx = 32768, kvw = D * Hkv, chunk = 4096;
    for (GgmlType t : {GgmlType::F16, GgmlType::Q4_0}) {
      const size_t rb = tensor::row_size(t, D), nb2 = rb * Hkv, nb3 = nb2 * n_ctx;
      DevBuf kc(nb3), vc(nb3);
      const cuda::SeqMem km{kc.p, t, D, Hkv, n_ctx, rb, nb2, nb3}, vm{vc.p, t, D, Hkv, n_ctx, rb, nb2, nb3};
      {  // fill the cache through kv_store
        DevBuf xd(size_t(kvw * chunk) * 4), sd(size_t(chunk) * 4), pd(size_t(chunk) * 4);
        std::vector<int32_t> seq(static_cast<size_t>(chunk), 0), pos(static_cast<size_t>(chunk), 0);
        xd.up(randv(size_t(kvw * chunk), rng, -1, 1));
        sd.up(seq);
        for (int64_t c0 = 0; c0 < n_ctx; c0 += chunk) {
          for (int64_t i = 0; i < chunk; ++i) pos[size_t(i)] = int32_t(c0 + i);
          pd.up(pos);
          cuda::kv_store(L, cuda::Rows{xd.as<float>(), D, Hkv, chunk, D, kvw}, sd.as<int32_t>(), pd.as<int32_t>(), km);
          cuda::kv_store(L, cuda::Rows{xd.as<float>(), D, Hkv, chunk, D, kvw}, sd.as<int32_t>(), pd.as<int32_t>(), vm);
          sync();
        }
      }
      cuda::AttnArgs aa;
      aa.head_dim = D, aa.n_head = Hq, aa.n_head_kv = Hkv, aa.scale = 1.0f / 16.0f;
      for (int64_t n_kv : {int64_t(4096), int64_t(32768)}) {
        DevBuf qd(size_t(D * Hq) * 4), od(size_t(D * Hq) * 4), sd(4), pd(4);
        qd.up(randv(size_t(D * Hq), rng, -1, 1));
        sd.up(std::vector<int32_t>{0});
        pd.up(std::vector<int32_t>{int32_t(n_kv - 1)});
        aa.n_kv_max = n_kv;
        const size_t wsb = cuda::attention_workspace(aa, 1);
        DevBuf ws(wsb);
        L.ws = ws.p, L.ws_bytes = wsb;
        const double us = time_us(stream_, 50, [&] {
          cuda::attention(L, cuda::Rows{qd.as<float>(), D, Hq, 1, D, D * Hq}, sd.as<int32_t>(), pd.as<int32_t>(), km,
                          vm, aa, cuda::Rows{od.as<float>(), D, Hq, 1, D, D * Hq});
        });
        const double bytes = 2.0 * double(n_kv) * double(nb2), bw = bytes / (us * 1e-6);
        std::printf("[bench] attention decode %-4s D=256 Hq=16 Hkv=4 n_kv=%5lld: %7.1f us  %6.0f GB/s (%.0f%% of %.1f TB/s)\n",
                    std::string(gguf::type_name(t)).c_str(), (long long)n_kv, us, bw * 1e-9, 100.0 * bw / peak_bw, peak_bw * 1e-12);
      }
      for (int64_t p0 : {int64_t(0), int64_t(7680), int64_t(32256)}) {  // 512-token prefill chunks at p0
        const int64_t T = 512;
        DevBuf qd(size_t(D * Hq * T) * 4), od(size_t(D * Hq * T) * 4), sd(size_t(T) * 4), pd(size_t(T) * 4);
        qd.up(randv(size_t(D * Hq * T), rng, -1, 1));
        std::vector<int32_t> seq(static_cast<size_t>(T), 0), pos(static_cast<size_t>(T), 0);
        for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(p0 + i);
        sd.up(seq), pd.up(pos);
        aa.n_kv_max = p0 + T;
        const size_t wsb = cuda::attention_workspace(aa, T);
        DevBuf ws(wsb);
        L.ws = ws.p, L.ws_bytes = wsb;
        const double us = time_us(stream_, 20, [&] {
          cuda::attention(L, cuda::Rows{qd.as<float>(), D, Hq, T, D, D * Hq}, sd.as<int32_t>(), pd.as<int32_t>(), km,
                          vm, aa, cuda::Rows{od.as<float>(), D, Hq, T, D, D * Hq});
        });
        const double flop = 4.0 * double(D) * double(Hq) * double(T) * (double(p0) + double(T + 1) / 2);
        std::printf("[bench] attention prefill %-4s T=512 at %5lld D=256 Hq=16 Hkv=4: %8.1f us  %6.2f TFLOP/s\n",
                    std::string(gguf::type_name(t)).c_str(), (long long)p0, us, flop / us * 1e-6);
      }
    }
  }
  {  // gated delta rule: Qwen3.5-9B, Hv = 32, Hk = 16, S = 128
    const int64_t S = 128, Hk = 16, Hv = 32, kd = S * Hk, conv = 2 * kd + S * Hv;
    for (int64_t n_seq : {int64_t(1), int64_t(8)}) {
      const size_t st_n = size_t(S * S * Hv);
      DevBuf std_(st_n * 4 * n_seq);
      std_.up(randv(st_n * n_seq, rng, -0.1f, 0.1f));
      const cuda::SeqMem sm{std_.p, GgmlType::F32, S, S, Hv, size_t(S) * 4, size_t(S * S) * 4, st_n * 4};
      for (int64_t per : {int64_t(1), int64_t(512), int64_t(2048)}) {
        if (per > 1 && n_seq > 1) continue;
        const int64_t T = n_seq * per;
        std::vector<int32_t> seq(static_cast<size_t>(T), 0);
        for (int64_t t = 0; t < T; ++t) seq[size_t(t)] = int32_t(t / per);
        DevBuf md(size_t(conv * T) * 4), gd(size_t(Hv * T) * 4), bd(size_t(Hv * T) * 4), sd(size_t(T) * 4),
            od(size_t(S * Hv * T) * 4);
        md.up(randv(size_t(conv * T), rng, -0.1f, 0.1f));
        gd.up(randv(size_t(Hv * T), rng, -1.0f, -0.01f));
        bd.up(randv(size_t(Hv * T), rng, 0.1f, 0.9f));
        sd.up(seq);
        float* m = md.as<float>();
        DevBuf ws(cuda::gated_delta_workspace(S, Hv, 64, T));
        cuda::Launch Lw = L;
        Lw.ws = ws.p, Lw.ws_bytes = ws.n;
        for (int chunk : {0, 64}) {
          if (chunk > 0 && per < 64) continue;
          const double us = time_us(stream_, per > 1 ? 10 : 200, [&] {
            cuda::gated_delta(Lw, cuda::Rows{m, S, Hk, T, S, conv}, cuda::Rows{m + kd, S, Hk, T, S, conv},
                              cuda::Rows{m + 2 * kd, S, Hv, T, S, conv}, gd.as<float>(), bd.as<float>(),
                              sd.as<int32_t>(), sm, cuda::Rows{od.as<float>(), S, Hv, T, S, S * Hv}, chunk);
          });
          const double floor_us = 2.0 * double(st_n * 4 * n_seq) / peak_bw * 1e6;
          std::printf("[bench] gated_delta S=128 Hv=32 %lld slot(s) x %4lld token(s) %s: %7.1f us  (state-traffic "
                      "floor %.2f us = %.0f%%)\n",
                      (long long)n_seq, (long long)per, chunk ? "chunked  " : "recurrent", us, floor_us,
                      100.0 * floor_us / us);
        }
      }
    }
  }
  {  // conv1d_silu, Qwen3.5-9B conv_dim 8192
    const int64_t C = 8192;
    const int K = 4;
    for (int64_t T : {int64_t(1), int64_t(512)}) {
      DevBuf xd(size_t(C * T) * 4), wd(size_t(C * K) * 4), std_(size_t(C * (K - 1)) * 4), sd(size_t(T) * 4);
      xd.up(randv(size_t(C * T), rng, -1, 1)), wd.up(randv(size_t(C * K), rng, -1, 1));
      std_.up(randv(size_t(C * (K - 1)), rng, -1, 1));
      sd.up(std::vector<int32_t>(size_t(T), 0));
      const cuda::SeqMem sm{std_.p, GgmlType::F32, K - 1, C, 1, size_t(K - 1) * 4, size_t(K - 1) * 4 * C,
                            size_t(K - 1) * 4 * C};
      const double us = time_us(stream_, 50, [&] {
        cuda::conv1d_silu(L, xd.as<float>(), C, wd.as<float>(), K, C, sd.as<int32_t>(), sm, xd.as<float>(), C, T);
      });
      std::printf("[bench] conv1d_silu C=8192 d_conv=4 T=%3lld: %6.1f us\n", (long long)T, us);
    }
  }
}

}  // namespace
}  // namespace kiln

#else  // !KILN_HAVE_CUDA

TEST(CudaSeq, NotBuilt) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF or no nvcc)"; }

#endif
