// The backend interface on the CPU device: buffers (owned and wrapped), tensor views, the arena,
// workspace planning, and ops through a Stream against the scalar references.
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
    st->reserve_workspace(st->matmul_workspace(t, k, m));

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

TEST(Backend, StreamOpsMatchReference) {
  auto dev = make_cpu_device(3);
  auto st = dev->create_stream();
  const int64_t D = 64, Hq = 4, Hkv = 2, T = 5, n_ctx = 16;
  Arena arena;
  const size_t qo = arena.reserve_tensor(GgmlType::F32, {D, Hq, T, 1});
  const size_t oo = arena.reserve_tensor(GgmlType::F32, {D, Hq, T, 1});
  const size_t ko = arena.reserve_tensor(GgmlType::F32, {D, Hkv, T, 1});
  const size_t po = arena.reserve_tensor(GgmlType::I32, {T, 1, 1, 1});
  const size_t kc = arena.reserve_tensor(GgmlType::F16, {D, Hkv, n_ctx, 1});
  const size_t vc = arena.reserve_tensor(GgmlType::F16, {D, Hkv, n_ctx, 1});
  arena.allocate(*dev);
  const Tensor Q = arena.tensor(qo, GgmlType::F32, {D, Hq, T, 1});
  const Tensor O = arena.tensor(oo, GgmlType::F32, {D, Hq, T, 1});
  const Tensor Kx = arena.tensor(ko, GgmlType::F32, {D, Hkv, T, 1});
  const Tensor P = arena.tensor(po, GgmlType::I32, {T, 1, 1, 1});
  const Tensor KC = arena.tensor(kc, GgmlType::F16, {D, Hkv, n_ctx, 1});
  const Tensor VC = arena.tensor(vc, GgmlType::F16, {D, Hkv, n_ctx, 1});

  const auto q = randv(size_t(D * Hq * T), 1), kx = randv(size_t(D * Hkv * T), 2);
  const int32_t pos[T] = {0, 1, 2, 3, 4};
  st->upload(Q, q.data(), q.size() * 4);
  st->upload(Kx, kx.data(), kx.size() * 4);
  st->upload(P, pos, sizeof pos);
  // rope q and k, store k (and k as v) into F16 caches, attend over positions 0..4.
  kernels::RopeParams rp{32, true, 10000.f, 1.f};
  st->rope(Q, P, rp);
  st->rope(Kx, P, rp);
  st->kv_store(Kx, P, KC);
  st->kv_store(Kx, P, VC);
  kernels::AttnParams ap{D, Hq, Hkv, 0.125f};
  st->attention(Q, P, KC.slice(2, 0, T), VC.slice(2, 0, T), ap, O);
  std::vector<float> got(q.size());
  st->download(got.data(), O, got.size() * 4);
  st->synchronize();

  std::vector<float> rq = q, rk = kx, want(q.size());
  ref::rope(kernels::rows3(rq.data(), D, Hq, T), pos, rp);
  ref::rope(kernels::rows3(rk.data(), D, Hkv, T), pos, rp);
  const size_t rs = tensor::row_size(GgmlType::F16, D);
  std::vector<uint8_t> cache(rs * Hkv * T);
  ref::kv_store(GgmlType::F16, kernels::crows3(rk.data(), D, Hkv, T), pos, cache.data(), rs * Hkv, rs);
  kernels::KvView kv{GgmlType::F16, cache.data(), rs * Hkv, rs, T};
  ref::attention(kernels::crows3(rq.data(), D, Hq, T), pos, kv, kv, ap, kernels::rows3(want.data(), D, Hq, T));
  EXPECT_LE(nmse(got, want), 1e-9);
}

