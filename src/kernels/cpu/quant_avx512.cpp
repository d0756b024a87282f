// AVX-512 (F/BW/VL/DQ/VNNI) entries of the CPU kernel table: the x86 kernels with vpdpbusd.
#define KILN_X86_FILL fill_avx512
#define KILN_AVX512 1
#include "kernels/cpu/x86_kernels.inc"
