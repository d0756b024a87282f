// The dispatched, multi-threaded CPU ops of kernels/ops.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/fp16.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

namespace kiln::kernels {

using cpu::Table;

namespace {
inline size_t align64(size_t x) { return (x + 63) & ~size_t(63); }
constexpr int64_t kRowTile = 16;  // weight rows kept hot while sweeping the columns of X
bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
}  // namespace

size_t matmul_workspace(GgmlType wt, int64_t k, int64_t m, int n_threads) {
  if (is_float_type(wt) && m == 1) return 0;
  // Quantized activations for every column + kRowTile dequantized rows per thread (float path).
  return align64(size_t(m) * cpu::act_bytes(cpu::act_type(wt), k)) + size_t(n_threads) * align64(size_t(kRowTile * k) * 4);
}

void matmul(const MatmulArgs& a, void* ws, ThreadPool& pool) {
  KILN_CHECK(matmul_supported(a.wt), "matmul: unsupported weight type {}", gguf::type_name(a.wt));
  KILN_CHECK(a.m == 1 || (a.x_stride >= a.k && a.y_stride >= a.n), "matmul: bad strides");
  KILN_CHECK(a.k % int64_t(gguf::type_info(a.wt).block_size) == 0, "matmul: k {} is not whole {} blocks", a.k,
             gguf::type_name(a.wt));
  KILN_CHECK(a.w_stride >= gguf::type_info(a.wt).type_size * size_t(a.k / gguf::type_info(a.wt).block_size),
             "matmul: weight row stride {} shorter than a row", a.w_stride);
  const Table& T = cpu::table();
  const int wi = cpu::type_index(a.wt);
  const auto* w = static_cast<const char*>(a.w);
  const int64_t k = a.k, m = a.m;

  if (is_float_type(a.wt) && m == 1) {
    const cpu::DotRowFn dot = T.dot_row[wi];
    pool.parallel_for(a.n, [&](int64_t j0, int64_t j1, int) {
      for (int64_t j = j0; j < j1; ++j) a.y[j] = dot(w + size_t(j) * a.w_stride, a.x, k);
    }, 4);
    return;
  }
  KILN_CHECK(ws != nullptr, "matmul: {} weights with m = {} need a workspace", gguf::type_name(a.wt), m);
  const GgmlType at = cpu::act_type(a.wt);
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(at)];
  // float weights: at is F32, no qa. A weight's row count picks the kernel, never the batch.
  cpu::VecDotQ8Fn vd = qa ? T.vec_dot_q8[wi] : nullptr;
  if (qa && a.n % 8 != 0 && T.vec_dot_q8_rows_not8[wi]) vd = T.vec_dot_q8_rows_not8[wi];
  else if (qa && a.expert && T.vec_dot_q8_expert[wi]) vd = T.vec_dot_q8_expert[wi];
  if (vd) {
    KILN_CHECK(k % 32 == 0, "matmul: k {} not a multiple of 32", k);
    auto* act = static_cast<uint8_t*>(ws);
    const size_t ab = cpu::act_bytes(at, k);
    auto quantize_cols = [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) qa(a.x + t * a.x_stride, k, act + size_t(t) * ab);
    };
    if (m < 2 * pool.size()) quantize_cols(0, m, 0);
    else pool.parallel_for(m, quantize_cols);
    pool.parallel_for(a.n, [&](int64_t j0, int64_t j1, int) {
      for (int64_t jb = j0; jb < j1; jb += kRowTile) {
        const int64_t je = std::min(j1, jb + kRowTile);
        for (int64_t t = 0; t < m; t += cpu::kMaxCols) {
          const int nc = int(std::min<int64_t>(cpu::kMaxCols, m - t));
          const uint8_t* at = act + size_t(t) * ab;
          float out[cpu::kMaxCols];
          for (int64_t j = jb; j < je; ++j) {
            vd(k, w + size_t(j) * a.w_stride, at, ab, nc, out);
            for (int c = 0; c < nc; ++c) a.y[(t + c) * a.y_stride + j] = out[c];
          }
        }
      }
    }, 4);
    return;
  }
  // Float path: dequantize a tile of weight rows once, dot it with every column.
  auto* rows = static_cast<uint8_t*>(ws) + align64(size_t(m) * cpu::act_bytes(at, k));
  const cpu::ToF32Fn deq = T.to_f32[wi];
  KILN_CHECK(deq != nullptr, "matmul: no dequantizer for {}", gguf::type_name(a.wt));
  pool.parallel_for(a.n, [&](int64_t j0, int64_t j1, int tid) {
    float* tile = reinterpret_cast<float*>(rows + size_t(tid) * align64(size_t(kRowTile * k) * 4));
    for (int64_t jb = j0; jb < j1; jb += kRowTile) {
      const int64_t je = std::min(j1, jb + kRowTile);
      for (int64_t j = jb; j < je; ++j) deq(w + size_t(j) * a.w_stride, tile + (j - jb) * k, k);
      for (int64_t t = 0; t < m; ++t) {
        const float* xt = a.x + t * a.x_stride;
        for (int64_t j = jb; j < je; ++j) a.y[t * a.y_stride + j] = T.dot_f32(tile + (j - jb) * k, xt, k);
      }
    }
  }, 4);
}

