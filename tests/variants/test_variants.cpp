// The attention variants (window, softcap, ALiBi, sinks, dropout) in the fused kernel against
// the float64 reference, and the reference against finite differences.
//
// Asserted:
//   - a randomized matrix of shapes and options, forward and backward (dq, dk, dv and the sinks'
//     gradient), on every compiled Highway target and every backward plan: float32 within
//     (2e-5 + min(max|lse|, 64) eps) of the largest magnitude of each result, float64 within
//     1e-10 of it (the contract of tests/kernels, whose naive baseline has no variants);
//   - bit-identical results for 1, 2 and 3 threads with every variant on;
//   - rows that see no key (a window that reaches no key) give out = 0 and lse = -inf, or the
//     sink's logit with a sink, and zero gradients;
//   - rows with |lse| > 64 (an additive mask of -200) are renormalised in the backward;
//   - the reference's gradients, the sink's included, match central differences in float64;
//   - dropout: the fused kernel draws the reference's mask (same out and gradients); the same
//     seed gives the same bits, another seed another mask; about p of the keys are dropped; the
//     mean over seeds converges to the output without dropout;
//   - the kernel's vectorised Philox gives the scalar Random123 factors bit for bit, and its
//     rational tanh stays within 3 float32 ulps of a float64 tanh, on every compiled target;
//   - bad options are refused with an sdpa::Error naming the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "../common/test_util.h"
#include "core/problem.h"
#include "core/variants.h"
#include "hwy/targets.h"
#include "kernels/dispatch.h"
#include "reference/reference.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"
#include "sdpa/varlen.h"

namespace {

using sdpa::Array;
using sdpa::AttentionOptions;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::MutableTensorRef;
using sdpa::TensorRef;
using sdpa::test::Case;
using sdpa::test::Inputs;
using sdpa::test::max_abs;
using sdpa::test::max_abs_diff;

struct Result {
  Array out, lse, dq, dk, dv, dsinks;
};

Result run_variants(const Inputs& in, AttentionOptions o, Impl impl, bool backward = true) {
  o.impl = impl;
  Result r;
  r.out = Array(in.q.dtype(), sdpa::attention_output_shape(in.q, in.k, in.v, o));
  r.lse = Array(in.q.dtype(), sdpa::attention_lse_shape(in.q));
  const MutableTensorRef lse = r.lse.mut();
  sdpa::attention_forward(in.q, in.k, in.v, in.mask_ref(), o, r.out.mut(), &lse);
  if (!backward) return r;
  r.dq = Array(in.q.dtype(), in.q.shape());
  r.dk = Array(in.k.dtype(), in.k.shape());
  r.dv = Array(in.v.dtype(), in.v.shape());
  r.dsinks = Array(in.q.dtype(), {static_cast<std::int64_t>(o.sinks.size())});
  const MutableTensorRef ds = r.dsinks.mut();
  sdpa::attention_backward(in.q, in.k, in.v, in.mask_ref(), r.out, r.lse, in.dout, o, r.dq.mut(),
                           r.dk.mut(), r.dv.mut(), o.sinks.empty() ? nullptr : &ds);
  return r;
}

Inputs as_float64(const Inputs& in) {
  Inputs d;
  d.q = in.q.astype(DType::float64);
  d.k = in.k.astype(DType::float64);
  d.v = in.v.astype(DType::float64);
  d.dout = in.dout.astype(DType::float64);
  d.has_mask = in.has_mask;
  if (in.has_mask) d.mask = in.mask.astype(in.mask.dtype());
  return d;
}

double finite_max_abs(const Array& a) {
  double m = 0;
  const Array d = a.astype(DType::float64);
  for (std::int64_t i = 0; i < d.numel(); ++i) {
    const double x = std::fabs(d.data_as<double>()[i]);
    if (std::isfinite(x)) m = std::max(m, x);
  }
  return m;
}

void expect_close(const char* what, const Array& got, const Array& want, double rel,
                  const std::string& name) {
  const Array g = got.astype(DType::float64);
  std::int64_t worst = 0;
  const double err = max_abs_diff(g, want, &worst);
  const double bound = rel * std::max(1.0, max_abs(want));
  EXPECT_LE(err, bound) << what << " of " << name << ": worst at flat index " << worst << " got "
                        << g.data_as<double>()[worst] << " want " << want.data_as<double>()[worst];
}

// One problem of the matrix: its shape, causal, mask and variants.
struct VariantCase {
  Case c;
  std::string name;
};

Case random_case(std::mt19937_64& rng, bool small) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  Case c;
  if (rng() % 2 == 0) c.lead = {pick(1, 2)};
  c.Hkv = pick(1, 2);
  c.Hq = c.Hkv * pick(1, 2);
  c.options.enable_gqa = c.Hq != c.Hkv;
  c.L = small ? pick(1, 40) : pick(1, 200);
  c.S = small ? pick(1, 40) : pick(1, 330);
  c.E = pick(1, 24);
  c.Ev = rng() % 2 == 0 ? c.E : pick(1, 24);
  c.options.causal = static_cast<Causal>(rng() % 3);
  c.mask_kind = static_cast<int>(rng() % 4 == 0 ? 1 + rng() % 2 : 0);
  auto window_side = [&] {
    const auto r = rng() % 3;
    return r == 0 ? std::int64_t{-1} : pick(0, small ? 12 : 150);
  };
  if (rng() % 4 != 0) {
    c.options.window_left = window_side();
    c.options.window_right = window_side();
  }
  if (rng() % 2 == 0) c.options.softcap = 0.5 + static_cast<double>(rng() % 100) / 20.0;
  const std::int64_t B = c.lead.empty() ? 1 : c.lead[0];
  std::uniform_real_distribution<double> u(0.01, 0.6);
  if (rng() % 2 == 0) {
    const std::int64_t n = rng() % 2 == 0 ? c.Hq : B * c.Hq;
    for (std::int64_t i = 0; i < n; ++i) c.options.alibi_slopes.push_back(u(rng));
  }
  std::normal_distribution<double> normal(0.0, 1.5);
  if (rng() % 2 == 0) {
    for (std::int64_t i = 0; i < c.Hq; ++i) c.options.sinks.push_back(normal(rng));
  }
  return c;
}

