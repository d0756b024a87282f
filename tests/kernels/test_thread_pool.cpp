#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"

using namespace kiln;

TEST(ThreadPool, CoversEveryIndexOnceWithinGrain) {
  for (int nt : {1, 2, 3, 5}) {
    ThreadPool pool(nt);
    EXPECT_EQ(pool.size(), nt);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_tid{0}, bad_align{0};
        pool.parallel_for(n, [&](int64_t b, int64_t e, int tid) {
          if (tid < 0 || tid >= nt) bad_tid++;
          if (b % grain != 0) bad_align++;
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        }, grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "nt " << nt << " n " << n << " i " << i;
        EXPECT_EQ(bad_tid.load(), 0);
        EXPECT_EQ(bad_align.load(), 0);
      }
    }
  }
}

TEST(ThreadPool, UsesDistinctThreadIdsAndNestsInline) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> per_tid(4);
  std::atomic<int64_t> inner_sum{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e, int tid) {
    per_tid[size_t(tid)] += int(e - b);
    // A nested call runs inline on this thread (thread id 0, the whole range).
    pool.parallel_for(10, [&](int64_t b2, int64_t e2, int tid2) {
      EXPECT_EQ(tid2, 0);
      EXPECT_EQ(b2, 0);
      EXPECT_EQ(e2, 10);
      inner_sum += e2 - b2;
    });
  });
  for (auto& c : per_tid) EXPECT_EQ(c.load(), 1);
  EXPECT_EQ(inner_sum.load(), 40);
}

TEST(ThreadPool, RunAllAndManyBackToBackJobs) {
  ThreadPool pool(3);
  std::vector<int> seen(3, 0);
  pool.run_all([&](int tid, int nt) {
    EXPECT_EQ(nt, 3);
    seen[size_t(tid)]++;
  });
  EXPECT_EQ(seen, std::vector<int>({1, 1, 1}));
  std::atomic<int64_t> total{0};
  for (int it = 0; it < 300; ++it)
    pool.parallel_for(3, [&](int64_t b, int64_t e, int) { total += e - b; });
  EXPECT_EQ(total.load(), 900);
}

TEST(CpuFeatures, IsaNamesAndLevels) {
  for (CpuIsa i : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512}) EXPECT_EQ(parse_isa(isa_name(i)), i);
  EXPECT_FALSE(parse_isa("sse9").has_value());
  EXPECT_TRUE(isa_supported(CpuIsa::Scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_LE(int(selected_isa()), int(best_isa()));
  // Levels are nested: a CPU with AVX-512 (as kiln defines it) also has the AVX2 level.
  if (isa_supported(CpuIsa::Avx512)) { EXPECT_TRUE(isa_supported(CpuIsa::Avx2)); }
  EXPECT_EQ(isa_from_env(nullptr, CpuIsa::Avx512), CpuIsa::Avx512);
  EXPECT_EQ(isa_from_env("", CpuIsa::Avx2), CpuIsa::Avx2);
  EXPECT_EQ(isa_from_env("scalar", CpuIsa::Avx512), CpuIsa::Scalar);
  EXPECT_EQ(isa_from_env("avx2", CpuIsa::Avx512), CpuIsa::Avx2);
  EXPECT_EQ(isa_from_env("avx512", CpuIsa::Avx2), CpuIsa::Avx2);  // capped at what the CPU has
  EXPECT_EQ(isa_from_env("bogus", CpuIsa::Avx2), CpuIsa::Avx2);
  const char* env = std::getenv("KILN_CPU");
  EXPECT_EQ(selected_isa(), isa_from_env(env, best_isa()));
  const auto& f = cpu_features();
  EXPECT_EQ(isa_supported(CpuIsa::Avx2), f.avx2 && f.fma && f.f16c);
}

// parallel_for_dynamic: every index exactly once, chunk starts on grain boundaries, for ragged n and
// many chunks, back to back with static jobs (each job's chunks claimed under its own generation).
TEST(ThreadPool, DynamicCoversEveryIndexOnce) {
  for (int nt : {1, 2, 3, 5}) {
    ThreadPool pool(nt);
    for (int64_t n : {0, 1, 7, 64, 1000, 4097, 100003}) {
      for (int64_t grain : {1, 8}) {
        for (int64_t chunk : {1, 24, 1000}) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::atomic<int> bad_tid{0}, bad_align{0};
          pool.parallel_for_dynamic(n, [&](int64_t b, int64_t e, int tid) {
            if (tid < 0 || tid >= nt) bad_tid++;
            if (b % grain != 0 || (e != n && (e - b) % grain != 0)) bad_align++;
            for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
          }, grain, chunk);
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(hits[size_t(i)].load(), 1) << "nt " << nt << " n " << n << " grain " << grain << " chunk " << chunk << " i " << i;
          EXPECT_EQ(bad_tid.load(), 0);
          EXPECT_EQ(bad_align.load(), 0);
          std::atomic<int64_t> total{0};
          pool.parallel_for(n, [&](int64_t b, int64_t e, int) { total += e - b; });
          EXPECT_EQ(total.load(), n);
        }
      }
    }
  }
  ThreadPool pool(2);  // many short jobs: late workers meet stale generations
  std::vector<int64_t> sum(64, 0);
  for (int it = 0; it < 20000; ++it)
    pool.parallel_for_dynamic(64, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum[size_t(i)] += 1;
    }, 1, 1);
  for (int64_t v : sum) ASSERT_EQ(v, 20000);
}

// A worker held up inside its first chunk (as by another process on its core) leaves the rest of
// its share to the other threads: thread 1 holds its first chunk until every other chunk is done,
// which under a static split (or without stealing) never happens (bounded by a 20 s timeout). Thread
// 0 waits in its first chunk until thread 1 holds one, so that thread 1 takes part.
TEST(ThreadPool, DynamicStealsFromADelayedWorker) {
  if (const char* e = std::getenv("KILN_DYNAMIC_ROWS"); e && e[0] == '0') GTEST_SKIP() << "static schedule forced";
  using Clock = std::chrono::steady_clock;
  for (int nt : {2, 3}) {
    ThreadPool pool(nt);
    const int64_t n = 64 * nt;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int64_t> finished{0};
    std::atomic<int> held{0}, started0{0}, timed_out{0}, tid1_chunks{0};
    pool.parallel_for_dynamic(n, [&](int64_t b, int64_t e, int tid) {
      const auto until = Clock::now() + std::chrono::seconds(20);
      if (tid == 0 && started0.exchange(1) == 0)
        while (held.load() == 0 && Clock::now() < until) std::this_thread::yield();
      if (tid == 1) {
        tid1_chunks++;
        if (held.exchange(1) == 0) {  // hold this chunk until all others are done
          while (finished.load() < n - (e - b)) {
            if (Clock::now() > until) {
              timed_out = 1;
              break;
            }
            std::this_thread::yield();
          }
        }
      }
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      finished += e - b;
    }, 1, 4);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "nt " << nt << " i " << i;
    EXPECT_EQ(held.load(), 1) << "nt " << nt << ": thread 1 took no chunk in 20 s";
    EXPECT_EQ(timed_out.load(), 0) << "nt " << nt << ": the other threads did not take the held worker's chunks";
    EXPECT_EQ(tid1_chunks.load(), 1) << "nt " << nt;
  }
}
