// `kiln devices` — the compute devices kiln can use (llama.cpp's --list-devices): the CPU and every
// usable CUDA device with its name, memory and compute capability, or why there is none.
#include <cstdio>

#include "backend/backend.h"
#include "subcommand.h"

namespace {

int cmd_devices(int argc, char** argv) {
  using namespace kiln::backend;
  if (argc > 1) {
    std::fprintf(stderr, "usage: kiln devices\n");
    return 2;
  }
  std::printf("Available devices:\n");
  std::printf("  %s\n", make_cpu_device(1)->name().c_str());
  const int n = cuda_device_count();
  for (int i = 0; i < n; ++i) std::printf("  %s\n", cuda_device(i).name().c_str());
  if (n == 0) std::printf("  (no CUDA device: %s)\n", cuda_unavailable_reason().c_str());
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(devices, "list the devices kiln can run on (CPU, CUDA GPUs)", cmd_devices);
