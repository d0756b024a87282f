// kernels/cpu/attention_avx512.cpp — AVX-512 pieces of the tiled flash-attention order
//   (kernels/cpu/attention.cpp, FaOrder::Tiled) that keep an accumulator in registers.
// Owns: Table::ggml_fa_pv.
// Must not: change a float step: acc += p[j] * v_j is one FMA per element per key in key order,
//   the bits of Table::axpy called key by key (tests/kernels/test_ggml_order.cpp).
// Threading: pure function.
#include <immintrin.h>

#include "kernels/cpu/dispatch.h"

namespace kiln::kernels::cpu {
namespace {

// acc[d] = fma(p[j], v[j*D + d], acc[d]) for j < nb in order; D % 16 == 0. The accumulator goes
// through registers 256 floats at a time (16 zmm) instead of a load and a store per key.
void fa_pv(const float* p, const float* v, int nb, int64_t D, float* acc) {
  constexpr int kU = 16;
  int64_t d0 = 0;
  for (; d0 + 16 * kU <= D; d0 += 16 * kU) {
    __m512 a[kU];
    for (int u = 0; u < kU; ++u) a[u] = _mm512_loadu_ps(acc + d0 + 16 * u);
    for (int j = 0; j < nb; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* vj = v + j * D + d0;
      for (int u = 0; u < kU; ++u) a[u] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16 * u), a[u]);
    }
    for (int u = 0; u < kU; ++u) _mm512_storeu_ps(acc + d0 + 16 * u, a[u]);
  }
  for (; d0 < D; d0 += 16) {
    __m512 a = _mm512_loadu_ps(acc + d0);
    for (int j = 0; j < nb; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(v + j * D + d0), a);
    _mm512_storeu_ps(acc + d0, a);
  }
}

}  // namespace

void fill_attention_avx512(Table& t) { t.ggml_fa_pv = fa_pv; }

}  // namespace kiln::kernels::cpu
