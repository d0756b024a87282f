// tools/kiln/kld_file.h — llama-perplexity's KL-divergence base file ("--kl-divergence-base"), so
//   kiln and llama.cpp logits can be compared in either direction, and the statistics that
//   `--kl-divergence` prints.
// Format (little-endian): "_logits_" | int32 n_ctx | int32 n_vocab | int32 n_chunk |
//   int32 tokens[n_chunk * n_ctx] (the text's tokens, before any BOS substitution) | per chunk,
//   per scored position (n_ctx - 1 - n_ctx/2 of them, predicting tokens first+1 .. n_ctx-1):
//   nv = 2*((n_vocab+1)/2) + 4 uint16 words: float scale, float min_log_prob, then n_vocab codes;
//   log p[v] = scale * code[v] + min_log_prob, codes 0 for logits more than 16 below the maximum.
// Owns: the encoding and the statistics; nothing else (the caller computes logits).
// Threading: plain functions and a value type.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace kiln::tools {

inline int kld_words(int64_t n_vocab) { return int(2 * ((n_vocab + 1) / 2) + 4); }

// Encodes one position's logits into kld_words(n_vocab) words; returns its NLL of `target`.
inline double kld_encode(const float* logits, int64_t n_vocab, int32_t target, uint16_t* out) {
  float mx = logits[0], mn = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) {
    mx = std::max(mx, logits[i]);
    mn = std::min(mn, logits[i]);
  }
  mn = std::max(mn, mx - 16);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i] - mx));
  const float lse = float(std::log(sum));
  const float min_lp = mn - mx - lse, scale = (mx - mn) / 65535.f;
  std::memcpy(out, &scale, 4);
  std::memcpy(out + 2, &min_lp, 4);
  uint16_t* code = out + 4;
  if (scale > 0) {
    const float inv = 1 / scale;
    for (int64_t i = 0; i < n_vocab; ++i)
      code[i] = logits[i] > mn ? uint16_t(std::clamp(std::lround(inv * (logits[i] - mn)), 0L, 65535L)) : 0;
  } else {
    std::fill_n(code, n_vocab, uint16_t(0));
  }
  return double(mx) + double(lse) - double(logits[target]);
}

// Running statistics of `--kl-divergence` (the quantities llama-perplexity prints).
struct KldStats {
  double nll = 0, nll2 = 0, nll_base = 0, nll_base2 = 0, nll_cross = 0;
  double kld = 0, kld2 = 0, dp = 0, dp2 = 0;
  float max_dp = 0;
  int64_t same_top = 0, count = 0;
  std::vector<float> klds;  // per position, for the percentiles

  // One position: the model's logits vs the base words.
  void add(const float* logits, int64_t n_vocab, int32_t target, const uint16_t* base) {
    int64_t imax = 0;
    for (int64_t i = 1; i < n_vocab; ++i)
      if (logits[i] > logits[imax]) imax = i;
    const float mx = logits[imax];
    double sum = 0;
    for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i] - mx));
    const double lse = double(mx) + std::log(sum);  // log-sum-exp
    float scale, min_lp;
    std::memcpy(&scale, base, 4);
    std::memcpy(&min_lp, base + 2, 4);
    const uint16_t* code = base + 4;
    const double q_nll = lse - double(logits[target]);
    const double b_nll = -(double(scale) * code[target] + double(min_lp));
    nll += q_nll;
    nll2 += q_nll * q_nll;
    nll_base += b_nll;
    nll_base2 += b_nll * b_nll;
    nll_cross += q_nll * b_nll;
    double k = 0;
    int64_t ibase = 0;
    float best = -INFINITY;
    for (int64_t i = 0; i < n_vocab; ++i) {
      const float lp = scale * code[i] + min_lp;
      if (lp > best) {
        best = lp;
        ibase = i;
      }
      if (lp > -16.f) k += std::exp(double(lp)) * (double(lp) - (double(logits[i]) - lse));
    }
    kld += k;
    kld2 += k * k;
    klds.push_back(float(k));
    same_top += imax == ibase;
    const double d = std::exp(-q_nll) - std::exp(-b_nll);
    dp += d;
    dp2 += d * d;
    max_dp = std::max(max_dp, float(std::fabs(d)));
    ++count;
  }

  // Mean and its standard error.
  static std::pair<double, double> mean_err(double s, double s2, int64_t n) {
    const double m = s / double(n);
    const double v = n > 1 ? std::max(0.0, s2 / double(n) - m * m) / double(n - 1) : 0;
    return {m, std::sqrt(v)};
  }

  void print(FILE* f) {
    if (count == 0) return;
    auto [q, qe] = mean_err(nll, nll2, count);
    auto [b, be] = mean_err(nll_base, nll_base2, count);
    const double n = double(count);
    const double cov = nll_cross / n - q * b, vq = nll2 / n - q * q, vb = nll_base2 / n - b * b;
    const double cor = vq > 0 && vb > 0 ? cov / std::sqrt(vq * vb) : 1.0;
    // ln(PPL(Q)/PPL(base)) = mean(nll_q - nll_b): its error from the variances and covariance.
    const double dvar = std::max(0.0, (vq + vb - 2 * cov) / std::max(1.0, n - 1));
    auto [k, ke] = mean_err(kld, kld2, count);
    auto [d, de] = mean_err(dp, dp2, count);
    const double p_same = double(same_top) / n;
    std::sort(klds.begin(), klds.end());
    auto pct = [&](double p) { return klds[std::min(klds.size() - 1, size_t(p * double(klds.size() - 1) + 0.5))]; };
    std::fprintf(f, "\n====== Perplexity statistics ======\n");
    std::fprintf(f, "Mean PPL(Q)                   : %10.6f ± %10.6f\n", std::exp(q), std::exp(q) * qe);
    std::fprintf(f, "Mean PPL(base)                : %10.6f ± %10.6f\n", std::exp(b), std::exp(b) * be);
    std::fprintf(f, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100.0 * cor);
    std::fprintf(f, "Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", q - b, std::sqrt(dvar));
    std::fprintf(f, "\n====== KL divergence statistics ======\n");
    std::fprintf(f, "Mean    KLD: %10.6f ± %10.6f\n", k, ke);
    std::fprintf(f, "Maximum KLD: %10.6f\n", double(klds.back()));
    std::fprintf(f, "99.9%%   KLD: %10.6f\n", double(pct(0.999)));
    std::fprintf(f, "99.0%%   KLD: %10.6f\n", double(pct(0.99)));
    std::fprintf(f, "Median  KLD: %10.6f\n", double(pct(0.5)));
    std::fprintf(f, "Minimum KLD: %10.6f\n", double(klds.front()));
    std::fprintf(f, "\n====== Token probability statistics ======\n");
    std::fprintf(f, "Mean    Δp: %6.3f ± %5.3f %%\n", 100.0 * d, 100.0 * de);
    std::fprintf(f, "Maximum Δp: %6.3f%%\n", 100.0 * max_dp);
    std::fprintf(f, "RMS Δp    : %6.3f ± %5.3f %%\n", 100.0 * std::sqrt(dp2 / n), 100.0 * de);
    std::fprintf(f, "Same top p: %6.3f ± %5.3f %%\n", 100.0 * p_same,
                 100.0 * std::sqrt(p_same * (1 - p_same) / std::max(1.0, n - 1)));
    std::fprintf(f, "Positions  : %lld\n", (long long)count);
  }
};

}  // namespace kiln::tools
