// The CUDA backend through backend::cuda_device(0): buffers, transfers, strided copy / fill_zero,
// every elementwise / row op of kernels/cuda/elementwise.cu against the scalar references
// (kernels::ref, or the CPU op where ops.h's definition is the CPU's arithmetic) on odd, strided
// shapes, graph capture + replay, and workspace growth counting. Every test skips (with the
// reason) when no CUDA device is usable. Each comparison prints its max error next to its bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "kernel_test_util.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

using namespace kiln;
using namespace kiln::backend;
using kiln::kernels::testing::randv;
namespace K = kiln::kernels;
namespace ref = kiln::kernels::ref;

#define KILN_REQUIRE_CUDA()                                                                         \
  if (::kiln::backend::cuda_device_count() == 0)                                                   \
  GTEST_SKIP() << "no usable CUDA device: " << ::kiln::backend::cuda_unavailable_reason()

namespace {

// An F32 view [ne0, n1, n2] with padded strides inside a device buffer, and the host image of the
// whole buffer (gaps included, so writes outside the view show up as mismatches).
struct View {
  std::unique_ptr<Buffer> buf;
  std::vector<float> h;  // host image of the buffer, buf->size() / 4 floats
  Tensor t;
  K::Rows r;  // the same view on h
};

View make_view(Device& dev, int64_t ne0, int64_t n1, int64_t n2, int64_t pad1, int64_t pad2, uint32_t seed,
               float lo = -1.f, float hi = 1.f) {
  const int64_t off = 3, s1 = ne0 + pad1, s2 = s1 * n1 + pad2, total = off + s2 * n2 + 5;
  View v;
  v.buf = dev.alloc(size_t(total) * 4);
  v.h = randv(size_t(total), seed, lo, hi);
  v.t = Tensor::make(v.buf.get(), size_t(off) * 4, GgmlType::F32, {ne0, n1, n2, 1});
  v.t.nb[1] = size_t(s1) * 4;
  v.t.nb[2] = size_t(s2) * 4;
  v.t.nb[3] = v.t.nb[2] * size_t(n2);
  v.r = K::Rows{v.h.data() + off, ne0, n1, n2, s1, s2};
  return v;
}
Tensor whole(const View& v) { return Tensor::make(v.buf.get(), 0, GgmlType::F32, {int64_t(v.h.size()), 1, 1, 1}); }
void push(Stream& st, const View& v) { st.upload(whole(v), v.h.data(), v.h.size() * 4); }
std::vector<float> pull(Stream& st, const View& v) {
  std::vector<float> g(v.h.size());
  st.download(g.data(), whole(v), g.size() * 4);
  st.synchronize();
  return g;
}
// Contiguous device copy of host data.
template <class T>
std::pair<std::unique_ptr<Buffer>, Tensor> dev_vec(Device& dev, Stream& st, const std::vector<T>& v, GgmlType type,
                                                   std::array<int64_t, 4> ne) {
  auto b = dev.alloc(v.size() * sizeof(T));
  Tensor t = Tensor::make(b.get(), 0, type, ne);
  st.upload(t, v.data(), v.size() * sizeof(T));
  return {std::move(b), t};
}

// |got - want| <= abs_tol + rel_tol * |want| everywhere; prints the max error.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double abs_tol, double rel_tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double max_abs = 0, worst = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    const double lim = abs_tol + rel_tol * std::fabs(double(want[i]));
    if (!(d <= lim)) {
      if (bad++ == 0) first_bad = i;
    }
    max_abs = std::max(max_abs, d);
    worst = std::max(worst, d / lim);
  }
  std::printf("[ bound ] %-44s max abs err %.3g (bound %.1g + %.1g*|ref|, %.2f of it)\n", what.c_str(), max_abs, abs_tol,
              rel_tol, worst);
  EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first_bad << ": got " << got[first_bad] << " want "
                     << want[first_bad];
}

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_CUDA();
    dev_ = &cuda_device(0);
    st_ = dev_->create_stream();
  }
  Device* dev_ = nullptr;
  std::unique_ptr<Stream> st_;
};
using CudaOps = CudaBackend;
using CudaGraphs = CudaBackend;

struct Shape {
  int64_t ne0, n1, n2, pad1, pad2;
};
// Odd sizes, padded strides; both the warp-per-row (ne0 <= 1024) and block-per-row kernels.
const Shape kShapes[] = {{1, 7, 2, 1, 0}, {37, 5, 3, 3, 7}, {1000, 2, 1, 0, 0}, {1025, 3, 2, 5, 1}, {4099, 2, 1, 1, 0},
                         {20001, 1, 2, 3, 2}};

}  // namespace

TEST(CudaBackendProbe, CountAndReasonAgree) {
  const int n = cuda_device_count();
  if (n == 0) EXPECT_FALSE(cuda_unavailable_reason().empty());
  else EXPECT_TRUE(cuda_unavailable_reason().empty()) << cuda_unavailable_reason();
  if (n == 0) GTEST_SKIP() << "no usable CUDA device: " << cuda_unavailable_reason();
  EXPECT_EQ(&cuda_device(0), &cuda_device(0));  // process-wide
}

TEST_F(CudaBackend, DeviceAndBuffers) {
  EXPECT_EQ(dev_->type(), DeviceType::Cuda);
  const std::string name = dev_->name();
  std::printf("device: %s\n", name.c_str());
  EXPECT_NE(name.find("CUDA0: "), std::string::npos);
  EXPECT_NE(name.find("GiB"), std::string::npos);
  EXPECT_NE(name.find("sm_"), std::string::npos);
  std::vector<float> host(16);
  EXPECT_EQ(dev_->wrap(host.data(), 64), nullptr);  // weights are uploaded, not wrapped
  auto b = dev_->alloc(1001);
  EXPECT_EQ(b->size(), 1001u);
  EXPECT_EQ(b->host_ptr(), nullptr);
  EXPECT_EQ(&b->device(), dev_);
  EXPECT_EQ(&st_->device(), dev_);
}