std::string describe(const Case& c) {
  return c.name() + "_w" + std::to_string(c.options.window_left) + "," +
         std::to_string(c.options.window_right) + "_cap" + std::to_string(c.options.softcap) +
         "_alibi" + std::to_string(c.options.alibi_slopes.size()) + "_sinks" +
         std::to_string(c.options.sinks.size()) + "_p" + std::to_string(c.options.dropout_p);
}

// float32 fast against the float64 reference on the same inputs, forward and backward.
void check_against_reference(const Case& c, std::uint64_t seed) {
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, seed);
  const Inputs in64 = as_float64(in);
  const Result fast = run_variants(in, c.options, Impl::fast);
  const Result ref = run_variants(in64, c.options, Impl::reference);
  const std::string name = describe(c) + " on " + sdpa::detail::fast_kernel_target();
  const double eps = std::numeric_limits<float>::epsilon();
  const double lse_floor = std::min(finite_max_abs(ref.lse), 64.0) * eps;
  expect_close("out", fast.out, ref.out, 2e-5, name);
  expect_close("lse", fast.lse, ref.lse, 2e-5, name);
  expect_close("dq", fast.dq, ref.dq, 2e-5 + lse_floor, name);
  expect_close("dk", fast.dk, ref.dk, 2e-5 + lse_floor, name);
  expect_close("dv", fast.dv, ref.dv, 2e-5 + lse_floor, name);
  if (!c.options.sinks.empty()) {
    // A sum over every row of the head: its rounding grows with L (float32 D and lse).
    expect_close("dsinks", fast.dsinks, ref.dsinks, 2e-5 + lse_floor + 1e-6 * double(c.L), name);
  }
}

TEST(Variants, MatrixOnEveryTargetAndPlan) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  std::mt19937_64 rng(20261201);
  std::uint64_t seed = 1500;
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    ASSERT_STREQ(sdpa::detail::fast_kernel_target(), hwy::TargetName(target));
    for (int chunks : {-1, 0, 1, 3}) {
      sdpa::detail::set_backward_chunks_for_test(chunks);
      for (int n = 0; n < 3; ++n) check_against_reference(random_case(rng, n != 0), seed++);
    }
    sdpa::detail::set_backward_chunks_for_test(-1);
    // Float64 inputs: the same algorithm in float64, against the reference to 1e-10.
    Case c = random_case(rng, false);
    const Inputs in = sdpa::test::make_inputs(c, DType::float64, seed++);
    const Result fast = run_variants(in, c.options, Impl::fast);
    const Result ref = run_variants(in, c.options, Impl::reference);
    for (auto [what, a, b] :
         {std::tuple{"out", &fast.out, &ref.out}, std::tuple{"lse", &fast.lse, &ref.lse},
          std::tuple{"dq", &fast.dq, &ref.dq}, std::tuple{"dk", &fast.dk, &ref.dk},
          std::tuple{"dv", &fast.dv, &ref.dv}}) {
      expect_close(what, *a, *b, 1e-10, describe(c) + " float64");
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Every variant on at once, on shapes across several tiles, fixed rather than sampled.
Case all_variants_case() {
  Case c;
  c.lead = {2};
  c.Hq = 4;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  c.L = 150;
  c.S = 400;
  c.E = 16;
  c.Ev = 20;
  c.options.causal = Causal::lower_right;
  c.options.window_left = 130;
  c.options.window_right = 0;
  c.options.softcap = 4.0;
  c.options.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  c.options.sinks = {0.3, -1.0, 2.0, 0.0};
  c.options.dropout_p = 0.2;
  c.options.seed = 77;
  return c;
}

TEST(Variants, FixedCaseEveryVariantAgainstReference) {
  check_against_reference(all_variants_case(), 11);
  Case c = all_variants_case();
  c.mask_kind = 2;  // an additive mask with -inf on top
  check_against_reference(c, 12);
}

bool bit_identical(const Array& a, const Array& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Variants, BitIdenticalForAnyThreadCount) {
  const Case c = all_variants_case();
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, 21);
  AttentionOptions o = c.options;
  o.threads = 1;
  const Result one = run_variants(in, o, Impl::fast);
  for (int threads : {2, 3}) {
    o.threads = threads;
    const Result r = run_variants(in, o, Impl::fast);
    EXPECT_TRUE(bit_identical(one.out, r.out)) << threads << " threads: out";
    EXPECT_TRUE(bit_identical(one.lse, r.lse)) << threads << " threads: lse";
    EXPECT_TRUE(bit_identical(one.dq, r.dq)) << threads << " threads: dq";
    EXPECT_TRUE(bit_identical(one.dk, r.dk)) << threads << " threads: dk";
    EXPECT_TRUE(bit_identical(one.dv, r.dv)) << threads << " threads: dv";
    EXPECT_TRUE(bit_identical(one.dsinks, r.dsinks)) << threads << " threads: dsinks";
  }
}