void get_rows(GgmlType t, const void* table, size_t row_stride, int64_t n_rows, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride, ThreadPool& pool) {
  const Table& T = cpu::table();
  const cpu::ToF32Fn deq = T.to_f32[cpu::type_index(t)];
  KILN_CHECK(deq != nullptr, "get_rows: unsupported type {}", gguf::type_name(t));
  for (int64_t r = 0; r < n; ++r)
    KILN_CHECK(ids[r] >= 0 && ids[r] < n_rows, "get_rows: id {} out of range [0, {})", ids[r], n_rows);
  pool.parallel_for(n, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      deq(static_cast<const char*>(table) + size_t(ids[r]) * row_stride, out + r * out_stride, k);
  });
}

namespace {
// Runs fn(row_in, row_out) over all rows of x/y, split across the pool.
template <class F>
void for_rows(CRows x, Rows y, ThreadPool& pool, F&& fn) {
  const int64_t nr = x.n1 * x.n2;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, x.ne0));
  auto body = [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i1 = r % x.n1, i2 = r / x.n1;
      fn(x.row(i1, i2), y.row(i1, i2));
    }
  };
  if (nr <= grain) body(0, nr, 0);
  else pool.parallel_for(nr, body, grain);
}
}  // namespace

void rms_norm(CRows x, const float* w, Rows y, float eps, ThreadPool& pool) {
  // ggml's arithmetic (ggml_compute_forward_rms_norm_f32): float squares summed in double, the mean
  // and 1/sqrt in float, then (x * scale) * w.
  const int64_t n = x.ne0;
  for_rows(x, y, pool, [&](const float* xr, float* yr) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i] * xr[i]);
    const float mean = float(sum / double(n));
    const float r = 1.0f / std::sqrt(mean + eps);
    if (w) for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r * w[i];
    else for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r;
  });
}

void l2_norm(CRows x, Rows y, float eps, ThreadPool& pool) {
  const int64_t n = x.ne0;
  for_rows(x, y, pool, [&](const float* xr, float* yr) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float r = float(1.0 / std::max(std::sqrt(ss), double(eps)));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r;
  });
}

void rope(Rows x, const int32_t* pos, const RopeParams& p, ThreadPool& pool) {
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0 && p.n_rot <= 1024, "rope: n_rot {} vs head_dim {}",
             p.n_rot, x.ne0);
  const int half = p.n_rot / 2;
  // ggml's arithmetic (ggml_rope_cache_init): theta_i = pos * theta_scale^i by repeated float
  // multiplication, theta_scale = powf(base, -2/n_rot), cos/sin in float of freq_scale * theta_i.
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
  // Pair i is (e[0], e[off]) with e = row + i * step: (i, i + half) when neox, else (2i, 2i + 1).
  const int64_t off = p.neox ? half : 1, step = p.neox ? 1 : 2;
  pool.parallel_for(x.n2, [&](int64_t t0, int64_t t1, int) {
    float cs[512], sn[512];
    for (int64_t t = t0; t < t1; ++t) {
      float theta = float(pos[t]);
      for (int i = 0; i < half; ++i) {
        const float th = p.freq_scale * theta;
        cs[i] = std::cos(th);
        sn[i] = std::sin(th);
        theta *= theta_scale;
      }
      for (int64_t h = 0; h < x.n1; ++h) {
        float* r = x.row(h, t);
        for (int i = 0; i < half; ++i) {
          float* e = r + i * step;
          const float x0 = e[0], x1 = e[off];
          // ggml's compiler contracts x0*c - x1*s into fma(x0, c, -(x1*s)).
          e[0] = std::fma(x0, cs[i], -(x1 * sn[i]));
          e[off] = std::fma(x0, sn[i], x1 * cs[i]);
        }
      }
    }
  });
}

