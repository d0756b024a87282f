// kernels/cpu/attention.cpp — CPU attention (kernels/ops.h attention): llama.cpp's flash-attention
//   orders (tiled for F16/F32 K and V, per key for quantized caches), its non-flash order
//   (attention_ggml), kiln's streaming order elsewhere; keys reduced in fixed chunks of 256 positions
//   whose states are folded in order (batch invariance), spread across threads for decode.
// Threading: work items (token, kv head, head group) split across the pool; results never depend on
//   the split.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "core/check.h"
#include "core/fp16.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace kiln::kernels {

using cpu::Table;

namespace {
inline size_t align64(size_t x) { return (x + 63) & ~size_t(63); }
}  // namespace

namespace {
constexpr int kAttnG = 8;     // query heads processed together (share each K/V row conversion)
constexpr int kAttnBk = 64;   // keys per tile of the online softmax
constexpr int kMaxSplitsPerThread = 4;

// Online-softmax state of up to kAttnG heads over a key range.
struct AttnState {
  float m[kAttnG], l[kAttnG];
  alignas(64) float acc[kAttnG][512];
};

// How attend_range forms its sums. Tiled and PerKey are llama.cpp's CPU flash attention
// (ggml_compute_forward_flash_attn_ext) operation for operation, on the AVX-512 tables:
//  - Tiled (F16 or F32 K and V, llama.cpp's path for batches of >= 64 tokens): keys in tiles of 64 at
//    absolute positions; per tile the 64 scores as one FMA chain over d each (F32 q, keys widened),
//    times scale; M' = max(M, tile max), on a new maximum acc and S scaled by exp(M - M');
//    probabilities by ggml's soft_max (its exp, 16-lane sums in double) added to S; acc += p * v as
//    one FMA per key in key order; out = acc * (1/S).
//  - PerKey (quantized K, or K and V of different types; llama.cpp's path for every batch size then):
//    q rounded to the K row's dot type (Q8_0 for Q8_0/Q4_0 keys, F16 for F16 keys), the score by that
//    type's ggml dot, then the online softmax one key at a time (exp by expf, S = S*ms + vs) with the
//    accumulator in F16 when V is F16 (ggml_vec_mad_f16), else in F32 on the dequantized V row.
// llama.cpp switches to other orders for batches of < 64 tokens with F16 K/V (F16 accumulation) and
// for single tokens with >= 512 keys (a thread-count-dependent split); kiln keeps one order for every
// batch, so its results stay batch-invariant, and equal llama.cpp's prefill bit for bit.
//  - Streaming (other hosts, head_dim % 16 != 0): kiln's online softmax in F32 with its own dots.
enum class FaOrder { Streaming, Tiled, PerKey };

FaOrder fa_order(const Table& T, GgmlType kt, GgmlType vt, int64_t D) {
  if (!T.ggml_fa_scores || !T.ggml_softmax_exp || D % 16 != 0) return FaOrder::Streaming;
  const auto is = [](GgmlType t, std::initializer_list<GgmlType> l) { return std::find(l.begin(), l.end(), t) != l.end(); };
  if (kt == vt && is(kt, {GgmlType::F16, GgmlType::F32})) return FaOrder::Tiled;
  if (is(kt, {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) && is(vt, {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}))
    return FaOrder::PerKey;
  return FaOrder::Streaming;
}

const char* kv_row(const KvView& kv, int64_t j, int64_t hk) {
  return static_cast<const char*>(kv.data) + size_t(j) * kv.pos_stride + size_t(hk) * kv.head_stride;
}

void attend_reset(AttnState& st, int ng, int64_t D) {
  for (int g = 0; g < ng; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0;
    std::fill(st.acc[g], st.acc[g] + D, 0.f);
  }
}

void attend_streaming(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                      const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D,
                      float scale, AttnState& st) {
  alignas(64) float kr[512], vr[512];
  float sc[kAttnG][kAttnBk];
  attend_reset(st, ng, D);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kAttnBk) {
    const int nb = int(std::min<int64_t>(kAttnBk, j_end - j0));
    for (int jj = 0; jj < nb; ++jj) {
      kdeq(kv_row(kv_k, j0 + jj, hk), kr, D);
      for (int g = 0; g < ng; ++g) sc[g][jj] = T.dot_f32(q.row(h0 + g, t), kr, D) * scale;
    }
    for (int g = 0; g < ng; ++g) {
      float tm = st.m[g];
      for (int jj = 0; jj < nb; ++jj) tm = std::max(tm, sc[g][jj]);
      const float corr = std::exp(st.m[g] - tm);  // 0 on the first tile (m = -inf)
      if (corr != 1.f) {
        T.scale(st.acc[g], corr, D);
        st.l[g] *= corr;
      }
      st.m[g] = tm;
      for (int jj = 0; jj < nb; ++jj) {
        sc[g][jj] = std::exp(sc[g][jj] - tm);
        st.l[g] += sc[g][jj];
      }
    }
    for (int jj = 0; jj < nb; ++jj) {
      vdeq(kv_row(kv_v, j0 + jj, hk), vr, D);
      for (int g = 0; g < ng; ++g) T.axpy(sc[g][jj], vr, st.acc[g], D);
    }
  }
}

static_assert(kAttnBk == 64, "the tiled order is ggml's 64-key tile");
// One 64-key tile's scores sc of q head g folded into the running softmax (ggml's tiled order): keys
// at and past nb masked (probability 0), the new maximum, acc and l rescaled when it grew, the tile's
// probabilities into p (the caller adds p · V) and their sum into l.
inline void tile_softmax(const Table& T, AttnState& st, int g, float* sc, int nb, float scale, float* p, int64_t D) {
  float tmax = -INFINITY;
  for (int jj = 0; jj < kAttnBk; ++jj) {
    sc[jj] = jj < nb ? sc[jj] * scale : -INFINITY;
    tmax = std::max(tmax, sc[jj]);
  }
  const float mnew = std::fmax(st.m[g], tmax);
  if (mnew > st.m[g]) {
    const float ms = std::exp(st.m[g] - mnew);
    T.scale(st.acc[g], ms, D);
    st.l[g] *= ms;
  }
  st.m[g] = mnew;
  st.l[g] = float(double(st.l[g]) + T.ggml_softmax_exp(sc, mnew, p, kAttnBk));
}

void attend_tiled(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                  const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D, float scale,
                  AttnState& st) {
  alignas(64) float kt[512 * kAttnBk];  // [D][64]: the key tile, transposed
  alignas(64) float kr[512], vr[512];
  alignas(64) float p[kAttnG][kAttnBk];
  attend_reset(st, ng, D);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kAttnBk) {
    const int nb = int(std::min<int64_t>(kAttnBk, j_end - j0));
    for (int jj = 0; jj < nb; ++jj) {
      kdeq(kv_row(kv_k, j0 + jj, hk), kr, D);
      for (int64_t d = 0; d < D; ++d) kt[d * kAttnBk + jj] = kr[d];
    }
    for (int g = 0; g < ng; ++g) {
      alignas(64) float sc[kAttnBk];
      T.ggml_fa_scores(q.row(h0 + g, t), kt, D, sc);
      tile_softmax(T, st, g, sc, nb, scale, p[g], D);
    }
    for (int jj = 0; jj < nb; ++jj) {
      vdeq(kv_row(kv_v, j0 + jj, hk), vr, D);
      for (int g = 0; g < ng; ++g) T.axpy(p[g][jj], vr, st.acc[g], D);
    }
  }
}

