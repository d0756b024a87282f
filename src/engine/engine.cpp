// Engine: the engine thread, admission + prefix reuse, the step loop (batch building, decode,
// sampling, stop handling), request channels, metrics.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>

#include "core/log.h"
#include "engine/grammar_matcher.h"
#include "engine/prefix_cache.h"
#include "engine/slot_file.h"
#include "model/fit.h"
#include "model/vocab_loader.h"

namespace kiln::engine {

using Clock = std::chrono::steady_clock;

static double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

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

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool poke = false;  // a cancellation happened
  struct Pending {
    std::shared_ptr<Channel> ch;
    Request req;
    Clock::time_point t_submit;
  };
  std::deque<Pending> pending;
  std::deque<std::function<void()>> tasks;  // slot actions, run by the engine thread between steps
  void wake() {
    {
      std::lock_guard<std::mutex> lk(mu);
      poke = true;
    }
    cv.notify_one();
  }
};

struct Channel {
  uint64_t id = 0;
  std::shared_ptr<Inbox> inbox;
  std::atomic<bool> cancelled{false};
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> q;
  bool final_pushed = false;
  bool final_taken = false;

  void push(Event e) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (final_pushed) return;
      final_pushed = e.final();
      q.push_back(std::move(e));
    }
    cv.notify_all();
  }
};

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

struct Active {
  std::shared_ptr<Channel> ch;
  Request req;
  Clock::time_point t_submit, t_admit, t_prompt_done;
  bool prompt_done = false;
  int slot = -1;
  int64_t n_past = 0;     // positions in the slot's memory
  int64_t cache_n = 0;
  int64_t n_decoded = 0;
  int32_t next_token = -1;  // sampled, to be fed in the next step
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<tokenizer::StreamDecoder> dec;
  std::unique_ptr<GrammarMatcher> matcher;  // Request::grammar
  bool grammar_on = false;                  // the grammar applies (its trigger, if any, was seen)
  std::string trig_buf;                     // output bytes that may hold the start of the trigger
  std::string held;       // decoded text not yet emitted (possible beginning of a stop string)
  std::vector<int64_t> cuts;  // hybrid: prompt positions (ascending, > cache_n) to snapshot at
  std::vector<float> embd;    // Request::embed: the pooled (summed, for Mean) or every token's hidden state
  bool finished = false;
  // per-step bookkeeping
  int64_t step_n = 0;
  int64_t out_row = -1;
};

struct SlotState {
  std::vector<int32_t> tokens;  // what the slot's memory holds (size == runner seq_pos)
  Active* active = nullptr;
  uint64_t last_used = 0;
};

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

struct Engine::Impl {
  Engine& eng;
  std::unique_ptr<Runner> runner;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<GrammarCache> grammars;
  const tokenizer::Tokenizer* tok = nullptr;
  int64_t n_ctx_slot = 0;
  int64_t step_tokens = 0;
  int64_t snap_interval = 0;
  bool recurrent = false;
  std::vector<int32_t> eog;  // sorted

  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>();
  std::atomic<uint64_t> next_id{1};

  // engine-thread state
  std::vector<SlotState> slots;
  std::deque<std::unique_ptr<Active>> waiting;
  std::vector<std::unique_ptr<Active>> active;  // admission order
  uint64_t clock = 0;
  model::Batch batch;
  std::vector<float> rec_buf;
  std::deque<std::function<void()>> tasks;  // taken from the inbox
  Result<SlotActionResult> slot_action(SlotAction action, int slot, const std::string& path);
  PrefixCacheStats cs;          // last published cache stats
  uint64_t cache_version = 0;

  // published state
  mutable std::mutex pub_mu;
  Metrics metrics;
  std::vector<SlotInfo> slot_info;

  explicit Impl(Engine& e) : eng(e) {}

