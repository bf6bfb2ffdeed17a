// Per-target pieces of the fused kernel for the attention variants (core/variants.h): the
// softcap and ALiBi transforms of one row of scores (a rational tanh), and the dropout
// factors of one row of probabilities (Philox4x32-10 on vectors). Included by flash.cpp after
// gemm-inl.h, once per Highway target.
#if defined(SDPA_KERNELS_VARIANTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_KERNELS_VARIANTS_INL_H_
#undef SDPA_KERNELS_VARIANTS_INL_H_
#else
#define SDPA_KERNELS_VARIANTS_INL_H_
#endif

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/problem.h"
#include "core/variants.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hnv = hwy::HWY_NAMESPACE;

/// tanh(x) as a rational function x P(x^2) / Q(x^2) of degrees 13 / 6 on [-7.9053, 7.9053]
/// (Eigen's float32 tanh, where the float32 value rounds to +-1 beyond), about 15 operations
/// per vector against about 30 for hn::Tanh (its Expm1 and division). The rational form itself
/// is within 3.5e-8 of tanh; evaluated in float32 its error against a float64 tanh, asserted by
/// tests/variants over a sweep of float32 inputs, is below 6 float32 ulps of 1 (measured 4.5 with
/// FMA, 5.6 without), i.e. a capped score within 3.6e-7 of the cap. Beyond |x| = 9.011, where
/// tanh rounds to +-1 in float32, it is +-1 exactly (the clamped rational form gives 1 - 2^-22
/// there), so that the backward's chain factor 1 - t^2 of a saturated score is 0, as in the
/// maths and a float32 tanh, not 4.8e-7. double keeps hn::Tanh: the rational form is
/// float32-accurate only.
template <class D, class V>
HWY_INLINE V FastTanh(D d, V x0) {
  using T = hnv::TFromD<D>;
  if constexpr (sizeof(T) == 8) {
    return hnv::Tanh(d, x0);
  } else {
    const auto bound = hnv::Set(d, 7.90531110763549805f);
    const auto x = hnv::Min(hnv::Max(x0, hnv::Neg(bound)), bound);
    const auto x2 = hnv::Mul(x, x);
    auto p = hnv::Set(d, -2.76076847742355e-16f);
    p = hnv::MulAdd(p, x2, hnv::Set(d, 2.00018790482477e-13f));
    p = hnv::MulAdd(p, x2, hnv::Set(d, -8.60467152213735e-11f));
    p = hnv::MulAdd(p, x2, hnv::Set(d, 5.12229709037114e-08f));
    p = hnv::MulAdd(p, x2, hnv::Set(d, 1.48572235717979e-05f));
    p = hnv::MulAdd(p, x2, hnv::Set(d, 6.37261928875436e-04f));
    p = hnv::MulAdd(p, x2, hnv::Set(d, 4.89352455891786e-03f));
    auto q = hnv::Set(d, 1.19825839466702e-06f);
    q = hnv::MulAdd(q, x2, hnv::Set(d, 1.18534705686654e-04f));
    q = hnv::MulAdd(q, x2, hnv::Set(d, 2.26843463243900e-03f));
    q = hnv::MulAdd(q, x2, hnv::Set(d, 4.89352518554385e-03f));
    const auto r = hnv::Div(hnv::Mul(x, p), q);
    // 1 - tanh(x) < 2^-25 (half the spacing of float32 below 1) beyond (26 / 2) ln 2 = 9.0109.
    const auto one = hnv::CopySign(hnv::Set(d, 1.0f), x0);
    const auto saturated = hnv::Gt(hnv::Abs(x0), hnv::Set(d, 9.0110f));
    // The clamp would turn a NaN score finite: a NaN stays NaN, as in the reference.
    return hnv::IfThenElse(hnv::IsNaN(x0), x0, hnv::IfThenElse(saturated, one, r));
  }
}

