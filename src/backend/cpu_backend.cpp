// backend/cpu_backend.cpp — the CPU backend: host buffers (owned or wrapped), and a stream that runs
//   kernels/cpu ops on the device's ThreadPool as each op is enqueued (synchronously: synchronize()
//   is a no-op, capture() unsupported).
// Owns: the mapping of Stream ops onto kernels/ops.h calls — in particular, for the sequence ops,
//   how a batch splits into runs (consecutive tokens of one slot, read from the host seq/pos
//   tensors) and which kernel call each run gets (the same calls the model made before the Stream
//   existed, so results stay bit-identical); the non-flash attention orders (AttnOrder::GgmlTiny for
//   runs of >= 2 tokens, GgmlVec for one) and the chunk length of the chunked gated-delta form.
// Must not: know about models or layers.
// Threading: a CpuStream is used by one thread at a time; it reads and writes any host-addressable
//   Buffer (of any CPU device).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_sizes.h"
#include "core/cpu_features.h"
#include "core/op_profile.h"
#include "core/thread_pool.h"
#include "kernels/cuda/workspace.h"

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

size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

// The chunk length of the chunked gated-delta form (the CPU's choice; Stream::gated_delta's `chunk`
// is the shortest run that takes it).
constexpr int kDeltaChunk = 64;

// Host view of a per-token slot tensor (I32 [T]), each value checked against n_seq.
const int32_t* seq_of(const Tensor& seq, int64_t T, int64_t n_seq) {
  check_i32(seq, T, "seq");
  const auto* s = seq.host_as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) KILN_CHECK(s[t] >= 0 && s[t] < n_seq, "seq[{}] = {} outside [0, {})", t, s[t], n_seq);
  return s;
}
const int32_t* pos_of(const Tensor& pos, int64_t T, int64_t n_ctx) {
  check_i32(pos, T, "pos");
  const auto* p = pos.host_as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) KILN_CHECK(p[t] >= 0 && p[t] < n_ctx, "pos[{}] = {} outside [0, {})", t, p[t], n_ctx);
  return p;
}
// Host view of a keep tensor (I32 [T], values -1 or a slot < n_seq); nullptr for an empty Tensor.
const int32_t* keep_of(const Tensor& keep, int64_t T, int64_t n_seq) {
  if (keep.buf == nullptr) return nullptr;
  check_i32(keep, T, "keep");
  const auto* k = keep.host_as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) KILN_CHECK(k[t] >= -1 && k[t] < n_seq, "keep[{}] = {} outside [-1, {})", t, k[t], n_seq);
  return k;
}
bool any_kept(const int32_t* keep, int64_t t0, int64_t n) {
  if (!keep) return false;
  for (int64_t t = t0; t < t0 + n; ++t)
    if (keep[t] >= 0) return true;
  return false;
}
// Byte 0 of slot s of a per-sequence memory view (ne[3] = slots).
void* slot_ptr(const Tensor& mem, int32_t s) { return static_cast<char*>(mem.host()) + size_t(s) * mem.nb[3]; }
// fn(t0, n) for each run of consecutive tokens with the same slot.
template <class F>
void for_runs(const int32_t* seq, int64_t T, F&& fn) {
  for (int64_t t0 = 0; t0 < T;) {
    int64_t t1 = t0 + 1;
    while (t1 < T && seq[t1] == seq[t0]) ++t1;
    fn(t0, t1 - t0);
    t0 = t1;
  }
}

// The CPU streams' workspace sizes for a pool of n_threads workers (CpuStream answers through one).
class CpuSizes final : public WorkspaceSizes {
 public:
  explicit CpuSizes(int n_threads) : n_(n_threads) {}
  size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) const override {
    return K::matmul_workspace(wt, k, m, n_);
  }
  size_t attention_workspace(const AttnSpec& p, int64_t n_tok, int64_t n_kv_max) const override {
    K::AttnParams ap{p.head_dim, p.n_head, p.n_head_kv, p.scale};
    return K::attention_workspace(ap, n_);
  }
  size_t gated_delta_workspace(int64_t S, int64_t, int chunk, int64_t n_tok) const override {
    return chunk > 0 ? K::gated_delta_chunked_workspace(S, kDeltaChunk, n_) : 0;
  }
  size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) const override {
    return align64(K::matmul_workspace(wt, k, n_slots, n_)) + align64(size_t(n_slots) * 4) +
           align64(size_t(k * n_slots) * 4) + align64(size_t(n * n_slots) * 4);
  }
  size_t top_logits_workspace(int64_t n_vocab, int64_t n_rows, int k) const override { return 0; }

 private:
  int n_;
};

