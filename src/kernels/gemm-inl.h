// Per-target building blocks of the fused attention kernel: a register-blocked micro-kernel for
// the small matrix products of one tile, and the row operations of the online softmax.
// Included once per Highway target by flash.cpp (foreach_target), hence the toggling guard.
//
// The one product every tile needs (Q K^T, P V, dO V^T, P^T dO, dS^T Q, dS K):
//   C[m][n] (+)= sum_k A(m, k) * B[k][n]     m < M, n < N, k < K
// with A(m, k) = a[m * a_rs + k * a_cs] (so A may be read transposed), B row-major with leading
// dimension ldb, C row-major with leading dimension ldc. N must be a multiple of the vector
// length (callers pad rows to 64 bytes). The micro-kernel keeps an MR x NV block of C in
// registers for the whole K loop: per k it loads NV vectors of B, broadcasts MR scalars of A
// and issues MR * NV independent FMAs. Zen 5 has 2 FMA pipes of latency 4, so >= 8 FMAs must be
// in flight; with AVX-512 (32 registers) a 6 x 4 block uses 24 accumulators + 4 B vectors + 1
// broadcast = 29 registers; targets with 16 registers use 6 x 2 (12 + 2 + 1 = 15).
#if defined(SDPA_KERNELS_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_KERNELS_GEMM_INL_H_
#undef SDPA_KERNELS_GEMM_INL_H_
#else
#define SDPA_KERNELS_GEMM_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr std::size_t kGemmRows = 6, kGemmVectors = 4;
#elif HWY_TARGET == HWY_SCALAR
inline constexpr std::size_t kGemmRows = 4, kGemmVectors = 4;
#else
inline constexpr std::size_t kGemmRows = 6, kGemmVectors = 2;
#endif

// How a product meets the C it is written to: store (C = A B), accumulate (C += A B, the sum
// running on from C's value) or add (C += A B, the product summed from zero and then added).
enum class Into { store, accumulate, add };

// The depth of one block of a stored product's sum over K: Gemm<false> sums K > kGemmDepth in
// blocks of this many products, each from zero, and adds the blocks, as BLAS does. A single
// chain of K rounding errors grows with K where the blocks' grow with kGemmDepth and K /
// kGemmDepth: at E = 1024 the one chain's score errors made out 3.5-7 times as far from the
// float64 reference as OpenBLAS's (blocked) product does, and at E = 256 up to 4 times.
// K <= kGemmDepth (E <= 128) is one block.
inline constexpr std::size_t kGemmDepth = 128;

// One MR x NV block of C: C[0..MR)[0..NV*lanes) (=, += as kInto) A(0..MR, 0..K) B[0..K)[..).
template <std::size_t MR, std::size_t NV, Into kInto, typename T>
HWY_INLINE void MicroTile(std::size_t K, const T* HWY_RESTRICT a, std::size_t a_rs,
                          std::size_t a_cs, const T* HWY_RESTRICT b, std::size_t ldb,
                          T* HWY_RESTRICT c, std::size_t ldc) {
  const hn::ScalableTag<T> d;
  using V = hn::Vec<decltype(d)>;
  const std::size_t N = hn::Lanes(d);
  V acc[MR][NV];
#pragma GCC unroll 8
  for (std::size_t m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v) {
      acc[m][v] = kInto == Into::accumulate ? hn::LoadU(d, c + m * ldc + v * N) : hn::Zero(d);
    }
  }
  for (std::size_t k = 0; k < K; ++k) {
    const T* HWY_RESTRICT bk = b + k * ldb;
    const T* HWY_RESTRICT ak = a + k * a_cs;
    V bv[NV];
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, bk + v * N);
#pragma GCC unroll 8
    for (std::size_t m = 0; m < MR; ++m) {
      const V av = hn::Set(d, ak[m * a_rs]);
#pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[m][v] = hn::MulAdd(av, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (std::size_t m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v) {
      T* HWY_RESTRICT cv = c + m * ldc + v * N;
      hn::StoreU(kInto == Into::add ? hn::Add(hn::LoadU(d, cv), acc[m][v]) : acc[m][v], d, cv);
    }
  }
}