/// x[c] = cap * tanh(x[c] / cap) for c < n (n a multiple of the vector length); when `t` is
/// given it receives tanh(x[c] / cap), whose 1 - t^2 is the backward's chain factor.
template <typename T>
HWY_INLINE void SoftcapRow(T* HWY_RESTRICT x, std::size_t n, T cap, T* HWY_RESTRICT t) {
  const hnv::ScalableTag<T> d;
  const auto c = hnv::Set(d, cap), inv = hnv::Set(d, T(1) / cap);
  for (std::size_t i = 0; i < n; i += hnv::Lanes(d)) {
    const auto th = FastTanh(d, hnv::Mul(hnv::LoadU(d, x + i), inv));
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

#if HWY_TARGET != HWY_SCALAR
/// Philox4x32-10 (Random123's philox4x32, which core/variants.h's dropout_row calls) for the
/// counters (m0 + c, i, h, b), c < n (n a multiple of the number of 64-bit lanes, 4 words per
/// counter), key (k0, k1), words written in counter order as 16-bit halves, low half first:
/// out[8c + 2w + k] is half k of word w of counter m0 + c, the draw of key 8 (m0 + c) + 2w + k
/// in dropout_row's layout (the 32-bit words reinterpreted as 16-bit lanes, which puts the low
/// half first on a little-endian machine; asserted below). One counter per 64-bit lane, in the
/// lane's low half: MulEven gives the full 64-bit product M * x, whose halves are Philox's hi
/// and lo. The high halves of the state are left
/// unmasked: they carry garbage, but only reach the next round's multiplication (which reads
/// the low halves) or the words' low halves taken at the end.
HWY_INLINE void PhiloxWords(std::uint32_t m0, std::size_t n, std::uint32_t i, std::uint32_t h,
                            std::uint32_t b, std::uint32_t k0, std::uint32_t k1,
                            std::uint16_t* HWY_RESTRICT out) {
  static_assert(std::endian::native == std::endian::little,
                "the 16-bit halves of the Philox words are taken by a little-endian BitCast");
  const hnv::ScalableTag<std::uint64_t> d64;
  const hnv::Repartition<std::uint32_t, decltype(d64)> d32;
  const hnv::Repartition<std::uint16_t, decltype(d64)> d16;
  const std::size_t N = hnv::Lanes(d64);
  // Lane k holds counter k / 2 (k even) or N / 2 + k / 2 (k odd): the interleaves at the end
  // take lanes 0, 2, 4 .. of each pair of 128-bit halves first, which leaves the words in order.
  HWY_ALIGN std::uint64_t order[(HWY_MAX_BYTES / 8)];
  for (std::size_t k = 0; k < N; ++k) order[k] = k % 2 == 0 ? k / 2 : N / 2 + k / 2;
  const auto lane = hnv::Load(d64, order);
  const auto M0 = hnv::BitCast(d32, hnv::Set(d64, std::uint64_t{0xD2511F53u}));
  const auto M1 = hnv::BitCast(d32, hnv::Set(d64, std::uint64_t{0xCD9E8D57u}));
  // Words 1 .. 3 of the counter (i, h, b) are the same in every lane: the first round's
  // product of word 2 and the second round's product of word 0 are scalars, computed once.
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // the key schedule (Weyl)
  const std::uint64_t h1 = std::uint64_t{0xCD9E8D57u} * h;
  const auto r1_x0 = static_cast<std::uint32_t>(h1 >> 32) ^ i ^ k0;  // round 1: x0, x1
  const auto r1_x1 = static_cast<std::uint32_t>(h1);
  const std::uint64_t h0 = std::uint64_t{0xD2511F53u} * r1_x0;  // round 2's hi0:lo0
  const auto r1_x2_key = hnv::Set(d64, std::uint64_t{b ^ k1});
  const auto r2_x0_key = hnv::Set(d64, std::uint64_t{r1_x1 ^ (k0 + kW0)});
  const auto r2_x2_key = hnv::Set(d64, std::uint64_t{static_cast<std::uint32_t>(h0 >> 32) ^
                                                     static_cast<std::uint32_t>(k1 + kW1)});
  const auto r2_x3 = hnv::Set(d64, std::uint64_t{static_cast<std::uint32_t>(h0)});
  for (std::size_t c = 0; c < n; c += N) {
    // Round 1: x2 = hi(M0 m) ^ b ^ k1, x3 = lo(M0 m).
    const auto m = hnv::Add(hnv::Set(d64, std::uint64_t{m0} + c), lane);
    const auto q0 = hnv::MulEven(hnv::BitCast(d32, m), M0);
    const auto y2 = hnv::Xor(hnv::ShiftRight<32>(q0), r1_x2_key);
    // Round 2: x0 = hi(M1 x2) ^ x1 ^ ka, x1 = lo(M1 x2), x2 = hi0 ^ x3 ^ kb, x3 = lo0.
    const auto q1 = hnv::MulEven(hnv::BitCast(d32, y2), M1);
    auto x0 = hnv::Xor(hnv::ShiftRight<32>(q1), r2_x0_key);
    auto x1 = q1;
    auto x2 = hnv::Xor(q0, r2_x2_key);
    auto x3 = r2_x3;
    std::uint32_t ka = k0 + kW0, kb = k1 + kW1;
    for (int round = 2; round < 10; ++round) {
      ka += kW0;
      kb += kW1;
      const auto p0 = hnv::MulEven(hnv::BitCast(d32, x0), M0);  // hi0:lo0
      const auto p1 = hnv::MulEven(hnv::BitCast(d32, x2), M1);  // hi1:lo1
      x0 = hnv::Xor(hnv::Xor(hnv::ShiftRight<32>(p1), x1), hnv::Set(d64, std::uint64_t{ka}));
      x2 = hnv::Xor(hnv::Xor(hnv::ShiftRight<32>(p0), x3), hnv::Set(d64, std::uint64_t{kb}));
      x1 = p1;
      x3 = p0;
    }
    // 32-bit lanes (x0, x1) and (x2, x3) per counter, then (x0, x1, x2, x3) per counter.
    const auto w01 = hnv::BitCast(
        d64, hnv::OddEven(hnv::BitCast(d32, hnv::ShiftLeft<32>(x1)), hnv::BitCast(d32, x0)));
    const auto w23 = hnv::BitCast(
        d64, hnv::OddEven(hnv::BitCast(d32, hnv::ShiftLeft<32>(x3)), hnv::BitCast(d32, x2)));
    hnv::StoreU(hnv::BitCast(d16, hnv::InterleaveLower(d64, w01, w23)), d16, out + 8 * c);
    hnv::StoreU(hnv::BitCast(d16, hnv::InterleaveUpper(d64, w01, w23)), d16, out + 8 * c + 4 * N);
  }
}
#endif

/// The dropout factors of core/variants.h's dropout_row (the same Philox words, the same 16-bit
/// draws and threshold, so the same bits) for keys j0 .. j0 + n of query row i,
/// n <= kMaxDropoutKeys, written to factor[0 .. n).
inline constexpr std::int64_t kMaxDropoutKeys = 256;
template <typename T>
HWY_INLINE void DropoutFactors(const Variants& v, std::int64_t b, std::int64_t h, std::int64_t i,
                               std::int64_t j0, std::int64_t n, T* HWY_RESTRICT factor) {
#if HWY_TARGET == HWY_SCALAR
  dropout_row(v, b, h, i, j0, n, factor);
#else
  if (n <= 0) return;
  const hnv::ScalableTag<std::uint64_t> d64;
  const auto N = static_cast<std::int64_t>(hnv::Lanes(d64));
  // Eight keys per counter: at most (7 + 256 + 7) / 8 = 33 counters, rounded up to N, each
  // giving 8 draws.
  const std::int64_t m0 = j0 >> 3, skip = j0 & 7;
  const std::int64_t calls = (skip + n + 7) / 8;
  HWY_ALIGN std::uint16_t draws[kMaxDropoutKeys + 8 * (HWY_MAX_BYTES / 8) + 8];
  PhiloxWords(static_cast<std::uint32_t>(m0), static_cast<std::size_t>((calls + N - 1) / N * N),
              static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(h),
              static_cast<std::uint32_t>(b + v.rng_batch_offset),
              static_cast<std::uint32_t>(v.seed), static_cast<std::uint32_t>(v.seed >> 32), draws);
  const std::uint32_t threshold = dropout_threshold(v.dropout_p);
  const T keep = static_cast<T>(dropout_keep_factor(v.dropout_p));
  const std::uint16_t* u = draws + skip;
  if constexpr (sizeof(T) == 4) {
    const hnv::ScalableTag<T> df;
    const hnv::RebindToSigned<decltype(df)> di;
    const hnv::RebindToUnsigned<decltype(df)> du;
    const hnv::Rebind<std::uint16_t, decltype(df)> d16;  // one 16-bit draw per float lane
    const auto L = static_cast<std::int64_t>(hnv::Lanes(df));
    // Draws and threshold are below 2^16: a signed 32-bit comparison is exact.
    const auto thr = hnv::Set(di, static_cast<std::int32_t>(threshold));
    const auto keepv = hnv::Set(df, keep);
    std::int64_t c = 0;
    for (; c + L <= n; c += L) {
      const auto x = hnv::BitCast(di, hnv::PromoteTo(du, hnv::LoadU(d16, u + c)));
      hnv::StoreU(hnv::IfThenZeroElse(hnv::RebindMask(df, hnv::Lt(x, thr)), keepv), df, factor + c);
    }
    for (; c < n; ++c) factor[c] = u[c] >= threshold ? keep : T(0);
  } else {
    for (std::int64_t c = 0; c < n; ++c) factor[c] = u[c] >= threshold ? keep : T(0);
  }
#endif
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
