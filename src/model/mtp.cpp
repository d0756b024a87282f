// model/mtp.cpp — the MTP (nextn) block of qwen35 / qwen35moe as a drafter (--spec-type draft-mtp):
//   the block itself (mtp_block), its catch-up rows inside every decode (Context::Impl::mtp_prepare /
//   mtp_catchup) and the greedy draft (Context::mtp_draft).
// Math as llama.cpp's qwen35 graph_mtp (facts from its source; notes in docs/engine.md):
//   for the token x_p at position p and h_{p-1}, the trunk's hidden state of the token before it
//   AFTER the output norm (llama.cpp's t_h_nextn; zeros before the first token):
//     c = concat(RMSNorm(e(x_p)) * enorm, RMSNorm(h_{p-1}) * hnorm)       (the embedding first; 2E)
//     u = eh_proj · c;  u += GatedAttn(RMSNorm(u) * attn_norm) (own KV, position p);
//     u += FFN(RMSNorm(u) * post_attention_norm)                          (dense, or the MoE set)
//     h' = RMSNorm(u) * (nextn.shared_head_norm or output_norm);  logits = (shared_head_head or output) · h'
//   e = nextn.embed_tokens or token_embd. A draft feeds h' back as the next step's h.
// Catch-up: the MTP's KV must hold a row for every position of the sequence, computed with the
//   trunk's hidden states. Each decode (ContextOptions::mtp) therefore runs the block over all of its
//   tokens after the trunk, pairing token t with the hidden state of token t - 1 of its run, or, for
//   a run's first token, with the sequence's stored one (Memory::mtp_h at the recurrent slot); then
//   the run's last hidden state is stored there (a speculative verify run's kept tokens: at their
//   keep slots, so Memory::seq_accept's slot swap also picks the hidden state of the last accepted
//   token). Prefix-cache snapshots and slot files carry it as part of the recurrent state.
// Deferred catch-up (Batch::mtp_defer: the engine's steps while every slot's drafting is paused): the
//   decode skips the block and only keeps each token's hidden state in the Memory's ring (written by
//   every decode); mtp_flush later runs the block once over each sequence's pending positions
//   [Memory::mtp_done, seq_pos), pairing token p with the ring's hidden state of p - 1 — the same rows
//   as the per-step catch-up, at the cost of one batched pass instead of one per step.
// Drafts: rows [sampled token, stored h] at the sequence's next position, then each drafted token
//   with the block's own h', k times; the KV rows written past seq_pos are overwritten by the next
//   decode's catch-up. Placement (Model::mtp_device): the block runs with the last trunk layer, so on
//   the GPU whenever a layer is, also when the output (the head matrix) stays on the host: the
//   catch-up rows of a prompt then run on the GPU, and a draft's h' rows go to the host for the head.
//   The argmax is on the device (topk_route with k = 1; the probability for --spec-draft-p-min), and
//   token_embd stays on the host, which gathers each drafted token's embedding. When the whole step
//   is on one GPU and only the ids are wanted (the engine's drafts), all k positions of all rows are
//   one recorded graph (mtp_draft_graph: a host node gathers the embeddings between positions, no
//   host round trip); otherwise (the CPU, a split model, keep_logits) position by position, the host
//   reading each row's id and probability in between.
// Must not: sample with the request's sampler or touch seq_pos. Threading: as Context.
#include <algorithm>
#include <cmath>

#include "model/context_impl.h"
#include "tensor/quant.h"

