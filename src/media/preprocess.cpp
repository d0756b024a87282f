// media/preprocess.cpp — the Qwen-VL image preprocessing as llama.cpp's mtmd dyn_size preprocessor
// does it: the target size (calc_size_preserved_ratio: round each side to patch*merge, then scale
// into [min_pixels, max_pixels] keeping the aspect ratio), a Pillow-compatible bicubic resize
// (separable, a = -0.5, the filter widened when downsampling, each pass rounded to 8 bits), and the
// per-channel normalisation. See image.h.
#include <algorithm>
#include <cmath>

#include "media/image.h"

namespace kiln::media {

void target_size(int w, int h, const PreprocessParams& p, int& out_w, int& out_h) {
  const int f = p.patch * p.merge;
  const int64_t area = int64_t(f) * f;
  const int64_t min_px = p.min_tokens * area, max_px = p.max_tokens * area;
  auto round_f = [f](float x) { return int(std::round(x / float(f))) * f; };
  auto ceil_f = [f](float x) { return int(std::ceil(x / float(f))) * f; };
  auto floor_f = [f](float x) { return int(std::floor(x / float(f))) * f; };
  int wb = std::max(f, round_f(float(w))), hb = std::max(f, round_f(float(h)));
  if (max_px > 0 && int64_t(hb) * wb > max_px) {
    const float beta = std::sqrt(float(h) * float(w) / float(max_px));
    hb = std::max(f, floor_f(float(h) / beta));
    wb = std::max(f, floor_f(float(w) / beta));
  } else if (min_px > 0 && int64_t(hb) * wb < min_px) {
    const float beta = std::sqrt(float(min_px) / (float(h) * float(w)));
    hb = ceil_f(float(h) * beta);
    wb = ceil_f(float(w) * beta);
  }
  out_w = wb, out_h = hb;
}

namespace {

double cubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Pillow's precompute_coeffs: for each output index, the first input index, the count and the
// normalised weights.
struct Coeffs {
  int ksize = 0;
  std::vector<int> lo, n;
  std::vector<double> w;
};
Coeffs coeffs(int in, int out) {
  Coeffs c;
  const double scale = double(in) / out;
  const double fs = std::max(scale, 1.0);
  const double support = 2.0 * fs;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.lo.resize(size_t(out));
  c.n.resize(size_t(out));
  c.w.assign(size_t(out) * size_t(c.ksize), 0.0);
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    int xmin = int(center - support + 0.5), xmax = int(center + support + 0.5);
    xmin = std::max(xmin, 0);
    xmax = std::min(xmax, in) - xmin;
    double* k = &c.w[size_t(o) * size_t(c.ksize)];
    double ss = 0;
    for (int x = 0; x < xmax; ++x) ss += (k[x] = cubic((x + xmin - center + 0.5) / fs));
    for (int x = 0; x < xmax; ++x)
      if (ss != 0) k[x] /= ss;
    c.lo[size_t(o)] = xmin;
    c.n[size_t(o)] = xmax;
  }
  return c;
}

uint8_t clip8(double v) {
  // Pillow's fixed point rounds half up; in double that is floor(v + 0.5).
  const double r = std::floor(v + 0.5);
  return uint8_t(r < 0 ? 0 : r > 255 ? 255 : r);
}

}  // namespace

Image resize_bicubic(const Image& s, int w, int h) {
  if (s.w == w && s.h == h) return s;
  // Horizontal pass, then vertical (Pillow's order).
  Image mid;
  mid.w = w, mid.h = s.h;
  mid.rgb.resize(size_t(w) * size_t(s.h) * 3);
  const Coeffs cx = coeffs(s.w, w);
  for (int y = 0; y < s.h; ++y)
    for (int x = 0; x < w; ++x) {
      const double* k = &cx.w[size_t(x) * size_t(cx.ksize)];
      for (int c = 0; c < 3; ++c) {
        double acc = 0;
        for (int i = 0; i < cx.n[size_t(x)]; ++i) acc += k[i] * s.rgb[(size_t(y) * s.w + size_t(cx.lo[size_t(x)] + i)) * 3 + c];
        mid.rgb[(size_t(y) * w + x) * 3 + c] = clip8(acc);
      }
    }
  Image d;
  d.w = w, d.h = h;
  d.rgb.resize(size_t(w) * size_t(h) * 3);
  const Coeffs cy = coeffs(s.h, h);
  for (int y = 0; y < h; ++y) {
    const double* k = &cy.w[size_t(y) * size_t(cy.ksize)];
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        double acc = 0;
        for (int i = 0; i < cy.n[size_t(y)]; ++i) acc += k[i] * mid.rgb[(size_t(cy.lo[size_t(y)] + i) * w + x) * 3 + c];
        d.rgb[(size_t(y) * w + x) * 3 + c] = clip8(acc);
      }
  }
  return d;
}

Pixels preprocess(const Image& img, const PreprocessParams& p) {
  int w = 0, h = 0;
  target_size(img.w, img.h, p, w, h);
  const Image r = resize_bicubic(img, w, h);
  Pixels out;
  out.w = w, out.h = h;
  out.chw.resize(size_t(3) * size_t(w) * size_t(h));
  const size_t plane = size_t(w) * size_t(h);
  for (size_t i = 0; i < plane; ++i)
    for (int c = 0; c < 3; ++c)
      out.chw[size_t(c) * plane + i] = (float(r.rgb[i * 3 + size_t(c)]) / 255.0f - p.mean[c]) / p.std[c];
  return out;
}

}  // namespace kiln::media