void softmax(Rows x, float scale, ThreadPool& pool) {
  const int64_t n = x.ne0;
  for_rows(x, x, pool, [&](const float* xr, float* yr) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, scale * xr[i]);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (yr[i] = std::exp(scale * xr[i] - mx));
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) yr[i] *= inv;
  });
}

void silu(const float* x, float* y, int64_t n) { cpu::table().silu(x, y, n); }
void swiglu(const float* gate, const float* up, float* y, int64_t n) { cpu::table().swiglu(gate, up, y, n); }
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n) { cpu::table().sigmoid_mul(x, g, y, n); }
void sigmoid(const float* x, float* y, int64_t n) { cpu::table().sigmoid(x, y, n); }
void softplus(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 20.f ? x[i] : std::log1p(std::exp(x[i]));
}
void add(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i]; }
void mul(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i]; }
void scale(const float* x, float s, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s; }

void topk_route(const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm, float w_scale,
                int32_t* ids, float* weights) {
  KILN_CHECK(k >= 1 && k <= n_expert && n_expert <= 4096, "topk_route: k {} vs n_expert {}", k, n_expert);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* l = logits + t * n_expert;
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
    float sum = 0;
    for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(l[e] - mx);
    // Selection: k passes of argmax over the not-yet-chosen (k is small: 8-10 of 64-512).
    int32_t* id = ids + t * k;
    float* wt = weights + t * k;
    float ksum = 0;
    for (int i = 0; i < k; ++i) {
      int32_t best = -1;
      for (int64_t e = 0; e < n_expert; ++e) {
        bool taken = false;
        for (int j = 0; j < i; ++j) taken |= id[j] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = int32_t(e);
      }
      id[i] = best;
      wt[i] = std::exp(l[best] - mx) / sum;
      ksum += wt[i];
    }
    for (int i = 0; i < k; ++i) wt[i] = (renorm ? wt[i] / ksum : wt[i]) * w_scale;
  }
}

void kv_store(GgmlType type, CRows x, const int32_t* pos, void* dst, size_t pos_stride, size_t head_stride) {
  ref::kv_store(type, x, pos, dst, pos_stride, head_stride);
}