TEST_F(CudaBackend, UploadDownloadRoundTrip) {
  auto b = dev_->alloc(4096);
  const auto v = randv(700, 1);
  const Tensor t = Tensor::make(b.get(), 36, GgmlType::F32, {700, 1, 1, 1});  // offset not 256-aligned
  st_->upload(t, v.data(), v.size() * 4);
  std::vector<float> back(700, 0.f);
  st_->download(back.data(), t, back.size() * 4);
  st_->synchronize();
  EXPECT_EQ(std::memcmp(back.data(), v.data(), v.size() * 4), 0);
  // Partial upload (fewer bytes than the tensor) into a slice; the rest keeps its contents.
  const auto w = randv(10, 2);
  st_->upload(t.slice(1, 0, 1).reshape({700, 1, 1, 1}), w.data(), w.size() * 4);
  st_->download(back.data(), t, back.size() * 4);
  st_->synchronize();
  for (int i = 0; i < 700; ++i) ASSERT_EQ(back[size_t(i)], i < 10 ? w[size_t(i)] : v[size_t(i)]) << i;
}

TEST_F(CudaBackend, StridedCopyAndFillZero) {
  // F32, 4-D, different paddings on both sides (kernel path), then dense -> dense (memcpy path).
  const int64_t ne0 = 7, n1 = 5, n2 = 3, n3 = 2;
  auto sb = dev_->alloc(4096 * 4), db = dev_->alloc(4096 * 4);
  const auto sv = randv(4096, 3), dv0 = randv(4096, 4);
  Tensor s = Tensor::make(sb.get(), 8, GgmlType::F32, {ne0, n1, n2, n3});
  s.nb = {4, 4 * 9, 4 * 9 * 6, 4 * 9 * 6 * 4};
  Tensor d = Tensor::make(db.get(), 4, GgmlType::F32, {ne0, n1, n2, n3});
  d.nb = {4, 4 * 8, 4 * 8 * 5 + 12, (4 * 8 * 5 + 12) * 3 + 20};
  const Tensor sall = Tensor::make(sb.get(), 0, GgmlType::F32, {4096, 1, 1, 1});
  const Tensor dall = Tensor::make(db.get(), 0, GgmlType::F32, {4096, 1, 1, 1});
  st_->upload(sall, sv.data(), 4096 * 4);
  st_->upload(dall, dv0.data(), 4096 * 4);
  st_->copy(d, s);
  std::vector<float> got(4096), want = dv0;
  auto at = [](const Tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (t.offset + size_t(i0) * t.nb[0] + size_t(i1) * t.nb[1] + size_t(i2) * t.nb[2] + size_t(i3) * t.nb[3]) / 4;
  };
  for (int64_t i3 = 0; i3 < n3; ++i3)
    for (int64_t i2 = 0; i2 < n2; ++i2)
      for (int64_t i1 = 0; i1 < n1; ++i1)
        for (int64_t i0 = 0; i0 < ne0; ++i0) want[at(d, i0, i1, i2, i3)] = sv[at(s, i0, i1, i2, i3)];
  st_->download(got.data(), dall, 4096 * 4);
  st_->synchronize();
  EXPECT_EQ(got, want) << "strided F32 copy";

  // fill_zero of the strided view: its elements become 0, the gaps keep their values.
  st_->fill_zero(d);
  for (int64_t i3 = 0; i3 < n3; ++i3)
    for (int64_t i2 = 0; i2 < n2; ++i2)
      for (int64_t i1 = 0; i1 < n1; ++i1)
        for (int64_t i0 = 0; i0 < ne0; ++i0) want[at(d, i0, i1, i2, i3)] = 0.f;
  // ... and of a view whose dims 1 and 2 merge (one 2-D memset), and of a dense slice.
  Tensor m = Tensor::make(db.get(), 4 * 3000, GgmlType::F32, {5, 4, 3, 1});
  m.nb = {4, 4 * 8, 4 * 8 * 4, 4 * 8 * 4 * 3};
  st_->fill_zero(m);
  for (int64_t i2 = 0; i2 < 3; ++i2)
    for (int64_t i1 = 0; i1 < 4; ++i1)
      for (int64_t i0 = 0; i0 < 5; ++i0) want[at(m, i0, i1, i2, 0)] = 0.f;
  st_->fill_zero(Tensor::make(db.get(), 4 * 3500, GgmlType::F32, {33, 1, 1, 1}));
  for (int i = 3500; i < 3533; ++i) want[size_t(i)] = 0.f;
  st_->download(got.data(), dall, 4096 * 4);
  st_->synchronize();
  EXPECT_EQ(got, want) << "strided fill_zero";

  // Block type: Q8_0 rows of 64 (68 bytes) at a 70-byte stride (2-byte copy units), into dense rows.
  const int64_t k = 64, rows = 11;
  const size_t rb = tensor::row_size(GgmlType::Q8_0, k), sstride = rb + 2;
  std::vector<uint8_t> q(sstride * rows, 0xAB);
  const auto f = randv(size_t(k * rows), 5);
  for (int64_t r = 0; r < rows; ++r) tensor::quantize_row(GgmlType::Q8_0, f.data() + r * k, q.data() + r * sstride, k);
  auto qb = dev_->alloc(q.size()), ob = dev_->alloc(rb * rows);
  st_->upload(Tensor::make(qb.get(), 0, GgmlType::I8, {int64_t(q.size()), 1, 1, 1}), q.data(), q.size());
  Tensor qs = Tensor::make(qb.get(), 0, GgmlType::Q8_0, {k, rows, 1, 1});
  qs.nb[1] = sstride;
  qs.nb[2] = qs.nb[3] = sstride * rows;
  const Tensor qd = Tensor::make(ob.get(), 0, GgmlType::Q8_0, {k, rows, 1, 1});
  st_->copy(qd, qs);
  std::vector<uint8_t> qgot(rb * rows);
  st_->download(qgot.data(), qd, qgot.size());
  st_->synchronize();
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(std::memcmp(qgot.data() + r * rb, q.data() + r * sstride, rb), 0) << "Q8_0 row " << r;
  // Dense -> dense (one cudaMemcpyAsync).
  auto ob2 = dev_->alloc(rb * rows);
  const Tensor qd2 = Tensor::make(ob2.get(), 0, GgmlType::Q8_0, {k, rows, 1, 1});
  st_->copy(qd2, qd);
  std::vector<uint8_t> qgot2(rb * rows);
  st_->download(qgot2.data(), qd2, qgot2.size());
  st_->synchronize();
  EXPECT_EQ(qgot2, qgot);
}

