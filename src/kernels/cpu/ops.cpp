// kernels/cpu/ops.cpp — the dispatched, multi-threaded row and element ops of kernels/ops.h: norms,
//   rope, softmax, elementwise, top-k selection and routing, hadamard, kv_store. The mat-mul is in
//   matmul.cpp, attention in attention.cpp, conv1d and the gated delta rule in delta.cpp.
// Threading: rows split across the pool (static ranges); per-row results never depend on the split.
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
  // llama.cpp's build_gdn_l2_norm: rms_norm(x, eps/n) (float squares summed in double, as rms_norm
  // above), then a scale by 1/sqrt(n): y = (x * r) * (1/sqrt(n)), r = 1/sqrt(mean + eps/n).
  const float fn = float(n), eps_n = eps / fn, post = 1.0f / std::sqrt(fn);
  for_rows(x, y, pool, [&](const float* xr, float* yr) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i] * xr[i]);
    const float mean = float(sum / double(n));
    const float r = 1.0f / std::sqrt(mean + eps_n);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r * post;
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

void rope_multi(Rows x, const int32_t* pos, const RopeParams& p, ThreadPool& pool) {
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0 && p.n_rot <= 1024,
             "rope_multi: n_rot {} vs head_dim {}", p.n_rot, x.ne0);
  KILN_CHECK(p.multi != RopeParams::Multi::None, "rope_multi: RopeParams::multi is None");
  const int half = p.n_rot / 2;
  const bool vision = p.multi == RopeParams::Multi::Vision;
  // ggml_mrope_cache_init: one running theta per stream, all multiplied by theta_scale every pair;
  // vision restarts a stream's theta at its section's first pair. With equal positions in every
  // stream (text tokens) the angles are rope()'s bit for bit.
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(vision ? half : p.n_rot));
  int stream[512], start[512];
  for (int i = 0; i < half; ++i) {
    int e = 0;
    rope_multi_pair(p, i, stream[i], e);
    start[i] = vision && e == 0;
  }
  pool.parallel_for(x.n2, [&](int64_t t0, int64_t t1, int) {
    float cs[512], sn[512];
    for (int64_t t = t0; t < t1; ++t) {
      float th[4];
      for (int s = 0; s < 4; ++s) th[s] = float(pos[s * x.n2 + t]);
      for (int i = 0; i < half; ++i) {
        if (start[i]) th[stream[i]] = float(pos[stream[i] * x.n2 + t]);
        const float a = p.freq_scale * th[stream[i]];
        cs[i] = std::cos(a);
        sn[i] = std::sin(a);
        for (float& v : th) v *= theta_scale;
      }
      for (int64_t h = 0; h < x.n1; ++h) {
        float* r = x.row(h, t);
        for (int i = 0; i < half; ++i) {
          const float x0 = r[i], x1 = r[i + half];
          r[i] = std::fma(x0, cs[i], -(x1 * sn[i]));
          r[i + half] = std::fma(x0, sn[i], x1 * cs[i]);
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
void gelu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
  }
}
void gelu_erf(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678f));
}

void softplus(const float* x, float* y, int64_t n) {
  // ggml's softplus: logf(1 + expf(x)), x above 20 passed through.
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 20.f ? x[i] : std::log(1.0f + std::exp(x[i]));
}
void add(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i]; }
void mul(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i]; }
void scale(const float* x, float s, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s; }

namespace {
// id[0..k) = the k largest scores, largest first (ties: lower index): k passes of argmax over the
// not-yet-chosen (k is small: 8-10 of 64-512).
void select_topk(const float* score, int64_t n, int k, int32_t* id) {
  for (int i = 0; i < k; ++i) {
    int32_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int j = 0; j < i; ++j) taken |= id[j] == e;
      if (!taken && (best < 0 || score[e] > score[best])) best = int32_t(e);
    }
    id[i] = best;
  }
}

