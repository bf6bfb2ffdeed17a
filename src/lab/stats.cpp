#include "lab/stats.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "lab/random.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {

double mean(std::span<const double> x) {
  if (x.empty()) throw Error("lab statistics: expected at least one sample, got none");
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

namespace {
// Central moments m2, m4 (divided by n) about the mean, two-pass for accuracy.
void central_moments(std::span<const double> x, double& m, double& m2, double& m4) {
  m = mean(x);
  double s2 = 0, s4 = 0;
  for (double v : x) {
    const double d = v - m, d2 = d * d;
    s2 += d2;
    s4 += d2 * d2;
  }
  const double n = static_cast<double>(x.size());
  m2 = s2 / n;
  m4 = s4 / n;
}
}  // namespace

double sample_variance(std::span<const double> x) {
  if (x.size() < 2) throw Error("lab statistics: a variance needs at least two samples");
  double m, m2, m4;
  central_moments(x, m, m2, m4);
  const double n = static_cast<double>(x.size());
  return m2 * n / (n - 1);
}

double kurtosis(std::span<const double> x) {
  double m, m2, m4;
  central_moments(x, m, m2, m4);
  return m2 > 0 ? m4 / (m2 * m2) : 0.0;
}

Interval mean_ci(std::span<const double> x, double z) {
  const double m = mean(x);
  const double se = std::sqrt(sample_variance(x) / static_cast<double>(x.size()));
  return {m, m - z * se, m + z * se};
}

Interval variance_ci(std::span<const double> x, double z) {
  if (x.size() < 4) throw Error("lab statistics: a variance interval needs at least four samples");
  double m, m2, m4;
  central_moments(x, m, m2, m4);
  const double n = static_cast<double>(x.size());
  const double s2 = m2 * n / (n - 1);
  const double var_s2 = std::max(0.0, (m4 - (n - 3) / (n - 1) * s2 * s2) / n);
  if (s2 <= 0) return {0, 0, 0};
  const double rel = std::sqrt(var_s2) / s2;  // se of log(s^2) by the delta method
  return {s2, s2 * std::exp(-z * rel), s2 * std::exp(z * rel)};
}

double quantile(std::vector<double> x, double q) {
  if (x.empty()) throw Error("lab statistics: a quantile needs at least one sample");
  assert(q >= 0 && q <= 1);
  const double pos = q * static_cast<double>(x.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, x.size() - 1);
  std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(lo), x.end());
  const double a = x[lo];
  double b = a;
  if (hi != lo) b = *std::min_element(x.begin() + static_cast<std::ptrdiff_t>(hi), x.end());
  return a + (pos - static_cast<double>(lo)) * (b - a);
}

NormStats norm_stats(std::span<const double> norms, double dead_threshold) {
  NormStats s;
  std::vector<double> v(norms.begin(), norms.end());
  s.mean = mean(norms);
  s.median = quantile(v, 0.5);
  s.p99 = quantile(v, 0.99);
  std::size_t dead = 0;
  for (double x : norms) dead += x < dead_threshold;
  s.dead = static_cast<double>(dead) / static_cast<double>(norms.size());
  return s;
}

std::vector<Interval> bootstrap(
    int n, int strata, int replicates, std::uint64_t seed, std::uint64_t stream, double level,
    const std::function<std::vector<double>(const std::vector<int>&)>& stat) {
  if (n <= 0 || strata <= 0 || n % strata != 0 || replicates < 2) {
    throw Error("lab bootstrap: expected n > 0 rows in equal strata and >= 2 replicates");
  }
  std::vector<int> idx(n);
  for (int i = 0; i < n; ++i) idx[i] = i;
  const std::vector<double> est = stat(idx);
  std::vector<std::vector<double>> reps(est.size(), std::vector<double>(replicates));
  Stream s(seed, stream);
  const int block = n / strata;
  for (int r = 0; r < replicates; ++r) {
    for (int b = 0; b < strata; ++b) {
      for (int i = 0; i < block; ++i) {
        idx[b * block + i] =
            b * block + static_cast<int>(s.below(static_cast<std::uint32_t>(block)));
      }
    }
    const std::vector<double> v = stat(idx);
    for (std::size_t k = 0; k < v.size(); ++k) reps[k][r] = v[k];
  }
  std::vector<Interval> out(est.size());
  for (std::size_t k = 0; k < est.size(); ++k) {
    out[k] = {est[k], quantile(reps[k], (1 - level) / 2), quantile(reps[k], (1 + level) / 2)};
  }
  return out;
}

Interval bootstrap_mean(std::span<const double> x, int replicates, std::uint64_t seed,
                        std::uint64_t stream, double level) {
  const std::vector<double> v(x.begin(), x.end());
  return bootstrap(static_cast<int>(v.size()), 1, replicates, seed, stream, level,
                   [&](const std::vector<int>& idx) {
                     double m = 0;
                     for (int i : idx) m += v[i];
                     return std::vector<double>{m / static_cast<double>(idx.size())};
                   })[0];
}

Interval slope_ci(std::span<const double> x, std::span<const double> y) {
  const std::size_t n = x.size();
  if (n < 3 || y.size() != n) throw Error("lab slope: expected at least 3 (x, y) pairs");
  const double mx = mean(x), my = mean(y);
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  const double b = sxy / sxx, a = my - b * mx;
  double sse = 0;
  for (std::size_t i = 0; i < n; ++i) sse += (y[i] - a - b * x[i]) * (y[i] - a - b * x[i]);
  const double se = std::sqrt(sse / static_cast<double>(n - 2) / sxx);
  // 97.5% quantiles of Student's t with 1..30 degrees of freedom.
  static const double t975[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  const std::size_t df = n - 2;
  // Past 30 degrees of freedom, the Cornish-Fisher expansion of t's quantile about z's (its
  // error there is below 1e-5: 1.99834 at 63 against 1.99834).
  const double v = static_cast<double>(df), z = kZ95, z2 = z * z;
  const double t =
      df <= 30 ? t975[df - 1]
               : z + z * (z2 + 1) / (4 * v) + z * (5 * z2 * z2 + 16 * z2 + 3) / (96 * v * v) +
                     z * (3 * z2 * z2 * z2 + 19 * z2 * z2 + 17 * z2 - 15) / (384 * v * v * v);
  return {b, b - t * se, b + t * se};
}

namespace {
template <class T>
double entropy_of(std::span<const T> p) {
  double h = 0;
  for (T x : p) {
    const double v = x;
    if (v > 0) h -= v * std::log(v);
  }
  return h;
}
}  // namespace

double entropy(std::span<const double> p) { return entropy_of(p); }
double entropy(std::span<const float> p) { return entropy_of(p); }

double jacobian_frobenius(std::span<const double> p) {
  double s2 = 0, s3 = 0;
  for (double v : p) {
    s2 += v * v;
    s3 += v * v * v;
  }
  return std::sqrt(std::max(0.0, s2 - 2 * s3 + s2 * s2));
}

}  // namespace sdpa::lab
