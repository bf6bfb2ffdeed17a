// The reference attention: hand-computed cases, gradients against central finite differences,
// the properties its semantics imply, masking edge cases, its optional scores/P/dS matrices and
// argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "../common/test_util.h"
#include "core/problem.h"
#include "reference/reference.h"
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
using sdpa::test::max_abs_diff;
using sdpa::test::set;

using Result = sdpa::test::Outputs;  // out and lse
using Grads = sdpa::test::Outputs;   // dq, dk and dv too

Result forward(const Array& q, const Array& k, const Array& v, const sdpa::TensorRef* mask,
               const AttentionOptions& o) {
  return sdpa::test::run_forward(q, k, v, mask, o, Impl::reference);
}

Grads backward(const Inputs& in, const AttentionOptions& o) {
  return sdpa::test::run(in, o, Impl::reference);
}

Array make(DType dt, std::vector<std::int64_t> shape, std::vector<double> values) {
  Array a(dt, std::move(shape));
  for (std::size_t i = 0; i < values.size(); ++i) set(a, std::int64_t(i), values[i]);
  return a;
}

TEST(Reference, HandComputedTwoKeys) {
  // q = [1, 0], k = [[1, 0], [0, 1]], v = [[1, 2], [3, 4]], scale 1:
  // scores [1, 0], p = [e/(e+1), 1/(e+1)], out = p0*[1,2] + p1*[3,4], lse = log(e + 1).
  for (DType dt : {DType::float64, DType::float32}) {
    const Array q = make(dt, {1, 2}, {1, 0});
    const Array k = make(dt, {2, 2}, {1, 0, 0, 1});
    const Array v = make(dt, {2, 2}, {1, 2, 3, 4});
    AttentionOptions o;
    o.scale = 1.0;
    const Result r = forward(q, k, v, nullptr, o);
    const double e = std::exp(1.0), p0 = e / (e + 1), p1 = 1 / (e + 1);
    const double tol = dt == DType::float32 ? 1e-6 : 1e-15;
    EXPECT_NEAR(get(r.out, 0), p0 * 1 + p1 * 3, tol);
    EXPECT_NEAR(get(r.out, 1), p0 * 2 + p1 * 4, tol);
    EXPECT_NEAR(get(r.lse, 0), std::log(e + 1), tol);
  }
}

TEST(Reference, DefaultScaleIsOneOverSqrtE) {
  const Array q = make(DType::float64, {1, 4}, {1, 1, 1, 1});
  const Array k = make(DType::float64, {2, 4}, {1, 1, 1, 1, 0, 0, 0, 0});
  const Array v = make(DType::float64, {2, 1}, {1, 0});
  const Result r = forward(q, k, v, nullptr, {});
  // scores [4 / 2, 0] = [2, 0]
  EXPECT_NEAR(get(r.out, 0), std::exp(2.0) / (std::exp(2.0) + 1), 1e-15);
  EXPECT_NEAR(get(r.lse, 0), std::log(std::exp(2.0) + 1), 1e-15);
}

// ---- gradients against central finite differences ---------------------------------------

// sum(out * dout) as a function of the inputs, in float64.
double loss(const Inputs& in, const AttentionOptions& o) {
  const Result r = forward(in.q, in.k, in.v, in.mask_ref(), o);
  double s = 0;
  for (std::int64_t i = 0; i < r.out.numel(); ++i) s += get(r.out, i) * get(in.dout, i);
  return s;
}

