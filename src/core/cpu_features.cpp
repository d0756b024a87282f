#include "core/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KILN_X86 1
#endif

namespace kiln {
namespace {

#ifdef KILN_X86
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef KILN_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  __get_cpuid(1, &a, &b, &c, &d);
  const bool osxsave = c & (1u << 27);
  const bool avx = c & (1u << 28);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;           // XMM + YMM state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;      // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!(avx && os_avx)) { f.fma = f.f16c = false; }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = os_avx && (b & (1u << 5));
    if (os_avx512) {
      f.avx512f = b & (1u << 16);
      f.avx512dq = b & (1u << 17);
      f.avx512bw = b & (1u << 30);
      f.avx512vl = b & (1u << 31);
      f.avx512vnni = c & (1u << 11);
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512bf16 = a & (1u << 5);
    }
  }
  unsigned ext = 0;
  if (!__get_cpuid(0x80000000u, &ext, &b, &c, &d)) ext = 0;
  if (ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4];
      __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + 16 * i, r, 16);
    }
    std::string s(brand);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    f.brand = s;
  }
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(CpuIsa isa) {
  const auto& f = cpu_features();
  switch (isa) {
    case CpuIsa::Scalar: return true;
    case CpuIsa::Avx2: return f.avx2 && f.fma && f.f16c;
    case CpuIsa::Avx512:
      return isa_supported(CpuIsa::Avx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  }
  return false;
}

CpuIsa best_isa() {
  if (isa_supported(CpuIsa::Avx512)) return CpuIsa::Avx512;
  if (isa_supported(CpuIsa::Avx2)) return CpuIsa::Avx2;
  return CpuIsa::Scalar;
}

CpuIsa isa_from_env(const char* value, CpuIsa best) {
  if (!value || !*value) return best;
  auto want = parse_isa(value);
  if (!want || int(*want) > int(best)) return best;
  return *want;
}

CpuIsa selected_isa() {
  static const CpuIsa sel = [] {
    const CpuIsa best = best_isa();
    const char* env = std::getenv("KILN_CPU");
    const CpuIsa got = isa_from_env(env, best);
    if (env && *env && parse_isa(env) != got)  // unknown name, or capped at best
      KILN_LOG_WARN("KILN_CPU='{}' is not one of scalar, avx2, avx512 or not supported by this CPU; using {}", env,
                    isa_name(got));
    return got;
  }();
  return sel;
}

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> parse_isa(std::string_view name) {
  if (name == "scalar" || name == "generic") return CpuIsa::Scalar;
  if (name == "avx2") return CpuIsa::Avx2;
  if (name == "avx512") return CpuIsa::Avx512;
  return std::nullopt;
}

}  // namespace kiln
