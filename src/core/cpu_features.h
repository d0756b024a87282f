// core/cpu_features.h — x86 CPU feature detection (CPUID + XGETBV) and the kernel ISA level.
// Owns: the detected feature set and the selected ISA level (KILN_CPU=scalar|avx2|avx512
//   caps it, for testing each kernel path; a request above what the CPU has is clamped).
// Must not: know about kernels; kernels/cpu reads selected_isa() to fill its dispatch table.
// Threading: detection runs once (thread-safe static); the results are immutable.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
  std::string brand;  // CPUID brand string, trimmed ("" if unavailable)
};

// Kernel ISA levels, ordered. Avx2 needs AVX2+FMA+F16C; Avx512 needs F+BW+VL+DQ+VNNI
// (the flags src/kernels/*_avx512.cpp are compiled with, minus BF16 which kernels do not use).
enum class CpuIsa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

const CpuFeatures& cpu_features();
CpuIsa best_isa();        // highest level the CPU (and OS, via XGETBV) supports
CpuIsa selected_isa();    // best_isa() capped by KILN_CPU when set (read once)
bool isa_supported(CpuIsa isa);
// The KILN_CPU rule, as a pure function: value (may be null/empty) capped at `best`; an unknown
// name or a level above `best` gives `best` (selected_isa() logs a warning for those).
CpuIsa isa_from_env(const char* value, CpuIsa best);
std::string_view isa_name(CpuIsa isa);                  // "scalar", "avx2", "avx512"
std::optional<CpuIsa> parse_isa(std::string_view name);  // inverse of isa_name

}  // namespace kiln
