// engine/engine.cpp — the engine thread's scheduling: the run loop, admission and prefix reuse, the
//   step (batch building, decode, sampling, stop handling, embedding rows), finishing requests,
//   slot actions on the engine thread, published state; and the request channels' consumer side.
//   Loading and the public API are engine_load.cpp's; Impl is declared in engine_impl.h.
#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "engine/engine_impl.h"
#include "engine/slot_file.h"

namespace kiln::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "";
}

// ============================================================================================
// Channels

RequestHandle::RequestHandle(std::shared_ptr<Channel> ch) : ch_(std::move(ch)) {}

RequestHandle& RequestHandle::operator=(RequestHandle&& o) noexcept {
  if (this != &o) {
    if (ch_ && !done()) cancel();
    ch_ = std::move(o.ch_);
  }
  return *this;
}

RequestHandle::~RequestHandle() {
  if (ch_ && !done()) cancel();
}

uint64_t RequestHandle::id() const { return ch_ ? ch_->id : 0; }

std::optional<Event> RequestHandle::next(std::chrono::milliseconds timeout) {
  if (!ch_) return std::nullopt;
  std::unique_lock<std::mutex> lk(ch_->mu);
  if (ch_->final_taken) return std::nullopt;
  if (!ch_->cv.wait_for(lk, timeout, [&] { return !ch_->q.empty(); })) return std::nullopt;
  Event e = std::move(ch_->q.front());
  ch_->q.pop_front();
  if (e.final()) ch_->final_taken = true;
  return e;
}

void RequestHandle::cancel() {
  if (!ch_) return;
  ch_->cancelled.store(true);
  if (ch_->inbox) ch_->inbox->wake();
}

bool RequestHandle::done() const {
  if (!ch_) return true;
  std::lock_guard<std::mutex> lk(ch_->mu);
  return ch_->final_taken;
}

// ============================================================================================
// Engine internals

namespace {

int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return int64_t(i);
}

// What a slot's own content offers a prompt: `common`, the common prefix capped at P-1 (the last
// prompt token is always decoded: its logits give the first generated token), and `own`, the part
// usable as is (a recurrent state continues only from the slot's end, so 0 unless common is all of it).
struct SlotReuse {
  int64_t common, own;
};
SlotReuse slot_reuse(const SlotState& st, const std::vector<int32_t>& prompt, bool recurrent) {
  const int64_t common = std::min(common_prefix(st.tokens, prompt), int64_t(prompt.size()) - 1);
  return {common, recurrent && common != int64_t(st.tokens.size()) ? 0 : common};
}

}  // namespace

void Engine::Impl::take_inbox(std::unique_lock<std::mutex>& lk) {
  while (!inbox->pending.empty()) {
    auto p = std::move(inbox->pending.front());
    inbox->pending.pop_front();
    auto a = std::make_unique<Active>();
    a->ch = std::move(p.ch);
    a->req = std::move(p.req);
    a->t_submit = p.t_submit;
    waiting.push_back(std::move(a));
  }
}

void Engine::Impl::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(inbox->mu);
      if (active.empty() && waiting.empty())
        inbox->cv.wait(lk, [&] { return inbox->stop || inbox->poke || !inbox->pending.empty(); });
      inbox->poke = false;
      if (inbox->stop) break;
      take_inbox(lk);
      tasks.swap(inbox->tasks);
    }
    for (auto& t : tasks) t();  // slot actions: no step is running
    tasks.clear();
    handle_cancellations();
    const auto t0 = Clock::now();
    admit();
    publish();
    const auto t1 = Clock::now();
    if (!active.empty()) step();
    publish();
    // Debug: one line per step (where a busy server's time goes: admission, the forward, the rest).
    if (step_log.tokens > 0)
      KILN_LOG_DEBUG("step: {} tokens ({} decode, {} prompt), admit {:.2f} ms, forward {:.2f} ms, step {:.2f} ms",
                     step_log.tokens, step_log.decode, step_log.tokens - step_log.decode, ms_between(t0, t1),
                     step_log.forward_ms, ms_between(t1, Clock::now()));
    step_log = {};
  }
  // Shutdown: everything still known ends with Cancelled; queued slot actions run (they fail fast).
  {
    std::unique_lock<std::mutex> lk(inbox->mu);
    take_inbox(lk);
    tasks.swap(inbox->tasks);
  }
  for (auto& t : tasks) t();
  for (auto& a : active)
    if (!a->finished) finish(*a, FinishReason::Cancelled, Event{});
  for (auto& a : waiting) finish(*a, FinishReason::Cancelled, Event{});
  active.clear();
  waiting.clear();
  publish();
}

