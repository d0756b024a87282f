// The backend interface on the CPU device: buffers (owned and wrapped), tensor views, the arena,
// workspace planning, and ops through a Stream: against the scalar references, and bit for bit
// against the kernel calls the CPU stream promises (one call per row for the elementwise ops; per
// expert for matmul_id; per run of one sequence for the sequence ops, several sequences per call).
#include <algorithm>
#include <cstring>

#include "backend/backend.h"
#include "kernel_test_util.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::backend;
using namespace kiln::kernels::testing;
namespace ref = kiln::kernels::ref;

TEST(Backend, TensorGeometry) {
  Tensor t = Tensor::make(nullptr, 0, GgmlType::Q4_K, {512, 3, 2, 1});
  EXPECT_EQ(t.row_bytes(), 2u * 144u);
  EXPECT_EQ(t.nb[1], 288u);
  EXPECT_EQ(t.nb[2], 288u * 3);
  EXPECT_EQ(t.n_bytes(), 288u * 6);
  EXPECT_TRUE(t.is_contiguous());
  Tensor s = t.slice(1, 1, 2);
  EXPECT_EQ(s.offset, 288u);
  EXPECT_EQ(s.ne[1], 2);
  EXPECT_FALSE(s.is_contiguous());
  Tensor f = Tensor::make(nullptr, 0, GgmlType::F32, {8, 4, 1, 1}).reshape({32, 1, 1, 1});
  EXPECT_EQ(f.nb[1], 128u);
}

TEST(Backend, BuffersArenaAndWrap) {
  auto dev = make_cpu_device(2);
  EXPECT_EQ(dev->type(), DeviceType::Cpu);
  auto buf = dev->alloc(1000);
  ASSERT_NE(buf->host_ptr(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->host_ptr()) % 64, 0u);
  EXPECT_EQ(buf->size(), 1000u);
  // wrap() does not copy: the buffer is the caller's memory.
  std::vector<float> ext(64, 1.5f);
  auto w = dev->wrap(ext.data(), ext.size() * 4);
  EXPECT_EQ(w->host_ptr(), ext.data());
  // Arena: aligned, non-overlapping offsets; one buffer.
  Arena arena;
  const size_t a = arena.reserve_tensor(GgmlType::F32, {100, 3, 1, 1});
  const size_t b = arena.reserve(7, 16);
  const size_t c = arena.reserve_tensor(GgmlType::F16, {64, 1, 1, 1});
  EXPECT_EQ(a % 64, 0u);
  EXPECT_GE(b, a + 1200);
  EXPECT_EQ(b % 16, 0u);
  EXPECT_GE(c, b + 7);
  EXPECT_EQ(c % 64, 0u);
  arena.allocate(*dev);
  ASSERT_NE(arena.buffer(), nullptr);
  EXPECT_GE(arena.buffer()->size(), arena.planned());
  Buffer* first = arena.buffer();
  arena.reset();
  arena.reserve(10);
  arena.allocate(*dev);
  EXPECT_EQ(arena.buffer(), first);  // a smaller plan reuses the buffer
}

TEST(Backend, StreamMatmulOnWrappedWeightsNoWorkspaceGrowth) {
  auto dev = make_cpu_device(2);
  auto st = dev->create_stream();
  const int64_t k = 512, n = 40, m = 3;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
    // Weights live in caller memory (as they would in the GGUF mapping) and are used in place.
    const size_t rs = tensor::row_size(t, k);
    std::vector<uint8_t> wbytes(rs * n);
    const auto wf = randv(size_t(k * n), 3);
    for (int64_t j = 0; j < n; ++j) tensor::quantize_row(t, wf.data() + j * k, wbytes.data() + j * rs, k);
    auto wbuf = dev->wrap(wbytes.data(), wbytes.size());
    const Tensor W = Tensor::make(wbuf.get(), 0, t, {k, n, 1, 1});

    Arena arena;
    const size_t xo = arena.reserve_tensor(GgmlType::F32, {k, m, 1, 1});
    const size_t yo = arena.reserve_tensor(GgmlType::F32, {n, m, 1, 1});
    arena.allocate(*dev);
    const Tensor X = arena.tensor(xo, GgmlType::F32, {k, m, 1, 1});
    const Tensor Y = arena.tensor(yo, GgmlType::F32, {n, m, 1, 1});
    st->reserve_workspace(st->matmul_workspace(t, k, n, m));

    const auto x = randv(size_t(k * m), 4);
    st->upload(X, x.data(), x.size() * 4);
    for (int rep = 0; rep < 3; ++rep) st->matmul(W, X, Y);
    std::vector<float> got(size_t(n * m)), want(size_t(n * m));
    st->download(got.data(), Y, got.size() * 4);
    st->synchronize();
    kernels::MatmulArgs a{t, wbytes.data(), rs, k, n, m, x.data(), k, want.data(), n};
    ref::matmul(a);
    EXPECT_LE(nmse(got, want), 1e-4) << gguf::type_name(t);
    EXPECT_EQ(st->workspace_grows(), 0) << gguf::type_name(t);
  }
}

namespace {

// A host buffer of `floats` floats viewed as tensors at float offsets (optionally strided).
struct HostBuf {
  std::unique_ptr<Buffer> buf;
  HostBuf(Device& dev, size_t bytes) : buf(dev.alloc(bytes)) { std::memset(buf->host_ptr(), 0, bytes); }
  Tensor t(size_t off_bytes, GgmlType type, std::array<int64_t, 4> ne) const {
    return Tensor::make(buf.get(), off_bytes, type, ne);
  }
  template <class T>
  T* at(size_t off_bytes) const { return reinterpret_cast<T*>(static_cast<char*>(buf->host_ptr()) + off_bytes); }
};

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

}  // namespace

