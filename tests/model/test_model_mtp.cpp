// The MTP drafter (model/mtp.cpp: ContextOptions::mtp, MemoryOptions::mtp, Context::mtp_draft) on
// tiny generated qwen35 / qwen35moe models with one MTP block, F32 weights, on the CPU:
//  - the draft logits equal a scalar re-computation of the MTP math written here from the weights
//    (llama.cpp's graph_mtp: concat(enorm(e), hnorm(h)) · eh_proj, gated attention with its own KV
//    over every earlier position's catch-up row, the FFN or MoE, shared_head_norm, the head), fed
//    with the trunk's normed hidden states read from a plain Context (ContextOptions::embeddings);
//  - the catch-up is schedule-independent: the prompt in one run, in chunks, or token by token, next
//    to another sequence, gives bit-identical drafts and logits;
//  - after a verify run and Memory::seq_accept the stored hidden state is the last accepted token's
//    (drafts equal those of a sequence that decoded the accepted tokens plainly);
//  - snapshots carry the MTP layer (restore into another slot drafts the same);
//  - deferred catch-up (Batch::mtp_defer, Context::mtp_flush) leaves the same rows and drafts as the
//    per-step one, also after a restore and for a copied sequence; the ring's bound is enforced;
//  - a draft vocabulary (ContextOptions::mtp_draft_vocab) drafts the best of the head's first rows;
//  - errors: a memory without the MTP layer, a model without an MTP block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/context.h"
#include "model/memory.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tensor/quant.h"

namespace kiln::model {
namespace {

using Vec = std::vector<float>;

std::unique_ptr<Model> load(const std::string& preset) {
  auto m = load_model(test::generated_model("kiln_test_model_mtp", preset, gguf::GgmlType::F32, 5));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(*m) : nullptr;
}

std::unique_ptr<Memory> memory(const Model& m, int n_seq, bool mtp, int n_spec = 0) {
  MemoryOptions mo;
  mo.n_ctx = 96;
  mo.n_seq = n_seq;
  mo.n_spec = n_spec;
  mo.mtp = mtp;
  auto mem = Memory::create(m, mo);
  EXPECT_TRUE(mem.ok()) << mem.error().message;
  return mem.ok() ? std::move(*mem) : nullptr;
}

std::unique_ptr<Context> context(const Model& m, bool mtp, bool embeddings = false, int64_t draft_vocab = 0) {
  ContextOptions co;
  co.n_batch = 64;
  co.n_threads = 2;
  co.mtp = mtp;
  co.embeddings = embeddings;
  co.mtp_draft_vocab = draft_vocab;
  return std::make_unique<Context>(m, co);
}

// ---- the scalar reference ----
struct Ref {
  const Model& m;
  const ModelConfig& c;
  const LayerWeights& L;
  std::vector<Vec> K, V;  // per position: [Hkv * D]
  explicit Ref(const Model& mm) : m(mm), c(mm.config()), L(mm.mtp[0]) {}