void check_gradient_fd(const Case& c, std::uint64_t seed) {
  Inputs in = make_inputs(c, DType::float64, seed);
  const Grads g = backward(in, c.options);
  const double h = 1e-5;
  struct Target {
    Array* x;
    const Array* grad;
    const char* name;
  } targets[] = {{&in.q, &g.dq, "dq"}, {&in.k, &g.dk, "dk"}, {&in.v, &g.dv, "dv"}};
  for (auto& t : targets) {
    double worst = 0, scale = 1e-300;
    std::int64_t worst_i = -1;
    for (std::int64_t i = 0; i < t.x->numel(); ++i) {
      const double x0 = get(*t.x, i);
      set(*t.x, i, x0 + h);
      const double fp = loss(in, c.options);
      set(*t.x, i, x0 - h);
      const double fm = loss(in, c.options);
      set(*t.x, i, x0);
      const double fd = (fp - fm) / (2 * h);
      const double err = std::fabs(fd - get(*t.grad, i));
      scale = std::max(scale, std::fabs(fd));
      if (err > worst) {
        worst = err;
        worst_i = i;
      }
    }
    EXPECT_LT(worst / scale, 1e-6) << c.name() << " " << t.name << " worst element " << worst_i
                                   << " relative error " << worst / scale;
  }
}

TEST(ReferenceGradient, MatchesFiniteDifferencesOnOddShapes) {
  std::uint64_t seed = 1;
  for (std::int64_t E : {1, 3, 17}) {
    for (auto causal : {Causal::none, Causal::upper_left, Causal::lower_right}) {
      for (int mask_kind : {0, 1, 2}) {
        Case c;
        c.lead = {2};
        c.Hq = 2;
        c.Hkv = 1;
        c.L = 3;
        c.S = 5;
        c.E = E;
        c.Ev = 2;
        c.options.enable_gqa = true;
        c.options.causal = causal;
        c.options.scale = 0.8;
        c.mask_kind = mask_kind;
        check_gradient_fd(c, seed++);
      }
    }
  }
  Case wide;  // L > S, default scale, no batch dims
  wide.L = 6;
  wide.S = 2;
  wide.E = 3;
  wide.Ev = 4;
  check_gradient_fd(wide, 99);
}

// ---- properties ---------------------------------------------------------------------------

Case property_case(std::int64_t E) {
  Case c;
  c.lead = {2};
  c.Hq = 2;
  c.Hkv = 2;
  c.L = 7;
  c.S = 11;
  c.E = E;
  c.Ev = 5;
  return c;
}

TEST(ReferenceProperty, PermutingKeysAndValuesTogetherLeavesOutUnchanged) {
  for (std::int64_t E : {1, 3, 17}) {
    const Case c = property_case(E);
    const Inputs in = make_inputs(c, DType::float64, E);
    const Result r = forward(in.q, in.k, in.v, nullptr, c.options);
    Array k2(DType::float64, in.k.shape()), v2(DType::float64, in.v.shape());
    // reverse the key order within each (b, h)
    for (std::int64_t bh = 0; bh < 2 * c.Hkv; ++bh) {
      for (std::int64_t s = 0; s < c.S; ++s) {
        const std::int64_t t = c.S - 1 - s;
        for (std::int64_t e = 0; e < c.E; ++e) {
          set(k2, (bh * c.S + t) * c.E + e, get(in.k, (bh * c.S + s) * c.E + e));
        }
        for (std::int64_t e = 0; e < c.Ev; ++e) {
          set(v2, (bh * c.S + t) * c.Ev + e, get(in.v, (bh * c.S + s) * c.Ev + e));
        }
      }
    }
    const Result r2 = forward(in.q, k2, v2, nullptr, c.options);
    EXPECT_LT(max_abs_diff(r.out, r2.out), 1e-14);
    EXPECT_LT(max_abs_diff(r.lse, r2.lse), 1e-13);
  }
}

