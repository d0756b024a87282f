// model/qwen35moe.cpp — `qwen35moe`: the qwen35 mixer layers (qwen35.cpp) with a routed-expert FFN plus a shared expert.
// Math as llama.cpp's build_moe_ffn (softmax gating, norm_w = true) + shared expert:
//   p = softmax(ffn_gate_inp·m); top n_expert_used experts (ties: lower id), weights renormalised to
//   sum 1 (expert_weights_norm), times expert_weights_scale (kernels::topk_route: ggml's arithmetic on
//   AVX-512 hosts); the weighted expert outputs summed in rank order;
//   out = Σ_e w_e · down_e(silu(gate_e·m) * up_e·m)
//       + sigmoid(ffn_gate_inp_shexp·m) · down_sh(silu(gate_sh·m) * up_sh·m)
// Only backend::Stream ops (model/blocks.h): the routing stays on the device (matmul_id reads the
// expert ids there); the CPU backend's matmul_id gathers per expert exactly as this file once did.
// Where the expert tensors live (the block's device, or the host with --cpu-moe / --n-cpu-moe / -ot)
// is routed_experts' concern (experts.cpp); the router, the weighted sum and the shared expert always
// run on the block's device.
#include "model/blocks.h"

namespace kiln::model {

using backend::Binary;

void moe_ffn(const Step& s, const LayerWeights& L) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, E = c.n_embd, X = c.n_expert, K = c.n_expert_used, Fs = c.n_ff_shexp;
  // Router logits: on AVX-512 hosts an F32 router is ggml's mat-mul order (tinyBLAS when n_expert % 4
  // == 0, for every column count; see kernels::matmul).
  const Tensor router = dense_view(s.a.router, X, T);
  s.st.matmul(L.ffn_gate_inp.t, s.a.cur, router);
  s.st.topk_route(router, int(K), c.expert_weights_norm, c.expert_weights_scale, s.a.ids, s.a.wts);
  // Slot (j, t): token t's expert of rank j, its output in ye[:, j, t].
  routed_experts(s, L);
  const Tensor ye = dense_view(s.a.ye, E, K, T);
  s.st.binary(Binary::Mul, ye, dense_view(s.a.wts, 1, K, T), ye);  // weight w[j, t] on slot (j, t)
  // The weighted slots summed in rank order, as llama.cpp's chain of adds over its mul_mat_id views.
  const Tensor out = dense_view(s.a.tmp, E, 1, T);
  auto rank = [&](int64_t j) { return ye.slice(1, j, 1); };
  if (K == 1) s.st.copy(out, rank(0));
  else s.st.binary(Binary::Add, rank(0), rank(1), out);
  for (int64_t j = 2; j < K; ++j) s.st.binary(Binary::Add, out, rank(j), out);
  // Shared expert with its scalar sigmoid gate (ggml: a one-row mul_mat, sigmoid, the product, then
  // added to the routed sum).
  const Tensor sa = dense_view(s.a.fa, Fs, T), sb = dense_view(s.a.fb, Fs, T), sy = dense_view(s.a.ye, E, T);
  const Tensor w[] = {L.ffn_gate_shexp.t, L.ffn_up_shexp.t}, y[] = {sa, sb};
  s.st.matmul_n(w, y, 2, s.a.cur);
  s.st.binary(Binary::SwiGlu, sa, sb, sa);
  s.st.matmul(L.ffn_down_shexp.t, sa, sy);
  // The gate logit is llama.cpp's mul_mat of a one-row F32 weight (ggml_vec_dot_f32's order on
  // AVX-512 hosts); the router region (consumed by the routing above) holds the T logits.
  const Tensor gl = dense_view(s.a.router, 1, T);
  s.st.matmul(L.ffn_gate_inp_shexp.t, s.a.cur, gl);
  s.st.binary(Binary::SigmoidMul, sy, gl, sy);  // one scalar per token column
  s.st.binary(Binary::Add, s.a.tmp, sy, s.a.tmp);
}

}  // namespace kiln::model
