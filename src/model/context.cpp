// Context: scratch planning, batch validation, and the trunk loop shared by every architecture.
#include <algorithm>
#include <cstring>

#include "model/forward.h"

namespace kiln::model {

Context::Impl::Impl(const Model& model, ThreadPool& p, const ContextOptions& o)
    : m(model), c(model.config()), pool(p), opt(o) {
  const int64_t E = c.n_embd, D = c.head_dim, B = opt.n_batch;
  n_out_max = opt.n_outputs_max > 0 ? std::min(opt.n_outputs_max, B) : B;
  const bool hybrid = arch_is_hybrid(c.arch);
  tok.reserve(size_t(B));
  pos.reserve(size_t(B));
  runs.reserve(size_t(B));
  auto sz = [&](int64_t w) { return size_t(std::max<int64_t>(w, 1) * B); };
  x.resize(sz(E));
  cur.resize(sz(E));
  tmp.resize(sz(E));
  q.resize(sz((hybrid ? 2 : 1) * D * c.n_head));
  k.resize(sz(D * c.n_head_kv));
  v.resize(sz(D * c.n_head_kv));
  att.resize(sz(D * c.n_head));
  const int64_t ff = std::max({c.n_ff, c.n_ff_exp, c.n_ff_shexp});
  fa.resize(sz(ff));
  fb.resize(sz(ff));
  if (hybrid) {
    mixed.resize(sz(c.ssm_conv_dim()));
    z.resize(sz(c.ssm_value_dim()));
    beta.resize(sz(c.ssm_dt_rank));
    g.resize(sz(c.ssm_dt_rank));
    dout.resize(sz(c.ssm_value_dim()));
  }
  if (c.n_expert > 0) {
    router.resize(sz(c.n_expert));
    ids.resize(sz(c.n_expert_used));
    wts.resize(sz(c.n_expert_used));
    xe.resize(sz(E));
    ye.resize(sz(E));
    eout.resize(sz(E * c.n_expert_used));
    etok.resize(size_t(B));
    ewt.resize(size_t(B));
  }
  out_idx.reserve(size_t(B));
  hidden.resize(sz(E));
  logits.resize(size_t(c.n_vocab) * size_t(n_out_max));

  // Matmul workspace: the largest any weight needs at m = n_batch.
  size_t w = 0;
  auto need = [&](const Weight& wt) {
    if (wt.present() && wt.ne[1] > 1) w = std::max(w, kernels::matmul_workspace(wt.type, wt.ne[0], B, pool.size()));
  };
  need(m.output);
  for (const auto& L : m.layers)
    for (const Weight* wt : {&L.attn_q, &L.attn_k, &L.attn_v, &L.attn_output, &L.ssm_qkv, &L.ssm_gate, &L.ssm_beta,
                             &L.ssm_alpha, &L.ssm_out, &L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.ffn_gate_inp,
                             &L.ffn_gate_exps, &L.ffn_up_exps, &L.ffn_down_exps, &L.ffn_gate_shexp, &L.ffn_up_shexp,
                             &L.ffn_down_shexp})
      need(*wt);
  ws.reserve(std::max<size_t>(w, 64));
  if (hybrid) dws.reserve(std::max<size_t>(kernels::gated_delta_chunked_workspace(c.ssm_d_state, delta_chunk, pool.size()), 64));
}

void Context::Impl::matmul(const Weight& w, const float* xin, int64_t mcols, float* y, int64_t e, int64_t x_stride,
                           int64_t y_stride) {
  kernels::MatmulArgs a;
  a.wt = w.type;
  a.w = w.data + size_t(e) * size_t(w.ne[1]) * w.row_bytes;
  a.w_stride = w.row_bytes;
  a.k = w.ne[0];
  a.n = w.ne[1];
  a.m = mcols;
  a.x = xin;
  a.x_stride = x_stride ? x_stride : a.k;
  a.y = y;
  a.y_stride = y_stride ? y_stride : a.n;
  a.expert = w.ne[2] > 1;  // an expert of a stacked MoE tensor: llama.cpp's mul_mat_id orders
  kernels::matmul(a, ws.p, pool);
}

void Context::Impl::rms_norm(const float* in, const Weight& w, float* out, int64_t ne0, int64_t rows) {
  kernels::rms_norm(kernels::crows3(in, ne0, rows), w.f32(), kernels::rows3(out, ne0, rows), c.rms_eps, pool);
}

void Context::Impl::swiglu(int64_t n, int64_t cols) {
  for (int64_t t = 0; t < cols; ++t) kernels::swiglu(fa.data() + t * n, fb.data() + t * n, fa.data() + t * n, n);
}

void Context::Impl::add_bias(float* y, const Weight& b, int64_t n, int64_t mcols) {
  if (!b.present()) return;
  for (int64_t t = 0; t < mcols; ++t) kernels::add(y + t * n, b.f32(), y + t * n, n);
}

Context::Context(const Model& model, const ContextOptions& opt) : model_(model), opt_(opt) {
  KILN_CHECK(opt_.n_batch > 0, "n_batch must be positive");
  pool_ = std::make_unique<ThreadPool>(opt_.n_threads);
  impl_ = std::make_unique<Impl>(model_, *pool_, opt_);
}

Context::~Context() = default;

const float* Context::logits(int64_t i) const {
  KILN_CHECK(i >= 0 && i < n_out_, "logits({}) with {} outputs", i, n_out_);
  return impl_->logits.data() + size_t(i) * size_t(model_.config().n_vocab);
}

Status Context::decode(const Batch& b, Memory& mem) {
  Impl& s = *impl_;
  const ModelConfig& c = model_.config();
  const int64_t T = b.size();
  n_out_ = 0;
  if (T == 0) return {};
  if (T > opt_.n_batch) return err("batch of {} tokens exceeds n_batch {}", T, opt_.n_batch);
  if (int64_t(b.pos.size()) != T || int64_t(b.seq.size()) != T || int64_t(b.output.size()) != T)
    return err("batch arrays have different lengths");
  // Split into runs and validate.
  s.runs.clear();
  s.tok.assign(b.token.begin(), b.token.end());
  s.pos.assign(b.pos.begin(), b.pos.end());
  for (int64_t t = 0; t < T; ++t) {
    if (b.token[size_t(t)] < 0 || b.token[size_t(t)] >= c.n_vocab)
      return err("batch token {}: id {} outside the vocabulary [0, {})", t, b.token[size_t(t)], c.n_vocab);
    const int32_t sq = b.seq[size_t(t)];
    if (sq < 0 || sq >= mem.n_seq()) return err("batch token {}: sequence {} outside [0, {})", t, sq, mem.n_seq());
    if (!s.runs.empty() && s.runs.back().seq == sq) {
      Run& r = s.runs.back();
      if (b.pos[size_t(t)] != r.pos0 + r.n)
        return err("batch token {}: sequence {} position {} does not follow {}", t, sq, b.pos[size_t(t)], r.pos0 + r.n - 1);
      ++r.n;
      continue;
    }
    for (const Run& r : s.runs)
      if (r.seq == sq) return err("batch token {}: sequence {} appears in two separate runs", t, sq);
    s.runs.push_back({sq, t, 1, b.pos[size_t(t)]});
  }
  for (const Run& r : s.runs) {
    const int64_t have = mem.seq_pos(r.seq);
    if (r.pos0 < 0 || r.pos0 > have || (r.pos0 != have && mem.has_recurrent()))
      return err("sequence {}: run starts at position {} but the memory holds {} positions{}", r.seq, r.pos0, have,
                 mem.has_recurrent() ? " (recurrent state: runs must continue exactly)" : "");
    if (r.pos0 + r.n > mem.n_ctx())
      return err("sequence {}: positions up to {} exceed the context size {}", r.seq, r.pos0 + r.n - 1, mem.n_ctx());
  }
  int64_t n_req = 0;
  for (int64_t t = 0; t < T; ++t) n_req += b.output[size_t(t)] != 0;
  if (n_req > s.n_out_max) return err("batch asks for {} output rows, the context holds {} (n_outputs_max)", n_req, s.n_out_max);
  s.T = T;
  const int64_t E = c.n_embd;

  // Embeddings.
  const Weight& te = model_.token_embd;
  kernels::get_rows(te.type, te.data, te.row_bytes, te.ne[1], E, s.tok.data(), T, s.x.data(), E, s.pool);

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = model_.layers[size_t(il)];
    s.rms_norm(s.x.data(), L.attn_norm, s.cur.data(), E, T);
    if (c.is_recurrent(il)) delta_net(s, L, il, mem);
    else if (arch_is_hybrid(c.arch)) gated_attention(s, L, il, mem);
    else dense_attention(s, L, il, mem);
    kernels::add(s.x.data(), s.tmp.data(), s.x.data(), E * T);
    s.rms_norm(s.x.data(), L.ffn_norm, s.cur.data(), E, T);
    if (c.arch == Arch::Qwen35Moe) moe_ffn(s, L);
    else dense_ffn(s, L);
    kernels::add(s.x.data(), s.tmp.data(), s.x.data(), E * T);
  }
  for (const Run& r : s.runs) mem.set_seq_pos(r.seq, r.pos0 + r.n);

  // Output rows.
  s.out_idx.clear();
  for (int64_t t = 0; t < T; ++t)
    if (b.output[size_t(t)]) s.out_idx.push_back(int32_t(t));
  const int64_t n_out = int64_t(s.out_idx.size());
  if (n_out == 0) return {};
  for (int64_t i = 0; i < n_out; ++i)
    std::memcpy(s.hidden.data() + i * E, s.x.data() + int64_t(s.out_idx[size_t(i)]) * E, size_t(E) * sizeof(float));
  s.rms_norm(s.hidden.data(), model_.output_norm, s.hidden.data(), E, n_out);
  s.matmul(model_.output, s.hidden.data(), n_out, s.logits.data());
  n_out_ = n_out;
  return {};
}

}  // namespace kiln::model
