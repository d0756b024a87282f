// kernels/ops.h — the op-level compute API on host memory: every op the models need, in two
//   flavours with the same arguments: kiln::kernels::ref::* (kernels/ref/ref.h: scalar, single
//   thread, the oracle) and kiln::kernels::* (here: runtime-dispatched SIMD, multi-threaded on a
//   ThreadPool).
// Owns: op semantics (documented once, here), the dispatch table (kernels/cpu/dispatch.h).
// Must not: know about models, sequences or devices; allocate on the hot path (callers pass a
//   workspace sized by the *_workspace() functions); take ownership of any pointer.
// Threading: each call uses the given pool and returns when done; distinct calls on distinct
//   pools may run concurrently. Inputs may alias outputs only where an op says so.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "gguf/types.h"

namespace kiln::kernels {

using gguf::GgmlType;

// A set of rows of ne0 contiguous floats: row (i1, i2) starts at p + i1*s1 + i2*s2 (strides in
// floats). Typical use: [head_dim, n_head, n_tokens] with s1 = head_dim, s2 = token stride.
struct Rows {
  float* p = nullptr;
  int64_t ne0 = 0, n1 = 1, n2 = 1;
  int64_t s1 = 0, s2 = 0;
  float* row(int64_t i1, int64_t i2) const { return p + i1 * s1 + i2 * s2; }
  int64_t n_rows() const { return n1 * n2; }
};
struct CRows {
  const float* p = nullptr;
  int64_t ne0 = 0, n1 = 1, n2 = 1;
  int64_t s1 = 0, s2 = 0;
  CRows() = default;
  CRows(const float* p_, int64_t ne0_, int64_t n1_ = 1, int64_t n2_ = 1, int64_t s1_ = 0, int64_t s2_ = 0)
      : p(p_), ne0(ne0_), n1(n1_), n2(n2_), s1(s1_), s2(s2_) {}
  CRows(const Rows& r) : p(r.p), ne0(r.ne0), n1(r.n1), n2(r.n2), s1(r.s1), s2(r.s2) {}  // NOLINT
  const float* row(int64_t i1, int64_t i2) const { return p + i1 * s1 + i2 * s2; }
};
// Contiguous [ne0, n1, n2] rows.
inline Rows rows3(float* p, int64_t ne0, int64_t n1 = 1, int64_t n2 = 1) { return {p, ne0, n1, n2, ne0, ne0 * n1}; }
inline CRows crows3(const float* p, int64_t ne0, int64_t n1 = 1, int64_t n2 = 1) { return {p, ne0, n1, n2, ne0, ne0 * n1}; }

// ---- matrix x matrix -------------------------------------------------------------------------
// Weight W [k, n] of type wt: n rows of k elements, row j at (const char*)w + j*w_stride bytes.
// X [k, m] F32: column t at x + t*x_stride floats.  Y [n, m] F32: column t at y + t*y_stride.
// Y[j, t] = sum_i W[i, j] * X[i, t], accumulated in F32 (m = 1 is the mat-vec).
// wt: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS; k must be a
// multiple of the type's block size. The fast paths quantize X to 8 bits per 32 elements.
// On AVX-512 hosts F16 / BF16 weights take X rounded to F16 / BF16 first and every float weight type
// sums in ggml's order (llamafile tinyBLAS / ggml_vec_dot), as llama.cpp's CPU backend does.
bool matmul_supported(GgmlType wt);
struct MatmulArgs {
  GgmlType wt = GgmlType::F32;
  const void* w = nullptr;
  size_t w_stride = 0;  // bytes between weight rows (>= row_size(wt, k))
  int64_t k = 0, n = 0, m = 1;
  const float* x = nullptr;
  int64_t x_stride = 0;  // floats between columns of X (>= k when m > 1)
  float* y = nullptr;
  int64_t y_stride = 0;  // floats between columns of Y (>= n when m > 1)
  // W is one expert of a stacked expert tensor: llama.cpp's MUL_MAT_ID orders on AVX-512 (float
  // weights: ggml_vec_dot's order even where tinyBLAS's would apply; K-quants: the per-block gemv).
  bool expert = false;
};

// ---- rope ------------------------------------------------------------------------------------
// Rotates the first n_rot dims of every row of x (in place), pairing (i, i + n_rot/2) when neox,
// else (2i, 2i+1). Row (h, t) uses position pos[t]; theta_p = pos * freq_scale *
// freq_base^(-2p/n_rot) for pair p; dims >= n_rot pass through. ext_factor/YaRN: not supported.
struct RopeParams {
  int n_rot = 0;
  bool neox = true;
  float freq_base = 10000.f;
  float freq_scale = 1.f;
  // rope_multi only (ggml_rope_multi): each pair takes one of four position streams pos[s*T + t].
  //   Imrope (Qwen3-VL / Qwen3.5 text, GGML_ROPE_TYPE_IMROPE): NeoX pairs over n_rot dims; pair i
  //     with sector = i % sum(sections) uses stream 1 when sector % 3 == 1 && sector < 3*sections[1],
  //     2 when sector % 3 == 2 && sector < 3*sections[2], 0 when sector % 3 == 0 && sector <
  //     3*sections[0], else 3; theta = pos_s * freq_base^(-2i/n_rot).
  //   Vision (GGML_ROPE_TYPE_VISION, the Qwen-VL ViT): NeoX pairs (i, i + n_rot/2) over n_rot dims;
  //     pair i uses the stream of the section its sector falls in (sections laid end to end) and
  //     the exponent restarts in each section: theta = pos_s * freq_base^(-2(i - start_s)/(n_rot/2)).
  // As rope(): angles by repeated float multiplication (ggml's), pos * freq_scale, fma rotation.
  enum class Multi { None, Imrope, Vision };
  Multi multi = Multi::None;
  int sections[4] = {0, 0, 0, 0};
};
// rope_multi's choice for pair i: the position stream (0..3) and the exponent index (see RopeParams).
inline void rope_multi_pair(const RopeParams& p, int i, int& stream, int& expo) {
  const int sect = p.sections[0] + p.sections[1] + p.sections[2] + p.sections[3];
  const int sector = sect > 0 ? i % sect : 0;
  if (p.multi == RopeParams::Multi::Vision) {
    int start = 0, s = 0;
    while (s < 3 && sector >= start + p.sections[s]) start += p.sections[s++];
    stream = s;
    expo = sector - start;
    return;
  }
  expo = i;
  if (sector % 3 == 1 && sector < 3 * p.sections[1]) stream = 1;
  else if (sector % 3 == 2 && sector < 3 * p.sections[2]) stream = 2;
  else if (sector % 3 == 0 && sector < 3 * p.sections[0]) stream = 0;
  else stream = 3;
}

// ---- attention -------------------------------------------------------------------------------
// One sequence's KV cache: n_kv positions of n_head_kv heads of head_dim elements of `type`
// (F32, F16, Q8_0 or Q4_0); the row for (pos p, head h) is at data + p*pos_stride + h*head_stride
// bytes (row_size(type, head_dim) bytes, head_dim a multiple of the block size).
struct KvView {
  GgmlType type = GgmlType::F16;
  const void* data = nullptr;
  size_t pos_stride = 0, head_stride = 0;
  int64_t n_kv = 0;
};
// q: [head_dim, n_head, n_tok]; out: same shape. Query t sees cache positions 0..pos[t] (pos[t] <
// n_kv). q-head i uses kv-head i / (n_head / n_head_kv). Online softmax of scale * q.k;
// out = sum softmax * v. head_dim <= 512.
// order: how the sums are formed. Flash: llama.cpp's CPU flash attention as it runs for a prompt
// batch (tiled for F16/F32 caches, per key for quantized keys; AVX-512 hosts, head_dim % 16 == 0,
// else kiln's own F32 online softmax), the same for every batch (batch- and chunk-invariant).
// GgmlVec / GgmlTiny: llama.cpp's CPU graph without flash attention, operation for operation (q and
// the probabilities rounded to F16, ggml's soft_max and exp, its dot orders: GgmlTiny is the
// tinyBLAS order ggml uses for batches of >= 2 tokens, GgmlVec its vec_dot order for single
// tokens). The Ggml orders need F16 K and V and an AVX-512 host; otherwise Flash.
enum class AttnOrder { Flash, GgmlVec, GgmlTiny };
struct AttnParams {
  int64_t head_dim = 0, n_head = 0, n_head_kv = 0;
  float scale = 1.f;
  AttnOrder order = AttnOrder::Flash;
};
bool attention_ggml_supported(GgmlType k, GgmlType v, int64_t head_dim);

// ---- Walsh-Hadamard rotation ------------------------------------------------------------------
// Every n-element chunk of every row (n a power of two dividing ne0), in place: x <- H_n x / sqrt(n),
// H_n the Sylvester-ordered Hadamard matrix (symmetric; the map is its own inverse). Formed as
// llama.cpp's CPU fwht: x * (1/sqrtf(n)) first, then the butterflies (u+v, u-v) with spans 1, 2, 4...
// llama.cpp rotates q and k this way when the K cache is quantized, v and the attention output when
// the V cache is: the rotation spreads outliers before the 8/4-bit rounding.
void hadamard(Rows x, int64_t n, ThreadPool& pool);

// ---- gated delta rule (Qwen3.5 / Qwen3-Next linear attention) -------------------------------
// Per v-head h (< Hv) with q/k head hk = h % Hk, and per token t, with S x S state M[i][j]
// (i key index, j value index) stored ggml-style: state[h*S*S + j*S + i]:
//   M *= exp(g[t,h]);  kvm[j] = sum_i M[i][j] k[i];  d[j] = (v[j] - kvm[j]) * beta[t,h];
//   M[i][j] += k[i] d[j];  out[j] = sum_i M[i][j] q[i] / sqrt(S).
// q, k: head hk of token t at q + t*qk_stride + hk*S; v: v + t*v_stride + h*S;
// out: out + t*out_stride + h*S; g, beta: [Hv, n_t] contiguous. q, k already L2-normalised.
// out must not alias q/k/v. state is updated in place. keep (the recurrence only; nullptr: none):
// [n_t] states of Hv heads, keep[t] (when not null) receives the state after token t — the bits of
// n_t one-token calls with a copy after each kept token.
struct DeltaArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  int64_t qk_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  float* state = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t S = 0, Hk = 0, Hv = 0, n_t = 0;
  float* const* keep = nullptr;
};