TEST(ReferenceProperty, AddingAConstantToAMaskRowLeavesOutUnchanged) {
  Case c = property_case(3);
  c.mask_kind = 2;
  const Inputs in = make_inputs(c, DType::float64, 5);
  const Result r = forward(in.q, in.k, in.v, in.mask_ref(), c.options);
  Array shifted = in.mask.astype(DType::float64);
  for (std::int64_t row = 0; row < shifted.numel() / c.S; ++row) {
    for (std::int64_t s = 0; s < c.S; ++s) {
      set(shifted, row * c.S + s, get(shifted, row * c.S + s) + 3.0 * double(row % 4) - 5.0);
    }
  }
  const sdpa::TensorRef sref = shifted.ref();
  const Result r2 = forward(in.q, in.k, in.v, &sref, c.options);
  EXPECT_LT(max_abs_diff(r.out, r2.out), 1e-13);
}

TEST(ReferenceProperty, BoolMaskEqualsAdditiveMinusInfinity) {
  Case c = property_case(17);
  c.mask_kind = 1;
  const Inputs in = make_inputs(c, DType::float64, 6);
  Array additive(DType::float64, in.mask.shape());
  for (std::int64_t i = 0; i < additive.numel(); ++i) {
    set(additive, i, get(in.mask, i) != 0 ? 0.0 : -INFINITY);
  }
  const sdpa::TensorRef aref = additive.ref();
  const Result r1 = forward(in.q, in.k, in.v, in.mask_ref(), c.options);
  const Result r2 = forward(in.q, in.k, in.v, &aref, c.options);
  EXPECT_EQ(max_abs_diff(r1.out, r2.out), 0.0);
  EXPECT_EQ(max_abs_diff(r1.lse, r2.lse), 0.0);
}

TEST(ReferenceProperty, CausalEqualsItsExplicitTrilMask) {
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {11, 7}, {5, 5}}) {
    for (auto causal : {Causal::upper_left, Causal::lower_right}) {
      Case c = property_case(3);
      c.L = L;
      c.S = S;
      const Inputs in = make_inputs(c, DType::float64, 7);
      Array tril(DType::boolean, {L, S});
      const std::int64_t offset = causal == Causal::upper_left ? 0 : S - L;
      for (std::int64_t l = 0; l < L; ++l) {
        for (std::int64_t s = 0; s < S; ++s) set(tril, l * S + s, s <= l + offset ? 1.0 : 0.0);
      }
      AttentionOptions oc = c.options;
      oc.causal = causal;
      const sdpa::TensorRef tref = tril.ref();
      const Result r1 = forward(in.q, in.k, in.v, nullptr, oc);
      const Result r2 = forward(in.q, in.k, in.v, &tref, c.options);
      EXPECT_EQ(max_abs_diff(r1.out, r2.out), 0.0) << sdpa::causal_name(causal) << L << "x" << S;
      EXPECT_EQ(max_abs_diff(r1.lse, r2.lse), 0.0);
    }
  }
}

TEST(ReferenceProperty, GqaEqualsExplicitlyRepeatedHeads) {
  Case c = property_case(3);
  c.Hq = 6;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  const Inputs in = make_inputs(c, DType::float64, 8);
  const Result r1 = forward(in.q, in.k, in.v, nullptr, c.options);
  // repeat_interleave along heads: head h of the repeated tensors is kv head h / 3
  Array k2(DType::float64, c.shape(6, c.S, c.E)), v2(DType::float64, c.shape(6, c.S, c.Ev));
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t h = 0; h < 6; ++h) {
      const std::int64_t src = b * 2 + h / 3, dst = b * 6 + h;
      for (std::int64_t i = 0; i < c.S * c.E; ++i)
        set(k2, dst * c.S * c.E + i, get(in.k, src * c.S * c.E + i));
      for (std::int64_t i = 0; i < c.S * c.Ev; ++i)
        set(v2, dst * c.S * c.Ev + i, get(in.v, src * c.S * c.Ev + i));
    }
  }
  AttentionOptions plain = c.options;
  plain.enable_gqa = false;
  const Result r2 = forward(in.q, k2, v2, nullptr, plain);
  EXPECT_EQ(max_abs_diff(r1.out, r2.out), 0.0);
}

// ---- masking edge cases -------------------------------------------------------------------

