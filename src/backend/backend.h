// backend/backend.h — the device interface model code is written against: Device, Buffer, Tensor
//   (a typed view into a Buffer), Stream (ops are enqueued on it) and Arena (scratch planned once).
// Owns: the rules every backend (CPU now, CUDA later) follows:
//   1. Memory may not be host-addressable: only Buffer::host_ptr() (nullptr on a GPU) gives a host
//      pointer; move data with Stream::upload / download / copy.
//   2. Execution may be asynchronous: results are defined only after Stream::synchronize(); host
//      memory passed to upload/download must stay valid (and unchanged) until then.
//   3. Weights stay in their GGUF type and are used in place: Device::wrap() turns the GGUF
//      mapping into a Buffer without copying where the device can read it (the CPU always can;
//      a GPU returns nullptr and the loader uploads instead).
//   4. No allocation on the decode path: scratch tensors live in an Arena planned once per batch
//      shape; op workspaces are reserved up front with Stream::reserve_workspace (the CPU stream
//      counts any later growth in workspace_grows(), which tests assert stays 0).
// Must not: know about models, layers or sequences; do shape inference (callers pass outputs).
// Threading: a Stream is used by one thread at a time; Buffers/Devices may be shared.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "gguf/types.h"
#include "kernels/ops.h"

namespace kiln::backend {

using gguf::GgmlType;
using kernels::AttnParams;
using kernels::RopeParams;

enum class DeviceType { Cpu, Cuda };
class Device;

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual Device& device() const = 0;
  virtual size_t size() const = 0;
  // Host address of byte 0 when the memory is host-addressable, else nullptr.
  virtual void* host_ptr() const = 0;
};

// A view of a Buffer: GGUF type, shape ne (ne[0] contiguous) and byte strides nb. For block types
// ne[0] counts elements and nb[1] is the row stride in bytes. Plain value; does not own memory.
struct Tensor {
  Buffer* buf = nullptr;
  size_t offset = 0;  // bytes from the start of buf
  GgmlType type = GgmlType::F32;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};
  std::array<size_t, 4> nb = {0, 0, 0, 0};

  // Contiguous tensor of shape ne at buf + offset.
  static Tensor make(Buffer* buf, size_t offset, GgmlType type, std::array<int64_t, 4> ne);
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const;     // bytes of one ne[0] row of `type`
  size_t n_bytes() const;       // span from the first to one past the last byte
  bool is_contiguous() const;
  // View of rows [r0, r0 + n) along dimension `dim` (1..3); strides kept.
  Tensor slice(int dim, int64_t start, int64_t n) const;
  // Same bytes, new contiguous shape (must be contiguous, same element count).
  Tensor reshape(std::array<int64_t, 4> ne) const;
  // Host pointer (only for host-addressable buffers).
  void* host() const;
  template <class T>
  T* host_as() const { return static_cast<T*>(host()); }
};

