// `qwen35moe`: the qwen35 mixer layers (qwen35.cpp) with a routed-expert FFN plus a shared expert.
// Math as llama.cpp's build_moe_ffn (softmax gating, norm_w = true) + shared expert:
//   p = softmax(ffn_gate_inp·m); top n_expert_used experts (ties: lower id), weights renormalised to
//   sum 1 (expert_weights_norm), times expert_weights_scale (kernels::topk_route: ggml's arithmetic on
//   AVX-512 hosts); the weighted expert outputs summed in rank order;
//   out = Σ_e w_e · down_e(silu(gate_e·m) * up_e·m)
//       + sigmoid(ffn_gate_inp_shexp·m) · down_sh(silu(gate_sh·m) * up_sh·m)
#include <cmath>
#include <cstring>

#include "model/forward.h"

namespace kiln::model {

void moe_ffn(Context::Impl& s, const LayerWeights& L) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, E = c.n_embd, X = c.n_expert, K = c.n_expert_used, F = c.n_ff_exp, Fs = c.n_ff_shexp;
  // Router logits: on AVX-512 hosts an F32 router is ggml's mat-mul order (tinyBLAS when n_expert % 4
  // == 0, for every column count; see kernels::matmul).
  s.matmul(L.ffn_gate_inp, s.cur.data(), T, s.router.data());
  kernels::topk_route(s.router.data(), X, T, int(K), c.expert_weights_norm, c.expert_weights_scale, s.ids.data(),
                      s.wts.data());
  // Expert e's outputs land in eout at slot t*K + j (j: the expert's rank for token t), weighted; the
  // slots are then summed in rank order, as llama.cpp's chain of adds over its mul_mat_id views.
  float* eout = s.eout.data();
  for (int64_t e = 0; e < X; ++e) {
    int64_t m = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j)
        if (s.ids[size_t(t * K + j)] == e) {
          s.etok[size_t(m)] = int32_t(t * K + j);
          s.ewt[size_t(m)] = s.wts[size_t(t * K + j)];
          std::memcpy(s.xe.data() + m * E, s.cur.data() + t * E, size_t(E) * sizeof(float));
          ++m;
        }
    if (m == 0) continue;
    s.matmul(L.ffn_gate_exps, s.xe.data(), m, s.fa.data(), e);
    s.matmul(L.ffn_up_exps, s.xe.data(), m, s.fb.data(), e);
    s.swiglu(F, m);
    s.matmul(L.ffn_down_exps, s.fa.data(), m, s.ye.data(), e);
    for (int64_t i = 0; i < m; ++i) {
      float* dst = eout + int64_t(s.etok[size_t(i)]) * E;
      const float* src = s.ye.data() + i * E;
      const float w = s.ewt[size_t(i)];
      for (int64_t d = 0; d < E; ++d) dst[d] = src[d] * w;
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    float* dst = s.tmp.data() + t * E;
    std::memcpy(dst, eout + t * K * E, size_t(E) * sizeof(float));
    for (int64_t j = 1; j < K; ++j) {
      const float* src = eout + (t * K + j) * E;
      for (int64_t d = 0; d < E; ++d) dst[d] += src[d];
    }
  }
  // Shared expert with its scalar sigmoid gate (ggml: a one-row mul_mat, sigmoid, the product, then
  // added to the routed sum).
  s.matmul(L.ffn_gate_shexp, s.cur.data(), T, s.fa.data());
  s.matmul(L.ffn_up_shexp, s.cur.data(), T, s.fb.data());
  s.swiglu(Fs, T);
  s.matmul(L.ffn_down_shexp, s.fa.data(), T, s.ye.data());
  // The gate logit is llama.cpp's mul_mat of a one-row F32 weight (ggml_vec_dot_f32's order on
  // AVX-512 hosts); s.router (n_expert x T, consumed by the routing above) holds the T logits.
  s.matmul(L.ffn_gate_inp_shexp, s.cur.data(), T, s.router.data());
  for (int64_t t = 0; t < T; ++t) {
    const float gsh = 1.0f / (1.0f + std::exp(-s.router[size_t(t)]));
    float* dst = s.tmp.data() + t * E;
    const float* src = s.ye.data() + t * E;
    for (int64_t d = 0; d < E; ++d) dst[d] += src[d] * gsh;
  }
}

}  // namespace kiln::model