TEST(Backend, StreamOpsMatchReference) {
  auto dev = make_cpu_device(3);
  auto st = dev->create_stream();
  const int64_t D = 64, Hq = 4, Hkv = 2, T = 5, n_ctx = 16;
  Arena arena;
  const size_t qo = arena.reserve_tensor(GgmlType::F32, {D, Hq, T, 1});
  const size_t oo = arena.reserve_tensor(GgmlType::F32, {D, Hq, T, 1});
  const size_t ko = arena.reserve_tensor(GgmlType::F32, {D, Hkv, T, 1});
  const size_t po = arena.reserve_tensor(GgmlType::I32, {T, 1, 1, 1});
  const size_t so = arena.reserve_tensor(GgmlType::I32, {T, 1, 1, 1});
  const size_t kc = arena.reserve_tensor(GgmlType::F16, {D, Hkv, n_ctx, 1});
  const size_t vc = arena.reserve_tensor(GgmlType::F16, {D, Hkv, n_ctx, 1});
  arena.allocate(*dev);
  const Tensor Q = arena.tensor(qo, GgmlType::F32, {D, Hq, T, 1});
  const Tensor O = arena.tensor(oo, GgmlType::F32, {D, Hq, T, 1});
  const Tensor Kx = arena.tensor(ko, GgmlType::F32, {D, Hkv, T, 1});
  const Tensor P = arena.tensor(po, GgmlType::I32, {T, 1, 1, 1});
  const Tensor S = arena.tensor(so, GgmlType::I32, {T, 1, 1, 1});
  const Tensor KC = arena.tensor(kc, GgmlType::F16, {D, Hkv, n_ctx, 1});
  const Tensor VC = arena.tensor(vc, GgmlType::F16, {D, Hkv, n_ctx, 1});

  const auto q = randv(size_t(D * Hq * T), 1), kx = randv(size_t(D * Hkv * T), 2);
  const int32_t pos[T] = {0, 1, 2, 3, 4}, seq[T] = {0, 0, 0, 0, 0};
  st->upload(Q, q.data(), q.size() * 4);
  st->upload(Kx, kx.data(), kx.size() * 4);
  st->upload(P, pos, sizeof pos);
  st->upload(S, seq, sizeof seq);
  // rope q and k, store k (and k as v) into F16 caches, attend over positions 0..4.
  kernels::RopeParams rp{32, true, 10000.f, 1.f};
  st->rope(Q, P, rp);
  st->rope(Kx, P, rp);
  st->kv_store(Kx, S, P, KC);
  st->kv_store(Kx, S, P, VC);
  AttnSpec spec{D, Hq, Hkv, 0.125f, true};
  st->reserve_workspace(st->attention_workspace(spec, T, n_ctx));
  st->attention(Q, S, P, KC, VC, spec, O);
  std::vector<float> got(q.size());
  st->download(got.data(), O, got.size() * 4);
  st->synchronize();
  EXPECT_EQ(st->workspace_grows(), 0);

  std::vector<float> rq = q, rk = kx, want(q.size());
  ref::rope(kernels::rows3(rq.data(), D, Hq, T), pos, rp);
  ref::rope(kernels::rows3(rk.data(), D, Hkv, T), pos, rp);
  const size_t rs = tensor::row_size(GgmlType::F16, D);
  std::vector<uint8_t> cache(rs * Hkv * T);
  ref::kv_store(GgmlType::F16, kernels::crows3(rk.data(), D, Hkv, T), pos, cache.data(), rs * Hkv, rs);
  kernels::KvView kv{GgmlType::F16, cache.data(), rs * Hkv, rs, T};
  kernels::AttnParams ap{D, Hq, Hkv, 0.125f};
  ref::attention(kernels::crows3(rq.data(), D, Hq, T), pos, kv, kv, ap, kernels::rows3(want.data(), D, Hq, T));
  EXPECT_LE(nmse(got, want), 1e-9);
}

