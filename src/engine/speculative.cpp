// engine/speculative.cpp — spec type names, the synthetic acceptance curve, the n-gram drafter and
//   the adaptive draft length (engine/speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

namespace kiln::engine {

std::optional<SpecType> spec_type_from_name(std::string_view name) {
  if (name == "none") return SpecType::None;
  if (name == "ngram-simple") return SpecType::NgramSimple;
  if (name == "draft-mtp") return SpecType::DraftMtp;
  if (name == "draft-simple") return SpecType::DraftSimple;
  return std::nullopt;
}

const char* spec_type_name(SpecType t) {
  switch (t) {
    case SpecType::None: return "none";
    case SpecType::NgramSimple: return "ngram-simple";
    case SpecType::DraftMtp: return "draft-mtp";
    case SpecType::DraftSimple: return "draft-simple";
  }
  return "none";
}

Result<std::vector<double>> synth_probs(const SpecOptions& o) {
  const int n = o.n_max;
  if (o.synth_len >= 0 && !o.synth_rates.empty())
    return err("--spec-synth-len and --spec-synth-rates: synthetic acceptance length and rates are mutually exclusive");
  if (!o.synthetic()) return std::vector<double>{};
  if (n < 1) return err("--spec-synth-len/--spec-synth-rates: synthetic acceptance requires at least one speculative token "
                        "(--spec-draft-n-max {})", n);
  std::vector<double> rates;
  if (o.synth_len >= 0) {
    const double L = o.synth_len;
    if (!std::isfinite(L) || L < 1 || L > n + 1)
      return err("--spec-synth-len {}: must be finite and within [1, {}] (--spec-draft-n-max {} + 1)", L, n + 1, n);
    // p + p^2 + ... + p^n = L - 1, increasing in p on [0, 1]: bisection.
    auto sum = [n](double p) {
      double s = 0, q = 1;
      for (int i = 0; i < n; ++i) s += (q *= p);
      return s;
    };
    double lo = 0, hi = 1;
    for (int it = 0; it < 200; ++it) {
      const double mid = 0.5 * (lo + hi);
      (sum(mid) < L - 1 ? lo : hi) = mid;
    }
    const double p = L - 1 >= n ? 1.0 : 0.5 * (lo + hi);
    double q = 1;
    for (int i = 0; i < n; ++i) rates.push_back(q *= p);
  } else {
    rates = o.synth_rates;
    if (int(rates.size()) != n)
      return err("--spec-synth-rates: must contain {} values (--spec-draft-n-max), got {}", n, rates.size());
    for (size_t i = 0; i < rates.size(); ++i) {
      if (!std::isfinite(rates[i]) || rates[i] < 0 || rates[i] > 1)
        return err("--spec-synth-rates: value {} ({}) must be finite and within [0, 1]", i, rates[i]);
      if (i > 0 && rates[i] > rates[i - 1]) return err("--spec-synth-rates: must be monotonically non-increasing");
    }
  }
  std::vector<double> cond(rates.size());
  for (size_t i = 0; i < rates.size(); ++i)
    cond[i] = i == 0 ? rates[0] : (rates[i - 1] > 0 ? rates[i] / rates[i - 1] : 0.0);
  return cond;
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> h, int n, int n_max) {
  std::vector<int32_t> out;
  const int64_t H = int64_t(h.size());
  if (n < 1 || n_max < 1 || H <= n) return out;
  const auto key = h.subspan(size_t(H - n));
  for (int64_t s = H - n - 1; s >= 0; --s) {  // most recent earlier occurrence first
    if (!std::equal(key.begin(), key.end(), h.begin() + s)) continue;
    for (int64_t i = s + n; i < H && int(out.size()) < n_max; ++i) out.push_back(h[size_t(i)]);
    break;
  }
  return out;
}

void SpecState::miss() {
  k = std::max(1, k / 2);
  constexpr int kMissesToPause = 3;
  if (++misses >= kMissesToPause) {
    pause = next_pause;
    next_pause = std::min(64, next_pause * 2);
    // The draft after a pause is a probe: its miss pauses again at once (twice as long); an
    // accepted token ends the back-off (update).
    misses = kMissesToPause - 1;
    k = 1;
  }
}

void SpecState::empty_draft(bool adaptive) {
  if (adaptive) miss();
}

void SpecState::update(int drafted, int accepted, int n_max, bool adaptive) {
  if (!adaptive || drafted == 0) return;
  if (accepted == drafted) {
    k = std::min(n_max, k + 1);
    misses = 0;
    next_pause = 2;
  } else if (accepted == 0) {
    miss();
  } else {
    misses = 0;
    next_pause = 2;
  }
}

}  // namespace kiln::engine
