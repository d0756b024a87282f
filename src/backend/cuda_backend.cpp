// backend/cuda_backend.cpp — the CUDA device: CudaDevice (one per GPU ordinal, process-wide),
//   CudaBuffer (cudaMalloc memory, not host-addressable), CudaStream (a cudaStream_t with a cuBLAS
//   handle bound to it and one device workspace) and CudaGraph (an instantiated CUDA graph).
// Owns: the mapping of every Stream op onto the launchers of kernels/cuda/cuda_ops.h (shape and type
//   checks here, arithmetic there), transfers, workspaces, graph capture/replay, and turning CUDA /
//   cuBLAS errors into KILN_CHECK failures that name the call and the error.
// Must not: synchronize inside ops (only synchronize() and download of pageable memory block), or
//   allocate inside ops except a workspace growth (counted in workspace_grows(); refused while a
//   graph is being captured).
// Threading: a Stream is used by one thread at a time; Devices and Buffers may be shared. Graph
//   capture uses cudaStreamCaptureModeThreadLocal: only the capturing thread is barred from unsafe
//   calls (cudaMalloc...), other threads' streams keep working.
#include "backend/backend.h"

#ifdef KILN_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda_sizes.h"
#include "core/log.h"
#include "core/op_profile.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/invariant.h"
#endif

namespace kiln::backend {
#ifndef KILN_HAVE_CUDA
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "kiln was built without CUDA (no nvcc found at build time)"; }
Device& cuda_device(int) { KILN_CHECK(false, "kiln was built without CUDA"); __builtin_unreachable(); }
bool cuda_memory_info(int, CudaMemoryInfo*) { return false; }
std::string cuda_profile_report() { return ""; }
#else

