// Dense decoder layers: `llama` (SmolLM2, Llama 2/3), `qwen2` (QKV bias) and `qwen3` (q/k norms).
// Math as llama.cpp builds it (llm_build_llama / qwen2 / qwen3):
//   h   = x + Wo · Attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv),   n = RMSNorm(x) * attn_norm
//   out = h + Wdown · (silu(Wgate·m) * Wup·m),                           m = RMSNorm(h) * ffn_norm
// qwen3: q and k heads are RMSNorm'd (attn_q_norm / attn_k_norm, over head_dim) before rope.
// RoPE: llama pairs (2i, 2i+1) (LLAMA_ROPE_TYPE_NORM); qwen2/qwen3 pair (i, i + n_rot/2) (NEOX).
// GQA: q-head i uses kv-head i / (Hq/Hkv). Scale 1/sqrt(head_dim) unless attention.scale is set.
#include <cmath>

#include "model/forward.h"

namespace kiln::model {

void attend(Context::Impl& s, int64_t il, Memory& mem, float* qp, int64_t q_head, int64_t q_tok) {
  const ModelConfig& c = s.c;
  const int64_t D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv, kvw = D * Hkv;
  const auto& mo = mem.options();
  kernels::AttnParams ap;
  ap.head_dim = D;
  ap.n_head = Hq;
  ap.n_head_kv = Hkv;
  ap.scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(float(D));
  // Quantized caches: llama.cpp's Walsh-Hadamard rotation (kernels::hadamard). K: q and k rotated
  // by the largest power-of-two chunk (>= 64) dividing head_dim; V: v and, after attention, the
  // output rotated (back) in chunks of 64. head_dim not a multiple of 64: no rotation.
  const auto quantized = [](gguf::GgmlType t) { return t == gguf::GgmlType::Q8_0 || t == gguf::GgmlType::Q4_0; };
  const int64_t n_tok = s.T;
  const bool rot_k = quantized(mo.type_k) && D % 64 == 0, rot_v = quantized(mo.type_v) && D % 64 == 0;
  if (rot_k) {
    int64_t nr = 64;
    while (D % (2 * nr) == 0) nr *= 2;
    kernels::hadamard(kernels::Rows{qp, D, Hq, n_tok, q_head, q_tok}, nr, s.pool);
    kernels::hadamard(kernels::rows3(s.k.data(), D, Hkv, n_tok), nr, s.pool);
  }
  if (rot_v) kernels::hadamard(kernels::rows3(s.v.data(), D, Hkv, n_tok), 64, s.pool);
  for (const Run& r : s.runs) {
    // -fa off: ggml's rule, tinyBLAS sums for a batch of >= 2 tokens, vec_dot sums for one.
    if (!s.opt.flash_attn) ap.order = r.n >= 2 ? kernels::AttnOrder::GgmlTiny : kernels::AttnOrder::GgmlVec;
    const int32_t* pos = s.pos.data() + r.t0;
    uint8_t* kd = mem.k_data(il, r.seq);
    uint8_t* vd = mem.v_data(il, r.seq);
    kernels::kv_store(mo.type_k, kernels::CRows(s.k.data() + r.t0 * kvw, D, Hkv, r.n, D, kvw), pos, kd,
                      mem.k_pos_stride(), mem.k_head_stride());
    kernels::kv_store(mo.type_v, kernels::CRows(s.v.data() + r.t0 * kvw, D, Hkv, r.n, D, kvw), pos, vd,
                      mem.v_pos_stride(), mem.v_head_stride());
    kernels::KvView kv{mo.type_k, kd, mem.k_pos_stride(), mem.k_head_stride(), r.pos0 + r.n};
    kernels::KvView vv{mo.type_v, vd, mem.v_pos_stride(), mem.v_head_stride(), r.pos0 + r.n};
    kernels::attention(kernels::CRows(qp + r.t0 * q_tok, D, Hq, r.n, q_head, q_tok), pos, kv, vv, ap,
                       kernels::Rows{s.att.data() + r.t0 * D * Hq, D, Hq, r.n, D, D * Hq}, s.pool);
  }
  if (rot_v) kernels::hadamard(kernels::rows3(s.att.data(), D, Hq, n_tok), 64, s.pool);
}

void dense_attention(Context::Impl& s, const LayerWeights& L, int64_t il, Memory& mem) {
  const ModelConfig& c = s.c;
  const int64_t T = s.T, D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv;
  s.matmul(L.attn_q, s.cur.data(), T, s.q.data());
  s.matmul(L.attn_k, s.cur.data(), T, s.k.data());
  s.matmul(L.attn_v, s.cur.data(), T, s.v.data());
  s.add_bias(s.q.data(), L.attn_q_bias, D * Hq, T);
  s.add_bias(s.k.data(), L.attn_k_bias, D * Hkv, T);
  s.add_bias(s.v.data(), L.attn_v_bias, D * Hkv, T);
  if (L.attn_q_norm.present()) {
    s.rms_norm(s.q.data(), L.attn_q_norm, s.q.data(), D, Hq * T);
    s.rms_norm(s.k.data(), L.attn_k_norm, s.k.data(), D, Hkv * T);
  }
  kernels::RopeParams rp;
  rp.n_rot = c.n_rot;
  rp.neox = c.rope_neox;
  rp.freq_base = c.rope_freq_base;
  rp.freq_scale = c.rope_freq_scale;
  kernels::rope(kernels::rows3(s.q.data(), D, Hq, T), s.pos.data(), rp, s.pool);
  kernels::rope(kernels::rows3(s.k.data(), D, Hkv, T), s.pos.data(), rp, s.pool);
  attend(s, il, mem, s.q.data(), D, D * Hq);
  s.matmul(L.attn_output, s.att.data(), T, s.tmp.data());
  s.add_bias(s.tmp.data(), L.attn_output_bias, c.n_embd, T);
}

void dense_ffn(Context::Impl& s, const LayerWeights& L) {
  const int64_t T = s.T, F = L.ffn_gate.ne[1];
  s.matmul(L.ffn_gate, s.cur.data(), T, s.fa.data());
  s.matmul(L.ffn_up, s.cur.data(), T, s.fb.data());
  s.swiglu(F, T);
  s.matmul(L.ffn_down, s.fa.data(), T, s.tmp.data());
}

}  // namespace kiln::model
