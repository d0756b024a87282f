// The CPU backend: host buffers (owned or wrapped), and a stream that runs kernels/cpu ops on the
// device's ThreadPool as each op is enqueued.
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"

namespace kiln::backend {
namespace {

namespace K = kiln::kernels;

class CpuDevice;

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(Device& dev, void* p, size_t n, bool owned) : dev_(dev), p_(p), n_(n), owned_(owned) {}
  ~CpuBuffer() override {
    if (owned_) std::free(p_);
  }
  Device& device() const override { return dev_; }
  size_t size() const override { return n_; }
  void* host_ptr() const override { return p_; }

 private:
  Device& dev_;
  void* p_;
  size_t n_;
  bool owned_;
};

const float* fptr(const Tensor& t) { return t.host_as<const float>(); }
float* fmut(const Tensor& t) { return t.host_as<float>(); }

void check_f32(const Tensor& t, const char* what) {
  KILN_CHECK(t.type == GgmlType::F32 && t.nb[0] == 4 && t.nb[1] % 4 == 0 && t.nb[2] % 4 == 0 && t.nb[3] % 4 == 0,
             "{}: expected an F32 tensor with float-aligned strides, got {}", what, gguf::type_name(t.type));
}
void check_i32(const Tensor& t, int64_t n, const char* what) {
  KILN_CHECK(t.type == GgmlType::I32 && t.is_contiguous() && t.n_elements() == n, "{}: expected I32 [{}]", what, n);
}
// [ne0, n1, n2] rows (ne[3] must be 1).
K::Rows rows_of(const Tensor& t, const char* what) {
  check_f32(t, what);
  KILN_CHECK(t.ne[3] == 1, "{}: 4-D tensors are not supported", what);
  return K::Rows{fmut(t), t.ne[0], t.ne[1], t.ne[2], int64_t(t.nb[1] / 4), int64_t(t.nb[2] / 4)};
}
void check_same_shape(const Tensor& a, const Tensor& b, const char* what) {
  KILN_CHECK(a.ne == b.ne, "{}: shape mismatch [{} {} {} {}] vs [{} {} {} {}]", what, a.ne[0], a.ne[1], a.ne[2], a.ne[3],
             b.ne[0], b.ne[1], b.ne[2], b.ne[3]);
}

class CpuStream final : public Stream {
 public:
  CpuStream(Device& dev, ThreadPool& pool) : dev_(dev), pool_(pool) {}
  ~CpuStream() override { std::free(ws_); }
  Device& device() const override { return dev_; }

  void upload(const Tensor& dst, const void* src, size_t bytes) override {
    KILN_CHECK(dst.is_contiguous() && bytes <= dst.n_bytes(), "upload: {} bytes into a {}-byte tensor", bytes, dst.n_bytes());
    std::memcpy(dst.host(), src, bytes);
  }
  void download(void* dst, const Tensor& src, size_t bytes) override {
    KILN_CHECK(src.is_contiguous() && bytes <= src.n_bytes(), "download: {} bytes from a {}-byte tensor", bytes, src.n_bytes());
    std::memcpy(dst, src.host(), bytes);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    KILN_CHECK(dst.type == src.type, "copy: type mismatch");
    check_same_shape(dst, src, "copy");
    const size_t rb = src.row_bytes();
    auto* d = static_cast<char*>(dst.host());
    const auto* s = static_cast<const char*>(src.host());
    for (int64_t i3 = 0; i3 < src.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < src.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < src.ne[1]; ++i1)
          std::memmove(d + i1 * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3], s + i1 * src.nb[1] + i2 * src.nb[2] + i3 * src.nb[3],
                       rb);
  }
  void synchronize() override {}

