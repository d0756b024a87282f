// core/op_profile.h — per-op time tables: the CPU path's (KILN_CPU_PROFILE=1, host times) and the
//   table type the CUDA backend fills from its event pairs (KILN_CUDA_PROFILE, backend.h:
//   cuda_profile_report), so both print the same report.
// Owns: Table (label -> {calls, ms, weight bytes, thread busy ms}); the CPU path's table and switch.
// Must not: cost anything when a switch is off (one cached bool per op).
// Threading: Table::add() from any thread (a mutex; only when on); report() takes and clears a table.
//
// What is timed: every CPU Stream op as a whole (backend/cpu_backend.cpp, "op ..." labels) and,
// inside kernels::matmul, its phases ("  mm ..." labels: activation quantization, side data, the
// kernel sweep). A phase row's "busy %" is the threads' summed time inside the chunks of that
// parallel sweep over (wall time x threads): what is left is thread-pool wait (imbalance, wake-up).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace kiln::op_profile {

// True when the environment variable `name` is set, non-empty and not "0".
bool env_on(const char* name);

class Table {
 public:
  // Adds one call of `label`: ms of time, bytes of weights read, busy_ms the time summed over the
  // n_threads threads of its parallel sweep (0: not measured).
  void add(const std::string& label, double ms, double bytes = 0, double busy_ms = 0, int n_threads = 1);
  // Everything added since the last report (rows by total time), then forgets it; "" when empty.
  // `title` heads it with the total of the rows whose label starts with `total_prefix` ("ms in
  // ops"; an empty prefix: every row, "ms in all").
  std::string report(const std::string& title, const std::string& total_prefix = "");

 private:
  struct Row {
    int64_t calls = 0;
    double ms = 0, bytes = 0, busy = 0;
  };
  std::mutex mu_;
  std::map<std::string, Row> rows_;
};

// The CPU path's table: every Stream op as "op ...", matmul's phases as "  mm ..." (inside the ops,
// so its total counts the "op " rows only).
bool on();  // KILN_CPU_PROFILE (read once)
void add(const std::string& label, double ms, double bytes = 0, double busy_ms = 0, int n_threads = 1);
std::string report(const std::string& title);  // "" when off or empty

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace kiln::op_profile