namespace kiln::model {

using backend::Binary;
using backend::DeviceType;

// u = eh_proj · [enorm(e); hnorm(h)], then the block (gated attention at il + FFN) on u (in place).
void mtp_block(const Step& s, const LayerWeights& L, int64_t il, Memory& mem, const Tensor& emb, const Tensor& hprev,
               const Tensor& cat, const Tensor& u) {
  const ModelConfig& c = s.c;
  const int64_t E = c.n_embd, T = s.T;
  const Tensor ce = rows_view(cat, E, T, 1, 2 * E, 2 * E * T), ch = rows_view(cat, E, T, 1, 2 * E, 2 * E * T, E);
  s.st.rms_norm(dense_view(emb, E, T), &L.nextn_enorm.t, ce, c.rms_eps);
  s.st.rms_norm(dense_view(hprev, E, T), &L.nextn_hnorm.t, ch, c.rms_eps);
  s.st.matmul(L.nextn_eh_proj.t, dense_view(cat, 2 * E, T), dense_view(u, E, T));
  s.st.rms_norm(u, &L.attn_norm.t, s.a.cur, c.rms_eps);
  gated_attention(s, L, il, mem);
  s.st.add_rms_norm(u, s.a.tmp, &L.ffn_norm.t, s.a.cur, c.rms_eps);
  if (c.arch == Arch::Qwen35Moe) moe_ffn(s, L);
  else dense_ffn(s, L);
  s.st.binary(Binary::Add, u, s.a.tmp, u);
}

namespace {
// A contiguous F32 [ne0, 1, n, 1] view at t's buffer and offset (kv_store's rows / cache shape).
Tensor as_rows(const Tensor& t, int64_t ne0, int64_t n) {
  return Tensor::make(t.buf, t.offset, gguf::GgmlType::F32, {ne0, 1, n, 1});
}

// The drafts' head: the first `vocab` rows of the head matrix [E, V] (weights are kept in the file's
// row order on every device, so that is a prefix of its bytes), all of them when vocab is 0 or >= V.
Tensor draft_head(const Tensor& head, int64_t vocab) {
  if (vocab <= 0 || vocab >= head.ne[1]) return head;
  Tensor t = head;
  t.ne[1] = vocab;
  t.nb[2] = t.nb[3] = t.nb[1] * size_t(vocab);
  return t;
}
}  // namespace

Status Context::Impl::mtp_prepare(const Batch& b, const Memory& mem) {
  if (!mem.has_mtp()) return err("the context runs the MTP block (ContextOptions::mtp) but the memory has no MTP layer "
                                 "(MemoryOptions::mtp)");
  const int64_t T = b.size();
  mtp_defer = b.mtp_defer;
  hidx.assign(size_t(5 * T), 0);
  int32_t *hsrc = hidx.data(), *hshift = hsrc + T, *hdst = hshift + T, *hring = hdst + 2 * T;  // hzero: [3T, 4T)
  std::fill(hshift, hshift + T, int32_t(T));
  std::fill(hdst, hdst + T, mem.mtp_h_scratch());
  for (const Run& r : runs) {
    // A deferred run's positions join the pending ones; the ring holds the last kMtpRing hidden states.
    if (mtp_defer && r.pos0 + r.n - mem.mtp_done(r.seq) >= Memory::kMtpRing)
      return err("sequence {}: deferring the MTP catch-up of positions [{}, {}) exceeds the {}-position ring "
                 "(Context::mtp_flush first)", r.seq, mem.mtp_done(r.seq), r.pos0 + r.n, Memory::kMtpRing);
    for (int64_t i = 0; i < r.n; ++i) {
      const size_t t = size_t(r.t0 + i);
      hring[t] = mem.mtp_ring_col(r.seq, r.pos0 + i);
      hsrc[t] = mem.rec_slot(r.seq);
      if (i + 1 < r.n) hshift[t] = int32_t(t + 1);
      if (i + 1 == r.n) hdst[t] = mem.rec_slot(r.seq);
      else if (!keep.empty() && keep[t] >= 0) hdst[t] = keep[t];  // keep: empty without keep slots
    }
  }
  return {};
}

// After the trunk, on the MTP block's device d (x: the residual stream of the T tokens).
void Context::Impl::mtp_catchup(Dev& d, Memory& mem, int64_t T) {
  const int64_t E = c.n_embd;
  backend::Stream& st = *d.st;
  const LayerWeights& L = m.mtp[0];
  // The trunk's hidden states after the output norm (llama.cpp's t_h_nextn), every token, also into
  // the sequences' rings (for a later mtp_flush).
  st.rms_norm(d.a.x, &m.mtp_output_norm.t, d.hall, c.rms_eps);
  const Tensor& mh = mem.mtp_h();
  st.kv_store(as_rows(d.hall, E, T), d.hzero, d.hring, as_rows(mh, E, mh.ne[1]));
  if (!mtp_defer) {
    // Each token's previous hidden state: the stored one (run starts), then the run's own shifted by one.
    st.get_rows(mh, d.hsrc, dense_view(d.hprev, E, T));
    st.kv_store(as_rows(d.hall, E, T), d.hzero, d.hshift, as_rows(d.hprev, E, T + 1));
    Dev& e = experts_of(c.n_layer);
    const Step xs{*e.st, e.a, c, opt, T};
    const Step s{st, d.a, c, opt, T, &e != &d ? &xs : nullptr};
    mtp_block(s, L, c.n_layer, mem, d.emb, d.hprev, d.cat, d.a.x);
  }
  // Each run's last hidden state (and a verify run's kept ones) into the sequence's slots.
  st.kv_store(as_rows(d.hall, E, T), d.hzero, d.hdst, as_rows(mh, E, mh.ne[1]));
}

// The block over T rows, op by op on its device (the result in its x): row t is token ids[t] of sequence
// seq[t] at position pos[t] with the hidden state in column src[t] of hs. Binds every device for T rows
// and n_out outputs (the drafts read the head's rows afterwards).
void Context::Impl::mtp_rows(Memory& mem, int64_t T, int64_t n_out, const int32_t* ids, const int32_t* pos,
                             const int32_t* seq, const int32_t* src, const Tensor& hs) {
  const int64_t E = c.n_embd;
  const LayerWeights& L = m.mtp[0];
  const Tensor& table = L.nextn_embed_tokens.present() ? L.nextn_embed_tokens.t : m.token_embd.t;
  Dev& h = devs[0];
  Dev& md = devs[size_t(mtp_dev)];
  Dev& e = experts_of(c.n_layer);
  for (Dev& d : devs) bind(d, T, n_out);
  h.st->upload(h.tok, ids, size_t(T) * 4);
  h.st->get_rows(table, h.tok, h.emb);
  if (&md != &h) md.st->upload(md.emb, h.emb.host(), size_t(E * T) * sizeof(float));
  md.st->upload(md.a.pos, pos, size_t(T) * 4);
  md.st->upload(md.a.seq, seq, size_t(T) * 4);
  md.st->upload(md.hsrc, src, size_t(T) * 4);
  md.st->get_rows(hs, md.hsrc, dense_view(md.hprev, E, T));
  const Step xs{*e.st, e.a, c, opt, T};
  const Step st{*md.st, md.a, c, opt, T, &e != &md ? &xs : nullptr};
  mtp_block(st, L, c.n_layer, mem, md.emb, md.hprev, md.cat, md.a.x);
}

Status Context::mtp_flush(std::span<const int32_t> seqs, std::span<const std::span<const int32_t>> tokens,
                          Memory& mem) {
  Impl& s = *impl_;
  const ModelConfig& c = model_.config();
  if (!opt_.mtp || model_.mtp.empty()) return err("mtp_flush: the context was created without ContextOptions::mtp");
  if (!mem.has_mtp()) return err("mtp_flush: the memory has no MTP layer (MemoryOptions::mtp)");
  if (seqs.size() != tokens.size()) return err("mtp_flush: {} sequences but {} token lists", seqs.size(), tokens.size());
  // Pending positions, each token with its sequence, position and the ring column of the hidden state before it.
  std::vector<int32_t> ids, pos, seq, src;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int q = seqs[i];
    if (q < 0 || q >= mem.n_seq()) return err("mtp_flush: sequence {} outside [0, {})", q, mem.n_seq());
    const int64_t p0 = mem.mtp_done(q), p1 = mem.seq_pos(q);
    if (p0 >= p1) continue;
    if (p0 < 1 || p1 - p0 >= Memory::kMtpRing || int64_t(tokens[i].size()) < p1)
      return err("mtp_flush: sequence {}: pending positions [{}, {}) with {} tokens (ring {})", q, p0, p1,
                 tokens[i].size(), Memory::kMtpRing);
    for (int64_t p = p0; p < p1; ++p) {
      const int32_t t = tokens[i][size_t(p)];
      if (t < 0 || t >= c.n_vocab) return err("mtp_flush: token {} outside the vocabulary", t);
      ids.push_back(t);
      pos.push_back(int32_t(p));
      seq.push_back(q);
      src.push_back(mem.mtp_ring_col(q, p - 1));
    }
  }
  if (ids.empty()) return {};
  s.reserve_attention(mem);
  for (size_t t0 = 0; t0 < ids.size(); t0 += size_t(opt_.n_batch)) {
    const int64_t T = std::min<int64_t>(opt_.n_batch, int64_t(ids.size() - t0));
    s.mtp_rows(mem, T, 0, ids.data() + t0, pos.data() + t0, seq.data() + t0, src.data() + t0, mem.mtp_h());
    for (Impl::Dev& d : s.devs) d.st->synchronize();
  }
  for (const int q : seqs) mem.set_decoded(q, mem.seq_pos(q), mem.seq_pos(q));
  n_out_ = 0;  // the decode's rows are no longer this Context's (bind reused the scratch)
  s.top_valid = false;
  return {};
}

