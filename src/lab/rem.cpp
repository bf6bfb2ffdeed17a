#include "lab/rem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace sdpa::lab {

double digamma(double x) {
  double r = 0;
  while (x < 6) {
    r -= 1 / x;
    x += 1;
  }
  const double f = 1 / (x * x);
  // psi(x) ~ ln x - 1/(2x) - sum B_2k / (2k x^2k): the terms through x^-12.
  return r + std::log(x) - 0.5 / x -
         f * (1.0 / 12 - f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f * (1.0 / 132)))));
}

double rem_annealed_entropy(double s, double n) { return std::log(n) - s * s / 2; }

double rem_freezing_s(double n) { return std::sqrt(2 * std::log(n)); }

double rem_z_relative_variance(double s, double n) { return std::expm1(s * s) / n; }

double rem_crossover_s(double n) { return std::sqrt(std::log(n + 1)); }

double rem_frozen_entropy(double s, double n) {
  const double m = rem_freezing_s(n) / s;
  return digamma(1.0) - digamma(1.0 - m);
}

double rem_entropy(double s, double n) {
  const double sc = rem_freezing_s(n);
  if (s < sc) return std::max(0.0, rem_annealed_entropy(s, n));
  if (s < kRemDeepFrozen * sc) return std::numeric_limits<double>::quiet_NaN();
  return rem_frozen_entropy(s, n);
}

std::string rem_regime(double s, double n) {
  if (s >= rem_freezing_s(n)) return "frozen";
  return rem_z_relative_variance(s, n) < 1 ? "liquid" : "crossover";
}

double uniform_grad_logits(int d, int n) { return std::sqrt(static_cast<double>(d) * (n - 1)) / n; }

double uniform_grad_q(int d, int n) { return uniform_grad_logits(d, n); }

double uniform_grad_k(int d, int n, int queries) {
  const double nn = n;
  return std::sqrt(static_cast<double>(queries) * d * (nn - 1) / (nn * nn * nn));
}

double gaussian_max_location(double n) {
  const double a = std::sqrt(2 * std::log(n));
  return a - (std::log(std::log(n)) + std::log(4 * std::numbers::pi)) / (2 * a);
}

double predicted_dead_fraction(double scale_value, int d, int n, double threshold) {
  const double s = scale_value * std::sqrt(static_cast<double>(d));
  const double g = scale_value * 2 * d * std::sqrt(2 / std::numbers::pi);
  const double t = std::log(g / threshold);
  if (t <= 0) return 1.0;
  return std::exp(-t * gaussian_max_location(n) / s);
}

}  // namespace sdpa::lab