TEST_F(CudaOps, Unary) {
  for (const Shape& s : kShapes)
    for (Unary op : {Unary::Silu, Unary::Sigmoid, Unary::Softplus, Unary::Gelu, Unary::GeluErf})
      for (bool in_place : {false, true}) {
        View x = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 10, -30.f, 30.f);
        View y = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad2, s.pad1, 11);
        push(*st_, x);
        push(*st_, y);
        View& out = in_place ? x : y;
        st_->unary(op, x.t, out.t);
        std::vector<float> want = out.h;
        K::Rows wr = out.r;
        wr.p = want.data() + (out.r.p - out.h.data());
        for (int64_t i2 = 0; i2 < s.n2; ++i2)
          for (int64_t i1 = 0; i1 < s.n1; ++i1) {
            const float* xi = x.r.row(i1, i2);
            float* yo = wr.row(i1, i2);
            if (op == Unary::Silu) ref::silu(xi, yo, s.ne0);
            if (op == Unary::Sigmoid) ref::sigmoid(xi, yo, s.ne0);
            if (op == Unary::Softplus) ref::softplus(xi, yo, s.ne0);
            if (op == Unary::Gelu) ref::gelu(xi, yo, s.ne0);
            if (op == Unary::GeluErf) ref::gelu_erf(xi, yo, s.ne0);
          }
        expect_close(pull(*st_, out), want, 1e-6, 4e-6,
                     fmt::format("unary {} [{} {} {}]{}", int(op), s.ne0, s.n1, s.n2, in_place ? " in place" : ""));
      }
}

TEST_F(CudaOps, BinaryAllModes) {
  for (const Shape& s : kShapes)
    for (Binary op : {Binary::Add, Binary::Mul, Binary::SwiGlu, Binary::SigmoidMul})
      for (int mode : {0, 1, 2}) {
        View a = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 20, -6.f, 6.f);
        View b = mode == 0   ? make_view(*dev_, s.ne0, s.n1, s.n2, s.pad2, s.pad1, 21, -6.f, 6.f)
                 : mode == 1 ? make_view(*dev_, s.ne0, 1, 1, 0, 0, 22, -6.f, 6.f)
                             : make_view(*dev_, 1, s.n1, s.n2, 2, 1, 23, -6.f, 6.f);
        const bool in_place = mode == 0 && op == Binary::Mul;  // y aliases a
        View y = make_view(*dev_, s.ne0, s.n1, s.n2, 1, 3, 24);
        View& out = in_place ? a : y;
        push(*st_, a);
        push(*st_, b);
        push(*st_, y);
        const std::vector<float> a0 = a.h;
        K::Rows ar = a.r;
        ar.p = const_cast<float*>(a0.data()) + (a.r.p - a.h.data());
        st_->binary(op, a.t, b.t, out.t);
        std::vector<float> want = out.h;
        K::Rows wr = out.r;
        wr.p = want.data() + (out.r.p - out.h.data());
        std::vector<float> brow(size_t(s.ne0));
        for (int64_t i2 = 0; i2 < s.n2; ++i2)
          for (int64_t i1 = 0; i1 < s.n1; ++i1) {
            for (int64_t i = 0; i < s.ne0; ++i)
              brow[size_t(i)] = mode == 0 ? b.r.row(i1, i2)[i] : mode == 1 ? b.r.row(0, 0)[i] : b.r.row(i1, i2)[0];
            const float* ai = ar.row(i1, i2);
            float* yo = wr.row(i1, i2);
            switch (op) {
              case Binary::Add: ref::add(ai, brow.data(), yo, s.ne0); break;
              case Binary::Mul: ref::mul(ai, brow.data(), yo, s.ne0); break;
              case Binary::SwiGlu: ref::swiglu(ai, brow.data(), yo, s.ne0); break;
              case Binary::SigmoidMul: ref::sigmoid_mul(ai, brow.data(), yo, s.ne0); break;
            }
          }
        expect_close(pull(*st_, out), want, 1e-6, 4e-6,
                     fmt::format("binary {} mode {} [{} {} {}]", int(op), mode, s.ne0, s.n1, s.n2));
      }
}

TEST_F(CudaOps, Scale) {
  for (const Shape& s : kShapes) {
    View x = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 30);
    View y = make_view(*dev_, s.ne0, s.n1, s.n2, 0, 2, 31);
    push(*st_, x);
    push(*st_, y);
    st_->scale(x.t, -0.37f, y.t);
    std::vector<float> want = y.h;
    for (int64_t i2 = 0; i2 < s.n2; ++i2)
      for (int64_t i1 = 0; i1 < s.n1; ++i1)
        ref::scale(x.r.row(i1, i2), -0.37f, want.data() + (y.r.row(i1, i2) - y.h.data()), s.ne0);
    expect_close(pull(*st_, y), want, 0, 0, fmt::format("scale [{} {} {}]", s.ne0, s.n1, s.n2));  // exact
  }
}