// MR rows of C, all N columns: blocks of NV vectors, then single vectors.
template <std::size_t MR, Into kInto, typename T>
HWY_INLINE void RowPanel(std::size_t N, std::size_t K, const T* a, std::size_t a_rs,
                         std::size_t a_cs, const T* b, std::size_t ldb, T* c, std::size_t ldc) {
  const hn::ScalableTag<T> d;
  const std::size_t lanes = hn::Lanes(d);
  // 32-bit counters: the row width is far below 2^32 (and g++ then knows the pointer arithmetic
  // below cannot overflow).
  const auto vectors = static_cast<std::uint32_t>(N / lanes);
  std::uint32_t v = 0;
  for (; v + kGemmVectors <= vectors; v += kGemmVectors) {
    MicroTile<MR, kGemmVectors, kInto>(K, a, a_rs, a_cs, b + v * lanes, ldb, c + v * lanes, ldc);
  }
  for (; v < vectors; ++v) {
    MicroTile<MR, 1, kInto>(K, a, a_rs, a_cs, b + v * lanes, ldb, c + v * lanes, ldc);
  }
}

// The last M % kGemmRows rows, with a panel of exactly that height.
template <std::size_t R, Into kInto, typename T>
HWY_INLINE void RemainderRows(std::size_t rows, std::size_t N, std::size_t K, const T* a,
                              std::size_t a_rs, std::size_t a_cs, const T* b, std::size_t ldb, T* c,
                              std::size_t ldc) {
  if constexpr (R > 0) {
    if (rows == R) {
      RowPanel<R, kInto>(N, K, a, a_rs, a_cs, b, ldb, c, ldc);
    } else {
      RemainderRows<R - 1, kInto>(rows, N, K, a, a_rs, a_cs, b, ldb, c, ldc);
    }
  }
}

/// C (=, += as kInto) A B over one run of K.
/// The columns go in blocks of kGemmVectors vectors, each block through every row panel, so
/// that one block of B (K x 64 floats on AVX-512: 32 KiB at K = 128) can stay in L1 while the
/// panels of A pass; with the row panels outside, every 6 rows reread all of B (64 KiB for a
/// 128-key tile). Measured on an AVX-512 Xeon: the backward 2-3 points of the peak faster at
/// E = 64, the forward unchanged. Each element's sum runs in the same order either way, so the
/// loop order does not change a bit of C.
template <Into kInto, typename T>
HWY_INLINE void GemmPass(std::size_t M, std::size_t N, std::size_t K, const T* a, std::size_t a_rs,
                         std::size_t a_cs, const T* b, std::size_t ldb, T* c, std::size_t ldc) {
  const std::size_t block = kGemmVectors * hn::Lanes(hn::ScalableTag<T>());
  for (std::size_t n0 = 0; n0 < N; n0 += block) {
    const std::size_t nb = N - n0 < block ? N - n0 : block;
    std::size_t m = 0;
    for (; m + kGemmRows <= M; m += kGemmRows) {
      RowPanel<kGemmRows, kInto>(nb, K, a + m * a_rs, a_rs, a_cs, b + n0, ldb, c + m * ldc + n0,
                                 ldc);
    }
    RemainderRows<kGemmRows - 1, kInto>(M - m, nb, K, a + m * a_rs, a_rs, a_cs, b + n0, ldb,
                                        c + m * ldc + n0, ldc);
  }
}

/// C (+)= A B as described at the top of this file. N % Lanes == 0. C = A B sums K in blocks of
/// kGemmDepth (see there); C += A B runs each element's sum on from C, one tile's product after
/// another.
template <bool kAccumulate, typename T>
HWY_NOINLINE void Gemm(std::size_t M, std::size_t N, std::size_t K, const T* a, std::size_t a_rs,
                       std::size_t a_cs, const T* b, std::size_t ldb, T* c, std::size_t ldc) {
  if constexpr (kAccumulate) {
    GemmPass<Into::accumulate>(M, N, K, a, a_rs, a_cs, b, ldb, c, ldc);
  } else {
    const std::size_t first = K < kGemmDepth ? K : kGemmDepth;
    GemmPass<Into::store>(M, N, first, a, a_rs, a_cs, b, ldb, c, ldc);
    for (std::size_t k0 = first; k0 < K; k0 += kGemmDepth) {
      const std::size_t kb = K - k0 < kGemmDepth ? K - k0 : kGemmDepth;
      GemmPass<Into::add>(M, N, kb, a + k0 * a_cs, a_rs, a_cs, b + k0 * ldb, ldb, c, ldc);
    }
  }
}

