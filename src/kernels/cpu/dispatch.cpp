#include "kernels/cpu/dispatch.h"

#include <atomic>

#include "kernels/ops.h"

namespace kiln::kernels::cpu {
namespace {

struct Tables {
  Table t[3];
  bool ok[3] = {};
  Tables() {
    fill_generic(t[0]);
    ok[0] = true;
#if defined(__x86_64__)
    // An ISA's table: the generic entries, overridden by its own.
    auto add = [this](CpuIsa isa, void (*fill)(Table&)) {
      if (!isa_supported(isa)) return;
      Table& x = t[int(isa)];
      fill_generic(x);
      fill(x);
      x.isa = isa;
      ok[int(isa)] = true;
    };
    add(CpuIsa::Avx2, [](Table& x) {
      fill_avx2(x);
      fill_tile_avx2(x);
    });
    add(CpuIsa::Avx512, [](Table& x) {
      fill_avx512(x);
      fill_tile_avx512(x);
      fill_delta_avx512(x);
      fill_attention_avx512(x);
    });
#endif
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

std::atomic<const Table*>& current() {
  static std::atomic<const Table*> cur{table_for(selected_isa())};
  return cur;
}

}  // namespace

const Table* table_for(CpuIsa isa) {
  const int i = int(isa);
  return tables().ok[i] ? &tables().t[i] : nullptr;
}

const Table& table() { return *current().load(std::memory_order_relaxed); }

}  // namespace kiln::kernels::cpu

namespace kiln::kernels {

bool set_isa(CpuIsa isa) {
  const cpu::Table* t = cpu::table_for(isa);
  if (!t) return false;
  cpu::current().store(t, std::memory_order_relaxed);
  return true;
}

CpuIsa current_isa() { return cpu::table().isa; }

}  // namespace kiln::kernels