TEST(Variants, RowsThatSeeNoKeyGiveZeros) {
  // L > S with a window of (-1, 0): query i sees keys j <= i + (S - L), so the first L - S rows
  // see none. With and without a sink, NaN in the keys' and values' last rows does not matter.
  for (bool sink : {false, true}) {
    Case c;
    c.Hq = c.Hkv = 2;
    c.L = 200;
    c.S = 70;
    c.E = c.Ev = 8;
    c.options.window_left = -1;
    c.options.window_right = 0;
    c.options.softcap = 2.0;
    c.options.alibi_slopes = {0.1, 0.2};
    if (sink) c.options.sinks = {0.5, -0.25};
    const Inputs in = sdpa::test::make_inputs(c, DType::float32, 31);
    for (Impl impl : {Impl::fast, Impl::reference}) {
      const Result r = run_variants(in, c.options, impl);
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        for (std::int64_t l = 0; l < c.L - c.S; ++l) {
          const std::int64_t row = h * c.L + l;
          const float want_lse =
              sink ? static_cast<float>(c.options.sinks[static_cast<std::size_t>(h)])
                   : -std::numeric_limits<float>::infinity();
          ASSERT_EQ(r.lse.data_as<float>()[row], want_lse) << "row " << row;
          for (std::int64_t e = 0; e < c.Ev; ++e) {
            ASSERT_EQ(r.out.data_as<float>()[row * c.Ev + e], 0.0f) << "row " << row;
          }
          for (std::int64_t e = 0; e < c.E; ++e) {
            ASSERT_EQ(r.dq.data_as<float>()[row * c.E + e], 0.0f) << "row " << row;
          }
        }
      }
    }
  }
}

// Every softcapped score saturated (|x / cap| ~ 125): the cap's derivative 1 - tanh^2 is 0 in
// float32 (4 exp(-250) in the maths), so dq and dk are exactly 0, as the reference gives to
// float32; on every compiled target.
TEST(Variants, SaturatedSoftcapGivesNoQueryOrKeyGradient) {
  Case c;
  c.Hq = c.Hkv = 2;
  c.L = 40;
  c.S = 50;
  c.E = c.Ev = 16;
  c.options.softcap = 5.0;
  Inputs in = sdpa::test::make_inputs(c, DType::float32, 41);
  for (std::int64_t i = 0; i < c.Hq * c.L; ++i) sdpa::test::set(in.q, i * c.E, 50.0);
  for (std::int64_t s = 0; s < c.Hkv * c.S; ++s) {
    sdpa::test::set(in.k, s * c.E, s % 3 == 0 ? -50.0 : 50.0);
  }
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const Result r = run_variants(in, c.options, Impl::fast);
    EXPECT_EQ(sdpa::test::max_abs(r.dq), 0.0) << hwy::TargetName(target);
    EXPECT_EQ(sdpa::test::max_abs(r.dk), 0.0) << hwy::TargetName(target);
    EXPECT_GT(sdpa::test::max_abs(r.dv), 0.0) << hwy::TargetName(target);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A softcap or a sink past float32's range, finite as given, on float32 inputs: the results are
// the reference's (the cap inactive; a huge sink takes the whole row: zeros, lse +inf), never
// NaN from inf * 0 or inf - inf in float32.
TEST(Variants, SoftcapAndSinksPastFloat32RangeFollowTheReference) {
  Case c;
  c.Hq = c.Hkv = 2;
  c.L = 20;
  c.S = 30;
  c.E = c.Ev = 8;
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, 43);
  AttentionOptions capped = c.options, sunk = c.options;
  capped.softcap = 1e39;
  sunk.sinks = {1e39, -0.5};
  for (const AttentionOptions& o : {capped, sunk}) {
    const Result fast = run_variants(in, o, Impl::fast);
    const Result ref = run_variants(in, o, Impl::reference);
    for (const auto& [f, r, what] :
         {std::tuple{&fast.out, &ref.out, "out"}, std::tuple{&fast.lse, &ref.lse, "lse"},
          std::tuple{&fast.dq, &ref.dq, "dq"}, std::tuple{&fast.dk, &ref.dk, "dk"},
          std::tuple{&fast.dv, &ref.dv, "dv"}}) {
      EXPECT_TRUE(bit_identical(*f, *r)) << what << " softcap " << o.softcap;
    }
  }
  const Result r = run_variants(in, capped, Impl::fast);
  EXPECT_TRUE(sdpa::test::all_finite(r.out));
}

