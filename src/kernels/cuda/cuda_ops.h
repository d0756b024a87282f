// kernels/cuda/cuda_ops.h — the CUDA kernels as host-callable launchers on device pointers: the
//   device half of every backend::Stream op (backend/cuda_backend.cpp maps Tensors onto these).
// Owns: op semantics on the GPU (the same as kernels/ops.h; sums in the GPU's own orders — bit
//   identity with the CPU or with ggml is not a goal, closeness to the exact result is).
// Must not: allocate (workspaces come in `Launch`), synchronize the stream, read device memory on
//   the host, or know about models. Every launcher only enqueues on L.stream (graph-capturable).
// Conventions: pointers are device pointers; strides of F32 activations are in floats, strides of
//   weights / caches (block types) in bytes. Per-token sequence inputs: seq[t] (slot) and pos[t]
//   (position); tokens of one slot are consecutive at consecutive positions (a run).
// Threading: launchers are thread-safe; a Launch (stream, handle, workspace) belongs to one stream.
// matmul_supported and the *_workspace size functions are defined in workspace.cpp (plain C++,
// compiled in every build: the memory planner uses them without a GPU).
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/types.h"
#include "kernels/ops.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct cublasContext* cublasHandle_t;

namespace kiln::cuda {

using gguf::GgmlType;

// Everything a launcher may use besides its arguments.
struct Launch {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;  // bound to `stream`
  void* ws = nullptr;             // device workspace, ws_bytes long, 256-byte aligned
  size_t ws_bytes = 0;
  int sm = 0;                     // code_sm(): compute capability * 10 + minor (e.g. 90, 89, 86)
  int n_sm = 0;                   // multiprocessors
};

// Rows of ne0 contiguous floats: row (i1, i2) at p + i1*s1 + i2*s2 (floats).
struct Rows {
  float* p = nullptr;
  int64_t ne0 = 0, n1 = 1, n2 = 1;
  int64_t s1 = 0, s2 = 0;
};
// Whether every row starting at p + i1*s1 + i2*s2 is 16-byte aligned (float4 / 16-byte copies).
inline bool rows_vec16(const float* p, int64_t s1, int64_t s2) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && s1 % 4 == 0 && s2 % 4 == 0;
}

// Per-sequence memory: element/row (i1, i2, slot) at base + i1*nb1 + i2*nb2 + slot*nb3 (bytes).
struct SeqMem {
  void* p = nullptr;
  GgmlType type = GgmlType::F32;
  int64_t ne0 = 0, ne1 = 1, ne2 = 1;  // e.g. KV: head_dim, n_head_kv, n_ctx
  size_t nb1 = 0, nb2 = 0, nb3 = 0;
};

// ---- mat-mul (matmul.cu) ----------------------------------------------------------------------
// The op that produces a mat-vec's x, run by matmul / matmul_n in ONE kernel together with the int8
// quantization of x (the CUDA stream defers these ops to the mat-mul that reads their output; the
// values written are those of the op alone). "out" is the mat-mul's x [k, m]:
//   AddRmsNorm: x += t; out = rms_norm(x) * w (w may be null) — add_rms_norm(x, t, w, out, eps);
//   SwiGlu:     out = silu(out) * b — binary(SwiGlu, out, b, out).
// x, t, b: rows [k, m] (row c = column c). Needs m <= 8 and k <= kProduceMaxK (produce_ok).
struct XProducer {
  enum class Kind { AddRmsNorm, SwiGlu } kind = Kind::AddRmsNorm;
  Rows x, t;
  const float* w = nullptr;
  float eps = 0;
  Rows b;
};
inline constexpr int64_t kProduceMaxK = 16384;
inline bool produce_ok(int64_t k, int64_t m) { return m >= 1 && m <= 8 && k % 32 == 0 && k <= kProduceMaxK; }
bool matmul_supported(GgmlType wt);
// Workspace for y[n, m] = W[k, n] x[k, m] (e.g. a dequantized F16 tile of W and x in F16).
size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m);
// W rows (k elements of wt) w_stride bytes apart; x column t at x + t*x_stride; y column t at
// y + t*y_stride. Any m >= 1 (mat-vec kernels for small m, tensor cores for large m). W is read as
// constant (sm_90+: its first bytes may be requested before the kernels enqueued just before finish);
// the mat-vec path quantizes x to int8 per 32 values for most block types (matmul.cu).
void matmul(const Launch& L, GgmlType wt, const void* w, size_t w_stride, int64_t k, int64_t n, const float* x,
            int64_t x_stride, float* y, int64_t y_stride, int64_t m, const XProducer* pre = nullptr);
// One weight of matmul_n: W [k, n] of wt (rows w_stride bytes apart); y column t at y + t*y_stride.
struct MatmulW {
  GgmlType wt = GgmlType::F32;
  const void* w = nullptr;
  size_t w_stride = 0;
  int64_t n = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};
