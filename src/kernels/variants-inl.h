// Per-target pieces of the fused kernel for the attention variants (core/variants.h): the
// softcap and ALiBi transforms of one row of scores, and the dropout of one row of
// probabilities. Included by flash.cpp after gemm-inl.h, once per Highway target.
#if defined(SDPA_KERNELS_VARIANTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_KERNELS_VARIANTS_INL_H_
#undef SDPA_KERNELS_VARIANTS_INL_H_
#else
#define SDPA_KERNELS_VARIANTS_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include "core/problem.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hnv = hwy::HWY_NAMESPACE;

/// x[c] = cap * tanh(x[c] / cap) for c < n (n a multiple of the vector length); when `t` is
/// given it receives tanh(x[c] / cap), whose 1 - t^2 is the backward's chain factor.
template <typename T>
HWY_INLINE void SoftcapRow(T* HWY_RESTRICT x, std::size_t n, T cap, T* HWY_RESTRICT t) {
  const hnv::ScalableTag<T> d;
  const auto c = hnv::Set(d, cap), inv = hnv::Set(d, T(1) / cap);
  for (std::size_t i = 0; i < n; i += hnv::Lanes(d)) {
    const auto th = hnv::Tanh(d, hnv::Mul(hnv::LoadU(d, x + i), inv));
    if (t != nullptr) hnv::StoreU(th, d, t + i);
    hnv::StoreU(hnv::Mul(c, th), d, x + i);
  }
}

/// x[c] -= slope * |diagonal - c| for c < n (n a multiple of the vector length): ALiBi's
/// bias for keys s0 + c of query i, with diagonal = i + (S - L) - s0. The distance is exact in
/// T (|diagonal - c| < 2^24 for every sequence this kernel can hold in memory).
template <typename T>
HWY_INLINE void AlibiRow(T* HWY_RESTRICT x, std::size_t n, T slope, std::int64_t diagonal) {
  const hnv::ScalableTag<T> d;
  const auto neg_slope = hnv::Set(d, -slope);
  auto col = hnv::Sub(hnv::Set(d, static_cast<T>(diagonal)), hnv::Iota(d, T(0)));
  const auto step = hnv::Set(d, static_cast<T>(hnv::Lanes(d)));
  for (std::size_t i = 0; i < n; i += hnv::Lanes(d)) {
    hnv::StoreU(hnv::MulAdd(neg_slope, hnv::Abs(col), hnv::LoadU(d, x + i)), d, x + i);
    col = hnv::Sub(col, step);
  }
}

/// The score transforms of one row before the mask: softcap, then ALiBi (FlashAttention's
/// order). `t`: see SoftcapRow (may be null).
template <typename T>
HWY_INLINE void TransformScoresRow(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l,
                                   std::int64_t s0, T* HWY_RESTRICT row, std::size_t n,
                                   T* HWY_RESTRICT t) {
  const Variants& v = p.variants;
  if (v.softcap > 0.0) SoftcapRow(row, n, static_cast<T>(v.softcap), t);
  if (v.alibi != nullptr) {
    AlibiRow(row, n, static_cast<T>(v.slope(b, h)), l + (p.S - p.L) - s0);
  }
}

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SDPA_KERNELS_VARIANTS_INL_H_