/// C += A B where every zero A(m, k) is skipped, so that 0 * inf or 0 * NaN in B (a masked-out
/// key or value holding a non-finite number) never reaches C. Slower; used only for tiles that
/// hold non-finite numbers.
template <typename T>
HWY_NOINLINE void GemmSkipZeros(std::size_t M, std::size_t N, std::size_t K, const T* a,
                                std::size_t a_rs, std::size_t a_cs, const T* b, std::size_t ldb,
                                T* c, std::size_t ldc) {
  const hn::ScalableTag<T> d;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t m = 0; m < M; ++m) {
    for (std::size_t k = 0; k < K; ++k) {
      const T am = a[m * a_rs + k * a_cs];
      if (am == T(0)) continue;
      const auto av = hn::Set(d, am);
      for (std::size_t n = 0; n < N; n += lanes) {
        hn::StoreU(hn::MulAdd(av, hn::LoadU(d, b + k * ldb + n), hn::LoadU(d, c + m * ldc + n)), d,
                   c + m * ldc + n);
      }
    }
  }
}

// ---- widening 16-bit inputs --------------------------------------------------------------------

/// float16 or bfloat16 lanes widened exactly to float32, inf and NaN included (NaN made quiet,
/// as vcvtph2ps and core/half.h make it). Highway's PromoteTo from float16 on the targets
/// without F16C (SSE4, SSSE3, EMU128, SCALAR) rebiases every exponent, inf and NaN's too, so
/// it reads inf as +-65536 and NaN as a finite number; those lanes (float32 exponent 15 + 128,
/// which no finite float16 reaches) are rebuilt here.
template <class D, class V16>
HWY_INLINE hn::Vec<D> WidenExact(D d, V16 v) {
  auto x = hn::PromoteTo(d, v);
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128 || \
    HWY_TARGET == HWY_SCALAR || defined(HWY_DISABLE_F16C)
  if constexpr (std::is_same_v<hn::TFromV<V16>, hwy::float16_t>) {
    const hn::RebindToUnsigned<D> du;
    const auto bits = hn::BitCast(du, x);
    const auto special =
        hn::Eq(hn::And(bits, hn::Set(du, 0x7f800000u)), hn::Set(du, (31u + 112u) << 23));
    const auto mantissa = hn::And(bits, hn::Set(du, 0x007fe000u));
    const auto quiet = hn::IfThenElseZero(hn::Ne(mantissa, hn::Zero(du)), hn::Set(du, 0x00400000u));
    const auto inf_nan = hn::Or(hn::Or(hn::And(bits, hn::Set(du, 0x80000000u)), mantissa),
                                hn::Or(quiet, hn::Set(du, 0x7f800000u)));
    x = hn::BitCast(d, hn::IfThenElse(special, inf_nan, bits));
  }
#endif
  return x;
}

// ---- row operations of the softmax (n % Lanes == 0) ------------------------------------------

/// The row maximum, or NaN if any entry is NaN: x86's max drops NaN operands, so NaN is tracked
/// separately (one compare and one OR per element, beside the E multiply-adds each score cost),
/// so that a NaN score poisons its row as the maths says instead of vanishing.
template <typename T>
HWY_INLINE T RowMax(const T* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<T> d;
  const std::size_t lanes = hn::Lanes(d);
  auto m = hn::Set(d, -std::numeric_limits<T>::infinity());
  auto nan = hn::Zero(d);
  for (std::size_t i = 0; i < n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(
        nan, hn::VecFromMask(d, hn::IsNaN(v)));  // Ne(v, v) is an ordered compare: false for NaN
  }
  if (!hn::AllFalse(d, hn::MaskFromVec(nan))) return std::numeric_limits<T>::quiet_NaN();
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

/// True when every x[0..n) is finite. x - x is 0 for finite x and NaN for inf or NaN.
template <typename T>
HWY_INLINE bool AllFinite(const T* HWY_RESTRICT x, std::int64_t n) {
  const hn::ScalableTag<T> d;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::Add(acc, hn::Sub(v, v));
  }
  T tail = 0;
  for (; i < n; ++i) tail += x[i] - x[i];
  return !std::isnan(hn::GetLane(hn::SumOfLanes(d, acc)) + tail);
}