void Engine::Impl::handle_cancellations() {
  for (auto it = waiting.begin(); it != waiting.end();) {
    if ((*it)->ch->cancelled.load()) {
      finish(**it, FinishReason::Cancelled, Event{});
      it = waiting.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& a : active)
    if (!a->finished && a->ch->cancelled.load()) finish(*a, FinishReason::Cancelled, Event{});
  drop_finished();
}

// Slot choice: the free slot whose own content gives the longest reusable prefix; ties go to the
// least recently used slot (its content is the least likely to be wanted again).
int Engine::Impl::pick_slot(const Active& a) const {
  int best = -1;
  int64_t best_reuse = -1;
  for (int s = 0; s < int(slots.size()); ++s) {
    const SlotState& st = slots[size_t(s)];
    if (st.active) continue;
    const int64_t c = slot_reuse(st, a.req.prompt, recurrent).own;
    if (c > best_reuse || (c == best_reuse && st.last_used < slots[size_t(best)].last_used)) {
      best = s;
      best_reuse = c;
    }
  }
  return best;
}

void Engine::Impl::admit() {
  while (!waiting.empty()) {
    const int s = pick_slot(*waiting.front());
    if (s < 0) break;
    auto a = std::move(waiting.front());
    waiting.pop_front();
    prepare(*a, s);
    active.push_back(std::move(a));
  }
}

// NOTE(engine): reuse = max(own slot content, prefix cache match), both capped at P-1 (see
// slot_reuse). Restoring copies only the KV rows the slot does not already hold (rows [common, L)),
// plus the recurrent state at L.
void Engine::Impl::prepare(Active& a, int s) {
  SlotState& st = slots[size_t(s)];
  a.slot = s;
  st.active = &a;
  a.t_admit = Clock::now();
  if (a.req.embed) a.req.cache_prompt = false;  // every prompt token's hidden state is needed
  const auto& prompt = a.req.prompt;
  const int64_t P = int64_t(prompt.size());
  KILN_CHECK(runner->seq_pos(s) == int64_t(st.tokens.size()), "slot {} holds {} positions but {} tokens", s,
             runner->seq_pos(s), st.tokens.size());
  const auto [common, slot_own] = slot_reuse(st, prompt, recurrent);
  const int64_t own = a.req.cache_prompt ? slot_own : 0;
  PrefixCache::Match m;
  if (a.req.cache_prompt && cache->enabled()) m = cache->match(prompt, P - 1);
  int64_t reused;
  if (m.n_tokens > own) {
    const int64_t from = std::min(common, m.n_tokens);  // rows [0, from) are already in the slot
    if (runner->kv_bytes_per_pos() > 0)
      for (const auto& pc : m.pieces) {
        const int64_t r0 = std::max<int64_t>(0, from - pc.pos0);
        const int64_t r1 = std::min<int64_t>(pc.rows, m.n_tokens - pc.pos0);
        if (r0 < r1) runner->write_kv(s, pc.pos0, pc.kv, pc.rows, r0, r1);
      }
    if (recurrent && m.rec_dev >= 0) runner->load_rec(m.rec_dev, s);  // a device copy
    else if (recurrent) runner->write_rec(s, m.rec);
    runner->set_seq_pos(s, m.n_tokens);
    reused = m.n_tokens;
  } else {
    if (own == 0) runner->seq_clear(s);
    else if (own != runner->seq_pos(s)) {
      Status k = runner->seq_keep(s, own);
      KILN_CHECK(k.ok(), "seq_keep: {}", k.ok() ? "" : k.error().message);
    }
    reused = own;
  }
  st.tokens.assign(prompt.begin(), prompt.begin() + reused);
  a.n_past = reused;
  a.cache_n = reused;
  if (!a.req.images.empty()) image_positions(a);
  a.sampler = std::make_unique<Sampler>(a.req.sampling, runner->n_vocab());
  spec_start(a);
  a.sampler->accept(std::span<const int32_t>(prompt));
  std::sort(a.req.preserved_tokens.begin(), a.req.preserved_tokens.end());
  a.dec = std::make_unique<tokenizer::StreamDecoder>(*tok, a.req.render_special, a.req.preserved_tokens);
  if (a.req.grammar) {
    a.matcher = std::make_unique<GrammarMatcher>(grammars->get(a.req.grammar, a.req.preserved_tokens, std::move(a.req.prepared_grammar)));
    a.grammar_on = a.req.grammar_trigger.empty();
  }
  if (recurrent && a.req.cache_prompt && cache->enabled()) {
    for (int64_t p : a.req.snapshot_at)
      if (p > reused && p < P) a.cuts.push_back(p);
    // After each image (and the token closing it): a follow-up question about the same image
    // resumes there instead of encoding and prefilling it again.
    for (const ImageInput& im : a.req.images)
      if (int64_t p = im.pos + int64_t(im.nx) * im.ny + 1; p > reused && p < P) a.cuts.push_back(p);
    if (eng.opt_.snapshot_before_control) {
      // Turn starts: later occurrences of the prompt's first control token ("<|im_start|>",
      // "<|start_header_id|>"). Keep the first two (end of the system message, of the first user
      // message) and the last two (before the last user message and the assistant header).
      std::vector<int64_t> starts;
      int32_t marker = -1;
      for (int64_t p = 0; p < P; ++p) {
        const int32_t t = prompt[size_t(p)];
        if (marker < 0 && tok->is_control(t)) marker = t;
        else if (t == marker) starts.push_back(p);
      }
      for (size_t i = 0; i < starts.size(); ++i)
        if ((i < 2 || i + 2 >= starts.size()) && starts[i] > reused) a.cuts.push_back(starts[i]);
    }
    // Where the prompt leaves what is cached: a state there lets the next prompt sharing that prefix
    // (a common document or instruction before differing questions) resume instead of recomputing it;
    // not for a few shared tokens ("Request " before unique texts), whose state would cost more to keep
    // than the tokens cost to recompute.
    if (const int64_t d = cache->shared_prefix(prompt); d >= reused + kMinSharedSnapshot && d < P) a.cuts.push_back(d);
    for (int64_t p = (reused / snap_interval + 1) * snap_interval; p < P; p += snap_interval) a.cuts.push_back(p);
    std::sort(a.cuts.begin(), a.cuts.end());
    a.cuts.erase(std::unique(a.cuts.begin(), a.cuts.end()), a.cuts.end());
  }
  KILN_LOG_DEBUG("slot {} | request {} | prompt {} tokens, reused {} (own {}, cache {})", s, a.ch->id, P, reused,
                 own, m.n_tokens);
}

void Engine::Impl::cache_insert(const Active& a, bool end_of_turn) {
  if (!a.req.cache_prompt || !cache->enabled()) return;
  const SlotState& st = slots[size_t(a.slot)];
  if (st.tokens.empty()) return;
  const int s = a.slot;
  const int one[] = {s};
  mtp_flush(one);  // the cached rows must be complete
  const PrefixCache::StateSource rec{[&](float* out) { runner->read_rec(s, out); },
                                     [&](int i) { runner->save_rec(s, i); }};
  cache->insert(st.tokens, [&](int64_t p0, int64_t n, uint8_t* out) { runner->read_kv(s, p0, n, out); },
                recurrent ? &rec : nullptr, end_of_turn);
}

// M-RoPE positions of the prompt (llama.cpp's mtmd): text tokens advance by one; an image of
// nx x ny tokens at text position p0 gives (p0, p0 + y, p0 + x) and the text continues at
// p0 + max(nx, ny). Generated tokens continue from mpos_end.
void Engine::Impl::image_positions(Active& a) {
  const auto& imgs = a.req.images;
  const int64_t P = int64_t(a.req.prompt.size());
  a.mpos.assign(size_t(3 * P), 0);
  a.img_embd.assign(imgs.size(), model::ImageEmbedding{});
  a.img_jobs.resize(imgs.size());
  int32_t p = 0;
  size_t k = 0;
  for (int64_t i = 0; i < P;) {
    if (k < imgs.size() && i == imgs[k].pos) {
      const ImageInput& im = imgs[k++];
      for (int y = 0; y < im.ny; ++y)
        for (int x = 0; x < im.nx; ++x, ++i) {
          a.mpos[size_t(3 * i)] = p;
          a.mpos[size_t(3 * i + 1)] = p + y;
          a.mpos[size_t(3 * i + 2)] = p + x;
        }
      p += std::max(im.nx, im.ny);
      continue;
    }
    for (int c = 0; c < 3; ++c) a.mpos[size_t(3 * i + c)] = p;
    ++p, ++i;
  }
  a.mpos_end = p;
}

Status Engine::Impl::image_ready(Active& a, int64_t p0, int64_t& n) {
  const auto& imgs = a.req.images;
  for (size_t k = 0; k < imgs.size(); ++k) {
    const ImageInput& im = imgs[k];
    const int64_t nt = int64_t(im.nx) * im.ny;
    if (im.pos + nt <= p0 || !a.img_embd[k].data.empty()) continue;  // prefilled (or cached) / encoded
    // Not encoded yet: start it and every later image (they run one after another, off this thread).
    for (size_t j = k; j < imgs.size(); ++j) {
      if (a.img_jobs[j].valid() || !a.img_embd[j].data.empty()) continue;
      const ImageInput& ij = imgs[j];
      a.img_jobs[j] = std::async(std::launch::async, [this, chw = ij.chw, w = ij.w, h = ij.h, slot = a.slot, j] {
        std::lock_guard<std::mutex> lk(vision_mu);
        const auto t0 = Clock::now();
        auto r = vision_enc->encode(chw->data(), w, h);
        if (r.ok())
          KILN_LOG_INFO("slot {} | image {} ({}x{} px, {} tokens) encoded in {:.1f} ms", slot, j, w, h,
                        int64_t(r->nx) * r->ny, ms_between(t0, Clock::now()));
        return r;
      });
    }
    auto& job = a.img_jobs[k];
    if (job.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      n = std::min(n, std::max<int64_t>(0, im.pos - p0));  // the text before it goes on
      return {};
    }
    auto r = job.get();
    if (!r.ok()) return err("image {}: {}", k, r.error().message);
    if (r->nx != im.nx || r->ny != im.ny) return err("image {}: {}x{} tokens, expected {}x{}", k, r->nx, r->ny, im.nx, im.ny);
    a.img_embd[k] = std::move(*r);
  }
  return {};
}

void Engine::Impl::image_rows(const Active& a, int64_t p0, int64_t n, std::vector<const float*>& out) const {
  const auto& imgs = a.req.images;
  for (int64_t i = p0; i < p0 + n; ++i) {
    const float* row = nullptr;
    for (size_t k = 0; k < imgs.size(); ++k) {
      const ImageInput& im = imgs[k];
      if (i < im.pos || i >= im.pos + int64_t(im.nx) * im.ny) continue;
      row = a.img_embd[k].data.data() + size_t(i - im.pos) * size_t(vision->config().n_out);
      break;
    }
    out.push_back(row);
  }
}

void Engine::Impl::step() {
  batch.clear();
  int64_t budget = step_tokens;
  int64_t row = 0;
  int64_t generating = 0;
  for (auto& a : active) generating += a->prompt_done ? 1 : 0;
  bool images = false;  // a request with images takes part: every token gets embd / mpos entries
  for (auto& a : active)
    if (!a->req.images.empty() && (a->prompt_done || budget > 0)) images = true;
  auto add_mpos = [&](const Active& a, int64_t i) {  // prompt index i, or a generated position when >= P
    const int64_t P = int64_t(a.req.prompt.size());
    if (a.req.images.empty()) {
      for (int c = 0; c < 3; ++c) batch.mpos.push_back(int32_t(i));
    } else if (i < P) {
      for (int c = 0; c < 3; ++c) batch.mpos.push_back(a.mpos[size_t(3 * i + c)]);
    } else {
      for (int c = 0; c < 3; ++c) batch.mpos.push_back(int32_t(a.mpos_end + (i - P)));
    }
  };
  // Speculative decoding (engine_spec.cpp): the run [next_token, draft...], every token an output
  // row, the recurrent state kept after each but the last; drafts leave a token for every other
  // generating request.
  make_drafts(budget, generating);
  for (auto& a : active) {
    a->step_n = 0;
    a->out_row = -1;
    if (!a->prompt_done) continue;
    const int64_t k = int64_t(a->draft.size());
    batch.add(a->next_token, int32_t(a->n_past), a->slot, true, k > 0);
    for (int64_t i = 0; i < k; ++i) batch.add(a->draft[size_t(i)], int32_t(a->n_past + 1 + i), a->slot, true, i + 1 < k);
    if (images)
      for (int64_t i = 0; i <= k; ++i) {
        batch.embd.push_back(nullptr);
        add_mpos(*a, a->n_past + i);
      }
    a->step_n = 1 + k;
    a->out_row = row;
    row += 1 + k;
    budget -= 1 + k;
  }
  bool waiting_image = false;  // a prompt waits for an image's encoding
  for (auto& a : active) {
    if (a->prompt_done || budget <= 0) continue;
    const auto& prompt = a->req.prompt;
    const int64_t P = int64_t(prompt.size());
    int64_t n = std::min(P - a->n_past, budget);
    {
      auto it = std::upper_bound(a->cuts.begin(), a->cuts.end(), a->n_past);
      if (it != a->cuts.end()) n = std::min(n, *it - a->n_past);
    }
    if (!a->req.images.empty()) {
      if (Status is = image_ready(*a, a->n_past, n); !is.ok()) {
        runner->seq_clear(a->slot);
        slots[size_t(a->slot)].tokens.clear();
        a->n_past = 0;
        a->req.cache_prompt = false;
        finish(*a, FinishReason::Error, Event{}, is.error().message);
        continue;
      }
      if (n == 0) {  // its next image is still being encoded: the other slots go on
        waiting_image = true;
        continue;
      }
    }
    if (images) {
      image_rows(*a, a->n_past, n, batch.embd);
      for (int64_t i = a->n_past; i < a->n_past + n; ++i) add_mpos(*a, i);
    }
    const bool last = a->n_past + n == P;
    batch.add_run(std::span<const int32_t>(prompt).subspan(size_t(a->n_past), size_t(n)), int32_t(a->n_past),
                  a->slot, a->req.embed, last);
    a->step_n = n;
    if (a->req.embed) a->out_row = row, row += n;  // every token's row
    else if (last) a->out_row = row++;
    budget -= n;
  }
  if (batch.size() == 0) {
    drop_finished();
    // Only image encodings to wait for: the first of them, briefly (new requests are looked at between).
    if (waiting_image)
      for (auto& a : active)
        for (auto& f : a->img_jobs)
          if (f.valid()) {
            f.wait_for(std::chrono::milliseconds(2));
            return;
          }
    return;
  }

  mtp_schedule();
  const auto tf = Clock::now();
  Status st = runner->decode(batch);
  if (spdlog::should_log(spdlog::level::debug)) {  // for run()'s debug line
    step_log = {batch.size(), 0, ms_between(tf, Clock::now())};
    for (auto& a : active) step_log.decode += a->prompt_done ? a->step_n : 0;
  }
  {
    std::lock_guard<std::mutex> lk(pub_mu);
    metrics.decode_calls++;
    int busy = 0;
    for (auto& s : slots) busy += s.active ? 1 : 0;
    metrics.busy_slot_steps += uint64_t(busy);
  }
  if (!st.ok()) {
    KILN_LOG_ERROR("decode failed: {}", st.error().message);
    for (auto& a : active) {
      if (a->step_n == 0) continue;
      SlotState& ss = slots[size_t(a->slot)];
      runner->seq_clear(a->slot);
      ss.tokens.clear();
      a->n_past = 0;
      a->req.cache_prompt = false;  // nothing valid to cache
      finish(*a, FinishReason::Error, Event{}, "decode failed: " + st.error().message);
    }
    drop_finished();
    return;
  }

  for (auto& ap : active) {
    Active& a = *ap;
    if (a.step_n == 0) continue;
    SlotState& ss = slots[size_t(a.slot)];
    if (a.prompt_done) {
      verify(a);  // the decode token, and the draft's tokens while they are accepted
      continue;
    }
    const auto& prompt = a.req.prompt;
    if (a.req.embed && !embed_rows(a)) continue;
    ss.tokens.insert(ss.tokens.end(), prompt.begin() + a.n_past, prompt.begin() + a.n_past + a.step_n);
    a.n_past += a.step_n;
    if (a.n_past == int64_t(prompt.size())) {
      a.prompt_done = true;
      a.t_prompt_done = Clock::now();
      if (a.req.embed) {
        Event ev;
        if (a.req.pooling == Pooling::Mean)
          for (float& v : a.embd) v /= float(prompt.size());
        ev.embedding = std::move(a.embd);
        finish(a, FinishReason::Stop, std::move(ev));
        continue;
      }
      cache_insert(a, true);  // end of prompt: blocks, tail and (hybrid) the state here
      if (a.req.max_tokens == 0) {
        finish(a, FinishReason::Length, Event{});
        continue;
      }
      process_token(a, sample_row(a, a.out_row), a.out_row);
    } else if (!recurrent) {
      cache_insert(a, false);  // full blocks so far (concurrent requests can share them)
    } else if (std::binary_search(a.cuts.begin(), a.cuts.end(), a.n_past)) {
      cache_insert(a, false);  // hybrid: a snapshot point inside the prompt
    }
  }
  drop_finished();
}

// Takes this step's hidden states of an embedding request into a.embd (rows out_row.. of its
// step_n prompt tokens at positions n_past..). false: the runner keeps none (the request failed).
bool Engine::Impl::embed_rows(Active& a) {
  const int64_t E = eng.info_.n_embd;
  if (runner->embedding(a.out_row) == nullptr) {
    finish(a, FinishReason::Error, Event{}, "embeddings are off: start the server with --embedding");
    return false;
  }
  for (int64_t i = 0; i < a.step_n; ++i) {
    const float* h = runner->embedding(a.out_row + i);
    const int64_t p = a.n_past + i;  // prompt position of this row
    switch (a.req.pooling) {
      case Pooling::None: a.embd.insert(a.embd.end(), h, h + E); break;
      case Pooling::Mean:
        if (a.embd.empty()) a.embd.assign(size_t(E), 0.f);
        for (int64_t e = 0; e < E; ++e) a.embd[size_t(e)] += h[e];
        break;
      case Pooling::Cls:
        if (p == 0) a.embd.assign(h, h + E);
        break;
      case Pooling::Last:
        if (p + 1 == int64_t(a.req.prompt.size())) a.embd.assign(h, h + E);
        break;
    }
  }
  return true;
}

// A slot action (Engine::slot_action), on the engine thread between steps.
Result<Engine::SlotActionResult> Engine::Impl::slot_action(SlotAction action, int s, const std::string& path) {
  const auto t0 = Clock::now();
  if (s < 0 || s >= int(slots.size())) return err("slot {} does not exist ({} slots)", s, slots.size());
  SlotState& st = slots[size_t(s)];
  if (st.active) return err("slot {} is busy", s);
  const ModelInfo& mi = eng.info_;
  SlotFingerprint fp{mi.arch, mi.n_vocab, mi.n_embd, mi.n_layer, mi.n_params_bytes, runner->kv_bytes_per_pos(),
                     runner->rec_floats()};
  SlotActionResult r;
  if (action == SlotAction::Erase) {
    r.n_tokens = int64_t(st.tokens.size());
    runner->seq_clear(s);
    st.tokens.clear();
  } else if (action == SlotAction::Save) {
    const int one[] = {s};
    mtp_flush(one);  // the saved rows must be complete
    SlotFile f;
    f.fp = fp;
    f.tokens = st.tokens;
    const int64_t n = int64_t(f.tokens.size());
    f.kv.resize(size_t(n) * fp.kv_bytes_per_pos);
    if (!f.kv.empty()) runner->read_kv(s, 0, n, f.kv.data());
    f.rec.resize(fp.rec_floats);
    if (!f.rec.empty()) runner->read_rec(s, f.rec.data());
    auto w = write_slot_file(path, f);
    KILN_TRY(w);
    r.n_tokens = n;
    r.n_bytes = *w;
  } else {
    uint64_t nb = 0;
    auto f = read_slot_file(path, &nb);
    KILN_TRY(f);
    if (const std::string m = fingerprint_mismatch(f->fp, fp); !m.empty())
      return err("{}: saved for another model or cache layout: {}", path, m);
    const int64_t n = int64_t(f->tokens.size());
    if (n > runner->n_ctx()) return err("{}: {} tokens do not fit the slot's {} positions", path, n, runner->n_ctx());
    runner->seq_clear(s);
    if (!f->kv.empty()) runner->write_kv(s, 0, f->kv.data(), n, 0, n);
    if (!f->rec.empty()) runner->write_rec(s, f->rec.data());
    runner->set_seq_pos(s, n);
    st.tokens = std::move(f->tokens);
    r.n_tokens = n;
    r.n_bytes = nb;
  }
  st.last_used = ++clock;
  publish();
  r.ms = ms_between(t0, Clock::now());
  return r;
}

// The token for output row `row` of the last decode: from the row's top logits where the request's
// chain needs no more (no grammar mask, no log-probabilities, Sampler::can_sample_top: on a GPU only
// those were downloaded), else from the whole row.
int32_t Engine::Impl::sample_row(Active& a, int64_t row) {
  model::Context::TopLogits top;
  if (!(a.matcher && a.grammar_on) && a.req.n_probs == 0 && runner->top_logits(row, top) &&
      a.sampler->can_sample_top(top.n))
    return a.sampler->sample_top(top.id, top.logit, top.n);
  return sample(a, runner->logits(row));
}

// The next token; when a grammar applies, its mask bans what it rejects. -1: it allows nothing.
int32_t Engine::Impl::sample(Active& a, const float* logits) {
  if (!a.matcher || !a.grammar_on) return a.sampler->sample(logits);
  const uint64_t* m = a.matcher->mask();
  const size_t words = size_t(runner->n_vocab() + 63) / 64;
  bool any = false;
  for (size_t w = 0; w < words && !any; ++w) any = m[w] != 0;
  return any ? a.sampler->sample(logits, m) : -1;
}

// Feeds token t to the request's grammar (or watches for its trigger). false: the grammar rejects
// the output (the request fails). done: the grammar is complete and nothing may follow.
bool Engine::Impl::grammar_step(Active& a, int32_t t, bool& done) {
  done = false;
  if (!a.matcher) return true;
  if (a.grammar_on) {
    if (is_eog(t)) return a.matcher->can_end();
    if (!a.matcher->accept_token(t)) return false;
    done = a.matcher->done();
    return true;
  }
  const std::string& trig = a.req.grammar_trigger;
  a.trig_buf += tok->token_to_piece(t, true);
  const size_t p = a.trig_buf.find(trig);
  if (p == std::string::npos) {
    if (a.trig_buf.size() >= trig.size()) a.trig_buf.erase(0, a.trig_buf.size() - (trig.size() - 1));
    return true;
  }
  a.grammar_on = true;
  std::string rest = a.trig_buf.substr(p + trig.size());
  a.trig_buf.clear();
  if (!a.matcher->accept_bytes(rest)) {
    // Whitespace right after the trigger ("</think>\n\n") is not part of the constrained answer.
    const size_t k = rest.find_first_not_of(" \t\r\n");
    if (!a.matcher->accept_bytes(k == std::string::npos ? std::string() : rest.substr(k))) return false;
  }
  done = a.matcher->done();
  return true;
}

void Engine::Impl::process_token(Active& a, int32_t t, int64_t row) {
  if (t < 0) {
    finish(a, FinishReason::Error, Event{}, "grammar: no token of the vocabulary can continue the output");
    return;
  }
  bool grammar_done = false;
  if (!grammar_step(a, t, grammar_done)) {
    finish(a, FinishReason::Error, Event{}, fmt::format("grammar: token {} does not continue the output", t));
    return;
  }
  a.n_decoded++;
  Event ev;
  TokenOut to;
  to.id = t;
  to.piece = tok->token_to_piece(
      t, a.req.render_special || std::binary_search(a.req.preserved_tokens.begin(), a.req.preserved_tokens.end(), t));
  if (a.req.n_probs != 0)
    to.logprob = Sampler::logprob_of(runner->logits(row), runner->n_vocab(), t, std::max(0, a.req.n_probs), &to.top);
  a.sampler->accept(t);
  ev.tokens.push_back(std::move(to));

  const bool stop_tok = std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), t) != a.req.stop_tokens.end();
  // With a grammar, an end-of-generation token is allowed only where the grammar is complete: it ends.
  if ((is_eog(t) && (!a.req.ignore_eos || (a.matcher && a.grammar_on))) || stop_tok) {
    ev.text = a.held + a.dec->flush();
    a.held.clear();
    finish(a, FinishReason::Stop, std::move(ev));
    return;
  }
  a.held += a.dec->push(t);
  // Earliest stop string in the held text.
  size_t best = std::string::npos;
  const std::string* word = nullptr;
  for (const auto& s : a.req.stop) {
    if (s.empty()) continue;
    const size_t p = a.held.find(s);
    if (p != std::string::npos && (best == std::string::npos || p < best)) {
      best = p;
      word = &s;
    }
  }
  if (word) {
    ev.text = a.held.substr(0, best);
    ev.stop_word = *word;
    a.held.clear();
    finish(a, FinishReason::Stop, std::move(ev));
    return;
  }
  if (grammar_done) {  // the grammar is complete and allows nothing more: stop as on an end token
    ev.text = a.held + a.dec->flush();
    a.held.clear();
    finish(a, FinishReason::Stop, std::move(ev));
    return;
  }
  // Hold back the longest suffix that could begin a stop string.
  size_t hold = 0;
  for (const auto& s : a.req.stop)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), a.held.size()); k > hold; --k)
      if (a.held.compare(a.held.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  ev.text = a.held.substr(0, a.held.size() - hold);
  a.held.erase(0, a.held.size() - hold);

  const bool out_of_tokens = a.req.max_tokens >= 0 && a.n_decoded >= a.req.max_tokens;
  const bool out_of_ctx = a.n_past + 1 > n_ctx_slot;  // no room to feed this token
  if (out_of_tokens || out_of_ctx) {
    ev.text += a.held + a.dec->flush();
    a.held.clear();
    finish(a, FinishReason::Length, std::move(ev));
    return;
  }
  a.next_token = t;
  a.ch->push(std::move(ev));
}

void Engine::Impl::finish(Active& a, FinishReason r, Event ev, const std::string& error) {
  settle(a);  // a speculative verify in progress: the memory as of the last emitted token
  const auto now = Clock::now();
  ev.finish = r;
  ev.error = error;
  const int64_t P = int64_t(a.req.prompt.size());
  Timings& tm = ev.timings;
  tm.cache_n = a.cache_n;
  tm.queue_ms = a.slot >= 0 ? ms_between(a.t_submit, a.t_admit) : ms_between(a.t_submit, now);
  if (a.slot >= 0) {
    tm.prompt_n = (a.prompt_done ? P : a.n_past) - a.cache_n;
    tm.prompt_ms = ms_between(a.t_admit, a.prompt_done ? a.t_prompt_done : now);
    tm.predicted_n = a.n_decoded;
    tm.predicted_ms = a.prompt_done ? ms_between(a.t_prompt_done, now) : 0;
    tm.draft_n = a.spec.draft_n;
    tm.draft_n_accepted = a.spec.draft_n_accepted;
    if (r != FinishReason::Error) cache_insert(a, true);  // end of the turn: the next one starts here
    SlotState& st = slots[size_t(a.slot)];
    st.active = nullptr;
    st.last_used = ++clock;
  }
  a.finished = true;
  {
    std::lock_guard<std::mutex> lk(pub_mu);
    metrics.requests_finished++;
    if (r == FinishReason::Cancelled) metrics.requests_cancelled++;
    if (r == FinishReason::Error) metrics.requests_failed++;
    metrics.prompt_tokens += uint64_t(std::max<int64_t>(0, tm.prompt_n));
    metrics.prompt_seconds += tm.prompt_ms / 1000.0;
    metrics.predicted_tokens += uint64_t(tm.predicted_n);
    metrics.predicted_seconds += tm.predicted_ms / 1000.0;
    if (a.cache_n > 0) metrics.cache_requests_hit++;
    metrics.cache_tokens_reused += uint64_t(a.cache_n);
  }
  if (a.slot >= 0) {
    const double pps = tm.prompt_ms > 0 ? 1000.0 * double(tm.prompt_n) / tm.prompt_ms : 0;
    const double tps = tm.predicted_ms > 0 ? 1000.0 * double(tm.predicted_n) / tm.predicted_ms : 0;
    KILN_LOG_INFO("slot {} | request {} | prompt eval time = {:.2f} ms / {} tokens ({:.2f} tokens per second), "
                  "cached {}", a.slot, a.ch->id, tm.prompt_ms, tm.prompt_n, pps, tm.cache_n);
    KILN_LOG_INFO("slot {} | request {} |        eval time = {:.2f} ms / {} tokens ({:.2f} tokens per second)",
                  a.slot, a.ch->id, tm.predicted_ms, tm.predicted_n, tps);
    KILN_LOG_INFO("slot {} | request {} |       total time = {:.2f} ms / {} tokens, finish: {}", a.slot, a.ch->id,
                  tm.prompt_ms + tm.predicted_ms, tm.prompt_n + tm.predicted_n, finish_reason_name(r));
    if (a.spec.draft_runs > 0)
      KILN_LOG_INFO("slot {} | request {} |  draft: {} passes, {:.2f} ms ({:.3f} ms each), {} drafted, {} accepted",
                    a.slot, a.ch->id, a.spec.draft_runs, a.spec.draft_ms, a.spec.draft_ms / double(a.spec.draft_runs),
                    a.spec.draft_n, a.spec.draft_n_accepted);
  }
  publish();  // the slot is free (and counted so) before the consumer sees the final event
  a.ch->push(std::move(ev));
}

void Engine::Impl::publish() {
  std::vector<SlotInfo> info(slots.size());
  int busy = 0;
  int64_t max_past = 0;
  for (size_t s = 0; s < slots.size(); ++s) {
    SlotInfo& si = info[s];
    si.id = int(s);
    si.n_ctx = n_ctx_slot;
    si.n_past = int64_t(slots[s].tokens.size());
    max_past = std::max(max_past, si.n_past);
    if (const Active* a = slots[s].active) {
      si.busy = true;
      ++busy;
      si.request_id = a->ch->id;
      si.n_prompt = int64_t(a->req.prompt.size());
      si.n_decoded = a->n_decoded;
      si.cache_n = a->cache_n;
      si.draft_n = a->spec.draft_n;
      si.draft_n_accepted = a->spec.draft_n_accepted;
    }
  }
  if (cache->version() != cache_version) {  // version 0: empty, as cs starts
    cs = cache->stats();
    cache_version = cache->version();
  }
  std::lock_guard<std::mutex> lk(pub_mu);
  slot_info = std::move(info);
  metrics.busy_slots = busy;
  metrics.queue_length = int(waiting.size());
  metrics.max_tokens_seen = std::max(metrics.max_tokens_seen, max_past);
  metrics.cache_bytes = uint64_t(cs.bytes);
  metrics.cache_entries = uint64_t(cs.n_nodes + cs.n_tails);
  metrics.cache_states = uint64_t(cs.n_states);
  metrics.cache_evictions = uint64_t(cs.evictions);
}

}  // namespace kiln::engine
