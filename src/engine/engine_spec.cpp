// engine/engine_spec.cpp — speculative decoding in the scheduler (Engine::Impl's spec_* methods):
//   drafting before a step, verification after it, and the rollback of rejected tokens.
// A generating request with a draft d0..d(k-1) feeds the run [next_token, d0, ..., d(k-1)] (every
//   token an output row; the recurrent state kept after each of the first k tokens). After the
//   decode, position i's logits are sampled as usual (penalties, grammar mask, temperature: the
//   request's own Sampler, one draw per emitted token); the draft token is accepted when the sample
//   equals it. The first mismatch (or position k) emits the sample and ends the verification.
//   Because the drafters are deterministic (a point-mass draft distribution), "accept iff the target's
//   own sample equals the draft" is exactly speculative sampling's rule, so the emitted tokens follow
//   the target distribution; with the same seed they are the very tokens plain decoding emits.
//   The memory is then rolled back to the last accepted token (Runner::seq_accept: the attention KV
//   length and a switch of recurrent state slots), once, before anything reads it (settle()).
// Synthetic acceptance (--spec-synth-*, benchmarking): position i < k is accepted with the curve's
//   conditional probability instead, emitting the draft token (the output is not the model's; a
//   request's grammar still holds: finish_draft cuts the draft where it rejects a token).
// Must not: see JSON or HTTP. Threading: the engine thread only.
#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "engine/engine_impl.h"

namespace kiln::engine {

void Engine::Impl::spec_start(Active& a) {
  const SpecOptions& so = eng.opt_.spec;
  const uint32_t seed = a.req.sampling.seed == 0xFFFFFFFFu ? std::random_device{}() : a.req.sampling.seed;
  a.spec.start(so.n_max, seed ^ 0x5bd1e995u);
}

// Every generating request's draft for this step (a.draft), in admission order: request i's at most
// budget - 1 - (the generating requests after it) tokens, less what the drafts before it took. The
// MTP drafter and the draft model run once for all of them (one batched pass per draft position).
void Engine::Impl::make_drafts(int64_t budget, int64_t generating) {
  const SpecOptions& so = eng.opt_.spec;
  std::vector<model::Context::MtpRow> rows;
  std::vector<DraftModel::Row> drows;
  std::vector<Active*> who;
  for (auto& ap : active) {
    Active& a = *ap;
    a.draft.clear();
    if (!a.prompt_done) continue;
    --generating;
    // Requests with images do not draft (their positions are M-RoPE streams the drafters do not follow).
    a.mtp_idle = !a.req.images.empty();
    const int64_t k = a.req.images.empty() ? draft_len(a, budget - 1 - generating) : 0;
    if (so.type == SpecType::NgramSimple && k > 0) {
      std::vector<int32_t>& h = slots[size_t(a.slot)].tokens;
      h.push_back(a.next_token);
      a.draft = ngram_draft(h, so.ngram_n, int(k));
      h.pop_back();
      finish_draft(a);
    } else if (so.type == SpecType::DraftMtp && k > 0) {
      rows.push_back({int32_t(a.slot), a.next_token, int(k)});
      who.push_back(&a);
    } else if (so.type == SpecType::DraftSimple && k > 0) {
      drows.push_back({a.slot, slots[size_t(a.slot)].tokens, a.next_token, int(k)});
      who.push_back(&a);
    }
    budget -= 1 + (so.type == SpecType::NgramSimple ? int64_t(a.draft.size()) : k);
  }
  if (who.empty()) return;
  if (so.type == SpecType::DraftMtp) {  // the drafter reads every earlier position's MTP row
    std::vector<int> ss;
    for (const auto& r : rows) ss.push_back(r.seq);
    mtp_flush(ss);
  }
  std::vector<std::vector<int32_t>> out;
  const auto t0 = std::chrono::steady_clock::now();
  // Synthetic acceptance measures the verification at a given acceptance: the drafters draft their
  // whole length whatever their confidence (as llama.cpp's --spec-synth-* do).
  const float p_min = synth.empty() ? so.p_min : 0.0f;
  Status s = so.type == SpecType::DraftMtp ? runner->draft_mtp(rows, p_min, out)
                                           : drafter->draft(drows, p_min, runner->n_vocab(), out);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) {
    KILN_LOG_ERROR("{} draft: {}", spec_type_name(so.type), s.error().message);
    return;  // the step decodes without drafts
  }
  for (size_t i = 0; i < who.size(); ++i) {
    Active& a = *who[i];
    a.draft = std::move(out[i]);
    finish_draft(a);
    a.spec.draft_runs++;
    a.spec.draft_ms += ms / double(who.size());
    if (a.draft.empty()) a.spec.empty_draft(synth.empty());
  }
}

// The most draft tokens request a may verify this step (0: none), at most `cap`.
int64_t Engine::Impl::draft_len(Active& a, int64_t cap) {
  const SpecOptions& so = eng.opt_.spec;
  if (!so.on() || a.req.embed) return 0;
  if (a.spec.pause > 0) {
    --a.spec.pause;
    a.mtp_idle = true;
    return 0;
  }
  int64_t k = std::min<int64_t>(synth.empty() ? a.spec.k : so.n_max, cap);
  k = std::min<int64_t>(k, n_ctx_slot - a.n_past - 1);  // every fed position must fit the slot
  if (a.req.max_tokens >= 0) k = std::min<int64_t>(k, a.req.max_tokens - a.n_decoded - 1);
  return std::max<int64_t>(k, 0);
}

