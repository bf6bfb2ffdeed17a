// Rows at the edges of what float32 can resolve, for the fused kernel (and the naive baseline
// where it shares the rule), on every compiled SIMD target:
//   - a mask that shifts a whole row by a constant too large for float32 to resolve the scores
//     (-1e9, finfo.min): the backward's P must sum to 1, as the forward's does;
//   - huge scales, where P is one-hot and the exact gradients of q and k are 0;
//   - NaN or inf in the q or dO of a row that sees no key: they must not reach dk or dv;
//   - +inf in an additive mask: the row is NaN, as in the reference and PyTorch;
//   - a float64 mask below float32's range on float32 scores: the keys stay visible;
//   - an lse that cannot normalise P (NaN, +inf): the backward recomputes the row's sum.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "../common/test_util.h"
#include "hwy/targets.h"
#include "kernels/kernels.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::AttentionOptions;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::test::Case;
using sdpa::test::get;
using sdpa::test::Inputs;
using sdpa::test::make_inputs;
using sdpa::test::max_abs;
using sdpa::test::max_abs_diff;
using sdpa::test::Outputs;
using sdpa::test::run;
using sdpa::test::set;

// Runs `check` once with each compiled Highway target pinned.
template <class F>
void on_every_target(F check) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    check();
  }
  hwy::SetSupportedTargetsForTest(0);
}

Case small_case(std::int64_t L, std::int64_t S, std::int64_t E, int mask_kind) {
  Case c;
  c.L = L;
  c.S = S;
  c.E = E;
  c.Ev = E;
  c.mask_kind = mask_kind;
  return c;
}

// Sum over the keys of dv, per (kv head, feature), and sum over the rows that see a key of dO:
// equal when every row's P sums to 1 (sum_s dv[s] = sum_l (sum_s P[l][s]) dO[l]).
double column_sum_gap(const Inputs& in, const Outputs& o, const Case& c,
                      const std::vector<bool>& row_sees_a_key) {
  double worst = 0, mass = 0;
  for (std::int64_t e = 0; e < c.Ev; ++e) {
    double dv_sum = 0, dout_sum = 0;
    for (std::int64_t s = 0; s < c.S; ++s) dv_sum += get(o.dv, s * c.Ev + e);
    for (std::int64_t l = 0; l < c.L; ++l) {
      if (row_sees_a_key[static_cast<std::size_t>(l)]) dout_sum += get(in.dout, l * c.Ev + e);
    }
    worst = std::max(worst, std::abs(dv_sum - dout_sum));
    mass = std::max(mass, std::abs(dout_sum));
  }
  return worst / std::max(mass, 1.0);
}

// The review's example: q (1,1,4,8), k (1,1,11,8), an additive mask of c everywhere. For every
// shift c from 0 to finfo.min the backward's P sums to 1 and dv agrees with the naive baseline
// (which normalises P itself) within what rounding the scores at |c| allows.
TEST(ExtremeRows, ConstantMaskShiftKeepsBackwardNormalised) {
  const Case c = small_case(4, 11, 8, 2);
  const double shifts[] = {0.0, -1e2, -1e4, -1e6, -1e9, -1e20, -1e35, -FLT_MAX};
  on_every_target([&] {
    for (const double shift : shifts) {
      Inputs in = make_inputs(c, DType::float32, 11);
      for (std::int64_t i = 0; i < in.mask.numel(); ++i) set(in.mask, i, shift);
      const Outputs fast = run(in, c.options, Impl::fast);
      const Outputs naive = run(in, c.options, Impl::naive);
      const std::vector<bool> all(static_cast<std::size_t>(c.L), true);
      EXPECT_LE(column_sum_gap(in, fast, c, all), 1e-5) << "shift " << shift;
      // Scores at |shift| are rounded to ulp(shift); the two kernels may round a score to
      // neighbouring values, which moves P by a factor up to exp(ulp): allow that, plus the
      // contract's relative error.
      const double ulp = std::max(std::abs(shift), 1.0) * FLT_EPSILON;
      const double tol = (std::expm1(std::min(2 * ulp, 1.0)) + 2e-5) * max_abs(naive.dv);
      EXPECT_LE(max_abs_diff(fast.dv, naive.dv), tol) << "shift " << shift;
      EXPECT_LE(max_abs(fast.dv), 1.01 * max_abs(naive.dv) + 1e-6) << "shift " << shift;
    }
  });
}