TEST(Variants, LargeLseIsRenormalised) {
  // Every score shifted by -200: |lse| > 64, so the backward recomputes each row's max and sum
  // (with the sink joining them) instead of trusting exp(S - lse) in float32.
  Case c;
  c.Hq = c.Hkv = 2;
  c.L = 90;
  c.S = 260;
  c.E = c.Ev = 16;
  c.mask_kind = 2;
  c.mask_shape = {1, 1};
  c.options.window_left = 100;
  c.options.window_right = 40;
  c.options.softcap = 5.0;
  c.options.alibi_slopes = {0.05, 0.1};
  for (bool sink : {false, true}) {
    if (sink) c.options.sinks = {-199.0, -205.0};
    Inputs in = sdpa::test::make_inputs(c, DType::float32, 41);
    in.mask.data_as<float>()[0] = -200.0f;
    const Result fast = run_variants(in, c.options, Impl::fast);
    const Result ref = run_variants(as_float64(in), c.options, Impl::reference);
    const std::string name = sink ? "with sinks" : "without sinks";
    const double eps = std::numeric_limits<float>::epsilon();
    expect_close("out", fast.out, ref.out, 2e-5, name);
    expect_close("lse", fast.lse, ref.lse, 2e-5, name);
    expect_close("dq", fast.dq, ref.dq, 2e-5 + 64 * eps, name);
    expect_close("dk", fast.dk, ref.dk, 2e-5 + 64 * eps, name);
    expect_close("dv", fast.dv, ref.dv, 2e-5 + 64 * eps, name);
    if (sink) expect_close("dsinks", fast.dsinks, ref.dsinks, 2e-5 + 64 * eps, name);
  }
}

// ---- finite differences --------------------------------------------------------------------

double loss(const Inputs& in, const AttentionOptions& o) {
  const Result r = run_variants(in, o, Impl::reference, false);
  double sum = 0;
  for (std::int64_t i = 0; i < r.out.numel(); ++i) {
    sum += r.out.data_as<double>()[i] * in.dout.data_as<double>()[i];
  }
  return sum;
}

TEST(Variants, GradientsMatchFiniteDifferences) {
  Case c;
  c.Hq = 2;
  c.Hkv = 1;
  c.options.enable_gqa = true;
  c.L = 9;
  c.S = 13;
  c.E = 5;
  c.Ev = 6;
  c.options.causal = Causal::lower_right;
  c.options.window_left = 6;
  c.options.window_right = 2;
  c.options.softcap = 1.5;
  c.options.alibi_slopes = {0.3, 0.1};
  c.options.sinks = {0.4, -0.7};
  Inputs in = sdpa::test::make_inputs(c, DType::float64, 51);
  const Result ref = run_variants(in, c.options, Impl::reference);
  const Result fast = run_variants(in, c.options, Impl::fast);
  const double h = 1e-5;
  auto check = [&](Array& x, const Array& grad_ref, const Array& grad_fast, const char* what) {
    for (std::int64_t i = 0; i < x.numel(); i += 3) {
      double* p = x.data_as<double>() + i;
      const double saved = *p;
      *p = saved + h;
      const double up = loss(in, c.options);
      *p = saved - h;
      const double down = loss(in, c.options);
      *p = saved;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grad_ref.data_as<double>()[i], fd, 1e-7) << what << " reference at " << i;
      EXPECT_NEAR(grad_fast.data_as<double>()[i], fd, 1e-7) << what << " fast at " << i;
    }
  };
  check(in.q, ref.dq, fast.dq, "dq");
  check(in.k, ref.dk, fast.dk, "dk");
  check(in.v, ref.dv, fast.dv, "dv");
  for (std::size_t s = 0; s < c.options.sinks.size(); ++s) {
    AttentionOptions o = c.options;
    o.sinks[s] += h;
    const double up = loss(in, o);
    o.sinks[s] -= 2 * h;
    const double down = loss(in, o);
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(ref.dsinks.data_as<double>()[s], fd, 1e-7) << "dsinks reference at " << s;
    EXPECT_NEAR(fast.dsinks.data_as<double>()[s], fd, 1e-7) << "dsinks fast at " << s;
    EXPECT_GT(std::fabs(fd), 1e-4) << "the sink should matter in this case";
  }
}

// ---- dropout -------------------------------------------------------------------------------

