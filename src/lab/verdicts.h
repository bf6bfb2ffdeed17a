// Verdicts: small pure functions from measured numbers to "holds" / "fails" / "holds-if".
//
// Each experiment reduces its tables to the few numbers below and asks these functions; the
// tests (tests/lab/test_verdicts.cpp) show every verdict flips when its numbers do. The
// thresholds are written next to each function with the reason for them. A condition is written
// in the `lang` given (English by default).
#pragma once

#include <string>
#include <vector>

#include "lab/words.h"

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
                            bool naive_nan, Lang lang = Lang::en);

/// C2 beyond the article's row: the stable (library) softmax never gives NaN; the naive one
/// does on `naive_nan_fraction` of the rows. Holds-if "computed stably" when the naive one
/// breaks, holds when neither does, fails when the stable one is not finite.
Verdict verdict_stable_vs_naive(bool stable_all_finite, double naive_nan_fraction,
                                Lang lang = Lang::en);

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

/// C4: Var(q.k) = d. Fails when the iid rows' coverage is not consistent or when the pooled
/// log-log slope of Var against d has an interval that excludes 1; holds-if (the assumptions,
/// naming each confirmed departure) when some confirmed departure needs another normaliser;
/// holds otherwise. The departures are those the lab chose to try: the condition lists what was
/// measured, not every way the assumptions can fail.
Verdict verdict_variance(int covered, int total, const std::vector<Departure>& departures,
                         bool slope_covers_one = true, Lang lang = Lang::en);

/// A claim that follows from another by an identity (C6 from C4: Var(q.k/sqrt(d)) = Var(q.k)/d):
/// not a second vote. It takes the premise's verdict when the identity holds in the samples
/// (`identity_exact`), and fails otherwise.
Verdict verdict_consequence(const Verdict& premise, bool identity_exact);

/// The two-sided normal quantile of level 1 - 1e-3: single intervals that decide a verdict
/// (C5) use it, the same alpha as the coverage counts.
inline constexpr double kZ999 = 3.2905267314919255;

/// One (d, N) cell of the saturation grid: unscaled against 1/sqrt(d) on the same query rows,
/// each number a bound of a 95% bootstrap interval over rows.
struct C7Cell {
  int d = 0, n = 0;
  double median_ratio_low = 1, median_ratio_high = 1;  // median |dQ| unscaled / scaled
  double unscaled_dead_low = 0;                        // dead fraction of dQ rows, scale 1
  double scaled_dead_low = 0, scaled_dead_high = 0;    // the same, 1/sqrt(d)
  double mean_ratio = 1;                               // mean |dQ| unscaled / scaled
};

/// C7 at one cell: "holds" when the typical unscaled row gets less gradient (the median ratio's
/// interval lies below 1), significantly more unscaled rows are dead (their dead fraction's low
/// end exceeds the scaled one's high end) and the scaled rows are stable (at most 1% dead, upper
/// bound); "fails" when the typical unscaled row gets more gradient (ratio interval above 1) or
/// more than 1% of scaled rows are dead (low end); "undecided" otherwise; "equal" at d = 1, where
/// scale 1 is 1/sqrt(d).
std::string verdict_c7_cell(const C7Cell& cell);

/// C7 over the (d, N) grid: holds when every cell (d > 1) holds, fails when none does, holds-if
/// otherwise, the condition naming the region per N (for example "N = 128: d >= 256") and the
/// cells that fail; "per row, not on average" is added when a holding cell's mean ratio exceeds
/// 1 (a few near-tied rows explode).
Verdict verdict_saturation_region(const std::vector<C7Cell>& cells, Lang lang = Lang::en);

/// C7 in the temperature sweep: "the gradient stays stable" read as a healthy distribution of
/// per-row |dQ|: at c = 1 (the 1/sqrt(d) scale) at most 1% of rows dead (below 1e-3 of the
/// uniform-attention norm, a closed form: not relative to the c = 1 rows themselves) and a 99th
/// percentile at most 5 times the median (a normal-like spread gives about 2.5), while at c =
/// sqrt(d) (the unscaled logits) one of the two is violated, so that the stability is owed to the
/// scale. Fails otherwise.
Verdict verdict_temperature(double dead_at_c1, double tail_ratio_at_c1, double dead_unscaled,
                            double tail_ratio_unscaled);

/// C7 in low precision: holds when scaling saves at least one bit of the probabilities
/// (bits_lost >= 1) and the naive softmax of scaled logits never breaks while that of unscaled
/// ones does; fails otherwise.
Verdict verdict_precision(double bits_lost, double naive_nan_unscaled, double naive_nan_scaled);

}  // namespace sdpa::lab