// unary / binary / scale: one kernel call per row (rows strided, odd lengths), binary's three b
// shapes; on every ISA level (the AVX-512 silu / swiglu leave a row's n % 16 tail to libm, so the
// row split is visible in the bits). Scalar-per-row b: the kernel with b's scalar repeated.
TEST(Backend, ElementwiseOpsRunPerRow) {
  IsaGuard guard;
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  for (int64_t ne0 : {int64_t(37), int64_t(300)}) {
    const int64_t n1 = 3, n2 = 2, s1 = ne0 + 5, s2 = s1 * n1 + 3;  // strides in floats
    const size_t span = size_t(s2 * n2) * 4;
    HostBuf h(*dev, 5 * span + size_t(ne0 + n1 * n2) * 4);
    auto rows = [&](size_t base) {
      Tensor t = h.t(base, GgmlType::F32, {ne0, n1, n2, 1});
      t.nb[1] = size_t(s1) * 4;
      t.nb[2] = size_t(s2) * 4;
      return t;
    };
    const Tensor A = rows(0), B = rows(span), Y = rows(2 * span), W = rows(3 * span);
    const Tensor Brow = h.t(5 * span, GgmlType::F32, {ne0, 1, 1, 1});
    const Tensor Bsc = h.t(5 * span + size_t(ne0) * 4, GgmlType::F32, {1, n1, n2, 1});
    const auto va = randv(size_t(s2 * n2), 21, -6.f, 6.f), vb = randv(size_t(s2 * n2), 22, -6.f, 6.f);
    const auto vrow = randv(size_t(ne0), 23, -3.f, 3.f), vsc = randv(size_t(n1 * n2), 24, -3.f, 3.f);
    std::memcpy(A.host(), va.data(), span);
    std::memcpy(B.host(), vb.data(), span);
    std::memcpy(Brow.host(), vrow.data(), vrow.size() * 4);
    std::memcpy(Bsc.host(), vsc.data(), vsc.size() * 4);
    auto row = [&](const Tensor& t, int64_t i1, int64_t i2) {
      return reinterpret_cast<float*>(static_cast<char*>(t.host()) + i1 * t.nb[1] + i2 * t.nb[2]);
    };
    auto check = [&](const char* what) {
      for (int64_t i2 = 0; i2 < n2; ++i2)
        for (int64_t i1 = 0; i1 < n1; ++i1)
          ASSERT_TRUE(same_bits(row(Y, i1, i2), row(W, i1, i2), size_t(ne0) * 4)) << what << " row " << i1 << "," << i2;
    };
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(kernels::set_isa(isa));
      SCOPED_TRACE(std::string(isa_name(isa)) + " ne0 " + std::to_string(ne0));
      for (Unary op : {Unary::Silu, Unary::Sigmoid, Unary::Softplus}) {
        st->unary(op, A, Y);
        for (int64_t i2 = 0; i2 < n2; ++i2)
          for (int64_t i1 = 0; i1 < n1; ++i1) {
            auto f = op == Unary::Silu ? kernels::silu : op == Unary::Sigmoid ? kernels::sigmoid : kernels::softplus;
            f(row(A, i1, i2), row(W, i1, i2), ne0);
          }
        check("unary");
      }
      using BinFn = void (*)(const float*, const float*, float*, int64_t);
      const std::pair<Binary, BinFn> ops[] = {{Binary::Add, kernels::add},
                                               {Binary::Mul, kernels::mul},
                                               {Binary::SwiGlu, kernels::swiglu},
                                               {Binary::SigmoidMul, kernels::sigmoid_mul}};
      std::vector<float> rep(static_cast<size_t>(ne0));
      for (auto [op, f] : ops) {
        st->binary(op, A, B, Y);
        for (int64_t i2 = 0; i2 < n2; ++i2)
          for (int64_t i1 = 0; i1 < n1; ++i1) f(row(A, i1, i2), row(B, i1, i2), row(W, i1, i2), ne0);
        check("binary, same shape");
        st->binary(op, A, Brow, Y);
        for (int64_t i2 = 0; i2 < n2; ++i2)
          for (int64_t i1 = 0; i1 < n1; ++i1) f(row(A, i1, i2), vrow.data(), row(W, i1, i2), ne0);
        check("binary, one row");
        st->binary(op, A, Bsc, Y);
        for (int64_t i2 = 0; i2 < n2; ++i2)
          for (int64_t i1 = 0; i1 < n1; ++i1) {
            std::fill(rep.begin(), rep.end(), vsc[size_t(i2 * n1 + i1)]);
            f(row(A, i1, i2), rep.data(), row(W, i1, i2), ne0);
          }
        check("binary, scalar per row");
      }
      st->scale(A, 0.37f, Y);
      for (int64_t i2 = 0; i2 < n2; ++i2)
        for (int64_t i1 = 0; i1 < n1; ++i1) kernels::scale(row(A, i1, i2), 0.37f, row(W, i1, i2), ne0);
      check("scale");
      // In place (y = a).
      std::memcpy(Y.host(), va.data(), span);
      st->binary(Binary::SwiGlu, Y, B, Y);
      for (int64_t i2 = 0; i2 < n2; ++i2)
        for (int64_t i1 = 0; i1 < n1; ++i1) kernels::swiglu(row(A, i1, i2), row(B, i1, i2), row(W, i1, i2), ne0);
      check("binary in place");
    }
  }
}

TEST(Backend, HadamardAndFillZero) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const int64_t D = 128, H = 3, T = 4, s2 = D * H + 16;
  HostBuf h(*dev, size_t(s2 * T) * 8);
  Tensor X = h.t(0, GgmlType::F32, {D, H, T, 1});
  X.nb[2] = size_t(s2) * 4;
  const auto v = randv(size_t(s2 * T), 31);
  std::memcpy(X.host(), v.data(), v.size() * 4);
  std::vector<float> want = v;
  st->hadamard(X, 64);
  kernels::hadamard(kernels::Rows{want.data(), D, H, T, D, s2}, 64, pool);
  EXPECT_TRUE(same_bits(X.host(), want.data(), want.size() * 4));
  // fill_zero on a strided 4-D view touches exactly its rows.
  std::vector<uint8_t> ones(size_t(s2 * T) * 8, 0xff);
  std::memcpy(h.buf->host_ptr(), ones.data(), ones.size());
  Tensor Z = h.t(0, GgmlType::F16, {32, 2, 3, 2});
  Z.nb[1] = 128, Z.nb[2] = 512, Z.nb[3] = 4096;
  st->fill_zero(Z);
  const auto* b = static_cast<const uint8_t*>(h.buf->host_ptr());
  for (size_t i = 0; i < ones.size(); ++i) {
    const size_t in_row = i % 128, r1 = (i / 128) % 4, r2 = (i / 512) % 8, r3 = i / 4096;
    const bool inside = in_row < 64 && r1 < 2 && r2 < 3 && r3 < 2;
    ASSERT_EQ(b[i], inside ? 0 : 0xff) << i;
  }
}