void attend_per_key(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                    const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn vdeq, int64_t D, float scale, AttnState& st) {
  constexpr int kQBytes = 512 * 2;  // q of up to 512 elements as F16 (1024 bytes) or Q8_0 (544)
  alignas(64) uint8_t qk[kAttnG][kQBytes];  // q in the key row's dot type
  alignas(64) uint16_t acc16[kAttnG][512];  // F16 accumulators (F16 V)
  alignas(64) float vr[512];
  const bool k_f16 = kv_k.type == GgmlType::F16, v_f16 = kv_v.type == GgmlType::F16;
  // ggml_vec_dot's order (llama.cpp never repacks the cache): for Q4_0 on AVX-512 that is the
  // rows_not8 entry, vec_dot_q8 being the repacked weights' order there.
  const int ki = cpu::type_index(kv_k.type);
  const cpu::VecDotQ8Fn kdot = k_f16 ? nullptr : T.vec_dot_q8_rows_not8[ki] ? T.vec_dot_q8_rows_not8[ki] : T.vec_dot_q8[ki];
  KILN_CHECK(k_f16 || (kdot && T.quantize_act[cpu::type_index(GgmlType::Q8_0)]), "attention: no dot for K type");
  attend_reset(st, ng, D);
  for (int g = 0; g < ng; ++g) {
    const float* qr = q.row(h0 + g, t);
    if (k_f16) {
      auto* qh = reinterpret_cast<uint16_t*>(qk[g]);
      for (int64_t i = 0; i < D; ++i) qh[i] = f32_to_fp16(qr[i]);
    } else {
      T.quantize_act[cpu::type_index(GgmlType::Q8_0)](qr, D, qk[g]);
    }
    if (v_f16) std::fill(acc16[g], acc16[g] + D, uint16_t(0));
  }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const char* krow = kv_row(kv_k, j, hk);
    const char* vrow = kv_row(kv_v, j, hk);
    if (!v_f16) vdeq(vrow, vr, D);
    for (int g = 0; g < ng; ++g) {
      float s;
      if (k_f16)
        s = T.ggml_dot_f16(reinterpret_cast<const uint16_t*>(krow), reinterpret_cast<const uint16_t*>(qk[g]), D, false);
      else
        kdot(D, krow, qk[g], 0, 1, &s);
      s *= scale;
      float ms = 1.f, vs = 1.f;
      if (s > st.m[g]) {
        ms = std::exp(st.m[g] - s);
        st.m[g] = s;
        if (v_f16) T.scale_f16(acc16[g], ms, D);
        else T.scale(st.acc[g], ms, D);
      } else {
        vs = std::exp(s - st.m[g]);
      }
      if (v_f16) T.mad_f16(acc16[g], reinterpret_cast<const uint16_t*>(vrow), vs, D);
      else T.axpy(vs, vr, st.acc[g], D);
      st.l[g] = std::fma(st.l[g], ms, vs);
    }
  }
  if (v_f16)
    for (int g = 0; g < ng; ++g)
      for (int64_t i = 0; i < D; ++i) st.acc[g][i] = fp16_to_f32(acc16[g][i]);
}