void Engine::Impl::finish_draft(Active& a) {
  const SpecOptions& so = eng.opt_.spec;
  // Drafts end at an end-of-generation token, and where the request's grammar rejects a token
  // (they could never be accepted).
  for (size_t i = 0; i < a.draft.size(); ++i)
    if (is_eog(a.draft[i])) {
      a.draft.resize(i + 1);
      break;
    }
  // Plain verification would reject such a token anyway (the target's sample is masked); synthetic
  // acceptance emits draft tokens without sampling them, so there the cut is what keeps the output in
  // the grammar's language. Before a grammar's trigger, a synthetic draft also ends before the token
  // that would complete the trigger (the target's own sample decides it, and the grammar from there).
  if (a.matcher && (a.grammar_on || !synth.empty())) {
    GrammarMatcher m = *a.matcher;  // already past next_token (process_token fed it)
    std::string buf = a.trig_buf;
    const std::string& trig = a.req.grammar_trigger;
    for (size_t i = 0; i < a.draft.size(); ++i) {
      const int32_t t = a.draft[i];
      if (!a.grammar_on) {
        buf += tok->token_to_piece(t, true);
        if (buf.find(trig) == std::string::npos) continue;
      } else if (is_eog(t) ? m.can_end() : m.accept_token(t)) {
        continue;
      }
      a.draft.resize(i);
      break;
    }
  }
  if (int(a.draft.size()) < std::max(1, so.n_min)) a.draft.clear();
}

// After the decode: sample the run's rows in order, accept the matching drafts, emit the first
// mismatch (or the bonus token after a fully accepted draft), roll the memory back.
void Engine::Impl::verify(Active& a) {
  SlotState& ss = slots[size_t(a.slot)];
  const int64_t n0 = a.n_past;
  const int k = int(a.draft.size());
  int accepted = 0;
  a.spec.draft_n += k;
  if (k > 0) {
    std::lock_guard<std::mutex> lk(pub_mu);
    metrics.draft_tokens += uint64_t(k);
  }
  for (int i = 0; i <= k; ++i) {
    ss.tokens.push_back(i == 0 ? a.next_token : a.draft[size_t(i - 1)]);
    a.n_past = n0 + 1 + i;
    if (k > 0) a.pend = {true, a.n_past, i == k ? -1 : i};  // the memory as of this token
    int32_t t = sample_row(a, a.out_row + i);
    bool acc = false;
    if (i < k) {
      if (!synth.empty()) {
        acc = std::uniform_real_distribution<double>(0.0, 1.0)(a.spec.rng) < synth[size_t(i)];
        if (acc) t = a.draft[size_t(i)];
      } else {
        acc = t == a.draft[size_t(i)];
      }
    }
    if (acc) {
      ++accepted;
      ++a.spec.draft_n_accepted;
      std::lock_guard<std::mutex> lk(pub_mu);
      metrics.draft_tokens_accepted++;
    }
    process_token(a, t, a.out_row + i);  // may finish the request (finish() settles first)
    if (a.finished || !acc) break;
  }
  settle(a);
  a.spec.update(k, accepted, eng.opt_.spec.n_max, synth.empty());
}

// A step may defer the MTP catch-up (model::Batch::mtp_defer) when every token in it is the decode
// token of a request that drafts nothing this step for a pause or its images: at zero acceptance the
// paused steps then cost what plain decoding costs, and the rows are caught up in one pass before the
// next draft. Any other step (prompt tokens, drafts) first catches up the slots it feeds, since a
// decode's catch-up only extends complete rows; a slot whose pending rows would outgrow the Memory's
// ring is caught up before it defers more.
void Engine::Impl::mtp_schedule() {
  if (eng.opt_.spec.type != SpecType::DraftMtp || !runner->has_mtp()) return;
  bool defer = true;
  for (const auto& a : active)
    if (a->step_n > 0 && (!a->prompt_done || !a->draft.empty() || !a->mtp_idle)) defer = false;
  std::vector<int> ss;
  for (const auto& a : active)
    if (a->step_n > 0) {
      const int64_t n = runner->mtp_pending(a->slot);
      if (n > 0 && (!defer || n + a->step_n >= model::Memory::kMtpRing)) ss.push_back(a->slot);
    }
  mtp_flush(ss);
  batch.mtp_defer = defer;
  if (defer) {
    std::lock_guard<std::mutex> lk(pub_mu);
    metrics.mtp_deferred_steps++;
  }
}

void Engine::Impl::mtp_flush(std::span<const int> ss) {
  std::vector<int32_t> fs;
  std::vector<std::span<const int32_t>> toks;
  for (const int s : ss)
    if (runner->mtp_pending(s) > 0) {
      fs.push_back(s);
      toks.emplace_back(slots[size_t(s)].tokens);
    }
  if (fs.empty()) return;
  if (Status st = runner->mtp_flush(fs, toks); !st.ok()) {  // then the drafts fail too: plain decoding goes on
    KILN_LOG_ERROR("draft-mtp catch-up: {}", st.error().message);
    return;
  }
  std::lock_guard<std::mutex> lk(pub_mu);
  metrics.mtp_flushes++;
}

void Engine::Impl::settle(Active& a) {
  if (!a.pend.on) return;
  a.pend.on = false;
  Status s = runner->seq_accept(a.slot, a.pend.n_pos, a.pend.kept);
  KILN_CHECK(s.ok(), "speculative rollback of slot {}: {}", a.slot, s.ok() ? "" : s.error().message);
}

}  // namespace kiln::engine
