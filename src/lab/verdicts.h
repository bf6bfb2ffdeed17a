// Verdicts: small pure functions from measured numbers to "holds" / "fails" / "holds-if".
//
// Each experiment reduces its tables to the few numbers below and asks these functions; the
// tests (tests/lab/test_verdicts.cpp) show every verdict flips when its numbers do. The
// thresholds are written next to each function with the reason for them.
#pragma once

#include <string>
#include <vector>

namespace sdpa::lab {

struct Verdict {
  std::string verdict;    // "holds", "fails" or "holds-if"
  std::string condition;  // for "holds-if": when it holds; else ""

  static Verdict holds() { return {"holds", ""}; }
  static Verdict fails() { return {"fails", ""}; }
  static Verdict holds_if(std::string condition) { return {"holds-if", std::move(condition)}; }
  bool operator==(const Verdict&) const = default;
};

/// Whether `covered` of `total` 95% intervals containing the truth is consistent with honest
/// intervals: covered >= the alpha-quantile of Binomial(total, p). alpha = 1e-3 keeps a false
/// "fails" to one run in a thousand while 10 misses out of 65 (85%) already fail.
bool coverage_consistent(int covered, int total, double p = 0.95, double alpha = 1e-3);

/// The largest k with P(Binomial(n, p) < k) <= alpha: fewer than k successes is a surprise at
/// level alpha.
int binomial_lower_bound(int n, double p, double alpha);

/// C1: softmax is sensitive to its input's size. Holds when the largest scale gives a near
/// one-hot row (max probability >= 0.99) and the smallest a near-uniform one (entropy >= 0.99
/// of ln N); fails otherwise.
Verdict verdict_sensitivity(double max_prob_at_large_scale, double normalized_entropy_at_small);

/// C2: softmax([1000, 10, 5]) ~ [1, 0, 0] and almost no gradient reaches the other positions.
/// Holds when the stable softmax is finite with p0 within 1e-12 of 1 and the largest Jacobian
/// row norm of a non-maximal position is below 1e-100 (log10 < -100); "holds-if computed
/// stably" when, on top of that, the naive formula gives NaN; fails otherwise.
Verdict verdict_article_row(bool stable_finite, double p0, double log10_nonmax_gradient,
                            bool naive_nan);

/// C2 beyond the article's row: the stable (library) softmax never gives NaN; the naive one
/// does on `naive_nan_fraction` of the rows. Holds-if "computed stably" when the naive one
/// breaks, holds when neither does, fails when the stable one is not finite.
Verdict verdict_stable_vs_naive(bool stable_all_finite, double naive_nan_fraction);

/// C3 / C6: every estimate against its theory: holds when the coverage is consistent
/// (coverage_consistent), fails otherwise.
Verdict verdict_coverage(int covered, int total);

/// A single interval: holds when theory lies in [low, high].
Verdict verdict_interval(double theory, double low, double high);

/// A departure from the article's assumptions, measured: `case_name` needs a normaliser other
/// than 1/sqrt(d) (its right_scale_ratio is outside [1/sqrt(2), sqrt(2)], that is the variance
/// softmax sees is off by more than a factor 2) and the measurement agrees with its own closed
/// form (`confirmed`).
struct Departure {
  std::string case_name;
  double right_scale_ratio = 1.0;
  bool confirmed = false;
};

/// C4: Var(q.k) = d. Fails when the iid rows' coverage is not consistent; holds-if (the
/// assumptions, naming each confirmed departure) when some confirmed departure needs another
/// normaliser; holds otherwise.
Verdict verdict_variance(int covered, int total, const std::vector<Departure>& departures);

/// What the saturation grid says about unscaled vs scaled attention at the largest d.
struct SaturationSummary {
  double unscaled_max_prob = 0;    // mean max probability, scale 1
  double unscaled_dead = 0;        // dead fraction of dQ rows, scale 1
  double unscaled_mean_ratio = 0;  // mean |dQ| unscaled / mean |dQ| scaled
  double scaled_dead = 0;          // dead fraction of dQ rows, scale 1/sqrt(d)
  double scaled_max_prob = 0;      // mean max probability, scale 1/sqrt(d)
};

/// C7: unscaled attention saturates and its gradient vanishes; scaled stays stable. Needs
/// unscaled max_prob >= 0.9 (saturated), unscaled dead fraction >= 0.2 (a fifth of rows carry
/// no gradient: "vanishes" is visible), scaled dead fraction <= 0.01 and scaled max_prob < 0.5
/// (not saturated). Then: holds-if "for most rows, not on average" when the unscaled mean
/// gradient is still larger than the scaled one (a few exploding rows), else holds. Otherwise
/// fails.
Verdict verdict_saturation(const SaturationSummary& s);

/// C7 in the temperature sweep: "the gradient stays stable" read as a healthy distribution of
/// per-row |dQ|: at c = 1 (the 1/sqrt(d) scale) at most 1% of rows dead and a 99th percentile
/// at most 5 times the median (a normal-like spread gives about 2.5), while at c = sqrt(d) (the
/// unscaled logits) one of the two is violated, so that the stability is owed to the scale.
/// Fails otherwise.
Verdict verdict_temperature(double dead_at_c1, double tail_ratio_at_c1, double dead_unscaled,
                            double tail_ratio_unscaled);

/// C7 in low precision: holds when scaling saves at least one bit of the probabilities
/// (bits_lost >= 1) and the naive softmax of scaled logits never breaks while that of unscaled
/// ones does; fails otherwise.
Verdict verdict_precision(double bits_lost, double naive_nan_unscaled, double naive_nan_scaled);

}  // namespace sdpa::lab