// Attends heads h0..h0+ng-1 (kv-head hk) of token t over keys [j_begin, j_end) into st.
void attend_range(const Table& T, FaOrder order, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin,
                  int64_t j_end, const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D,
                  float scale, AttnState& st) {
  switch (order) {
    case FaOrder::Tiled: return attend_tiled(T, q, t, h0, ng, hk, j_begin, j_end, kv_k, kv_v, kdeq, vdeq, D, scale, st);
    case FaOrder::PerKey: return attend_per_key(T, q, t, h0, ng, hk, j_begin, j_end, kv_k, kv_v, vdeq, D, scale, st);
    case FaOrder::Streaming:
      return attend_streaming(T, q, t, h0, ng, hk, j_begin, j_end, kv_k, kv_v, kdeq, vdeq, D, scale, st);
  }
}

// Keys are reduced in fixed chunks of kAttnChunk absolute positions ([0, 256), [256, 512), ...):
// each chunk's online-softmax state starts fresh, and the chunk states of a query are folded in
// chunk order by fold_state(). A query's result therefore depends only on its own position and the
// cache, never on the other queries, the thread count or whether the chunks ran on one thread
// (prefill) or were spread across threads (decode).
constexpr int64_t kAttnChunk = 256;
static_assert(kAttnChunk % kAttnBk == 0);

