// core/thread_pool.h — low-overhead fork/join pool for compute kernels.
// Owns: persistent worker threads (n_threads - 1 of them; the calling thread is worker 0).
// Must not: be used for I/O or long blocking work; it knows nothing about kernels or models.
// Threading: parallel_for may be called from any one thread at a time (calls are serialised
//   by a mutex); a parallel_for issued from inside a worker runs inline on that worker.
//   Workers spin briefly after each job (cheap back-to-back decode ops), then sleep on a futex
//   (std::atomic::wait), so an idle pool costs no CPU.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // n_threads <= 0: std::thread::hardware_concurrency(). KILN_THREADS env overrides 0.
  explicit ThreadPool(int n_threads = 0);
  // The worker count a ThreadPool(n_threads) gets (the memory planner sizes CPU workspaces with it).
  static int resolve_threads(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Splits [0, n) into at most size() contiguous ranges, each a multiple of `grain` (except the
  // last), and calls fn(begin, end, thread_id) once per non-empty range; returns when all are
  // done. thread_id < size(). Ranges are deterministic for a given (n, grain, size()).
  template <class F>
  void parallel_for(int64_t n, F&& fn, int64_t grain = 1) {
    using Fn = std::remove_reference_t<F>;
    run_ranges(n, grain, [](void* ctx, int64_t b, int64_t e, int tid) { (*static_cast<Fn*>(ctx))(b, e, tid); },
               const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Calls fn(thread_id, n_threads) once on every thread (for kernels that split work themselves).
  // Nested (inline) calls run all ids serially on the calling thread.
  template <class F>
  void run_all(F&& fn) {
    const int nt = n_threads_;
    parallel_for(nt, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) fn(int(i), nt);
    });
  }

  // Process-wide default pool (created on first use with n_threads = 0).
  static ThreadPool& global();

 private:
  using Thunk = void (*)(void*, int64_t, int64_t, int);
  void run_ranges(int64_t n, int64_t grain, Thunk thunk, void* ctx);
  void worker_main(int tid);
  void do_range(int tid);

  int n_threads_ = 1;
  std::vector<std::thread> threads_;
  std::mutex call_mu_;
  // Current job (written by the caller before bumping generation_).
  Thunk thunk_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  int n_parts_ = 0;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kiln