  void run();
  void take_inbox(std::unique_lock<std::mutex>& lk);
  void handle_cancellations();
  void admit();
  void prepare(Active& a, int s);
  int pick_slot(const Active& a) const;
  void step();
  int32_t sample(Active& a, const float* logits);
  bool embed_rows(Active& a);
  bool grammar_step(Active& a, int32_t t, bool& done);
  void process_token(Active& a, int32_t tok, const float* logits);
  void finish(Active& a, FinishReason r, Event ev, const std::string& error = {});
  void cache_insert(const Active& a, bool end_of_turn);
  void publish();
  bool is_eog(int32_t t) const { return std::binary_search(eog.begin(), eog.end(), t); }
  void drop_finished() {
    std::erase_if(active, [](const std::unique_ptr<Active>& a) { return a->finished; });
  }
};

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
    admit();
    publish();
    if (!active.empty()) step();
    publish();
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
    if (recurrent) runner->write_rec(s, m.rec);
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
  a.sampler = std::make_unique<Sampler>(a.req.sampling, runner->n_vocab());
  a.sampler->accept(std::span<const int32_t>(prompt));
  a.dec = std::make_unique<tokenizer::StreamDecoder>(*tok, a.req.render_special);
  if (a.req.grammar) {
    a.matcher = std::make_unique<GrammarMatcher>(grammars->get(a.req.grammar));
    a.grammar_on = a.req.grammar_trigger.empty();
  }
  if (recurrent && a.req.cache_prompt && cache->enabled()) {
    for (int64_t p : a.req.snapshot_at)
      if (p > reused && p < P) a.cuts.push_back(p);
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
  const float* rec = nullptr;
  if (recurrent) {
    rec_buf.resize(runner->rec_floats());
    runner->read_rec(s, rec_buf.data());
    rec = rec_buf.data();
  }
  cache->insert(st.tokens, [&](int64_t p0, int64_t n, uint8_t* out) { runner->read_kv(s, p0, n, out); }, rec,
                end_of_turn);
}

void Engine::Impl::step() {
  batch.clear();
  int64_t budget = step_tokens;
  int64_t row = 0;
  for (auto& a : active) {
    a->step_n = 0;
    a->out_row = -1;
    if (!a->prompt_done) continue;
    batch.add(a->next_token, int32_t(a->n_past), a->slot, true);
    a->step_n = 1;
    a->out_row = row++;
    --budget;
  }
  for (auto& a : active) {
    if (a->prompt_done || budget <= 0) continue;
    const auto& prompt = a->req.prompt;
    const int64_t P = int64_t(prompt.size());
    int64_t n = std::min(P - a->n_past, budget);
    {
      auto it = std::upper_bound(a->cuts.begin(), a->cuts.end(), a->n_past);
      if (it != a->cuts.end()) n = std::min(n, *it - a->n_past);
    }
    const bool last = a->n_past + n == P;
    batch.add_run(std::span<const int32_t>(prompt).subspan(size_t(a->n_past), size_t(n)), int32_t(a->n_past),
                  a->slot, a->req.embed, last);
    a->step_n = n;
    if (a->req.embed) a->out_row = row, row += n;  // every token's row
    else if (last) a->out_row = row++;
    budget -= n;
  }
  if (batch.size() == 0) return;

  Status st = runner->decode(batch);
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
      ss.tokens.push_back(a.next_token);
      a.n_past += 1;
      process_token(a, sample(a, runner->logits(a.out_row)), runner->logits(a.out_row));
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
      const float* lg = runner->logits(a.out_row);
      process_token(a, sample(a, lg), lg);
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

void Engine::Impl::process_token(Active& a, int32_t t, const float* logits) {
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
  to.piece = tok->token_to_piece(t, a.req.render_special);
  if (a.req.n_probs != 0)
    to.logprob = Sampler::logprob_of(logits, runner->n_vocab(), t, std::max(0, a.req.n_probs), &to.top);
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

// ============================================================================================
// Engine

Engine::Engine() : impl_(std::make_unique<Impl>(*this)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    impl_->inbox->stop = true;
  }
  impl_->inbox->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  // Requests submitted after the thread ended (or when it never served).
  std::deque<Inbox::Pending> rest;
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    rest.swap(impl_->inbox->pending);
  }
  for (auto& p : rest) {
    Event e;
    e.finish = FinishReason::Cancelled;
    p.ch->push(std::move(e));
  }
}