TEST(Variants, DropoutDrawsTheReferenceMask) {
  Case c = all_variants_case();
  c.options.dropout_p = 0.3;
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, 61);
  const Result fast = run_variants(in, c.options, Impl::fast);
  const Result ref = run_variants(as_float64(in), c.options, Impl::reference);
  const double eps = std::numeric_limits<float>::epsilon();
  expect_close("out", fast.out, ref.out, 2e-5, "dropout");
  expect_close("lse", fast.lse, ref.lse, 2e-5, "dropout");
  expect_close("dq", fast.dq, ref.dq, 2e-5 + 8 * eps, "dropout");
  expect_close("dk", fast.dk, ref.dk, 2e-5 + 8 * eps, "dropout");
  expect_close("dv", fast.dv, ref.dv, 2e-5 + 8 * eps, "dropout");
  expect_close("dsinks", fast.dsinks, ref.dsinks, 2e-5 + 1e-6 * double(c.L), "dropout");
  // Same seed: the same bits; another seed: another output.
  const Result again = run_variants(in, c.options, Impl::fast);
  EXPECT_TRUE(bit_identical(fast.out, again.out));
  EXPECT_TRUE(bit_identical(fast.dq, again.dq));
  AttentionOptions other = c.options;
  other.seed = 78;
  const Result changed = run_variants(in, other, Impl::fast, false);
  EXPECT_GT(max_abs_diff(fast.out, changed.out), 1e-3);
}

// p below 2^-17 rounds to a threshold of 0: nothing is dropped, so the call is plain attention,
// the naive baseline included, bit for bit.
TEST(Variants, DropoutThatRoundsToZeroIsNoDropout) {
  Case c = all_variants_case();
  c.options = AttentionOptions{};
  c.options.enable_gqa = true;
  c.options.causal = Causal::lower_right;
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, 62);
  for (Impl impl : {Impl::fast, Impl::reference, Impl::naive}) {
    AttentionOptions tiny = c.options;
    tiny.dropout_p = 1e-9;
    tiny.seed = 5;
    const Result plain = run_variants(in, c.options, impl);
    const Result rounded = run_variants(in, tiny, impl);
    EXPECT_TRUE(bit_identical(plain.out, rounded.out)) << sdpa::impl_name(impl);
    EXPECT_TRUE(bit_identical(plain.dq, rounded.dq)) << sdpa::impl_name(impl);
    EXPECT_TRUE(bit_identical(plain.dv, rounded.dv)) << sdpa::impl_name(impl);
  }
  // The smallest p that drops: 2^-17, a threshold of 1 (one draw in 65536).
  AttentionOptions least = c.options;
  least.dropout_p = std::ldexp(1.0, -17);
  EXPECT_THROW(run_variants(in, least, Impl::naive), sdpa::Error);
}

// The reference's mask, rebuilt here from Random123's philox4x32 by the documented layout:
// key j draws the 16-bit half (j mod 2, low first) of word (j mod 8) / 2 of the call with
// counter (j / 8, i, head, batch + offset) and key (seed low, seed high); kept iff the draw is
// >= round(p * 2^16) (at most 2^16 - 1), with the factor 2^16 / (2^16 - threshold).
TEST(Variants, DropoutRowIsTheDocumentedRandom123Draw) {
  // The rounding of p to a multiple of 2^-16: nearest, ties away from zero, capped below 1.
  EXPECT_EQ(sdpa::detail::dropout_threshold(0.1), 6554u);  // 6553.6
  EXPECT_EQ(sdpa::detail::dropout_threshold(0.25), 16384u);
  EXPECT_EQ(sdpa::detail::dropout_threshold(0.4 / 65536), 0u);
  EXPECT_EQ(sdpa::detail::dropout_threshold(0.5 / 65536), 1u);
  EXPECT_EQ(sdpa::detail::dropout_threshold(0.999999), 65535u);
  EXPECT_EQ(sdpa::detail::dropout_keep_factor(0.25), 1 / 0.75);
  EXPECT_EQ(sdpa::detail::dropout_keep_factor(0.1), 65536.0 / (65536 - 6554));
  EXPECT_EQ(sdpa::detail::dropout_keep_factor(1e-9), 1.0);
  std::mt19937_64 rng(97);
  const r123::Philox4x32 philox;
  for (int t = 0; t < 200; ++t) {
    sdpa::detail::Variants v;
    const double ps[] = {0.1, 0.5, 0.3, 0.999999, 1e-9};
    v.dropout_p = ps[t % 5];
    v.seed = rng();
    v.rng_batch_offset = std::int64_t(rng() % 5);
    const auto b = std::int64_t(rng() % 7), h = std::int64_t(rng() % 64);
    const auto i = std::int64_t(rng() % 100000);
    const auto j0 = std::int64_t(rng() % 5000);
    const std::int64_t n = 1 + std::int64_t(rng() % 40);
    std::vector<double> got(std::size_t(n) + 1, -1.0);
    sdpa::detail::dropout_row(v, b, h, i, j0, n, got.data());
    const double threshold = std::min(std::round(v.dropout_p * 65536), 65535.0);
    for (std::int64_t c = 0; c < n; ++c) {
      const std::int64_t j = j0 + c;
      const r123::Philox4x32::ctr_type ctr = {{std::uint32_t(j / 8), std::uint32_t(i),
                                               std::uint32_t(h),
                                               std::uint32_t(b + v.rng_batch_offset)}};
      const r123::Philox4x32::key_type key = {{std::uint32_t(v.seed), std::uint32_t(v.seed >> 32)}};
      const std::uint32_t word = philox(ctr, key).v[(j % 8) / 2];
      const std::uint32_t u = j % 2 == 0 ? word & 0xffffu : word >> 16;
      const double want = u >= threshold ? 65536 / (65536 - threshold) : 0.0;
      ASSERT_EQ(got[std::size_t(c)], want)
          << "seed " << v.seed << " j " << j << " p " << v.dropout_p;
    }
    ASSERT_EQ(got[std::size_t(n)], -1.0) << "wrote past n";
  }
}

