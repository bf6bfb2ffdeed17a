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
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/half.h"
#include "kernels/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/range.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

// The bit patterns of non-negative IEEE numbers sort as the numbers do, and +inf's pattern is
// above every finite one (NaN's above that); so the maxima below are integer maxima over the
// patterns, vectorised with Highway on the best target. Each is one read of the tensor at memory
// speed: ~1 ms for the 25 MB of Q, K and V at B = 1, H = 8, L = S = 4096, E = 64 on AVX-512,
// under 1% of that forward.
HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The largest pattern below +inf's among x[0..n) (each first and-ed with keep: clearing the sign
// bit gives |x|; keeping it makes negative numbers negative integers, below 0), or 0.
template <class T, class I>
I MaxFinitePattern(const T* x, std::int64_t n, I keep, I inf) {
  const hn::ScalableTag<T> d;
  const hn::RebindToSigned<decltype(d)> di;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto vkeep = hn::Set(di, keep), vinf = hn::Set(di, inf);
  auto m = hn::Zero(di);
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto b = hn::And(hn::BitCast(di, hn::LoadU(d, x + i)), vkeep);
    m = hn::Max(m, hn::IfThenElseZero(hn::Lt(b, vinf), b));
  }
  I r = hn::GetLane(hn::MaxOfLanes(di, m));
  for (; i < n; ++i) {
    I b;
    std::memcpy(&b, x + i, sizeof b);
    b &= keep;
    if (b < inf && b > r) r = b;
  }
  return r;
}

// Largest |x| (abs) or largest positive x (!abs) over the finite entries, 0 if none.
float MaxFiniteFloat(const float* x, std::int64_t n, bool abs) {
  const std::int32_t p =
      MaxFinitePattern<float, std::int32_t>(x, n, abs ? 0x7fffffff : ~std::int32_t{0}, 0x7f800000);
  float r;
  std::memcpy(&r, &p, sizeof r);
  return r;
}
double MaxFiniteDouble(const double* x, std::int64_t n, bool abs) {
  const std::int64_t p = MaxFinitePattern<double, std::int64_t>(
      x, n, abs ? 0x7fffffffffffffff : ~std::int64_t{0}, 0x7ff0000000000000);
  double r;
  std::memcpy(&r, &p, sizeof r);
  return r;
}

// The largest pattern below inf's among the 16-bit patterns x[0..n), sign cleared: float16 and
// bfloat16 magnitudes sort as their patterns do, as float32's do, and every pattern without its
// sign is a non-negative int16.
std::int16_t MaxFinite16(const std::int16_t* x, std::int64_t n, std::int16_t inf) {
  return MaxFinitePattern<std::int16_t, std::int16_t>(x, n, 0x7fff, inf);
}

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_EXPORT(MaxFiniteFloat);
HWY_EXPORT(MaxFiniteDouble);
HWY_EXPORT(MaxFinite16);

namespace {

// The largest finite |x| of a (B, H, L, width) float32, float16 or bfloat16 operand, read through
// its strides in pieces of at most 1 MiB shared out among the threads: a maximum does not depend
// on the order it is taken in. Read by one thread, these scans (three 32 MiB tensors at
// (1,8,16384,64)) were a serial part of calls whose own work is small: a sliding window of 1024
// keys does 1/14 of full attention's.
double max_finite_abs(const InputView& v, std::int64_t B, std::int64_t H, std::int64_t L,
                      std::int64_t width, int threads) {
  const bool half = v.dtype == DType::float16 || v.dtype == DType::bfloat16;
  const std::int64_t piece = (std::int64_t{1} << 20) / (half ? 2 : 4);
  const std::size_t bytes = half ? 2 : 4;
  std::vector<std::pair<const char*, std::int64_t>> pieces;
  const auto cut = [&](const char* x, std::int64_t n) {
    for (std::int64_t i = 0; i < n; i += piece)
      pieces.emplace_back(x + static_cast<std::size_t>(i) * bytes, std::min(piece, n - i));
  };
  if (half) {
    for_each_run<std::int16_t>(v, B, H, L, width, [&](const std::int16_t* x, std::int64_t n) {
      cut(reinterpret_cast<const char*>(x), n);
    });
  } else {
    for_each_run<float>(v, B, H, L, width, [&](const float* x, std::int64_t n) {
      cut(reinterpret_cast<const char*>(x), n);
    });
  }
  const auto count = static_cast<std::int64_t>(pieces.size());
  const bool f16 = v.dtype == DType::float16;
  const auto inf16 = static_cast<std::int16_t>(f16 ? 0x7c00 : 0x7f80);
  double m = 0.0;
#pragma omp parallel for schedule(static) reduction(max  \
                                                    : m) \
    num_threads(threads) if (threads > 1 && count > 1)
  for (std::int64_t i = 0; i < count; ++i) {
    const auto& [x, n] = pieces[static_cast<std::size_t>(i)];
    double r;
    if (half) {
      const auto b = static_cast<std::uint16_t>(
          HWY_DYNAMIC_DISPATCH(MaxFinite16)(reinterpret_cast<const std::int16_t*>(x), n, inf16));
      r = f16 ? float16_to_float(b) : bfloat16_to_float(b);
    } else {
      r = HWY_DYNAMIC_DISPATCH(MaxFiniteFloat)(reinterpret_cast<const float*>(x), n, true);
    }
    m = std::max(m, r);
  }
  return m;
}