enum class Unary { Silu, Sigmoid, Softplus };
enum class Binary { Add, Mul, SwiGlu /* silu(a) * b */, SigmoidMul /* a * sigmoid(b) */ };

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() const = 0;

  // ---- transfers (asynchronous; see rule 2) ----
  virtual void upload(const Tensor& dst, const void* src, size_t bytes) = 0;  // dst contiguous
  virtual void download(void* dst, const Tensor& src, size_t bytes) = 0;      // src contiguous
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;                // same type and shape
  virtual void synchronize() = 0;

  // ---- workspaces (rule 4) ----
  virtual size_t matmul_workspace(GgmlType wt, int64_t k, int64_t m) const = 0;
  virtual size_t gated_delta_workspace(int64_t S, int chunk) const = 0;
  virtual size_t attention_workspace(const AttnParams& p) const = 0;
  virtual void reserve_workspace(size_t bytes) = 0;
  virtual int workspace_grows() const = 0;  // reallocations after the first reserve

  // ---- ops (enqueued; semantics in kernels/ops.h). F32 activations unless stated. ----
  // w [k, n] any matmul_supported type; x [k, m]; y [n, m]. Rows of x/y may be strided (nb[1]).
  virtual void matmul(const Tensor& w, const Tensor& x, const Tensor& y) = 0;
  // table [k, n_rows] any type; ids I32 [n]; out [k, n].
  virtual void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // x, y [ne0, n1, n2] (y may be x); w [ne0] or nullptr.
  virtual void rms_norm(const Tensor& x, const Tensor* w, const Tensor& y, float eps) = 0;
  virtual void l2_norm(const Tensor& x, const Tensor& y, float eps) = 0;
  // x [head_dim, n_head, n_tok] in place; pos I32 [n_tok].
  virtual void rope(const Tensor& x, const Tensor& pos, const RopeParams& p) = 0;
  virtual void softmax(const Tensor& x, float scale) = 0;  // rows, in place
  virtual void unary(Unary op, const Tensor& x, const Tensor& y) = 0;            // contiguous
  virtual void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& y) = 0;  // contiguous
  virtual void scale(const Tensor& x, float s, const Tensor& y) = 0;
  // logits [n_expert, n_tok]; ids I32 [k, n_tok]; weights [k, n_tok].
  virtual void topk_route(const Tensor& logits, int k, bool renorm, float w_scale, const Tensor& ids,
                          const Tensor& weights) = 0;
  // x [head_dim, n_head_kv, n_tok] F32 into cache [head_dim, n_head_kv, n_ctx] (F32/F16/Q8_0/Q4_0)
  // at positions pos I32 [n_tok].
  virtual void kv_store(const Tensor& x, const Tensor& pos, const Tensor& cache) = 0;
  // q, out [head_dim, n_head, n_tok]; k/v caches [head_dim, n_head_kv, n_kv] (a view whose ne[2]
  // is the number of valid positions); pos I32 [n_tok].
  virtual void attention(const Tensor& q, const Tensor& pos, const Tensor& k, const Tensor& v, const AttnParams& p,
                         const Tensor& out) = 0;
  // x, y [C, n_t] (token stride nb[1]); w [d_conv, C]; state [d_conv - 1, C].
  virtual void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y) = 0;
  // q, k [S, Hk, n_t]; v [S, Hv, n_t]; g, beta [Hv, n_t]; state [S, S, Hv]; out [S, Hv, n_t].
  // chunk = 0: token-by-token recurrence; > 0: chunked form with that chunk length.
  virtual void gated_delta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                           const Tensor& state, const Tensor& out, int chunk) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceType type() const = 0;
  virtual std::string name() const = 0;
  virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;  // 64-byte aligned, uninitialised
  // Wraps caller-owned host memory (e.g. the GGUF mapping) without copying; nullptr when the
  // device cannot read host memory in place. The memory must outlive the Buffer.
  virtual std::unique_ptr<Buffer> wrap(const void* host, size_t bytes) = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
};

// The CPU device: kernels from kernels/cpu on a ThreadPool of n_threads (<= 0: all cores, or
// KILN_THREADS). Its streams execute each op when it is enqueued (synchronize() is a no-op).
std::unique_ptr<Device> make_cpu_device(int n_threads = 0);

// Scratch planning: reserve() hands out aligned offsets while planning; allocate() makes one
// Buffer of the total; tensor() views it. Re-plan (reset + reserve + allocate) only when the batch
// shape grows.
class Arena {
 public:
  size_t reserve(size_t bytes, size_t align = 64);
  size_t reserve_tensor(GgmlType type, std::array<int64_t, 4> ne) ;
  void allocate(Device& dev);
  void reset();  // forget the plan (keeps the buffer until the next allocate)
  size_t planned() const { return size_; }
  Buffer* buffer() const { return buf_.get(); }
  Tensor tensor(size_t offset, GgmlType type, std::array<int64_t, 4> ne) const;

 private:
  size_t size_ = 0;
  std::unique_ptr<Buffer> buf_;
};

}  // namespace kiln::backend