// run = run (+) part for heads 0..ng-1 (run empty: a copy).
void fold_state(const Table& T, AttnState& run, const AttnState& part, int ng, int64_t D, bool first) {
  for (int g = 0; g < ng; ++g) {
    if (first) {
      run.m[g] = part.m[g];
      run.l[g] = part.l[g];
      std::copy(part.acc[g], part.acc[g] + D, run.acc[g]);
      continue;
    }
    const float M = std::max(run.m[g], part.m[g]);
    const float fr = std::exp(run.m[g] - M), fp = std::exp(part.m[g] - M);
    T.scale(run.acc[g], fr, D);
    T.axpy(fp, part.acc[g], run.acc[g], D);
    run.l[g] = run.l[g] * fr + part.l[g] * fp;
    run.m[g] = M;
  }
}
// The tiled order for a block of tokens (prefill): each 64-key tile's keys are widened and
// transposed, and its values widened, once for every token and head of the block instead of once
// per token; each (token, head) then runs attend_tiled's steps on them in the same order (scores,
// mask, softmax update, acc += p*v key by key via Table::ggml_fa_pv), its keys in the same fixed
// chunks of kAttnChunk folded in order: the bits of the token-by-token path.
// st_run / st_part: per token of the block, the running and the chunk state.
constexpr int64_t kAttnTokBlock = 16;
void attend_tiled_block(const Table& T, CRows q, const int32_t* pos, int64_t t0, int64_t nt, int64_t h0, int ng,
                        int64_t hk, const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq,
                        int64_t D, float scale, AttnState* st_run, AttnState* st_part, float* kt, float* vt) {
  alignas(64) float kr[512];
  alignas(64) float p[kAttnBk];
  alignas(64) float sc[kAttnBk];
  int64_t maxn = 0;
  for (int64_t i = 0; i < nt; ++i) maxn = std::max<int64_t>(maxn, int64_t(pos[t0 + i]) + 1);
  for (int64_t jb = 0; jb < maxn; jb += kAttnChunk) {
    const bool first = jb == 0;
    for (int64_t i = 0; i < nt; ++i)
      if (int64_t(pos[t0 + i]) + 1 > jb) attend_reset(first ? st_run[i] : st_part[i], ng, D);
    const int64_t je_max = std::min(maxn, jb + kAttnChunk);
    for (int64_t j0 = jb; j0 < je_max; j0 += kAttnBk) {
      const int nbmax = int(std::min<int64_t>(kAttnBk, je_max - j0));
      for (int jj = 0; jj < nbmax; ++jj) {
        kdeq(kv_row(kv_k, j0 + jj, hk), kr, D);
        for (int64_t d = 0; d < D; ++d) kt[d * kAttnBk + jj] = kr[d];
        vdeq(kv_row(kv_v, j0 + jj, hk), vt + jj * D, D);
      }
      for (int64_t i = 0; i < nt; ++i) {
        const int64_t n = int64_t(pos[t0 + i]) + 1;
        if (n <= j0) continue;
        const int nb = int(std::min<int64_t>(kAttnBk, std::min(n, jb + kAttnChunk) - j0));
        AttnState& st = first ? st_run[i] : st_part[i];
        for (int g = 0; g < ng; ++g) {
          T.ggml_fa_scores(q.row(h0 + g, t0 + i), kt, D, sc);
          tile_softmax(T, st, g, sc, nb, scale, p, D);
          T.ggml_fa_pv(p, vt, nb, D, st.acc[g]);
        }
      }
    }
    if (!first)
      for (int64_t i = 0; i < nt; ++i)
        if (int64_t(pos[t0 + i]) + 1 > jb) fold_state(T, st_run[i], st_part[i], ng, D, false);
  }
}

}  // namespace

bool attention_ggml_supported(GgmlType k, GgmlType v, int64_t head_dim) {
  return k == GgmlType::F16 && v == GgmlType::F16 && head_dim % 16 == 0 && cpu::table().ggml_kqv != nullptr;
}

namespace {
// llama.cpp's attention without flash attention, per (token, q-head): kq = K . f16(q) (ggml_mul_mat),
// soft_max_ext(kq * scale) with ggml's exp, kqv = V^T . f16(probabilities). Positions past pos[t]
// are masked in ggml (probability exactly 0) and skipped here; the lanes and chains of the sums
// follow the absolute position, so the result is ggml's bit for bit.
void attention_ggml(CRows q, const int32_t* pos, const KvView& kv_k, const KvView& kv_v, const AttnParams& p, Rows out,
                    ThreadPool& pool) {
  const Table& T = cpu::table();
  const int64_t D = p.head_dim, group = p.n_head / p.n_head_kv;
  const bool tiny = p.order == AttnOrder::GgmlTiny;
  pool.parallel_for(q.n2 * p.n_head, [&](int64_t i0, int64_t i1, int) {
    // Per-thread scratch, grown once to the longest context seen (not per call).
    thread_local std::vector<float> sc, ex, acc;
    thread_local std::vector<uint16_t> qh;
    if (int64_t(acc.size()) < 64 * D) acc.resize(size_t(64 * D));  // kqv: 4 chains x 16 lanes x D
    qh.resize(size_t(D));
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t t = it / p.n_head, h = it % p.n_head, hk = h / group;
      const int64_t n = int64_t(pos[t]) + 1, n16 = (n + 15) / 16 * 16;
      if (int64_t(sc.size()) < n16) { sc.resize(size_t(n16)); ex.resize(size_t(n16)); }
      const float* qr = q.row(h, t);
      for (int64_t i = 0; i < D; ++i) qh[size_t(i)] = f32_to_fp16(qr[i]);
      const auto* kb = static_cast<const uint8_t*>(kv_k.data) + size_t(hk) * kv_k.head_stride;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const auto* kj = reinterpret_cast<const uint16_t*>(kb + size_t(j) * kv_k.pos_stride);
        sc[size_t(j)] = T.ggml_dot_f16(kj, qh.data(), D, tiny) * p.scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      for (int64_t j = n; j < n16; ++j) sc[size_t(j)] = -INFINITY;
      const double sum = T.ggml_softmax_exp(sc.data(), mx, ex.data(), n16);
      const float inv = float(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) ex[size_t(j)] = fp16_to_f32(f32_to_fp16(ex[size_t(j)] * inv));
      T.ggml_kqv(static_cast<const uint8_t*>(kv_v.data) + size_t(hk) * kv_v.head_stride, kv_v.pos_stride, ex.data(), n,
                 D, tiny, acc.data(), out.row(h, t));
    }
  });
}
}  // namespace

