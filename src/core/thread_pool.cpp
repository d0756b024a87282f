#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

#include "core/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() std::this_thread::yield()
#endif

namespace kiln {
namespace {
thread_local bool t_in_worker = false;
// Waiting: kSpinPause pause-spins (a few microseconds), then kSpinYield sched_yield()s (lets an
// oversubscribed core run the thread we wait for), then sleep on the futex.
constexpr int kSpinPause = 2000;
constexpr int kSpinYield = 64;
constexpr uint64_t kGenMask = 0x7fffffff;
// parallel_for_dynamic's schedule; KILN_DYNAMIC_ROWS=0: the static one (speed comparisons only).
bool dynamic_rows() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_DYNAMIC_ROWS");
    return !(e && e[0] == '0');
  }();
  return v;
}
template <class Pred>
inline void spin_until(Pred&& done) {
  for (int i = 0; i < kSpinPause; ++i) {
    if (done()) return;
    KILN_PAUSE();
  }
  for (int i = 0; i < kSpinYield; ++i) {
    if (done()) return;
    std::this_thread::yield();
  }
}
}  // namespace

int ThreadPool::resolve_threads(int n_threads) {
  if (n_threads <= 0) {
    if (const char* env = std::getenv("KILN_THREADS")) n_threads = std::atoi(env);
    if (n_threads <= 0) n_threads = int(std::thread::hardware_concurrency());
    if (n_threads <= 0) n_threads = 1;
  }
  return n_threads;
}

ThreadPool::ThreadPool(int n_threads) {
  n_threads_ = resolve_threads(n_threads);
  shares_ = std::make_unique<Share[]>(size_t(n_threads_));
  threads_.reserve(size_t(n_threads_ - 1));
  for (int t = 1; t < n_threads_; ++t) threads_.emplace_back([this, t] { worker_main(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& th : threads_) th.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(0);
  return pool;
}

void ThreadPool::work(int tid, uint32_t gen) {
  const uint64_t tag = gen & kGenMask;
  int64_t count = 0;
  for (int k = 0; k < n_threads_; ++k) {
    std::atomic<uint64_t>& word = shares_[size_t((tid + k) % n_threads_)].word;
    uint64_t w = word.load(std::memory_order_acquire);
    for (;;) {
      // A newer job (or none of ours left): while this thread holds uncounted chunks the job cannot
      // finish, so a stale word means count == 0 and nothing of the job may be read.
      if (((w >> 32) & kGenMask) != tag) return;
      if (k > 0 && (w >> 63) != 0) break;  // private share: its owner's only
      const uint64_t next = (w >> 16) & 0xffff;
      if (next >= (w & 0xffff)) break;
      if (!word.compare_exchange_weak(w, w + (uint64_t(1) << 16), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
        continue;  // w reloaded
      const int64_t b = int64_t(next) * chunk_;
      thunk_(ctx_, b, std::min(n_, b + chunk_), tid);
      ++count;
      w = word.load(std::memory_order_acquire);
    }
  }
  if (count == 0) return;
  const int64_t total = n_chunks_;  // read before the add: after it the caller may start a new job
  if (done_.fetch_add(count, std::memory_order_acq_rel) + count == total) done_.notify_one();
}

void ThreadPool::worker_main(int tid) {
  t_in_worker = true;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g;
    spin_until([&] { return (g = generation_.load(std::memory_order_acquire)) != seen; });
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    work(tid, g);
  }
}

void ThreadPool::run(int64_t n, int64_t grain, int64_t chunk, Thunk thunk, void* ctx) {
  if (n <= 0) return;
  KILN_CHECK(grain >= 1, "grain {} < 1", grain);
  const int nt = n_threads_;
  const int64_t n_grains = (n + grain - 1) / grain;
  if (chunk > 0 && !dynamic_rows()) chunk = 0;
  bool priv = chunk == 0;
  int64_t chunk_items, n_chunks;
  if (priv) {  // static: at most nt ranges of whole grains, range t on thread t
    const int64_t parts = std::min<int64_t>(nt, n_grains);
    chunk_items = (n_grains + parts - 1) / parts * grain;
  } else {  // dynamic: whole grains per chunk, at most kMaxChunks chunks
    const int64_t g_per = std::max((chunk + grain - 1) / grain, (n_grains + kMaxChunks - 1) / kMaxChunks);
    chunk_items = g_per * grain;
  }
  n_chunks = (n + chunk_items - 1) / chunk_items;
  if (n_chunks <= 1 || nt <= 1 || t_in_worker) {
    thunk(ctx, 0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(call_mu_);
  thunk_ = thunk;
  ctx_ = ctx;
  n_ = n;
  chunk_ = chunk_items;
  n_chunks_ = n_chunks;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  const uint64_t head = (priv ? uint64_t(1) << 63 : 0) | (uint64_t(gen & kGenMask) << 32);
  for (int t = 0; t < nt; ++t) {
    // Static: chunk t (none past n_chunks). Dynamic: an even contiguous run of chunks.
    const int64_t b = priv ? std::min<int64_t>(t, n_chunks) : n_chunks * t / nt;
    const int64_t e = priv ? std::min<int64_t>(t + 1, n_chunks) : n_chunks * (t + 1) / nt;
    shares_[size_t(t)].word.store(head | uint64_t(b) << 16 | uint64_t(e), std::memory_order_release);
  }
  generation_.store(gen, std::memory_order_release);
  generation_.notify_all();
  t_in_worker = true;  // nested calls from fn run inline (the caller is not a worker otherwise)
  work(0, gen);
  t_in_worker = false;
  int64_t d;
  spin_until([&] { return (d = done_.load(std::memory_order_acquire)) == n_chunks; });
  while (d != n_chunks) {
    done_.wait(d, std::memory_order_acquire);
    d = done_.load(std::memory_order_acquire);
  }
}

}  // namespace kiln
