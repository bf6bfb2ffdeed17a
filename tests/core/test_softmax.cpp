#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "sdpa/sdpa.h"

namespace {

template <class T>
std::vector<T> sm(std::vector<T> x, double scale = 1.0) {
  std::vector<T> p(x.size());
  sdpa::softmax<T>(x, p, scale);
  return p;
}

template <class T>
class SoftmaxTest : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SoftmaxTest, Types);

TYPED_TEST(SoftmaxTest, ArticleExampleIsExactlyOneHot) {
  const auto p = sm<TypeParam>({1000, 10, 5});
  EXPECT_EQ(p[0], TypeParam(1));
  EXPECT_EQ(p[1], TypeParam(0));
  EXPECT_EQ(p[2], TypeParam(0));
}

TYPED_TEST(SoftmaxTest, LogSoftmaxKeepsWhatSoftmaxUnderflows) {
  std::vector<TypeParam> x{1000, 10, 5}, lp(3);
  sdpa::log_softmax<TypeParam>(x, lp);
  EXPECT_EQ(lp[0], TypeParam(0));
  EXPECT_NEAR(double(lp[1]), -990.0, 1e-3);
  EXPECT_NEAR(double(lp[2]), -995.0, 1e-3);
}

TYPED_TEST(SoftmaxTest, HugeLogitsNeverOverflow) {
  for (double big : {1e10, 1e20, 1e30}) {
    const auto p = sm<TypeParam>({TypeParam(big), TypeParam(-big), TypeParam(big / 2)});
    EXPECT_EQ(p[0], TypeParam(1)) << big;
    EXPECT_EQ(p[1], TypeParam(0)) << big;
    EXPECT_EQ(p[2], TypeParam(0)) << big;
    const auto q = sm<TypeParam>({TypeParam(big), TypeParam(big)});
    EXPECT_EQ(q[0], TypeParam(0.5));
    EXPECT_EQ(q[1], TypeParam(0.5));
  }
}

TYPED_TEST(SoftmaxTest, NegativeInfinityEntriesGetZero) {
  const TypeParam inf = std::numeric_limits<TypeParam>::infinity();
  const auto p = sm<TypeParam>({-inf, 0, 0, -inf});
  EXPECT_EQ(p[0], TypeParam(0));
  EXPECT_EQ(p[1], TypeParam(0.5));
  EXPECT_EQ(p[2], TypeParam(0.5));
  EXPECT_EQ(p[3], TypeParam(0));
  const auto all = sm<TypeParam>({-inf, -inf});
  EXPECT_EQ(all[0], TypeParam(0));
  EXPECT_EQ(all[1], TypeParam(0));
  std::vector<TypeParam> x{-inf, -inf}, lp(2);
  sdpa::log_softmax<TypeParam>(x, lp);
  EXPECT_EQ(lp[0], -inf);
}

TYPED_TEST(SoftmaxTest, PositiveInfinitySharesEqually) {
  const TypeParam inf = std::numeric_limits<TypeParam>::infinity();
  const auto p = sm<TypeParam>({inf, 3, inf, -inf});
  EXPECT_EQ(p[0], TypeParam(0.5));
  EXPECT_EQ(p[1], TypeParam(0));
  EXPECT_EQ(p[2], TypeParam(0.5));
}

