#include "core/copy_wide.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace kiln {

void copy_wide(void* dst, const void* src, size_t n) {
  constexpr size_t kMinPerThread = size_t(8) << 20;
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t nt = std::min<size_t>({4, hw, n / kMinPerThread});
  if (nt <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t per = (n / nt + 4095) / 4096 * 4096;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  std::vector<std::thread> th;
  for (size_t b = per; b < n; b += per) th.emplace_back([=] { std::memcpy(d + b, s + b, std::min(per, n - b)); });
  std::memcpy(d, s, std::min(per, n));
  for (auto& t : th) t.join();
}

}  // namespace kiln