// The kernel's vectorised Philox4x32-10 gives, on every compiled target, the very factors of the
// scalar Random123 generator (dropout_row): for seeds using both key words, rows, heads, batch
// offsets, starts that are not multiples of 8 (mid-counter), counters past 2^31, every length
// up to a tile and beyond, and probabilities near 0 and 1 (and ones that round).
TEST(Variants, VectorPhiloxIsRandom123OnEveryTarget) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  std::mt19937_64 rng(4321);
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    ASSERT_STREQ(sdpa::detail::fast_kernel_target(), hwy::TargetName(target));
    for (int t = 0; t < 300; ++t) {
      sdpa::detail::Variants v;
      const double ps[] = {0.1, 0.5, 1e-9, 0.999999, 0.3, 0.5 / 65536};
      v.dropout_p = ps[t % 6];
      v.seed = t < 5 ? std::uint64_t(t) : rng();
      v.rng_batch_offset = std::int64_t(rng() % 5);
      const auto b = std::int64_t(rng() % 7), h = std::int64_t(rng() % 64);
      const auto i = std::int64_t(t % 3 == 0 ? (1ll << 31) + std::int64_t(rng() % 1000)
                                             : std::int64_t(rng() % 100000));
      std::int64_t j0 = std::int64_t(rng() % 5000);
      if (t % 4 == 0) j0 = 8 * ((std::int64_t{1} << 31) + std::int64_t(rng() % 1000)) + t % 7;
      const std::int64_t n = t < 257 ? t : std::int64_t(rng() % 257);
      std::vector<float> want(std::size_t(n) + 1, -1.0f), got(std::size_t(n) + 1, -1.0f);
      sdpa::detail::dropout_row(v, b, h, i, j0, n, want.data());
      sdpa::detail::fast_dropout_factors_for_test(v, b, h, i, j0, n, got.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)))
          << hwy::TargetName(target) << " seed " << v.seed << " b " << b << " h " << h << " i " << i
          << " j0 " << j0 << " n " << n << " p " << v.dropout_p;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The kernel's float32 softcap (a rational tanh) against tanh in float64, on every compiled