#define KILN_CUDA_CALL(call)                                                                                  \
  do {                                                                                                        \
    const cudaError_t e_ = (call);                                                                            \
    KILN_CHECK(e_ == cudaSuccess, "{} failed: {} ({})", #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
  } while (0)
#define KILN_CUBLAS_CALL(call)                                                                          \
  do {                                                                                                  \
    const cublasStatus_t s_ = (call);                                                                   \
    KILN_CHECK(s_ == CUBLAS_STATUS_SUCCESS, "{} failed: {}", #call, cublasGetStatusString(s_));         \
  } while (0)

namespace {

// Runs with `ordinal` as the calling thread's current device (restores the previous one).
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    KILN_CUDA_CALL(cudaGetDevice(&prev_));
    if (prev_ != ordinal) KILN_CUDA_CALL(cudaSetDevice(ordinal));
    else prev_ = -1;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

class CudaDevice;

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(CudaDevice& dev, void* p, size_t n) : dev_(dev), p_(p), n_(n) {}
  ~CudaBuffer() override;
  Device& device() const override;
  size_t size() const override { return n_; }
  void* host_ptr() const override { return nullptr; }
  void* dev_ptr() const { return p_; }

 private:
  CudaDevice& dev_;
  void* p_;
  size_t n_;
};

// Host memory from alloc_host: page-locked (cudaHostAlloc) or, failing that, ordinary.
class CudaHostBuffer final : public Buffer {
 public:
  CudaHostBuffer(Device& dev, size_t n) : dev_(dev), n_(n) {
    const size_t bytes = std::max<size_t>(64, (n + 63) & ~size_t(63));
    if (bytes <= Device::kMaxPinnedBytes && cudaHostAlloc(&p_, bytes, cudaHostAllocDefault) == cudaSuccess) {
      pinned_ = true;
    } else {
      (void)cudaGetLastError();  // a refused page-locked allocation is not an error of later calls
      p_ = std::aligned_alloc(64, bytes);
      KILN_CHECK(p_ != nullptr, "host allocation of {} bytes failed", bytes);
    }
  }
  ~CudaHostBuffer() override {
    if (pinned_) cudaFreeHost(p_);
    else std::free(p_);
  }
  Device& device() const override { return dev_; }
  size_t size() const override { return n_; }
  void* host_ptr() const override { return p_; }

 private:
  Device& dev_;
  void* p_ = nullptr;
  size_t n_;
  bool pinned_ = false;
};

class CudaGraph final : public Graph {
 public:
  CudaGraph(int ordinal, cudaGraph_t g, cudaGraphExec_t e) : ordinal_(ordinal), graph_(g), exec_(e) {}
  ~CudaGraph() override {
    DeviceScope ds(ordinal_);
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  int ordinal() const { return ordinal_; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  int ordinal_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    KILN_CUDA_CALL(cudaGetDeviceProperties(&prop_, ordinal));
  }
  DeviceType type() const override { return DeviceType::Cuda; }
  std::string name() const override {
    return fmt::format("CUDA{}: {} ({:.1f} GiB, sm_{}{}, {} SMs)", ordinal_, prop_.name,
                       double(prop_.totalGlobalMem) / double(1ull << 30), prop_.major, prop_.minor,
                       prop_.multiProcessorCount);
  }
  std::unique_ptr<Buffer> alloc(size_t bytes) override {
    DeviceScope ds(ordinal_);
    void* p = nullptr;
    const size_t n = std::max<size_t>(256, (bytes + 255) & ~size_t(255));
    const cudaError_t e = cudaMalloc(&p, n);
    KILN_CHECK(e == cudaSuccess, "cudaMalloc of {} bytes on {} failed: {} ({})", n, prop_.name, cudaGetErrorName(e),
               cudaGetErrorString(e));
    KILN_CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0, "cudaMalloc returned a pointer not 256-byte aligned");
    return std::make_unique<CudaBuffer>(*this, p, bytes);
  }
  std::unique_ptr<Buffer> wrap(const void*, size_t) override { return nullptr; }  // weights are uploaded
  std::unique_ptr<Buffer> alloc_host(size_t bytes) override {
    DeviceScope ds(ordinal_);
    return std::make_unique<CudaHostBuffer>(*this, bytes);
  }
  std::unique_ptr<Stream> create_stream() override;

  int ordinal() const { return ordinal_; }
  int sm() const { return prop_.major * 10 + prop_.minor; }
  int n_sm() const { return prop_.multiProcessorCount; }
  int threads_per_sm() const { return prop_.maxThreadsPerMultiProcessor; }

 private:
  int ordinal_;
  cudaDeviceProp prop_{};
};

CudaBuffer::~CudaBuffer() {
  DeviceScope ds(dev_.ordinal());
  cudaFree(p_);  // errors at process teardown (driver already unloaded) are not actionable
}
Device& CudaBuffer::device() const { return dev_; }

namespace C = kiln::cuda;

void check_f32(const Tensor& t, const char* what) {
  KILN_CHECK(t.type == GgmlType::F32 && t.nb[0] == 4 && t.nb[1] % 4 == 0 && t.nb[2] % 4 == 0 && t.nb[3] % 4 == 0,
             "{}: expected an F32 tensor with float-aligned strides, got {}", what, gguf::type_name(t.type));
}
void check_same_shape(const Tensor& a, const Tensor& b, const char* what) {
  KILN_CHECK(a.ne == b.ne, "{}: shape mismatch [{} {} {} {}] vs [{} {} {} {}]", what, a.ne[0], a.ne[1], a.ne[2], a.ne[3],
             b.ne[0], b.ne[1], b.ne[2], b.ne[3]);
}

// ---- KILN_CUDA_PROFILE (backend.h: cuda_profile_report) ----
bool profiling() {
  static const bool on = op_profile::env_on("KILN_CUDA_PROFILE");
  return on;
}
op_profile::Table& prof_table() {  // label -> totals over every stream
  static auto* t = new op_profile::Table();  // never destroyed, like the devices
  return *t;
}
constexpr int64_t kProfHoldUs = 20000;  // device-side hold at the start of each step (host enqueues meanwhile)

class CudaStream final : public Stream {
 public:
  explicit CudaStream(CudaDevice& dev) : dev_(dev) {
    DeviceScope ds(dev.ordinal());
    KILN_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUBLAS_CALL(cublasCreate(&blas_));
    KILN_CUBLAS_CALL(cublasSetStream(blas_, stream_));
    // cuBLAS gets its own workspace so that it never allocates while a graph is being captured
    // (NVIDIA's advice: 32 MiB on Hopper, 4 MiB before).
    blas_ws_bytes_ = cuda_stream_fixed_bytes(dev.sm());
    KILN_CUDA_CALL(cudaMalloc(&blas_ws_, blas_ws_bytes_));
    KILN_CUBLAS_CALL(cublasSetWorkspace(blas_, blas_ws_, blas_ws_bytes_));
    L_.stream = stream_;
    L_.blas = blas_;
    L_.sm = C::code_sm(dev.sm());
    if (L_.sm < dev.sm()) {
      static std::once_flag once;
      std::call_once(once, [&] {
        KILN_LOG_INFO("CUDA{}: sm_{} card running sm_{} code (a build for an older card, or KILN_CUDA_SM): the "
                      "newer cards' kernel paths are off; build with -DKILN_CUDA_ARCHS=native for them",
                      dev.ordinal(), dev.sm(), L_.sm);
      });
    }
    L_.n_sm = dev.n_sm();
  }
  ~CudaStream() override {
    DeviceScope ds(dev_.ordinal());
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cublasDestroy(blas_);
    cudaFree(blas_ws_);
    cudaFree(ws_);
    cudaStreamDestroy(stream_);
  }
  Device& device() const override { return dev_; }

  // ---- transfers ----
  void upload(const Tensor& dst, const void* src, size_t bytes) override {
    flush();
    KILN_CHECK(dst.is_contiguous() && bytes <= dst.n_bytes(), "upload: {} bytes into a {}-byte tensor", bytes, dst.n_bytes());
    if (bytes == 0) return;
    DeviceScope ds(dev_.ordinal());
    KILN_CUDA_CALL(cudaMemcpyAsync(ptr(dst, "upload dst"), src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void download(void* dst, const Tensor& src, size_t bytes) override {
    flush();
    KILN_CHECK(src.is_contiguous() && bytes <= src.n_bytes(), "download: {} bytes from a {}-byte tensor", bytes,
               src.n_bytes());
    if (bytes == 0) return;
    DeviceScope ds(dev_.ordinal());
    KILN_CUDA_CALL(cudaMemcpyAsync(dst, ptr(src, "download src"), bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    flush();
    KILN_CHECK(dst.type == src.type, "copy: type mismatch ({} vs {})", gguf::type_name(dst.type), gguf::type_name(src.type));
    check_same_shape(dst, src, "copy");
    if (dst.n_elements() == 0) return;
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "copy " + shape(src); });
    const size_t dnb[3] = {dst.nb[1], dst.nb[2], dst.nb[3]}, snb[3] = {src.nb[1], src.nb[2], src.nb[3]};
    const int64_t ne[3] = {src.ne[1], src.ne[2], src.ne[3]};
    C::copy_rows(L_, ptr(dst, "copy dst"), dnb, ptr(src, "copy src"), snb, src.row_bytes(), ne);
  }
  void fill_zero(const Tensor& dst) override {
    flush();
    if (dst.n_elements() == 0) return;
    DeviceScope ds(dev_.ordinal());
    char* p = static_cast<char*>(ptr(dst, "fill_zero"));
    if (dst.is_contiguous()) {
      KILN_CUDA_CALL(cudaMemsetAsync(p, 0, dst.n_bytes(), stream_));
      return;
    }
    // Merge dims 1..3 where they are contiguous with the one below, then one 2-D memset (width =
    // the dense span, pitch = the next stride) per remaining outer index.
    size_t width = dst.row_bytes();
    std::array<int64_t, 3> ne{};
    std::array<size_t, 3> nb{};
    int nd = 0;
    for (int d = 1; d < 4; ++d) {
      if (dst.ne[d] == 1) continue;
      if (nd == 0 && dst.nb[d] == width) width *= size_t(dst.ne[d]);
      else if (nd > 0 && dst.nb[d] == nb[nd - 1] * size_t(ne[nd - 1])) ne[nd - 1] *= dst.ne[d];
      else ne[nd] = dst.ne[d], nb[nd] = dst.nb[d], ++nd;
    }
    if (nd == 0) {
      KILN_CUDA_CALL(cudaMemsetAsync(p, 0, width, stream_));
      return;
    }
    KILN_CHECK(nb[0] >= width, "fill_zero: overlapping rows (stride {} < {} bytes)", nb[0], width);
    const int64_t n_outer1 = nd > 1 ? ne[1] : 1, n_outer2 = nd > 2 ? ne[2] : 1;
    for (int64_t j = 0; j < n_outer2; ++j)
      for (int64_t i = 0; i < n_outer1; ++i)
        KILN_CUDA_CALL(cudaMemset2DAsync(p + i * (nd > 1 ? nb[1] : 0) + j * (nd > 2 ? nb[2] : 0), nb[0], 0, width,
                                         size_t(ne[0]), stream_));
  }
  void synchronize() override {
    flush();
    DeviceScope ds(dev_.ordinal());
    KILN_CUDA_CALL(cudaStreamSynchronize(stream_));
    if (!timed_.empty()) prof_collect();
  }

  void host_call(void (*fn)(void*), void* arg) override {
    flush();
    DeviceScope ds(dev_.ordinal());
    KILN_CUDA_CALL(cudaLaunchHostFunc(stream_, fn, arg));
  }

  // ---- graphs ----
  std::unique_ptr<Graph> capture(const std::function<void()>& body) override {
    if (profiling()) return nullptr;  // ops are timed one by one
    flush();
    DeviceScope ds(dev_.ordinal());
    KILN_CUDA_CALL(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t g = nullptr;
    try {
      body();
      flush();  // a deferred op of the body belongs to the graph
    } catch (...) {
      def_.on = false;  // leave the stream usable: end (and drop) the capture, then rethrow
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    KILN_CUDA_CALL(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t e = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
    if (err != cudaSuccess) cudaGraphDestroy(g);
    KILN_CHECK(err == cudaSuccess, "cudaGraphInstantiate failed: {} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
    return std::make_unique<CudaGraph>(dev_.ordinal(), g, e);
  }
  void replay(Graph& g) override {
    flush();
    auto* cg = dynamic_cast<CudaGraph*>(&g);
    KILN_CHECK(cg != nullptr && cg->ordinal() == dev_.ordinal(), "replay: not a graph captured on CUDA{}", dev_.ordinal());
    DeviceScope ds(dev_.ordinal());
    KILN_CUDA_CALL(cudaGraphLaunch(cg->exec(), stream_));
  }

  // ---- workspaces: the sizes are CudaSizes' (backend/cuda_sizes.h), as workspace_sizes(Cuda) plans them ----
  size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) const override {
    return sizes_.matmul_workspace(wt, k, n, m);
  }
  size_t gated_delta_workspace(int64_t S, int64_t Hv, int chunk, int64_t n_tok) const override {
    return sizes_.gated_delta_workspace(S, Hv, chunk, n_tok);
  }
  size_t attention_workspace(const AttnSpec& p, int64_t n_tok, int64_t n_kv_max) const override {
    return sizes_.attention_workspace(p, n_tok, n_kv_max);
  }
  size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) const override {
    return sizes_.matmul_id_workspace(wt, k, n, n_slots);
  }
  size_t top_logits_workspace(int64_t n_vocab, int64_t n_rows, int k) const override {
    return sizes_.top_logits_workspace(n_vocab, n_rows, k);
  }
  void reserve_workspace(size_t bytes) override { ensure(bytes, /*planned=*/true); }
  void set_batch_invariant(bool on) override { C::set_batch_invariant(on); }
  int workspace_grows() const override { return grows_; }

  // ---- ops ----
  void matmul(const Tensor& w, const Tensor& x, const Tensor& y) override {
    check_f32(x, "matmul x");
    check_f32(y, "matmul y");
    KILN_CHECK(C::matmul_supported(w.type), "matmul: weight type {} not supported on CUDA", gguf::type_name(w.type));
    KILN_CHECK(w.ne[2] == 1 && w.ne[3] == 1 && x.ne[2] == 1 && x.ne[3] == 1 && y.ne[2] == 1 && y.ne[3] == 1,
               "matmul: 2-D tensors only");
    KILN_CHECK(x.ne[0] == w.ne[0] && y.ne[0] == w.ne[1] && y.ne[1] == x.ne[1],
               "matmul: w [{}, {}] x [{}, {}] -> y [{}, {}]", w.ne[0], w.ne[1], x.ne[0], x.ne[1], y.ne[0], y.ne[1]);
    const C::XProducer* pre = take(x);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("matmul {}{} {}x{} m{}", pre ? "(+x) " : "", gguf::type_name(w.type), w.ne[0], w.ne[1], x.ne[1]); }, double(w.nb[1]) * double(w.ne[1]));
    const int64_t k = w.ne[0], n = w.ne[1], m = x.ne[1];
    const C::Launch L = launch(C::matmul_workspace(w.type, k, n, m));
    C::matmul(L, w.type, ptr(w, "matmul w"), w.nb[1], k, n, fptr(x, "matmul x"), int64_t(x.nb[1] / 4),
              fptr(y, "matmul y"), int64_t(y.nb[1] / 4), m, pre);
  }
  void matmul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& y) override {
    flush();
    check_f32(x, "matmul_id x");
    check_f32(y, "matmul_id y");
    KILN_CHECK(C::matmul_supported(w.type), "matmul_id: weight type {} not supported on CUDA", gguf::type_name(w.type));
    const int64_t k = w.ne[0], n = w.ne[1], K = ids.ne[0], T = ids.ne[1];
    check_i32(ids, K * T, "matmul_id ids");
    KILN_CHECK(w.ne[3] == 1 && ids.ne[2] == 1 && ids.ne[3] == 1 && x.ne[3] == 1 && y.ne[3] == 1,
               "matmul_id: w [k, n, n_expert], ids [K, T], x [k, nx, T], y [n, K, T]");
    KILN_CHECK(x.ne[0] == k && (x.ne[1] == 1 || x.ne[1] == K) && x.ne[2] == T,
               "matmul_id: x [{}, {}, {}] for w [{}, ...] and ids [{}, {}] (x must be [k, 1 or K, T])", x.ne[0], x.ne[1],
               x.ne[2], k, K, T);
    KILN_CHECK(y.ne[0] == n && y.ne[1] == K && y.ne[2] == T, "matmul_id: y [{}, {}, {}], expected [{}, {}, {}]", y.ne[0],
               y.ne[1], y.ne[2], n, K, T);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("matmul_id {} {}x{}x{} K{} T{}", gguf::type_name(w.type), k, n, w.ne[2], K, T); }, double(w.nb[1]) * double(n) * double(std::min<int64_t>(K * T, w.ne[2])));
    const C::Launch L = launch(C::matmul_id_workspace(w.type, k, n, K * T));
    C::matmul_id(L, w.type, ptr(w, "matmul_id w"), w.nb[1], w.nb[2], w.ne[2], k, n, fptr(x, "matmul_id x"), x.ne[1],
                 int64_t(x.nb[1] / 4), int64_t(x.nb[2] / 4), iptr(ids, "matmul_id ids"), K, T, fptr(y, "matmul_id y"),
                 int64_t(y.nb[1] / 4), int64_t(y.nb[2] / 4));
  }
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    flush();
    check_f32(out, "get_rows out");
    check_i32(ids, out.ne[1], "get_rows ids");
    KILN_CHECK(out.ne[0] == table.ne[0], "get_rows: row length {} vs {}", out.ne[0], table.ne[0]);
    KILN_CHECK(out.ne[2] == 1 && out.ne[3] == 1, "get_rows: out must be 2-D [k, n]");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("get_rows {} {}", gguf::type_name(table.type), shape(out)); });
    C::get_rows(launch(), table.type, ptr(table, "get_rows table"), table.nb[1], table.ne[0], iptr(ids, "get_rows ids"),
                out.ne[1], fptr(out, "get_rows out"), int64_t(out.nb[1] / 4));
  }
  void rms_norm(const Tensor& x, const Tensor* w, const Tensor& y, float eps) override {
    flush();
    check_same_shape(x, y, "rms_norm");
    if (w) KILN_CHECK(w->type == GgmlType::F32 && w->n_elements() == x.ne[0] && w->is_contiguous(),
                      "rms_norm: weight must be F32 [{}]", x.ne[0]);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "rms_norm " + shape(x); });
    C::rms_norm(launch(), rows(x, "rms_norm x"), w ? fptr(*w, "rms_norm w") : nullptr, rows(y, "rms_norm y"), eps);
  }
  void l2_norm(const Tensor& x, const Tensor& y, float eps) override {
    flush();
    check_same_shape(x, y, "l2_norm");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "l2_norm " + shape(x); });
    C::l2_norm(launch(), rows(x, "l2_norm x"), rows(y, "l2_norm y"), eps);
  }
  void rope(const Tensor& x, const Tensor& pos, const RopeParams& p) override {
    flush();
    check_i32(pos, x.ne[2], "rope pos");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "rope " + shape(x); });
    C::rope(launch(), rows(x, "rope x"), iptr(pos, "rope pos"), p);
  }
  void rope_multi(const Tensor& x, const Tensor& pos, const RopeParams& p) override {
    flush();
    check_i32(pos, x.ne[2] * 4, "rope_multi pos");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "rope_multi " + shape(x); });
    C::rope_multi(launch(), rows(x, "rope_multi x"), iptr(pos, "rope_multi pos"), p);
  }
  void softmax(const Tensor& x, float scale) override {
    flush();
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "softmax " + shape(x); });
    C::softmax(launch(), rows(x, "softmax x"), scale);
  }
  void unary(Unary op, const Tensor& x, const Tensor& y) override {
    flush();
    check_same_shape(x, y, "unary");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("unary{} {}", int(op), shape(x)); });
    C::unary(launch(), to_cuda(op), rows(x, "unary x"), rows(y, "unary y"));
  }
  void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& y) override {
    check_same_shape(a, y, "binary a/y");
    int mode = -1;
    if (b.ne == a.ne) mode = 0;
    else if (b.ne[0] == a.ne[0] && b.ne[1] == 1 && b.ne[2] == 1 && b.ne[3] == 1) mode = 1;
    else if (b.ne[0] == 1 && b.ne[1] == a.ne[1] && b.ne[2] == a.ne[2] && b.ne[3] == a.ne[3]) mode = 2;
    KILN_CHECK(mode >= 0,
               "binary: b [{} {} {} {}] must be a's shape [{} {} {} {}], one row [{}] or one scalar per row [1, {}, {}]",
               b.ne[0], b.ne[1], b.ne[2], b.ne[3], a.ne[0], a.ne[1], a.ne[2], a.ne[3], a.ne[0], a.ne[1], a.ne[2]);
    flush();
    if (op == Binary::SwiGlu && mode == 0 && same_view(y, a)) {
      C::XProducer p;
      p.kind = C::XProducer::Kind::SwiGlu;
      p.b = rows(b, "binary b");
      if (defer(p, y)) return;
    }
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("binary{} {}", int(op), shape(a)); });
    C::binary(launch(), to_cuda(op), rows(a, "binary a"), rows(b, "binary b"), mode, rows(y, "binary y"));
  }
  void scale(const Tensor& x, float s, const Tensor& y) override {
    flush();
    check_same_shape(x, y, "scale");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "scale " + shape(x); });
    C::scale(launch(), rows(x, "scale x"), s, rows(y, "scale y"));
  }
  void topk_route(const Tensor& logits, int k, bool renorm, float w_scale, const Tensor& ids,
                  const Tensor& weights) override {
    flush();
    check_f32(logits, "topk_route logits");
    KILN_CHECK(logits.is_contiguous(), "topk_route: contiguous logits");
    check_i32(ids, int64_t(k) * logits.ne[1], "topk_route ids");
    check_f32(weights, "topk_route weights");
    KILN_CHECK(weights.is_contiguous() && weights.n_elements() == int64_t(k) * logits.ne[1], "topk_route: weights [k, n_tok]");
    KILN_CHECK(logits.ne[2] == 1 && logits.ne[3] == 1, "topk_route: logits [n_expert, n_tok]");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "topk_route " + shape(logits); });
    C::topk_route(launch(), fptr(logits, "topk_route logits"), logits.ne[0], logits.ne[1], k, renorm, w_scale,
                  iptr(ids, "topk_route ids"), fptr(weights, "topk_route weights"));
  }
  void top_logits(const Tensor& logits, int k, const Tensor& ids, const Tensor& vals) override {
    flush();
    check_f32(logits, "top_logits logits");
    KILN_CHECK(logits.is_contiguous() && logits.ne[2] == 1 && logits.ne[3] == 1, "top_logits: contiguous logits [V, n]");
    check_i32(ids, int64_t(k) * logits.ne[1], "top_logits ids");
    check_f32(vals, "top_logits vals");
    KILN_CHECK(vals.is_contiguous() && vals.n_elements() == int64_t(k) * logits.ne[1], "top_logits: vals [k, n]");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "top_logits " + shape(logits); });
    C::top_logits(launch(C::top_logits_workspace(logits.ne[0], logits.ne[1], k)), fptr(logits, "top_logits logits"),
                  logits.ne[0], logits.ne[1], k, iptr(ids, "top_logits ids"), fptr(vals, "top_logits vals"));
  }
  void hadamard(const Tensor& x, int64_t n) override {
    flush();
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "hadamard " + shape(x); });
    C::hadamard(launch(), rows(x, "hadamard x"), n);
  }
  void kv_store(const Tensor& x, const Tensor& seq, const Tensor& pos, const Tensor& cache) override {
    flush();
    const int64_t T = x.ne[2];
    check_i32(seq, T, "kv_store seq");
    check_i32(pos, T, "kv_store pos");
    KILN_CHECK(cache.type == GgmlType::F32 || cache.type == GgmlType::F16 || cache.type == GgmlType::Q8_0 ||
                   cache.type == GgmlType::Q4_0,
               "kv_store: cache type {} (F32, F16, Q8_0 or Q4_0)", gguf::type_name(cache.type));
    KILN_CHECK(cache.ne[0] == x.ne[0] && cache.ne[1] == x.ne[1],
               "kv_store: x rows [{}, {}] vs cache [head_dim {}, n_head_kv {}]", x.ne[0], x.ne[1], cache.ne[0], cache.ne[1]);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("kv_store {} {}", gguf::type_name(cache.type), shape(x)); });
    C::kv_store(launch(), rows(x, "kv_store x"), iptr(seq, "kv_store seq"), iptr(pos, "kv_store pos"),
                seq_mem(cache, "kv_store cache"));
  }
  void attention(const Tensor& q, const Tensor& seq, const Tensor& pos, const Tensor& k, const Tensor& v,
                 const AttnSpec& p, const Tensor& out) override {
    flush();
    const int64_t T = q.ne[2];
    check_same_shape(q, out, "attention q/out");
    check_i32(seq, T, "attention seq");
    check_i32(pos, T, "attention pos");
    KILN_CHECK(q.ne[0] == p.head_dim && q.ne[1] == p.n_head, "attention: q [{}, {}] vs head_dim {} n_head {}", q.ne[0],
               q.ne[1], p.head_dim, p.n_head);
    KILN_CHECK(p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "attention: n_head {} not a multiple of n_head_kv {}",
               p.n_head, p.n_head_kv);
    for (const Tensor* c : {&k, &v})
      KILN_CHECK(c->ne[0] == p.head_dim && c->ne[1] == p.n_head_kv && c->ne[2] == k.ne[2] && c->ne[3] == k.ne[3],
                 "attention: cache [{} {} {} {}] vs head_dim {} n_head_kv {}", c->ne[0], c->ne[1], c->ne[2], c->ne[3],
                 p.head_dim, p.n_head_kv);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("attention {} {}", gguf::type_name(k.type), shape(q)); });
    // Split-KV work is sized for the cache length (an upper bound of every pos + 1).
    const C::AttnArgs a = CudaSizes::attn_args(p, k.ne[2]);
    C::attention(launch(C::attention_workspace(a, T)), rows(q, "attention q"), iptr(seq, "attention seq"),
                 iptr(pos, "attention pos"), seq_mem(k, "attention k"), seq_mem(v, "attention v"), a,
                 rows(out, "attention out"));
  }
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& seq, const Tensor& state, const Tensor& y,
                   const Tensor& keep) override {
    flush();
    check_f32(x, "conv1d_silu x");
    check_f32(y, "conv1d_silu y");
    check_f32(w, "conv1d_silu w");
    check_f32(state, "conv1d_silu state");
    check_same_shape(x, y, "conv1d_silu x/y");
    const int64_t C_ = x.ne[0], T = x.ne[1];
    const int d_conv = int(w.ne[0]);
    KILN_CHECK(x.ne[2] == 1 && x.ne[3] == 1, "conv1d_silu: x [C, T]");
    KILN_CHECK(w.is_contiguous() && w.ne[1] == C_ && d_conv >= 2, "conv1d_silu: w [{}, {}] for {} channels", w.ne[0],
               w.ne[1], C_);
    KILN_CHECK(state.ne[0] == d_conv - 1 && state.ne[1] == C_ && state.ne[2] == 1,
               "conv1d_silu: state [{} {} {} {}], expected [{}, {}, 1, n_seq]", state.ne[0], state.ne[1], state.ne[2],
               state.ne[3], d_conv - 1, C_);
    check_i32(seq, T, "conv1d_silu seq");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "conv1d_silu " + shape(x); });
    C::conv1d_silu(launch(), fptr(x, "conv1d_silu x"), int64_t(x.nb[1] / 4), fptr(w, "conv1d_silu w"), d_conv, C_,
                   iptr(seq, "conv1d_silu seq"), seq_mem(state, "conv1d_silu state"), fptr(y, "conv1d_silu y"),
                   int64_t(y.nb[1] / 4), T, keep_ptr(keep, T, "conv1d_silu keep"));
  }
  void gated_delta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const Tensor& seq, const Tensor& state, const Tensor& out, int chunk, const Tensor& keep) override {
    flush();
    const int64_t S = q.ne[0], Hk = q.ne[1], T = q.ne[2], Hv = v.ne[1];
    check_same_shape(q, k, "gated_delta q/k");
    check_same_shape(v, out, "gated_delta v/out");
    KILN_CHECK(v.ne[0] == S && v.ne[2] == T && Hk > 0 && Hv % Hk == 0, "gated_delta: v [{} {} {}] for q [{} {} {}]",
               v.ne[0], v.ne[1], v.ne[2], S, Hk, T);
    for (const Tensor* t : {&g, &beta}) {
      check_f32(*t, "gated_delta g/beta");
      KILN_CHECK(t->is_contiguous() && t->ne[0] == Hv && t->ne[1] == T && t->ne[2] == 1 && t->ne[3] == 1,
                 "gated_delta: g/beta [{} {}], expected [{} {}]", t->ne[0], t->ne[1], Hv, T);
    }
    check_f32(state, "gated_delta state");
    KILN_CHECK(state.ne[0] == S && state.ne[1] == S && state.ne[2] == Hv,
               "gated_delta: state [{} {} {} {}], expected [{} {} {} n_seq]", state.ne[0], state.ne[1], state.ne[2],
               state.ne[3], S, S, Hv);
    check_i32(seq, T, "gated_delta seq");
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return fmt::format("gated_delta {} chunk{}", shape(v), chunk); });
    C::gated_delta(launch(C::gated_delta_workspace(S, Hv, chunk, T)), rows(q, "gated_delta q"), rows(k, "gated_delta k"),
                   rows(v, "gated_delta v"), fptr(g, "gated_delta g"), fptr(beta, "gated_delta beta"),
                   iptr(seq, "gated_delta seq"), seq_mem(state, "gated_delta state"), rows(out, "gated_delta out"), chunk,
                   keep_ptr(keep, T, "gated_delta keep"));
  }

  // ---- fused ops ----
  void matmul_n(const Tensor* w, const Tensor* y, int n, const Tensor& x) override {
    KILN_CHECK(n >= 1 && n <= 4, "matmul_n: {} weights (1..4)", n);
    check_f32(x, "matmul_n x");
    KILN_CHECK(x.ne[2] == 1 && x.ne[3] == 1, "matmul_n: x must be 2-D");
    const int64_t k = x.ne[0], m = x.ne[1];
    C::MatmulW ws[4];
    size_t need = 0;
    for (int i = 0; i < n; ++i) {
      check_f32(y[i], "matmul_n y");
      KILN_CHECK(C::matmul_supported(w[i].type), "matmul_n: weight type {} not supported on CUDA",
                 gguf::type_name(w[i].type));
      KILN_CHECK(w[i].ne[2] == 1 && w[i].ne[3] == 1 && y[i].ne[2] == 1 && y[i].ne[3] == 1, "matmul_n: 2-D tensors only");
      KILN_CHECK(w[i].ne[0] == k && y[i].ne[0] == w[i].ne[1] && y[i].ne[1] == m,
                 "matmul_n: w{} [{}, {}] x [{}, {}] -> y [{}, {}]", i, w[i].ne[0], w[i].ne[1], k, m, y[i].ne[0],
                 y[i].ne[1]);
      ws[i] = C::MatmulW{w[i].type, ptr(w[i], "matmul_n w"), w[i].nb[1], w[i].ne[1], fptr(y[i], "matmul_n y"),
                         int64_t(y[i].nb[1] / 4)};
      need = std::max(need, C::matmul_workspace(w[i].type, k, w[i].ne[1], m));
    }
    const C::XProducer* pre = take(x);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof(
        [&] {
          std::string l = fmt::format("matmul_n {}k{} m{}:", pre ? "(+x) " : "", k, m);
          for (int i = 0; i < n; ++i) l += fmt::format(" {}x{}", gguf::type_name(w[i].type), w[i].ne[1]);
          return l;
        },
        [&] {
          double b = 0;
          for (int i = 0; i < n; ++i) b += double(w[i].nb[1]) * double(w[i].ne[1]);
          return b;
        }());
    C::matmul_n(launch(need), ws, n, k, fptr(x, "matmul_n x"), int64_t(x.nb[1] / 4), m, pre);
  }
  void delta_gates(const Tensor& beta, const Tensor& g, const Tensor& dt_bias, const Tensor& a) override {
    flush();
    check_same_shape(beta, g, "delta_gates beta/g");
    for (const Tensor* t : {&dt_bias, &a}) {
      check_f32(*t, "delta_gates dt_bias/a");
      KILN_CHECK(t->is_contiguous() && t->n_elements() == beta.ne[0] && t->ne[0] == beta.ne[0],
                 "delta_gates: dt_bias / a must be one F32 row [{}]", beta.ne[0]);
    }
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "delta_gates " + shape(g); });
    C::delta_gates(launch(), rows(beta, "delta_gates beta"), rows(g, "delta_gates g"), fptr(dt_bias, "delta_gates dt_bias"),
                   fptr(a, "delta_gates a"));
  }
  void rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps) override {
    flush();
    check_same_shape(x, z, "rms_norm_gated x/z");
    KILN_CHECK(w.type == GgmlType::F32 && w.n_elements() == x.ne[0] && w.is_contiguous(),
               "rms_norm_gated: weight must be F32 [{}]", x.ne[0]);
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "rms_norm_gated " + shape(x); });
    C::rms_norm_gated(launch(), rows(x, "rms_norm_gated x"), fptr(w, "rms_norm_gated w"), rows(z, "rms_norm_gated z"),
                      eps);
  }
  void add_rms_norm(const Tensor& x, const Tensor& t, const Tensor* w, const Tensor& y, float eps) override {
    check_same_shape(x, t, "add_rms_norm x/t");
    check_same_shape(x, y, "add_rms_norm x/y");
    if (w) KILN_CHECK(w->type == GgmlType::F32 && w->n_elements() == x.ne[0] && w->is_contiguous(),
                      "add_rms_norm: weight must be F32 [{}]", x.ne[0]);
    flush();
    C::XProducer p;
    p.kind = C::XProducer::Kind::AddRmsNorm;
    p.x = rows(x, "add_rms_norm x"), p.t = rows(t, "add_rms_norm t"), p.w = w ? fptr(*w, "add_rms_norm w") : nullptr;
    p.eps = eps;
    if (defer(p, y)) return;
    DeviceScope ds(dev_.ordinal());
    auto pf = prof([&] { return "add_rms_norm " + shape(x); });
    C::add_rms_norm(launch(), p.x, p.t, p.w, rows(y, "add_rms_norm y"), eps);
  }
  void delta_prep(const Tensor& mixed, int64_t S, int64_t Hk, const Tensor& conv_w, const Tensor& seq,
                  const Tensor& conv_state, const Tensor& beta, const Tensor& g, const Tensor& dt_bias, const Tensor& a,
                  float eps, const Tensor& keep) override {
    flush();
    check_f32(mixed, "delta_prep mixed");
    const int64_t T = mixed.ne[1], Hv = beta.ne[0];
    const bool shapes = S > 0 && Hk > 0 && mixed.ne[2] == 1 && mixed.ne[3] == 1 && mixed.ne[0] == (2 * Hk + Hv) * S &&
                        conv_w.type == GgmlType::F32 && conv_w.is_contiguous() && conv_w.ne[1] == mixed.ne[0] &&
                        g.ne == beta.ne && dt_bias.is_contiguous() && a.is_contiguous() &&
                        dt_bias.n_elements() == Hv && a.n_elements() == Hv && dt_bias.type == GgmlType::F32 &&
                        a.type == GgmlType::F32 && conv_state.ne[2] == 1;
    if (shapes) {
      check_i32(seq, T, "delta_prep seq");
      DeviceScope ds(dev_.ordinal());
      auto pf = prof([&] { return "delta_prep (fused) " + shape(mixed); });
      if (C::delta_prep_fused(launch(), fptr(mixed, "delta_prep mixed"), int64_t(mixed.nb[1] / 4), S, Hk, Hv,
                              fptr(conv_w, "delta_prep conv_w"), int(conv_w.ne[0]), iptr(seq, "delta_prep seq"),
                              seq_mem(conv_state, "delta_prep conv_state"), rows(beta, "delta_prep beta"),
                              rows(g, "delta_prep g"), fptr(dt_bias, "delta_prep dt_bias"), fptr(a, "delta_prep a"), eps,
                              T, keep_ptr(keep, T, "delta_prep keep")))
        return;
    }
    Stream::delta_prep(mixed, S, Hk, conv_w, seq, conv_state, beta, g, dt_bias, a, eps, keep);
  }
  void gated_delta_norm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& seq, const Tensor& state, const Tensor& out, int chunk, const Tensor& norm_w,
                        const Tensor& z, float eps, const Tensor& keep) override {
    flush();
    const int64_t T = q.ne[2];
    const bool shapes = g.is_contiguous() && beta.is_contiguous() && g.ne[0] == v.ne[1] && beta.ne == g.ne &&
                        g.ne[1] == T && norm_w.type == GgmlType::F32 && norm_w.is_contiguous() &&
                        norm_w.n_elements() == v.ne[0] && z.ne == out.ne && out.ne == v.ne && state.type == GgmlType::F32;
    if (shapes) {
      check_i32(seq, T, "gated_delta_norm seq");
      DeviceScope ds(dev_.ordinal());
      auto pf = prof([&] { return "gated_delta_norm (fused) " + shape(v); });
      if (C::gated_delta_norm_fused(launch(), rows(q, "gated_delta_norm q"), rows(k, "gated_delta_norm k"),
                                    rows(v, "gated_delta_norm v"), fptr(g, "gated_delta_norm g"),
                                    fptr(beta, "gated_delta_norm beta"), iptr(seq, "gated_delta_norm seq"),
                                    seq_mem(state, "gated_delta_norm state"), rows(out, "gated_delta_norm out"),
                                    fptr(norm_w, "gated_delta_norm w"), rows(z, "gated_delta_norm z"), eps,
                                    keep_ptr(keep, T, "gated_delta_norm keep")))
        return;
    }
    Stream::gated_delta_norm(q, k, v, g, beta, seq, state, out, chunk, norm_w, z, eps, keep);
  }

 private:
  CudaSizes sizes_;

  // ---- profiling: one event pair per op, collected at synchronize() ----
  struct Timed {
    cudaEvent_t a, b;
    std::string label;
    double bytes;
  };
  class ProfScope {
   public:
    ProfScope(CudaStream* s, size_t i) : s_(s), i_(i) {}
    ~ProfScope() {
      if (s_) cudaEventRecord(s_->timed_[i_].b, s_->stream_);
    }
    ProfScope(const ProfScope&) = delete;
    ProfScope& operator=(const ProfScope&) = delete;

   private:
    CudaStream* s_;
    size_t i_;
  };
  // Times the op enqueued in the caller's scope as label() (called only when profiling), with
  // `bytes` of weights it reads (0: not reported).
  template <class F>
  ProfScope prof(F&& label, double bytes = 0) {
    if (!profiling()) return {nullptr, 0};
    if (timed_.empty()) C::busy_wait(L_, kProfHoldUs);
    const size_t i = timed_.size();
    while (events_.size() < 2 * (i + 1)) {
      cudaEvent_t e;
      KILN_CUDA_CALL(cudaEventCreate(&e));
      events_.push_back(e);
    }
    timed_.push_back({events_[2 * i], events_[2 * i + 1], label(), bytes});
    KILN_CUDA_CALL(cudaEventRecord(timed_[i].a, stream_));
    return {this, i};
  }
  void prof_collect() {
    for (const Timed& t : timed_) {
      float ms = 0;
      KILN_CUDA_CALL(cudaEventElapsedTime(&ms, t.a, t.b));
      prof_table().add(t.label, ms, t.bytes);
    }
    timed_.clear();
  }
  static std::string shape(const Tensor& t) { return fmt::format("[{} {} {}]", t.ne[0], t.ne[1], t.ne[2]); }

  // ---- deferred x producers: add_rms_norm and in-place SwiGLU whose output is one to eight F32
  // columns are held back until the next op; if that op is a matmul / matmul_n reading exactly that
  // output, the mat-mul launcher runs the producer in one kernel with its x quantization
  // (cuda_ops.h XProducer); any other next op (or synchronize, a transfer, the end of a capture)
  // first launches it on its own. The values are the same either way. ----
  struct Deferred {
    bool on = false;
    C::XProducer p;
    Tensor out;
  };
  static bool same_view(const Tensor& a, const Tensor& b) {
    return a.buf == b.buf && a.offset == b.offset && a.type == b.type && a.ne == b.ne && a.nb == b.nb;
  }
  // Holds p back when `out` (its output) is something a mat-mul producer can make; true if held.
  bool defer(const C::XProducer& p, const Tensor& out) {
    // Batch-invariant: no producer fused into the next mat-mul's x (a batch of more than 8 columns
    // could not take it), so every batch makes x with the same kernels.
    if (C::batch_invariant() || out.type != GgmlType::F32 || out.ne[2] != 1 || out.ne[3] != 1 || out.nb[0] != 4 || out.nb[1] % 4 != 0 ||
        !C::produce_ok(out.ne[0], out.ne[1]))
      return false;
    def_.on = true, def_.p = p, def_.out = out;
    return true;
  }
  // The held producer if x is its output (the caller's mat-mul runs it), else nullptr after flush().
  const C::XProducer* take(const Tensor& x) {
    if (def_.on && same_view(def_.out, x)) {
      def_.on = false;
      return &def_.p;
    }
    flush();
    return nullptr;
  }
  // Launches the held producer on its own.
  void flush() {
    if (!def_.on) return;
    def_.on = false;
    DeviceScope ds(dev_.ordinal());
    const C::XProducer& p = def_.p;
    const C::Rows out = rows(def_.out, "deferred op output");
    if (p.kind == C::XProducer::Kind::AddRmsNorm) {
      auto pf = prof([&] { return "add_rms_norm " + shape(def_.out); });
      C::add_rms_norm(launch(), p.x, p.t, p.w, out, p.eps);
    } else {
      auto pf = prof([&] { return fmt::format("binary{} {}", int(Binary::SwiGlu), shape(def_.out)); });
      C::binary(launch(), C::Binary::SwiGlu, out, p.b, 0, out);
    }
  }

  // Device address of t's byte 0; t must be in a buffer of this device and inside it.
  void* ptr(const Tensor& t, const char* what) const {
    KILN_CHECK(t.buf != nullptr, "{}: tensor has no buffer", what);
    KILN_CHECK(&t.buf->device() == &dev_, "{}: tensor lives on {}, the stream on {}", what, t.buf->device().name(),
               dev_.name());
    KILN_CHECK(t.offset + t.n_bytes() <= t.buf->size(), "{}: view [{} {} {} {}] at {} overflows its {}-byte buffer", what,
               t.ne[0], t.ne[1], t.ne[2], t.ne[3], t.offset, t.buf->size());
    return static_cast<char*>(static_cast<CudaBuffer*>(t.buf)->dev_ptr()) + t.offset;
  }
  float* fptr(const Tensor& t, const char* what) const { return static_cast<float*>(ptr(t, what)); }
  int32_t* iptr(const Tensor& t, const char* what) const { return static_cast<int32_t*>(ptr(t, what)); }
  // A recurrent op's keep tensor (backend.h): nullptr for an empty Tensor, else I32 [T] on this device.
  const int32_t* keep_ptr(const Tensor& keep, int64_t T, const char* what) const {
    if (keep.buf == nullptr) return nullptr;
    check_i32(keep, T, what);
    return iptr(keep, what);
  }
  static void check_i32(const Tensor& t, int64_t n, const char* what) {
    KILN_CHECK(t.type == GgmlType::I32 && t.is_contiguous() && t.n_elements() == n, "{}: expected I32 [{}]", what, n);
  }
  // [ne0, n1, n2] rows (ne[3] must be 1).
  C::Rows rows(const Tensor& t, const char* what) const {
    check_f32(t, what);
    KILN_CHECK(t.ne[3] == 1, "{}: 4-D tensors are not supported", what);
    return C::Rows{fptr(t, what), t.ne[0], t.ne[1], t.ne[2], int64_t(t.nb[1] / 4), int64_t(t.nb[2] / 4)};
  }
  C::SeqMem seq_mem(const Tensor& t, const char* what) const {
    return C::SeqMem{ptr(t, what), t.type, t.ne[0], t.ne[1], t.ne[2], t.nb[1], t.nb[2], t.nb[3]};
  }
  static C::Unary to_cuda(Unary op) {
    switch (op) {
      case Unary::Silu: return C::Unary::Silu;
      case Unary::Sigmoid: return C::Unary::Sigmoid;
      case Unary::Softplus: return C::Unary::Softplus;
      case Unary::Gelu: return C::Unary::Gelu;
      case Unary::GeluErf: return C::Unary::GeluErf;
    }
    __builtin_unreachable();
  }
  static C::Binary to_cuda(Binary op) {
    switch (op) {
      case Binary::Add: return C::Binary::Add;
      case Binary::Mul: return C::Binary::Mul;
      case Binary::SwiGlu: return C::Binary::SwiGlu;
      case Binary::SigmoidMul: return C::Binary::SigmoidMul;
    }
    __builtin_unreachable();
  }
  // The Launch for an op that needs `ws_bytes` of workspace (grown if needed, and counted).
  C::Launch launch(size_t ws_bytes = 0) {
    if (ws_bytes > 0) ensure(ws_bytes);
    return L_;
  }
  void ensure(size_t bytes, bool planned = false) {
    if (bytes <= ws_size_) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    KILN_CUDA_CALL(cudaStreamIsCapturing(stream_, &cs));
    KILN_CHECK(cs == cudaStreamCaptureStatusNone,
               "workspace of {} bytes needed while capturing a graph (reserved {}): reserve_workspace before capture",
               bytes, ws_size_);
    if (ws_ || !planned) ++grows_;  // a first use without a reserve also counts
    DeviceScope ds(dev_.ordinal());
    if (ws_) {
      KILN_CUDA_CALL(cudaStreamSynchronize(stream_));  // work already enqueued may still use the old one
      KILN_CUDA_CALL(cudaFree(ws_));
      ws_ = nullptr;
    }
    const size_t n = (bytes + 255) & ~size_t(255);
    const cudaError_t e = cudaMalloc(&ws_, n);
    KILN_CHECK(e == cudaSuccess, "workspace cudaMalloc of {} bytes failed: {} ({})", n, cudaGetErrorName(e),
               cudaGetErrorString(e));
    ws_size_ = n;
    L_.ws = ws_;
    L_.ws_bytes = ws_size_;
  }

  Deferred def_;
  std::vector<Timed> timed_;  // ops enqueued since the last synchronize (profiling)
  std::vector<cudaEvent_t> events_;
  CudaDevice& dev_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_ws_ = nullptr;
  size_t blas_ws_bytes_ = 0;
  void* ws_ = nullptr;
  size_t ws_size_ = 0;
  int grows_ = 0;
  C::Launch L_;
};