// ---- the dispatched, multi-threaded ops (kernels/cpu) -----------------------------------------

// Selects the kernel table. Default: selected_isa() (KILN_CPU). Returns false (and changes
// nothing) if the CPU lacks the ISA. Not thread-safe against concurrent ops: tests only.
bool set_isa(CpuIsa isa);
CpuIsa current_isa();

size_t matmul_workspace(GgmlType wt, int64_t k, int64_t m, int n_threads);
// ws: matmul_workspace(...) bytes, 64-byte aligned.
void matmul(const MatmulArgs& a, void* ws, ThreadPool& pool);

// out[:, r] = dequantize(table row ids[r]) for r < n; table rows: k elements of type t, row_stride
// bytes apart; out column stride out_stride floats. ids are checked against n_rows.
void get_rows(GgmlType t, const void* table, size_t row_stride, int64_t n_rows, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride, ThreadPool& pool);

// y = x / sqrt(mean(x^2) + eps) * w (w: [ne0] or nullptr). y may alias x.
void rms_norm(CRows x, const float* w, Rows y, float eps, ThreadPool& pool);
// y = x / sqrt(sum(x^2) + eps), in llama.cpp's arithmetic (build_gdn_l2_norm: rms_norm with eps/n,
// then times 1/sqrt(n); squares summed in double). y may alias x.
void l2_norm(CRows x, Rows y, float eps, ThreadPool& pool);
void rope(Rows x, const int32_t* pos, const RopeParams& p, ThreadPool& pool);
// Multi-section rope (RopeParams::multi): row (h, t) uses positions pos[s * n2 + t], s = 0..3.
void rope_multi(Rows x, const int32_t* pos, const RopeParams& p, ThreadPool& pool);
// Row-wise softmax of scale * x, in place.
void softmax(Rows x, float scale, ThreadPool& pool);

