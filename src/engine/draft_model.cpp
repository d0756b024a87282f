// engine/draft_model.cpp — the draft model of --spec-type draft-simple (engine/draft_model.h): the
//   mirror of each slot's committed tokens, the batched greedy drafts and the rollback after them.
#include "engine/draft_model.h"

#include <algorithm>
#include <cmath>

namespace kiln::engine {

Result<std::unique_ptr<DraftModel>> DraftModel::create(const model::Model& m, const DraftModelOptions& o) {
  auto d = std::unique_ptr<DraftModel>(new DraftModel(m));
  d->o_ = o;
  model::MemoryOptions mo;
  mo.n_ctx = o.n_ctx_slot;
  mo.n_seq = o.n_slots;
  mo.type_k = o.type_k;
  mo.type_v = o.type_v;
  mo.n_spec = o.n_max + 1;  // the committed run's last token may be token n_max of its run
  auto mem = model::Memory::create(m, mo);
  if (!mem.ok()) return err("-md/--model-draft {}: {}", m.file().path(), mem.error().message);
  d->mem_ = std::move(*mem);
  model::ContextOptions co;
  co.n_batch = std::max<int64_t>(o.n_batch, int64_t(o.n_slots) * (o.n_max + 2));
  co.n_threads = o.n_threads;
  co.n_outputs_max = o.n_slots;  // one row per slot and decode
  d->cx_ = std::make_unique<model::Context>(m, co);
  d->held_.assign(size_t(o.n_slots), {});
  return d;
}

Status DraftModel::decode(const model::Batch& b) {
  Status s = cx_->decode(b, *mem_);
  if (!s.ok()) return err("draft model {}: {}", m_.file().path(), s.error().message);
  return {};
}

Status DraftModel::draft(std::span<const Row> rows, float p_min, int64_t n_vocab_target,
                         std::vector<std::vector<int32_t>>& out) {
  out.assign(rows.size(), {});
  const bool rec = mem_->has_recurrent();
  const int64_t V = m_.config().n_vocab, B = cx_->n_batch();
  struct St {
    int64_t clen = 0;     // committed tokens: history + next
    int64_t a_next = 0;   // next position to feed in phase A
    int64_t b0 = 0;       // first position of the phase-B run (ends at clen - 1, its state kept)
    int fed = 0;          // drafts fed after the committed tokens
    int32_t last = -1;    // the last drafted token (fed next)
    bool on = false;
  };
  std::vector<St> st(rows.size());
  auto committed = [&](const Row& r, int64_t k) { return k < int64_t(r.history.size()) ? r.history[size_t(k)] : r.next; };
  // Sync: the draft memory keeps the longest prefix of the committed tokens it holds.
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.n_max <= 0) continue;
    if (r.slot < 0 || r.slot >= mem_->n_seq()) return err("draft model: slot {} outside [0, {})", r.slot, mem_->n_seq());
    St& s = st[i];
    s.on = true;
    s.clen = int64_t(r.history.size()) + 1;
    if (s.clen + r.n_max > mem_->n_ctx()) return err("draft model: slot {}: {} positions exceed its context {}", r.slot,
                                                     s.clen + r.n_max, mem_->n_ctx());
    std::vector<int32_t>& h = held_[size_t(r.slot)];
    int64_t lcp = 0;
    while (lcp < int64_t(h.size()) && lcp < s.clen && h[size_t(lcp)] == committed(r, lcp)) ++lcp;
    lcp = std::min(lcp, s.clen - 1);  // the last committed token is always fed (its logits give the first draft)
    if (lcp < int64_t(h.size())) {
      if (rec || lcp == 0) {
        mem_->seq_clear(r.slot);
        lcp = 0;
      } else {
        KILN_TRY(mem_->seq_keep(r.slot, lcp));
      }
      h.resize(size_t(lcp));
    }
    s.a_next = lcp;
    s.b0 = std::max<int64_t>(lcp, s.clen - (o_.n_max + 1));
  }
  // Phase A: what precedes the phase-B run, in chunks of the draft context's batch.
  for (;;) {
    batch_.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
      St& s = st[i];
      if (!s.on || s.a_next >= s.b0) continue;
      const int64_t n = std::min(s.b0 - s.a_next, B - batch_.size());
      for (int64_t k = 0; k < n; ++k) batch_.add(committed(rows[i], s.a_next + k), int32_t(s.a_next + k), rows[i].slot, false);
      s.a_next += n;
      if (batch_.size() >= B) break;
    }
    if (batch_.size() == 0) break;
    KILN_TRY(decode(batch_));
  }
  // Phase B: the rest of the committed tokens, the last one's state kept and its logits read.
  auto pick = [&](size_t i, int64_t row) {
    const float* lg = cx_->logits(row);
    const int64_t best = std::max_element(lg, lg + V) - lg;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(lg[v]) - double(lg[best]));
    St& s = st[i];
    if (1.0 / sum < double(p_min) || best >= n_vocab_target) {
      s.on = false;
      return;
    }
    out[i].push_back(int32_t(best));
    s.last = int32_t(best);
    if (int(out[i].size()) >= rows[i].n_max) s.on = false;
  };
  batch_.clear();
  std::vector<size_t> who;
  for (size_t i = 0; i < rows.size(); ++i) {
    St& s = st[i];
    if (!s.on) continue;
    for (int64_t p = s.b0; p < s.clen; ++p)
      batch_.add(committed(rows[i], p), int32_t(p), rows[i].slot, p + 1 == s.clen, rec && p + 1 == s.clen);
    who.push_back(i);
  }
  if (who.empty()) return {};
  KILN_TRY(decode(batch_));
  for (size_t w = 0; w < who.size(); ++w) {
    const Row& r = rows[who[w]];
    held_[size_t(r.slot)].assign(r.history.begin(), r.history.end());
    held_[size_t(r.slot)].push_back(r.next);
    pick(who[w], int64_t(w));
  }
  // Draft steps: each row's last draft at the next position.
  for (;;) {
    batch_.clear();
    who.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
      St& s = st[i];
      if (!s.on) continue;
      batch_.add(s.last, int32_t(s.clen + s.fed), rows[i].slot, true);
      ++s.fed;
      who.push_back(i);
    }
    if (who.empty()) break;
    KILN_TRY(decode(batch_));
    for (size_t w = 0; w < who.size(); ++w) pick(who[w], int64_t(w));
  }
  // Back to the committed tokens.
  for (size_t i = 0; i < rows.size(); ++i) {
    const St& s = st[i];
    if (s.fed == 0) continue;
    if (rec) KILN_TRY(mem_->seq_accept(rows[i].slot, s.clen, int(s.clen - 1 - s.b0)));
    else KILN_TRY(mem_->seq_keep(rows[i].slot, s.clen));
  }
  return {};
}

}  // namespace kiln::engine