TEST_F(CudaOps, RmsNormAndL2Norm) {
  ThreadPool pool(2);
  for (const Shape& s : kShapes)
    for (int variant : {0, 1, 2}) {  // rms_norm with weight, rms_norm without (in place), l2_norm
      View x = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 40, -3.f, 3.f);
      View y = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad2, s.pad1, 41);
      const auto w = randv(size_t(s.ne0), 42, 0.5f, 1.5f);
      auto [wb, wt] = dev_vec(*dev_, *st_, w, GgmlType::F32, {s.ne0, 1, 1, 1});
      push(*st_, x);
      push(*st_, y);
      View& out = variant == 1 ? x : y;
      std::vector<float> want = out.h;
      K::Rows wr = out.r;
      wr.p = want.data() + (out.r.p - out.h.data());
      if (variant == 0) {
        st_->rms_norm(x.t, &wt, y.t, 1e-6f);
        ref::rms_norm(x.r, w.data(), wr, 1e-6f);
      } else if (variant == 1) {
        st_->rms_norm(x.t, nullptr, x.t, 1e-5f);
        ref::rms_norm(x.r, nullptr, wr, 1e-5f);
      } else {
        // ops.h's l2_norm is x / sqrt(sum x^2 + eps) (the CPU op; ref uses max(norm, eps), which
        // differs only for rows of norm ~ sqrt(eps)).
        st_->l2_norm(x.t, y.t, 1e-6f);
        K::l2_norm(x.r, wr, 1e-6f, pool);
      }
      expect_close(pull(*st_, out), want, 2e-6, 1e-5,
                   fmt::format("{} [{} {} {}]", variant == 2 ? "l2_norm" : "rms_norm", s.ne0, s.n1, s.n2));
    }
  // A zero row: l2_norm gives 0 (eps keeps it finite).
  View z = make_view(*dev_, 64, 1, 1, 0, 0, 43);
  std::fill(z.h.begin(), z.h.end(), 0.f);
  push(*st_, z);
  st_->l2_norm(z.t, z.t, 1e-6f);
  for (float v : pull(*st_, z)) ASSERT_EQ(v, 0.f);
}

TEST_F(CudaOps, RopeNeoxAndNormalPartial) {
  struct Case {
    int64_t head_dim, n_head, n_tok;
    int n_rot;
    bool neox;
    float base, fscale;
  };
  const Case cases[] = {{64, 5, 7, 64, true, 10000.f, 1.f},   {80, 3, 9, 32, false, 1e6f, 0.25f},
                        {6, 2, 3, 4, true, 500.f, 1.f},        {128, 33, 2, 64, true, 5e6f, 1.f},
                        {256, 4, 5, 256, false, 10000.f, 1.f}, {130, 3, 4, 2, false, 10000.f, 2.f}};
  for (const Case& c : cases) {
    View x = make_view(*dev_, c.head_dim, c.n_head, c.n_tok, 3, 5, 50);
    std::vector<int32_t> pos(size_t(c.n_tok));
    std::mt19937 rng(51);
    for (auto& p : pos) p = int32_t(rng() % 131072);
    pos[0] = 0;
    auto [pb, pt] = dev_vec(*dev_, *st_, pos, GgmlType::I32, {c.n_tok, 1, 1, 1});
    push(*st_, x);
    const RopeParams p{c.n_rot, c.neox, c.base, c.fscale};
    st_->rope(x.t, pt, p);
    std::vector<float> want = x.h;
    K::Rows wr = x.r;
    wr.p = want.data() + (x.r.p - x.h.data());
    ref::rope(wr, pos.data(), p);
    expect_close(pull(*st_, x), want, 1e-6, 1e-6,
                 fmt::format("rope {} d{} rot{} [{} {}]", c.neox ? "neox" : "normal", c.head_dim, c.n_rot, c.n_head,
                             c.n_tok));
  }
}

TEST_F(CudaOps, RopeMulti) {
  struct Case {
    RopeParams::Multi m;
    int64_t head_dim, n_head, n_tok;
    int n_rot, s0, s1, s2, s3;
  };
  const Case cases[] = {{RopeParams::Multi::Imrope, 256, 4, 9, 64, 11, 11, 10, 0},
                        {RopeParams::Multi::Imrope, 128, 3, 5, 128, 24, 20, 20, 0},
                        {RopeParams::Multi::Vision, 72, 16, 33, 72, 18, 18, 18, 18},
                        {RopeParams::Multi::Vision, 64, 2, 4, 64, 16, 16, 16, 16}};
  for (const Case& c : cases) {
    View x = make_view(*dev_, c.head_dim, c.n_head, c.n_tok, 3, 5, 52);
    std::vector<int32_t> pos(size_t(4 * c.n_tok));
    std::mt19937 rng(53);
    for (auto& p : pos) p = int32_t(rng() % 4096);
    auto [pb, pt] = dev_vec(*dev_, *st_, pos, GgmlType::I32, {c.n_tok, 4, 1, 1});
    push(*st_, x);
    RopeParams p{c.n_rot, true, 10000.f, 1.f};
    p.multi = c.m;
    p.sections[0] = c.s0, p.sections[1] = c.s1, p.sections[2] = c.s2, p.sections[3] = c.s3;
    st_->rope_multi(x.t, pt, p);
    std::vector<float> want = x.h;
    K::Rows wr = x.r;
    wr.p = want.data() + (x.r.p - x.h.data());
    ref::rope_multi(wr, pos.data(), p);
    expect_close(pull(*st_, x), want, 1e-6, 1e-6, fmt::format("rope_multi {} d{} [{} {}]", int(c.m), c.head_dim, c.n_head, c.n_tok));
  }
}