// matmul_id: per expert, the routed slots in (t, j) order through one expert matmul — bit for bit
// as kiln's MoE FFN gathered them — and close to the reference per slot. x with nx = 1 and nx = K.
TEST(Backend, MatmulIdGathersPerExpert) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const int64_t k = 256, n = 24, X = 6, Kx = 3, T = 7;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(size_t(Kx * T));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(static_cast<size_t>(X));
    for (int32_t i = 0; i < X; ++i) e[size_t(i)] = i;
    std::shuffle(e.begin(), e.end(), rng);
    for (int64_t j = 0; j < Kx; ++j) ids[size_t(t * Kx + j)] = e[size_t(j)];
  }
  for (GgmlType wt : {GgmlType::F32, GgmlType::Q4_K, GgmlType::Q8_0}) {
    const auto wf = randv(size_t(k * n * X), 41);
    const auto wbytes = weight_rows(wt, wf.data(), k, n * X);
    auto wbuf = dev->wrap(wbytes.data(), wbytes.size());
    const Tensor W = Tensor::make(wbuf.get(), 0, wt, {k, n, X, 1});
    for (int64_t nx : {int64_t(1), Kx}) {
      SCOPED_TRACE(std::string(gguf::type_name(wt)) + " nx " + std::to_string(nx));
      HostBuf h(*dev, size_t(k * nx * T + n * Kx * T) * 4 + 4096);
      const Tensor Xt = h.t(0, GgmlType::F32, {k, nx, T, 1});
      const Tensor Ids = h.t(size_t(k * nx * T) * 4, GgmlType::I32, {Kx, T, 1, 1});
      const Tensor Y = h.t(size_t(k * nx * T + Kx * T) * 4 + 64, GgmlType::F32, {n, Kx, T, 1});
      const auto xv = randv(size_t(k * nx * T), 42);
      std::memcpy(Xt.host(), xv.data(), xv.size() * 4);
      std::memcpy(Ids.host(), ids.data(), ids.size() * 4);
      st->reserve_workspace(st->matmul_id_workspace(wt, k, n, Kx * T));
      const int grows = st->workspace_grows();
      st->matmul_id(W, Xt, Ids, Y);
      EXPECT_EQ(st->workspace_grows(), grows);
      std::vector<float> want(size_t(n * Kx * T)), xg, yg;
      for (int64_t e = 0; e < X; ++e) {
        std::vector<int64_t> slots;
        xg.clear();
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < Kx; ++j)
            if (ids[size_t(t * Kx + j)] == e) {
              slots.push_back(t * Kx + j);
              const float* c = xv.data() + (t * nx + (nx > 1 ? j : 0)) * k;
              xg.insert(xg.end(), c, c + k);
            }
        if (slots.empty()) continue;
        const int64_t m = int64_t(slots.size());
        yg.assign(size_t(n * m), 0.f);
        const size_t rs = tensor::row_size(wt, k);
        run_matmul(matmul_args(wt, wbytes.data() + size_t(e * n) * rs, rs, k, n, m, xg.data(), k, yg.data(), n, true),
                   pool);
        for (int64_t i = 0; i < m; ++i)
          std::copy_n(yg.data() + i * n, n, want.data() + slots[size_t(i)] * n);
      }
      EXPECT_TRUE(same_bits(Y.host(), want.data(), want.size() * 4));
      // Against the reference, slot by slot.
      std::vector<float> r(size_t(n * Kx * T));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < Kx; ++j) {
          const int64_t e = ids[size_t(t * Kx + j)];
          const size_t rs = tensor::row_size(wt, k);
          ref::matmul(matmul_args(wt, wbytes.data() + size_t(e * n) * rs, rs, k, n, 1,
                                  xv.data() + (t * nx + (nx > 1 ? j : 0)) * k, k, r.data() + (t * Kx + j) * n, n));
        }
      EXPECT_LE(nmse(Y.host_as<float>(), r.data(), r.size()), 1e-4);
    }
  }
}

namespace {
// Three slots in one batch: slot 2 continues a run of 5 tokens from position 33, slot 0 brings one
// token at position 40, slot 1 starts with 2 tokens at position 0.
struct SeqBatch {
  static constexpr int64_t T = 8, n_seq = 3;
  const int32_t seq[T] = {2, 2, 2, 2, 2, 0, 1, 1};
  const int32_t pos[T] = {33, 34, 35, 36, 37, 40, 0, 1};
  struct Run {
    int64_t t0, n;
  };
  const Run runs[3] = {{0, 5}, {5, 1}, {6, 2}};
};
}  // namespace

