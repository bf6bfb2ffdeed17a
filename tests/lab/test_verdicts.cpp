// Every verdict follows from its numbers: each one flips when its numbers cross its threshold.
#include <gtest/gtest.h>

#include "lab/verdicts.h"

namespace sdpa::lab {
namespace {

const Verdict kHolds = Verdict::holds();
const Verdict kFails = Verdict::fails();

TEST(Verdicts, Coverage) {
  const int bound = binomial_lower_bound(65, 0.95, 1e-3);
  EXPECT_EQ(verdict_coverage(65, 65), kHolds);
  EXPECT_EQ(verdict_coverage(bound, 65), kHolds);
  EXPECT_EQ(verdict_coverage(bound - 1, 65), kFails);
  EXPECT_EQ(verdict_coverage(0, 0), kFails);
}

TEST(Verdicts, Interval) {
  EXPECT_EQ(verdict_interval(512, 480, 540), kHolds);
  EXPECT_EQ(verdict_interval(512, 513, 540), kFails);
  EXPECT_EQ(verdict_interval(512, 480, 511), kFails);
}

TEST(Verdicts, Sensitivity) {
  EXPECT_EQ(verdict_sensitivity(0.999, 0.999), kHolds);
  EXPECT_EQ(verdict_sensitivity(0.98, 0.999), kFails);  // large scale not one-hot
  EXPECT_EQ(verdict_sensitivity(0.999, 0.95), kFails);  // small scale not uniform
}

TEST(Verdicts, ArticleRow) {
  EXPECT_EQ(verdict_article_row(true, 1.0, -429.8, false), kHolds);
  EXPECT_EQ(verdict_article_row(true, 1.0, -429.8, true).verdict, "holds-if");
  EXPECT_FALSE(verdict_article_row(true, 1.0, -429.8, true).condition.empty());
  EXPECT_EQ(verdict_article_row(false, 1.0, -429.8, true), kFails);  // stable one broke
  EXPECT_EQ(verdict_article_row(true, 0.9, -429.8, true), kFails);   // not one-hot
  EXPECT_EQ(verdict_article_row(true, 1.0, -50.0, true), kFails);    // gradient still flows
}

TEST(Verdicts, StableVsNaive) {
  EXPECT_EQ(verdict_stable_vs_naive(true, 0.0), kHolds);
  EXPECT_EQ(verdict_stable_vs_naive(true, 0.5).verdict, "holds-if");
  EXPECT_EQ(verdict_stable_vs_naive(false, 0.5), kFails);
}

TEST(Verdicts, Variance) {
  std::vector<Departure> none = {{"mean_k 2", 1.0, true}, {"corr_qk 0.5", 1.15, true}};
  EXPECT_EQ(verdict_variance(62, 65, none), kHolds);
  std::vector<Departure> some = none;
  some.push_back({"corr_dims 0.2", 0.15, true});
  const Verdict v = verdict_variance(62, 65, some);
  EXPECT_EQ(v.verdict, "holds-if");
  EXPECT_NE(v.condition.find("corr_dims 0.2"), std::string::npos) << v.condition;
  EXPECT_EQ(v.condition.find("corr_qk"), std::string::npos) << v.condition;
  // An unconfirmed departure (its closed form missed) does not count.
  some.back().confirmed = false;
  EXPECT_EQ(verdict_variance(62, 65, some), kHolds);
  // Just inside / outside the factor-sqrt(2) band.
  EXPECT_EQ(verdict_variance(62, 65, {{"x", 1.40, true}}), kHolds);
  EXPECT_EQ(verdict_variance(62, 65, {{"x", 1.42, true}}).verdict, "holds-if");
  EXPECT_EQ(verdict_variance(62, 65, {{"x", 0.71, true}}), kHolds);
  EXPECT_EQ(verdict_variance(62, 65, {{"x", 0.70, true}}).verdict, "holds-if");
  EXPECT_EQ(verdict_variance(40, 65, none), kFails);
}

TEST(Verdicts, C7Cell) {
  // A frozen cell: the typical unscaled row gets a tenth of the gradient, 40% of its rows die.
  const C7Cell frozen{.d = 1024,
                      .n = 128,
                      .median_ratio_low = 0.05,
                      .median_ratio_high = 0.2,
                      .unscaled_dead_low = 0.35,
                      .scaled_dead_low = 0.0,
                      .scaled_dead_high = 0.0,
                      .mean_ratio = 8.0};
  EXPECT_EQ(verdict_c7_cell(frozen), "holds");
  auto c = frozen;
  c.median_ratio_high = 1.01;  // the interval reaches 1: not shown smaller
  EXPECT_EQ(verdict_c7_cell(c), "undecided");
  c.median_ratio_low = 1.01;  // the typical unscaled row gets more gradient (d = 64)
  EXPECT_EQ(verdict_c7_cell(c), "fails");
  c = frozen;
  c.unscaled_dead_low = 0.0;  // no more dead rows than scaled
  EXPECT_EQ(verdict_c7_cell(c), "undecided");
  c = frozen;
  c.scaled_dead_high = 0.011;  // scaled not shown stable
  EXPECT_EQ(verdict_c7_cell(c), "undecided");
  c.scaled_dead_low = 0.011;  // scaled itself has dead rows
  EXPECT_EQ(verdict_c7_cell(c), "fails");
  c = frozen;
  c.d = 1;  // scale 1 is 1/sqrt(1)
  EXPECT_EQ(verdict_c7_cell(c), "equal");
}

TEST(Verdicts, SaturationRegion) {
  C7Cell h{.d = 256,
           .n = 16,
           .median_ratio_low = 0.1,
           .median_ratio_high = 0.5,
           .unscaled_dead_low = 0.2,
           .scaled_dead_low = 0,
           .scaled_dead_high = 0.005,
           .mean_ratio = 0.5};
  C7Cell f = h;
  f.median_ratio_low = 2;
  f.median_ratio_high = 4;
  auto at = [](C7Cell c, int d, int n) {
    c.d = d;
    c.n = n;
    return c;
  };
  // Every cell holds (the mean included): holds. d = 1 never counts.
  EXPECT_EQ(verdict_saturation_region({at(h, 1, 16), at(h, 64, 16), at(h, 256, 16)}), kHolds);
  // ... and with exploding means only per row.
  auto e = h;
  e.mean_ratio = 3;
  EXPECT_EQ(verdict_saturation_region({at(e, 64, 16), at(e, 256, 16)}).verdict, "holds-if");
  // None holds: fails.
  EXPECT_EQ(verdict_saturation_region({at(f, 64, 16), at(f, 256, 16)}), kFails);
  EXPECT_EQ(verdict_saturation_region({at(h, 1, 16)}), kFails);
  // A region: large d holds, small d fails, per N.
  const Verdict v = verdict_saturation_region(
      {at(f, 64, 16), at(h, 256, 16), at(h, 1024, 16), at(f, 256, 128), at(h, 1024, 128)});
  EXPECT_EQ(v.verdict, "holds-if");
  EXPECT_NE(v.condition.find("N = 16: d >= 256"), std::string::npos) << v.condition;
  EXPECT_NE(v.condition.find("N = 128: d >= 1024"), std::string::npos) << v.condition;
  EXPECT_NE(v.condition.find("fails"), std::string::npos) << v.condition;
}

TEST(Verdicts, Temperature) {
  EXPECT_EQ(verdict_temperature(0.0, 2.5, 0.03, 8.5), kHolds);
  EXPECT_EQ(verdict_temperature(0.0, 2.5, 0.0, 3.0), kFails);    // unscaled just as healthy
  EXPECT_EQ(verdict_temperature(0.0, 2.5, 0.0, 6.0), kHolds);    // unscaled tail too long
  EXPECT_EQ(verdict_temperature(0.02, 2.5, 0.03, 8.5), kFails);  // scaled has dead rows
  EXPECT_EQ(verdict_temperature(0.0, 5.5, 0.03, 8.5), kFails);   // scaled tail too long
}

TEST(Verdicts, Precision) {
  EXPECT_EQ(verdict_precision(6.1, 1.0, 0.0), kHolds);
  EXPECT_EQ(verdict_precision(0.5, 1.0, 0.0), kFails);  // scaling saves no bit
  EXPECT_EQ(verdict_precision(6.1, 0.0, 0.0), kFails);  // unscaled never breaks
  EXPECT_EQ(verdict_precision(6.1, 1.0, 0.1), kFails);  // scaled breaks too
}

}  // namespace
}  // namespace sdpa::lab