#if HWY_TARGET != HWY_SCALAR
/// One node of LaneTree: lane i of the result reduces (sum, or maximum with kMax) lanes 2i and
/// 2i + 1 of the concatenation lo, hi.
template <bool kMax = false, class D, class V>
HWY_INLINE V TreeLevel(D d, V lo, V hi) {
  const V even = hn::ConcatEven(d, hi, lo), odd = hn::ConcatOdd(d, hi, lo);
  return kMax ? hn::Max(even, odd) : hn::Add(even, odd);
}
#endif

/// a[0..K) reduced to one vector whose N / K consecutive lanes per input hold the reductions
/// (sums, or maxima with kMax) of that input's lanes, in input order; K = N (the lane count)
/// gives lane j = the reduction of a[j]. Each node puts the pairwise results of its lower
/// input's lanes in the lower half of its output and those of its upper input in the upper half.
/// N vectors take N - 1 nodes of three operations
/// (ConcatEven, ConcatOdd, the add or max), 45 at N = 16, against two per level and vector
/// (128) when each vector is reduced on its own, in a chain of dependent shuffles. The 1-lane
/// SCALAR target has no ConcatEven and needs no tree.
template <std::size_t K, bool kMax = false>
struct LaneTree {
#if HWY_TARGET != HWY_SCALAR
  template <class D, class V>
  static HWY_INLINE V Run(D d, const V* a) {
    const V lo = LaneTree<K / 2, kMax>::Run(d, a), hi = LaneTree<K / 2, kMax>::Run(d, a + K / 2);
    return TreeLevel<kMax>(d, lo, hi);
  }
#endif
};
template <bool kMax>
struct LaneTree<1, kMax> {
  template <class D, class V>
  static HWY_INLINE V Run(D, const V* a) {
    return a[0];
  }
};

/// The lane-wise maximum of x[0..n) (n a positive multiple of the lanes), in two chains. A NaN
/// entry may or may not survive (x86's max returns its second operand when either is NaN): for
/// callers that catch NaN elsewhere.
template <class D>
HWY_INLINE hn::Vec<D> LaneMax(D d, const hn::TFromD<D>* HWY_RESTRICT x, std::size_t n) {
  const std::size_t lanes = hn::Lanes(d);
  auto m0 = hn::LoadU(d, x), m1 = m0;
  std::size_t i = lanes;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    m1 = hn::Max(m1, hn::LoadU(d, x + i));
    m0 = hn::Max(m0, hn::LoadU(d, x + i + lanes));
  }
  for (; i < n; i += lanes) m1 = hn::Max(m1, hn::LoadU(d, x + i));
  return hn::Max(m0, m1);
}