// kv_store + attention over several sequences in one call = the per-run kernel calls (n_kv = pos0 + n;
// flash off: GgmlTiny for runs of >= 2 tokens, GgmlVec for one), bit for bit, caches included.
TEST(Backend, KvStoreAndAttentionPerRun) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const SeqBatch sb;
  const int64_t D = 128, Hq = 4, Hkv = 2, n_ctx = 48, T = SeqBatch::T, S = SeqBatch::n_seq;
  for (GgmlType ct : {GgmlType::F16, GgmlType::Q8_0}) {
    for (bool flash : {true, false}) {
      SCOPED_TRACE(std::string(gguf::type_name(ct)) + (flash ? " flash" : " non-flash"));
      const size_t rs = tensor::row_size(ct, D), cache_bytes = rs * size_t(Hkv * n_ctx * S);
      const size_t qb = size_t(D * Hq * T) * 4, kb = size_t(D * Hkv * T) * 4;
      HostBuf h(*dev, 2 * cache_bytes + 2 * qb + 2 * kb + 1024);
      size_t off = 0;
      auto take = [&](size_t bytes) { const size_t o = off; off += (bytes + 63) / 64 * 64; return o; };
      const Tensor KC = h.t(take(cache_bytes), ct, {D, Hkv, n_ctx, S}), VC = h.t(take(cache_bytes), ct, {D, Hkv, n_ctx, S});
      const Tensor Q = h.t(take(qb), GgmlType::F32, {D, Hq, T, 1}), O = h.t(take(qb), GgmlType::F32, {D, Hq, T, 1});
      const Tensor Kx = h.t(take(kb), GgmlType::F32, {D, Hkv, T, 1}), Vx = h.t(take(kb), GgmlType::F32, {D, Hkv, T, 1});
      const Tensor Sq = h.t(take(T * 4), GgmlType::I32, {T, 1, 1, 1}), Ps = h.t(take(T * 4), GgmlType::I32, {T, 1, 1, 1});
      std::memcpy(Sq.host(), sb.seq, sizeof sb.seq);
      std::memcpy(Ps.host(), sb.pos, sizeof sb.pos);
      // Earlier positions of every slot: random cache contents.
      std::vector<uint8_t> hist(2 * cache_bytes);
      {
        const auto f = randv(size_t(D * Hkv * n_ctx * S) * 2, 51);
        for (size_t r = 0; r < size_t(Hkv * n_ctx * S) * 2; ++r)
          tensor::quantize_row(ct, f.data() + r * size_t(D), hist.data() + r * rs, D);
      }
      std::memcpy(KC.host(), hist.data(), cache_bytes);
      std::memcpy(VC.host(), hist.data() + cache_bytes, cache_bytes);
      const auto q = randv(size_t(D * Hq * T), 52), kx = randv(size_t(D * Hkv * T), 53), vx = randv(size_t(D * Hkv * T), 54);
      std::memcpy(Q.host(), q.data(), qb);
      std::memcpy(Kx.host(), kx.data(), kb);
      std::memcpy(Vx.host(), vx.data(), kb);
      const AttnSpec spec{D, Hq, Hkv, 0.125f, flash};
      st->kv_store(Kx, Sq, Ps, KC);
      st->kv_store(Vx, Sq, Ps, VC);
      st->attention(Q, Sq, Ps, KC, VC, spec, O);

      std::vector<uint8_t> kc(hist.begin(), hist.begin() + ptrdiff_t(cache_bytes)), vc(hist.begin() + ptrdiff_t(cache_bytes), hist.end());
      std::vector<float> want(size_t(D * Hq * T));
      const size_t slot_bytes = rs * size_t(Hkv * n_ctx);
      kernels::AttnParams ap{D, Hq, Hkv, 0.125f};
      for (const auto& r : sb.runs) {
        const int32_t s = sb.seq[r.t0];
        const int32_t* p = sb.pos + r.t0;
        kernels::kv_store(ct, kernels::crows3(kx.data() + r.t0 * D * Hkv, D, Hkv, r.n), p, kc.data() + s * slot_bytes,
                          rs * Hkv, rs);
        kernels::kv_store(ct, kernels::crows3(vx.data() + r.t0 * D * Hkv, D, Hkv, r.n), p, vc.data() + s * slot_bytes,
                          rs * Hkv, rs);
        ap.order = flash ? kernels::AttnOrder::Flash : r.n >= 2 ? kernels::AttnOrder::GgmlTiny : kernels::AttnOrder::GgmlVec;
        const kernels::KvView kv{ct, kc.data() + s * slot_bytes, rs * Hkv, rs, p[0] + r.n};
        const kernels::KvView vv{ct, vc.data() + s * slot_bytes, rs * Hkv, rs, p[0] + r.n};
        kernels::attention(kernels::crows3(q.data() + r.t0 * D * Hq, D, Hq, r.n), p, kv, vv, ap,
                           kernels::rows3(want.data() + r.t0 * D * Hq, D, Hq, r.n), pool);
      }
      EXPECT_TRUE(same_bits(KC.host(), kc.data(), cache_bytes));
      EXPECT_TRUE(same_bits(VC.host(), vc.data(), cache_bytes));
      EXPECT_TRUE(same_bits(O.host(), want.data(), want.size() * 4));
    }
  }
}

// An encoder's attention (AttnSpec::causal = false): every token sees all n_ctx positions of its slot,
// whatever pos says — the flash kernel with every query's last key at n_ctx - 1, bit for bit, and the
// scalar reference within 1e-5.
TEST(Backend, AttentionNotCausal) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const int64_t D = 72, Hq = 4, Hkv = 2, n_ctx = 40, S = 2, T = 7;
  const int32_t seq[T] = {0, 0, 0, 0, 1, 1, 1}, pos[T] = {0, 1, 2, 3, 5, 6, 7};  // pos: not read
  for (GgmlType ct : {GgmlType::F32, GgmlType::F16}) {
    SCOPED_TRACE(gguf::type_name(ct));
    const size_t rs = tensor::row_size(ct, D), cache_bytes = rs * size_t(Hkv * n_ctx * S), qb = size_t(D * Hq * T) * 4;
    HostBuf h(*dev, 2 * cache_bytes + 2 * qb + 1024);
    size_t off = 0;
    auto take = [&](size_t bytes) { const size_t o = off; off += (bytes + 63) / 64 * 64; return o; };
    const Tensor KC = h.t(take(cache_bytes), ct, {D, Hkv, n_ctx, S}), VC = h.t(take(cache_bytes), ct, {D, Hkv, n_ctx, S});
    const Tensor Q = h.t(take(qb), GgmlType::F32, {D, Hq, T, 1}), O = h.t(take(qb), GgmlType::F32, {D, Hq, T, 1});
    const Tensor Sq = h.t(take(T * 4), GgmlType::I32, {T, 1, 1, 1}), Ps = h.t(take(T * 4), GgmlType::I32, {T, 1, 1, 1});
    std::memcpy(Sq.host(), seq, sizeof seq);
    std::memcpy(Ps.host(), pos, sizeof pos);
    const auto f = randv(size_t(D * Hkv * n_ctx * S) * 2, 71), q = randv(size_t(D * Hq * T), 72);
    std::vector<uint8_t> kv(2 * cache_bytes);
    for (size_t r = 0; r < size_t(Hkv * n_ctx * S) * 2; ++r) tensor::quantize_row(ct, f.data() + r * size_t(D), kv.data() + r * rs, D);
    std::memcpy(KC.host(), kv.data(), cache_bytes);
    std::memcpy(VC.host(), kv.data() + cache_bytes, cache_bytes);
    std::memcpy(Q.host(), q.data(), qb);
    AttnSpec spec{D, Hq, Hkv, 0.125f, true};
    spec.causal = false;
    st->attention(Q, Sq, Ps, KC, VC, spec, O);

    std::vector<float> want(size_t(D * Hq * T)), ref(want.size());
    const std::vector<int32_t> last(T, int32_t(n_ctx - 1));
    const kernels::AttnParams ap{D, Hq, Hkv, 0.125f};
    const size_t slot_bytes = rs * size_t(Hkv * n_ctx);
    for (int64_t t0 : {0, 4}) {  // the two runs
      const int64_t n = t0 == 0 ? 4 : 3, s = seq[t0];
      const kernels::KvView kk{ct, kv.data() + s * slot_bytes, rs * Hkv, rs, n_ctx};
      const kernels::KvView vv{ct, kv.data() + cache_bytes + s * slot_bytes, rs * Hkv, rs, n_ctx};
      kernels::attention(kernels::crows3(q.data() + t0 * D * Hq, D, Hq, n), last.data(), kk, vv, ap,
                         kernels::rows3(want.data() + t0 * D * Hq, D, Hq, n), pool);
      kernels::ref::attention(kernels::crows3(q.data() + t0 * D * Hq, D, Hq, n), last.data(), kk, vv, ap,
                              kernels::rows3(ref.data() + t0 * D * Hq, D, Hq, n));
    }
    EXPECT_TRUE(same_bits(O.host(), want.data(), want.size() * 4));
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, double(std::fabs(O.host_as<float>()[i] - ref[i])));
    EXPECT_LE(e, 1e-5);
    // The causal call on the same inputs differs (token 0 of slot 0 sees one key there).
    spec.causal = true;
    std::vector<int32_t> cpos = {0, 1, 2, 3, 0, 1, 2};
    std::memcpy(Ps.host(), cpos.data(), sizeof pos);
    st->attention(Q, Sq, Ps, KC, VC, spec, O);
    EXPECT_FALSE(same_bits(O.host(), want.data(), want.size() * 4));
  }
}