TEST(ReferenceMasking, FullyMaskedRowsGiveZerosMinusInfLseAndZeroGradients) {
  for (DType dt : {DType::float32, DType::float64}) {
    Case c = property_case(3);
    c.mask_kind = 1;
    Inputs in = make_inputs(c, dt, 9);
    // row l = 2 of every (b, h) sees nothing
    for (std::int64_t bh = 0; bh < 4; ++bh) {
      for (std::int64_t s = 0; s < c.S; ++s) set(in.mask, (bh * c.L + 2) * c.S + s, 0);
    }
    const Result r = forward(in.q, in.k, in.v, in.mask_ref(), c.options);
    const Grads g = backward(in, c.options);
    for (std::int64_t bh = 0; bh < 4; ++bh) {
      const std::int64_t row = bh * c.L + 2;
      EXPECT_EQ(get(r.lse, row), -INFINITY);
      for (std::int64_t e = 0; e < c.Ev; ++e) EXPECT_EQ(get(r.out, row * c.Ev + e), 0.0);
      for (std::int64_t e = 0; e < c.E; ++e) EXPECT_EQ(get(g.dq, row * c.E + e), 0.0);
    }
    EXPECT_TRUE(sdpa::test::all_finite(r.out));
    EXPECT_TRUE(sdpa::test::all_finite(g.dq));
    EXPECT_TRUE(sdpa::test::all_finite(g.dk));
    EXPECT_TRUE(sdpa::test::all_finite(g.dv));
  }
}

TEST(ReferenceMasking, CausalLowerRightWithMoreQueriesThanKeysMasksLeadingRows) {
  Case c = property_case(3);
  c.L = 6;
  c.S = 3;
  c.options.causal = Causal::lower_right;  // rows l < L - S see no key
  const Inputs in = make_inputs(c, DType::float64, 10);
  const Result r = forward(in.q, in.k, in.v, nullptr, c.options);
  for (std::int64_t l = 0; l < 3; ++l) EXPECT_EQ(get(r.lse, l), -INFINITY);
  EXPECT_TRUE(std::isfinite(get(r.lse, 3)));
  EXPECT_TRUE(sdpa::test::all_finite(r.out));
}

TEST(ReferenceMasking, NanAndInfAtMaskedPositionsDoNotLeak) {
  Case c = property_case(3);
  c.mask_kind = 1;
  Inputs in = make_inputs(c, DType::float64, 11);
  const Result clean = forward(in.q, in.k, in.v, in.mask_ref(), c.options);
  // Mask key 4 for every row; fully mask row 1; then poison them.
  for (std::int64_t row = 0; row < 4 * c.L; ++row) set(in.mask, row * c.S + 4, 0);
  for (std::int64_t bh = 0; bh < 4; ++bh) {
    for (std::int64_t s = 0; s < c.S; ++s) set(in.mask, (bh * c.L + 1) * c.S + s, 0);
  }
  const Result before = forward(in.q, in.k, in.v, in.mask_ref(), c.options);
  for (std::int64_t bh = 0; bh < 4; ++bh) {
    for (std::int64_t e = 0; e < c.E; ++e) {
      set(in.k, (bh * c.S + 4) * c.E + e, NAN);
      set(in.q, (bh * c.L + 1) * c.E + e, INFINITY);
    }
    for (std::int64_t e = 0; e < c.Ev; ++e) set(in.v, (bh * c.S + 4) * c.Ev + e, NAN);
  }
  const Result after = forward(in.q, in.k, in.v, in.mask_ref(), c.options);
  EXPECT_EQ(max_abs_diff(before.out, after.out), 0.0);
  EXPECT_TRUE(sdpa::test::all_finite(after.out));
  const Grads g = backward(in, c.options);
  // The gradient of a masked key is zero; nothing is NaN.
  EXPECT_TRUE(sdpa::test::all_finite(g.dq));
  EXPECT_TRUE(sdpa::test::all_finite(g.dv));
  (void)clean;
}