// Elementwise over n floats; outputs may alias inputs.
void silu(const float* x, float* y, int64_t n);
void swiglu(const float* gate, const float* up, float* y, int64_t n);    // y = silu(gate) * up
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n);  // y = x * sigmoid(g)
void sigmoid(const float* x, float* y, int64_t n);
void softplus(const float* x, float* y, int64_t n);                     // ggml's logf(1 + expf(x)); x > 20: x
void gelu(const float* x, float* y, int64_t n);      // tanh form: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
void gelu_erf(const float* x, float* y, int64_t n);  // exact: 0.5x(1 + erf(x/sqrt(2)))
void add(const float* a, const float* b, float* y, int64_t n);
void mul(const float* a, const float* b, float* y, int64_t n);
void scale(const float* x, float s, float* y, int64_t n);

// MoE routing: logits [n_expert, n_tok]; ids, weights: [k, n_tok]. Softmax over all experts, the
// k largest (ties: lower id first) in descending order; renorm divides the k weights by their
// sum; then every weight is multiplied by w_scale. n_expert > 4096 (a vocabulary: the MTP drafter's
// argmax) only with k = 1.
void topk_route(const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm, float w_scale,
                int32_t* ids, float* weights);

// The k largest entries of each row of logits [V, n] (sampling from a row's top candidates):
// ids I32 [k, n] and vals [k, n] in descending order, ties: lower id first; NaN ranks below every
// number (-inf included). 1 <= k <= V.
void top_logits(const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals);

