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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "gguf/types.h"
#include "kernels/ops.h"

namespace kiln::backend {

using gguf::GgmlType;
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

enum class Unary { Silu, Sigmoid, Softplus, Gelu /* tanh form */, GeluErf };
enum class Binary { Add, Mul, SwiGlu /* silu(a) * b */, SigmoidMul /* a * sigmoid(b) */ };

// Attention as the model states it (device-neutral). flash = false asks for llama.cpp's
// non-flash attention (`-fa off`); only the CPU stream gives it a meaning of its own (ggml's
// mat-mul/soft_max orders); other devices treat it as flash. causal = false (an encoder, e.g. the
// vision tower): every token attends to every position 0..k.ne[2]-1 of its slot, pos is not read.
struct AttnSpec {
  int64_t head_dim = 0, n_head = 0, n_head_kv = 0;
  float scale = 1.f;
  bool flash = true;
  bool causal = true;
};

class Graph {  // a recorded op list (CUDA graph); replayed with Stream::replay
 public:
  virtual ~Graph() = default;
};

// Workspace sizes (rule 4) as the streams of one device type compute them. Every Stream is one;
// workspace_sizes() gives one without a device, for planning memory before anything is allocated
// (model/fit.h): the same functions the streams call, so plan and allocation cannot disagree.
class WorkspaceSizes {
 public:
  virtual ~WorkspaceSizes() = default;
  virtual size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) const = 0;
  virtual size_t gated_delta_workspace(int64_t S, int64_t Hv, int chunk, int64_t n_tok) const = 0;
  virtual size_t attention_workspace(const AttnSpec& p, int64_t n_tok, int64_t n_kv_max) const = 0;
  virtual size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) const = 0;
  virtual size_t top_logits_workspace(int64_t n_vocab, int64_t n_rows, int k) const = 0;
};

// Per-token sequence inputs. Every op that touches per-sequence memory takes `seq` (I32 [T], the
// slot of each token) and `pos` (I32 [T], its position). Tokens of one sequence are consecutive
// and at consecutive positions (a "run"); kernels find runs and KV lengths (pos + 1) themselves
// from these device tensors, so the op list of a step depends only on T, never on which
// sequences it holds. Per-sequence memory is a 4-D view whose ne[3] (stride nb[3]) is the slot.
class Stream : public WorkspaceSizes {
 public:
  ~Stream() override = default;
  virtual Device& device() const = 0;

  // ---- transfers (asynchronous; see rule 2) ----
  virtual void upload(const Tensor& dst, const void* src, size_t bytes) = 0;  // dst contiguous
  virtual void download(void* dst, const Tensor& src, size_t bytes) = 0;      // src contiguous
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same type and shape, any strides, same device
  virtual void fill_zero(const Tensor& dst) = 0;                // any strides
  virtual void synchronize() = 0;

