// core/result.h — Result<T> for errors caused by input data (files, requests, templates).
// Owns: Error (a message naming the file/tensor/key/field) and Result<T>/Status.
// Must not: throw across module boundaries; programmer errors use KILN_CHECK instead.
// Threading: plain values.
#pragma once
#include <fmt/format.h>

#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace kiln {

struct Error {
  std::string message;
};

// Builds an Error with fmt formatting: return kiln::err("{}: tensor '{}' ...", path, name);
template <class... Args>
Error err(fmt::format_string<Args...> f, Args&&... args) {
  return Error{fmt::format(f, std::forward<Args>(args)...)};
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}
  Result(Error e) : v_(std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { KILN_CHECK(ok(), "Result::value() on error: {}", std::get<1>(v_).message); return std::get<0>(v_); }
  const T& value() const& { KILN_CHECK(ok(), "Result::value() on error: {}", std::get<1>(v_).message); return std::get<0>(v_); }
  T&& value() && { KILN_CHECK(ok(), "Result::value() on error: {}", std::get<1>(v_).message); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  const Error& error() const { KILN_CHECK(!ok(), "Result::error() on success"); return std::get<1>(v_); }
  T value_or(T dflt) const { return ok() ? std::get<0>(v_) : std::move(dflt); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error e) : e_(std::move(e)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { KILN_CHECK(!ok_, "Result::error() on success"); return e_; }

 private:
  Error e_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace kiln

// Propagate an error: KILN_TRY(expr) where expr is a Status / Result<T>.
#define KILN_TRY(expr)                                  \
  do {                                                  \
    auto&& kiln_try_r_ = (expr);                        \
    if (!kiln_try_r_.ok()) return kiln_try_r_.error();  \
  } while (0)
