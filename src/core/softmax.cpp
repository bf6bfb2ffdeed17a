// Stable softmax, log-softmax and the softmax vector-Jacobian product on one row.
// NumPy: p = exp(c*x - max(c*x)); p /= p.sum()
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

template <class T>
void check_sizes(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("expected {} elements (the size of the input), got {}", a, b));
  }
}

// The row maximum of scale * x, and how many entries reach it when it is +inf.
template <class T>
double scaled_max(std::span<const T> x, double scale, bool& has_nan) {
  double m = -kInf;
  has_nan = false;
  for (T v : x) {
    const double z = scale * double(v);
    if (std::isnan(z)) has_nan = true;
    if (z > m) m = z;
  }
  return m;
}

// Whether scale * v is +inf because v itself is infinite (a true +inf score), not because a
// finite product overflowed.
template <class T>
bool infinite_score(T v, double scale) {
  return std::isinf(double(v)) && scale * double(v) == kInf;
}

// The scores scale * x shifted to a maximum of 0, as z_i = scale * (x_i - x_top), for a row
// whose scale * x overflowed but holds no infinite logit: x_top is the logit that gives the
// largest score (the largest x for scale > 0, the smallest for scale < 0). The differences do
// not overflow upwards, so the largest logit(s) get z = 0 and the mass, as in the limit of
// softmax(c * x) for c -> inf, instead of sharing it with every overflowed score.
template <class T>
std::vector<double> shifted_scores(std::span<const T> x, double scale) {
  double top = scale > 0 ? -kInf : kInf;
  for (T v : x) top = scale > 0 ? std::max(top, double(v)) : std::min(top, double(v));
  std::vector<double> z(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) z[i] = scale * (double(x[i]) - top);
  return z;
}

}  // namespace

template <class T>
void softmax(std::span<const T> logits, std::span<T> probabilities, double scale) {
  check_sizes<T>(logits.size(), probabilities.size(), "probabilities");
  bool has_nan = false;
  const double m = scaled_max(logits, scale, has_nan);
  const std::size_t n = logits.size();
  if (has_nan) {
    for (std::size_t i = 0; i < n; ++i) probabilities[i] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  if (m == -kInf) {  // empty or all -inf: nothing takes part
    for (std::size_t i = 0; i < n; ++i) probabilities[i] = T(0);
    return;
  }
  if (m == kInf) {
    double count = 0;
    for (T v : logits) count += infinite_score(v, scale);
    if (count > 0) {  // the limit: equal shares among the infinite logits
      for (std::size_t i = 0; i < n; ++i) {
        probabilities[i] = static_cast<T>(infinite_score(logits[i], scale) ? 1.0 / count : 0.0);
      }
      return;
    }
    const std::vector<double> z = shifted_scores(logits, scale);
    double sum = 0.0;
    for (double zi : z) sum += std::exp(zi);
    for (std::size_t i = 0; i < n; ++i) probabilities[i] = static_cast<T>(std::exp(z[i]) / sum);
    return;
  }
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += std::exp(scale * double(logits[i]) - m);
  for (std::size_t i = 0; i < n; ++i) {
    probabilities[i] = static_cast<T>(std::exp(scale * double(logits[i]) - m) / sum);
  }
}

template <class T>
void log_softmax(std::span<const T> logits, std::span<T> log_probabilities, double scale) {
  check_sizes<T>(logits.size(), log_probabilities.size(), "log_probabilities");
  bool has_nan = false;
  const double m = scaled_max(logits, scale, has_nan);
  const std::size_t n = logits.size();
  if (has_nan) {
    for (std::size_t i = 0; i < n; ++i) log_probabilities[i] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  double count = 0;
  if (m == kInf) {
    for (T v : logits) count += infinite_score(v, scale);
  }
  if (m == -kInf || count > 0) {  // nothing takes part, or equal shares among infinite logits
    for (std::size_t i = 0; i < n; ++i) {
      const bool top = m == kInf && infinite_score(logits[i], scale);
      log_probabilities[i] = static_cast<T>(top ? -std::log(count) : -kInf);
    }
    return;
  }
  if (m == kInf) {
    const std::vector<double> z = shifted_scores(logits, scale);
    double sum = 0.0;
    for (double zi : z) sum += std::exp(zi);
    const double log_sum = std::log(sum);
    for (std::size_t i = 0; i < n; ++i) log_probabilities[i] = static_cast<T>(z[i] - log_sum);
    return;
  }
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += std::exp(scale * double(logits[i]) - m);
  const double log_sum = std::log(sum);
  for (std::size_t i = 0; i < n; ++i) {
    log_probabilities[i] = static_cast<T>(scale * double(logits[i]) - m - log_sum);
  }
}

template <class T>
void softmax_backward(std::span<const T> probabilities, std::span<const T> grad_probabilities,
                      std::span<T> grad_logits, double scale) {
  check_sizes<T>(probabilities.size(), grad_probabilities.size(), "grad_probabilities");
  check_sizes<T>(probabilities.size(), grad_logits.size(), "grad_logits");
  double dot = 0.0;
  for (std::size_t i = 0; i < probabilities.size(); ++i) {
    if (probabilities[i] != T(0)) dot += double(probabilities[i]) * double(grad_probabilities[i]);
  }
  for (std::size_t i = 0; i < probabilities.size(); ++i) {
    const double p = probabilities[i];
    grad_logits[i] =
        static_cast<T>(p == 0.0 ? 0.0 : scale * p * (double(grad_probabilities[i]) - dot));
  }
}

template void softmax<float>(std::span<const float>, std::span<float>, double);
template void softmax<double>(std::span<const double>, std::span<double>, double);
template void log_softmax<float>(std::span<const float>, std::span<float>, double);
template void log_softmax<double>(std::span<const double>, std::span<double>, double);
template void softmax_backward<float>(std::span<const float>, std::span<const float>,
                                      std::span<float>, double);
template void softmax_backward<double>(std::span<const double>, std::span<const double>,
                                       std::span<double>, double);

}  // namespace sdpa