TEST(ReferenceMasking, BroadcastMaskShapes) {
  Case c = property_case(3);
  const Inputs in = make_inputs(c, DType::float64, 12);
  // A (L, S) mask broadcasts over batch and heads; compare with the same mask made full.
  Array small = sdpa::test::random_array(DType::boolean, {c.L, c.S}, 13);
  Array full(DType::boolean, c.shape(c.Hq, c.L, c.S));
  for (std::int64_t i = 0; i < full.numel(); ++i) set(full, i, get(small, i % (c.L * c.S)));
  const sdpa::TensorRef sref = small.ref(), fref = full.ref();
  const Result r1 = forward(in.q, in.k, in.v, &sref, c.options);
  const Result r2 = forward(in.q, in.k, in.v, &fref, c.options);
  EXPECT_EQ(max_abs_diff(r1.out, r2.out), 0.0);
  // (B, 1, 1, S): a key-padding mask
  Array pad = sdpa::test::random_array(DType::boolean, {2, 1, 1, c.S}, 14);
  for (std::int64_t i = 0; i < full.numel(); ++i) {
    const std::int64_t s = i % c.S, b = i / (c.Hq * c.L * c.S);
    set(full, i, get(pad, b * c.S + s));
  }
  const sdpa::TensorRef pref = pad.ref();
  const Result r3 = forward(in.q, in.k, in.v, &pref, c.options);
  const Result r4 = forward(in.q, in.k, in.v, &fref, c.options);
  EXPECT_EQ(max_abs_diff(r3.out, r4.out), 0.0);
}

TEST(Reference, ResultIsIdenticalForAnyThreadCount) {
  Case c = property_case(17);
  c.Hq = 4;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  c.mask_kind = 2;
  const Inputs in = make_inputs(c, DType::float32, 15);
  AttentionOptions one = c.options, three = c.options;
  one.threads = 1;
  three.threads = 3;
  const Result r1 = forward(in.q, in.k, in.v, in.mask_ref(), one);
  const Result r3 = forward(in.q, in.k, in.v, in.mask_ref(), three);
  EXPECT_EQ(std::memcmp(r1.out.data(), r3.out.data(), r1.out.nbytes()), 0);
  const Grads g1 = backward(in, one), g3 = backward(in, three);
  EXPECT_EQ(std::memcmp(g1.dk.data(), g3.dk.data(), g1.dk.nbytes()), 0);
  EXPECT_EQ(std::memcmp(g1.dq.data(), g3.dq.data(), g1.dq.nbytes()), 0);
}

// ---- the optional matrices: scores, P and dS ----------------------------------------------

// The scores, P and dS of one problem, from the reference's optional outputs.
struct Matrices {
  std::vector<double> scores, probs, dscores;
  Array out, lse, dq, dk, dv;  // the forward's, and the backward's when it ran in full
};

Matrices reference_matrices(const Inputs& in, const AttentionOptions& o, bool full) {
  const sdpa::detail::Problem p = sdpa::detail::resolve_problem(in.q, in.k, in.v, in.mask_ref(), o);
  const auto n = static_cast<std::size_t>(p.B * p.Hq * p.L * p.S);
  Matrices m;
  m.scores.assign(n, 1.0);  // not 0 or -inf: an element never written shows
  m.probs.assign(n, 7.0);
  m.dscores.assign(n, 7.0);
  std::vector<double> fwd_scores(n, 1.0), fwd_probs(n, 7.0);
  m.lse = Array(in.q.dtype(), sdpa::attention_lse_shape(in.q));
  if (full) m.out = Array(in.q.dtype(), sdpa::attention_output_shape(in.q, in.k, in.v, o));
  sdpa::detail::reference_forward(p, full ? m.out.data() : nullptr, m.lse.data(),
                                  {fwd_scores.data(), fwd_probs.data(), nullptr});
  sdpa::detail::ReferenceMatrices bwd{m.scores.data(), m.probs.data(), m.dscores.data()};
  if (full) {
    m.dq = Array(in.q.dtype(), in.q.shape());
    m.dk = Array(in.k.dtype(), in.k.shape());
    m.dv = Array(in.v.dtype(), in.v.shape());
    sdpa::detail::reference_backward(p, in.dout.data(), m.dq.data(), m.dk.data(), m.dv.data(), bwd);
  } else {
    sdpa::detail::reference_backward(p, in.dout.data(), nullptr, nullptr, nullptr, bwd);
  }
  // The forward and the backward share one row computation: the same matrices, bit for bit.
  EXPECT_EQ(fwd_scores, m.scores);
  EXPECT_EQ(0, std::memcmp(fwd_probs.data(), m.probs.data(), n * sizeof(double)));
  return m;
}