// Writes rows (h, t) of x ([head_dim, n_head_kv, n_tok]) into a cache of `type` (F32 F16 Q8_0
// Q4_0) at dst + pos[t]*pos_stride + h*head_stride bytes.
void kv_store(GgmlType type, CRows x, const int32_t* pos, void* dst, size_t pos_stride, size_t head_stride);

// When there are fewer (token, kv-head) work items than threads (decode), the key range is split
// across threads (flash-decoding) and the partial softmax states are merged; ws holds them.
size_t attention_workspace(const AttnParams& p, int n_threads);
void attention(CRows q, const int32_t* pos, const KvView& k, const KvView& v, const AttnParams& p, Rows out, void* ws,
               ThreadPool& pool);
// Without a workspace: no key splitting (parallel over tokens x kv-heads only).
inline void attention(CRows q, const int32_t* pos, const KvView& k, const KvView& v, const AttnParams& p, Rows out,
                      ThreadPool& pool) {
  attention(q, pos, k, v, p, out, nullptr, pool);
}

// Causal depthwise conv + SiLU over C channels and n_t tokens: x column t at x + t*x_stride,
// y column t at y + t*y_stride (y may alias x); w: [d_conv, C] (row c = taps, oldest first);
// state: [d_conv-1, C] (row c = the previous d_conv-1 inputs of channel c, oldest first), updated.
// keep (nullptr: none): [n_t] states, keep[t] (when not null) receives the state after token t — the
// bits of n_t one-token calls with a copy after each kept token.
void conv1d_silu(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t C, int64_t n_t, int d_conv, ThreadPool& pool, float* const* keep = nullptr);

// Token-by-token recurrence (decode; any n_t).
void gated_delta_rule(const DeltaArgs& a, ThreadPool& pool);
// Chunked form for prefill: same outputs and final state (within float error).
size_t gated_delta_chunked_workspace(int64_t S, int chunk, int n_threads);
void gated_delta_rule_chunked(const DeltaArgs& a, int chunk, void* ws, ThreadPool& pool);

}  // namespace kiln::kernels