  Vec row(const Weight& w, int64_t r, int64_t slice = 0) const {
    Vec out(size_t(w.ne[0]));
    tensor::dequantize_row(w.type, w.data + size_t(slice * w.ne[1] + r) * w.row_bytes, out.data(), w.ne[0]);
    return out;
  }
  Vec mv(const Weight& w, const Vec& x, int64_t slice = 0) const {  // w [k, n] · x [k] -> [n]
    Vec y(size_t(w.ne[1]));
    for (int64_t r = 0; r < w.ne[1]; ++r) {
      const Vec wr = row(w, r, slice);
      double s = 0;
      for (size_t i = 0; i < x.size(); ++i) s += double(wr[i]) * x[i];
      y[size_t(r)] = float(s);
    }
    return y;
  }
  Vec norm(const float* x, int64_t n, const Weight* w) const {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const double sc = 1.0 / std::sqrt(ss / double(n) + double(c.rms_eps));
    Vec y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) y[size_t(i)] = float(x[i] * sc) * (w ? w->f32()[i] : 1.f);
    return y;
  }
  static float silu(float x) { return x / (1.f + std::exp(-x)); }
  static float sigm(float x) { return 1.f / (1.f + std::exp(-x)); }
  void rope(float* x, int64_t pos) const {
    const int64_t half = c.n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double th = double(pos) * c.rope_freq_scale * std::pow(double(c.rope_freq_base), -2.0 * double(i) / c.n_rot);
      const double x0 = x[i], x1 = x[i + half];
      x[i] = float(x0 * std::cos(th) - x1 * std::sin(th));
      x[i + half] = float(x0 * std::sin(th) + x1 * std::cos(th));
    }
  }
  Vec ffn(const Vec& x) const {
    auto swiglu = [&](const Weight& g, const Weight& u, const Weight& d, int64_t e) {
      Vec a = mv(g, x, e), b = mv(u, x, e);
      for (size_t i = 0; i < a.size(); ++i) a[i] = silu(a[i]) * b[i];
      return mv(d, a, e);
    };
    if (c.arch != Arch::Qwen35Moe) return swiglu(L.ffn_gate, L.ffn_up, L.ffn_down, 0);
    Vec p = mv(L.ffn_gate_inp, x);
    const float mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (float& v : p) sum += (v = std::exp(v - mx));
    for (float& v : p) v = float(v / sum);
    std::vector<int> ids(p.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int(i);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    const int64_t K = c.n_expert_used;
    double wsum = 0;
    for (int64_t j = 0; j < K; ++j) wsum += p[size_t(ids[size_t(j)])];
    Vec out(size_t(c.n_embd), 0.f);
    for (int64_t j = 0; j < K; ++j) {
      const int e = ids[size_t(j)];
      const double w = (c.expert_weights_norm ? p[size_t(e)] / wsum : p[size_t(e)]) * c.expert_weights_scale;
      const Vec y = swiglu(L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps, e);
      for (size_t i = 0; i < out.size(); ++i) out[i] += float(w * y[i]);
    }
    const Vec sh = swiglu(L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp, 0);
    double g = 0;
    for (size_t i = 0; i < x.size(); ++i) g += double(L.ffn_gate_inp_shexp.f32()[i]) * x[i];
    for (size_t i = 0; i < out.size(); ++i) out[i] += sigm(float(g)) * sh[i];
    return out;
  }
  // One MTP row: token tok at position pos (== K.size()) with the previous hidden state h. Returns
  // {h' (normed), logits}.
  std::pair<Vec, Vec> step(int32_t tok, const Vec& h, int64_t pos) {
    const int64_t E = c.n_embd, D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv;
    EXPECT_EQ(pos, int64_t(K.size()));
    const Weight& emb = L.nextn_embed_tokens.present() ? L.nextn_embed_tokens : m.token_embd;
    const Vec e = row(emb, tok);
    const Vec en = norm(e.data(), E, &L.nextn_enorm), hn = norm(h.data(), E, &L.nextn_hnorm);
    Vec cat(en);
    cat.insert(cat.end(), hn.begin(), hn.end());  // the embedding first
    Vec u = mv(L.nextn_eh_proj, cat);
    const Vec n = norm(u.data(), E, &L.attn_norm);
    const Vec qg = mv(L.attn_q, n);
    Vec k = mv(L.attn_k, n), v = mv(L.attn_v, n);
    Vec q(size_t(D * Hq)), gate(size_t(D * Hq));
    for (int64_t hh = 0; hh < Hq; ++hh) {
      const Vec qn = norm(qg.data() + hh * 2 * D, D, &L.attn_q_norm);
      std::copy(qn.begin(), qn.end(), q.begin() + hh * D);
      std::copy(qg.begin() + hh * 2 * D + D, qg.begin() + (hh + 1) * 2 * D, gate.begin() + hh * D);
      rope(q.data() + hh * D, pos);
    }
    for (int64_t hh = 0; hh < Hkv; ++hh) {
      const Vec kn = norm(k.data() + hh * D, D, &L.attn_k_norm);
      std::copy(kn.begin(), kn.end(), k.begin() + hh * D);
      rope(k.data() + hh * D, pos);
    }
    K.push_back(k);
    V.push_back(v);
    Vec att(size_t(D * Hq), 0.f);
    const double scale = c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(double(D));
    for (int64_t hh = 0; hh < Hq; ++hh) {
      const int64_t kv = hh / (Hq / Hkv);
      std::vector<double> s(K.size());
      double mx = -1e300, sum = 0;
      for (size_t p = 0; p < K.size(); ++p) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += double(q[size_t(hh * D + i)]) * K[p][size_t(kv * D + i)];
        mx = std::max(mx, s[p] = d * scale);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (size_t p = 0; p < K.size(); ++p)
        for (int64_t i = 0; i < D; ++i) att[size_t(hh * D + i)] += float(s[p] / sum * V[p][size_t(kv * D + i)]);
    }
    for (size_t i = 0; i < att.size(); ++i) att[i] *= sigm(gate[i]);
    const Vec o = mv(L.attn_output, att);
    for (size_t i = 0; i < u.size(); ++i) u[i] += o[i];
    const Vec f = ffn(norm(u.data(), E, &L.ffn_norm));
    for (size_t i = 0; i < u.size(); ++i) u[i] += f[i];
    const Weight& hw = L.nextn_shared_head_norm.present() ? L.nextn_shared_head_norm : m.output_norm;
    Vec hout = norm(u.data(), E, &hw);
    const Weight& head = L.nextn_shared_head_head.present() ? L.nextn_shared_head_head : m.output;
    return {hout, mv(head, hout)};
  }
};

// The trunk's normed hidden states of every prompt token (a plain Context with embeddings).
std::vector<Vec> trunk_hidden(const Model& m, const std::vector<int32_t>& p) {
  auto mem = memory(m, 1, false);
  auto cx = context(m, false, true);
  Batch b;
  b.add_run(p, 0, 0, true);
  EXPECT_TRUE(cx->decode(b, *mem).ok());
  std::vector<Vec> h;
  for (int64_t i = 0; i < cx->n_outputs(); ++i) h.emplace_back(cx->embedding(i), cx->embedding(i) + m.config().n_embd);
  return h;
}

struct Draft {
  std::vector<int32_t> tokens;
  Vec last_logits;  // the last draft step's row of this sequence (when it is the only row)
};

Draft draft(Context& cx, Memory& mem, int seq, int32_t tok, int n) {
  std::vector<Context::MtpRow> rows{{seq, tok, n}};
  std::vector<std::vector<int32_t>> out;
  Status s = cx.mtp_draft(rows, 0.f, mem, out, /*keep_logits=*/true);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  Draft d;
  if (!s.ok()) return d;
  d.tokens = out[0];
  if (cx.n_outputs() == 1) d.last_logits.assign(cx.logits(0), cx.logits(0) + cx.model().config().n_vocab);
  return d;
}

class Mtp : public ::testing::TestWithParam<std::string> {};

TEST_P(Mtp, DraftLogitsEqualScalarReference) {
  auto m = load(GetParam());
  ASSERT_TRUE(m);
  const ModelConfig& c = m->config();
  ASSERT_EQ(m->mtp.size(), 1u);
  const auto prompt = test::random_tokens(13, c.n_vocab, 3);
  const int32_t next = 77;
  const auto H = trunk_hidden(*m, prompt);
  ASSERT_EQ(H.size(), prompt.size());
  // kiln: the prompt in two chunks (a run start inside the prompt), then three draft steps.
  auto mem = memory(*m, 1, true);
  auto cx = context(*m, true);
  for (auto [p0, n] : {std::pair{0, 5}, std::pair{5, 8}}) {
    Batch b;
    b.add_run(std::span<const int32_t>(prompt).subspan(size_t(p0), size_t(n)), p0, 0, false, true);
    ASSERT_TRUE(cx->decode(b, *mem).ok());
  }
  const Draft d = draft(*cx, *mem, 0, next, 3);
  ASSERT_EQ(d.tokens.size(), 3u);
  EXPECT_EQ(mem->seq_pos(0), int64_t(prompt.size()));  // drafting leaves the position
  // The reference: catch-up rows (x_p, h_{p-1}) for the prompt, then the chain.
  Ref ref(*m);
  Vec h(size_t(c.n_embd), 0.f);
  for (size_t p = 0; p < prompt.size(); ++p) {
    ref.step(prompt[p], h, int64_t(p));
    h = H[p];
  }
  int32_t tok = next;
  Vec lg;
  for (int j = 0; j < 3; ++j) {
    auto [hn, l] = ref.step(tok, h, int64_t(prompt.size()) + j);
    Vec sorted(l);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const int32_t best = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    if (sorted[0] - sorted[1] > 1e-3f) {
      EXPECT_EQ(d.tokens[size_t(j)], best) << "draft step " << j;
    }
    tok = d.tokens[size_t(j)];  // follow kiln's chain (ties aside, the same)
    h = hn;
    lg = l;
  }
  ASSERT_EQ(d.last_logits.size(), lg.size());
  float mx = 0, diff = 0;
  for (size_t i = 0; i < lg.size(); ++i) {
    mx = std::max(mx, std::fabs(lg[i]));
    diff = std::max(diff, std::fabs(lg[i] - d.last_logits[i]));
  }
  EXPECT_GT(mx, 0.f);
  EXPECT_LE(diff, 1e-4f * (1.f + mx)) << "max |logit| " << mx;
}

// --spec-draft-vocab (ContextOptions::mtp_draft_vocab = Vd): a draft is the largest of the full
// head's logits among ids [0, Vd). Vd is the full draft's own choice, so the restricted draft must
// pick another id; every token of a longer restricted draft is below Vd.
TEST_P(Mtp, DraftVocabChoosesAmongItsFirstRows) {
  auto m = load(GetParam());
  ASSERT_TRUE(m);
  const ModelConfig& c = m->config();
  const auto prompt = test::random_tokens(11, c.n_vocab, 9);
  auto prefilled = [&](Context& cx) {
    auto mem = memory(*m, 1, true);
    Batch b;
    b.add_run(prompt, 0, 0, false);
    EXPECT_TRUE(cx.decode(b, *mem).ok());
    return mem;
  };
  auto full = context(*m, true);
  auto mem = prefilled(*full);
  int32_t next = -1, vd = 0;
  Vec row;
  for (int32_t t : {77, 5, 123, 40, 9}) {  // a next token whose full draft is not among the first two ids
    const Draft d = draft(*full, *mem, 0, t, 1);
    ASSERT_EQ(d.last_logits.size(), size_t(c.n_vocab));
    vd = int32_t(std::max_element(d.last_logits.begin(), d.last_logits.end()) - d.last_logits.begin());
    if (vd >= 2) {
      next = t, row = d.last_logits;
      break;
    }
  }
  ASSERT_GE(next, 0);
  auto cut = context(*m, true, false, vd);
  auto mem2 = prefilled(*cut);
  std::vector<Context::MtpRow> rows{{0, next, 1}};
  std::vector<std::vector<int32_t>> out;
  ASSERT_TRUE(cut->mtp_draft(rows, 0.f, *mem2, out).ok());
  ASSERT_EQ(out[0].size(), 1u);
  const int32_t got = out[0][0];
  ASSERT_GE(got, 0);
  ASSERT_LT(got, vd);
  const float best = *std::max_element(row.begin(), row.begin() + vd), mx = std::fabs(row[size_t(vd)]);
  EXPECT_GE(row[size_t(got)], best - 1e-4f * (1.f + mx)) << "drafted " << got << " of the first " << vd << " ids";
  rows[0].n_max = 4;
  ASSERT_TRUE(cut->mtp_draft(rows, 0.f, *mem2, out).ok());
  ASSERT_EQ(out[0].size(), 4u);
  EXPECT_EQ(out[0][0], got);
  for (int32_t t : out[0]) EXPECT_LT(t, vd);
}

// The catch-up does not depend on how the prompt was scheduled.
TEST_P(Mtp, CatchUpIsScheduleIndependent) {
  auto m = load(GetParam());
  ASSERT_TRUE(m);
  const auto prompt = test::random_tokens(20, m->config().n_vocab, 4);
  const auto other = test::random_tokens(9, m->config().n_vocab, 5);
  auto cx = context(*m, true);
  std::vector<Draft> ds;
  for (int mode = 0; mode < 3; ++mode) {
    auto mem = memory(*m, 2, true);
    if (mode == 0) {  // one run
      Batch b;
      b.add_run(prompt, 0, 1, false);
      ASSERT_TRUE(cx->decode(b, *mem).ok());
    } else if (mode == 1) {  // chunks of 7, next to another sequence's prefill
      for (int p0 = 0; p0 < 20; p0 += 7) {
        Batch b;
        const int n = std::min(7, 20 - p0);
        if (p0 == 7) b.add_run(other, 0, 0, false);
        b.add_run(std::span<const int32_t>(prompt).subspan(size_t(p0), size_t(n)), p0, 1, false);
        ASSERT_TRUE(cx->decode(b, *mem).ok());
      }
    } else {  // token by token
      for (int p = 0; p < 20; ++p) {
        Batch b;
        b.add(prompt[size_t(p)], p, 1, true);
        ASSERT_TRUE(cx->decode(b, *mem).ok());
      }
    }
    ds.push_back(draft(*cx, *mem, 1, 5, 4));
  }
  for (int mode = 1; mode < 3; ++mode) {
    EXPECT_EQ(ds[size_t(mode)].tokens, ds[0].tokens) << "mode " << mode;
    ASSERT_EQ(ds[size_t(mode)].last_logits.size(), ds[0].last_logits.size());
    EXPECT_EQ(std::memcmp(ds[size_t(mode)].last_logits.data(), ds[0].last_logits.data(), ds[0].last_logits.size() * 4), 0)
        << "mode " << mode;
  }
}

// After a verify run [t, d0, d1, d2] and seq_accept of n tokens, the drafts equal those of a
// sequence that decoded the accepted tokens plainly; a snapshot restored into another slot too.
TEST_P(Mtp, AcceptAndSnapshotCarryTheHiddenState) {
  auto m = load(GetParam());
  ASSERT_TRUE(m);
  const auto prompt = test::random_tokens(10, m->config().n_vocab, 6);
  const std::vector<int32_t> run{11, 12, 13, 14};
  auto cx = context(*m, true);
  for (int n = 0; n < 4; ++n) {
    auto mem = memory(*m, 3, true, 3);
    Batch b;
    b.add_run(prompt, 0, 0, false);
    b.add_run(prompt, 0, 1, false);
    ASSERT_TRUE(cx->decode(b, *mem).ok());
    b.clear();
    for (size_t i = 0; i < run.size(); ++i) b.add(run[i], int32_t(10 + i), 0, true, i + 1 < run.size());
    ASSERT_TRUE(cx->decode(b, *mem).ok());
    ASSERT_TRUE(mem->seq_accept(0, 10 + n + 1, n < 3 ? n : -1).ok());
    b.clear();
    b.add_run(std::span<const int32_t>(run).subspan(0, size_t(n + 1)), 10, 1, false);
    ASSERT_TRUE(cx->decode(b, *mem).ok());
    const Draft a = draft(*cx, *mem, 0, 40, 3), p = draft(*cx, *mem, 1, 40, 3);
    EXPECT_EQ(a.tokens, p.tokens) << "accepted " << n;
    EXPECT_EQ(a.last_logits, p.last_logits) << "accepted " << n;
    const Snapshot snap = mem->snapshot(0);
    ASSERT_TRUE(mem->restore(2, snap).ok());
    EXPECT_EQ(draft(*cx, *mem, 2, 40, 3).last_logits, a.last_logits) << "restored, accepted " << n;
  }
}

// Deferred catch-up (Batch::mtp_defer + Context::mtp_flush): decodes that skip the block, then one
// batched pass, leave the very MTP rows (KV bytes, drafts, logits) of decodes that ran it every step —
// after a prompt, after a snapshot restored into another slot (the ring's column before the restore
// point comes from the stored hidden state), and for a copy of a sequence with rows still pending.
TEST_P(Mtp, DeferredCatchUpEqualsPerStep) {
  auto m = load(GetParam());
  ASSERT_TRUE(m);
  const auto prompt = test::random_tokens(20, m->config().n_vocab, 7);
  const auto gen = test::random_tokens(12, m->config().n_vocab, 8);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  auto cx = context(*m, true);
  auto step = [&](Memory& mem, int seq, int64_t i0, int64_t i1, bool defer) {
    for (int64_t p = i0; p < i1; ++p) {
      Batch b;
      b.add(all[size_t(p)], int32_t(p), seq, true);
      b.mtp_defer = defer;
      ASSERT_TRUE(cx->decode(b, mem).ok()) << "position " << p;
    }
  };
  auto mem = memory(*m, 4, true, 3);
  Batch b;
  b.add_run(prompt, 0, 0, false);
  b.add_run(prompt, 0, 1, false);
  ASSERT_TRUE(cx->decode(b, *mem).ok());
  const Snapshot snap = mem->snapshot(1);  // at the prompt's end, for slot 2 below
  step(*mem, 0, 20, 32, false);            // slot 0: the catch-up every step
  step(*mem, 1, 20, 26, false);            // slot 1: six steps with it, six without
  step(*mem, 1, 26, 32, true);
  EXPECT_EQ(mem->mtp_done(1), 26);
  std::vector<std::vector<int32_t>> out;
  const std::vector<Context::MtpRow> r1{{1, 40, 3}};
  const Status early = cx->mtp_draft(r1, 0.f, *mem, out);  // rows pending: refused
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.error().message.find("mtp_flush"), std::string::npos) << early.error().message;
  mem->seq_copy(1, 3);  // a copy with its rows still pending
  ASSERT_TRUE(mem->restore(2, snap).ok());  // slot 2: restored at 20, then deferred to the end
  step(*mem, 2, 20, 32, true);
  const std::vector<int32_t> seqs{1, 2, 3};
  const std::vector<std::span<const int32_t>> toks(3, std::span<const int32_t>(all));
  ASSERT_TRUE(cx->mtp_flush(seqs, toks, *mem).ok());
  const size_t n = 32 * mem->kv_bytes_per_pos();
  std::vector<uint8_t> kv0(n), kv(n);
  mem->read_kv(0, 0, 32, kv0.data());
  const Draft want = draft(*cx, *mem, 0, 40, 3);
  for (int seq : seqs) {
    EXPECT_EQ(mem->mtp_done(seq), 32) << "slot " << seq;
    mem->read_kv(seq, 0, 32, kv.data());
    EXPECT_EQ(std::memcmp(kv.data(), kv0.data(), n), 0) << "slot " << seq << ": KV rows differ";
    const Draft got = draft(*cx, *mem, seq, 40, 3);
    EXPECT_EQ(got.tokens, want.tokens) << "slot " << seq;
    EXPECT_EQ(got.last_logits, want.last_logits) << "slot " << seq;
  }
}