// y_i = W_i x for i < n_w (1 <= n_w <= 4), one x [k, m] for all: what n_w matmul calls give, with
// fewer launches. Mat-vec path (m <= 16) with int8 x: x is quantized once per x order the weights
// need (one order for most mixes); m = 1 (decode): ONE launch per weight type covers the rows of all
// weights of that type (CTAs mapped to weights by a segment table); m = 2..16: the int8 kernel per
// weight on that one quantized x; the F32-x types / mode: their matmul each. m > 16: one matmul each. Workspace: the largest matmul_workspace of the weights.
void matmul_n(const Launch& L, const MatmulW* ws, int n_w, int64_t k, const float* x, int64_t x_stride, int64_t m,
              const XProducer* pre = nullptr);
// Expert mat-mul: expert e < n_expert's matrix at w + e*w_expert_stride; ids [K, T] (slot j of token t
// at ids[t*K + j]); x column for (j, t) at x + t*x_tok + (nx == 1 ? 0 : j)*x_slot; y column (j, t) at
// y + t*y_tok + j*y_slot. ids are in range (the router wrote them). From kMmqIdMinSlots slots on (a
// prefill) the block types go through the grouped tensor-core mat-mul (mmq.cu: each expert's columns
// together), else one mat-vec per slot.
size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots);
void matmul_id(const Launch& L, GgmlType wt, const void* w, size_t w_stride, size_t w_expert_stride, int64_t n_expert,
               int64_t k, int64_t n, const float* x, int64_t nx, int64_t x_slot, int64_t x_tok, const int32_t* ids,
               int64_t K, int64_t T, float* y, int64_t y_slot, int64_t y_tok);
// out column r (out + r*out_stride) = dequantized table row ids[r] (rows row_stride bytes apart).
void get_rows(const Launch& L, GgmlType t, const void* table, size_t row_stride, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride);

// ---- elementwise, norms, rope (elementwise.cu) -----------------------------------------------
enum class Unary { Silu, Sigmoid, Softplus, Gelu, GeluErf };
enum class Binary { Add, Mul, SwiGlu, SigmoidMul };
void unary(const Launch& L, Unary op, Rows x, Rows y);
// b: same shape as a (b_mode 0), one row broadcast (1: b.ne0 == a.ne0, b.n1 = b.n2 = 1), or one
// scalar per row (2: b.ne0 == 1, b.n1/n2 == a's).
void binary(const Launch& L, Binary op, Rows a, Rows b, int b_mode, Rows y);
void scale(const Launch& L, Rows x, float s, Rows y);
void rms_norm(const Launch& L, Rows x, const float* w, Rows y, float eps);  // w may be nullptr
void l2_norm(const Launch& L, Rows x, Rows y, float eps);
void rope(const Launch& L, Rows x, const int32_t* pos, const kernels::RopeParams& p);  // pos [n2]
// RopeParams::multi (kernels/ops.h): pos [4 * n2], stream s of token t at s * n2 + t.
void rope_multi(const Launch& L, Rows x, const int32_t* pos, const kernels::RopeParams& p);
void softmax(const Launch& L, Rows x, float scale);
void hadamard(const Launch& L, Rows x, int64_t n);
// logits [n_expert, n_tok] contiguous; ids, weights [k, n_tok] (kernels::topk_route semantics).
void topk_route(const Launch& L, const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm,
                float w_scale, int32_t* ids, float* weights);
// top_logits (kernels::top_logits semantics, exact): logits [V, n] contiguous; ids, vals [k, n];
// k <= kMaxTopLogits. Workspace: top_logits_workspace(V, n, k) (the survivors of chunks of
// kTopLogitsChunk entries; top_logits.cu).
constexpr int kMaxTopLogits = 128, kTopLogitsChunk = 4096;
size_t top_logits_workspace(int64_t V, int64_t n, int k);
void top_logits(const Launch& L, const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals);
// Strided copy of n_rows rows of row_bytes bytes (rows (i1, i2, i3) at the given byte strides).
void copy_rows(const Launch& L, void* dst, const size_t dst_nb[3], const void* src, const size_t src_nb[3],
               size_t row_bytes, const int64_t ne[3]);

// ---- fused elementwise ops (fused.cu): one kernel each (backend::Stream's fused ops) -----------
// beta, g rows [H, n1, n2] (same shape), in place; dt_bias, a [H] contiguous:
// beta = sigmoid(beta); g = softplus(g + dt_bias) * a.
void delta_gates(const Launch& L, Rows beta, Rows g, const float* dt_bias, const float* a);
// x rows in place: x = rms_norm(x) * w * silu(z); z the same shape (only read); w [ne0].
void rms_norm_gated(const Launch& L, Rows x, const float* w, Rows z, float eps);
// x += t; y = rms_norm(x) * w (w [ne0] or nullptr); x, t, y the same shape; y may be x or t.
void add_rms_norm(const Launch& L, Rows x, Rows t, const float* w, Rows y, float eps);