TEST_F(CudaOps, Softmax) {
  for (const Shape& s : kShapes) {
    View x = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 60, -12.f, 12.f);
    push(*st_, x);
    st_->softmax(x.t, 0.7f);
    std::vector<float> want = x.h;
    K::Rows wr = x.r;
    wr.p = want.data() + (x.r.p - x.h.data());
    ref::softmax(wr, 0.7f);
    expect_close(pull(*st_, x), want, 1e-8, 1e-5, fmt::format("softmax [{} {} {}]", s.ne0, s.n1, s.n2));
  }
}

TEST_F(CudaOps, Hadamard) {
  for (int64_t n : {1, 2, 8, 64, 128, 1024, 8192})
    for (int64_t chunks : {1, 3}) {
      const int64_t ne0 = n * chunks;
      View x = make_view(*dev_, ne0, 3, 2, 1, 3, 70);
      push(*st_, x);
      st_->hadamard(x.t, n);
      // Reference in double: y = H_n x / sqrt(n) with H_n[i][j] = (-1)^popcount(i & j) (Sylvester), as
      // the matrix product for n <= 256, as double butterflies (the same map) for larger n.
      std::vector<float> want = x.h;
      std::vector<double> d(static_cast<size_t>(n));
      for (int64_t i2 = 0; i2 < 2; ++i2)
        for (int64_t i1 = 0; i1 < 3; ++i1)
          for (int64_t c = 0; c < chunks; ++c) {
            const float* xi = x.r.row(i1, i2) + c * n;
            float* yo = want.data() + (x.r.row(i1, i2) - x.h.data()) + c * n;
            if (n <= 256) {
              for (int64_t i = 0; i < n; ++i) {
                double acc = 0;
                for (int64_t j = 0; j < n; ++j) acc += (__builtin_popcountll(uint64_t(i & j)) & 1) ? -xi[j] : xi[j];
                d[size_t(i)] = acc;
              }
            } else {
              for (int64_t i = 0; i < n; ++i) d[size_t(i)] = xi[i];
              for (int64_t len = 1; len < n; len <<= 1)
                for (int64_t i = 0; i < n; i += 2 * len)
                  for (int64_t j = i; j < i + len; ++j) {
                    const double u = d[size_t(j)], v = d[size_t(j + len)];
                    d[size_t(j)] = u + v;
                    d[size_t(j + len)] = u - v;
                  }
            }
            for (int64_t i = 0; i < n; ++i) yo[i] = float(d[size_t(i)] / std::sqrt(double(n)));
          }
      expect_close(pull(*st_, x), want, 2e-6, 1e-5, fmt::format("hadamard n{} x{} chunks", n, chunks));
    }
}

TEST_F(CudaOps, TopkRouteTiesRenormScale) {
  struct Case {
    int64_t n_expert, n_tok;
    int k;
  };
  // 248,320 x k = 1: a drafter's greedy token and its probability over the Qwen3.5 vocabulary (the
  // block-per-token path); 5,000: just above that path's threshold.
  for (const Case& c : {Case{7, 5, 1}, Case{128, 33, 8}, Case{257, 3, 10}, Case{64, 4, 32}, Case{512, 6, 10},
                        Case{248320, 3, 1}, Case{5000, 2, 1}})
    for (bool renorm : {false, true})
      for (float w_scale : {1.f, 2.5f}) {
        // Logits on a 0.25 grid in [-2, 2]: many ties, broken towards the lower expert id.
        auto l = randv(size_t(c.n_expert * c.n_tok), 80, -2.f, 2.f);
        for (auto& v : l) v = std::round(v * 4.f) / 4.f;
        auto [lb, lt] = dev_vec(*dev_, *st_, l, GgmlType::F32, {c.n_expert, c.n_tok, 1, 1});
        auto ib = dev_->alloc(size_t(c.k * c.n_tok) * 4), wb = dev_->alloc(size_t(c.k * c.n_tok) * 4);
        const Tensor it = Tensor::make(ib.get(), 0, GgmlType::I32, {c.k, c.n_tok, 1, 1});
        const Tensor wt = Tensor::make(wb.get(), 0, GgmlType::F32, {c.k, c.n_tok, 1, 1});
        st_->topk_route(lt, c.k, renorm, w_scale, it, wt);
        std::vector<int32_t> ids(size_t(c.k * c.n_tok)), want_ids(ids.size());
        std::vector<float> w(ids.size()), want_w(ids.size());
        st_->download(ids.data(), it, ids.size() * 4);
        st_->download(w.data(), wt, w.size() * 4);
        st_->synchronize();
        ref::topk_route(l.data(), c.n_expert, c.n_tok, c.k, renorm, w_scale, want_ids.data(), want_w.data());
        EXPECT_EQ(ids, want_ids) << "experts " << c.n_expert << " k " << c.k;
        expect_close(w, want_w, 1e-7, 2e-6,
                     fmt::format("topk_route e{} k{} t{}{} x{}", c.n_expert, c.k, c.n_tok, renorm ? " renorm" : "",
                                 w_scale));
      }
}