/// exp(x[u]) for u < U, in place, for the softmax's arguments (x <= 0 in exact arithmetic: a
/// score minus its row's maximum or its log-sum-exp). float32: within 1 ULP of exp on
/// [-87.33, 88], exactly 1 at 0 and 0 below -87.33 (where exp leaves float32's normal range: such
/// a weight is below 2^-126 of the row's largest, which is 1), at -inf and at NaN (as hn::Exp,
/// whose NaN rows RowMax catches). Arguments above 88 are taken as 88; kNonPositive leaves that
/// clamp out for callers whose arguments are never positive (a score minus its row's maximum):
/// one operation of fifteen, the same result for every argument <= 0. It is hn::Exp's reduction
/// and polynomial with a cheaper rounding and reconstruction: n = round(x / ln 2) comes from
/// adding x / ln 2 to 1.5 * 2^23 + 127, whose low mantissa bits then hold n + 127, so that 2^n
/// is those bits moved into the exponent field; e^r - 1 on r = x - n ln 2 (Cody-Waite, two parts
/// of ln 2) is hn::Exp's degree-5 polynomial, and (1 + (e^r - 1)) 2^n one multiply-add. Fifteen
/// vector operations against hn::Exp's twenty-two, which matters: the forward spends a fifth of
/// its time in the softmax. Each step runs over all U vectors before the next, so that U
/// independent chains of dependent operations are in flight: one vector's chain is ~45 cycles
/// of latency, longer than an AVX2 core's scheduler window holds (on family 23, U = 4 computes
/// a row 1.3x faster than one vector at a time). Every lane's result is the same for any U.
/// float64 takes hn::Exp, on arguments clamped to [-1001, 1000] (NaN to -1001: see below).
/// kKeepNaN: NaN arguments give NaN instead of 0, so that a NaN score reaches its row's sum (the
/// forward's online softmax, which does not look for NaN in its row maximum).
template <bool kNonPositive = false, bool kKeepNaN = false, std::size_t U, class D, class V>
HWY_INLINE void ExpSoftmaxN(D d, V (&x)[U]) {
  if constexpr (sizeof(hn::TFromD<D>) != 4) {
    // hn::Exp converts x / ln 2 to int32 before it looks at its range: on the portable target
    // (EMU128) that conversion is C++'s, undefined for NaN, infinities and |x| past 1.4e9.
    // Arguments below -1000 (where hn::Exp gives 0), -inf and NaN enter as -1001 instead, which
    // gives the same 0; those above 1000 as 1000, which gives inf as before.
    const V low = hn::Set(d, hn::TFromD<D>(-1001.0));
    const V high = hn::Set(d, hn::TFromD<D>(1000.0));
    for (std::size_t u = 0; u < U; ++u) {
      const V e = hn::Exp(d, hn::IfThenElse(hn::Ge(x[u], low), hn::Min(x[u], high), low));
      x[u] = kKeepNaN ? hn::IfThenElse(hn::IsNaN(x[u]), x[u], e) : e;
    }
  } else {
    const hn::RebindToSigned<D> di;
    const auto shifter = hn::Set(d, 12583039.0f);  // 1.5 * 2^23 + 127
    V t[U], r[U];
#pragma GCC unroll 8
    for (std::size_t u = 0; u < U; ++u) {
      V xc = x[u];
      if constexpr (!kNonPositive) xc = hn::Min(xc, hn::Set(d, 88.0f));
      t[u] = hn::MulAdd(xc, hn::Set(d, 1.44269504088896341f), shifter);
      const auto n = hn::Sub(t[u], shifter);  // exact: an integer in [-126, 127] where it is used
      r[u] = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), xc);
      r[u] = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r[u]);
    }
#pragma GCC unroll 8
    for (std::size_t u = 0; u < U; ++u) r[u] = hn::impl::ExpImpl<float>().ExpPoly(d, r[u]);
#pragma GCC unroll 8
    for (std::size_t u = 0; u < U; ++u) {
      const auto two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t[u])));
      const auto e = hn::MulAdd(r[u], two_n, two_n);
      if constexpr (kKeepNaN) {
        x[u] = hn::IfThenZeroElse(hn::Lt(x[u], hn::Set(d, -87.33654f)), e);  // NaN: Lt is false
      } else {
        x[u] = hn::IfThenElseZero(hn::Ge(x[u], hn::Set(d, -87.33654f)), e);
      }
    }
  }
}

/// exp(x) of one vector, as ExpSoftmaxN.
template <bool kNonPositive = false, bool kKeepNaN = false, class D, class V>
HWY_INLINE V ExpSoftmax(D d, V x) {
  V one[1] = {x};
  ExpSoftmaxN<kNonPositive, kKeepNaN>(d, one);
  return one[0];
}

