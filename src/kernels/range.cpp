// The range guard shared by the fused and the naive kernel for float32 problems.
//
// Both compute float32 scores as (scale * q) . k, add the mask in float32 and run the softmax in
// float32. When a score can pass float32's range (3.4e38), it overflows to +inf and inf - inf
// gives NaN where the exact score is finite (a scale of 1e200 is not even a float32). Such
// calls, which only absurd scales, magnitudes or mask values make, take the float64 reference,
// which never overflows. The guard reads Q, K and a floating mask once: O((L + S) E + |mask|)
// beside the kernels' O(L S E). The bound 1e36 leaves a margin of 300 below float32's maximum
// for the rescaling inside the online softmax.
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

bool float32_scores_may_overflow(const Problem& p) {
  const double mq = max_finite_abs(static_cast<const float*>(p.query), p.B * p.Hq * p.L * p.E);
  const double mk = max_finite_abs(static_cast<const float*>(p.key), p.B * p.Hkv * p.S * p.E);
  const double scale = std::fabs(p.scale);
  // The scale is folded into q, so scale * q must fit as well (a scale of 1e200 times a q of
  // 1e-190 is a modest score but an infinite folded query).
  if (scale > 3e38 || scale * mq > 1e36) return true;
  const double score_bound = scale * static_cast<double>(p.E) * mq * mk;
  return score_bound + max_positive_mask(p.mask) > 1e36;
}

}  // namespace sdpa::detail