// top_logits is exact: the reference's ids and values bit for bit, at vocabulary sizes (several
// 4096-entry chunks and a partial one), with ties on a coarse grid, -inf and NaN entries.
TEST_F(CudaOps, TopLogitsExact) {
  struct Case {
    int64_t V, n;
    int k;
  };
  for (const Case& c : {Case{248320, 3, 64}, Case{248320, 33, 128}, Case{151936, 1, 40}, Case{4097, 5, 1},
                        Case{128, 2, 128}}) {
    auto l = randv(size_t(c.V * c.n), 81, -8.f, 8.f);
    for (auto& v : l) v = std::round(v * 8.f) / 8.f;  // many ties
    for (int64_t r = 0; r < c.n; ++r) {
      l[size_t(r * c.V + 3)] = -INFINITY;
      l[size_t(r * c.V + 4)] = NAN;
      l[size_t(r * c.V + c.V - 1)] = 9.f;  // the largest, in the last (partial) chunk
    }
    auto [lb, lt] = dev_vec(*dev_, *st_, l, GgmlType::F32, {c.V, c.n, 1, 1});
    auto ib = dev_->alloc(size_t(c.k * c.n) * 4), vb = dev_->alloc(size_t(c.k * c.n) * 4);
    const Tensor it = Tensor::make(ib.get(), 0, GgmlType::I32, {c.k, c.n, 1, 1});
    const Tensor vt = Tensor::make(vb.get(), 0, GgmlType::F32, {c.k, c.n, 1, 1});
    st_->top_logits(lt, c.k, it, vt);
    std::vector<int32_t> ids(size_t(c.k * c.n)), want_ids(ids.size());
    std::vector<float> v(ids.size()), want_v(ids.size());
    st_->download(ids.data(), it, ids.size() * 4);
    st_->download(v.data(), vt, v.size() * 4);
    st_->synchronize();
    ref::top_logits(l.data(), c.V, c.n, c.k, want_ids.data(), want_v.data());
    EXPECT_EQ(ids, want_ids) << "V " << c.V << " k " << c.k;
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_TRUE(v[i] == want_v[i] || (std::isnan(v[i]) && std::isnan(want_v[i]))) << "V " << c.V << " at " << i;
    EXPECT_EQ(ids[0], int32_t(c.V - 1));
  }
}

// The fused ops (one kernel each) against their op sequences on the scalar references; every shape
// of kShapes (warp- and block-per-row kernels), padded strides; the gaps between rows must keep
// their values (the whole buffer is compared).
TEST_F(CudaOps, DeltaGates) {
  for (const Shape& s : kShapes) {
    View beta = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 50, -30.f, 30.f);
    View g = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad2, s.pad1, 51, -25.f, 25.f);
    const auto dt = randv(size_t(s.ne0), 52, -2.f, 2.f), a = randv(size_t(s.ne0), 53, -3.f, -0.1f);
    auto [db, dtt] = dev_vec(*dev_, *st_, dt, GgmlType::F32, {s.ne0, 1, 1, 1});
    auto [ab, at] = dev_vec(*dev_, *st_, a, GgmlType::F32, {s.ne0, 1, 1, 1});
    push(*st_, beta);
    push(*st_, g);
    st_->delta_gates(beta.t, g.t, dtt, at);
    std::vector<float> wb = beta.h, wg = g.h;
    for (int64_t i2 = 0; i2 < s.n2; ++i2)
      for (int64_t i1 = 0; i1 < s.n1; ++i1) {
        float* b = wb.data() + (beta.r.row(i1, i2) - beta.h.data());
        float* gg = wg.data() + (g.r.row(i1, i2) - g.h.data());
        ref::sigmoid(b, b, s.ne0);
        ref::add(gg, dt.data(), gg, s.ne0);
        ref::softplus(gg, gg, s.ne0);
        ref::mul(gg, a.data(), gg, s.ne0);
      }
    expect_close(pull(*st_, beta), wb, 1e-6, 4e-6, fmt::format("delta_gates beta [{} {} {}]", s.ne0, s.n1, s.n2));
    expect_close(pull(*st_, g), wg, 1e-6, 1e-5, fmt::format("delta_gates g [{} {} {}]", s.ne0, s.n1, s.n2));
  }
}

TEST_F(CudaOps, RmsNormGated) {
  for (const Shape& s : kShapes) {
    View x = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 54, -3.f, 3.f);
    View z = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad2, s.pad1, 55, -4.f, 4.f);
    const auto w = randv(size_t(s.ne0), 56, 0.5f, 1.5f);
    auto [wb, wt] = dev_vec(*dev_, *st_, w, GgmlType::F32, {s.ne0, 1, 1, 1});
    push(*st_, x);
    push(*st_, z);
    st_->rms_norm_gated(x.t, wt, z.t, 1e-6f);
    std::vector<float> want = x.h, zs(size_t(s.ne0));
    K::Rows wr = x.r;
    wr.p = want.data() + (x.r.p - x.h.data());
    ref::rms_norm(x.r, w.data(), wr, 1e-6f);
    for (int64_t i2 = 0; i2 < s.n2; ++i2)
      for (int64_t i1 = 0; i1 < s.n1; ++i1) {
        ref::silu(z.r.row(i1, i2), zs.data(), s.ne0);
        ref::mul(wr.row(i1, i2), zs.data(), wr.row(i1, i2), s.ne0);
      }
    // rms_norm's bound (2e-6 + 1e-5 |ref|) times |silu(z)| <= 4, plus silu's own rounding.
    expect_close(pull(*st_, x), want, 1e-5, 2e-5, fmt::format("rms_norm_gated [{} {} {}]", s.ne0, s.n1, s.n2));
    expect_close(pull(*st_, z), z.h, 0, 0, "rms_norm_gated leaves z as it was (CUDA)");
  }
}

TEST_F(CudaOps, AddRmsNorm) {
  for (const Shape& s : kShapes)
    for (int variant : {0, 1, 2, 3}) {  // y separate; no weight; y = x; y = t
      View x = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad1, s.pad2, 57, -3.f, 3.f);
      View t = make_view(*dev_, s.ne0, s.n1, s.n2, s.pad2, s.pad1, 58, -3.f, 3.f);
      View y = make_view(*dev_, s.ne0, s.n1, s.n2, 1, 3, 59);
      const auto w = randv(size_t(s.ne0), 60, 0.5f, 1.5f);
      auto [wb, wt] = dev_vec(*dev_, *st_, w, GgmlType::F32, {s.ne0, 1, 1, 1});
      push(*st_, x);
      push(*st_, t);
      push(*st_, y);
      View& out = variant == 2 ? x : variant == 3 ? t : y;
      st_->add_rms_norm(x.t, t.t, variant == 1 ? nullptr : &wt, out.t, 1e-5f);
      // x + t first (exact IEEE adds: compared bit for bit where the norm did not overwrite them).
      std::vector<float> wx = x.h, wy = out.h;
      K::Rows xr = x.r, yr = out.r;
      xr.p = wx.data() + (x.r.p - x.h.data());
      for (int64_t i2 = 0; i2 < s.n2; ++i2)
        for (int64_t i1 = 0; i1 < s.n1; ++i1) ref::add(x.r.row(i1, i2), t.r.row(i1, i2), xr.row(i1, i2), s.ne0);
      if (variant == 2) wy = wx;
      yr.p = wy.data() + (out.r.p - out.h.data());
      ref::rms_norm(xr, variant == 1 ? nullptr : w.data(), yr, 1e-5f);
      const std::string what = fmt::format("add_rms_norm v{} [{} {} {}]", variant, s.ne0, s.n1, s.n2);
      if (variant != 2) expect_close(pull(*st_, x), wx, 0, 0, what + " x");
      expect_close(pull(*st_, out), wy, 2e-6, 1e-5, what + " y");
    }
}

