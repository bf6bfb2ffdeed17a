// Estimators of the lab, each with its 95% confidence interval.
//
// Means use the central limit theorem (the lab never estimates a mean from fewer than a
// thousand samples). The variance's interval uses the sample's own fourth central moment
// instead of assuming normal data: for a sample of size n with variance s^2 and fourth central
// moment m4,
//   Var(s^2) ~ (m4 - (n - 3)/(n - 1) s^4) / n,
// and the interval is built on the log scale, s^2 * exp(+-z se / s^2), which stays positive and
// follows the right skew of s^2's sampling distribution (a product of two normals has kurtosis
// 9, so the symmetric interval undercovers at small d).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace sdpa::lab {

/// The 97.5% quantile of the standard normal.
inline constexpr double kZ95 = 1.959963984540054;

struct Interval {
  double estimate = 0, low = 0, high = 0;
  bool contains(double v) const { return v >= low && v <= high; }
};

double mean(std::span<const double> x);
/// Unbiased sample variance (n - 1 in the denominator).
double sample_variance(std::span<const double> x);
/// Sample kurtosis m4 / m2^2 (3 for a normal).
double kurtosis(std::span<const double> x);

/// mean +- z sd / sqrt(n).
Interval mean_ci(std::span<const double> x, double z = kZ95);
/// The variance and its fourth-moment interval (see the header comment).
Interval variance_ci(std::span<const double> x, double z = kZ95);

/// The q-quantile (0 <= q <= 1) with linear interpolation between order statistics (NumPy's
/// default, "type 7"). x need not be sorted.
double quantile(std::vector<double> x, double q);

/// Statistics of a set of per-row gradient norms.
struct NormStats {
  double median = 0, mean = 0, p99 = 0;
  double dead = 0;  ///< fraction of rows with norm < dead_threshold
};
NormStats norm_stats(std::span<const double> norms, double dead_threshold);

/// A percentile bootstrap over rows, stratified: the n rows form `strata` consecutive blocks of
/// equal size (for example one block per K/V draw) and each replicate resamples rows with
/// replacement within every block. `stat` maps a set of row indices to k numbers; the result
/// holds k intervals: estimate = stat(all rows), low/high = the (1 - level)/2 and (1 + level)/2
/// quantiles over `replicates` resamples. The resamples come from Philox stream (seed, stream):
/// the same for any thread count.
std::vector<Interval> bootstrap(
    int n, int strata, int replicates, std::uint64_t seed, std::uint64_t stream, double level,
    const std::function<std::vector<double>(const std::vector<int>&)>& stat);

/// The same over independent units (seeds): a plain (one-stratum) bootstrap of the mean of x.
Interval bootstrap_mean(std::span<const double> x, int replicates, std::uint64_t seed,
                        std::uint64_t stream, double level = 0.95);

/// Least-squares slope of y on x with its 95% interval (t quantile for n - 2 degrees of freedom
/// replaced by the normal one when n > 30; the t table below covers 1..30).
Interval slope_ci(std::span<const double> x, std::span<const double> y);

/// Softmax summaries of one probability row: entropy (nats), max probability, and the
/// Frobenius norm of the Jacobian diag(p) - p p^T, in closed form:
/// ||J||_F^2 = sum p^2 - 2 sum p^3 + (sum p^2)^2.
double entropy(std::span<const double> p);
double entropy(std::span<const float> p);  // the same sum, each p_i widened to double
double jacobian_frobenius(std::span<const double> p);

}  // namespace sdpa::lab