// The same in float64, with scores that stay exact after the shift (q and k multiples of 1/8,
// scale 1, shifts powers of two): P = exp(S - lse) then errs only by the rounding of lse,
// |lse| / 2 epsilons, so the backward must renormalise rows with |lse| > 64 in float64 too and
// agree with the naive baseline to a few epsilons.
TEST(ExtremeRows, Float64ShiftedRowsKeepFloat64Accuracy) {
  Case c = small_case(20, 11, 8, 2);  // past kDecodeMaxQueries: the fused forward's own lse
  c.options.scale = 1.0;
  const double shifts[] = {0.0, -0x1p10, -0x1p20, -0x1p30, -0x1p40};
  on_every_target([&] {
    for (const double shift : shifts) {
      Inputs in = make_inputs(c, DType::float64, 13);
      for (Array* a : {&in.q, &in.k}) {
        for (std::int64_t i = 0; i < a->numel(); ++i) set(*a, i, std::round(8 * get(*a, i)) / 8);
      }
      for (std::int64_t i = 0; i < in.mask.numel(); ++i) set(in.mask, i, shift);
      const Outputs fast = run(in, c.options, Impl::fast);
      const Outputs naive = run(in, c.options, Impl::naive);
      for (const auto& [f, n, what] :
           {std::tuple{&fast.dv, &naive.dv, "dv"}, std::tuple{&fast.dk, &naive.dk, "dk"},
            std::tuple{&fast.dq, &naive.dq, "dq"}}) {
        EXPECT_LE(max_abs_diff(*f, *n), 1e-13 * max_abs(*n)) << what << " shift " << shift;
      }
    }
  });
}

// One padded query row (every key finfo.min), the others ordinary: the padded row's P is
// uniform (float32 cannot tell its scores apart), and sums to 1 in the backward too.
TEST(ExtremeRows, PaddedQueryRowOfFinfoMin) {
  const Case c = small_case(70, 150, 16, 2);  // two query tiles, two key tiles
  on_every_target([&] {
    Inputs in = make_inputs(c, DType::float32, 12);
    for (std::int64_t i = 0; i < in.mask.numel(); ++i) set(in.mask, i, 0.0);
    for (std::int64_t s = 0; s < c.S; ++s) set(in.mask, 66 * c.S + s, -FLT_MAX);
    const Outputs fast = run(in, c.options, Impl::fast);
    const Outputs naive = run(in, c.options, Impl::naive);
    const std::vector<bool> all(static_cast<std::size_t>(c.L), true);
    EXPECT_LE(column_sum_gap(in, fast, c, all), 1e-5);
    EXPECT_LE(max_abs_diff(fast.dv, naive.dv), 1e-4 * max_abs(naive.dv));
    EXPECT_LE(max_abs_diff(fast.dk, naive.dk), 1e-4 * max_abs(naive.dk));
    EXPECT_LE(max_abs_diff(fast.dq, naive.dq), 1e-4 * max_abs(naive.dq));
  });
}

// Scales so large that P is exactly one-hot: the exact dq and dk are 0 (dP - D vanishes at the
// one visible maximum), and so are the reference's and the naive baseline's.
TEST(ExtremeRows, HugeScaleGivesZeroQueryAndKeyGradients) {
  for (const double scale : {1e8, 1e30}) {
    Case c = small_case(33, 150, 16, 0);
    c.options.scale = scale;
    on_every_target([&] {
      const Inputs in = make_inputs(c, DType::float32, 13);
      const Outputs fast = run(in, c.options, Impl::fast);
      const Outputs truth = run(in, c.options, Impl::reference);
      EXPECT_EQ(max_abs(truth.dq), 0.0) << "scale " << scale;
      EXPECT_EQ(max_abs(fast.dq), 0.0) << "scale " << scale;
      EXPECT_EQ(max_abs(fast.dk), 0.0) << "scale " << scale;
      EXPECT_LE(max_abs_diff(fast.dv, truth.dv), 1e-6 * max_abs(truth.dv)) << "scale " << scale;
    });
  }
}

