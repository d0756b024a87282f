// model/scratch.cpp — the scratch layout and workspace sizes of one device (see scratch.h).
#include "model/scratch.h"

#include <algorithm>

namespace kiln::model {

void plan_scratch(const ModelConfig& c, int64_t n_batch, int64_t n_out_max, const ScratchRole& role,
                  backend::Arena& A, ScratchPlan& p) {
  const int64_t E = c.n_embd, D = c.head_dim, B = n_batch, K = std::max<int64_t>(1, c.n_expert_used);
  const bool hybrid = arch_is_hybrid(c.arch);
  auto f32 = [&](int64_t w) { return A.reserve_tensor(gguf::GgmlType::F32, {std::max<int64_t>(w, 1), B, 1, 1}); };
  auto i32 = [&](int64_t n) { return A.reserve_tensor(gguf::GgmlType::I32, {std::max<int64_t>(n, 1), 1, 1, 1}); };
  p.x = f32(E);                                          // [E, B]
  if (role.host) p.tok = i32(B);                         // [B]
  if (role.layers || role.mtp) {
    p.cur = f32(E);                                      // [E, B]
    p.tmp = f32(E);                                      // [E, B]
    p.q = f32((hybrid ? 2 : 1) * D * c.n_head);          // [(2)*D*Hq, B]
    p.k = f32(D * c.n_head_kv);                          // [D*Hkv, B]
    p.v = f32(D * c.n_head_kv);                          // [D*Hkv, B]
    p.att = f32(D * c.n_head);                           // [D*Hq, B]
    const int64_t ff = std::max({c.n_ff, c.n_ff_shexp, c.n_ff_exp * K});
    p.fa = f32(ff);                                      // [max(n_ff, n_ff_shexp, n_ff_exp*K), B]
    p.fb = f32(ff);
    if (hybrid) {
      p.mixed = f32(c.ssm_conv_dim());                   // [conv_dim, B]
      p.z = f32(c.ssm_value_dim());                      // [value_dim, B]
      p.beta = f32(c.ssm_dt_rank);                       // [Hv, B]
      p.g = f32(c.ssm_dt_rank);                          // [Hv, B]
      p.dout = f32(c.ssm_value_dim());                   // [value_dim, B]
      p.rseq = i32(B);                                   // [B]
      p.keep = i32(B);                                   // [B]
    }
    if (c.n_expert > 0) {
      p.router = f32(c.n_expert);                        // [n_expert, B]
      p.ids = A.reserve_tensor(gguf::GgmlType::I32, {K, B, 1, 1});  // [K, B]
      p.wts = f32(K);                                    // [K, B]
      p.ye = f32(E * K);                                 // [E, K, B]
    }
    p.pos = i32(B);                                      // [B]
    p.seq = i32(B);                                      // [B]
    if (c.rope_sections[0] + c.rope_sections[1] + c.rope_sections[2] + c.rope_sections[3] > 0)
      p.mpos = i32(4 * B);                               // [B, 4] M-RoPE streams (images)
  }
  if (role.experts && p.cur == ScratchPlan::kNone) {  // routed_experts on another device's blocks
    const int64_t ff = std::max({c.n_ff, c.n_ff_shexp, c.n_ff_exp * K});
    p.cur = f32(E);                                      // [E, B]
    p.fa = f32(ff);                                      // as above (the expert slots use n_ff_exp * K)
    p.fb = f32(ff);
    p.ids = A.reserve_tensor(gguf::GgmlType::I32, {K, B, 1, 1});  // [K, B]
    p.ye = f32(E * K);                                   // [E, K, B]
  }
  if (role.output) {
    p.out_idx = i32(n_out_max);                          // [n_out_max]
    p.hidden = A.reserve_tensor(gguf::GgmlType::F32, {E, n_out_max, 1, 1});  // [E, n_out_max]
    if (!role.host)                                      // [V, n_out_max] (host: Context's `logits`)
      p.logits = A.reserve_tensor(gguf::GgmlType::F32, {c.n_vocab, n_out_max, 1, 1});
    if (role.n_top > 0) {
      p.top_ids = A.reserve_tensor(gguf::GgmlType::I32, {role.n_top, n_out_max, 1, 1});   // [n_top, n_out_max]
      p.top_vals = A.reserve_tensor(gguf::GgmlType::F32, {role.n_top, n_out_max, 1, 1});  // [n_top, n_out_max]
    }
  }
  if (role.mtp) {
    p.emb = f32(E);                                      // [E, B]
    p.hall = f32(E);                                     // [E, B]
    p.hprev = A.reserve_tensor(gguf::GgmlType::F32, {E, B + 1, 1, 1});  // [E, B + 1]
    p.cat = f32(2 * E);                                  // [2E, B]
    p.hidx = i32(5 * B);  // [5, B]: hsrc | hshift | hdst | hzero | hring, each [T] back to back (one upload)
    if (role.mtp_block && !role.output)                  // [E, n_out_max] the drafts' h'
      p.hidden = A.reserve_tensor(gguf::GgmlType::F32, {E, n_out_max, 1, 1});
    p.dids = i32(n_out_max);
    p.dprob = A.reserve_tensor(gguf::GgmlType::F32, {std::max<int64_t>(n_out_max, 1), 1, 1, 1});
  }
}

std::vector<MatShape> layer_mats(const TensorLookup& find, int64_t il) {
  const std::string p = "blk." + std::to_string(il) + ".";
  std::vector<MatShape> out;
  for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_qkv.weight",
                        "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight", "ssm_out.weight", "ffn_gate.weight",
                        "ffn_up.weight", "ffn_down.weight", "ffn_gate_inp.weight", "ffn_gate_shexp.weight",
                        "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
    if (const gguf::TensorInfo* t = find(p + n)) out.push_back({t->type, t->ne[0], t->ne[1], false});
  if (const gguf::TensorInfo* t = find(p + "ffn_gate_inp_shexp.weight"))  // a vector, bound as F32
    out.push_back({gguf::GgmlType::F32, t->ne[0], 1, false});
  for (const char* n : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
    if (const gguf::TensorInfo* t = find(p + n)) out.push_back({t->type, t->ne[0], t->ne[1], true});
  return out;
}

std::optional<MatShape> output_mat(const TensorLookup& find) {
  const gguf::TensorInfo* t = find("output.weight");
  if (!t) t = find("token_embd.weight");
  if (!t) return std::nullopt;
  return MatShape{t->type, t->ne[0], t->ne[1], false};
}

size_t step_workspace(const backend::WorkspaceSizes& ws, const ModelConfig& c, std::span<const MatShape> mats,
                      int64_t n_rec, const MatShape* output, int64_t n_batch, int64_t n_out_max, int delta_chunk_min,
                      int n_top) {
  const int64_t B = n_batch, K = std::max<int64_t>(1, c.n_expert_used);
  size_t w = 64;
  for (const MatShape& m : mats)
    w = std::max(w, m.expert ? ws.matmul_id_workspace(m.type, m.k, m.n, K * B) : ws.matmul_workspace(m.type, m.k, m.n, B));
  if (n_rec > 0) w = std::max(w, ws.gated_delta_workspace(c.ssm_d_state, c.ssm_dt_rank, delta_chunk_min, B));
  if (output) w = std::max(w, ws.matmul_workspace(output->type, output->k, output->n, n_out_max));
  if (output && n_top > 0) w = std::max(w, ws.top_logits_workspace(output->n, n_out_max, n_top));
  return w;
}

size_t attention_step_workspace(const backend::WorkspaceSizes& ws, const ModelConfig& c, int64_t n_batch,
                                int64_t n_ctx, bool flash_attn) {
  if (c.n_attn_layers() == 0) return 0;
  const backend::AttnSpec spec{c.head_dim, c.n_head, c.n_head_kv, 1.f, flash_attn};
  return ws.attention_workspace(spec, n_batch, n_ctx);
}

}  // namespace kiln::model
