// `qwen35` (and the mixer half of `qwen35moe`): the hybrid Gated-DeltaNet + gated attention model.
// Math as llama.cpp's qwen35 graph computes it (notes: shared/reference/qwen35-and-llama-server.md §2):
//  gated attention:  QG = attn_q·n, per head h rows [h*2D, h*2D+D) = q and [h*2D+D, (h+1)*2D) = gate;
//    q = RMSNorm_D(q)*attn_q_norm, k = RMSNorm_D(attn_k·n)*attn_k_norm, v = attn_v·n;
//    partial NeoX rope on the first n_rot dims (IMROPE with every section at the token position is
//    plain NeoX rope for text); o = softmax(q·kᵀ/sqrt(D))·v; out = attn_output·(o ⊙ sigmoid(gate)).
//  delta-net: mixed = attn_qkv·n (conv_dim = q|k|v), z = attn_gate·n, beta = sigmoid(ssm_beta·n),
//    g = ssm_a ⊙ softplus(ssm_alpha·n + ssm_dt.bias) (log-decay); y = silu(causal depthwise conv of
//    mixed with the d_conv-1 previous inputs as state); q, k = L2-normalised heads (eps = rms eps);
//    gated delta rule per v-head h with q/k head h mod Hk (converter tiles V heads);
//    o_h = RMSNorm_S(o_h)*ssm_norm*silu(z_h); out = ssm_out·o.
#include <cmath>

#include "model/forward.h"

namespace kiln::model {

void gated_attention(Context::Impl& s, const LayerWeights& L, int64_t il, Memory& mem) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv;
  float* qg = s.q.data();  // [2*D*Hq, T]
  s.matmul(L.attn_q, s.cur.data(), T, qg);
  s.matmul(L.attn_k, s.cur.data(), T, s.k.data());
  s.matmul(L.attn_v, s.cur.data(), T, s.v.data());
  const kernels::Rows qrows{qg, D, Hq, T, 2 * D, 2 * D * Hq};
  kernels::rms_norm(qrows, L.attn_q_norm.f32(), qrows, c.rms_eps, s.pool);
  s.rms_norm(s.k.data(), L.attn_k_norm, s.k.data(), D, Hkv * T);
  kernels::RopeParams rp;
  rp.n_rot = c.n_rot;
  rp.neox = true;
  rp.freq_base = c.rope_freq_base;
  rp.freq_scale = c.rope_freq_scale;
  kernels::rope(qrows, s.pos.data(), rp, s.pool);
  kernels::rope(kernels::rows3(s.k.data(), D, Hkv, T), s.pos.data(), rp, s.pool);
  attend(s, il, mem, qg, 2 * D, 2 * D * Hq);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      float* o = s.att.data() + t * D * Hq + h * D;
      kernels::sigmoid_mul(o, qg + t * 2 * D * Hq + h * 2 * D + D, o, D);
    }
  s.matmul(L.attn_output, s.att.data(), T, s.tmp.data());
}

void delta_net(Context::Impl& s, const LayerWeights& L, int64_t il, Memory& mem) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, S = c.ssm_d_state, Hk = c.ssm_n_group, Hv = c.ssm_dt_rank;
  const int64_t conv = c.ssm_conv_dim(), kd = c.ssm_key_dim(), vd = c.ssm_value_dim();
  const int chunk_min = s.opt.delta_chunk_min;
  float* mixed = s.mixed.data();
  s.matmul(L.ssm_qkv, s.cur.data(), T, mixed);
  s.matmul(L.ssm_gate, s.cur.data(), T, s.z.data());
  s.matmul(L.ssm_beta, s.cur.data(), T, s.beta.data());
  s.matmul(L.ssm_alpha, s.cur.data(), T, s.g.data());
  kernels::sigmoid(s.beta.data(), s.beta.data(), Hv * T);
  for (int64_t t = 0; t < T; ++t) kernels::add(s.g.data() + t * Hv, L.ssm_dt.f32(), s.g.data() + t * Hv, Hv);
  kernels::softplus(s.g.data(), s.g.data(), Hv * T);
  for (int64_t t = 0; t < T; ++t) kernels::mul(s.g.data() + t * Hv, L.ssm_a.f32(), s.g.data() + t * Hv, Hv);

  for (const Run& r : s.runs)
    kernels::conv1d_silu(mixed + r.t0 * conv, conv, L.ssm_conv1d.f32(), mem.conv_state(il, r.seq),
                         mixed + r.t0 * conv, conv, conv, r.n, int(c.ssm_d_conv), s.pool);
  const kernels::Rows qr{mixed, S, Hk, T, S, conv}, kr{mixed + kd, S, Hk, T, S, conv};
  kernels::l2_norm(qr, qr, c.rms_eps, s.pool);
  kernels::l2_norm(kr, kr, c.rms_eps, s.pool);

  for (const Run& r : s.runs) {
    kernels::DeltaArgs a;
    a.q = mixed + r.t0 * conv;
    a.k = a.q + kd;
    a.qk_stride = conv;
    a.v = a.q + 2 * kd;
    a.v_stride = conv;
    a.g = s.g.data() + r.t0 * Hv;
    a.beta = s.beta.data() + r.t0 * Hv;
    a.state = mem.ssm_state(il, r.seq);
    a.out = s.dout.data() + r.t0 * vd;
    a.out_stride = vd;
    a.S = S;
    a.Hk = Hk;
    a.Hv = Hv;
    a.n_t = r.n;
    if (chunk_min > 0 && r.n >= chunk_min) kernels::gated_delta_rule_chunked(a, s.delta_chunk, s.dws.p, s.pool);
    else kernels::gated_delta_rule(a, s.pool);
  }
  // Gated RMSNorm per head, then the output projection.
  s.rms_norm(s.dout.data(), L.ssm_norm, s.dout.data(), S, Hv * T);
  // silu per head row of S (ggml's row: its vector silu leaves a row's S % 16 tail to libm).
  for (int64_t r = 0; r < Hv * T; ++r) kernels::silu(s.z.data() + r * S, s.z.data() + r * S, S);
  kernels::mul(s.dout.data(), s.z.data(), s.dout.data(), vd * T);
  s.matmul(L.ssm_out, s.dout.data(), T, s.tmp.data());
}

}  // namespace kiln::model