std::unique_ptr<Stream> CudaDevice::create_stream() { return std::make_unique<CudaStream>(*this); }

struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
      cudaGetLastError();  // clear the runtime's last-error state
    } else if (r.count == 0) {
      r.reason = "no CUDA-capable device";
    }
    return r;
  }();
  return p;
}

}  // namespace

int cuda_device_count() { return probe().count; }
std::string cuda_unavailable_reason() { return probe().reason; }

std::string cuda_profile_report() {
  return profiling() ? prof_table().report("CUDA op times (KILN_CUDA_PROFILE; op by op, no graphs)") : "";
}

Device& cuda_device(int i) {
  const int n = cuda_device_count();
  KILN_CHECK(i >= 0 && i < n, "cuda_device({}): {} CUDA device(s){}{}", i, n, n == 0 ? ": " : "",
             cuda_unavailable_reason());
  // Created on first use and never destroyed: buffers and streams may outlive static destruction,
  // and the CUDA runtime may already be torn down at exit.
  static std::mutex mu;
  static auto* devices = new std::vector<std::unique_ptr<CudaDevice>>(size_t(n));
  std::lock_guard<std::mutex> lock(mu);
  auto& d = (*devices)[size_t(i)];
  if (!d) d = std::make_unique<CudaDevice>(i);
  return *d;
}

bool cuda_memory_info(int i, CudaMemoryInfo* out) {
  if (i < 0 || i >= cuda_device_count()) return false;
  auto& d = static_cast<CudaDevice&>(cuda_device(i));
  DeviceScope ds(i);
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  size_t stack = 1024;
  if (cudaDeviceGetLimit(&stack, cudaLimitStackSize) != cudaSuccess) cudaGetLastError();
  out->free = free;
  out->total = total;
  out->context = cuda_context_bytes({d.n_sm(), d.threads_per_sm(), stack});
  out->sm = d.sm();
  out->name = d.name();
  return true;
}

#endif  // KILN_HAVE_CUDA
}  // namespace kiln::backend