// The maximum of l[0, 32) from -inf (a NaN never wins a comparison, so it is ignored), as 8
// independent max chains.
inline float max32(const float* l) {
  float mx[8];
  for (int j = 0; j < 8; ++j) mx[j] = -INFINITY;
  for (int i = 0; i < 32; i += 8)
    for (int j = 0; j < 8; ++j) mx[j] = mx[j] < l[i + j] ? l[i + j] : mx[j];
  float m = -INFINITY;
  for (int j = 0; j < 8; ++j) m = m < mx[j] ? mx[j] : m;
  return m;
}

// The first maximum of l[0, n) (NaNs ignored; 0 when every entry is NaN): the maxima of blocks of 32,
// then the first block holding the largest, then its first entry equal to it.
int64_t vocab_argmax(const float* l, int64_t n) {
  float best = -INFINITY;
  int64_t bb = 0, e = 0;
  for (; e + 32 <= n; e += 32) {
    const float m = max32(l + e);
    if (best < m) best = m, bb = e;
  }
  for (int64_t i = e; i < n; ++i)
    if (best < l[i]) best = l[i], bb = i;
  for (int64_t i = bb; i < n; ++i)
    if (l[i] == best) return i;
  return 0;
}
}  // namespace

// One pass per row keeping the k best so far in a heap whose front is the worst of them, then the
// heap sorted best first. While that worst is a number, an entry enters only if it is larger (a NaN
// or an equal value with its higher id never does), so blocks of 32 whose maximum is not larger are
// skipped (max32: a NaN cannot hide a larger value); the rest take the exact test. 248k logits at
// k = 1: ~175 -> ~70 us a row.
void top_logits(const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals) {
  KILN_CHECK(k >= 1 && k <= V, "top_logits: k {} vs V {}", k, V);
  struct E {
    float v;
    int32_t id;
  };
  // a before b: larger value, NaN last, ties lower id first.
  const auto before = [](const E& a, const E& b) {
    const bool na = a.v != a.v, nb = b.v != b.v;
    if (na || nb) return na == nb ? a.id < b.id : nb;
    return a.v > b.v || (a.v == b.v && a.id < b.id);
  };
  thread_local std::vector<E> heap;
  heap.resize(size_t(k));
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits + r * V;
    for (int i = 0; i < k; ++i) heap[size_t(i)] = {l[i], int32_t(i)};
    std::make_heap(heap.begin(), heap.end(), before);
    for (int64_t e = k; e < V;) {
      const float thr = heap.front().v;
      if (thr == thr) {
        for (; e + 32 <= V; e += 32) {
          if (max32(l + e) > thr) break;
        }
      }
      for (const int64_t end = std::min(V, e + 32); e < end; ++e) {
        const E c{l[e], int32_t(e)};
        if (!before(c, heap.front())) continue;
        std::pop_heap(heap.begin(), heap.end(), before);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), before);
      }
    }
    std::sort_heap(heap.begin(), heap.end(), before);
    for (int i = 0; i < k; ++i) {
      ids[r * k + i] = heap[size_t(i)].id;
      vals[r * k + i] = heap[size_t(i)].v;
    }
  }
}