// ---- KILN_CPU_PROFILE (core/op_profile.h): each op's host time, the outermost op only (a fused op's
// parts are inside its row) ----
std::string shape(const Tensor& t) { return fmt::format("[{} {} {}]", t.ne[0], t.ne[1], t.ne[2]); }
struct ProfScope {
  std::string label;
  double bytes = 0;
  int* depth = nullptr;  // the stream's nesting count; nullptr: not timed
  op_profile::Clock::time_point t0{};
  ProfScope() = default;
  ProfScope(std::string l, double b, int* d) : label(std::move(l)), bytes(b), depth(d), t0(op_profile::Clock::now()) { ++*d; }
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;
  ~ProfScope() {
    if (!depth) return;
    --*depth;
    op_profile::add("op " + label, op_profile::ms_since(t0), bytes);
  }
};

class CpuStream final : public Stream {
 public:
  CpuStream(Device& dev, ThreadPool& pool) : dev_(dev), pool_(pool), sizes_(pool.size()) {}
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
    auto pf = prof([&] { return "copy " + shape(src); });
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
  void host_call(void (*fn)(void*), void* arg) override { fn(arg); }

  size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) const override {
    return sizes_.matmul_workspace(wt, k, n, m);
  }
  size_t attention_workspace(const AttnSpec& p, int64_t n_tok, int64_t n_kv_max) const override {
    return sizes_.attention_workspace(p, n_tok, n_kv_max);
  }
  size_t gated_delta_workspace(int64_t S, int64_t Hv, int chunk, int64_t n_tok) const override {
    return sizes_.gated_delta_workspace(S, Hv, chunk, n_tok);
  }
  size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) const override {
    return sizes_.matmul_id_workspace(wt, k, n, n_slots);
  }
  size_t top_logits_workspace(int64_t n_vocab, int64_t n_rows, int k) const override { return 0; }
  void reserve_workspace(size_t bytes) override { ensure(bytes, /*planned=*/true); }
  int workspace_grows() const override { return grows_; }

  void matmul(const Tensor& w, const Tensor& x, const Tensor& y) override {
    auto pf = prof([&] { return fmt::format("matmul {} {}x{} m{}", gguf::type_name(w.type), w.ne[0], w.ne[1], x.ne[1]); }, double(w.nb[1]) * double(w.ne[1]));
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
    auto pf = prof([&] { return fmt::format("get_rows {} {}", gguf::type_name(table.type), shape(out)); });
    check_f32(out, "get_rows out");
    check_i32(ids, out.ne[1], "get_rows ids");
    KILN_CHECK(out.ne[0] == table.ne[0], "get_rows: row length {} vs {}", out.ne[0], table.ne[0]);
    K::get_rows(table.type, table.host(), table.nb[1], table.ne[1], table.ne[0], ids.host_as<const int32_t>(), out.ne[1],
                fmut(out), int64_t(out.nb[1] / 4), pool_);
  }
  void rms_norm(const Tensor& x, const Tensor* w, const Tensor& y, float eps) override {
    auto pf = prof([&] { return "rms_norm " + shape(x); });
    check_same_shape(x, y, "rms_norm");
    if (w) KILN_CHECK(w->type == GgmlType::F32 && w->n_elements() == x.ne[0], "rms_norm: weight must be F32 [{}]", x.ne[0]);
    K::rms_norm(rows_of(x, "rms_norm x"), w ? fptr(*w) : nullptr, rows_of(y, "rms_norm y"), eps, pool_);
  }
  void l2_norm(const Tensor& x, const Tensor& y, float eps) override {
    auto pf = prof([&] { return "l2_norm " + shape(x); });
    check_same_shape(x, y, "l2_norm");
    K::l2_norm(rows_of(x, "l2_norm x"), rows_of(y, "l2_norm y"), eps, pool_);
  }
  void rope(const Tensor& x, const Tensor& pos, const RopeParams& p) override {
    auto pf = prof([&] { return "rope " + shape(x); });
    check_i32(pos, x.ne[2], "rope pos");
    K::rope(rows_of(x, "rope x"), pos.host_as<const int32_t>(), p, pool_);
  }
  void rope_multi(const Tensor& x, const Tensor& pos, const RopeParams& p) override {
    auto pf = prof([&] { return "rope_multi " + shape(x); });
    check_i32(pos, x.ne[2] * 4, "rope_multi pos");
    K::rope_multi(rows_of(x, "rope_multi x"), pos.host_as<const int32_t>(), p, pool_);
  }
  void softmax(const Tensor& x, float scale) override {
    auto pf = prof([&] { return "softmax " + shape(x); });
    K::softmax(rows_of(x, "softmax x"), scale, pool_);
  }
  // Unary / binary / scale: one kernel call per row of ne0 floats (the kernels' vector tails fall
  // where the caller's rows end); rows split across the pool when there are enough elements (a row's
  // result does not depend on the thread that computes it).
  void unary(Unary op, const Tensor& x, const Tensor& y) override {
    auto pf = prof([&] { return fmt::format("unary{} {}", int(op), shape(x)); });
    check_same_shape(x, y, "unary");
    const K::Rows xr = rows_of(x, "unary x"), yr = rows_of(y, "unary y");
    for_each_row(xr, [&](int64_t i1, int64_t i2) {
      const float* a = xr.row(i1, i2);
      float* o = yr.row(i1, i2);
      switch (op) {
        case Unary::Silu: K::silu(a, o, xr.ne0); break;
        case Unary::Sigmoid: K::sigmoid(a, o, xr.ne0); break;
        case Unary::Softplus: K::softplus(a, o, xr.ne0); break;
        case Unary::Gelu: K::gelu(a, o, xr.ne0); break;
        case Unary::GeluErf: K::gelu_erf(a, o, xr.ne0); break;
      }
    });
  }
  // b: same shape (a row of b per row of a), one row [ne0] (the same row for every row of a), or
  // [1, n1, n2] (a scalar per row, computed as if repeated across the row: the kernel runs over
  // chunks of a stack row filled with it; chunks of 256 keep every vector tail where one call over
  // the whole row puts it).
  void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& y) override {
    auto pf = prof([&] { return fmt::format("binary{} {}", int(op), shape(a)); });
    check_same_shape(a, y, "binary");
    const K::Rows ar = rows_of(a, "binary a"), br = rows_of(b, "binary b"), yr = rows_of(y, "binary y");
    const int64_t n = ar.ne0;
    enum { Same, Row, Scalar } mode;
    if (b.ne == a.ne) mode = Same;
    else if (b.ne[0] == n && b.ne[1] == 1 && b.ne[2] == 1 && b.ne[3] == 1) mode = Row;
    else if (b.ne[0] == 1 && b.ne[1] == a.ne[1] && b.ne[2] == a.ne[2] && b.ne[3] == 1) mode = Scalar;
    else {
      KILN_CHECK(false, "binary: b [{} {} {} {}] neither a's shape, one row of {}, nor one scalar per row", b.ne[0],
                 b.ne[1], b.ne[2], b.ne[3], n);
      return;
    }
    auto run = [op](const float* pa, const float* pb, float* o, int64_t len) {
      switch (op) {
        case Binary::Add: K::add(pa, pb, o, len); break;
        case Binary::Mul: K::mul(pa, pb, o, len); break;
        case Binary::SwiGlu: K::swiglu(pa, pb, o, len); break;
        case Binary::SigmoidMul: K::sigmoid_mul(pa, pb, o, len); break;
      }
    };
    constexpr int64_t kFill = 256;
    for_each_row(ar, [&](int64_t i1, int64_t i2) {
      const float* pa = ar.row(i1, i2);
      float* o = yr.row(i1, i2);
      if (mode != Scalar) {
        run(pa, mode == Same ? br.row(i1, i2) : br.p, o, n);
        return;
      }
      alignas(64) float fill[kFill];
      std::fill_n(fill, std::min(n, kFill), *br.row(i1, i2));
      for (int64_t c = 0; c < n; c += kFill) run(pa + c, fill, o + c, std::min(kFill, n - c));
    });
  }
  void scale(const Tensor& x, float s, const Tensor& y) override {
    auto pf = prof([&] { return "scale " + shape(x); });
    check_same_shape(x, y, "scale");
    const K::Rows xr = rows_of(x, "scale x"), yr = rows_of(y, "scale y");
    for_each_row(xr, [&](int64_t i1, int64_t i2) { K::scale(xr.row(i1, i2), s, yr.row(i1, i2), xr.ne0); });
  }
  void hadamard(const Tensor& x, int64_t n) override {
    auto pf = prof([&] { return "hadamard " + shape(x); });
    K::hadamard(rows_of(x, "hadamard x"), n, pool_);
  }
  void fill_zero(const Tensor& dst) override {
    auto pf = prof([&] { return "fill_zero " + shape(dst); });
    const size_t rb = dst.row_bytes();
    auto* d = static_cast<char*>(dst.host());
    for (int64_t i3 = 0; i3 < dst.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < dst.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < dst.ne[1]; ++i1) std::memset(d + i1 * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3], 0, rb);
  }

  // Expert mat-mul as kiln's MoE FFN has always formed it: for expert e in order, the slots (t, j)
  // routed to it, in (t, j) order, gathered into m contiguous columns; one kernels::matmul (expert
  // orders) over them; the m outputs scattered back. Workspace: [matmul ws | slot list | X | Y].
  void matmul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& y) override {
    auto pf = prof([&] { return fmt::format("matmul_id {} {}x{}x{} slots{}", gguf::type_name(w.type), w.ne[0], w.ne[1], w.ne[2], ids.ne[0] * ids.ne[1]); });
    check_f32(x, "matmul_id x");
    check_f32(y, "matmul_id y");
    const int64_t k = w.ne[0], n = w.ne[1], X = w.ne[2], Kx = ids.ne[0], T = ids.ne[1];
    KILN_CHECK(w.ne[3] == 1 && x.ne[3] == 1 && y.ne[3] == 1 && ids.ne[2] == 1 && ids.ne[3] == 1, "matmul_id: at most 3-D");
    check_i32(ids, Kx * T, "matmul_id ids");
    KILN_CHECK(x.ne[0] == k && (x.ne[1] == 1 || x.ne[1] == Kx) && x.ne[2] == T && y.ne[0] == n && y.ne[1] == Kx &&
                   y.ne[2] == T,
               "matmul_id: w [{}, {}, {}] x [{}, {}, {}] ids [{}, {}] -> y [{}, {}, {}]", k, n, X, x.ne[0], x.ne[1],
               x.ne[2], Kx, T, y.ne[0], y.ne[1], y.ne[2]);
    const int64_t slots = Kx * T;
    auto* ws = static_cast<char*>(ensure(matmul_id_workspace(w.type, k, n, slots)));
    const size_t mws = align64(K::matmul_workspace(w.type, k, slots, pool_.size()));
    auto* slot = reinterpret_cast<int32_t*>(ws + mws);
    auto* xg = reinterpret_cast<float*>(ws + mws + align64(size_t(slots) * 4));
    auto* yg = reinterpret_cast<float*>(reinterpret_cast<char*>(xg) + align64(size_t(k * slots) * 4));
    const auto* id = ids.host_as<const int32_t>();
    for (int64_t r = 0; r < slots; ++r) KILN_CHECK(id[r] >= 0 && id[r] < X, "matmul_id: expert {} outside [0, {})", id[r], X);
    const auto* xb = static_cast<const char*>(x.host());
    auto* yb = static_cast<char*>(y.host());
    const bool per_slot = x.ne[1] > 1;
    for (int64_t e = 0; e < X; ++e) {
      int64_t m = 0;
      for (int64_t r = 0; r < slots; ++r)
        if (id[r] == e) {
          const int64_t t = r / Kx, j = r % Kx;
          slot[m] = int32_t(r);
          std::memcpy(xg + m * k, xb + t * x.nb[2] + (per_slot ? j : 0) * x.nb[1], size_t(k) * 4);
          ++m;
        }
      if (m == 0) continue;
      K::MatmulArgs a;
      a.wt = w.type;
      a.w = static_cast<const char*>(w.host()) + size_t(e) * w.nb[2];
      a.w_stride = w.nb[1];
      a.k = k;
      a.n = n;
      a.m = m;
      a.x = xg;
      a.x_stride = k;
      a.y = yg;
      a.y_stride = n;
      a.expert = X > 1;  // one matrix of a stacked expert tensor: llama.cpp's mul_mat_id orders
      K::matmul(a, ws, pool_);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t t = slot[i] / Kx, j = slot[i] % Kx;
        std::memcpy(yb + t * y.nb[2] + j * y.nb[1], yg + i * n, size_t(n) * 4);
      }
    }
  }
  void top_logits(const Tensor& logits, int k, const Tensor& ids, const Tensor& vals) override {
    auto pf = prof([&] { return "top_logits " + shape(logits); });
    check_f32(logits, "top_logits logits");
    KILN_CHECK(logits.is_contiguous() && logits.ne[2] == 1 && logits.ne[3] == 1, "top_logits: contiguous logits [V, n]");
    check_i32(ids, int64_t(k) * logits.ne[1], "top_logits ids");
    check_f32(vals, "top_logits vals");
    KILN_CHECK(vals.is_contiguous() && vals.n_elements() == int64_t(k) * logits.ne[1], "top_logits: vals [k, n]");
    const int64_t V = logits.ne[0];
    int32_t* id = ids.host_as<int32_t>();
    float* v = fmut(vals);
    const float* l = fptr(logits);
    // Rows in parallel (a 248k vocabulary is ~0.3 ms per row on one core).
    pool_.parallel_for(logits.ne[1], [&](int64_t r0, int64_t r1, int) {
      K::top_logits(l + r0 * V, V, r1 - r0, k, id + r0 * k, v + r0 * k);
    });
  }
  void topk_route(const Tensor& logits, int k, bool renorm, float w_scale, const Tensor& ids,
                  const Tensor& weights) override {
    auto pf = prof([&] { return "topk_route " + shape(logits); });
    check_f32(logits, "topk_route logits");
    KILN_CHECK(logits.is_contiguous(), "topk_route: contiguous logits");
    check_i32(ids, int64_t(k) * logits.ne[1], "topk_route ids");
    KILN_CHECK(weights.is_contiguous() && weights.n_elements() == int64_t(k) * logits.ne[1], "topk_route: weights [k, n_tok]");
    K::topk_route(fptr(logits), logits.ne[0], logits.ne[1], k, renorm, w_scale, ids.host_as<int32_t>(), fmut(weights));
  }
  // ---- sequence ops: the CPU reads seq/pos from host memory, splits the batch into runs
  // (consecutive tokens of one slot) and calls the kernel once per run. ----
  void kv_store(const Tensor& x, const Tensor& seq, const Tensor& pos, const Tensor& cache) override {
    auto pf = prof([&] { return fmt::format("kv_store {} {}", gguf::type_name(cache.type), shape(x)); });
    const K::Rows xr = rows_of(x, "kv_store x");
    const int64_t T = xr.n2;
    KILN_CHECK(cache.ne[0] == xr.ne0 && cache.ne[1] == xr.n1, "kv_store: rows [{}, {}] into a cache of [{}, {}]", xr.ne0,
               xr.n1, cache.ne[0], cache.ne[1]);
    const int32_t* sq = seq_of(seq, T, cache.ne[3]);
    const int32_t* ps = pos_of(pos, T, cache.ne[2]);
    for_runs(sq, T, [&](int64_t t0, int64_t n) {
      K::kv_store(cache.type, K::CRows(xr.row(0, t0), xr.ne0, xr.n1, n, xr.s1, xr.s2), ps + t0,
                  slot_ptr(cache, sq[t0]), cache.nb[2], cache.nb[1]);
    });
  }
  // Per run: n_kv = pos0 + n (the run's last position + 1); not causal: k.ne[2] for every token. flash = false: ggml's non-flash orders
  // by ggml's rule — tinyBLAS sums for a run of >= 2 tokens, vec_dot sums for one.
  void attention(const Tensor& q, const Tensor& seq, const Tensor& pos, const Tensor& k, const Tensor& v,
                 const AttnSpec& p, const Tensor& out) override {
    auto pf = prof([&] { return fmt::format("attention {} {}{}", gguf::type_name(k.type), shape(q), p.flash ? " fa" : ""); });
    const K::Rows qr = rows_of(q, "attention q"), orow = rows_of(out, "attention out");
    const int64_t T = qr.n2;
    KILN_CHECK(qr.ne0 == p.head_dim && qr.n1 == p.n_head && orow.ne0 == p.head_dim && orow.n1 == p.n_head &&
                   orow.n2 == T && k.ne[0] == p.head_dim && k.ne[1] == p.n_head_kv && v.ne[0] == p.head_dim &&
                   v.ne[1] == p.n_head_kv && v.ne[2] == k.ne[2] && v.ne[3] == k.ne[3],
               "attention: q [{}, {}, {}] k [{}, {}, {}, {}] for head_dim {}, heads {}/{}", qr.ne0, qr.n1, T, k.ne[0],
               k.ne[1], k.ne[2], k.ne[3], p.head_dim, p.n_head, p.n_head_kv);
    const int32_t* sq = seq_of(seq, T, k.ne[3]);
    if (!p.causal) check_i32(pos, T, "pos");
    const int32_t* ps = p.causal ? pos_of(pos, T, k.ne[2]) : nullptr;
    void* ws = ensure(attention_workspace(p, T, k.ne[2]));
    K::AttnParams ap{p.head_dim, p.n_head, p.n_head_kv, p.scale, K::AttnOrder::Flash};
    if (!p.causal && int64_t(all_last_.size()) < T) all_last_.resize(size_t(T));  // grows once per size
    for_runs(sq, T, [&](int64_t t0, int64_t n) {
      if (p.causal)
        for (int64_t i = 1; i < n; ++i)
          KILN_CHECK(ps[t0 + i] == ps[t0] + i, "attention: slot {} positions {} and {} are not consecutive", sq[t0],
                     ps[t0 + i - 1], ps[t0 + i]);
      if (!p.flash) ap.order = n >= 2 ? K::AttnOrder::GgmlTiny : K::AttnOrder::GgmlVec;
      // Not causal: every token's last key is the cache view's last position.
      const int64_t n_kv = p.causal ? int64_t(ps[t0]) + n : k.ne[2];
      const int32_t* last = p.causal ? ps + t0 : nullptr;
      if (!p.causal) {
        std::fill_n(all_last_.begin(), n, int32_t(n_kv - 1));
        last = all_last_.data();
      }
      const K::KvView kv{k.type, slot_ptr(k, sq[t0]), k.nb[2], k.nb[1], n_kv};
      const K::KvView vv{v.type, slot_ptr(v, sq[t0]), v.nb[2], v.nb[1], n_kv};
      K::attention(K::CRows(qr.row(0, t0), qr.ne0, qr.n1, n, qr.s1, qr.s2), last, kv, vv, ap,
                   K::Rows{orow.row(0, t0), orow.ne0, orow.n1, n, orow.s1, orow.s2}, ws, pool_);
    });
  }
  // A run with kept tokens (keep[t] >= 0: a speculative verify step) hands the kernels the keep slots'
  // states, which receive the state after their token (the bits of one-token calls).
  float* const* keep_states(const Tensor& state, const int32_t* kp, int64_t t0, int64_t n) {
    if (!any_kept(kp, t0, n)) return nullptr;
    if (int64_t(keep_states_.size()) < n) keep_states_.resize(size_t(n));  // grows once per size
    for (int64_t t = t0; t < t0 + n; ++t)
      keep_states_[size_t(t - t0)] = kp[t] >= 0 ? static_cast<float*>(slot_ptr(state, kp[t])) : nullptr;
    return keep_states_.data();
  }
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& seq, const Tensor& state, const Tensor& y,
                   const Tensor& keep) override {
    auto pf = prof([&] { return "conv1d_silu " + shape(x); });
    const K::Rows xr = rows_of(x, "conv1d_silu x"), yr = rows_of(y, "conv1d_silu y");
    check_f32(w, "conv1d_silu w");
    check_f32(state, "conv1d_silu state");
    const int64_t C = xr.ne0, T = xr.n1 * xr.n2, d_conv = w.ne[0];
    KILN_CHECK(xr.n2 == 1 && yr.n2 == 1 && yr.ne0 == C && yr.n1 == T, "conv1d_silu: x, y must be [C, T]");
    KILN_CHECK(w.ne[1] == C && w.is_contiguous() && state.ne[0] == d_conv - 1 && state.ne[1] == C && state.ne[2] == 1 &&
                   state.nb[1] == size_t(d_conv - 1) * 4,
               "conv1d_silu: w [{}, {}] state [{}, {}] for {} channels", w.ne[0], w.ne[1], state.ne[0], state.ne[1], C);
    const int32_t* sq = seq_of(seq, T, state.ne[3]);
    const int32_t* kp = keep_of(keep, T, state.ne[3]);
    for_runs(sq, T, [&](int64_t t0, int64_t n) {
      auto* st = static_cast<float*>(slot_ptr(state, sq[t0]));
      K::conv1d_silu(xr.row(t0, 0), xr.s1, fptr(w), st, yr.row(t0, 0), yr.s1, C, n, int(d_conv), pool_,
                     keep_states(state, kp, t0, n));
    });
  }
  // Runs of at least `chunk` tokens (chunk > 0) take the chunked form with chunks of kDeltaChunk.
  void gated_delta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const Tensor& seq, const Tensor& state, const Tensor& out, int chunk, const Tensor& keep) override {
    auto pf = prof([&] { return fmt::format("gated_delta {} chunk{}", shape(v), chunk); });
    const K::Rows qr = rows_of(q, "gated_delta q"), kr = rows_of(k, "gated_delta k"), vr = rows_of(v, "gated_delta v"),
                  orow = rows_of(out, "gated_delta out");
    check_f32(g, "gated_delta g");
    check_f32(beta, "gated_delta beta");
    check_f32(state, "gated_delta state");
    const int64_t S = qr.ne0, Hk = qr.n1, Hv = vr.n1, T = qr.n2;
    KILN_CHECK(kr.ne0 == S && kr.n1 == Hk && kr.n2 == T && kr.s2 == qr.s2 && qr.s1 == S && kr.s1 == S && vr.ne0 == S &&
                   vr.s1 == S && vr.n2 == T && orow.ne0 == S && orow.n1 == Hv && orow.n2 == T && orow.s1 == S,
               "gated_delta: q/k [{}, {}, {}] v [{}, {}, {}] out [{}, {}, {}] (heads contiguous, q and k one token stride)",
               S, Hk, T, vr.ne0, vr.n1, vr.n2, orow.ne0, orow.n1, orow.n2);
    KILN_CHECK(g.is_contiguous() && beta.is_contiguous() && g.n_elements() == Hv * T && beta.n_elements() == Hv * T,
               "gated_delta: g, beta must be contiguous [{}, {}]", Hv, T);
    KILN_CHECK(state.ne[0] == S && state.ne[1] == S && state.ne[2] == Hv && state.nb[1] == size_t(S) * 4 &&
                   state.nb[2] == size_t(S * S) * 4,
               "gated_delta: state must be [{}, {}, {}, n_seq] with contiguous slots", S, S, Hv);
    const int32_t* sq = seq_of(seq, T, state.ne[3]);
    const int32_t* kp = keep_of(keep, T, state.ne[3]);
    void* ws = chunk > 0 ? ensure(gated_delta_workspace(S, Hv, chunk, T)) : nullptr;
    for_runs(sq, T, [&](int64_t t0, int64_t n) {
      K::DeltaArgs a;
      a.q = qr.row(0, t0);
      a.k = kr.row(0, t0);
      a.qk_stride = qr.s2;
      a.v = vr.row(0, t0);
      a.v_stride = vr.s2;
      a.g = fptr(g) + t0 * Hv;
      a.beta = fptr(beta) + t0 * Hv;
      a.state = static_cast<float*>(slot_ptr(state, sq[t0]));
      a.out = orow.row(0, t0);
      a.out_stride = orow.s2;
      a.S = S;
      a.Hk = Hk;
      a.Hv = Hv;
      a.n_t = n;
      a.keep = keep_states(state, kp, t0, n);  // a kept run: the recurrence, each kept state into its slot
      if (chunk > 0 && n >= chunk && a.keep == nullptr) K::gated_delta_rule_chunked(a, kDeltaChunk, ws, pool_);
      else K::gated_delta_rule(a, pool_);
    });
  }

  // ---- fused ops: the very calls each stands for (Stream's comments), so the bits do not change ----
  void matmul_n(const Tensor* w, const Tensor* y, int n, const Tensor& x) override {
    KILN_CHECK(n >= 1 && n <= 4, "matmul_n: {} weights (1..4)", n);
    for (int i = 0; i < n; ++i) matmul(w[i], x, y[i]);
  }
  void delta_gates(const Tensor& beta, const Tensor& g, const Tensor& dt_bias, const Tensor& a) override {
    auto pf = prof([&] { return "delta_gates " + shape(g); });
    check_same_shape(beta, g, "delta_gates beta/g");
    unary(Unary::Sigmoid, beta, beta);
    binary(Binary::Add, g, dt_bias, g);
    unary(Unary::Softplus, g, g);
    binary(Binary::Mul, g, a, g);
  }
  void rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps) override {
    auto pf = prof([&] { return "rms_norm_gated " + shape(x); });
    check_same_shape(x, z, "rms_norm_gated x/z");
    rms_norm(x, &w, x, eps);
    unary(Unary::Silu, z, z);
    binary(Binary::Mul, x, z, x);
  }
  void add_rms_norm(const Tensor& x, const Tensor& t, const Tensor* w, const Tensor& y, float eps) override {
    auto pf = prof([&] { return "add_rms_norm " + shape(x); });
    check_same_shape(x, t, "add_rms_norm x/t");
    binary(Binary::Add, x, t, x);
    rms_norm(x, w, y, eps);
  }

 private:
  // Times the caller's scope as label() with `bytes` of weights read, unless profiling is off or an
  // enclosing op is timed already.
  template <class F>
  std::optional<ProfScope> prof(F&& label, double bytes = 0) {
    if (!op_profile::on() || prof_depth_ > 0) return std::nullopt;
    return std::optional<ProfScope>(std::in_place, label(), bytes, &prof_depth_);
  }
  int prof_depth_ = 0;
  // fn(i1, i2) for every row of r: in parallel (dynamic chunks of whole rows) from kParRowsMin
  // elements, else on the calling thread (a decode step's small rows: a pool wake-up costs more).
  template <class F>
  void for_each_row(const K::Rows& r, F&& fn) {
    constexpr int64_t kParRowsMin = 64 * 1024;
    const int64_t nr = r.n1 * r.n2;
    if (pool_.size() < 2 || nr < 2 || nr * r.ne0 < kParRowsMin) {
      for (int64_t i2 = 0; i2 < r.n2; ++i2)
        for (int64_t i1 = 0; i1 < r.n1; ++i1) fn(i1, i2);
      return;
    }
    const int64_t chunk = std::max<int64_t>(1, nr / (4 * pool_.size()));
    pool_.parallel_for_dynamic(nr, [&](int64_t a, int64_t b, int) {
      for (int64_t i = a; i < b; ++i) fn(i % r.n1, i / r.n1);
    }, 1, chunk);
  }

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
  CpuSizes sizes_;
  void* ws_ = nullptr;
  size_t ws_size_ = 0;
  int grows_ = 0;
  std::vector<int32_t> all_last_;  // [T] a non-causal run's last key per token (attention)
  std::vector<float*> keep_states_;  // [run length] a speculative run's keep-slot states per token (keep_states)
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int n_threads) : own_(std::make_unique<ThreadPool>(n_threads)), pool_(*own_) {}
  explicit CpuDevice(ThreadPool& pool) : pool_(pool) {}
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
  std::unique_ptr<Buffer> alloc_host(size_t bytes) override { return alloc(bytes); }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(*this, pool_); }

 private:
  std::unique_ptr<ThreadPool> own_;
  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int n_threads) { return std::make_unique<CpuDevice>(n_threads); }
std::unique_ptr<Device> make_cpu_device(ThreadPool& pool) { return std::make_unique<CpuDevice>(pool); }

std::unique_ptr<WorkspaceSizes> workspace_sizes(DeviceType type, int n_threads) {
  if (type == DeviceType::Cpu) return std::make_unique<CpuSizes>(ThreadPool::resolve_threads(n_threads));
  return std::make_unique<CudaSizes>();
}

size_t cuda_stream_fixed_bytes(int sm) { return cuda::detail::cublas_workspace_bytes(sm); }

uint64_t cuda_context_bytes(const CudaCard& card) {
  constexpr uint64_t kMiB = uint64_t(1) << 20;
  const char* ml = std::getenv("CUDA_MODULE_LOADING");
  const bool eager = ml != nullptr && std::string_view(ml) == "EAGER";
  const uint64_t local = card.stack_bytes * uint64_t(card.threads_per_sm) * uint64_t(card.n_sm);
  return 262 * kMiB + local + (eager ? 640 : 128) * kMiB;
}

}  // namespace kiln::backend
