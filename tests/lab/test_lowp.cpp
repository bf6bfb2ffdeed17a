// The emulated formats against the real ones: float16 (GCC's _Float16), bfloat16 (rounding the
// bits of a float), float32 (a cast).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "lab/lowp.h"
#include "lab/random.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

// Doubles spread over many binades of both signs, plus the edges of each format.
std::vector<double> probes() {
  std::vector<double> x = {0.0,      -0.0,     1.0,          65504.0,      65519.99,
                           65520.0,  -65520.0, 6.1e-5,       5.96e-8,      2.9e-8,
                           3.0e-8,   1e-10,    3.4e38,       3.4028235e38, 3.5e38,
                           1.17e-38, 1e-45,    1.0009765625, 1.00048828125};
  Stream s(1, 2);
  for (int i = 0; i < 200000; ++i) {
    const double m = 2 * s.uniform() - 1;
    const int e = static_cast<int>(s.below(300)) - 150;
    x.push_back(std::ldexp(m, e));
  }
  return x;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(LowPrecision, Float16MatchesTheCompilersFloat16) {
  for (double x : probes()) {
    const double want = static_cast<double>(static_cast<_Float16>(x));
    ASSERT_TRUE(same(round_to(x, kFloat16), want))
        << "x = " << x << ": got " << round_to(x, kFloat16) << ", _Float16 gives " << want;
  }
}

TEST(LowPrecision, BFloat16MatchesRoundingTheBitsOfAFloat) {
  for (double xd : probes()) {
    const float x = static_cast<float>(xd);  // bfloat16 from a float: exact input
    if (!std::isfinite(x)) continue;
    std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    u = (u + 0x7FFFU + ((u >> 16) & 1U)) & 0xFFFF0000U;  // round to nearest even on 16 bits
    const double want = std::bit_cast<float>(u);
    ASSERT_TRUE(same(round_to(x, kBFloat16), want))
        << "x = " << x << ": got " << round_to(x, kBFloat16) << ", bit rounding gives " << want;
  }
}

TEST(LowPrecision, Float32MatchesACast) {
  for (double x : probes()) {
    const double want = static_cast<float>(x);
    ASSERT_TRUE(same(round_to(x, kFloat32), want)) << "x = " << x;
  }
}

TEST(LowPrecision, MaxFiniteAndOverflowPoints) {
  EXPECT_EQ(max_finite(kFloat16), 65504.0);
  EXPECT_EQ(max_finite(kFloat32), static_cast<double>(std::numeric_limits<float>::max()));
  EXPECT_EQ(max_finite(kFloat64), std::numeric_limits<double>::max());
  // exp overflows past ln(max): 11.09, 88.72, 709.78. The point found is a value of the format
  // whose exp is inf, and the value just below it has a finite exp.
  for (const Format& f : {kFloat16, kBFloat16, kFloat32, kFloat64}) {
    const double x = exp_overflow_point(f);
    EXPECT_EQ(round_to(x, f), x) << f.name;
    EXPECT_TRUE(std::isinf(round_to(std::exp(x), f))) << f.name << " at " << x;
    const double below = f.precision >= 53 ? std::nextafter(x, 0.0) : x - ulp(x - ulp(x, f) / 2, f);
    EXPECT_TRUE(std::isfinite(round_to(std::exp(below), f))) << f.name << " below " << below;
    EXPECT_NEAR(x, std::log(max_finite(f)), 2 * ulp(x, f)) << f.name;
  }
}

TEST(LowPrecision, NaiveSoftmaxBreaksOnTheArticlesRowAndAgreesOnSmallLogits) {
  const std::vector<double> row = {1000.0, 10.0, 5.0};
  for (const Format& f : {kFloat16, kBFloat16, kFloat32, kFloat64}) {
    const auto p = naive_softmax(row, f);
    EXPECT_TRUE(std::isnan(p[0])) << f.name;
    EXPECT_EQ(p[1], 0.0) << f.name;
  }
  // Small logits: the naive result equals the library's stable one within a few roundings.
  const std::vector<double> x = {0.5, -1.0, 2.0, 0.0, 1.5};
  std::vector<double> ref(x.size());
  softmax<double>(x, ref);
  for (const Format& f : {kFloat16, kBFloat16, kFloat32}) {
    const auto p = naive_softmax(x, f);
    const double eps = std::ldexp(1.0, -f.precision);
    for (std::size_t i = 0; i < x.size(); ++i) {
      // exp, the sum of 5 terms and the quotient each round once, the input once.
      EXPECT_NEAR(p[i], ref[i], 10 * eps * (1 + std::fabs(x[i])) * ref[i] + 1e-300)
          << f.name << " i " << i;
    }
  }
}

}  // namespace
}  // namespace sdpa::lab
