// core/op_profile.cpp — see op_profile.h.
#include "core/op_profile.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kiln::op_profile {
namespace {
struct Row {
  int64_t calls = 0;
  double ms = 0, bytes = 0, busy = 0;
};
std::mutex g_mu;
std::map<std::string, Row>& table() {
  static auto* t = new std::map<std::string, Row>();  // never destroyed: ops may run during exit
  return *t;
}
}  // namespace

bool on() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_CPU_PROFILE");
    return e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
  }();
  return v;
}

void add(const std::string& label, double ms, double bytes, double busy_ms, int n_threads) {
  std::lock_guard<std::mutex> lock(g_mu);
  Row& r = table()[label];
  ++r.calls, r.ms += ms, r.bytes += bytes, r.busy += busy_ms / std::max(1, n_threads);
}

std::string report(const std::string& title) {
  if (!on()) return "";
  std::vector<std::pair<std::string, Row>> rows;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    rows.assign(table().begin(), table().end());
    table().clear();
  }
  if (rows.empty()) return "";
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;  // the ops only: phases are inside them
  for (const auto& r : rows)
    if (r.first.rfind("op ", 0) == 0) total += r.second.ms;
  std::string out = fmt::format("{}: {:.3f} ms in ops\n", title, total);
  out += "| op | calls | total ms | % | us/call | weight GB/s | busy % |\n| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& [label, r] : rows) {
    const double us = 1e3 * r.ms / double(r.calls);
    const std::string bw = r.bytes > 0 && r.ms > 0 ? fmt::format("{:.1f}", r.bytes / (r.ms * 1e6)) : "";
    const std::string busy = r.busy > 0 && r.ms > 0 ? fmt::format("{:.0f}", 100 * r.busy / r.ms) : "";
    out += fmt::format("| {} | {} | {:.3f} | {:.1f} | {:.1f} | {} | {} |\n", label, r.calls, r.ms,
                       total > 0 ? 100 * r.ms / total : 0.0, us, bw, busy);
  }
  return out;
}

}  // namespace kiln::op_profile