namespace {
constexpr int kAttnG = 8;     // query heads processed together (share each K/V row conversion)
constexpr int kAttnBk = 64;   // keys per tile of the online softmax
constexpr int kMaxSplitsPerThread = 4;

// Online-softmax state of up to kAttnG heads over a key range.
struct AttnState {
  float m[kAttnG], l[kAttnG];
  alignas(64) float acc[kAttnG][512];
};

// Attends heads h0..h0+ng-1 (kv-head hk) of token t over keys [j_begin, j_end) into st.
void attend_range(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                  const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D, float scale,
                  AttnState& st) {
  alignas(64) float kr[512], vr[512];
  float sc[kAttnG][kAttnBk];
  for (int g = 0; g < ng; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0;
    std::fill(st.acc[g], st.acc[g] + D, 0.f);
  }
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kAttnBk) {
    const int nb = int(std::min<int64_t>(kAttnBk, j_end - j0));
    for (int jj = 0; jj < nb; ++jj) {
      kdeq(static_cast<const char*>(kv_k.data) + size_t(j0 + jj) * kv_k.pos_stride + size_t(hk) * kv_k.head_stride, kr, D);
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
      vdeq(static_cast<const char*>(kv_v.data) + size_t(j0 + jj) * kv_v.pos_stride + size_t(hk) * kv_v.head_stride, vr, D);
      for (int g = 0; g < ng; ++g) T.axpy(sc[g][jj], vr, st.acc[g], D);
    }
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
  if (p.order != AttnOrder::Streaming && attention_ggml_supported(kv_k.type, kv_v.type, D)) {
    attention_ggml(q, pos, kv_k, kv_v, p, out, pool);
    return;
  }
  const Table& T = cpu::table();
  const cpu::ToF32Fn kdeq = T.to_f32[cpu::type_index(kv_k.type)], vdeq = T.to_f32[cpu::type_index(kv_v.type)];
  KILN_CHECK(kdeq && vdeq, "attention: unsupported cache types");
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
          attend_range(T, q, t, h0, ng, hk, jb, je, kv_k, kv_v, kdeq, vdeq, D, p.scale, c == 0 ? run : part);
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
        attend_range(T, q, t, h0, ng, hk, jb, je, kv_k, kv_v, kdeq, vdeq, D, p.scale, *slot(n_items + u));
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

void conv1d_silu(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t C, int64_t n_t, int d_conv, ThreadPool& pool) {
  KILN_CHECK(d_conv >= 1 && d_conv <= 8, "conv1d_silu: d_conv {} not in 1..8", d_conv);
  constexpr int kCB = 16;  // channels per inner block (one cache line of x per token)
  const int K = d_conv;
  const Table& T = cpu::table();
  pool.parallel_for((C + kCB - 1) / kCB, [&](int64_t b0, int64_t b1, int) {
    float win[8][kCB], wt[8][kCB];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kCB;
      const int nc = int(std::min<int64_t>(kCB, C - c0));
      for (int c = 0; c < nc; ++c) {
        for (int j = 0; j < K; ++j) wt[j][c] = w[(c0 + c) * K + j];
        for (int j = 0; j < K - 1; ++j) win[j][c] = state[(c0 + c) * (K - 1) + j];
      }
      for (int64_t t = 0; t < n_t; ++t) {
        const float* xt = x + t * x_stride + c0;
        float* yt = y + t * y_stride + c0;
        for (int c = 0; c < nc; ++c) {
          win[K - 1][c] = xt[c];  // read before the (possibly aliased) write below
          float s = 0;
          for (int j = 0; j < K; ++j) s += wt[j][c] * win[j][c];
          yt[c] = s;
          for (int j = 0; j < K - 1; ++j) win[j][c] = win[j + 1][c];
        }
        T.silu(yt, yt, nc);
      }
      for (int c = 0; c < nc; ++c)
        for (int j = 0; j < K - 1; ++j) state[(c0 + c) * (K - 1) + j] = win[j][c];
    }
  });
}

void gated_delta_rule(const DeltaArgs& a, ThreadPool& pool) {
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  const Table& T = cpu::table();
  const int64_t S = a.S;
  const float qscale = 1.0f / std::sqrt(float(S));
  pool.parallel_for(a.Hv, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hk = h % a.Hk;
      float* st = a.state + h * S * S;
      for (int64_t t = 0; t < a.n_t; ++t) {
        const float* q = a.q + t * a.qk_stride + hk * S;
        const float* k = a.k + t * a.qk_stride + hk * S;
        const float* v = a.v + t * a.v_stride + h * S;
        float* o = a.out + t * a.out_stride + h * S;
        const float decay = std::exp(a.g[t * a.Hv + h]), beta = a.beta[t * a.Hv + h];
        for (int64_t j = 0; j < S; ++j) {
          float* row = st + j * S;  // row j = column j of M: M[i][j] for all i
          T.scale(row, decay, S);
          const float dj = (v[j] - T.dot_f32(row, k, S)) * beta;
          T.axpy(dj, k, row, S);
          o[j] = T.dot_f32(row, q, S) * qscale;
        }
      }
    }
  });
}

namespace {
// Per-thread scratch of the chunked form: KS QS Dl [C, S], KK QK [C, C], G cf [C] floats.
size_t delta_chunk_bytes(int64_t S, int64_t C) { return align64(size_t(3 * C * S + 2 * C * C + 2 * C) * 4); }
}  // namespace

size_t gated_delta_chunked_workspace(int64_t S, int chunk, int n_threads) {
  return size_t(n_threads) * delta_chunk_bytes(S, chunk);
}

