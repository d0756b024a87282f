// kernels/cpu/delta_avx512.cpp — the AVX-512 table's gated delta rule (the recurrence, ggml's order)
//   with each state row kept in registers across a block of tokens.
// Owns: Table::ggml_delta_rows.
// Must not: change a float step of the per-row order kernels::gated_delta_rule takes through the
//   table's scale / ggml_dot_f32 / axpy entries (tests/kernels/test_delta_rows.cpp holds the bits).
// Threading: pure function of its arguments; callers split rows (independent) across threads.
//
// Why (issue #19; bench/RESULTS.md, session 14): the recurrence made four passes per token over
// each 128-float row (scale, dot with k, axpy, dot with q), each through a function pointer with
// the 64 KiB head state in L2: 26 % of a qwen35-0.8b pp512 at 2 threads. Row j of the state evolves
// on its own (its update reads only row j, k_t, q_t, v_t[j]), so a row can stay in registers for
// many tokens: one load and one store per token block instead of four passes per token. NR rows go
// together so that their dependency chains (mul -> dot -> axpy, about 60 cycles a token) overlap.
#include <immintrin.h>

#include "kernels/cpu/dispatch.h"

namespace kiln::kernels::cpu {
namespace {

// ggml_vec_dot_f32 as vdot_f32 (x86_kernels.inc) forms it for n = 16 V, n % 64 == 0: four chains
// over steps of 64, folded (0+2) + (1+3), reduced by _mm512_reduce_add_ps.
template <int V>
inline float dot_rows(const __m512* r, const float* x) {
  static_assert(V % 4 == 0);
  __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int i = 0; i < V; i += 4)
    for (int j = 0; j < 4; ++j) s[j] = _mm512_fmadd_ps(r[i + j], _mm512_loadu_ps(x + 16 * (i + j)), s[j]);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3])));
}

// NR rows (j0 ..) of the state, tokens [0, n_t).
template <int V, int NR>
inline void rows_nr(const DeltaRowsArgs& a, int64_t j0) {
  __m512 r[NR][V];
  for (int i = 0; i < NR; ++i)
    for (int u = 0; u < V; ++u) r[i][u] = _mm512_loadu_ps(a.st + (j0 + i) * a.S + 16 * u);
  for (int64_t t = 0; t < a.n_t; ++t) {
    const float* k = a.k + t * a.qk_stride;
    const float* q = a.q + t * a.qk_stride;
    const float* v = a.v + t * a.v_stride;
    float* o = a.out + t * a.out_stride;
    const __m512 decay = _mm512_set1_ps(a.decay[t]);
    const float beta = a.beta[t];
    for (int i = 0; i < NR; ++i) {
      for (int u = 0; u < V; ++u) r[i][u] = _mm512_mul_ps(decay, r[i][u]);  // scale(row, decay)
      const float dj = (v[j0 + i] - dot_rows<V>(r[i], k)) * beta;
      const __m512 vd = _mm512_set1_ps(dj);
      for (int u = 0; u < V; ++u) r[i][u] = _mm512_fmadd_ps(vd, _mm512_loadu_ps(k + 16 * u), r[i][u]);  // axpy
      o[j0 + i] = dot_rows<V>(r[i], q) * a.qscale;
    }
    if (a.keep != nullptr && a.keep[t] != nullptr) {  // a speculative step's kept state: streamed, no reads
      float* kp = a.keep[t] + a.keep_off + j0 * a.S;
      const bool aligned = reinterpret_cast<uintptr_t>(kp) % 64 == 0;  // rows of S = 16 V floats: all aligned
      for (int i = 0; i < NR; ++i)
        for (int u = 0; u < V; ++u) {
          float* d = kp + i * a.S + 16 * u;
          if (aligned) _mm512_stream_ps(d, r[i][u]);
          else _mm512_storeu_ps(d, r[i][u]);
        }
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int u = 0; u < V; ++u) _mm512_storeu_ps(a.st + (j0 + i) * a.S + 16 * u, r[i][u]);
  if (a.keep != nullptr) _mm_sfence();  // the streamed rows before the pool's hand-off
}

template <int V>
void delta_rows(const DeltaRowsArgs& a) {
  // Three 128-float rows (24 of the 32 zmm) measured 15 % faster than two, four no faster (qwen35-0.8b
  // pp512, 1 thread: the op 360 -> 305 ms).
  constexpr int kNR = V <= 8 ? 3 : 1;
  int64_t j = a.j0;
  for (; j + kNR <= a.j1; j += kNR) rows_nr<V, kNR>(a, j);
  if constexpr (kNR > 2)
    for (; j + 2 <= a.j1; j += 2) rows_nr<V, 2>(a, j);
  for (; j < a.j1; ++j) rows_nr<V, 1>(a, j);
}

}  // namespace

void fill_delta_avx512(Table& t) {
  t.ggml_delta_rows[0] = delta_rows<4>;   // S = 64
  t.ggml_delta_rows[1] = delta_rows<8>;   // S = 128
  t.ggml_delta_rows[2] = delta_rows<16>;  // S = 256
}

}  // namespace kiln::kernels::cpu