// matmul_n through the Stream: mixed weight types (one int8 segment group of 2, an F32 weight on the
// F32-x kernel, the IQ4 x order), m = 1 and 3; against y = W x on the host-dequantized weights
// (bound: the int8-x mat-vec's statistical one, 5e-2 * sum|w x| / sqrt(k); test_cuda_matmul has
// the tight ones); then the same recorded as a graph with the fused elementwise ops: replay == direct run.
TEST_F(CudaGraphs, MatmulNAndFusedOpsCapture) {
  const int64_t k = 512;
  const GgmlType types[4] = {GgmlType::Q4_K, GgmlType::F32, GgmlType::Q4_K, GgmlType::IQ4_XS};
  const int64_t ns[4] = {37, 8, 100, 19};
  std::vector<std::unique_ptr<Buffer>> wbuf;
  std::vector<std::vector<float>> deq(4);
  Tensor W[4], Y[4];
  std::vector<std::unique_ptr<Buffer>> ybuf;
  size_t ws = 0;
  for (int i = 0; i < 4; ++i) {
    const auto wf = randv(size_t(k * ns[i]), 100 + uint32_t(i));
    const auto bytes = kiln::kernels::testing::weight_rows(types[i], wf.data(), k, ns[i]);
    deq[size_t(i)].resize(size_t(k * ns[i]));
    const size_t rs = tensor::row_size(types[i], k);
    for (int64_t r = 0; r < ns[i]; ++r) tensor::dequantize_row(types[i], bytes.data() + r * rs, deq[size_t(i)].data() + r * k, k);
    wbuf.push_back(dev_->alloc(bytes.size()));
    W[i] = Tensor::make(wbuf.back().get(), 0, types[i], {k, ns[i], 1, 1});
    st_->upload(W[i], bytes.data(), bytes.size());
    ws = std::max(ws, st_->matmul_workspace(types[i], k, ns[i], 3));
  }
  st_->reserve_workspace(ws);
  for (int64_t m : {int64_t(1), int64_t(3)}) {
    View x = make_view(*dev_, k, m, 1, 5, 0, 110 + uint32_t(m));
    push(*st_, x);
    const Tensor X = x.t;  // [k, m], columns k + 5 floats apart
    ybuf.clear();
    for (int i = 0; i < 4; ++i) {
      ybuf.push_back(dev_->alloc(size_t((ns[i] + 2) * m) * 4));
      Y[i] = Tensor::make(ybuf.back().get(), 0, GgmlType::F32, {ns[i], m, 1, 1});
      Y[i].nb[1] = size_t(ns[i] + 2) * 4;
      Y[i].nb[3] = Y[i].nb[2] = Y[i].nb[1] * size_t(m);
    }
    st_->matmul_n(W, Y, 4, X);
    for (int i = 0; i < 4; ++i) {
      std::vector<float> got(size_t((ns[i] + 2) * m));
      st_->download(got.data(), Tensor::make(ybuf[size_t(i)].get(), 0, GgmlType::F32, {int64_t(got.size()), 1, 1, 1}),
                    got.size() * 4);
      st_->synchronize();
      double worst = 0;
      for (int64_t c = 0; c < m; ++c)
        for (int64_t r = 0; r < ns[i]; ++r) {
          double ref = 0, sum = 0;
          for (int64_t e = 0; e < k; ++e) {
            const double p = double(deq[size_t(i)][size_t(r * k + e)]) * double(x.r.row(c, 0)[e]);
            ref += p, sum += std::fabs(p);
          }
          worst = std::max(worst, std::fabs(double(got[size_t(c * (ns[i] + 2) + r)]) - ref) / sum * std::sqrt(double(k)));
        }
      std::printf("[ bound ] matmul_n m=%lld weight %d (%s): sqrt(k)|y - ref| / sum|w x| %.3g (bound 5e-2)\n",
                  (long long)m, i, std::string(gguf::type_name(types[i])).c_str(), worst);
      EXPECT_LE(worst, 5e-2) << "weight " << i << " m " << m;
    }
    // Graph: matmul_n then the three fused elementwise ops on its outputs.
    const int64_t H = ns[0];
    const auto dt = randv(size_t(H), 120), a = randv(size_t(H), 121, -2.f, -0.5f), nw = randv(size_t(H), 122, 0.5f, 1.5f);
    auto [db, dtt] = dev_vec(*dev_, *st_, dt, GgmlType::F32, {H, 1, 1, 1});
    auto [ab, at] = dev_vec(*dev_, *st_, a, GgmlType::F32, {H, 1, 1, 1});
    auto [nb, nwt] = dev_vec(*dev_, *st_, nw, GgmlType::F32, {H, 1, 1, 1});
    View g2 = make_view(*dev_, H, m, 1, 1, 0, 123);
    View r = make_view(*dev_, H, m, 1, 0, 0, 124);
    push(*st_, g2);
    push(*st_, r);
    auto body = [&] {
      st_->matmul_n(W, Y, 4, X);
      st_->copy(g2.t, Y[0]);
      st_->delta_gates(Y[0], g2.t, dtt, at);
      st_->rms_norm_gated(g2.t, nwt, Y[0], 1e-6f);
      st_->add_rms_norm(r.t, g2.t, &nwt, g2.t, 1e-6f);
    };
    auto gr = st_->capture(body);
    ASSERT_NE(gr, nullptr);
    const auto x2 = randv(x.h.size(), 125);
    st_->upload(whole(x), x2.data(), x2.size() * 4);
    push(*st_, r);
    st_->replay(*gr);
    const std::vector<float> replayed = pull(*st_, g2), rr = pull(*st_, r);
    push(*st_, r);
    body();
    EXPECT_EQ(replayed, pull(*st_, g2)) << "replay differs from a direct run, m " << m;
    EXPECT_EQ(rr, pull(*st_, r)) << "replay differs from a direct run (residual), m " << m;
    EXPECT_EQ(st_->workspace_grows(), 0);
  }
}