  size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) const override {
    return K::matmul_workspace(wt, k, m, pool_.size());
  }
  size_t attention_workspace(const AttnSpec& p, int64_t n_tok, int64_t n_kv_max) const override {
    K::AttnParams ap{p.head_dim, p.n_head, p.n_head_kv, p.scale};
    return K::attention_workspace(ap, pool_.size());
  }
  size_t gated_delta_workspace(int64_t S, int chunk, int64_t n_tok) const override {
    return K::gated_delta_chunked_workspace(S, chunk, pool_.size());
  }
  size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) const override {
    KILN_CHECK(false, "matmul_id: TODO (cpuseam)");
    return 0;
  }
  void fill_zero(const Tensor& dst) override { KILN_CHECK(false, "fill_zero: TODO (cpuseam)"); }
  void matmul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& y) override {
    KILN_CHECK(false, "matmul_id: TODO (cpuseam)");
  }
  void hadamard(const Tensor& x, int64_t n) override { KILN_CHECK(false, "hadamard: TODO (cpuseam)"); }
  void reserve_workspace(size_t bytes) override { ensure(bytes, /*planned=*/true); }
  int workspace_grows() const override { return grows_; }

  void matmul(const Tensor& w, const Tensor& x, const Tensor& y) override {
    check_f32(x, "matmul x");
    check_f32(y, "matmul y");
    KILN_CHECK(w.ne[2] == 1 && w.ne[3] == 1 && x.ne[2] == 1 && x.ne[3] == 1 && y.ne[2] == 1 && y.ne[3] == 1,
               "matmul: 2-D tensors only");
    KILN_CHECK(x.ne[0] == w.ne[0] && y.ne[0] == w.ne[1] && y.ne[1] == x.ne[1],
               "matmul: w [{}, {}] x [{}, {}] -> y [{}, {}]", w.ne[0], w.ne[1], x.ne[0], x.ne[1], y.ne[0], y.ne[1]);
    K::MatmulArgs a;
    a.wt = w.type;
    a.w = w.host();
    a.w_stride = w.nb[1];
    a.k = w.ne[0];
    a.n = w.ne[1];
    a.m = x.ne[1];
    a.x = fptr(x);
    a.x_stride = int64_t(x.nb[1] / 4);
    a.y = fmut(y);
    a.y_stride = int64_t(y.nb[1] / 4);
    K::matmul(a, ensure(matmul_workspace(w.type, a.k, a.n, a.m)), pool_);
  }
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    check_f32(out, "get_rows out");
    check_i32(ids, out.ne[1], "get_rows ids");
    KILN_CHECK(out.ne[0] == table.ne[0], "get_rows: row length {} vs {}", out.ne[0], table.ne[0]);
    K::get_rows(table.type, table.host(), table.nb[1], table.ne[1], table.ne[0], ids.host_as<const int32_t>(), out.ne[1],
                fmut(out), int64_t(out.nb[1] / 4), pool_);
  }
  void rms_norm(const Tensor& x, const Tensor* w, const Tensor& y, float eps) override {
    check_same_shape(x, y, "rms_norm");
    if (w) KILN_CHECK(w->type == GgmlType::F32 && w->n_elements() == x.ne[0], "rms_norm: weight must be F32 [{}]", x.ne[0]);
    K::rms_norm(rows_of(x, "rms_norm x"), w ? fptr(*w) : nullptr, rows_of(y, "rms_norm y"), eps, pool_);
  }
  void l2_norm(const Tensor& x, const Tensor& y, float eps) override {
    check_same_shape(x, y, "l2_norm");
    K::l2_norm(rows_of(x, "l2_norm x"), rows_of(y, "l2_norm y"), eps, pool_);
  }
  void rope(const Tensor& x, const Tensor& pos, const RopeParams& p) override {
    check_i32(pos, x.ne[2], "rope pos");
    K::rope(rows_of(x, "rope x"), pos.host_as<const int32_t>(), p, pool_);
  }
  void softmax(const Tensor& x, float scale) override { K::softmax(rows_of(x, "softmax x"), scale, pool_); }
  void unary(Unary op, const Tensor& x, const Tensor& y) override {
    KILN_CHECK(x.is_contiguous() && y.is_contiguous() && x.n_elements() == y.n_elements(), "unary: contiguous, same size");
    check_f32(x, "unary x");
    check_f32(y, "unary y");
    const int64_t n = x.n_elements();
    switch (op) {
      case Unary::Silu: K::silu(fptr(x), fmut(y), n); break;
      case Unary::Sigmoid: K::sigmoid(fptr(x), fmut(y), n); break;
      case Unary::Softplus: K::softplus(fptr(x), fmut(y), n); break;
    }
  }
  void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& y) override {
    KILN_CHECK(a.is_contiguous() && b.is_contiguous() && y.is_contiguous() && a.n_elements() == b.n_elements() &&
                   a.n_elements() == y.n_elements(),
               "binary: contiguous, same size");
    check_f32(a, "binary a");
    check_f32(b, "binary b");
    check_f32(y, "binary y");
    const int64_t n = a.n_elements();
    switch (op) {
      case Binary::Add: K::add(fptr(a), fptr(b), fmut(y), n); break;
      case Binary::Mul: K::mul(fptr(a), fptr(b), fmut(y), n); break;
      case Binary::SwiGlu: K::swiglu(fptr(a), fptr(b), fmut(y), n); break;
      case Binary::SigmoidMul: K::sigmoid_mul(fptr(a), fptr(b), fmut(y), n); break;
    }
  }
  void scale(const Tensor& x, float s, const Tensor& y) override {
    KILN_CHECK(x.is_contiguous() && y.is_contiguous() && x.n_elements() == y.n_elements(), "scale: contiguous, same size");
    K::scale(fptr(x), s, fmut(y), x.n_elements());
  }
  void topk_route(const Tensor& logits, int k, bool renorm, float w_scale, const Tensor& ids,
                  const Tensor& weights) override {
    check_f32(logits, "topk_route logits");
    KILN_CHECK(logits.is_contiguous(), "topk_route: contiguous logits");
    check_i32(ids, int64_t(k) * logits.ne[1], "topk_route ids");
    KILN_CHECK(weights.is_contiguous() && weights.n_elements() == int64_t(k) * logits.ne[1], "topk_route: weights [k, n_tok]");
    K::topk_route(fptr(logits), logits.ne[0], logits.ne[1], k, renorm, w_scale, ids.host_as<int32_t>(), fmut(weights));
  }
  void kv_store(const Tensor& x, const Tensor& seq, const Tensor& pos, const Tensor& cache) override {
    KILN_CHECK(false, "kv_store: TODO (cpuseam)");
  }
  void attention(const Tensor& q, const Tensor& seq, const Tensor& pos, const Tensor& k, const Tensor& v,
                 const AttnSpec& p, const Tensor& out) override {
    KILN_CHECK(false, "attention: TODO (cpuseam)");
  }
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& seq, const Tensor& state, const Tensor& y) override {
    KILN_CHECK(false, "conv1d_silu: TODO (cpuseam)");
  }
  void gated_delta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const Tensor& seq, const Tensor& state, const Tensor& out, int chunk) override {
    KILN_CHECK(false, "gated_delta: TODO (cpuseam)");
  }

 private:
  void* ensure(size_t bytes, bool planned = false) {
    if (bytes > ws_size_) {
      if (ws_ || !planned) ++grows_;  // a first use without a reserve also counts
      std::free(ws_);
      ws_size_ = (bytes + 63) & ~size_t(63);
      ws_ = std::aligned_alloc(64, ws_size_);
      KILN_CHECK(ws_ != nullptr, "workspace allocation of {} bytes failed", ws_size_);
    }
    return ws_;
  }

  Device& dev_;
  ThreadPool& pool_;
  void* ws_ = nullptr;
  size_t ws_size_ = 0;
  int grows_ = 0;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int n_threads) : pool_(n_threads) {}
  DeviceType type() const override { return DeviceType::Cpu; }
  std::string name() const override {
    const auto& f = cpu_features();
    return fmt::format("CPU ({}, {} threads, {})", f.brand.empty() ? "unknown" : f.brand, pool_.size(),
                       isa_name(kernels::current_isa()));
  }
  std::unique_ptr<Buffer> alloc(size_t bytes) override {
    const size_t n = std::max<size_t>(64, (bytes + 63) & ~size_t(63));
    void* p = std::aligned_alloc(64, n);
    KILN_CHECK(p != nullptr, "CPU allocation of {} bytes failed", n);
    return std::make_unique<CpuBuffer>(*this, p, bytes, true);
  }
  std::unique_ptr<Buffer> wrap(const void* host, size_t bytes) override {
    return std::make_unique<CpuBuffer>(*this, const_cast<void*>(host), bytes, false);
  }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(*this, pool_); }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int n_threads) { return std::make_unique<CpuDevice>(n_threads); }

}  // namespace kiln::backend