// The ring bounds what a sequence may defer: Memory::kMtpRing - 1 positions, then a flush.
TEST_P(Mtp, DeferringPastTheRingIsRefused) {
  auto m = load(GetParam());
  ASSERT_TRUE(m);
  const auto toks = test::random_tokens(90, m->config().n_vocab, 9);
  auto cx = context(*m, true);
  auto mem = memory(*m, 1, true);
  Batch b;
  b.add_run(std::span<const int32_t>(toks).subspan(0, 10), 0, 0, false);
  ASSERT_TRUE(cx->decode(b, *mem).ok());
  for (int64_t p = 10; p < 10 + Memory::kMtpRing; ++p) {
    b.clear();
    b.add(toks[size_t(p)], int32_t(p), 0, true);
    b.mtp_defer = true;
    const Status s = cx->decode(b, *mem);
    if (p < 10 + Memory::kMtpRing - 1) {
      ASSERT_TRUE(s.ok()) << "position " << p << ": " << s.error().message;
    } else {
      ASSERT_FALSE(s.ok()) << "deferred " << p - 10 + 1 << " positions";
      EXPECT_NE(s.error().message.find("ring"), std::string::npos) << s.error().message;
    }
  }
  const std::vector<int32_t> seqs{0};
  const std::vector<std::span<const int32_t>> t1{std::span<const int32_t>(toks)};
  ASSERT_TRUE(cx->mtp_flush(seqs, t1, *mem).ok());
  EXPECT_EQ(mem->mtp_done(0), mem->seq_pos(0));
}

INSTANTIATE_TEST_SUITE_P(Tiny, Mtp, ::testing::Values("tiny-qwen35-mtp", "tiny-qwen35moe-mtp"),
                         [](const auto& i) { return i.param == "tiny-qwen35-mtp" ? std::string("qwen35") : std::string("qwen35moe"); });

TEST(MtpErrors, MemoryAndModelWithoutMtp) {
  auto m = load("tiny-qwen35-mtp");
  ASSERT_TRUE(m);
  auto mem = memory(*m, 1, false);
  auto cx = context(*m, true);
  Batch b;
  b.add(1, 0, 0, true);
  Status s = cx->decode(b, *mem);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("MemoryOptions::mtp"), std::string::npos) << s.error().message;
  auto plain = load("tiny-qwen35");
  ASSERT_TRUE(plain);
  MemoryOptions mo;
  mo.mtp = true;
  auto bad = Memory::create(*plain, mo);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("draft-mtp"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace kiln::model
