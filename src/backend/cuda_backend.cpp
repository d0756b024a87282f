// backend/cuda_backend.cpp — placeholder until the cudabase branch lands (CUDA device, buffers, stream).
#include "backend/backend.h"

namespace kiln::backend {
#ifndef KILN_HAVE_CUDA
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "kiln was built without CUDA (no nvcc found at build time)"; }
Device& cuda_device(int) { KILN_CHECK(false, "kiln was built without CUDA"); __builtin_unreachable(); }
#endif
}  // namespace kiln::backend