// ---- sequence ops (attention.cu, deltanet.cu) -------------------------------------------------
// x rows [D, Hkv, T] F32 into cache (ne0 = D, ne1 = Hkv, ne2 = n_ctx) of F32/F16/Q8_0/Q4_0.
void kv_store(const Launch& L, Rows x, const int32_t* seq, const int32_t* pos, SeqMem cache);
struct AttnArgs {
  int64_t head_dim = 0, n_head = 0, n_head_kv = 0;
  float scale = 1.f;
  int64_t n_kv_max = 0;  // upper bound of pos + 1 over the batch (sizes split-KV work; 0: n_ctx)
  bool causal = true;    // false: every token attends to all n_ctx (= k.ne2) keys of its slot
};
size_t attention_workspace(const AttnArgs& a, int64_t n_tok);
// Tokens per tile of the tensor-core path (attention_mma.cu) that attention() takes for this launch's
// tiles of whole runs: prefill-sized batches (T > 64) over F16 / Q8_0 / Q4_0 K and V caches,
// head_dim 64 / 72 / 128 / 256, sm_80+, unless KILN_CUDA_ATTN_MMA=0; 0: the CUDA-core kernel takes every
// token. Its results round q, the probabilities and dequantized cache values to F16 (F32 sums).
int attention_mma_tile(const Launch& L, const AttnArgs& a, GgmlType kt, GgmlType vt, int64_t n_tok);
// q, out rows [D, Hq, T]; token t attends to positions 0..pos[t] of slot seq[t] (a.causal = false: to
// all k.ne2 positions; pos is not read).
void attention(const Launch& L, Rows q, const int32_t* seq, const int32_t* pos, SeqMem k, SeqMem v, const AttnArgs& a,
               Rows out);
// x, y [C, T] (column stride in floats; y may be x); w [d_conv, C]; state (ne0 = d_conv-1, ne1 = C).
// keep (every recurrent launcher): nullptr, or I32 [T] on the device: keep[t] >= 0 also writes the state
// as of the end of token t to slot keep[t] (backend::Stream::conv1d_silu's rule).
void conv1d_silu(const Launch& L, const float* x, int64_t x_stride, const float* w, int d_conv, int64_t C,
                 const int32_t* seq, SeqMem state, float* y, int64_t y_stride, int64_t T, const int32_t* keep = nullptr);
// q, k rows [S, Hk, T]; v rows [S, Hv, T]; g, beta [Hv, T] contiguous; state (ne0 = S, ne1 = S,
// ne2 = Hv) F32; out rows [S, Hv, T]. chunk = 0: the recurrence for every run; > 0: runs of at least
// max(chunk, 64) tokens take the chunked form (ContextOptions::delta_chunk_min; chunks of 64 tokens;
// sm_80+ and S 32 / 64 / 128, without keep and --batch-invariant: L.ws of gated_delta_workspace
// bytes), shorter runs the recurrence.
size_t gated_delta_workspace(int64_t S, int64_t Hv, int chunk, int64_t n_tok);
void gated_delta(const Launch& L, Rows q, Rows k, Rows v, const float* g, const float* beta, const int32_t* seq,
                 SeqMem state, Rows out, int chunk, const int32_t* keep = nullptr);

// ---- fused delta-net ops for small batches (deltanet_fused.cu) --------------------------------
// Each returns false, enqueuing nothing, where its kernel does not cover the shape (more than 64
// tokens, d_conv != 4, S not a multiple of 32 / not 64 or 128, ...); the caller runs the unfused ops.
// delta_prep: mixed x [C, T] (C = (2*Hk + Hv) * S: q heads, k heads, v heads; token stride x_stride),
// in place: gates (delta_gates on beta, g [Hv, T]), conv1d_silu with its state, L2 norm of each q/k head.
bool delta_prep_fused(const Launch& L, float* x, int64_t x_stride, int64_t S, int64_t Hk, int64_t Hv, const float* w,
                      int d_conv, const int32_t* seq, SeqMem state, Rows beta, Rows g, const float* dt_bias,
                      const float* a, float eps, int64_t T, const int32_t* keep = nullptr);
// gated_delta (as above, every run the recurrence) then rms_norm_gated(out, norm_w, z, eps).
bool gated_delta_norm_fused(const Launch& L, Rows q, Rows k, Rows v, const float* g, const float* beta,
                            const int32_t* seq, SeqMem state, Rows out, const float* norm_w, Rows z, float eps,
                            const int32_t* keep = nullptr);

// ---- profiling aid (elementwise.cu) -------------------------------------------------------------
// One thread that spins for `us` microseconds of device time: holds the stream back while the host
// enqueues a step op by op, so that per-op event timings (KILN_CUDA_PROFILE) measure the GPU's work,
// not the host's launch rate.
void busy_wait(const Launch& L, int64_t us);

// ---- the architecture the kernels run as (elementwise.cu) ---------------------------------------
// Launch::sm for the current device: its compute capability (device_sm), lowered to the virtual
// architecture of the code the runtime loaded for it — a build for 86 on a Hopper card runs its
// compute_86 PTX, whose sm_90-only paths (bulk copies, clusters, PDL) are compiled out, so the
// launchers must not choose them — and to KILN_CUDA_SM when that is set (e.g. 86: the paths of the
// RTX 30/40 cards on a newer one, for tests and comparisons).
int code_sm(int device_sm);

}  // namespace kiln::cuda