// conv1d_silu over several sequences in one call = one kernel call per run on that slot's state.
TEST(Backend, Conv1dSiluPerRun) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const SeqBatch sb;
  const int64_t C = 40, dc = 4, T = SeqBatch::T, S = SeqBatch::n_seq, xs = C + 8;
  HostBuf h(*dev, size_t(xs * T + dc * C + (dc - 1) * C * S) * 4 + 256);
  Tensor Xt = h.t(0, GgmlType::F32, {C, T, 1, 1});
  Xt.nb[1] = size_t(xs) * 4;
  const Tensor Wt = h.t(size_t(xs * T) * 4, GgmlType::F32, {dc, C, 1, 1});
  const Tensor St = h.t(size_t(xs * T + dc * C) * 4, GgmlType::F32, {dc - 1, C, 1, S});
  const Tensor Sq = h.t(size_t(xs * T + dc * C + (dc - 1) * C * S) * 4, GgmlType::I32, {T, 1, 1, 1});
  const auto x = randv(size_t(xs * T), 61), w = randv(size_t(dc * C), 62), s0 = randv(size_t((dc - 1) * C * S), 63);
  std::memcpy(Xt.host(), x.data(), x.size() * 4);
  std::memcpy(Wt.host(), w.data(), w.size() * 4);
  std::memcpy(St.host(), s0.data(), s0.size() * 4);
  std::memcpy(Sq.host(), sb.seq, sizeof sb.seq);
  st->conv1d_silu(Xt, Wt, Sq, St, Xt);  // in place, as the model runs it
  std::vector<float> wx = x, ws = s0;
  for (const auto& r : sb.runs)
    kernels::conv1d_silu(wx.data() + r.t0 * xs, xs, w.data(), ws.data() + sb.seq[r.t0] * (dc - 1) * C,
                         wx.data() + r.t0 * xs, xs, C, r.n, int(dc), pool);
  EXPECT_TRUE(same_bits(Xt.host(), wx.data(), wx.size() * 4));
  EXPECT_TRUE(same_bits(St.host(), ws.data(), ws.size() * 4));
}

