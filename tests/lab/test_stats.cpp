// The lab's estimators on distributions whose answers are known.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lab/common.h"
#include "lab/random.h"
#include "lab/sampling.h"
#include "lab/stats.h"
#include "lab/verdicts.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

// How many of `reps` intervals contain the truth, each from `n` draws of `draw`.
template <class Draw, class Ci>
int coverage(int reps, int n, double truth, Draw draw, Ci ci, std::uint64_t tag) {
  int covered = 0;
  std::vector<double> x(n);
  for (int r = 0; r < reps; ++r) {
    Stream s(12345, stream_id({tag, static_cast<std::uint64_t>(r)}));
    for (double& v : x) v = draw(s);
    covered += ci(x).contains(truth);
  }
  return covered;
}

// Two-sided acceptance for honest 95% intervals at level 1e-4 on each side: neither too many
// misses nor too few (an interval that is too wide is as wrong as one too narrow).
void expect_95(int covered, int reps, const char* what) {
  const int low = binomial_lower_bound(reps, 0.95, 1e-4);
  const int min_misses = binomial_lower_bound(reps, 0.05, 1e-4);
  EXPECT_GE(covered, low) << what << ": " << covered << " of " << reps << " intervals covered";
  EXPECT_LE(covered, reps - min_misses)
      << what << ": " << covered << " of " << reps << " covered: intervals too wide";
}

TEST(Binomial, LowerBoundIsTheAlphaQuantile) {
  for (int n : {5, 65, 1000}) {
    for (double alpha : {1e-3, 1e-4}) {
      const int k = binomial_lower_bound(n, 0.95, alpha);
      // P(X < k) <= alpha < P(X <= k), summed directly.
      double below = 0, at = 0;
      for (int j = 0; j <= k; ++j) {
        const double pj =
            std::exp(std::lgamma(n + 1.0) - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0) +
                     j * std::log(0.95) + (n - j) * std::log(0.05));
        if (j < k) below += pj;
        at += pj;
      }
      EXPECT_LE(below, alpha) << "n " << n << " k " << k;
      EXPECT_GT(at, alpha) << "n " << n << " k " << k;
    }
  }
  // 65 rows: the variance table. About 56 must be covered.
  EXPECT_GE(binomial_lower_bound(65, 0.95, 1e-3), 54);
  EXPECT_LE(binomial_lower_bound(65, 0.95, 1e-3), 58);
}

TEST(MeanCi, CoversTheMeanOfANormalAbout95Percent) {
  const int reps = 2000;
  const int c = coverage(
      reps, 200, 0.3, [](Stream& s) { return 0.3 + 2.0 * s.normal(); },
      [](const std::vector<double>& x) { return mean_ci(x); }, 1);
  expect_95(c, reps, "mean of N(0.3, 4), n = 200");
}

TEST(VarianceCi, CoversTheVarianceOfANormalAbout95Percent) {
  const int reps = 1000;
  const int c = coverage(
      reps, 2000, 4.0, [](Stream& s) { return 2.0 * s.normal(); },
      [](const std::vector<double>& x) { return variance_ci(x); }, 2);
  expect_95(c, reps, "variance of N(0, 4), n = 2000");
}

TEST(VarianceCi, CoversTheVarianceOfHeavyTailsWhereTheNormalFormulaFails) {
  // Laplace has kurtosis 6: Var(s^2) = 5 sigma^4 / n, not the 2 sigma^4 / (n - 1) of normal
  // data. The fourth-moment interval covers; the normal formula covers only ~78%.
  const int reps = 1000, n = 2000;
  auto draw = [](Stream& s) { return sample(s, Dist::laplace); };
  const int c = coverage(
      reps, n, 1.0, draw, [](const std::vector<double>& x) { return variance_ci(x); }, 3);
  expect_95(c, reps, "variance of Laplace, fourth-moment interval");
  const int naive = coverage(
      reps, n, 1.0, draw,
      [](const std::vector<double>& x) {
        const double v = sample_variance(x);
        const double se = v * std::sqrt(2.0 / (x.size() - 1));
        return Interval{v, v - kZ95 * se, v + kZ95 * se};
      },
      3);
  EXPECT_LT(naive, binomial_lower_bound(reps, 0.95, 1e-4))
      << "the normal-theory interval should undercover Laplace data; covered " << naive;
}

TEST(VarianceCi, CoversTheVarianceOfAProductOfNormals) {
  // q k with q, k independent N(0, 1): variance 1, kurtosis 9: the d = 1 row of the table.
  const int reps = 1000;
  const int c = coverage(
      reps, 2000, 1.0, [](Stream& s) { return s.normal() * s.normal(); },
      [](const std::vector<double>& x) { return variance_ci(x); }, 4);
  expect_95(c, reps, "variance of a product of normals");
}

TEST(Sampling, EveryDistributionHasMeanZeroAndVarianceOne) {
  const int n = 200000;
  for (Dist d : kAllDists) {
    Stream s(7, stream_id({99, static_cast<std::uint64_t>(d)}));
    std::vector<double> x(n), x2(n);
    for (int i = 0; i < n; ++i) {
      x[i] = sample(s, d);
      x2[i] = x[i] * x[i];
    }
    const Interval m = mean_ci(x), v = mean_ci(x2);  // E[x^2] = Var x when the mean is 0
    // 10 intervals at 95% in this test: widen to z = 4 (a miss at 6e-5 each) to keep it stable.
    const Interval m4 = mean_ci(x, 4.0), v4 = mean_ci(x2, 4.0);
    EXPECT_TRUE(m4.contains(0.0)) << dist_name(d) << " mean " << m.estimate;
    EXPECT_TRUE(v4.contains(1.0)) << dist_name(d) << " variance " << v.estimate;
  }
}