// target, over a dense sweep of scaled scores from -20 to 20 (every float32 there rounds tanh
// to +-1 beyond 9.01), infinities and NaN: tanh within 6 float32 ulps of 1 (6 * 2^-24; measured
// 4.5 with FMA, 5.6 without), cap * tanh(x / cap) within 6.5 of the cap, NaN kept; exactly +-1
// (and the cap) where float32's tanh is, beyond 9.011.
TEST(Variants, SoftcapTanhAccuracyOnEveryTarget) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  const std::size_t n = 1 << 18;
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    for (const float cap : {1.0f, 30.0f}) {
      std::vector<float> x(n), t(n);
      for (std::size_t k = 0; k < n; ++k) x[k] = cap * (-20.0f + 40.0f * float(k) / float(n));
      x[0] = std::numeric_limits<float>::infinity();
      x[1] = -std::numeric_limits<float>::infinity();
      x[2] = std::numeric_limits<float>::quiet_NaN();
      x[3] = 0.0f;
      const std::vector<float> in = x;
      sdpa::detail::fast_softcap_for_test(x.data(), n, cap, t.data());
      double worst = 0.0, worst_capped = 0.0;
      for (std::size_t k = 3; k < n; ++k) {
        const double want = std::tanh(double(in[k] * (1.0f / cap)));
        worst = std::max(worst, std::abs(double(t[k]) - want));
        worst_capped = std::max(worst_capped, std::abs(double(x[k]) - double(cap) * want) / cap);
        if (std::abs(double(in[k]) / cap) > 9.0110) {
          ASSERT_EQ(t[k], std::copysign(1.0f, in[k])) << in[k] << " on " << hwy::TargetName(target);
          ASSERT_EQ(x[k], std::copysign(cap, in[k])) << in[k] << " on " << hwy::TargetName(target);
        }
      }
      std::printf("softcap tanh on %s, cap %g: max error %.2f ulps of 1 (capped %.2f)\n",
                  hwy::TargetName(target), double(cap), worst / 0x1p-24, worst_capped / 0x1p-24);
      EXPECT_LE(worst, 6.0 * 0x1p-24) << hwy::TargetName(target);
      EXPECT_LE(worst_capped, 6.5 * 0x1p-24) << hwy::TargetName(target);
      EXPECT_EQ(x[0], cap);
      EXPECT_EQ(x[1], -cap);
      EXPECT_TRUE(std::isnan(x[2]));
      EXPECT_EQ(x[3], 0.0f);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(Variants, DropoutFractionAndReferenceMatrices) {
  Case c;
  c.Hq = c.Hkv = 2;
  c.L = 64;
  c.S = 96;
  c.E = c.Ev = 4;
  c.options.dropout_p = 0.25;
  c.options.seed = 5;
  const Inputs in = sdpa::test::make_inputs(c, DType::float64, 71);
  sdpa::detail::Problem p = sdpa::detail::resolve_problem(in.q, in.k, in.v, nullptr, c.options);
  const std::size_t n = static_cast<std::size_t>(c.Hq * c.L * c.S);
  std::vector<double> probs(n), drop(n);
  std::vector<double> out(static_cast<std::size_t>(c.Hq * c.L * c.Ev));
  sdpa::detail::reference_forward(p, out.data(), nullptr,
                                  {.probs = probs.data(), .dropout = drop.data()});
  std::size_t dropped = 0;
  for (double z : drop) {
    ASSERT_TRUE(z == 0.0 || std::fabs(z - 1 / 0.75) < 1e-15) << z;
    dropped += z == 0.0;
  }
  // 12288 Bernoulli(0.25) draws: 3072 expected, standard deviation 48; 5 sigma.
  EXPECT_NEAR(static_cast<double>(dropped), 0.25 * double(n), 5 * 48.0);
  // out = (P z) V, from the matrices.
  const double* v = in.v.data_as<double>();
  for (std::int64_t row = 0; row < c.Hq * c.L; ++row) {
    const std::int64_t h = row / c.L;
    for (std::int64_t e = 0; e < c.Ev; ++e) {
      double want = 0;
      for (std::int64_t s = 0; s < c.S; ++s) {
        const std::size_t at = static_cast<std::size_t>(row * c.S + s);
        want += probs[at] * drop[at] * v[(h * c.S + s) * c.Ev + e];
      }
      ASSERT_NEAR(out[static_cast<std::size_t>(row * c.Ev + e)], want, 1e-12);
    }
  }
}

TEST(Variants, DropoutMeanOverSeedsConvergesToTheExpectation) {
  Case c;
  c.Hq = c.Hkv = 1;
  c.L = 16;
  c.S = 40;
  c.E = c.Ev = 8;
  c.options.window_left = 20;
  c.options.window_right = 5;
  c.options.dropout_p = 0.4;
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, 81);
  AttentionOptions plain = c.options;
  plain.dropout_p = 0.0;
  const Array want = run_variants(in, plain, Impl::fast, false).out.astype(DType::float64);
  Array mean(DType::float64, want.shape());
  std::memset(mean.data(), 0, mean.nbytes());
  double err_at_25 = 0;
  for (int n = 1; n <= 400; ++n) {
    AttentionOptions o = c.options;
    o.seed = static_cast<std::uint64_t>(n);
    const Array out = run_variants(in, o, Impl::fast, false).out.astype(DType::float64);
    for (std::int64_t i = 0; i < mean.numel(); ++i) {
      mean.data_as<double>()[i] += (out.data_as<double>()[i] - mean.data_as<double>()[i]) / n;
    }
    if (n == 25) err_at_25 = max_abs_diff(mean, want);
  }
  const double err = max_abs_diff(mean, want);
  // The error of a mean of n draws falls as 1/sqrt(n): 16 times the draws, a quarter of the
  // error (allowing a factor 2 for the maximum over elements). At 400 draws of p = 0.4 the
  // standard error of an element is about 0.013 here; 0.1 bounds the maximum over 128 of them.
  std::printf("dropout mean: max error %.4f at 25 seeds, %.4f at 400\n", err_at_25, err);
  EXPECT_LT(err, err_at_25 / 2) << "at 25 seeds " << err_at_25 << ", at 400 " << err;
  EXPECT_LT(err, 0.1);
}

// ---- bad options ---------------------------------------------------------------------------

TEST(Variants, BadOptionsNameTheArgument) {
  Case c;
  c.Hq = c.Hkv = 2;
  c.L = c.S = 4;
  c.E = c.Ev = 4;
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, 91);
  auto expect_error = [&](AttentionOptions o, const std::string& argument) {
    try {
      run_variants(in, o, Impl::fast, false);
      ADD_FAILURE() << argument << ": no error";
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  AttentionOptions o;
  o.window_left = -2;
  expect_error(o, "window_left");
  o = {};
  o.window_right = -5;
  expect_error(o, "window_right");
  o = {};
  o.softcap = -1.0;
  expect_error(o, "softcap");
  o.softcap = std::nan("");
  expect_error(o, "softcap");
  o = {};
  o.alibi_slopes = {1.0, 2.0, 3.0};
  expect_error(o, "alibi_slopes");
  o = {};
  o.sinks = {1.0};
  expect_error(o, "sinks");
  o.sinks = {1.0, INFINITY};
  expect_error(o, "sinks");
  o = {};
  o.dropout_p = 1.0;
  expect_error(o, "dropout_p");
  o.dropout_p = -0.1;
  expect_error(o, "dropout_p");
  o = {};
  o.softcap = 1.0;
  o.impl = Impl::naive;
  try {
    run_variants(in, o, Impl::naive, false);
    ADD_FAILURE() << "naive with a softcap: no error";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), "impl");
  }
}

