#include "core/thread_pool.h"

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

void ThreadPool::do_range(int tid) {
  if (tid >= n_parts_) return;
  const int64_t b = int64_t(tid) * chunk_;
  const int64_t e = std::min(n_, b + chunk_);
  if (b < e) thunk_(ctx_, b, e, tid);
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
    do_range(tid);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run_ranges(int64_t n, int64_t grain, Thunk thunk, void* ctx) {
  if (n <= 0) return;
  KILN_CHECK(grain >= 1, "grain {} < 1", grain);
  const int64_t n_grains = (n + grain - 1) / grain;
  const int parts = int(std::min<int64_t>(n_threads_, n_grains));
  if (parts <= 1 || t_in_worker) {
    thunk(ctx, 0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(call_mu_);
  thunk_ = thunk;
  ctx_ = ctx;
  const int64_t grains_per = (n_grains + parts - 1) / parts;
  n_ = n;
  chunk_ = grains_per * grain;
  n_parts_ = int((n + chunk_ - 1) / chunk_);
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  t_in_worker = true;  // nested calls from fn run inline (the caller is not a worker otherwise)
  do_range(0);
  t_in_worker = false;
  int p;
  spin_until([&] { return (p = pending_.load(std::memory_order_acquire)) == 0; });
  while (p != 0) {
    pending_.wait(p, std::memory_order_acquire);
    p = pending_.load(std::memory_order_acquire);
  }
}

}  // namespace kiln
