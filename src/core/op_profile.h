// core/op_profile.h — per-op host times of the CPU path (KILN_CPU_PROFILE=1), the CPU twin of
//   KILN_CUDA_PROFILE (backend.h: cuda_profile_report) with the same table.
// Owns: the process-wide table label -> {calls, ms, weight bytes, thread busy ms}; the switch.
// Must not: cost anything when the switch is off (one cached bool per op).
// Threading: add() from any thread (a mutex; only when on); report() takes and clears the table.
//
// What is timed: every CPU Stream op as a whole (backend/cpu_backend.cpp, "op ..." labels) and,
// inside kernels::matmul, its phases ("  mm ..." labels: activation quantization, side data, the
// kernel sweep). A phase row's "busy %" is the threads' summed time inside the chunks of that
// parallel sweep over (wall time x threads): what is left is thread-pool wait (imbalance, wake-up).
#pragma once
#include <chrono>
#include <string>

namespace kiln::op_profile {

bool on();  // KILN_CPU_PROFILE set, non-empty and not "0" (read once)
// Adds one call of `label`: ms wall time, bytes of weights read, busy_ms the time summed over the
// n_threads threads of its parallel sweep (0: not measured).
void add(const std::string& label, double ms, double bytes = 0, double busy_ms = 0, int n_threads = 1);
// The table of everything added since the last call (rows by total time), then forgets it; "" when
// off or empty. `title` heads it.
std::string report(const std::string& title);

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace kiln::op_profile
