// core/op_profile.cpp — see op_profile.h.
#include "core/op_profile.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kiln::op_profile {

bool env_on(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
}

void Table::add(const std::string& label, double ms, double bytes, double busy_ms, int n_threads) {
  std::lock_guard<std::mutex> lock(mu_);
  Row& r = rows_[label];
  ++r.calls, r.ms += ms, r.bytes += bytes, r.busy += busy_ms / std::max(1, n_threads);
}

std::string Table::report(const std::string& title, const std::string& total_prefix) {
  std::vector<std::pair<std::string, Row>> rows;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rows.assign(rows_.begin(), rows_.end());
    rows_.clear();
  }
  if (rows.empty()) return "";
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (const auto& r : rows)
    if (r.first.rfind(total_prefix, 0) == 0) total += r.second.ms;
  std::string out = fmt::format("{}: {:.3f} ms in {}\n", title, total, total_prefix.empty() ? "all" : "ops");
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

namespace {
Table& cpu_table() {
  static auto* t = new Table();  // never destroyed: ops may run during exit
  return *t;
}
}  // namespace

bool on() {
  static const bool v = env_on("KILN_CPU_PROFILE");
  return v;
}

void add(const std::string& label, double ms, double bytes, double busy_ms, int n_threads) {
  cpu_table().add(label, ms, bytes, busy_ms, n_threads);
}

std::string report(const std::string& title) { return on() ? cpu_table().report(title, "op ") : ""; }

}  // namespace kiln::op_profile