static ModelInfo info_from_model(const model::Model& m, const tokenizer::Tokenizer& tok, const std::string& path) {
  ModelInfo mi;
  const auto& c = m.config();
  mi.arch = c.arch_str;
  mi.name = c.name;
  mi.path = path;
  if (auto t = m.file().get_string("tokenizer.chat_template"); t.ok()) mi.chat_template = *t;
  mi.n_ctx_train = c.n_ctx_train;
  mi.pooling_type = c.pooling_type;
  mi.n_layer = c.n_layer;
  mi.n_vocab = c.n_vocab;
  mi.n_embd = c.n_embd;
  mi.n_params_bytes = int64_t(m.info().weight_bytes);
  mi.hybrid = model::arch_is_hybrid(c.arch);
  const auto& v = tok.vocab();
  mi.bos = v.bos;
  mi.eos = v.eos;
  mi.eot = v.eot;
  mi.add_bos = v.add_bos;
  mi.eog_ids = tok.eog_ids();
  if (v.bos >= 0 && v.bos < int32_t(v.tokens.size())) mi.bos_text = tok.token_to_piece(v.bos, true);
  if (v.eos >= 0 && v.eos < int32_t(v.tokens.size())) mi.eos_text = tok.token_to_piece(v.eos, true);
  return mi;
}

// The ModelRunner for the options: per-slot context and step size from the options (and the
// model's training context), the rest passed through.
static Result<std::unique_ptr<ModelRunner>> make_runner(const model::Model& m, const EngineOptions& o) {
  // The rules the memory planner counts with (model/fit.h).
  const int np = std::max(1, o.n_parallel);
  const int64_t total = model::resolve_total_context(o.n_ctx, m.config().n_ctx_train);
  ModelRunnerOptions ro;
  ro.n_ctx_slot = model::slot_context(total, np);
  ro.n_batch = model::step_tokens(o.n_batch, o.n_ubatch, np);
  ro.n_slots = np;
  ro.n_threads = o.n_threads;
  ro.type_k = o.type_k;
  ro.type_v = o.type_v;
  ro.delta_chunk_min = o.delta_chunk_min;
  ro.flash_attn = o.flash_attn;
  ro.embeddings = o.embeddings;
  return ModelRunner::create(m, ro);
}

Status Engine::init_serving(std::unique_ptr<Runner> runner) {
  Impl& I = *impl_;
  I.runner = std::move(runner);
  I.tok = tok_.get();
  I.n_ctx_slot = I.runner->n_ctx();
  I.step_tokens = I.runner->n_batch();
  I.recurrent = I.runner->has_recurrent();
  if (I.runner->n_vocab() < int64_t(tok_->n_tokens()))
    return err("model has {} logits but the vocabulary has {} tokens", I.runner->n_vocab(), tok_->n_tokens());
  I.eog = tok_->eog_ids();
  for (int32_t t : info_.eog_ids) I.eog.push_back(t);
  std::sort(I.eog.begin(), I.eog.end());
  I.eog.erase(std::unique(I.eog.begin(), I.eog.end()), I.eog.end());
  info_.eog_ids = I.eog;
  info_.n_ctx_slot = I.n_ctx_slot;
  info_.n_ctx = I.n_ctx_slot * I.runner->n_slots();
  info_.n_vocab = I.runner->n_vocab();
  info_.hybrid = I.recurrent;
  PrefixCacheOptions po;
  po.block = std::max<int32_t>(1, opt_.cache_block);
  po.ram_bytes = opt_.cache_ram_bytes;
  po.recurrent = I.recurrent;
  po.kv_bytes_per_pos = I.runner->kv_bytes_per_pos();
  po.rec_floats = I.runner->rec_floats();
  I.cache = std::make_unique<PrefixCache>(po);
  I.grammars = std::make_unique<GrammarCache>(tok_.get(), I.eog, I.runner->n_vocab());
  const int64_t B = po.block;
  I.snap_interval = std::max<int64_t>(B, (std::max<int64_t>(opt_.cache_snapshot_interval, 1) + B - 1) / B * B);
  I.slots.assign(size_t(I.runner->n_slots()), SlotState{});
  for (int s = 0; s < I.runner->n_slots(); ++s) I.runner->seq_clear(s);
  I.publish();
  return {};
}