/// x[i..i + U * Lanes) = exp(x - shift) in place, U vectors at a time; adds each vector to *sum
/// (when given) in order, so that the sum is the same as one vector at a time.
template <bool kNonPositive, bool kKeepNaN, std::size_t U, class D, class V>
HWY_INLINE void ExpShiftBlock(D d, hn::TFromD<D>* HWY_RESTRICT x, V shift, V* sum) {
  const std::size_t lanes = hn::Lanes(d);
  V e[U];
#pragma GCC unroll 8
  for (std::size_t u = 0; u < U; ++u) e[u] = hn::Sub(hn::LoadU(d, x + u * lanes), shift);
  ExpSoftmaxN<kNonPositive, kKeepNaN>(d, e);
#pragma GCC unroll 8
  for (std::size_t u = 0; u < U; ++u) {
    hn::StoreU(e[u], d, x + u * lanes);
    if (sum != nullptr) *sum = hn::Add(*sum, e[u]);
  }
}

/// Vectors per block of the softmax's exp loops: enough chains to fill the FMA pipes, few enough
/// that 16-register targets keep them in registers.
inline constexpr std::size_t kExpBlock = 4;

/// x[i] = exp(x[i] - shift) in place over n elements, summed into *sum when given: blocks of
/// kExpBlock vectors, then single vectors.
template <bool kNonPositive, typename T, bool kKeepNaN = false>
HWY_INLINE void ExpShiftRow(T* HWY_RESTRICT x, std::size_t n, T shift,
                            hn::Vec<hn::ScalableTag<T>>* sum) {
  const hn::ScalableTag<T> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto vs = hn::Set(d, shift);
  std::size_t i = 0;
  for (; i + kExpBlock * lanes <= n; i += kExpBlock * lanes) {
    ExpShiftBlock<kNonPositive, kKeepNaN, kExpBlock>(d, x + i, vs, sum);
  }
  for (; i < n; i += lanes) ExpShiftBlock<kNonPositive, kKeepNaN, 1>(d, x + i, vs, sum);
}

/// x[i] = exp(x[i] - shift) in place; returns the sum. x may hold -inf (gives 0). shift is at
/// least every x[i] (the row's running maximum), or NaN, so no argument is positive.
template <typename T>
HWY_INLINE T ExpShiftSum(T* HWY_RESTRICT x, std::size_t n, T shift) {
  const hn::ScalableTag<T> d;
  auto sum = hn::Zero(d);
  ExpShiftRow</*kNonPositive=*/true>(x, n, shift, &sum);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

/// x[i] = exp(x[i] - shift) in place (no sum).
template <typename T>
HWY_INLINE void ExpShift(T* HWY_RESTRICT x, std::size_t n, T shift) {
  ExpShiftRow</*kNonPositive=*/false>(x, n, shift,
                                      static_cast<hn::Vec<hn::ScalableTag<T>>*>(nullptr));
}

template <typename T>
HWY_INLINE void ScaleRow(T* HWY_RESTRICT x, std::size_t n, T factor) {
  const hn::ScalableTag<T> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto f = hn::Set(d, factor);
  for (std::size_t i = 0; i < n; i += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), f), d, x + i);
}

/// ds[i] = p[i] * (dp[i] - D), and exactly 0 where p[i] == 0 (a masked key: its dP may be NaN
/// when the value row holds NaN; 0 * NaN must not happen). A NaN p[i] gives NaN (the zero test
/// is Eq, which is false for NaN; Ne is an ordered compare on x86, false for NaN too).
template <typename T>
HWY_INLINE void SoftmaxGradRow(const T* HWY_RESTRICT p, T* HWY_RESTRICT dp_to_ds, std::size_t n,
                               T D) {
  const hn::ScalableTag<T> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto vD = hn::Set(d, D);
  const auto zero = hn::Zero(d);
  for (std::size_t i = 0; i < n; i += lanes) {
    const auto pv = hn::LoadU(d, p + i);
    const auto ds = hn::Mul(pv, hn::Sub(hn::LoadU(d, dp_to_ds + i), vD));
    hn::StoreU(hn::IfThenZeroElse(hn::Eq(pv, zero), ds), d, dp_to_ds + i);
  }
}

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SDPA_KERNELS_GEMM_INL_H_