size_t attention_workspace(const AttnParams& p, int n_threads) {
  return size_t(kMaxSplitsPerThread) * size_t(std::max(1, n_threads)) * align64(sizeof(AttnState));
}

void attention(CRows q, const int32_t* pos, const KvView& kv_k, const KvView& kv_v, const AttnParams& p, Rows out, void* ws,
               ThreadPool& pool) {
  const int64_t D = p.head_dim;
  KILN_CHECK(D > 0 && D <= 512 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "attention: head_dim {} heads {}/{}",
             D, p.n_head, p.n_head_kv);
  int64_t max_n = 0;  // keys seen by the query that sees the most
  for (int64_t t = 0; t < q.n2; ++t) {
    KILN_CHECK(pos[t] >= 0 && pos[t] < kv_k.n_kv && pos[t] < kv_v.n_kv, "attention: pos {} outside cache of {}", pos[t],
               kv_k.n_kv);
    max_n = std::max<int64_t>(max_n, int64_t(pos[t]) + 1);
  }
  if (p.order != AttnOrder::Flash && attention_ggml_supported(kv_k.type, kv_v.type, D)) {
    attention_ggml(q, pos, kv_k, kv_v, p, out, pool);
    return;
  }
  const Table& T = cpu::table();
  const cpu::ToF32Fn kdeq = T.to_f32[cpu::type_index(kv_k.type)], vdeq = T.to_f32[cpu::type_index(kv_v.type)];
  KILN_CHECK(kdeq && vdeq, "attention: unsupported cache types");
  const FaOrder order = fa_order(T, kv_k.type, kv_v.type, D);
  const int64_t group = p.n_head / p.n_head_kv;
  const int64_t n_gchunks = (group + kAttnG - 1) / kAttnG;
  const int64_t n_items = q.n2 * p.n_head_kv * n_gchunks;
  auto item_geom = [&](int64_t it, int64_t& t, int64_t& hk, int64_t& h0, int& ng) {
    const int64_t gc = it % n_gchunks;
    hk = (it / n_gchunks) % p.n_head_kv;
    t = it / (n_gchunks * p.n_head_kv);
    h0 = hk * group + gc * kAttnG;
    ng = int(std::min<int64_t>(kAttnG, hk * group + group - h0));
  };
  auto chunk_range = [&](int64_t n, int64_t c, int64_t& jb, int64_t& je) {
    jb = c * kAttnChunk;
    je = std::min(n, jb + kAttnChunk);
  };
  auto write_out = [&](const AttnState& st, int64_t t, int64_t h0, int ng) {
    for (int g = 0; g < ng; ++g) {
      float* o = out.row(h0 + g, t);
      const float inv = 1.0f / st.l[g];
      for (int64_t i = 0; i < D; ++i) o[i] = st.acc[g][i] * inv;
    }
  };
  // Spread the chunks of an item across threads when the items alone cannot keep them busy
  // (decode). The result is the same either way; this is only a scheduling choice.
  const int64_t max_chunks = (max_n + kAttnChunk - 1) / kAttnChunk;
  const int64_t n_slots = ws ? int64_t(kMaxSplitsPerThread) * pool.size() : 0;
  const bool spread = ws && pool.size() > 1 && n_items < pool.size() && max_chunks >= 2 && n_slots >= 2 * n_items;
  if (!spread && order == FaOrder::Tiled && T.ggml_fa_pv && q.n2 >= 2) {
    // Prefill: items of kAttnTokBlock tokens share each tile's widened keys and values.
    const int64_t n_tb = (q.n2 + kAttnTokBlock - 1) / kAttnTokBlock;
    pool.parallel_for_dynamic(n_tb * p.n_head_kv * n_gchunks, [&](int64_t i0, int64_t i1, int) {
      // Per-thread scratch, grown once (as attention_ggml's): the block's states, the key tile
      // transposed [D][64] and the value tile [64][D].
      thread_local std::vector<AttnState> states;
      thread_local std::vector<float> tiles;
      if (states.size() < size_t(2 * kAttnTokBlock)) states.resize(size_t(2 * kAttnTokBlock));
      if (tiles.size() < size_t(2 * kAttnBk * D)) tiles.resize(size_t(2 * kAttnBk * D));
      for (int64_t it = i0; it < i1; ++it) {
        const int64_t gc = it % n_gchunks, hk = (it / n_gchunks) % p.n_head_kv, tb = it / (n_gchunks * p.n_head_kv);
        const int64_t h0 = hk * group + gc * kAttnG, t0 = tb * kAttnTokBlock, nt = std::min(kAttnTokBlock, q.n2 - t0);
        const int ng = int(std::min<int64_t>(kAttnG, hk * group + group - h0));
        attend_tiled_block(T, q, pos, t0, nt, h0, ng, hk, kv_k, kv_v, kdeq, vdeq, D, p.scale, states.data(),
                           states.data() + kAttnTokBlock, tiles.data(), tiles.data() + kAttnBk * D);
        for (int64_t i = 0; i < nt; ++i) write_out(states[size_t(i)], t0 + i, h0, ng);
      }
    }, 1, 1);
    return;
  }
  if (!spread) {
    pool.parallel_for(n_items, [&](int64_t i0, int64_t i1, int) {
      AttnState run, part;
      for (int64_t it = i0; it < i1; ++it) {
        int64_t t, hk, h0;
        int ng;
        item_geom(it, t, hk, h0, ng);
        const int64_t n = int64_t(pos[t]) + 1;
        for (int64_t c = 0; c * kAttnChunk < n; ++c) {
          int64_t jb, je;
          chunk_range(n, c, jb, je);
          attend_range(T, order, q, t, h0, ng, hk, jb, je, kv_k, kv_v, kdeq, vdeq, D, p.scale, c == 0 ? run : part);
          if (c > 0) fold_state(T, run, part, ng, D, false);
        }
        write_out(run, t, h0, ng);
      }
    });
    return;
  }
  // Workspace: one running state per item, then waves of W chunks per item computed in parallel
  // and folded in chunk order.
  auto* base = static_cast<uint8_t*>(ws);
  const size_t sb = align64(sizeof(AttnState));
  auto slot = [&](int64_t i) { return reinterpret_cast<AttnState*>(base + size_t(i) * sb); };
  const int64_t W = (n_slots - n_items) / n_items;
  for (int64_t c0 = 0; c0 < max_chunks; c0 += W) {
    pool.parallel_for(n_items * W, [&](int64_t u0, int64_t u1, int) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t it = u / W, c = c0 + u % W;
        int64_t t, hk, h0;
        int ng;
        item_geom(it, t, hk, h0, ng);
        const int64_t n = int64_t(pos[t]) + 1;
        if (c * kAttnChunk >= n) continue;
        int64_t jb, je;
        chunk_range(n, c, jb, je);
        attend_range(T, order, q, t, h0, ng, hk, jb, je, kv_k, kv_v, kdeq, vdeq, D, p.scale, *slot(n_items + u));
      }
    }, 1);
    for (int64_t it = 0; it < n_items; ++it) {
      int64_t t, hk, h0;
      int ng;
      item_geom(it, t, hk, h0, ng);
      const int64_t n = int64_t(pos[t]) + 1;
      for (int64_t c = c0; c < c0 + W && c * kAttnChunk < n; ++c)
        fold_state(T, *slot(it), *slot(n_items + it * W + (c - c0)), ng, D, c == 0);
    }
  }
  for (int64_t it = 0; it < n_items; ++it) {
    int64_t t, hk, h0;
    int ng;
    item_geom(it, t, hk, h0, ng);
    write_out(*slot(it), t, h0, ng);
  }
}

}  // namespace kiln::kernels