// The largest finite positive value of the mask, read through its view: each stored row once
// (a stride-0 dimension, the broadcast ones, is visited at index 0 only), rows of S contiguous
// values in one vectorised pass.
double max_positive_mask(const Problem& p) {
  const MaskView& m = p.mask;
  if (!m.present || (m.dtype != DType::float32 && m.dtype != DType::float64)) {
    return 0.0;  // none, or boolean: 0 or -inf
  }
  std::vector<std::int64_t> batches = m.batch_offset;
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  const std::int64_t H = m.stride_h == 0 ? 1 : p.Hq, L = m.stride_l == 0 ? 1 : p.L;
  const std::int64_t S = m.stride_s == 0 ? std::min<std::int64_t>(p.S, 1) : p.S;
  // The largest finite positive value of a row of S values stride_s apart.
  const auto strided_max = [&](const auto* x) -> double {
    double r = 0.0;
    for (std::int64_t s = 0; s < S; ++s) {
      const double v = static_cast<double>(x[s * m.stride_s]);
      if (std::isfinite(v)) r = std::max(r, v);
    }
    return r;
  };
  const auto row_max = [&](std::int64_t offset) -> double {
    if (m.dtype == DType::float32) {
      const float* x = static_cast<const float*>(m.data) + offset;
      if (m.stride_s != 1 && S > 1) return strided_max(x);
      return static_cast<double>(HWY_DYNAMIC_DISPATCH(MaxFiniteFloat)(x, S, false));
    }
    const double* x = static_cast<const double*>(m.data) + offset;
    if (m.stride_s != 1 && S > 1) return strided_max(x);
    return HWY_DYNAMIC_DISPATCH(MaxFiniteDouble)(x, S, false);
  };
  double r = 0.0;
  for (const std::int64_t b : batches) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t l = 0; l < L; ++l)
        r = std::max(r, row_max(b + h * m.stride_h + l * m.stride_l));
    }
  }
  return r;
}

}  // namespace

bool float32_may_overflow(const Problem& p, const void* grad_out) {
  constexpr double kLimit = 1e36;
  const double mq = max_finite_abs(p.q, p.B, p.Hq, p.L, p.E, p.threads);
  const double mk = max_finite_abs(p.k, p.B, p.Hkv, p.S, p.E, p.threads);
  const double mv = max_finite_abs(p.v, p.B, p.Hkv, p.S, p.Ev, p.threads);
  const double scale = std::fabs(p.scale);
  const double L = static_cast<double>(p.L), S = static_cast<double>(p.S);
  const double E = static_cast<double>(p.E), Ev = static_cast<double>(p.Ev);
  // The scale is folded into q, so scale * q must fit as well (a scale of 1e200 times a q of
  // 1e-190 is a modest score but an infinite folded query).
  if (scale > 3e38 || scale * mq > kLimit) return true;
  // Products are bounded both with the scale and without it (factor max(scale, 1)): the naive
  // kernel lets BLAS apply the scale after the product (alpha), and the fused backward scales
  // dQ at the end, so an unscaled q . k or dS K must fit too (a scale of 1e-30 does not save a
  // q of 3e38).
  const double sc = std::max(scale, 1.0);
  // Scores, mask included.
  if (sc * E * mq * mk + max_positive_mask(p) > kLimit) return true;
  // The forward's accumulator: at most S weights of at most 1 times max|v|.
  if (S * mv > kLimit) return true;
  if (grad_out == nullptr) return false;
  // The backward: |dP| and |rowsum(dO o O)| <= Ev max|dO| max|v|, |dS| <= twice that;
  // dQ sums S terms of scale dS k, dK sums the L rows of every query head of its group, dV
  // sums those rows' P dO.
  // grad_out is laid out as p.dout says, or in C order when p.dout is not bound.
  InputView g = p.dout;
  if (g.data != grad_out) {
    g = InputView{grad_out, DType::float32, p.Hq * p.L * p.Ev, p.L * p.Ev, p.Ev};
  }
  const double mdo = max_finite_abs(g, p.B, p.Hq, p.L, p.Ev, p.threads);
  const double rows = L * static_cast<double>(p.group);
  const double ds = 2 * Ev * mdo * mv;
  return ds > kLimit || sc * S * ds * mk > kLimit || sc * rows * ds * mq > kLimit ||
         rows * mdo > kLimit;
}

}  // namespace sdpa::detail
#endif  // HWY_ONCE
