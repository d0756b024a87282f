#include "kernels/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "tensor/quant.h"

namespace kiln::kernels {

bool matmul_supported(GgmlType wt) {
  switch (wt) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

namespace ref {

using tensor::dequantize_row;

namespace {
// fn(row of x, row of y) for every row (i1, i2).
template <class F>
void each_row(CRows x, Rows y, F&& fn) {
  for (int64_t i2 = 0; i2 < x.n2; ++i2)
    for (int64_t i1 = 0; i1 < x.n1; ++i1) fn(x.row(i1, i2), y.row(i1, i2));
}
double sum_sq(const float* x, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return ss;
}
}  // namespace

void matmul(const MatmulArgs& a) {
  KILN_CHECK(matmul_supported(a.wt), "matmul: unsupported weight type {}", gguf::type_name(a.wt));
  std::vector<float> row(static_cast<size_t>(a.k));
  for (int64_t j = 0; j < a.n; ++j) {
    dequantize_row(a.wt, static_cast<const char*>(a.w) + size_t(j) * a.w_stride, row.data(), a.k);
    for (int64_t t = 0; t < a.m; ++t) {
      const float* x = a.x + t * a.x_stride;
      double s = 0;
      for (int64_t i = 0; i < a.k; ++i) s += double(row[size_t(i)]) * x[i];
      a.y[t * a.y_stride + j] = float(s);
    }
  }
}

void get_rows(GgmlType t, const void* table, size_t row_stride, int64_t n_rows, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < n; ++r) {
    KILN_CHECK(ids[r] >= 0 && ids[r] < n_rows, "get_rows: id {} out of range [0, {})", ids[r], n_rows);
    dequantize_row(t, static_cast<const char*>(table) + size_t(ids[r]) * row_stride, out + r * out_stride, k);
  }
}

void rms_norm(CRows x, const float* w, Rows y, float eps) {
  each_row(x, y, [&](const float* xr, float* yr) {
    const double r = 1.0 / std::sqrt(sum_sq(xr, x.ne0) / double(x.ne0) + double(eps));
    for (int64_t i = 0; i < x.ne0; ++i) yr[i] = float(xr[i] * r * (w ? w[i] : 1.0f));
  });
}

void l2_norm(CRows x, Rows y, float eps) {
  each_row(x, y, [&](const float* xr, float* yr) {
    const double r = 1.0 / std::max(std::sqrt(sum_sq(xr, x.ne0)), double(eps));
    for (int64_t i = 0; i < x.ne0; ++i) yr[i] = float(xr[i] * r);
  });
}

void rope(Rows x, const int32_t* pos, const RopeParams& p) {
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0, "rope: n_rot {} vs head_dim {}", p.n_rot, x.ne0);
  const int half = p.n_rot / 2;
  for (int64_t t = 0; t < x.n2; ++t)
    for (int64_t h = 0; h < x.n1; ++h) {
      float* r = x.row(h, t);
      for (int i = 0; i < half; ++i) {
        const double theta = double(pos[t]) * p.freq_scale * std::pow(double(p.freq_base), -2.0 * i / p.n_rot);
        const double c = std::cos(theta), s = std::sin(theta);
        const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
        const double x0 = r[a], x1 = r[b];
        r[a] = float(x0 * c - x1 * s);
        r[b] = float(x0 * s + x1 * c);
      }
    }
}

void rope_multi(Rows x, const int32_t* pos, const RopeParams& p) {
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0, "rope_multi: n_rot {} vs head_dim {}", p.n_rot, x.ne0);
  KILN_CHECK(p.multi != RopeParams::Multi::None, "rope_multi: RopeParams::multi is None");
  const int half = p.n_rot / 2;
  const double nd = p.multi == RopeParams::Multi::Vision ? half : p.n_rot;
  for (int64_t t = 0; t < x.n2; ++t)
    for (int64_t h = 0; h < x.n1; ++h) {
      float* r = x.row(h, t);
      for (int i = 0; i < half; ++i) {
        int s = 0, e = 0;
        rope_multi_pair(p, i, s, e);
        const double theta = double(pos[s * x.n2 + t]) * p.freq_scale * std::pow(double(p.freq_base), -2.0 * e / nd);
        const double c = std::cos(theta), sn = std::sin(theta);
        const double x0 = r[i], x1 = r[i + half];
        r[i] = float(x0 * c - x1 * sn);
        r[i + half] = float(x0 * sn + x1 * c);
      }
    }
}