Status Context::mtp_draft(std::span<const MtpRow> rows, float p_min, Memory& mem,
                          std::vector<std::vector<int32_t>>& out, bool keep_logits) {
  Impl& s = *impl_;
  const ModelConfig& c = model_.config();
  const int64_t E = c.n_embd, V = c.n_vocab, n = int64_t(rows.size());
  out.assign(rows.size(), {});
  n_out_ = 0;
  if (n == 0) return {};
  if (!opt_.mtp || model_.mtp.empty()) return err("mtp_draft: the context was created without ContextOptions::mtp");
  if (!mem.has_mtp()) return err("mtp_draft: the memory has no MTP layer (MemoryOptions::mtp)");
  if (n > opt_.n_batch || n > s.n_out_max)
    return err("mtp_draft: {} rows exceed the context's batch {} / outputs {}", n, opt_.n_batch, s.n_out_max);
  for (const MtpRow& r : rows) {
    if (r.seq < 0 || r.seq >= mem.n_seq()) return err("mtp_draft: sequence {} outside [0, {})", r.seq, mem.n_seq());
    if (r.token < 0 || r.token >= V) return err("mtp_draft: token {} outside the vocabulary", r.token);
    if (mem.mtp_done(r.seq) != mem.seq_pos(r.seq))
      return err("mtp_draft: sequence {}: MTP rows [{}, {}) deferred (mtp_flush first)", r.seq, mem.mtp_done(r.seq),
                 mem.seq_pos(r.seq));
    if (mem.seq_pos(r.seq) + r.n_max > mem.n_ctx())
      return err("mtp_draft: sequence {}: {} draft positions after {} exceed the context size {}", r.seq, r.n_max,
                 mem.seq_pos(r.seq), mem.n_ctx());
  }
  s.reserve_attention(mem);
  const LayerWeights& L = model_.mtp[0];
  const Tensor& head_norm = L.nextn_shared_head_norm.present() ? L.nextn_shared_head_norm.t : model_.mtp_output_norm.t;
  const Tensor& head_all = L.nextn_shared_head_head.present() ? L.nextn_shared_head_head.t : model_.output.t;
  const Tensor head = keep_logits ? head_all : draft_head(head_all, opt_.mtp_draft_vocab);  // [E, Vd]
  const int64_t Vd = head.ne[1];
  Impl::Dev& md = s.devs[size_t(s.mtp_dev)];  // runs the block and the head norm
  Impl::Dev& o = s.devs[size_t(s.out_dev)];   // the head matrix, the argmax and the logits rows
  std::vector<int> act, prev;  // active rows (indices into `rows`), and the previous step's
  int k = 0;
  bool room = true;  // every row's k positions fit the context (the graph runs all rows k positions)
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].n_max > 0) {
      act.push_back(int(i));
      k = std::max(k, rows[i].n_max);
    }
  for (int r : act) room = room && mem.seq_pos(rows[size_t(r)].seq) + k <= mem.n_ctx();
  if (!act.empty() && !keep_logits && s.graph_step && k <= kDraftGraphMax && int64_t(act.size()) * k <= opt_.n_batch &&
      room) {
    s.mtp_draft_graph(rows, act, k, p_min, mem, out);
    s.rows_on_host = true;
    s.top_valid = false;
    return {};
  }
  std::vector<int32_t> tok(rows.size()), pos, seq, src;
  for (size_t i = 0; i < rows.size(); ++i) tok[i] = rows[i].token;
  for (int j = 0; !act.empty(); ++j) {
    const int64_t T = int64_t(act.size()), T_prev = int64_t(prev.size());
    pos.clear(), seq.clear(), src.clear();
    std::vector<int32_t> ids;
    for (size_t a = 0; a < act.size(); ++a) {
      const MtpRow& r = rows[size_t(act[a])];
      ids.push_back(tok[size_t(act[a])]);
      pos.push_back(int32_t(mem.seq_pos(r.seq) + j));
      seq.push_back(r.seq);
      // Step 0: the stored hidden state; then the row's own h' of the previous step.
      src.push_back(j == 0 ? mem.rec_slot(r.seq)
                           : int32_t(std::find(prev.begin(), prev.end(), act[a]) - prev.begin()));
    }
    const Tensor prev_h = Tensor::make(md.hidden.buf, md.hidden.offset, gguf::GgmlType::F32, {E, std::max<int64_t>(T_prev, 1), 1, 1});
    s.mtp_rows(mem, T, T, ids.data(), pos.data(), seq.data(), src.data(), j == 0 ? mem.mtp_h() : prev_h);
    md.st->rms_norm(md.a.x, &head_norm, md.hidden, c.rms_eps);
    if (&md != &o) {  // the GPU's h' rows to the host, where the output is (md keeps them for the next step)
      md.st->download(o.hidden.host(), md.hidden, size_t(E * T) * sizeof(float));
      md.st->synchronize();
    }
    const Tensor lg = Vd == V ? o.logits : dense_view(o.logits, Vd, T);  // [Vd, T]
    o.st->matmul(head, o.hidden, lg);
    // Greedy on the device: each row's argmax and its probability under the softmax of its Vd
    // logits (topk_route with k = 1); the host reads those two numbers per row.
    o.st->topk_route(lg, 1, false, 1.0f, o.dids, o.dprob);
    std::vector<int32_t> best_id(static_cast<size_t>(T));
    std::vector<float> best_p(static_cast<size_t>(T));
    o.st->download(best_id.data(), o.dids, size_t(T) * 4);
    o.st->download(best_p.data(), o.dprob, size_t(T) * 4);
    if (keep_logits && o.dev->type() != DeviceType::Cpu)
      o.st->download(s.logits, o.logits, size_t(V * T) * sizeof(float));
    for (Impl::Dev& d : s.devs) d.st->synchronize();
    n_out_ = keep_logits ? T : 0;  // logits(i): this step's row i (the last step's rows remain readable)
    s.rows_on_host = true;         // downloaded above (or the host's own)
    s.top_valid = false;           // the decode's top logits are no longer this Context's rows
    prev = act;
    std::vector<int> next;
    for (size_t a = 0; a < act.size(); ++a) {
      const int32_t best = best_id[a];
      const int r = act[a];
      if (best_p[a] < p_min) continue;
      out[size_t(r)].push_back(int32_t(best));
      tok[size_t(r)] = int32_t(best);
      if (int(out[size_t(r)].size()) < rows[size_t(r)].n_max) next.push_back(r);
    }
    act = std::move(next);
  }
  return {};
}