  // ---- graphs: record what `body` enqueues, replay it later with the same buffers. nullptr where
  // unsupported (the CPU: the caller just runs body). Scalars passed to ops are baked in. ----
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& body) { return nullptr; }
  virtual void replay(Graph& g) {}
  // fn(arg) on the host once the stream's earlier work is done, before its later work starts (CUDA:
  // a host node of the stream / of a graph being captured, run on a driver thread: fn must not call
  // the CUDA API, and arg and what it points to must outlive the graphs that hold it; the CPU: now).
  virtual void host_call(void (*fn)(void*), void* arg) = 0;

  // ---- batch invariance: on, every op computes each token's outputs with the same arithmetic however
  // many tokens and sequences the batch holds and however a prompt is split (greedy text identical with
  // and without prefix-cache hits or other slots' work). The CPU's kernels are so already (with flash
  // attention); CUDA then takes per-token kernels (kernels/cuda/invariant.h), slower for prefill and
  // batches. Set before the first op; it holds for the whole process on CUDA. ----
  virtual void set_batch_invariant(bool on) {}

  // ---- workspaces (rule 4): the sizes are WorkspaceSizes' ----
  virtual void reserve_workspace(size_t bytes) = 0;
  virtual int workspace_grows() const = 0;  // reallocations after the first reserve

  // ---- ops (enqueued; semantics in kernels/ops.h). F32 activations unless stated. "Rows": a
  // tensor [ne0, n1, n2] whose rows of ne0 contiguous floats are at nb[1] / nb[2] strides; an op
  // over rows applies to each row separately (the CPU calls its kernel once per row, which fixes
  // where its vector tails fall: pass [n, 1] for one flat call over n floats). ----
  // w [k, n] any matmul_supported type (a 2-D view; nb[1] the row stride); x [k, m]; y [n, m].
  // Columns of x/y may be strided (nb[1]).
  virtual void matmul(const Tensor& w, const Tensor& x, const Tensor& y) = 0;
  // Expert mat-mul (llama.cpp's mul_mat_id): w [k, n, n_expert]; ids I32 [K, T];
  // x [k, nx, T] with nx = 1 (every slot of token t reads column t) or nx = K (slot j reads x[:, j, t]);
  // y [n, K, T]: y[:, j, t] = w[:, :, ids[j, t]] · x. Strided along dims 1 and 2.
  virtual void matmul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& y) = 0;
  // table [k, n_rows] any type; ids I32 [n] (already validated); out [k, n] F32 (columns strided).
  virtual void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // x, y rows [ne0, n1, n2] (y may be x); w [ne0] F32 or nullptr.
  virtual void rms_norm(const Tensor& x, const Tensor* w, const Tensor& y, float eps) = 0;
  virtual void l2_norm(const Tensor& x, const Tensor& y, float eps) = 0;
  // x rows [head_dim, n_head, n_tok] in place; pos I32 [n_tok].
  virtual void rope(const Tensor& x, const Tensor& pos, const RopeParams& p) = 0;
  // Multi-section rope (RopeParams::multi, kernels/ops.h): x rows [head_dim, n_head, n_tok] in
  // place; pos I32 [n_tok, 4] (stream s of token t at s * n_tok + t, ggml_rope_multi's layout).
  virtual void rope_multi(const Tensor& x, const Tensor& pos, const RopeParams& p) = 0;
  virtual void softmax(const Tensor& x, float scale) = 0;  // rows, in place
  // Rows: x, y same shape (y may be x).
  virtual void unary(Unary op, const Tensor& x, const Tensor& y) = 0;
  // Rows: a, y same shape (y may be a or b); b either the same shape, one row [ne0] broadcast to
  // every row, or [1, n1, n2] (one scalar per row, as if repeated across the row).
  virtual void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void scale(const Tensor& x, float s, const Tensor& y) = 0;  // rows
  // logits [n_expert, n_tok]; ids I32 [k, n_tok]; weights [k, n_tok].
  virtual void topk_route(const Tensor& logits, int k, bool renorm, float w_scale, const Tensor& ids,
                          const Tensor& weights) = 0;
  // The k largest entries of each row (kernels::top_logits; exact): logits [V, n] contiguous; ids
  // I32 [k, n], vals [k, n], descending, ties lower id first. Workspace: top_logits_workspace(V, n, k).
  virtual void top_logits(const Tensor& logits, int k, const Tensor& ids, const Tensor& vals) = 0;
  // Walsh-Hadamard rotation of every n-chunk of every row (kernels::hadamard), in place.
  virtual void hadamard(const Tensor& x, int64_t n) = 0;
  // x rows [head_dim, n_head_kv, T] F32 into cache [head_dim, n_head_kv, n_ctx, n_seq] (F32/F16/
  // Q8_0/Q4_0) at (pos[t], seq[t]).
  virtual void kv_store(const Tensor& x, const Tensor& seq, const Tensor& pos, const Tensor& cache) = 0;
  // q, out rows [head_dim, n_head, T]; caches [head_dim, n_head_kv, n_ctx, n_seq]; token t attends
  // to positions 0..pos[t] of slot seq[t] (causal; p.causal = false: to all k.ne[2] positions). The
  // workspace: attention_workspace(p, T, n_kv_max) with n_kv_max >= every pos[t] + 1 (>= k.ne[2]).
  virtual void attention(const Tensor& q, const Tensor& seq, const Tensor& pos, const Tensor& k, const Tensor& v,
                         const AttnSpec& p, const Tensor& out) = 0;
  // x, y [C, T] (token stride nb[1]; y may be x); w [d_conv, C] F32; state [d_conv - 1, C, 1, n_seq]
  // F32 (slot seq[t]; a run continues from its slot's state and leaves its last inputs there).
  // keep (speculative verification; every recurrent op takes it): I32 [T], or an empty Tensor (no
  // buffer) for none. keep[t] >= 0: the state as of the end of token t is also written to slot keep[t]
  // of `state` (another slot than any run's), so a rejected draft can continue from an earlier token's
  // state (model::Memory::seq_accept). The kept states equal what a run ending at token t would leave.
  virtual void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& seq, const Tensor& state,
                           const Tensor& y, const Tensor& keep = {}) = 0;
  // q, k [S, Hk, T]; v [S, Hv, T]; g, beta [Hv, T]; state [S, S, Hv, n_seq] F32; out [S, Hv, T].
  // chunk = 0: token-by-token recurrence for every run; > 0: runs of at least `chunk` tokens take
  // the chunked form (ContextOptions::delta_chunk_min; the chunk length itself is the backend's
  // choice — 64 on the CPU), shorter runs the recurrence. keep as conv1d_silu's (a run with a kept
  // token takes the recurrence).
  virtual void gated_delta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                           const Tensor& seq, const Tensor& state, const Tensor& out, int chunk,
                           const Tensor& keep = {}) = 0;

  // ---- fused ops: each is exactly the sequence of the ops above that its comment names (the CPU
  // stream makes those very calls, so its bits do not change); other devices may run one kernel. ----
  // y_i = w_i · x for i < n (1 <= n <= 4): n matmul(w[i], x, y[i]) calls sharing one x [k, m]
  // (every w_i has k columns; y_i [w_i.ne[1], m]). A device may prepare x once for all of them.
  // No y_i may overlap x or another y_i.
  virtual void matmul_n(const Tensor* w, const Tensor* y, int n, const Tensor& x) = 0;
  // Delta-net gates, in place on rows beta, g [H, n1, n2] (same shape); dt_bias, a one row [H]:
  //   unary(Sigmoid, beta, beta); binary(Add, g, dt_bias, g); unary(Softplus, g, g); binary(Mul, g, a, g).
  virtual void delta_gates(const Tensor& beta, const Tensor& g, const Tensor& dt_bias, const Tensor& a) = 0;
  // Gated RMSNorm, in place on rows x [ne0, n1, n2]; z the same shape; w [ne0] F32:
  //   rms_norm(x, &w, x, eps); unary(Silu, z, z); binary(Mul, x, z, x).
  // z is scratch: its contents afterwards are unspecified (the CPU leaves silu(z) there).
  virtual void rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps) = 0;
  // Residual add and the next norm, on rows x, t, y [ne0, n1, n2] (same shape); w [ne0] F32 or nullptr:
  //   binary(Add, x, t, x); rms_norm(x, w, y, eps).
  // y may be x or t; no other overlap.
  virtual void add_rms_norm(const Tensor& x, const Tensor& t, const Tensor* w, const Tensor& y, float eps) = 0;
  // Delta-net input side (qwen35), in place: mixed [C, T] with C = (2*Hk + Hv) * S channels per token
  // (Hk q heads, Hk k heads, Hv v heads of S channels); beta, g [Hv, T]; dt_bias, a [Hv]; conv_w
  // [d_conv, C]; conv_state [d_conv - 1, C, 1, n_seq]:
  //   delta_gates(beta, g, dt_bias, a); conv1d_silu(mixed, conv_w, seq, conv_state, mixed, keep);
  //   l2_norm(q, q, eps); l2_norm(k, k, eps)   (q, k: rows [S, Hk, T] of mixed at channels 0 and Hk*S).
  // The default makes exactly those calls (the CPU's arithmetic).
  virtual void delta_prep(const Tensor& mixed, int64_t S, int64_t Hk, const Tensor& conv_w, const Tensor& seq,
                          const Tensor& conv_state, const Tensor& beta, const Tensor& g, const Tensor& dt_bias,
                          const Tensor& a, float eps, const Tensor& keep = {});
  // The gated delta rule and the gated RMSNorm of its output (z, norm_w as rms_norm_gated's z, w):
  //   gated_delta(q, k, v, g, beta, seq, state, out, chunk, keep); rms_norm_gated(out, norm_w, z, eps).
  // The default makes exactly those calls.
  virtual void gated_delta_norm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                const Tensor& seq, const Tensor& state, const Tensor& out, int chunk,
                                const Tensor& norm_w, const Tensor& z, float eps, const Tensor& keep = {});
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
  // Host memory (host_ptr() set, 64-byte aligned, uninitialised) for transfers with this device's
  // streams: page-locked on CUDA, so downloads and uploads run at the bus's speed without staging
  // through a driver buffer (ordinary memory above kMaxPinnedBytes or when the driver refuses);
  // ordinary memory on the CPU.
  virtual std::unique_ptr<Buffer> alloc_host(size_t bytes) = 0;
  static constexpr size_t kMaxPinnedBytes = size_t(1) << 30;
  virtual std::unique_ptr<Stream> create_stream() = 0;
};