Result<int> Engine::fit_memory(const gguf::File& f) {
  auto shape = model::ModelShape::from_file(f);
  KILN_TRY(shape);
  std::unique_ptr<gguf::File> proj_file;
  std::optional<model::ProjectorShape> proj;
  if (!opt_.mmproj.empty()) {
    gguf::OpenOptions po;
    po.limits.metadata_only = true;
    auto pf = gguf::File::open(opt_.mmproj, po);
    if (!pf.ok()) return err("--mmproj {}", pf.error().message);
    proj_file = std::move(*pf);
    auto ps = model::ProjectorShape::from_file(*proj_file);
    KILN_TRY(ps);
    proj = std::move(*ps);
  }
  model::PlanOptions o;
  o.n_ctx = opt_.n_ctx;
  o.n_parallel = std::max(1, opt_.n_parallel);
  o.n_batch = opt_.n_batch;
  o.n_ubatch = opt_.n_ubatch;
  o.n_outputs_max = opt_.embeddings ? 0 : o.n_parallel;  // ModelRunner's logits rows (runner.cpp)
  o.type_k = opt_.type_k;
  o.type_v = opt_.type_v;
  o.n_threads = opt_.n_threads;
  o.delta_chunk_min = opt_.delta_chunk_min;
  o.flash_attn = opt_.flash_attn;
  o.n_gpu_layers = opt_.n_gpu_layers;
  o.cache_ram_bytes = opt_.cache_ram_bytes;
  model::FitOptions fo;
  fo.fit = opt_.fit;
  fo.fit_ctx = opt_.fit_ctx;
  std::optional<model::DeviceBudget> gpu;
  if (opt_.n_gpu_layers != 0) gpu = model::gpu_budget(opt_.main_gpu, opt_.device_memory, opt_.fit_target, false);
  auto plan = model::fit_plan(*shape, proj ? &*proj : nullptr, o, fo, gpu);
  KILN_TRY(plan);
  KILN_LOG_INFO("{}", plan->table());
  if (!plan->fits()) KILN_LOG_WARN("--fit off: the plan does not fit {}; loading as asked", plan->gpu->name);
  if (opt_.n_ctx == 0 && plan->n_ctx != model::resolve_total_context(0, shape->cfg.n_ctx_train)) {
    KILN_LOG_INFO("--fit: context {} (the training context does not fit; -c sets it explicitly)", plan->n_ctx);
    opt_.n_ctx = plan->n_ctx;
  }
  // Without a usable GPU the loader falls back to the CPU itself (and says why).
  return gpu ? plan->n_gpu_layers : opt_.n_gpu_layers;
}

void Engine::start_thread(std::string path) {
  thread_ = std::thread([this, p = std::move(path)]() mutable { thread_main(std::move(p)); });
}

void Engine::thread_main(std::string path) {
  if (!path.empty()) {
    auto fail = [&](const std::string& msg) {
      KILN_LOG_ERROR("{}", msg);
      {
        std::lock_guard<std::mutex> lk(impl_->pub_mu);
        load_error_ = msg;
      }
      state_.store(EngineState::Failed);
      state_.notify_all();
    };
    model::LoadOptions lo;
    lo.load_mode = opt_.load_mode;
    lo.n_gpu_layers = opt_.n_gpu_layers;
    lo.main_gpu = opt_.main_gpu;
    lo.progress = [this](size_t done, size_t total) { progress_.store(total ? float(done) / float(total) : 1.f); };
    gguf::OpenOptions oo;
    oo.load_mode = opt_.load_mode;
    auto file = gguf::File::open(path, oo);
    if (!file.ok()) return fail(file.error().message);
    // Plan (and fit) before anything is allocated.
    if (auto fitted = fit_memory(**file); !fitted.ok()) return fail(fitted.error().message);
    else lo.n_gpu_layers = *fitted;
    auto m = model::load_model(std::move(*file), lo);
    if (!m.ok()) return fail(m.error().message);
    model_ = std::move(*m);
    auto t = model::load_tokenizer(model_->file());
    if (!t.ok()) return fail(t.error().message);
    tok_ = std::move(*t);
    info_ = info_from_model(*model_, *tok_, path);
    auto r = make_runner(*model_, opt_);
    if (!r.ok()) return fail(path + ": " + r.error().message);
    Status s = init_serving(std::move(*r));
    if (!s.ok()) return fail(path + ": " + s.error().message);
    progress_.store(1.f);
    state_.store(EngineState::Ready);
    state_.notify_all();
  }
  impl_->run();
}

std::unique_ptr<Engine> Engine::load_async(const std::string& path, const EngineOptions& opt) {
  auto e = std::unique_ptr<Engine>(new Engine());
  e->opt_ = opt;
  e->start_thread(path.empty() ? std::string("<no model path>") : path);
  return e;
}