TEST(Sampling, KurtosisOfTheLightTailedDistributions) {
  // E[x^4] has a finite variance for these (not for student-t5, whose 8th moment is infinite).
  const int n = 200000;
  for (Dist d : {Dist::normal, Dist::uniform, Dist::rademacher, Dist::laplace}) {
    Stream s(8, stream_id({98, static_cast<std::uint64_t>(d)}));
    std::vector<double> x4(n);
    for (double& v : x4) v = std::pow(sample(s, d), 4);
    const Interval k = mean_ci(x4, 4.0);
    EXPECT_TRUE(k.contains(dist_kurtosis(d)))
        << dist_name(d) << " E[x^4] " << k.estimate << " expected " << dist_kurtosis(d);
  }
}

TEST(Quantile, InterpolatesLikeNumPy) {
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 1.0), 4.0);
  std::vector<double> x(101);
  for (int i = 0; i <= 100; ++i) x[i] = 100 - i;
  EXPECT_DOUBLE_EQ(quantile(x, 0.99), 99.0);
  EXPECT_DOUBLE_EQ(quantile({1, 2}, 0.25), 1.25);
}

TEST(NormStats, DeadFractionMedianMeanTail) {
  std::vector<double> norms = {0.0, 1e-6, 1.0, 2.0, 100.0};
  const NormStats s = norm_stats(norms, 1e-3);
  EXPECT_DOUBLE_EQ(s.median, 1.0);
  EXPECT_DOUBLE_EQ(s.dead, 0.4);
  EXPECT_NEAR(s.mean, 103.000001 / 5, 1e-12);
  EXPECT_NEAR(s.p99, 2.0 + 0.96 * 98.0, 1e-9);
}

TEST(SoftmaxSummaries, ClosedFormJacobianNormMatchesTheLibrarysVjp) {
  Stream s(3, 4);
  for (int n : {1, 2, 7, 64}) {
    std::vector<double> x(n), p(n), e(n), col(n);
    for (double& v : x) v = 3 * s.normal();
    softmax<double>(x, p);
    double f2 = 0;
    for (int j = 0; j < n; ++j) {
      std::fill(e.begin(), e.end(), 0.0);
      e[j] = 1;
      softmax_backward<double>(p, e, col);
      for (double v : col) f2 += v * v;
    }
    EXPECT_NEAR(jacobian_frobenius(p), std::sqrt(f2), 1e-14) << "n = " << n;
    double h = 0;
    for (double v : p) h -= v > 0 ? v * std::log(v) : 0;
    EXPECT_NEAR(entropy(p), h, 1e-14);
  }
  // Uniform over N: entropy ln N, ||J||_F^2 = (N - 1) / N^2.
  std::vector<double> u(16, 1.0 / 16);
  EXPECT_NEAR(entropy(u), std::log(16.0), 1e-14);
  EXPECT_NEAR(jacobian_frobenius(u), std::sqrt(15.0) / 16, 1e-15);
}

TEST(StreamIds, DistinctFieldsGiveDistinctStreams) {
  EXPECT_NE(stream_id({1, 2}), stream_id({2, 1}));
  EXPECT_NE(stream_id({1, 2}), stream_id({1, 2, 0}));
  EXPECT_EQ(stream_id({5, 6, 7}), stream_id({5, 6, 7}));
  Stream a(1, stream_id({1})), b(1, stream_id({2})), c(2, stream_id({1}));
  const double va = a.normal();
  EXPECT_NE(va, b.normal());
  EXPECT_NE(va, c.normal());
}

TEST(ParallelFor, EveryItemOnceAndErrorsPropagate) {
  for (int threads : {1, 2, 3}) {
    std::vector<int> hits(1000, 0);
    parallel_for(1000, threads, [&](std::int64_t i) { hits[i] += 1; });
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i], 1) << "item " << i << " threads " << threads;
  }
  EXPECT_THROW(parallel_for(10, 2,
                            [](std::int64_t i) {
                              if (i == 7) throw Error("item 7");
                            }),
               Error);
}

// The slope's interval is b ± t·se with Student's t quantile at n − 2 degrees of freedom, on
// both sides of the table's end at 30: t(0.975) = 2.0423 at 30, 2.0395 at 31, 1.9983 at 63.
TEST(SlopeCi, UsesStudentsTAtEveryDegreeOfFreedom) {
  for (const auto& [n, t] : std::vector<std::pair<int, double>>{
           {32, 2.0423}, {33, 2.0395}, {65, 1.9983}, {102, 1.9840}}) {
    std::vector<double> x(static_cast<std::size_t>(n)), y(x.size());
    double sxx = 0, mx = (n - 1) / 2.0;
    for (int i = 0; i < n; ++i) {
      x[i] = i;
      y[i] = 2.0 * i + ((i % 3) - 1) * 0.5;  // a line with a small, known scatter
      sxx += (i - mx) * (i - mx);
    }
    const Interval ci = slope_ci(x, y);
    double sse = 0;
    const double b = ci.estimate;
    double my = 0;
    for (int i = 0; i < n; ++i) my += y[i] / n;
    for (int i = 0; i < n; ++i) {
      const double r = y[i] - (my + b * (i - mx));
      sse += r * r;
    }
    const double se = std::sqrt(sse / (n - 2) / sxx);
    EXPECT_NEAR((ci.high - ci.low) / (2 * se), t, 5e-4) << "n " << n;  // the table: 3 decimals
  }
}

}  // namespace
}  // namespace sdpa::lab
