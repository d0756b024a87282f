// core/overflow.h — checked integer arithmetic for sizes and offsets computed from untrusted input.
// Every size computed from a file header or a request goes through these.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln {
// Each returns false on overflow and leaves *out unspecified.
template <class T>
[[nodiscard]] inline bool checked_add(T a, T b, T* out) { return !__builtin_add_overflow(a, b, out); }
template <class T>
[[nodiscard]] inline bool checked_mul(T a, T b, T* out) { return !__builtin_mul_overflow(a, b, out); }
// Rounds x up to a multiple of align (align must be a power of two).
[[nodiscard]] inline bool checked_align_up(uint64_t x, uint64_t align, uint64_t* out) {
  uint64_t t;
  if (!checked_add<uint64_t>(x, align - 1, &t)) return false;
  *out = t & ~(align - 1);
  return true;
}
}  // namespace kiln
