// engine/engine_impl.h — internal to src/engine: the engine thread's state (Engine::Impl), the
//   request channels (Inbox, Channel) and per-request / per-slot bookkeeping (Active, SlotState),
//   shared by engine.cpp (scheduling: admission, steps, sampling, finishing, slot actions) and
//   engine_load.cpp (loading, serving set-up, the public API).
// Must not: be included outside src/engine.
// Threading: as engine.h says — Impl's engine-thread state is touched by the engine thread only;
//   the inbox under its mutex; published state under pub_mu.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/draft_model.h"
#include "engine/engine.h"
#include "model/vision.h"
#include "engine/grammar_matcher.h"
#include "engine/prefix_cache.h"

namespace kiln::engine {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// ---- request channels ----

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

// ---- engine-thread bookkeeping ----

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
  // speculative decoding (engine_spec.cpp)
  SpecState spec;
  std::vector<int32_t> draft;  // this step's draft (fed after next_token, verified after the decode)
  bool mtp_idle = false;       // draft-mtp: no draft this step for a pause or images (its catch-up may wait)
  struct PendingAccept {       // the rollback of the verify run in progress (applied once: settle())
    bool on = false;
    int64_t n_pos = 0;
    int kept = -1;
  } pend;
  // Images: M-RoPE positions of every prompt token (3 each) and where generated tokens continue;
  // each image's embeddings once encoded (model::ImageEmbedding, empty data until then) and its
  // encoding while it runs off the engine thread (valid from its start until its result is taken).
  std::vector<int32_t> mpos;
  int64_t mpos_end = 0;
  std::vector<model::ImageEmbedding> img_embd;
  std::vector<std::future<Result<model::ImageEmbedding>>> img_jobs;
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

struct Engine::Impl {
  Engine& eng;
  std::unique_ptr<Runner> runner;
  // Vision (--mmproj): the projector and its encoder. Images are encoded off the engine thread, one at
  // a time (vision_mu: the encoder is not reentrant), while the other slots keep decoding; a prompt
  // is prefilled up to its first image not yet encoded.
  std::unique_ptr<model::VisionModel> vision;
  std::unique_ptr<ThreadPool> vision_pool;
  std::unique_ptr<model::VisionEncoder> vision_enc;
  std::mutex vision_mu;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<GrammarCache> grammars;
  const tokenizer::Tokenizer* tok = nullptr;
  int64_t n_ctx_slot = 0;
  int64_t step_tokens = 0;
  int64_t snap_interval = 0;
  // The fewest tokens a snapshot where a prompt leaves the cached prefix must save (engine.cpp prepare()).
  static constexpr int64_t kMinSharedSnapshot = 32;
  bool recurrent = false;
  std::vector<int32_t> eog;  // sorted

  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>();
  std::atomic<uint64_t> next_id{1};

  // engine-thread state
  std::vector<SlotState> slots;
  std::deque<std::unique_ptr<Active>> waiting;
  std::vector<std::unique_ptr<Active>> active;  // admission order
  struct StepLog {  // the last step, for the debug line run() prints
    int64_t tokens = 0, decode = 0;
    double forward_ms = 0;
  } step_log;
  // Encodings of requests that ended before them (their futures must not block the engine thread).
  std::vector<std::future<Result<model::ImageEmbedding>>> orphan_jobs;
  uint64_t clock = 0;
  model::Batch batch;
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
  // Images: the M-RoPE positions of a request's prompt (admission); image_ready: starts the encodings
  // of the images at or after prompt position p0 and lowers n to the tokens from p0 that can be
  // prefilled now (those before the first image whose encoding has not finished; 0: wait). Errors:
  // the encoder's. image_rows: the embedding rows of prompt tokens [p0, p0 + n) (nullptr for text).
  void image_positions(Active& a);
  Status image_ready(Active& a, int64_t p0, int64_t& n);
  void image_rows(const Active& a, int64_t p0, int64_t n, std::vector<const float*>& out) const;
  int32_t sample(Active& a, const float* logits);
  int32_t sample_row(Active& a, int64_t row);
  bool embed_rows(Active& a);
  bool grammar_step(Active& a, int32_t t, bool& done);
  void process_token(Active& a, int32_t tok, int64_t row);  // row: the decode's output row tok came from
  void finish(Active& a, FinishReason r, Event ev, const std::string& error = {});
  void cache_insert(const Active& a, bool end_of_turn);
  void publish();
  // speculative decoding (engine_spec.cpp)
  std::vector<double> synth;  // conditional synthetic acceptance probabilities (empty: real verification)
  std::unique_ptr<DraftModel> drafter;  // --spec-type draft-simple (its Model: Engine::draft_model_)
  void spec_start(Active& a);
  void make_drafts(int64_t budget, int64_t generating);
  int64_t draft_len(Active& a, int64_t cap);
  void finish_draft(Active& a);
  void verify(Active& a);
  void settle(Active& a);
  // draft-mtp's deferred catch-up (model::Batch::mtp_defer): whether this step's batch may defer it,
  // flushing first where a slot's pending rows must not wait (mtp_schedule), and the flush of slots.
  void mtp_schedule();
  void mtp_flush(std::span<const int> slots);
  bool is_eog(int32_t t) const { return std::binary_search(eog.begin(), eog.end(), t); }
  void drop_finished() {
    for (auto& a : active)
      if (a->finished)
        for (auto& f : a->img_jobs)
          if (f.valid()) orphan_jobs.push_back(std::move(f));
    std::erase_if(active, [](const std::unique_ptr<Active>& a) { return a->finished; });
    std::erase_if(orphan_jobs, [](const std::future<Result<model::ImageEmbedding>>& f) {
      return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
  }
};

}  // namespace kiln::engine
