// model/forward.h — internal to src/model: the scratch state shared by the architecture files
//   (llama.cpp: dense decoder layers; qwen35.cpp: delta-net and gated attention; qwen35moe.cpp:
//   the MoE FFN). Not included outside src/model.
// Buffers are planned once in Context's constructor for n_batch tokens; the layer functions only
//   index into them. Activations are column-major per token: buffer [ne0, T] has token t at
//   p + t*ne0.
#pragma once
#include <cstdlib>
#include <vector>

#include "kernels/ops.h"
#include "model/context.h"

namespace kiln::model {

struct Run {
  int32_t seq = 0;
  int64_t t0 = 0, n = 0;  // token range [t0, t0+n) of the batch
  int32_t pos0 = 0;
};

struct AlignedBuffer {
  void* p = nullptr;
  size_t size = 0;
  void reserve(size_t n) {
    if (n <= size) return;
    std::free(p);
    size = (n + 63) / 64 * 64;
    p = std::aligned_alloc(64, size);
    KILN_CHECK(p != nullptr, "out of memory ({} bytes)", size);
  }
  ~AlignedBuffer() { std::free(p); }
};

struct Context::Impl {
  const Model& m;
  const ModelConfig& c;
  ThreadPool& pool;
  const ContextOptions& opt;  // the owning Context's options

  // Per-batch inputs.
  std::vector<int32_t> tok, pos;
  std::vector<Run> runs;
  int64_t T = 0;  // tokens in this batch

  // Activations ([width, T]).
  std::vector<float> x;     // residual stream [E, T]
  std::vector<float> cur;   // normed input of a block [E, T]
  std::vector<float> tmp;   // block output [E, T]
  std::vector<float> q;     // [q rows (qwen35: 2*D*Hq), T]
  std::vector<float> k, v;  // [D*Hkv, T]
  std::vector<float> att;   // [D*Hq, T]
  std::vector<float> fa, fb;  // FFN hidden [max(n_ff, n_ff_shexp, ...), T]
  // delta-net
  std::vector<float> mixed;  // [conv_dim, T]
  std::vector<float> z;      // [value_dim, T]
  std::vector<float> beta, g;  // [Hv, T]
  std::vector<float> dout;   // [value_dim, T]
  // MoE
  std::vector<float> router;   // [n_expert, T]
  std::vector<int32_t> ids;    // [k, T]
  std::vector<float> wts;      // [k, T]
  std::vector<float> xe;       // gathered inputs [E, T]
  std::vector<float> ye;       // expert outputs [E, T]
  std::vector<float> eout;     // weighted expert outputs by token and rank [E, k, T]
  std::vector<int32_t> etok;   // tokens routed to one expert
  std::vector<float> ewt;      // their weights
  // output
  std::vector<int32_t> out_idx;  // batch index of each output row
  std::vector<float> hidden;     // [E, n_out]
  std::vector<float> logits;     // [V, n_out]

  AlignedBuffer ws;       // matmul workspace
  AlignedBuffer dws;      // gated-delta chunked workspace
  int delta_chunk = 64;

  int64_t n_out_max = 0;  // rows of `logits`

  Impl(const Model& model, ThreadPool& p, const ContextOptions& o);

  // y[n, mcols] = W(slice e) x[k, mcols]; strides in floats (0 = dense).
  void matmul(const Weight& w, const float* xin, int64_t mcols, float* y, int64_t e = 0, int64_t x_stride = 0,
              int64_t y_stride = 0);
  void rms_norm(const float* in, const Weight& w, float* out, int64_t ne0, int64_t rows);
  void add_bias(float* y, const Weight& b, int64_t n, int64_t mcols);
  // fa[:, t] = silu(fa[:, t]) * fb[:, t] for the first `cols` columns of width n, one column at a
  // time (ggml's swiglu works per row; its vector tail makes a flat call over n*cols differ).
  void swiglu(int64_t n, int64_t cols);
};

// Architecture blocks. Each reads s.cur ([E, T], the normed block input) and writes s.tmp ([E, T]).
void dense_attention(Context::Impl& s, const LayerWeights& L, int64_t il, Memory& mem);   // llama.cpp
void dense_ffn(Context::Impl& s, const LayerWeights& L);                                   // llama.cpp
void gated_attention(Context::Impl& s, const LayerWeights& L, int64_t il, Memory& mem);   // qwen35.cpp
void delta_net(Context::Impl& s, const LayerWeights& L, int64_t il, Memory& mem);         // qwen35.cpp
void moe_ffn(Context::Impl& s, const LayerWeights& L);                                     // qwen35moe.cpp

// Shared attention core: q rows (head h of token t at q + t*q_tok + h*q_head), k/v [D*Hkv, T]
// (already normed and roped); stores k/v into the sequence caches and writes s.att [D*Hq, T].
void attend(Context::Impl& s, int64_t il, Memory& mem, float* qp, int64_t q_head, int64_t q_tok);

}  // namespace kiln::model
