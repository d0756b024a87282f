// core/copy_wide.h — memcpy of large buffers over a few threads.
// Owns: nothing (a function). Used where one large host copy sits on a latency-critical thread: the
//   recurrent state's staging copies of model/memory.cpp (a 9B's 53 MB state: one core copies ~6 GB/s and
//   takes the page faults of fresh memory alone, ~10-25 ms at every prompt end and finish of a busy server).
// Threading: starts up to 3 short-lived threads and joins them before returning; dst and src must not overlap.
#pragma once
#include <cstddef>

namespace kiln {
// Copies n bytes; below 16 MiB (or on one core) a plain memcpy, else up to 4 parts of >= 8 MiB in parallel.
void copy_wide(void* dst, const void* src, size_t n);
}  // namespace kiln