// Chunked form. Within a chunk of L tokens with cumulative log-decay G_t (inclusive) and start
// state M0, the deltas solve a unit lower-triangular system and the outputs / final state follow:
//   d_t = beta_t (v_t - e^{G_t} M0^T k_t - sum_{s<t} e^{G_t-G_s} (k_t.k_s) d_s)
//   o_t = (e^{G_t} M0^T q_t + sum_{s<=t} e^{G_t-G_s} (q_t.k_s) d_s) / sqrt(S)
//   M_L = e^{G_L} M0 + sum_s e^{G_L-G_s} k_s d_s^T
void gated_delta_rule_chunked(const DeltaArgs& a, int chunk, void* ws, ThreadPool& pool) {
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule_chunked: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  KILN_CHECK(chunk >= 1 && ws != nullptr, "gated_delta_rule_chunked: chunk {} / workspace", chunk);
  const Table& T = cpu::table();
  const int64_t S = a.S, C = chunk;
  const float qscale = 1.0f / std::sqrt(float(S));
  const size_t per = delta_chunk_bytes(S, C);
  pool.parallel_for(a.Hv, [&](int64_t h0, int64_t h1, int tid) {
    float* base = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + size_t(tid) * per);
    float* KS = base;          // [S, C]: row t = M0^T k_t
    float* QS = KS + C * S;    // [S, C]: row t = M0^T q_t
    float* Dl = QS + C * S;    // [S, C]: row t = d_t
    float* KK = Dl + C * S;    // [C, C]: KK[t*C + s] = k_t.k_s
    float* QK = KK + C * C;    // [C, C]
    float* G = QK + C * C;     // [C]
    float* cf = G + C;         // [C]
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hk = h % a.Hk;
      float* st = a.state + h * S * S;
      for (int64_t t0 = 0; t0 < a.n_t; t0 += C) {
        const int64_t L = std::min<int64_t>(C, a.n_t - t0);
        auto qv = [&](int64_t t) { return a.q + (t0 + t) * a.qk_stride + hk * S; };
        auto kv = [&](int64_t t) { return a.k + (t0 + t) * a.qk_stride + hk * S; };
        float gs = 0;
        for (int64_t t = 0; t < L; ++t) G[t] = (gs += a.g[(t0 + t) * a.Hv + h]);
        for (int64_t t = 0; t < L; ++t)
          for (int64_t j = 0; j < S; ++j) {
            KS[t * S + j] = T.dot_f32(st + j * S, kv(t), S);
            QS[t * S + j] = T.dot_f32(st + j * S, qv(t), S);
          }
        for (int64_t t = 0; t < L; ++t)
          for (int64_t s = 0; s <= t; ++s) {
            KK[t * C + s] = T.dot_f32(kv(t), kv(s), S);
            QK[t * C + s] = T.dot_f32(qv(t), kv(s), S);
          }
        for (int64_t t = 0; t < L; ++t) {
          const float beta = a.beta[(t0 + t) * a.Hv + h], eg = std::exp(G[t]);
          const float* v = a.v + (t0 + t) * a.v_stride + h * S;
          float* d = Dl + t * S;
          for (int64_t j = 0; j < S; ++j) d[j] = v[j] - eg * KS[t * S + j];
          for (int64_t s = 0; s < t; ++s) T.axpy(-std::exp(G[t] - G[s]) * KK[t * C + s], Dl + s * S, d, S);
          T.scale(d, beta, S);
          float* o = a.out + (t0 + t) * a.out_stride + h * S;
          for (int64_t j = 0; j < S; ++j) o[j] = eg * QS[t * S + j];
          for (int64_t s = 0; s <= t; ++s) T.axpy(std::exp(G[t] - G[s]) * QK[t * C + s], Dl + s * S, o, S);
          T.scale(o, qscale, S);
        }
        const float eL = std::exp(G[L - 1]);
        for (int64_t s = 0; s < L; ++s) cf[s] = std::exp(G[L - 1] - G[s]);
        for (int64_t j = 0; j < S; ++j) {
          float* row = st + j * S;
          T.scale(row, eL, S);
          for (int64_t s = 0; s < L; ++s) T.axpy(cf[s] * Dl[s * S + j], kv(s), row, S);
        }
      }
    }
  });
}

}  // namespace kiln::kernels
