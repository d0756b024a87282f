// model/qwen35.cpp — `qwen35` (and the mixer half of `qwen35moe`): the hybrid Gated-DeltaNet + gated attention model.
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
// Only backend::Stream ops (model/blocks.h). Rows as the CPU kernels were always called: sigmoid_mul
//    per head of D, silu per head row of S (ggml's row: its vector silu leaves a row's S % 16 tail to
//    libm; rms_norm_gated keeps those rows); sigmoid / softplus / add / mul are independent of the row
//    split. The projections sharing the normed input go through one matmul_n; the delta-net's
//    gates + conv + L2 norms (delta_prep) and recurrence + gated norm (gated_delta_norm) are fused
//    ops (the CPU makes the same unfused calls; a GPU runs one kernel each for small batches). The
//    recurrent ops index state by the tokens' recurrent slots (a.rseq, Memory::rec_slot) and keep the
//    per-token states a speculative verify run asks for (a.keep).
#include "model/blocks.h"

namespace kiln::model {

using backend::Binary;

void gated_attention(const Step& s, const LayerWeights& L, int64_t il, Memory& mem) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv;
  const Tensor qg = dense_view(s.a.q, 2 * D * Hq, T);  // per head: q [D] then gate [D]
  const Tensor w[] = {L.attn_q.t, L.attn_k.t, L.attn_v.t}, y[] = {qg, s.a.k, s.a.v};
  s.st.matmul_n(w, y, 3, s.a.cur);
  const Tensor q = rows_view(qg, D, Hq, T, 2 * D, 2 * D * Hq), gate = rows_view(qg, D, Hq, T, 2 * D, 2 * D * Hq, D);
  const Tensor k = dense_view(s.a.k, D, Hkv, T);
  s.st.rms_norm(q, &L.attn_q_norm.t, q, c.rms_eps);
  s.st.rms_norm(k, &L.attn_k_norm.t, k, c.rms_eps);
  backend::RopeParams rp;
  rp.n_rot = c.n_rot;
  rp.neox = true;
  rp.freq_base = c.rope_freq_base;
  rp.freq_scale = c.rope_freq_scale;
  if (s.a.mpos.buf) {
    // M-RoPE (IMROPE) for batches with image positions; with every stream equal it is rope().
    rp.multi = kernels::RopeParams::Multi::Imrope;
    for (int i = 0; i < 4; ++i) rp.sections[i] = c.rope_sections[size_t(i)];
    s.st.rope_multi(q, s.a.mpos, rp);
    s.st.rope_multi(k, s.a.mpos, rp);
  } else {
    s.st.rope(q, s.a.pos, rp);
    s.st.rope(k, s.a.pos, rp);
  }
  attend(s, il, mem, q);
  const Tensor att = dense_view(s.a.att, D, Hq, T);
  s.st.binary(Binary::SigmoidMul, att, gate, att);
  s.st.matmul(L.attn_output.t, s.a.att, s.a.tmp);
}

void delta_net(const Step& s, const LayerWeights& L, int64_t il, Memory& mem) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, S = c.ssm_d_state, Hk = c.ssm_n_group, Hv = c.ssm_dt_rank;
  const int64_t conv = c.ssm_conv_dim(), kd = c.ssm_key_dim();
  const Tensor& mixed = s.a.mixed;  // [conv, T]: per token q | k | v
  const Tensor w[] = {L.ssm_qkv.t, L.ssm_gate.t, L.ssm_beta.t, L.ssm_alpha.t}, y[] = {mixed, s.a.z, s.a.beta, s.a.g};
  s.st.matmul_n(w, y, 4, s.a.cur);
  // beta = sigmoid(beta); g = softplus(g + dt) * a; causal conv + SiLU; L2 norm of the q and k heads.
  // Without speculation (n_spec 0) a sequence's recurrent slot is the sequence itself and nothing is
  // kept: the ops get the plain seq tensor and no keep tensor (the decode path of a plain run).
  const bool spec = mem.n_spec() > 0;
  const Tensor& rseq = spec ? s.a.rseq : s.a.seq;
  const Tensor keep = spec ? s.a.keep : Tensor{};
  s.st.delta_prep(mixed, S, Hk, L.ssm_conv1d.t, rseq, mem.conv_state(il), s.a.beta, s.a.g, L.ssm_dt.t, L.ssm_a.t,
                  c.rms_eps, keep);
  const Tensor q = rows_view(mixed, S, Hk, T, S, conv), k = rows_view(mixed, S, Hk, T, S, conv, kd),
               v = rows_view(mixed, S, Hv, T, S, conv, 2 * kd);
  const Tensor out = dense_view(s.a.dout, S, Hv, T), z = dense_view(s.a.z, S, Hv, T);
  // The recurrence, then the gated RMSNorm per head (rms_norm, silu(z), mul; z is scratch after).
  s.st.gated_delta_norm(q, k, v, s.a.g, s.a.beta, rseq, mem.ssm_state(il), out, s.opt.delta_chunk_min,
                        L.ssm_norm.t, z, c.rms_eps, keep);
  s.st.matmul(L.ssm_out.t, s.a.dout, s.a.tmp);
}

}  // namespace kiln::model
