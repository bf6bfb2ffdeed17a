// The range guard shared by the fused and the naive kernel for float32 problems.
//
// Both compute in float32: scores (scale * q) . k with the mask added, the softmax, the
// unnormalised sum of exp(score - max) * v, and in the backward dP = dO V^T, dS and the three
// gradients. When one of these intermediates can pass float32's range (3.4e38) it overflows to
// inf, and inf - inf or inf / inf gives NaN (or an inf) where the exact result is finite: a
// scale of 1e200 is not even a float32, and 16 values of 3e38 sum to inf although their
// weighted mean is 3e38. Such calls, which only absurd scales, magnitudes or mask values make,
// take the float64 reference, which never overflows there. The guard bounds each intermediate
// from the largest magnitudes of the inputs, read once: O((L + S) E + S Ev + |mask|) beside the
// kernels' O(L S E). The bound 1e36 leaves a margin of 300 below float32's maximum for the
// rescaling inside the online softmax and for rounding.
//
// Only positive mask values count: a large negative one (PyTorch users often write
// torch.finfo(float32).min for "masked") can at worst round to -inf, which gives that key a
// probability of 0, never a NaN; counting it would send such everyday calls to the slow path.
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/kernels.h"

namespace sdpa::detail {
namespace {

// Largest |x| over the finite entries; the non-finite ones follow the masking and NaN rules.
template <class T>
double max_finite_abs(const T* x, std::int64_t n) {
  T m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const T a = std::fabs(x[i]);
    if (a > m && a <= std::numeric_limits<T>::max()) m = a;
  }
  return static_cast<double>(m);
}

// Largest finite positive entry (0 if none).
template <class T>
double max_finite_positive(const T* x, std::int64_t n) {
  T m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (x[i] > m && x[i] <= std::numeric_limits<T>::max()) m = x[i];
  }
  return static_cast<double>(m);
}

double max_positive_mask(const MaskView& m) {
  if (!m.present) return 0.0;
  switch (m.dtype) {
    case DType::float32:
      return max_finite_positive(static_cast<const float*>(m.data), m.numel);
    case DType::float64:
      return max_finite_positive(static_cast<const double*>(m.data), m.numel);
    default:
      return 0.0;  // boolean: 0 or -inf
  }
}

}  // namespace

bool float32_may_overflow(const Problem& p, const void* grad_out) {
  constexpr double kLimit = 1e36;
  auto max_of = [](const void* x, std::int64_t n) {
    return max_finite_abs(static_cast<const float*>(x), n);
  };
  const double mq = max_of(p.query, p.B * p.Hq * p.L * p.E);
  const double mk = max_of(p.key, p.B * p.Hkv * p.S * p.E);
  const double mv = max_of(p.value, p.B * p.Hkv * p.S * p.Ev);
  const double scale = std::fabs(p.scale);
  const double L = static_cast<double>(p.L), S = static_cast<double>(p.S);
  const double E = static_cast<double>(p.E), Ev = static_cast<double>(p.Ev);
  // The scale is folded into q, so scale * q must fit as well (a scale of 1e200 times a q of
  // 1e-190 is a modest score but an infinite folded query).
  if (scale > 3e38 || scale * mq > kLimit) return true;
  // Scores, mask included.
  if (scale * E * mq * mk + max_positive_mask(p.mask) > kLimit) return true;
  // The forward's accumulator: at most S weights of at most 1 times max|v|.
  if (S * mv > kLimit) return true;
  if (grad_out == nullptr) return false;
  // The backward: |dP| and |rowsum(dO o O)| <= Ev max|dO| max|v|, |dS| <= twice that;
  // dQ sums S terms of scale dS k, dK sums the L rows of every query head of its group, dV
  // sums those rows' P dO.
  const double mdo = max_of(grad_out, p.B * p.Hq * p.L * p.Ev);
  const double rows = L * static_cast<double>(p.group);
  const double ds = 2 * Ev * mdo * mv;
  return ds > kLimit || scale * S * ds * mk > kLimit || scale * rows * ds * mq > kLimit ||
         rows * mdo > kLimit;
}

}  // namespace sdpa::detail
