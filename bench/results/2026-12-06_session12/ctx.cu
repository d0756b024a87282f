// Context-size probe: device memory used by a bare CUDA context and by the local-memory reservation.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void spill(float* o, int n) { float a[512]; for (int i = 0; i < 512; ++i) a[i] = i * o[0]; o[threadIdx.x] = a[n & 511]; }
static size_t used() { size_t f, t; cudaMemGetInfo(&f, &t); return (t - f) >> 20; }
int main() {
  cudaFree(0);
  size_t st, heap, fifo; cudaDeviceGetLimit(&st, cudaLimitStackSize); cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize);
  cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize);
  printf("after context: used %zu MiB; stack %zu B, heap %zu B, printf fifo %zu B\n", used(), st, heap, fifo);
  float* d; cudaMalloc(&d, 4096); cudaMemset(d, 0, 4096);
  printf("after 4 KiB malloc: used %zu MiB\n", used());
  spill<<<1, 32>>>(d, 3); cudaDeviceSynchronize();
  cudaFuncAttributes a; cudaFuncGetAttributes(&a, spill);
  printf("after a kernel with %zu B local per thread: used %zu MiB\n", a.localSizeBytes, used());
  cudaDeviceSetLimit(cudaLimitStackSize, 4096);
  printf("after stack limit 4096: used %zu MiB\n", used());
  return 0;
}