void softmax(Rows x, float scale) {
  each_row(x, x, [&](const float*, float* r) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < x.ne0; ++i) mx = std::max(mx, double(scale) * r[i]);
    double sum = 0;
    for (int64_t i = 0; i < x.ne0; ++i) sum += std::exp(double(scale) * r[i] - mx);
    for (int64_t i = 0; i < x.ne0; ++i) r[i] = float(std::exp(double(scale) * r[i] - mx) / sum);
  });
}

static double silu_d(double v) { return v / (1.0 + std::exp(-v)); }
static double sigmoid_d(double v) { return 1.0 / (1.0 + std::exp(-v)); }

void silu(const float* x, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = float(silu_d(x[i])); }
void swiglu(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(silu_d(gate[i]) * up[i]);
}
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(x[i] * sigmoid_d(g[i]));
}
void sigmoid(const float* x, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = float(sigmoid_d(x[i])); }
void gelu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
  }
}
void gelu_erf(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = float(0.5 * v * (1.0 + std::erf(v * 0.7071067811865476)));
  }
}

void softplus(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = float(v > 20 ? v : std::log1p(std::exp(v)));
  }
}
void add(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i]; }
void mul(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i]; }
void scale(const float* x, float s, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s; }

void top_logits(const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals) {
  KILN_CHECK(k >= 1 && k <= V, "top_logits: k {} vs V {}", k, V);
  std::vector<int32_t> idx(static_cast<size_t>(V));
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits + r * V;
    std::iota(idx.begin(), idx.end(), 0);
    // Stable: equal values keep ascending ids. NaN after every number.
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      const bool na = std::isnan(l[a]), nb = std::isnan(l[b]);
      return na || nb ? !na && nb : l[a] > l[b];
    });
    for (int i = 0; i < k; ++i) {
      ids[r * k + i] = idx[size_t(i)];
      vals[r * k + i] = l[idx[size_t(i)]];
    }
  }
}

void topk_route(const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm, float w_scale,
                int32_t* ids, float* weights) {
  KILN_CHECK(k >= 1 && k <= n_expert, "topk_route: k {} vs n_expert {}", k, n_expert);
  std::vector<double> p(static_cast<size_t>(n_expert));
  std::vector<int32_t> idx(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* l = logits + t * n_expert;
    double mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, double(l[e]));
    double sum = 0;
    for (int64_t e = 0; e < n_expert; ++e) sum += (p[size_t(e)] = std::exp(double(l[e]) - mx));
    for (auto& v : p) v /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    double ksum = 0;
    for (int i = 0; i < k; ++i) ksum += p[size_t(idx[size_t(i)])];
    for (int i = 0; i < k; ++i) {
      ids[t * k + i] = idx[size_t(i)];
      double w = p[size_t(idx[size_t(i)])];
      if (renorm) w /= ksum;
      weights[t * k + i] = float(w * w_scale);
    }
  }
}

void kv_store(GgmlType type, CRows x, const int32_t* pos, void* dst, size_t pos_stride, size_t head_stride) {
  KILN_CHECK(type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::Q8_0 || type == GgmlType::Q4_0,
             "kv_store: unsupported cache type {}", gguf::type_name(type));
  for (int64_t t = 0; t < x.n2; ++t)
    for (int64_t h = 0; h < x.n1; ++h)
      tensor::quantize_row(type, x.row(h, t),
                           static_cast<char*>(dst) + size_t(pos[t]) * pos_stride + size_t(h) * head_stride, x.ne0);
}