// Cases with masks (bool, additive with -inf), both causal alignments, GQA, odd sizes, and rows
// without any visible key (L > S with lower_right; a random mask may also empty a row).
std::vector<Case> matrix_cases() {
  std::vector<Case> cases;
  for (std::int64_t E : {1, 3, 17}) {
    for (auto causal : {Causal::none, Causal::upper_left, Causal::lower_right}) {
      for (int mask_kind : {0, 1, 2}) {
        Case c;
        c.lead = {2};
        c.Hq = 2;
        c.Hkv = 1;
        c.L = E == 3 ? 7 : 3;  // E = 3: more queries than keys
        c.S = 5;
        c.E = E;
        c.Ev = 2;
        c.options.enable_gqa = true;
        c.options.causal = causal;
        c.options.scale = 0.8;
        c.mask_kind = mask_kind;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// Element (row, s) of the mask's additive value for a full-shape mask, -inf for false.
double mask_value(const Inputs& in, std::int64_t i) {
  if (!in.has_mask) return 0.0;
  if (in.mask.dtype() == DType::boolean) {
    return in.mask.data_as<std::uint8_t>()[i] ? 0.0 : -std::numeric_limits<double>::infinity();
  }
  return get(in.mask, i);
}

TEST(ReferenceMatrices, ScoresAndProbabilitiesMatchAnIndependentComputation) {
  std::uint64_t seed = 40;
  int empty_rows = 0;
  for (const Case& c : matrix_cases()) {
    for (DType dt : {DType::float64, DType::float32}) {
      const Inputs in = make_inputs(c, dt, seed++);
      const Matrices m = reference_matrices(in, c.options, /*full=*/false);
      const std::int64_t B = 2, Hq = c.Hq, L = c.L, S = c.S, E = c.E, group = c.Hq / c.Hkv;
      for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t h = 0; h < Hq; ++h) {
          for (std::int64_t l = 0; l < L; ++l) {
            const std::int64_t row = (b * Hq + h) * L + l;
            const double lse = get(m.lse, row);
            double sum = 0;
            for (std::int64_t s = 0; s < S; ++s) {
              const std::int64_t i = row * S + s;
              std::int64_t last = S - 1;
              if (c.options.causal == Causal::upper_left) last = l;
              if (c.options.causal == Causal::lower_right) last = l + S - L;
              double score = -std::numeric_limits<double>::infinity();
              const double bias = mask_value(in, i);
              if (s <= last && bias != score) {
                double dot = 0;
                for (std::int64_t e = 0; e < E; ++e) {
                  dot +=
                      get(in.q, row * E + e) * get(in.k, ((b * c.Hkv + h / group) * S + s) * E + e);
                }
                score = *c.options.scale * dot + bias;
              }
              if (std::isinf(score)) {
                ASSERT_EQ(m.scores[i], score) << c.name();
              } else {
                ASSERT_NEAR(m.scores[i], score, 1e-13 * (1 + std::fabs(score))) << c.name();
              }
              // P = exp(score - lse), 0 where the key is invisible; lse is rounded to the dtype.
              const double expected = std::isinf(score) ? 0.0 : std::exp(m.scores[i] - lse);
              const double tol = dt == DType::float32 ? 1e-6 : 1e-13;
              ASSERT_NEAR(m.probs[i], expected, tol * expected + 1e-15) << c.name() << " " << i;
              sum += m.probs[i];
            }
            if (std::isinf(lse)) {  // a row without keys: P is all 0
              EXPECT_EQ(sum, 0.0) << c.name() << " row " << row;
              ++empty_rows;
            } else {
              EXPECT_NEAR(sum, 1.0, 1e-14) << c.name() << " row " << row;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(empty_rows, 0);  // the cases do exercise rows without keys
}

TEST(ReferenceMatrices, DScoresIsTheGradientOnTheMaskByFiniteDifferences) {
  // With an additive float64 mask, score = scale q.k + mask, so dS = d sum(out * dout) / d mask.
  std::uint64_t seed = 70;
  for (Case c : matrix_cases()) {
    if (c.mask_kind != 2) continue;
    Inputs in = make_inputs(c, DType::float64, seed++);
    const Matrices m = reference_matrices(in, c.options, /*full=*/false);
    const double h = 1e-5;
    double worst = 0, size = 1e-300;
    for (std::int64_t i = 0; i < in.mask.numel(); ++i) {
      const double x0 = get(in.mask, i);
      if (std::isinf(x0)) {
        EXPECT_EQ(m.dscores[i], 0.0);
        continue;
      }
      set(in.mask, i, x0 + h);
      const double fp = loss(in, c.options);
      set(in.mask, i, x0 - h);
      const double fm = loss(in, c.options);
      set(in.mask, i, x0);
      const double fd = (fp - fm) / (2 * h);
      worst = std::max(worst, std::fabs(fd - m.dscores[i]));
      size = std::max(size, std::fabs(fd));
    }
    EXPECT_LT(worst / size, 1e-7) << c.name();
  }
}

TEST(ReferenceMatrices, DScoresIsPTimesDPMinusD) {
  // dS = P (dP - D), dP = dout v^T, with D = sum_s P dP computed here (the reference uses
  // dout . out, equal in exact arithmetic); so every row of dS also sums to 0.
  std::uint64_t seed = 90;
  for (const Case& c : matrix_cases()) {
    const Inputs in = make_inputs(c, DType::float32, seed++);
    const Matrices fast = reference_matrices(in, c.options, /*full=*/false);
    const Matrices full = reference_matrices(in, c.options, /*full=*/true);
    // The dS-only backward and the full one: the same matrices; the full one the same
    // gradients as the public backward.
    EXPECT_EQ(fast.dscores, full.dscores) << c.name();
    const Grads g = backward(in, c.options);
    EXPECT_EQ(max_abs_diff(g.dq, full.dq), 0.0) << c.name();
    EXPECT_EQ(max_abs_diff(g.dk, full.dk), 0.0) << c.name();
    EXPECT_EQ(max_abs_diff(g.dv, full.dv), 0.0) << c.name();
    EXPECT_EQ(max_abs_diff(g.out, full.out), 0.0) << c.name();
    const std::int64_t rows = 2 * c.Hq * c.L, S = c.S, Ev = c.Ev, group = c.Hq / c.Hkv;
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t bh = row / c.L, kv = (bh / c.Hq) * c.Hkv + (bh % c.Hq) / group;
      std::vector<double> dp(S);
      double D = 0, sum = 0, size = 0;
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t e = 0; e < Ev; ++e) {
          dp[s] += get(in.dout, row * Ev + e) * get(in.v, (kv * S + s) * Ev + e);
        }
        D += fast.probs[row * S + s] * dp[s];
      }
      for (std::int64_t s = 0; s < S; ++s) {
        const double p = fast.probs[row * S + s], ds = fast.dscores[row * S + s];
        ASSERT_NEAR(ds, p * (dp[s] - D), 1e-12 * (1 + std::fabs(dp[s]))) << c.name();
        sum += ds;
        size += p * std::fabs(dp[s]);  // the sum cancels terms of this size
      }
      EXPECT_LE(std::fabs(sum), 1e-13 * (size + std::fabs(D))) << c.name() << " row " << row;
    }
  }
}

TEST(ReferenceMatrices, IdenticalForAnyThreadCount) {
  Case c = property_case(17);
  c.Hq = 4;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  c.options.causal = Causal::lower_right;
  c.mask_kind = 2;
  const Inputs in = make_inputs(c, DType::float32, 16);
  AttentionOptions one = c.options, three = c.options;
  one.threads = 1;
  three.threads = 3;
  const Matrices m1 = reference_matrices(in, one, false), m3 = reference_matrices(in, three, false);
  EXPECT_EQ(m1.scores, m3.scores);
  EXPECT_EQ(m1.probs, m3.probs);
  EXPECT_EQ(m1.dscores, m3.dscores);
}

// ---- argument errors ----------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const sdpa::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReferenceErrors, MessagesNameTheArgument) {
  const Array q = sdpa::test::random_array(DType::float32, {2, 4, 3}, 1);
  const Array k = sdpa::test::random_array(DType::float32, {3, 5, 3}, 2);
  const Array v = sdpa::test::random_array(DType::float32, {3, 5, 2}, 3);
  Array out(DType::float32, {2, 4, 2});
  AttentionOptions o;
  o.enable_gqa = true;
  EXPECT_NE(
      error_of([&] { sdpa::attention_forward(q, k, v, nullptr, o, out.mut()); }).find("enable_gqa"),
      std::string::npos);
  o.enable_gqa = false;
  EXPECT_NE(error_of([&] { sdpa::attention_forward(q, k, v, nullptr, o, out.mut()); }).find("key"),
            std::string::npos);
  const Array k2 = sdpa::test::random_array(DType::float32, {2, 5, 3}, 2);
  const Array v2 = sdpa::test::random_array(DType::float32, {2, 5, 2}, 3);
  o.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(
      error_of([&] { sdpa::attention_forward(q, k2, v2, nullptr, o, out.mut()); }).find("scale"),
      std::string::npos);
  o.scale = std::numeric_limits<double>::infinity();
  EXPECT_NE(
      error_of([&] { sdpa::attention_forward(q, k2, v2, nullptr, o, out.mut()); }).find("scale"),
      std::string::npos);
  o.scale.reset();
  const Array badmask = sdpa::test::random_array(DType::boolean, {3, 5}, 4);
  const sdpa::TensorRef mref = badmask.ref();
  EXPECT_NE(error_of([&] { sdpa::attention_forward(q, k2, v2, &mref, o, out.mut()); }).find("mask"),
            std::string::npos);
  o.threads = -1;
  EXPECT_NE(
      error_of([&] { sdpa::attention_forward(q, k2, v2, nullptr, o, out.mut()); }).find("threads"),
      std::string::npos);
  o.threads = 0;
  Array wrong_out(DType::float32, {2, 4, 3});
  EXPECT_NE(error_of([&] {
              sdpa::attention_forward(q, k2, v2, nullptr, o, wrong_out.mut());
            }).find("out"),
            std::string::npos);
  const Array q64 = sdpa::test::random_array(DType::float64, {2, 4, 3}, 1);
  EXPECT_NE(
      error_of([&] { sdpa::attention_forward(q64, k2, v2, nullptr, o, out.mut()); }).find("dtype"),
      std::string::npos);
  const Array rank1 = sdpa::test::random_array(DType::float32, {3}, 1);
  EXPECT_NE(error_of([&] {
              sdpa::attention_forward(rank1, k2, v2, nullptr, o, out.mut());
            }).find("query"),
            std::string::npos);
}

}  // namespace