// scale * x overflowing float64 for finite x: the limit of softmax(c * x) as c grows puts all
// the mass on the largest x (the smallest for c < 0), never shares it among the overflowed ones.
TYPED_TEST(SoftmaxTest, OverflowingScaleGivesTheLimit) {
  const TypeParam inf = std::numeric_limits<TypeParam>::infinity();
  for (double scale : {1e308, 1e300, -1e308}) {
    const std::vector<TypeParam> x{1, 2, 3, scale > 0 ? -inf : inf};  // the last scores -inf
    const std::size_t top = scale > 0 ? 2 : 0;
    const auto p = sm<TypeParam>(x, scale);
    std::vector<TypeParam> lp(x.size());
    sdpa::log_softmax<TypeParam>(x, lp, scale);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(p[i], TypeParam(i == top ? 1 : 0)) << scale << " at " << i;
      if (i == top) {
        EXPECT_EQ(lp[i], TypeParam(0)) << scale;
      } else {
        EXPECT_LT(lp[i], TypeParam(-1e30)) << scale << " at " << i;
      }
    }
    EXPECT_EQ(p[3], TypeParam(0)) << scale;
    EXPECT_EQ(lp[3], -inf) << scale;
  }
  // Two largest logits tie: equal shares between them only.
  const auto tie = sm<TypeParam>({3, 1, 3}, 1e308);
  EXPECT_EQ(tie[0], TypeParam(0.5));
  EXPECT_EQ(tie[1], TypeParam(0));
  EXPECT_EQ(tie[2], TypeParam(0.5));
  // An infinite logit still takes the mass from overflowed finite ones.
  const auto p = sm<TypeParam>({3, inf, 2}, 1e308);
  EXPECT_EQ(p[0], TypeParam(0));
  EXPECT_EQ(p[1], TypeParam(1));
  EXPECT_EQ(p[2], TypeParam(0));
}

TYPED_TEST(SoftmaxTest, NanPropagates) {
  const auto p = sm<TypeParam>({1, std::numeric_limits<TypeParam>::quiet_NaN()});
  EXPECT_TRUE(std::isnan(p[0]));
}

TYPED_TEST(SoftmaxTest, MatchesDefinitionOnModerateLogits) {
  const std::vector<TypeParam> x{0.5, -1.25, 2.0, 0.0};
  const double scale = 0.7;
  const auto p = sm<TypeParam>(x, scale);
  double z = 0;
  for (auto v : x) z += std::exp(scale * v);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(double(p[i]), std::exp(scale * x[i]) / z, sizeof(TypeParam) == 4 ? 1e-7 : 1e-16);
  }
}

TEST(SoftmaxBackward, EqualsJacobianTransposeTimesGradient) {
  const std::vector<double> x{0.3, -2.0, 1.1, 0.0, 0.7};
  std::vector<double> p(x.size()), g{1.0, -0.5, 0.25, 2.0, -1.0}, dx(x.size());
  sdpa::softmax<double>(x, p);
  sdpa::softmax_backward<double>(p, g, dx);
  for (std::size_t i = 0; i < x.size(); ++i) {
    double expect = 0;  // (diag(p) - p p^T) g, row i
    for (std::size_t j = 0; j < x.size(); ++j) {
      expect += ((i == j ? p[i] : 0.0) - p[i] * p[j]) * g[j];
    }
    EXPECT_NEAR(dx[i], expect, 1e-15);
  }
}

TEST(SoftmaxBackward, MatchesFiniteDifferences) {
  const std::vector<double> x{0.3, -2.0, 1.1, 0.0};
  const std::vector<double> g{1.0, -0.5, 0.25, 2.0};
  const double scale = 1.7;
  std::vector<double> p(x.size()), dx(x.size());
  sdpa::softmax<double>(x, p, scale);
  sdpa::softmax_backward<double>(p, g, dx, scale);
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    std::vector<double> pp(x.size()), pm(x.size());
    sdpa::softmax<double>(xp, pp, scale);
    sdpa::softmax<double>(xm, pm, scale);
    double fd = 0;
    for (std::size_t j = 0; j < x.size(); ++j) fd += g[j] * (pp[j] - pm[j]) / (2 * h);
    EXPECT_NEAR(dx[i], fd, 1e-8);
  }
}

TEST(Softmax, SizeMismatchIsAnError) {
  std::vector<double> x{1, 2}, p(3);
  EXPECT_THROW(sdpa::softmax<double>(x, p), sdpa::Error);
}

}  // namespace
