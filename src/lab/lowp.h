// Emulated low-precision formats: rounding a double to float16, bfloat16 or float32, and the
// naive softmax exp(x) / sum(exp(x)) computed with every operation rounded to the format.
//
// Rounding a double once to a format of p significant bits reproduces the format's own
// +, *, /, exp of doubles that were exact in it (double has more than 2p + 2 bits), so the naive
// softmax below is the one a float16 / bfloat16 / float32 machine computes.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace sdpa::lab {

struct Format {
  const char* name;
  int precision;  ///< significant bits, the implicit one included (11, 8, 24, 53)
  int emin;       ///< exponent of the smallest normal number
  int emax;       ///< exponent of the largest finite number
};

inline constexpr Format kFloat16{"float16", 11, -14, 15};
inline constexpr Format kBFloat16{"bfloat16", 8, -126, 127};
inline constexpr Format kFloat32{"float32", 24, -126, 127};
inline constexpr Format kFloat64{"float64", 53, -1022, 1023};

/// The largest finite value, (2 - 2^(1-p)) 2^emax.
double max_finite(const Format& f);
/// x rounded to nearest, ties to even, with subnormals and overflow to +-inf. NaN stays NaN.
double round_to(double x, const Format& f);
/// The distance from x (a value of the format) to the next larger value of the format.
double ulp(double x, const Format& f);
/// The smallest x of the format whose exp, rounded to the format, is +inf.
double exp_overflow_point(const Format& f);

/// exp(x_i) / sum_j exp(x_j) with x, every exp, every partial sum and every quotient rounded
/// to the format: the article's formula, without the max subtraction. Returns NaN where it
/// breaks (inf / inf).
std::vector<double> naive_softmax(std::span<const double> x, const Format& f);

}  // namespace sdpa::lab
