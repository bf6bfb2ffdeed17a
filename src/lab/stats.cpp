#include "lab/stats.h"

#include <algorithm>
#include <cassert>
#include <cmath>

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
