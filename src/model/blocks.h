// model/blocks.h — internal to src/model: the per-batch state every architecture file uses (Step:
//   a device's Stream and the activation Tensors of this batch) and the block declarations
//   (dense.cpp: dense attention + FFN; qwen35.cpp: delta-net and gated attention; qwen35moe.cpp: the
//   MoE FFN). Not included outside src/model.
// Blocks only enqueue backend::Stream ops on Tensors (no host pointers, no host reads of results),
//   so the same code runs on any device; the op list of a block depends only on the batch size T.
// Activations are [width, T] F32 (token t's column at t * width), views of an Arena planned once in
//   Context's constructor for n_batch tokens.
#pragma once
#include <array>
#include <cstdint>

#include "backend/backend.h"
#include "model/context.h"

namespace kiln::model {

using backend::Tensor;

// Activation views of one device for a batch of T tokens (shapes for this T; widths as planned).
struct Act {
  Tensor x;          // residual stream [E, T]
  Tensor cur;        // normed input of a block [E, T]
  Tensor tmp;        // block output [E, T]
  Tensor q;          // [q rows (qwen35: 2*D*Hq, per head q then gate), T]
  Tensor k, v;       // [D*Hkv, T]
  Tensor att;        // [D*Hq, T]
  Tensor fa, fb;     // FFN hidden: region of max(n_ff, n_ff_shexp, n_ff_exp*K) * T floats (views per use)
  Tensor mixed;      // delta-net: [conv_dim, T]
  Tensor z;          // [value_dim, T]
  Tensor beta, g;    // [Hv, T]
  Tensor dout;       // [value_dim, T]
  Tensor router;     // MoE: [n_expert, T] (then the shared-expert gate logits [1, T])
  Tensor ids;        // I32 [K, T]
  Tensor wts;        // [K, T]
  Tensor ye;         // expert outputs: region of E*K*T floats
  Tensor pos, seq;   // I32 [T]: per-token position and sequence slot (uploaded once per decode)
  Tensor rseq, keep; // hybrid, I32 [T]: the recurrent state slot of each token and where its state is kept
                     // (-1: not kept) for speculative verification (Memory::rec_slot / rec_keep_slot)
  Tensor mpos;       // I32 [T, 4]: M-RoPE streams (t, h, w, 0) when the batch has them (Batch::mpos), else empty
};

// What a block runs with: the stream of the device its layer is on, that device's views.
struct Step {
  backend::Stream& st;
  const Act& a;
  const ModelConfig& c;
  const ContextOptions& opt;
  int64_t T = 0;
  // MoE: the device that holds this block's expert tensors when it is not st's (a GPU block whose
  // experts stay in host memory: --cpu-moe, --n-cpu-moe, -ot; Model::expert_device), with that
  // device's views for the same T; nullptr when the experts are on st's device. See routed_experts.
  const Step* experts = nullptr;
};

// A view of `base`'s memory (F32) as rows [ne0, n1, n2] with strides s1, s2 in floats, starting
// off floats in.
inline Tensor rows_view(const Tensor& base, int64_t ne0, int64_t n1, int64_t n2, int64_t s1, int64_t s2,
                        int64_t off = 0) {
  Tensor t = base;
  t.offset += size_t(off) * 4;
  t.type = gguf::GgmlType::F32;
  t.ne = {ne0, n1, n2, 1};
  t.nb = {4, size_t(s1) * 4, size_t(s2) * 4, size_t(s2 * n2) * 4};
  return t;
}
// The first ne0*n1*n2 floats of `base` as a contiguous [ne0, n1, n2].
inline Tensor dense_view(const Tensor& base, int64_t ne0, int64_t n1 = 1, int64_t n2 = 1) {
  return rows_view(base, ne0, n1, n2, ne0, ne0 * n1);
}

// Architecture blocks. Each reads s.a.cur ([E, T], the normed block input) and writes s.a.tmp ([E, T]).
void dense_attention(const Step& s, const LayerWeights& L, int64_t il, Memory& mem);  // dense.cpp
void dense_ffn(const Step& s, const LayerWeights& L);                                  // dense.cpp
void gated_attention(const Step& s, const LayerWeights& L, int64_t il, Memory& mem);  // qwen35.cpp
void delta_net(const Step& s, const LayerWeights& L, int64_t il, Memory& mem);        // qwen35.cpp
void moe_ffn(const Step& s, const LayerWeights& L);                                    // qwen35moe.cpp
// The routed experts of a MoE block (experts.cpp): for token t's expert of rank j, e = ids[j, t],
//   ye[:, j, t] = down_e(silu(gate_e · cur_t) * up_e · cur_t)
// reading s.a.cur [E, T] and s.a.ids I32 [K, T] (the router's choice), writing s.a.ye [E, K, T]
// (s.a.fa, s.a.fb: the hidden slots). With s.experts (the weights on another device, one of the two
// the host): cur and ids go there, the experts run on its stream into its views, and ye comes back
// (a download is waited for; an upload is ordered before the ops that follow on s.st).
void routed_experts(const Step& s, const LayerWeights& L);
// The MTP block (mtp.cpp): u = eh_proj · [enorm(emb); hnorm(hprev)] ([E, T] each; cat [2E, T] scratch),
// then gated attention (layer il's KV) and the FFN on u, in place.
void mtp_block(const Step& s, const LayerWeights& L, int64_t il, Memory& mem, const Tensor& emb, const Tensor& hprev,
               const Tensor& cat, const Tensor& u);

// Shared attention core: q rows [D, Hq, T] (any strides), k/v [D*Hkv, T] already normed and roped;
// stores k/v into the layer's caches and writes s.a.att [D*Hq, T].
void attend(const Step& s, int64_t il, Memory& mem, const Tensor& q);

}  // namespace kiln::model