// The CPU device: kernels from kernels/cpu on a ThreadPool of n_threads (<= 0: all cores, or
// KILN_THREADS). Its streams execute each op when it is enqueued (synchronize() is a no-op).
std::unique_ptr<Device> make_cpu_device(int n_threads = 0);
// A CPU device whose streams run on the caller's pool (which must outlive the device).
std::unique_ptr<Device> make_cpu_device(ThreadPool& pool);

// The workspace sizes of a device type's streams, without a device: CPU streams on a pool of
// n_threads workers (ThreadPool::resolve_threads), CUDA streams (in every build: the CUDA size
// arithmetic is plain C++, kernels/cuda/workspace.h). CUDA streams also give their cuBLAS handle a
// workspace of cuda_stream_fixed_bytes(sm) each (sm = compute capability * 10 + minor).
std::unique_ptr<WorkspaceSizes> workspace_sizes(DeviceType type, int n_threads = 0);
size_t cuda_stream_fixed_bytes(int sm);

// Device memory kiln's CUDA context holds (plain arithmetic, every build; docs/memory.md): the
// driver's own part (measured: 262 MiB on an H100 with driver 580, its 8 MiB device heap and printf
// buffer included), the local memory the driver reserves for every thread the SMs can hold
// (stack_bytes x threads_per_sm x n_sm: 264 MiB on 132 SMs at the default 1 KiB stack), and the
// kernels loaded on first use (a 128 MiB reserve; 640 MiB when CUDA_MODULE_LOADING=EAGER loads every
// module, cuBLAS's included, at start). kiln's kernels stay under the default stack (checked:
// cuobjdump --dump-resource-usage, at most 208 bytes), so the local memory does not grow later.
struct CudaCard {
  int n_sm = 128, threads_per_sm = 1536;  // without a GPU: an RTX 4090's (the larger of the users' cards)
  uint64_t stack_bytes = 1024;            // cudaLimitStackSize (the driver's default)
};
uint64_t cuda_context_bytes(const CudaCard& card);

// CUDA devices (backend/cuda_backend.*; built when nvcc is found). cuda_device_count() is 0 without
// a usable GPU or driver (cuda_unavailable_reason() says why) and in builds without CUDA.
int cuda_device_count();
std::string cuda_unavailable_reason();
// The process-wide device for ordinal i (< cuda_device_count()); created on first use.
Device& cuda_device(int i);

// Free and total memory of CUDA device i as the driver reports them now (cudaMemGetInfo; creates
// the device's context on first use), its compute capability (sm = major * 10 + minor) and name.
// false without that device.
struct CudaMemoryInfo {
  size_t free = 0, total = 0;
  size_t context = 0;  // cuda_context_bytes of this device (its context exists: free is net of it)
  int sm = 0;
  std::string name;
};
bool cuda_memory_info(int i, CudaMemoryInfo* out);

// Per-op GPU times, for finding the next gap (docs/gpu.md): with KILN_CUDA_PROFILE=1 in the
// environment every CUDA stream runs op by op (no graphs), holds each step back until the host has
// enqueued it, and times every op with a pair of events. Returns the table of the ops timed since
// the last call (and forgets them); "" when profiling is off.
std::string cuda_profile_report();

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