// Causal lower-right with L > S: the first L - S query rows see no key. NaN and inf in their q
// and dO must not reach any gradient.
TEST(ExtremeRows, NonFiniteQueryOrGradInRowWithoutKeys) {
  Case c = small_case(90, 40, 16, 0);
  c.options.causal = Causal::lower_right;
  on_every_target([&] {
    Inputs in = make_inputs(c, DType::float32, 14);
    const Outputs clean = run(in, c.options, Impl::reference);
    for (std::int64_t e = 0; e < c.E; ++e) {
      set(in.q, 3 * c.E + e, NAN);
      set(in.q, 7 * c.E + e, INFINITY);
      set(in.dout, 5 * c.Ev + e, NAN);
      set(in.dout, 7 * c.Ev + e, -INFINITY);
    }
    for (const Impl impl : {Impl::fast, Impl::naive}) {
      const Outputs o = run(in, c.options, impl);
      SCOPED_TRACE(sdpa::impl_name(impl));
      for (const Array* a : {&o.dk, &o.dv}) {
        for (std::int64_t i = 0; i < a->numel(); ++i) ASSERT_TRUE(std::isfinite(get(*a, i))) << i;
      }
      EXPECT_LE(max_abs_diff(o.dk, clean.dk), 1e-4 * max_abs(clean.dk));
      EXPECT_LE(max_abs_diff(o.dv, clean.dv), 1e-4 * max_abs(clean.dv));
      for (std::int64_t l = 0; l < c.L - c.S; ++l) {  // rows without keys: exactly zero
        for (std::int64_t e = 0; e < c.E; ++e) ASSERT_EQ(get(o.dq, l * c.E + e), 0.0);
      }
    }
  });
}

// A fully masked row (boolean mask) whose dO holds NaN: dv stays finite.
TEST(ExtremeRows, NanGradOfFullyMaskedRow) {
  const Case c = small_case(20, 30, 8, 1);
  on_every_target([&] {
    Inputs in = make_inputs(c, DType::float32, 15);
    for (std::int64_t s = 0; s < c.S; ++s) set(in.mask, 4 * c.S + s, 0.0);
    for (std::int64_t s = 0; s < c.S; ++s) set(in.mask, 5 * c.S + s, 1.0);  // row 5 sees all
    const Outputs clean = run(in, c.options, Impl::reference);
    for (std::int64_t e = 0; e < c.Ev; ++e) set(in.dout, 4 * c.Ev + e, NAN);
    for (const Impl impl : {Impl::fast, Impl::naive}) {
      const Outputs o = run(in, c.options, impl);
      SCOPED_TRACE(sdpa::impl_name(impl));
      EXPECT_LE(max_abs_diff(o.dv, clean.dv), 1e-4 * max_abs(clean.dv));
      EXPECT_LE(max_abs_diff(o.dk, clean.dk), 1e-4 * max_abs(clean.dk));
    }
  });
}

