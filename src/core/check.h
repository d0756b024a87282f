// core/check.h — always-on invariant checks.
// Owns: KILN_CHECK (release builds too) and KILN_DCHECK (debug only).
// Must not: be used for bad *input* (files, requests); those return kiln::Result.
// Threading: safe from any thread; a failed check prints file:line and aborts.
#pragma once
#include <fmt/format.h>

namespace kiln::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace kiln::detail

#define KILN_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (__builtin_expect(!(cond), 0))                                                          \
      ::kiln::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__));  \
  } while (0)

#ifdef NDEBUG
#define KILN_DCHECK(cond, ...) do { (void)sizeof(cond); } while (0)
#else
#define KILN_DCHECK(cond, ...) KILN_CHECK(cond, __VA_ARGS__)
#endif