void Context::Impl::DraftGather::run(void* self) {
  const DraftGather& g = *static_cast<const DraftGather*>(self);
  for (int64_t a = 0; a < g.n; ++a)
    tensor::dequantize_row(g.type, g.table + size_t(g.ids[a]) * g.row_bytes, g.emb + a * g.E, g.E);
}

// The draft as one graph on devs[1] (graph_step: the block, the head and the output there). Inputs
// before the replay: step 0's embeddings (gathered here), every position's pos [k, n], seq, step 0's
// hidden-state slots and the identity (later steps read their own h'). Per position in the graph: the
// block, the head, the argmax, its id and probability to page-locked memory, and (but the last) a host
// node gathering those ids' embeddings and their upload. All rows run k positions; each row's drafts
// are cut afterwards at its n_max and at the first probability below p_min (their KV rows past the
// cut are overwritten by the next decode's catch-up, as in the step-by-step path).
void Context::Impl::mtp_draft_graph(std::span<const Context::MtpRow> rows, const std::vector<int>& act, int k,
                                    float p_min, Memory& mem, std::vector<std::vector<int32_t>>& out) {
  const int64_t E = c.n_embd, n = int64_t(act.size());
  const LayerWeights& L = m.mtp[0];
  const Tensor& table = L.nextn_embed_tokens.present() ? L.nextn_embed_tokens.t : m.token_embd.t;
  const Tensor& head_norm = L.nextn_shared_head_norm.present() ? L.nextn_shared_head_norm.t : m.mtp_output_norm.t;
  const Tensor head = draft_head(L.nextn_shared_head_head.present() ? L.nextn_shared_head_head.t : m.output.t,
                                 opt.mtp_draft_vocab);  // [E, Vd]
  Dev& h = devs[0];
  Dev& g = devs[1];
  std::vector<int32_t> ids(static_cast<size_t>(n)), seq(ids), src0(ids), ident(ids), pos(static_cast<size_t>(k * n));
  for (int64_t a = 0; a < n; ++a) {
    const MtpRow& r = rows[size_t(act[size_t(a)])];
    ids[size_t(a)] = r.token;
    seq[size_t(a)] = r.seq;
    src0[size_t(a)] = mem.rec_slot(r.seq);
    ident[size_t(a)] = int32_t(a);
    for (int j = 0; j < k; ++j) pos[size_t(j * n + a)] = int32_t(mem.seq_pos(r.seq) + j);
  }
  for (Dev& d : devs) bind(d, n, n);
  const Tensor lg = head.ne[1] == c.n_vocab ? g.logits : dense_view(g.logits, head.ne[1], n);  // [Vd, n], as bound
  h.st->upload(h.tok, ids.data(), size_t(n) * 4);
  h.st->get_rows(table, h.tok, h.emb);
  g.st->upload(g.emb, h.emb.host(), size_t(E * n) * sizeof(float));
  g.st->upload(g.arena.tensor(g.plan.pos, gguf::GgmlType::I32, {k * n, 1, 1, 1}), pos.data(), pos.size() * 4);
  g.st->upload(g.a.seq, seq.data(), size_t(n) * 4);
  g.st->upload(g.hsrc, src0.data(), size_t(n) * 4);
  g.st->upload(g.hshift, ident.data(), size_t(n) * 4);

  if (draft_graph_mem != mem.id()) {  // graphs hold the Memory's buffer addresses
    draft_graphs.clear();
    draft_graph_mem = mem.id();
  }
  auto& dg = draft_graphs[{n, k}];
  if (!dg) {
    dg = std::make_unique<DraftGraph>();
    dg->gathers.resize(size_t(k - 1));
    for (int j = 0; j + 1 < k; ++j)
      dg->gathers[size_t(j)] = {static_cast<const char*>(table.host()), table.nb[1], table.type,
                                draft_ids + size_t(j * n), draft_emb, n, E};
  }
  const Tensor hid = Tensor::make(g.hidden.buf, g.hidden.offset, gguf::GgmlType::F32, {E, n, 1, 1});
  auto body = [&] {
    for (int j = 0; j < k; ++j) {
      Act aj = g.a;
      aj.pos = g.arena.tensor(g.plan.pos + size_t(j * n) * 4, gguf::GgmlType::I32, {n, 1, 1, 1});
      const Step st{*g.st, aj, c, opt, n};
      g.st->get_rows(j == 0 ? mem.mtp_h() : hid, j == 0 ? g.hsrc : g.hshift, dense_view(g.hprev, E, n));
      mtp_block(st, L, c.n_layer, mem, g.emb, g.hprev, g.cat, g.a.x);
      g.st->rms_norm(g.a.x, &head_norm, g.hidden, c.rms_eps);
      g.st->matmul(head, g.hidden, lg);
      g.st->topk_route(lg, 1, false, 1.0f, g.dids, g.dprob);
      g.st->download(draft_ids + size_t(j * n), g.dids, size_t(n) * 4);
      g.st->download(draft_p + size_t(j * n), g.dprob, size_t(n) * 4);
      if (j + 1 < k) {
        g.st->host_call(&DraftGather::run, &dg->gathers[size_t(j)]);
        g.st->upload(g.emb, draft_emb, size_t(E * n) * sizeof(float));
      }
    }
  };
  if (!dg->graph && !graphs_unsupported) dg->graph = g.st->capture(body);
  if (dg->graph) g.st->replay(*dg->graph);
  else body();  // no capture (per-op profiling): the same ops, enqueued now
  g.st->synchronize();
  for (int64_t a = 0; a < n; ++a) {
    const int r = act[size_t(a)];
    for (int j = 0; j < rows[size_t(r)].n_max; ++j) {
      if (draft_p[size_t(j * n + a)] < p_min) break;
      out[size_t(r)].push_back(draft_ids[size_t(j * n + a)]);
    }
  }
}

}  // namespace kiln::model
