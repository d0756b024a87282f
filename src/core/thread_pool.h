// core/thread_pool.h — low-overhead fork/join pool for compute kernels.
// Owns: persistent worker threads (n_threads - 1 of them; the calling thread is worker 0) and the
//   schedule of one job at a time.
// Must not: be used for I/O or long blocking work; it knows nothing about kernels or models.
// Threading: parallel_for / parallel_for_dynamic may be called from any one thread at a time (calls
//   are serialised by a mutex); a call issued from inside a worker runs inline on that worker.
//   A job is a list of chunks (contiguous index ranges). Each thread has a share of them (its own
//   contiguous run of chunks) and claims its next chunk from its share's atomic word (a CAS on
//   generation | next | end, one cache line per share). parallel_for has one chunk per thread and no
//   stealing (static, deterministic ranges); parallel_for_dynamic has several chunks per thread and
//   a thread whose share is empty claims the chunks left in the other shares, so a worker that
//   another process keeps off its core leaves its unstarted chunks to the others. A call returns
//   when every chunk is done (a count), not when every worker has checked in: a worker that wakes
//   late finds the words of a finished job stale (their generation) and waits for the next one; it
//   reads the job's function and sizes only after claiming a chunk, so never those of a newer job.
//   Workers spin briefly after each job (cheap back-to-back decode ops), then sleep on a futex
//   (std::atomic::wait), so an idle pool costs no CPU. No allocation per call.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
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

  // Static schedule. Splits [0, n) into at most size() contiguous ranges, each a multiple of
  // `grain` (except the last), and calls fn(begin, end, thread_id) once per non-empty range, range i
  // on thread i; returns when all are done. thread_id < size(). Ranges are deterministic for a given
  // (n, grain, size()), so fn may fold per-thread partial results in thread order.
  template <class F>
  void parallel_for(int64_t n, F&& fn, int64_t grain = 1) {
    run(n, grain, 0, thunk<F>(), const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Dynamic schedule, for work whose result at each index does not depend on which thread computes
  // it or with which neighbours (row-parallel mat-vecs: each row's sums come from the same kernel in
  // the same order whatever the split). [0, n) is cut into chunks of `chunk` indices (rounded up to
  // a multiple of `grain`; the last chunk takes the rest), dealt out as contiguous shares, one per
  // thread, and stolen from the other shares once a thread's own is done (see the header comment).
  // fn(begin, end, thread_id) is called once per chunk, several times per thread; begin is a
  // multiple of grain; thread_id only names scratch. KILN_DYNAMIC_ROWS=0 turns this into
  // parallel_for(n, fn, grain) (speed comparisons only).
  template <class F>
  void parallel_for_dynamic(int64_t n, F&& fn, int64_t grain, int64_t chunk) {
    run(n, grain, chunk < 1 ? 1 : chunk, thunk<F>(), const_cast<void*>(static_cast<const void*>(&fn)));
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
  template <class F>
  static Thunk thunk() {
    using Fn = std::remove_reference_t<F>;
    return [](void* ctx, int64_t b, int64_t e, int tid) { (*static_cast<Fn*>(ctx))(b, e, tid); };
  }
  // chunk == 0: static (one private chunk per thread); else dynamic with that many indices a chunk.
  void run(int64_t n, int64_t grain, int64_t chunk, Thunk thunk, void* ctx);
  void worker_main(int tid);
  // Claims and runs chunks of job `gen` (own share first, then the others' unless private); adds
  // the count to done_. Returns without touching anything of the job if it is stale.
  void work(int tid, uint32_t gen);

  // One thread's share of a job's chunks: bit 63 private (only its owner claims), bits 62..32 the
  // job's generation (31 bits), 31..16 the next unclaimed chunk, 15..0 the end of the share.
  struct alignas(64) Share {
    std::atomic<uint64_t> word{0};
  };
  static constexpr int64_t kMaxChunks = 0xffff;

  int n_threads_ = 1;
  std::vector<std::thread> threads_;
  std::unique_ptr<Share[]> shares_;
  std::mutex call_mu_;
  // Current job (written by the caller before publishing the shares; read by a worker only after it
  // claimed a chunk of the job, i.e. while the job cannot finish).
  Thunk thunk_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, n_chunks_ = 0;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int64_t> done_{0};  // chunks of the current job completed
  std::atomic<bool> stop_{false};
};

}  // namespace kiln
