// AVX2 + FMA + F16C entries of the CPU kernel table (compiled with -mavx2 -mfma -mf16c).
#define KILN_X86_FILL fill_avx2
#include "kernels/cpu/x86_kernels.inc"