Result<std::unique_ptr<Engine>> Engine::load(const std::string& path, const EngineOptions& opt) {
  auto e = load_async(path, opt);
  KILN_TRY(e->wait_ready());
  return e;
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<model::Model> m, const EngineOptions& opt) {
  auto e = std::unique_ptr<Engine>(new Engine());
  e->opt_ = opt;
  auto t = model::load_tokenizer(m->file());
  KILN_TRY(t);
  e->tok_ = std::move(*t);
  e->model_ = std::move(m);
  e->info_ = info_from_model(*e->model_, *e->tok_, "");
  auto r = make_runner(*e->model_, opt);
  KILN_TRY(r);
  KILN_TRY(e->init_serving(std::move(*r)));
  e->progress_.store(1.f);
  e->state_.store(EngineState::Ready);
  e->start_thread({});
  return e;
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Runner> runner, std::unique_ptr<tokenizer::Tokenizer> tok,
                                               ModelInfo info, const EngineOptions& opt) {
  auto e = std::unique_ptr<Engine>(new Engine());
  e->opt_ = opt;
  e->tok_ = std::move(tok);
  e->info_ = std::move(info);
  KILN_TRY(e->init_serving(std::move(runner)));
  e->progress_.store(1.f);
  e->state_.store(EngineState::Ready);
  e->start_thread({});
  return e;
}

Status Engine::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const EngineState s = state_.load();
    if (s == EngineState::Ready) return {};
    if (s == EngineState::Failed) return err("{}", load_error());
    if (timeout.count() >= 0 && Clock::now() >= deadline) return err("model still loading after {} ms", timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string Engine::load_error() const {
  std::lock_guard<std::mutex> lk(impl_->pub_mu);
  return load_error_;
}

const ModelInfo& Engine::info() const {
  KILN_CHECK(ready(), "Engine::info() before the model is ready");
  return info_;
}

const tokenizer::Tokenizer& Engine::tokenizer() const {
  KILN_CHECK(ready(), "Engine::tokenizer() before the model is ready");
  return *tok_;
}

RequestHandle Engine::submit(Request req) {
  auto ch = std::make_shared<Channel>();
  ch->id = impl_->next_id.fetch_add(1);
  ch->inbox = impl_->inbox;
  {
    std::lock_guard<std::mutex> lk(impl_->pub_mu);
    impl_->metrics.requests_submitted++;
  }
  auto fail = [&](std::string msg) {
    {
      std::lock_guard<std::mutex> lk(impl_->pub_mu);
      impl_->metrics.requests_finished++;
      impl_->metrics.requests_failed++;
    }
    Event e;
    e.finish = FinishReason::Error;
    e.error = std::move(msg);
    ch->push(std::move(e));
    return RequestHandle(ch);
  };
  if (state_.load() == EngineState::Loading) return fail("the model is still loading");
  if (state_.load() == EngineState::Failed) return fail("the model failed to load: " + load_error());
  const int64_t P = int64_t(req.prompt.size());
  if (P == 0) return fail("prompt: empty (at least one token is needed)");
  if (P >= impl_->n_ctx_slot)
    return fail(fmt::format("prompt: {} tokens do not fit the context of {} tokens per slot", P, impl_->n_ctx_slot));
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= info_.n_vocab)
      return fail(fmt::format("prompt: token {} at index {} is outside the vocabulary [0, {})", req.prompt[i], i,
                              info_.n_vocab));
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    impl_->inbox->pending.push_back({ch, std::move(req), Clock::now()});
  }
  impl_->inbox->cv.notify_one();
  return RequestHandle(ch);
}

Result<Engine::SlotActionResult> Engine::slot_action(SlotAction action, int slot, const std::string& path) {
  if (!ready()) return err("the model is not loaded");
  auto done = std::make_shared<std::promise<Result<SlotActionResult>>>();
  auto fut = done->get_future();
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    if (impl_->inbox->stop) return err("the engine is stopping");
    impl_->inbox->tasks.push_back(
        [this, done, action, slot, path] { done->set_value(impl_->slot_action(action, slot, path)); });
  }
  impl_->inbox->wake();
  return fut.get();
}

Metrics Engine::metrics() const {
  Metrics m;
  {
    std::lock_guard<std::mutex> lk(impl_->pub_mu);
    m = impl_->metrics;
  }
  // Requests still in the inbox (not yet seen by the engine thread) count as queued.
  std::lock_guard<std::mutex> lk(impl_->inbox->mu);
  m.queue_length += int(impl_->inbox->pending.size());
  return m;
}

std::vector<SlotInfo> Engine::slots() const {
  std::lock_guard<std::mutex> lk(impl_->pub_mu);
  return impl_->slot_info;
}

}  // namespace kiln::engine