// +inf in an additive mask makes that row NaN (inf - inf in the softmax), in every
// implementation; the other rows are untouched.
TEST(ExtremeRows, PlusInfinityInMaskGivesNaNRow) {
  const Case c = small_case(10, 150, 8, 2);
  on_every_target([&] {
    Inputs in = make_inputs(c, DType::float32, 16);
    for (std::int64_t i = 0; i < in.mask.numel(); ++i) set(in.mask, i, 0.0);
    set(in.mask, 2 * c.S + 140, INFINITY);
    const Outputs truth = run(in, c.options, Impl::reference, false);
    for (const Impl impl : {Impl::fast, Impl::naive}) {
      const Outputs o = run(in, c.options, impl, false);
      SCOPED_TRACE(sdpa::impl_name(impl));
      EXPECT_TRUE(std::isnan(get(truth.lse, 2)));
      EXPECT_TRUE(std::isnan(get(o.lse, 2)));
      for (std::int64_t e = 0; e < c.Ev; ++e) EXPECT_TRUE(std::isnan(get(o.out, 2 * c.Ev + e)));
      for (std::int64_t l : {0, 1, 3, 9}) {
        EXPECT_NEAR(get(o.lse, l), get(truth.lse, l), 1e-5 * std::abs(get(truth.lse, l)) + 1e-5);
      }
    }
  });
}

// A float64 mask with finite values below float32's range, on float32 inputs: the keys are
// visible (the reference's softmax over equal scores is uniform), not masked.
TEST(ExtremeRows, Float64MaskBelowFloat32Range) {
  Case c = small_case(6, 9, 8, 0);
  on_every_target([&] {
    Inputs in = make_inputs(c, DType::float32, 17);
    in.has_mask = true;
    in.mask = Array(DType::float64, {c.L, c.S});
    for (std::int64_t i = 0; i < in.mask.numel(); ++i) set(in.mask, i, 0.0);
    for (std::int64_t s = 0; s < c.S; ++s) set(in.mask, 1 * c.S + s, -1e300);  // whole row
    set(in.mask, 3 * c.S + 4, -1e300);                                         // one key
    const Outputs truth = run(in, c.options, Impl::reference);
    for (const Impl impl : {Impl::fast, Impl::naive}) {
      const Outputs o = run(in, c.options, impl);
      SCOPED_TRACE(sdpa::impl_name(impl));
      EXPECT_LE(max_abs_diff(o.out, truth.out), 1e-5 * max_abs(truth.out));
      EXPECT_LE(max_abs_diff(o.dv, truth.dv), 1e-4 * max_abs(truth.dv));
      // Row 1's lse, -1e300 + log(9), has no float32 value: the reference rounds it to -inf,
      // the kernels give the lowest float32; every other row's lse is ordinary.
      EXPECT_LE(get(o.lse, 1), -FLT_MAX / 2);
      for (std::int64_t l : {0, 2, 3, 4, 5}) {
        EXPECT_NEAR(get(o.lse, l), get(truth.lse, l), 1e-5 * std::abs(get(truth.lse, l)) + 1e-5);
      }
    }
  });
}

// The backward handed an lse it cannot normalise P with (NaN, +inf, a huge finite value)
// recomputes the row's sum from the inputs: the gradients are those of the true lse, never
// silently zero.
TEST(ExtremeRows, UnusableLseIsRecomputed) {
  const Case c = small_case(70, 150, 16, 0);
  on_every_target([&] {
    const Inputs in = make_inputs(c, DType::float32, 18);
    const Outputs good = run(in, c.options, Impl::fast);
    for (const double bad : {double(NAN), double(INFINITY), 1e30}) {
      Array lse = good.lse.astype(DType::float32);
      set(lse, 3, bad);
      set(lse, 68, bad);
      Array dq(DType::float32, in.q.shape()), dk(DType::float32, in.k.shape()),
          dv(DType::float32, in.v.shape());
      AttentionOptions o = c.options;
      o.impl = Impl::fast;
      sdpa::attention_backward(in.q, in.k, in.v, nullptr, good.out, lse, in.dout, o, dq.mut(),
                               dk.mut(), dv.mut());
      EXPECT_LE(max_abs_diff(dq, good.dq), 1e-5 * max_abs(good.dq)) << "lse " << bad;
      EXPECT_LE(max_abs_diff(dk, good.dk), 1e-5 * max_abs(good.dk)) << "lse " << bad;
      EXPECT_LE(max_abs_diff(dv, good.dv), 1e-5 * max_abs(good.dv)) << "lse " << bad;
    }
  });
}

}  // namespace