TEST_F(CudaGraphs, CaptureReplayMatchesDirectRun) {
  const int64_t D = 64, H = 4, T = 3;
  View x = make_view(*dev_, D, H, T, 0, 0, 90);
  View y = make_view(*dev_, D, H, T, 2, 1, 91);
  const auto w = randv(size_t(D), 92, 0.5f, 1.5f), b = randv(size_t(D), 93);
  auto [wb, wt] = dev_vec(*dev_, *st_, w, GgmlType::F32, {D, 1, 1, 1});
  auto [bb, bt] = dev_vec(*dev_, *st_, b, GgmlType::F32, {D, 1, 1, 1});
  std::vector<int32_t> pos = {5, 6, 7};
  auto [pb, pt] = dev_vec(*dev_, *st_, pos, GgmlType::I32, {T, 1, 1, 1});
  push(*st_, x);
  push(*st_, y);
  const RopeParams rp{32, true, 10000.f, 1.f};
  auto body = [&] {
    st_->rms_norm(x.t, &wt, y.t, 1e-6f);
    st_->rope(y.t, pt, rp);
    st_->binary(Binary::SwiGlu, y.t, bt, y.t);
    st_->softmax(y.t, 0.5f);
    st_->scale(y.t, 3.f, y.t);
  };
  const std::vector<float> y0 = pull(*st_, y);
  auto g = st_->capture(body);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(pull(*st_, y), y0) << "capture must record, not run";
  // New inputs, then replay; then the same inputs run directly.
  const auto x2 = randv(x.h.size(), 94, -2.f, 2.f);
  const std::vector<int32_t> pos2 = {100, 2000, 30000};
  st_->upload(whole(x), x2.data(), x2.size() * 4);
  st_->upload(pt, pos2.data(), pos2.size() * 4);
  st_->replay(*g);
  const std::vector<float> replayed = pull(*st_, y);
  push(*st_, y);  // reset y (the direct run must not depend on it anyway)
  body();
  const std::vector<float> direct = pull(*st_, y);
  EXPECT_EQ(replayed, direct) << "replay differs from a direct run on the same inputs";
  EXPECT_NE(replayed, y0);
  // Replay twice more on changed inputs: still equal to the direct run.
  const auto x3 = randv(x.h.size(), 95);
  st_->upload(whole(x), x3.data(), x3.size() * 4);
  st_->replay(*g);
  st_->replay(*g);  // idempotent body (y is recomputed from x)
  const std::vector<float> replayed3 = pull(*st_, y);
  body();
  EXPECT_EQ(replayed3, pull(*st_, y));
  EXPECT_EQ(st_->workspace_grows(), 0);
}

TEST_F(CudaBackend, WorkspaceGrowthIsCounted) {
  EXPECT_EQ(st_->workspace_grows(), 0);
  st_->reserve_workspace(1 << 20);  // the first reserve is the plan, not a growth
  EXPECT_EQ(st_->workspace_grows(), 0);
  st_->reserve_workspace(1000);  // smaller: kept
  st_->reserve_workspace(1 << 20);
  EXPECT_EQ(st_->workspace_grows(), 0);
  st_->reserve_workspace(3 << 20);
  EXPECT_EQ(st_->workspace_grows(), 1);
  st_->reserve_workspace(2 << 20);
  EXPECT_EQ(st_->workspace_grows(), 1);
  // Another stream has its own workspace.
  auto st2 = dev_->create_stream();
  st2->reserve_workspace(4 << 20);
  EXPECT_EQ(st2->workspace_grows(), 0);
  // Ops without a workspace never grow it.
  View x = make_view(*dev_, 100, 3, 1, 0, 0, 96);
  push(*st2, x);
  st2->softmax(x.t, 1.f);
  st2->synchronize();
  EXPECT_EQ(st2->workspace_grows(), 0);
}

TEST_F(CudaBackend, ChecksFailWithClearMessages) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  View a = make_view(*dev_, 10, 2, 1, 0, 0, 97);
  View b = make_view(*dev_, 9, 2, 1, 0, 0, 98);
  EXPECT_DEATH(st_->binary(Binary::Add, a.t, b.t, a.t), "binary: b \\[9 2 1 1\\] must be");
  EXPECT_DEATH(st_->rms_norm(a.t, nullptr, b.t, 1e-6f), "rms_norm: shape mismatch");
  auto cpu = make_cpu_device(1);
  auto hb = cpu->alloc(4096);
  const Tensor h = Tensor::make(hb.get(), 0, GgmlType::F32, {10, 2, 1, 1});
  EXPECT_DEATH(st_->softmax(h, 1.f), "softmax x: tensor lives on CPU");
  EXPECT_DEATH(st_->capture([&] { st_->reserve_workspace(64 << 20); }), "reserve_workspace before capture");
}
