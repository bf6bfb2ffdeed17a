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

TEST(Verdicts, Saturation) {
  SaturationSummary s{.unscaled_max_prob = 0.95,
                      .unscaled_dead = 0.4,
                      .unscaled_mean_ratio = 0.5,
                      .scaled_dead = 0.0,
                      .scaled_max_prob = 0.07};
  EXPECT_EQ(verdict_saturation(s), kHolds);
  s.unscaled_mean_ratio = 11.5;  // the mean grows: holds only per row
  EXPECT_EQ(verdict_saturation(s).verdict, "holds-if");
  auto flip = s;
  flip.unscaled_max_prob = 0.85;
  EXPECT_EQ(verdict_saturation(flip), kFails);
  flip = s;
  flip.unscaled_dead = 0.1;
  EXPECT_EQ(verdict_saturation(flip), kFails);
  flip = s;
  flip.scaled_dead = 0.05;
  EXPECT_EQ(verdict_saturation(flip), kFails);
  flip = s;
  flip.scaled_max_prob = 0.6;
  EXPECT_EQ(verdict_saturation(flip), kFails);
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