// gated_delta over several sequences in one call = one kernel call per run: runs of at least `chunk`
// tokens the chunked form (chunk length 64), shorter ones the recurrence; chunk = 0 never chunked.
TEST(Backend, GatedDeltaPerRunAndChunkThreshold) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const int64_t S = 32, Hk = 1, Hv = 2, n_seq = 3;
  const int32_t lens[3] = {70, 5, 1};  // slots 1, 0, 2
  const int32_t slot_of[3] = {1, 0, 2};
  const int64_t T = 76, tok = 2 * S * Hk + S * Hv;  // per-token [q | k | v], as the conv output
  std::vector<int32_t> seq;
  for (int r = 0; r < 3; ++r) seq.insert(seq.end(), size_t(lens[r]), slot_of[r]);
  auto qkv = randv(size_t(tok * T), 71);
  for (int64_t t = 0; t < T; ++t)
    ref::l2_norm(kernels::crows3(qkv.data() + t * tok, S, 2 * Hk), kernels::rows3(qkv.data() + t * tok, S, 2 * Hk), 1e-6f);
  const auto gv = randv(size_t(Hv * T), 72, -1.f, -0.05f), bv = randv(size_t(Hv * T), 73, 0.1f, 0.9f);
  const auto s0 = randv(size_t(S * S * Hv * n_seq), 74, -0.2f, 0.2f);
  const size_t qkv_b = size_t(tok * T) * 4, gb = size_t(Hv * T) * 4, sb = s0.size() * 4, ob = size_t(S * Hv * T) * 4;
  for (int chunk : {0, 16, 71}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    HostBuf h(*dev, qkv_b + 2 * gb + sb + ob + size_t(T) * 4 + 512);
    size_t off = 0;
    auto take = [&](size_t bytes) { const size_t o = off; off += (bytes + 63) / 64 * 64; return o; };
    const size_t oq = take(qkv_b);
    auto view = [&](size_t float_off, std::array<int64_t, 4> ne) {
      Tensor t = h.t(oq + float_off * 4, GgmlType::F32, ne);
      t.nb[2] = size_t(tok) * 4;
      return t;
    };
    const Tensor Qt = view(0, {S, Hk, T, 1}), Kt = view(size_t(S * Hk), {S, Hk, T, 1}), Vt = view(size_t(2 * S * Hk), {S, Hv, T, 1});
    const Tensor G = h.t(take(gb), GgmlType::F32, {Hv, T, 1, 1}), B = h.t(take(gb), GgmlType::F32, {Hv, T, 1, 1});
    const Tensor St = h.t(take(sb), GgmlType::F32, {S, S, Hv, n_seq}), O = h.t(take(ob), GgmlType::F32, {S, Hv, T, 1});
    const Tensor Sq = h.t(take(size_t(T) * 4), GgmlType::I32, {T, 1, 1, 1});
    std::memcpy(Qt.host(), qkv.data(), qkv_b);
    std::memcpy(G.host(), gv.data(), gb);
    std::memcpy(B.host(), bv.data(), gb);
    std::memcpy(St.host(), s0.data(), sb);
    std::memcpy(Sq.host(), seq.data(), size_t(T) * 4);
    st->reserve_workspace(st->gated_delta_workspace(S, Hv, chunk, T));
    const int grows = st->workspace_grows();
    st->gated_delta(Qt, Kt, Vt, G, B, Sq, St, O, chunk);
    EXPECT_EQ(st->workspace_grows(), grows);

    std::vector<float> ws = s0, wo(size_t(S * Hv * T));
    AlignedWs dws(kernels::gated_delta_chunked_workspace(S, 64, pool.size()));
    int64_t t0 = 0;
    for (int r = 0; r < 3; ++r) {
      kernels::DeltaArgs a;
      a.q = qkv.data() + t0 * tok; a.k = a.q + S * Hk; a.qk_stride = tok; a.v = a.q + 2 * S * Hk; a.v_stride = tok;
      a.g = gv.data() + t0 * Hv; a.beta = bv.data() + t0 * Hv; a.state = ws.data() + slot_of[r] * S * S * Hv;
      a.out = wo.data() + t0 * S * Hv; a.out_stride = S * Hv; a.S = S; a.Hk = Hk; a.Hv = Hv; a.n_t = lens[r];
      if (chunk > 0 && lens[r] >= chunk) kernels::gated_delta_rule_chunked(a, 64, dws.p, pool);
      else kernels::gated_delta_rule(a, pool);
      t0 += lens[r];
    }
    EXPECT_TRUE(same_bits(O.host(), wo.data(), ob));
    EXPECT_TRUE(same_bits(St.host(), ws.data(), sb));
    // Chunked or not, the same results within float error (the scalar reference, one run at a time).
    std::vector<float> rs = s0, ro(size_t(S * Hv * T));
    t0 = 0;
    for (int r = 0; r < 3; ++r) {
      kernels::DeltaArgs a;
      a.q = qkv.data() + t0 * tok; a.k = a.q + S * Hk; a.qk_stride = tok; a.v = a.q + 2 * S * Hk; a.v_stride = tok;
      a.g = gv.data() + t0 * Hv; a.beta = bv.data() + t0 * Hv; a.state = rs.data() + slot_of[r] * S * S * Hv;
      a.out = ro.data() + t0 * S * Hv; a.out_stride = S * Hv; a.S = S; a.Hk = Hk; a.Hv = Hv; a.n_t = lens[r];
      ref::gated_delta_rule(a);
      t0 += lens[r];
    }
    EXPECT_LE(nmse(O.host_as<float>(), ro.data(), ro.size()), 1e-9);
    EXPECT_LE(nmse(St.host_as<float>(), rs.data(), rs.size()), 1e-9);
  }
}