// Variable-length batches of 16-bit inputs take attention_forward's and attention_backward's
// dtypes (lse float32 for a 16-bit query, dK and dV of the key's and value's dtype), and each
// sequence's results are those of the call on that sequence alone, bit for bit: an all-bfloat16
// batch and a float32 query over a bfloat16 key and value.
TEST(Varlen, HalfPrecisionTakesTheDtypesOfTheDenseCalls) {
  const std::vector<std::int64_t> cu_q{0, 5, 25}, cu_k{0, 9, 39};
  constexpr std::int64_t H = 2, E = 8;
  for (const DType qdt : {DType::bfloat16, DType::float32}) {
    const DType kdt = DType::bfloat16;
    const Array q = sdpa::test::random_array(qdt, {25, H, E}, 51);
    const Array k = sdpa::test::random_array(kdt, {39, H, E}, 52);
    const Array v = sdpa::test::random_array(kdt, {39, H, E}, 53);
    const Array g = sdpa::test::random_array(qdt, {25, H, E}, 54);
    const DType ldt = DType::float32;  // the query's for float32, float32 for bfloat16
    AttentionOptions o;
    o.causal = Causal::lower_right;
    Array out(qdt, {25, H, E}), lse(ldt, {H, 25});
    const MutableTensorRef lse_ref = lse.mut();
    sdpa::attention_varlen_forward(q, k, v, cu_q, cu_k, 20, 30, o, out.mut(), &lse_ref);
    Array dq(qdt, {25, H, E}), dk(kdt, {39, H, E}), dv(kdt, {39, H, E});
    sdpa::attention_varlen_backward(q, k, v, cu_q, cu_k, 20, 30, out, lse, g, o, dq.mut(), dk.mut(),
                                    dv.mut());
    // Sequence b alone: (H, n, E) views of its rows.
    const auto rows = [](const Array& a, std::int64_t r0, std::int64_t n) {
      const auto* base = static_cast<const char*>(a.data()) +
                         r0 * H * E * static_cast<std::int64_t>(sdpa::dtype_size(a.dtype()));
      return TensorRef{base, a.dtype(), {H, n, E}, {E, H * E, 1}};
    };
    const auto mrows = [](Array& a, std::int64_t r0, std::int64_t n) {
      auto* base = static_cast<char*>(a.data()) +
                   r0 * H * E * static_cast<std::int64_t>(sdpa::dtype_size(a.dtype()));
      return MutableTensorRef{base, a.dtype(), {H, n, E}, {E, H * E, 1}};
    };
    Array out1(qdt, {25, H, E}), lse1(ldt, {H, 25}), dq1(qdt, {25, H, E}), dk1(kdt, {39, H, E}),
        dv1(kdt, {39, H, E});
    for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
      const std::int64_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
      auto* lbase =
          static_cast<char*>(lse1.data()) + q0 * static_cast<std::int64_t>(sdpa::dtype_size(ldt));
      const MutableTensorRef l{lbase, ldt, {H, nq}, {25, 1}};
      sdpa::attention_forward(rows(q, q0, nq), rows(k, k0, nk), rows(v, k0, nk), nullptr, o,
                              mrows(out1, q0, nq), &l);
      const TensorRef lr{lbase, ldt, {H, nq}, {25, 1}};
      sdpa::attention_backward(rows(q, q0, nq), rows(k, k0, nk), rows(v, k0, nk), nullptr,
                               rows(out1, q0, nq), lr, rows(g, q0, nq), o, mrows(dq1, q0, nq),
                               mrows(dk1, k0, nk), mrows(dv1, k0, nk));
    }
    const std::string what = sdpa::dtype_name(qdt);
    EXPECT_TRUE(bit_identical(out, out1)) << what;
    EXPECT_TRUE(bit_identical(lse, lse1)) << what;
    EXPECT_TRUE(bit_identical(dq, dq1)) << what;
    EXPECT_TRUE(bit_identical(dk, dk1)) << what;
    EXPECT_TRUE(bit_identical(dv, dv1)) << what;
  }
}

// The sinks' gradient over float32 inputs with a float16 mask: the mask's exact float32 values,
// so every gradient equals the call with the mask widened first.
TEST(Variants, SinksGradientTakesA16BitMaskOverFloat32Inputs) {
  Case c;
  c.Hq = c.Hkv = 2;
  c.L = 20;
  c.S = 30;
  c.E = c.Ev = 8;
  c.mask_kind = 2;
  c.options.sinks = {0.5, -1.0};
  Inputs in = sdpa::test::make_inputs(c, DType::float32, 47);
  Inputs half = sdpa::test::make_inputs(c, DType::float32, 47);
  half.mask = in.mask.astype(DType::float16);
  in.mask = half.mask.astype(DType::float32);
  const Result a = run_variants(in, c.options, Impl::fast);
  const Result b = run_variants(half, c.options, Impl::fast);
  for (const auto& [x, y, what] :
       {std::tuple{&a.out, &b.out, "out"}, std::tuple{&a.dq, &b.dq, "dq"},
        std::tuple{&a.dk, &b.dk, "dk"}, std::tuple{&a.dv, &b.dv, "dv"},
        std::tuple{&a.dsinks, &b.dsinks, "dsinks"}}) {
    EXPECT_TRUE(bit_identical(*x, *y)) << what;
  }
}

}  // namespace