void attention(CRows q, const int32_t* pos, const KvView& k, const KvView& v, const AttnParams& p, Rows out) {
  const int64_t D = p.head_dim, group = p.n_head / p.n_head_kv;
  KILN_CHECK(p.n_head % p.n_head_kv == 0, "attention: n_head {} % n_head_kv {}", p.n_head, p.n_head_kv);
  std::vector<float> kr(static_cast<size_t>(D)), vr(static_cast<size_t>(D));
  std::vector<double> sc, acc(static_cast<size_t>(D));
  for (int64_t t = 0; t < q.n2; ++t) {
    const int64_t n = int64_t(pos[t]) + 1;
    KILN_CHECK(n >= 1 && n <= k.n_kv && n <= v.n_kv, "attention: pos {} outside cache of {}", pos[t], k.n_kv);
    sc.assign(size_t(n), 0);
    for (int64_t h = 0; h < p.n_head; ++h) {
      const int64_t hk = h / group;
      const float* qr = q.row(h, t);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        dequantize_row(k.type, static_cast<const char*>(k.data) + size_t(j) * k.pos_stride + size_t(hk) * k.head_stride,
                       kr.data(), D);
        double s = 0;
        for (int64_t i = 0; i < D; ++i) s += double(qr[i]) * kr[size_t(i)];
        sc[size_t(j)] = s * p.scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      double sum = 0;
      for (auto& s : sc) sum += (s = std::exp(s - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        dequantize_row(v.type, static_cast<const char*>(v.data) + size_t(j) * v.pos_stride + size_t(hk) * v.head_stride,
                       vr.data(), D);
        for (int64_t i = 0; i < D; ++i) acc[size_t(i)] += sc[size_t(j)] * vr[size_t(i)];
      }
      float* o = out.row(h, t);
      for (int64_t i = 0; i < D; ++i) o[i] = float(acc[size_t(i)] / sum);
    }
  }
}

void conv1d_silu(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t C, int64_t n_t, int d_conv) {
  const int K = d_conv;
  std::vector<float> buf(static_cast<size_t>(K - 1 + n_t));
  for (int64_t c = 0; c < C; ++c) {
    float* st = state + c * (K - 1);
    for (int i = 0; i < K - 1; ++i) buf[size_t(i)] = st[i];
    for (int64_t t = 0; t < n_t; ++t) buf[size_t(K - 1 + t)] = x[t * x_stride + c];
    for (int64_t t = 0; t < n_t; ++t) {
      double s = 0;
      for (int j = 0; j < K; ++j) s += double(w[c * K + j]) * buf[size_t(t + j)];
      y[t * y_stride + c] = float(silu_d(s));
    }
    for (int i = 0; i < K - 1; ++i) st[i] = buf[size_t(n_t + i)];
  }
}

void gated_delta_rule(const DeltaArgs& a) {
  const int64_t S = a.S;
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  const double qscale = 1.0 / std::sqrt(double(S));
  std::vector<double> M(size_t(S * S)), d(static_cast<size_t>(S));
  for (int64_t h = 0; h < a.Hv; ++h) {
    const int64_t hk = h % a.Hk;
    float* st = a.state + h * S * S;
    for (int64_t j = 0; j < S; ++j)
      for (int64_t i = 0; i < S; ++i) M[size_t(i * S + j)] = st[j * S + i];
    for (int64_t t = 0; t < a.n_t; ++t) {
      const float* q = a.q + t * a.qk_stride + hk * S;
      const float* k = a.k + t * a.qk_stride + hk * S;
      const float* v = a.v + t * a.v_stride + h * S;
      const double decay = std::exp(double(a.g[t * a.Hv + h])), beta = a.beta[t * a.Hv + h];
      for (auto& m : M) m *= decay;
      for (int64_t j = 0; j < S; ++j) {
        double kvm = 0;
        for (int64_t i = 0; i < S; ++i) kvm += M[size_t(i * S + j)] * k[i];
        d[size_t(j)] = (v[j] - kvm) * beta;
      }
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) M[size_t(i * S + j)] += double(k[i]) * d[size_t(j)];
      float* o = a.out + t * a.out_stride + h * S;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t i = 0; i < S; ++i) s += M[size_t(i * S + j)] * q[i];
        o[j] = float(s * qscale);
      }
      if (a.keep != nullptr && a.keep[t] != nullptr)
        for (int64_t j = 0; j < S; ++j)
          for (int64_t i = 0; i < S; ++i) a.keep[t][h * S * S + j * S + i] = float(M[size_t(i * S + j)]);
    }
    for (int64_t j = 0; j < S; ++j)
      for (int64_t i = 0; i < S; ++i) st[j * S + i] = float(M[size_t(i * S + j)]);
  }
}

}  // namespace ref
}  // namespace kiln::kernels