// The fused ops are the op sequences their comments name, bit for bit (the CPU stream makes those
// very calls): on strided rows with odd lengths, on every ISA level (silu's per-row vector tail shows
// the row split in the bits), one fused call against the sequence on a copy of the same data.
TEST(Backend, FusedElementwiseOpsAreTheirSequences) {
  IsaGuard guard;
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  for (int64_t ne0 : {int64_t(37), int64_t(128), int64_t(300)}) {
    const int64_t n1 = 3, n2 = 2, s1 = ne0 + 5, s2 = s1 * n1 + 3;  // strides in floats
    const size_t span = size_t(s2 * n2) * 4;
    auto rows = [&](const HostBuf& h, size_t base) {
      Tensor t = h.t(base, GgmlType::F32, {ne0, n1, n2, 1});
      t.nb[1] = size_t(s1) * 4;
      t.nb[2] = size_t(s2) * 4;
      return t;
    };
    // Two identical buffers: [a | b | c | w row | bias row], a, b, c strided rows.
    const size_t bytes = 3 * span + 2 * size_t(ne0) * 4 + 64;
    HostBuf f(*dev, bytes), s(*dev, bytes);
    const auto va = randv(size_t(s2 * n2), 61, -6.f, 6.f), vb = randv(size_t(s2 * n2), 62, -25.f, 25.f),
               vc = randv(size_t(s2 * n2), 63, -3.f, 3.f), vw = randv(size_t(ne0), 64, 0.2f, 2.f),
               vd = randv(size_t(ne0), 65, -2.f, 2.f);
    auto fill = [&](const HostBuf& h) {
      std::memcpy(h.at<char>(0), va.data(), span);
      std::memcpy(h.at<char>(span), vb.data(), span);
      std::memcpy(h.at<char>(2 * span), vc.data(), span);
      std::memcpy(h.at<char>(3 * span), vw.data(), size_t(ne0) * 4);
      std::memcpy(h.at<char>(3 * span + size_t(ne0) * 4), vd.data(), size_t(ne0) * 4);
    };
    auto same = [&](const char* what) {
      ASSERT_TRUE(same_bits(f.at<char>(0), s.at<char>(0), 3 * span)) << what;
    };
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(kernels::set_isa(isa));
      SCOPED_TRACE(std::string(isa_name(isa)) + " ne0 " + std::to_string(ne0));
      const Tensor fa = rows(f, 0), fb = rows(f, span), fc = rows(f, 2 * span);
      const Tensor sa = rows(s, 0), sb = rows(s, span), sc = rows(s, 2 * span);
      const Tensor fw = f.t(3 * span, GgmlType::F32, {ne0, 1, 1, 1}), sw = s.t(3 * span, GgmlType::F32, {ne0, 1, 1, 1});
      const Tensor fd = f.t(3 * span + size_t(ne0) * 4, GgmlType::F32, {ne0, 1, 1, 1}),
                   sd = s.t(3 * span + size_t(ne0) * 4, GgmlType::F32, {ne0, 1, 1, 1});
      // delta_gates(beta = a, g = b, dt_bias = d, a = w).
      fill(f), fill(s);
      st->delta_gates(fa, fb, fd, fw);
      st->unary(Unary::Sigmoid, sa, sa);
      st->binary(Binary::Add, sb, sd, sb);
      st->unary(Unary::Softplus, sb, sb);
      st->binary(Binary::Mul, sb, sw, sb);
      same("delta_gates");
      // rms_norm_gated(x = a, w, z = c).
      fill(f), fill(s);
      st->rms_norm_gated(fa, fw, fc, 1e-6f);
      st->rms_norm(sa, &sw, sa, 1e-6f);
      st->unary(Unary::Silu, sc, sc);
      st->binary(Binary::Mul, sa, sc, sa);
      same("rms_norm_gated");
      // add_rms_norm(x = a, t = b, w, y = c); with w = nullptr; y = x in place.
      for (int variant = 0; variant < 3; ++variant) {
        fill(f), fill(s);
        const Tensor* wf = variant == 1 ? nullptr : &fw;
        const Tensor* ws = variant == 1 ? nullptr : &sw;
        st->add_rms_norm(fa, fb, wf, variant == 2 ? fa : fc, 1e-5f);
        st->binary(Binary::Add, sa, sb, sa);
        st->rms_norm(sa, ws, variant == 2 ? sa : sc, 1e-5f);
        same(variant == 0 ? "add_rms_norm" : variant == 1 ? "add_rms_norm, no weight" : "add_rms_norm in place");
      }
    }
  }
}

// matmul_n = n matmul calls with the same x, bit for bit: mixed weight types, n = 1..4, strided
// columns, m = 1 (mat-vec), 3, 8 and 40 (the batched paths).
TEST(Backend, MatmulNIsNMatmuls) {
  ThreadPool pool(2);
  auto dev = make_cpu_device(pool);
  auto st = dev->create_stream();
  const int64_t k = 512;
  const GgmlType types[4] = {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F32, GgmlType::IQ4_XS};
  const int64_t ns[4] = {40, 17, 8, 33};
  std::vector<std::vector<uint8_t>> wb(4);
  std::vector<std::unique_ptr<Buffer>> wbuf(4);
  Tensor W[4];
  for (int i = 0; i < 4; ++i) {
    const auto wf = randv(size_t(k * ns[i]), 70 + uint32_t(i));
    wb[size_t(i)] = weight_rows(types[i], wf.data(), k, ns[i]);
    wbuf[size_t(i)] = dev->wrap(wb[size_t(i)].data(), wb[size_t(i)].size());
    W[i] = Tensor::make(wbuf[size_t(i)].get(), 0, types[i], {k, ns[i], 1, 1});
  }
  for (int64_t m : {int64_t(1), int64_t(3), int64_t(8), int64_t(40)}) {
    for (int n = 1; n <= 4; ++n) {
      SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n));
      const int64_t xs = k + 7, ys = 41 + 3;  // column strides (floats)
      HostBuf h(*dev, size_t(xs * m + 8 * ys * m) * 4 + 256);
      Tensor X = h.t(0, GgmlType::F32, {k, m, 1, 1});
      X.nb[1] = size_t(xs) * 4;
      const auto xv = randv(size_t(xs * m), 80 + uint32_t(m));
      std::memcpy(X.host(), xv.data(), xv.size() * 4);
      Tensor Y[4], Z[4];
      for (int i = 0; i < 4; ++i) {
        Y[i] = h.t(size_t(xs * m + 2 * i * ys * m) * 4, GgmlType::F32, {ns[i], m, 1, 1});
        Z[i] = h.t(size_t(xs * m + (2 * i + 1) * ys * m) * 4, GgmlType::F32, {ns[i], m, 1, 1});
        Y[i].nb[1] = Z[i].nb[1] = size_t(ys) * 4;
      }
      size_t ws = 0;
      for (int i = 0; i < n; ++i) ws = std::max(ws, st->matmul_workspace(types[i], k, ns[i], m));
      st->reserve_workspace(ws);
      const int grows = st->workspace_grows();
      st->matmul_n(W, Y, n, X);
      EXPECT_EQ(st->workspace_grows(), grows);
      for (int i = 0; i < n; ++i) st->matmul(W[i], X, Z[i]);
      for (int i = 0; i < n; ++i)
        for (int64_t c = 0; c < m; ++c)
          ASSERT_TRUE(same_bits(Y[i].host_as<char>() + c * Y[i].nb[1], Z[i].host_as<char>() + c * Z[i].nb[1],
                                size_t(ns[i]) * 4))
              << "weight " << i << " column " << c;
    }
  }
}
