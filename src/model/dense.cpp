// model/dense.cpp — the dense decoder blocks: `llama` (SmolLM2, Llama 2/3), `qwen2` (QKV bias) and
// `qwen3` (q/k norms), and the attention core (attend) every attention layer shares.
// Math as llama.cpp builds it (llm_build_llama / qwen2 / qwen3):
//   h   = x + Wo · Attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv),   n = RMSNorm(x) * attn_norm
//   out = h + Wdown · (silu(Wgate·m) * Wup·m),                           m = RMSNorm(h) * ffn_norm
// qwen3: q and k heads are RMSNorm'd (attn_q_norm / attn_k_norm, over head_dim) before rope.
// RoPE: llama pairs (2i, 2i+1) (LLAMA_ROPE_TYPE_NORM); qwen2/qwen3 pair (i, i + n_rot/2) (NEOX).
// GQA: q-head i uses kv-head i / (Hq/Hkv). Scale 1/sqrt(head_dim) unless attention.scale is set.
// Only backend::Stream ops (model/blocks.h); exact elementwise ops (add, mul) take natural row shapes.
#include <cmath>

#include "model/blocks.h"

namespace kiln::model {

using backend::Binary;

void attend(const Step& s, int64_t il, Memory& mem, const Tensor& q) {
  const ModelConfig& c = s.c;
  const int64_t D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv, T = s.T;
  const auto& mo = mem.options();
  backend::AttnSpec p;
  p.head_dim = D;
  p.n_head = Hq;
  p.n_head_kv = Hkv;
  p.scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(float(D));
  p.flash = s.opt.flash_attn;  // false: llama.cpp's `-fa off` arithmetic (the CPU backend's ggml orders)
  const Tensor k = dense_view(s.a.k, D, Hkv, T), v = dense_view(s.a.v, D, Hkv, T), att = dense_view(s.a.att, D, Hq, T);
  // Quantized caches: llama.cpp's Walsh-Hadamard rotation (kernels::hadamard). K: q and k rotated
  // by the largest power-of-two chunk (>= 64) dividing head_dim; V: v and, after attention, the
  // output rotated (back) in chunks of 64. head_dim not a multiple of 64: no rotation.
  const auto quantized = [](gguf::GgmlType t) { return t == gguf::GgmlType::Q8_0 || t == gguf::GgmlType::Q4_0; };
  const bool rot_k = quantized(mo.type_k) && D % 64 == 0, rot_v = quantized(mo.type_v) && D % 64 == 0;
  if (rot_k) {
    int64_t nr = 64;
    while (D % (2 * nr) == 0) nr *= 2;
    s.st.hadamard(q, nr);
    s.st.hadamard(k, nr);
  }
  if (rot_v) s.st.hadamard(v, 64);
  s.st.kv_store(k, s.a.seq, s.a.pos, mem.k_cache(il));
  s.st.kv_store(v, s.a.seq, s.a.pos, mem.v_cache(il));
  s.st.attention(q, s.a.seq, s.a.pos, mem.k_cache(il), mem.v_cache(il), p, att);
  if (rot_v) s.st.hadamard(att, 64);
}

namespace {
void add_bias(const Step& s, const Tensor& y, const Weight& b) {
  if (b.present()) s.st.binary(Binary::Add, y, b.t, y);  // b: one row, added to every column
}
}  // namespace

void dense_attention(const Step& s, const LayerWeights& L, int64_t il, Memory& mem) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv;
  const Tensor q = dense_view(s.a.q, D * Hq, T), q3 = dense_view(s.a.q, D, Hq, T), k3 = dense_view(s.a.k, D, Hkv, T);
  const Tensor w[] = {L.attn_q.t, L.attn_k.t, L.attn_v.t}, y[] = {q, s.a.k, s.a.v};
  s.st.matmul_n(w, y, 3, s.a.cur);
  add_bias(s, q, L.attn_q_bias);
  add_bias(s, s.a.k, L.attn_k_bias);
  add_bias(s, s.a.v, L.attn_v_bias);
  if (L.attn_q_norm.present()) {
    s.st.rms_norm(q3, &L.attn_q_norm.t, q3, c.rms_eps);
    s.st.rms_norm(k3, &L.attn_k_norm.t, k3, c.rms_eps);
  }
  backend::RopeParams rp;
  rp.n_rot = c.n_rot;
  rp.neox = c.rope_neox;
  rp.freq_base = c.rope_freq_base;
  rp.freq_scale = c.rope_freq_scale;
  s.st.rope(q3, s.a.pos, rp);
  s.st.rope(k3, s.a.pos, rp);
  attend(s, il, mem, q3);
  s.st.matmul(L.attn_output.t, s.a.att, s.a.tmp);
  add_bias(s, s.a.tmp, L.attn_output_bias);
}

void dense_ffn(const Step& s, const LayerWeights& L) {
  const int64_t F = L.ffn_gate.ne[1];
  const Tensor fa = dense_view(s.a.fa, F, s.T), fb = dense_view(s.a.fb, F, s.T);
  const Tensor w[] = {L.ffn_gate.t, L.ffn_up.t}, y[] = {fa, fb};
  s.st.matmul_n(w, y, 2, s.a.cur);
  s.st.binary(Binary::SwiGlu, fa, fb, fa);  // per column of F (ggml's swiglu works per row)
  s.st.matmul(L.ffn_down.t, fa, s.a.tmp);
}

}  // namespace kiln::model