void topk_route(const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm, float w_scale,
                int32_t* ids, float* weights) {
  KILN_CHECK(k >= 1 && k <= n_expert && (n_expert <= 4096 || k == 1), "topk_route: k {} vs n_expert {}", k, n_expert);
  const cpu::Table& T = cpu::table();
  if (n_expert > 4096) {
    // k = 1 over a vocabulary (the MTP drafter's argmax, model/mtp.cpp): the first maximum and its
    // softmax probability (the sum of exp in double: the table's vector exp by chunks where it has
    // one, else a double exp per logit), scaled unless renorm (then 1) — not a router.
    constexpr int64_t kChunk = 1024;
    float ex[kChunk];
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* l = logits + t * n_expert;
      const int64_t best = vocab_argmax(l, n_expert);
      double sum = 0;
      if (T.ggml_softmax_exp)
        for (int64_t e0 = 0; e0 < n_expert; e0 += kChunk)
          sum += T.ggml_softmax_exp(l + e0, l[best], ex, std::min(kChunk, n_expert - e0));
      else
        for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(double(l[e]) - double(l[best]));
      ids[t] = int32_t(best);
      weights[t] = (renorm ? 1.0f : float(1.0 / sum)) * w_scale;
    }
    return;
  }
  if (T.ggml_softmax_exp) {
    // llama.cpp's build_moe_ffn (softmax gating) in ggml's arithmetic: p = soft_max(logits) (vector
    // exp, sum in double, times float(1/sum)); top k of p by argsort, descending (ties: lower id);
    // w = p of those; renormalised by their sum (in double, rounded to float, clamped below at
    // 2^-14) with a float division; scaled unless the scale is 0 or 1.
    float p[4096];
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* l = logits + t * n_expert;
      float mx = -INFINITY;
      for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
      const float inv = float(1.0 / T.ggml_softmax_exp(l, mx, p, n_expert));
      for (int64_t e = 0; e < n_expert; ++e) p[e] *= inv;
      int32_t* id = ids + t * k;
      float* wt = weights + t * k;
      select_topk(p, n_expert, k, id);
      for (int i = 0; i < k; ++i) wt[i] = p[id[i]];
      if (renorm) {
        double ws = 0;
        for (int i = 0; i < k; ++i) ws += double(wt[i]);
        const float wsum = std::max(float(ws), 6.103515625e-5f);
        for (int i = 0; i < k; ++i) wt[i] = wt[i] / wsum;
      }
      if (w_scale != 0.0f && w_scale != 1.0f)
        for (int i = 0; i < k; ++i) wt[i] *= w_scale;
    }
    return;
  }
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* l = logits + t * n_expert;
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
    float sum = 0;
    for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(l[e] - mx);
    int32_t* id = ids + t * k;
    float* wt = weights + t * k;
    select_topk(l, n_expert, k, id);
    float ksum = 0;
    for (int i = 0; i < k; ++i) {
      wt[i] = std::exp(l[id[i]] - mx) / sum;
      ksum += wt[i];
    }
    for (int i = 0; i < k; ++i) wt[i] = (renorm ? wt[i] / ksum : wt[i]) * w_scale;
  }
}

void hadamard(Rows x, int64_t n, ThreadPool& pool) {
  KILN_CHECK(n > 0 && (n & (n - 1)) == 0 && x.ne0 % n == 0, "hadamard: chunk {} of rows of {}", n, x.ne0);
  const float sc = 1.0f / std::sqrt(float(n));
  pool.parallel_for(x.n_rows(), [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = x.row(r % x.n1, r / x.n1);
      for (int64_t c = 0; c < x.ne0; c += n) {
        float* y = row + c;
        for (int64_t i = 0; i < n; ++i) y[i] *= sc;
        for (int64_t len = 1; len < n; len <<= 1)
          for (int64_t i = 0; i < n; i += 2 * len)
            for (int64_t j = i; j < i + len; ++j) {
              const float u = y[j], v = y[j + len];
              y[j] = u + v;
              y[j + len] = u - v;
            }
      }
    }
  });
}

void kv_store(GgmlType type, CRows x, const int32_t* pos, void* dst, size_t pos_stride, size_t head_stride) {
  // Q8_0 rows as ggml's CPU backend writes them (its SIMD quantize_row_q8_0, which rounds differently
  // from the reference quantizer); the other types through the reference conversion, as ggml does.
  const cpu::QuantizeActFn q8 = cpu::table().quantize_act[cpu::type_index(GgmlType::Q8_0)];
  if (type != GgmlType::Q8_0 || !q8 || x.ne0 % 32 != 0) {
    ref::kv_store(type, x, pos, dst, pos_stride, head_stride);
    return;
  }
  for (int64_t t = 0; t < x.n2; ++t)
    for (int64_t h = 0; h < x.n1; ++h)
      q8(x.row(h, t), x.ne0, static_cast<char*>(dst) + size_t(pos[t]) * pos_stride + size_t(h) * head_stride);
}

}  // namespace kiln::kernels
