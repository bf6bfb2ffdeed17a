#include "lab/lowp.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sdpa::lab {

double max_finite(const Format& f) {
  return std::ldexp(2.0 - std::ldexp(1.0, 1 - f.precision), f.emax);
}

double round_to(double x, const Format& f) {
  if (!std::isfinite(x) || x == 0.0) return x;
  if (f.precision >= 53) return x;
  int e = 0;
  std::frexp(x, &e);  // x = m 2^e, 0.5 <= |m| < 1: the leading bit has weight 2^(e-1)
  const int quantum = std::max(e - 1, f.emin) - (f.precision - 1);
  // ldexp by a power of two is exact; nearbyint rounds ties to even (the default mode).
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);
  if (std::fabs(r) > max_finite(f))
    return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

double ulp(double x, const Format& f) {
  if (f.precision >= 53) return std::nextafter(x, std::numeric_limits<double>::infinity()) - x;
  int e = 0;
  std::frexp(x, &e);
  return std::ldexp(1.0, std::max(e - 1, f.emin) - (f.precision - 1));
}

double exp_overflow_point(const Format& f) {
  // Start a few ulps below ln(max) (where exp reaches max) and walk up the format's grid.
  double x = round_to(std::log(max_finite(f)), f);
  for (int i = 0; i < 8; ++i) x -= ulp(x, f);
  x = round_to(x, f);
  for (int i = 0; i < 64; ++i) {
    if (std::isinf(round_to(std::exp(x), f))) return x;
    x = round_to(x + ulp(x, f), f);
  }
  return std::numeric_limits<double>::quiet_NaN();  // not reached for the formats above
}

std::vector<double> naive_softmax(std::span<const double> x, const Format& f) {
  std::vector<double> e(x.size()), p(x.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    e[i] = round_to(std::exp(round_to(x[i], f)), f);
    sum = round_to(sum + e[i], f);
  }
  for (std::size_t i = 0; i < x.size(); ++i) p[i] = round_to(e[i] / sum, f);
  return p;
}

}  // namespace sdpa::lab