TEST(Backend, StreamGatedDeltaChunkedEqualsRecurrent) {
  auto dev = make_cpu_device(2);
  auto st = dev->create_stream();
  const int64_t S = 32, Hk = 1, Hv = 2, T = 20;
  const int64_t tok = 2 * S * Hk + S * Hv;  // per-token [q | k | v], as the conv output
  auto buf = dev->alloc(size_t(tok * T) * 4 + size_t(2 * Hv * T) * 4 + size_t(2 * S * S * Hv) * 4 + size_t(2 * S * Hv * T) * 4);
  float* base = static_cast<float*>(buf->host_ptr());
  auto qkv = randv(size_t(tok * T), 7);
  for (int64_t t = 0; t < T; ++t) ref::l2_norm(kernels::crows3(qkv.data() + t * tok, S, 2 * Hk), kernels::rows3(qkv.data() + t * tok, S, 2 * Hk), 1e-6f);
  std::memcpy(base, qkv.data(), qkv.size() * 4);
  auto view = [&](size_t off_floats, std::array<int64_t, 4> ne, size_t tok_stride_floats) {
    Tensor t = Tensor::make(buf.get(), off_floats * 4, GgmlType::F32, ne);
    if (tok_stride_floats) t.nb[2] = tok_stride_floats * 4;
    return t;
  };
  const Tensor Qt = view(0, {S, Hk, T, 1}, size_t(tok)), Kt = view(size_t(S * Hk), {S, Hk, T, 1}, size_t(tok)),
               Vt = view(size_t(2 * S * Hk), {S, Hv, T, 1}, size_t(tok));
  size_t off = size_t(tok * T);
  const Tensor G = view(off, {Hv, T, 1, 1}, 0), B = view(off + size_t(Hv * T), {Hv, T, 1, 1}, 0);
  const auto gv = randv(size_t(Hv * T), 8, -1.f, -0.05f), bv = randv(size_t(Hv * T), 9, 0.1f, 0.9f);
  std::memcpy(G.host(), gv.data(), gv.size() * 4);
  std::memcpy(B.host(), bv.data(), bv.size() * 4);
  off += size_t(2 * Hv * T);
  const Tensor S1 = view(off, {S, S, Hv, 1}, 0), S2 = view(off + size_t(S * S * Hv), {S, S, Hv, 1}, 0);
  const auto s0 = randv(size_t(S * S * Hv), 10, -0.2f, 0.2f);
  std::memcpy(S1.host(), s0.data(), s0.size() * 4);
  std::memcpy(S2.host(), s0.data(), s0.size() * 4);
  off += size_t(2 * S * S * Hv);
  const Tensor O1 = view(off, {S, Hv, T, 1}, 0), O2 = view(off + size_t(S * Hv * T), {S, Hv, T, 1}, 0);
  st->gated_delta(Qt, Kt, Vt, G, B, S1, O1, 0);
  st->gated_delta(Qt, Kt, Vt, G, B, S2, O2, 8);
  st->synchronize();
  EXPECT_LE(nmse(O2.host_as<float>(), O1.host_as<float>(), size_t(S * Hv * T)), 1e-9);
  EXPECT_LE(nmse(S2.host_as<float>(), S1.host_as<float>(), size_t(S * S * Hv)), 1e-9);
  // The recurrent result equals the scalar reference.
  std::vector<float> rs = s0, ro(size_t(S * Hv * T));
  kernels::DeltaArgs a;
  a.q = qkv.data(); a.k = qkv.data() + S * Hk; a.qk_stride = tok; a.v = qkv.data() + 2 * S * Hk; a.v_stride = tok;
  a.g = gv.data(); a.beta = bv.data(); a.state = rs.data(); a.out = ro.data(); a.out_stride = S * Hv;
  a.S = S; a.Hk = Hk; a.Hv = Hv; a.n_t = T;
  ref::gated_delta_rule(a);
  EXPECT_LE(nmse(O1.host_as<float>(), ro.data(), ro.size()), 1e-9);
  EXPECT_LE(nmse(S1.host_as<float>(), rs.data(), rs.size()), 1e-9);
}
