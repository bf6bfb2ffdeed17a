#include "lab/verdicts.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace sdpa::lab {

int binomial_lower_bound(int n, double p, double alpha) {
  // P(X = k) built up in log space: n is at most a few thousand here, so the direct sum is exact
  // enough (terms below 1e-300 do not matter against alpha >= 1e-6).
  double cdf = 0.0;
  for (int k = 0; k <= n; ++k) {
    const double log_pk = std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) +
                          k * std::log(p) + (n - k) * std::log1p(-p);
    const double next = cdf + std::exp(log_pk);  // P(X <= k)
    if (next > alpha) return k;                  // P(X < k) = cdf <= alpha
    cdf = next;
  }
  return n;
}

bool coverage_consistent(int covered, int total, double p, double alpha) {
  if (total <= 0) return false;
  return covered >= binomial_lower_bound(total, p, alpha);
}

Verdict verdict_sensitivity(double max_prob_at_large_scale, double normalized_entropy_at_small) {
  if (max_prob_at_large_scale >= 0.99 && normalized_entropy_at_small >= 0.99) {
    return Verdict::holds();
  }
  return Verdict::fails();
}

Verdict verdict_article_row(bool stable_finite, double p0, double log10_nonmax_gradient,
                            bool naive_nan, Lang lang) {
  const bool near_one_hot = stable_finite && std::fabs(p0 - 1.0) <= 1e-12;
  const bool no_gradient = log10_nonmax_gradient < -100.0;
  if (!near_one_hot || !no_gradient) return Verdict::fails();
  if (naive_nan) {
    return Verdict::holds_if(pick(
        lang,
        "softmax is computed stably (row max subtracted before exp); the naive exp(x)/sum(exp(x)) "
        "overflows to NaN instead of [1, 0, 0]",
        "softmax 以稳定的方式计算（exp 之前先减去行最大值）；朴素的 exp(x)/sum(exp(x)) "
        "会溢出成 NaN，而不是 [1, 0, 0]"));
  }
  return Verdict::holds();
}

Verdict verdict_stable_vs_naive(bool stable_all_finite, double naive_nan_fraction, Lang lang) {
  if (!stable_all_finite) return Verdict::fails();
  if (naive_nan_fraction > 0.0) {
    return Verdict::holds_if(
        pick(lang,
             "softmax subtracts the row max before exp (as the library does); the naive formula "
             "turns to NaN once a logit passes ln(max float)",
             "softmax 在 exp 之前先减去行最大值（本库就是这样做的）；logit 一旦超过 ln(max float)，"
             "朴素公式就变成 NaN"));
  }
  return Verdict::holds();
}

Verdict verdict_coverage(int covered, int total) {
  return coverage_consistent(covered, total) ? Verdict::holds() : Verdict::fails();
}

Verdict verdict_interval(double theory, double low, double high) {
  return (theory >= low && theory <= high) ? Verdict::holds() : Verdict::fails();
}

Verdict verdict_consequence(const Verdict& premise, bool identity_exact) {
  return identity_exact ? premise : Verdict::fails();
}

Verdict verdict_variance(int covered, int total, const std::vector<Departure>& departures,
                         bool slope_covers_one, Lang lang) {
  if (!coverage_consistent(covered, total) || !slope_covers_one) return Verdict::fails();
  std::string listed;
  // A factor 2 in the variance softmax sees (sqrt(2) in the scale) is where the choice of
  // normaliser starts to matter as much as a doubling of d does.
  const double band = std::sqrt(2.0);
  for (const auto& dep : departures) {
    if (!dep.confirmed) continue;
    if (dep.right_scale_ratio > band || dep.right_scale_ratio < 1.0 / band) {
      if (!listed.empty()) listed += clause_separator(lang);
      listed += say(lang, "{} needs {:.3g} x 1/sqrt(d)", "{} 需要 {:.3g} × 1/sqrt(d)",
                    dep.case_name, dep.right_scale_ratio);
    }
  }
  if (listed.empty()) return Verdict::holds();
  return Verdict::holds_if(
      pick(lang,
           "the components of q and k are independent with mean 0 (a mean in k is harmless: it "
           "shifts whole rows, which softmax ignores); measured departures: ",
           "q 和 k 的分量相互独立且均值为 0（k 的均值无害：它平移整行，而 softmax 不受整行平移的"
           "影响）；测得的偏离：") +
      listed);
}

std::string verdict_c7_cell(const C7Cell& c) {
  if (c.d == 1) return "equal";
  if (c.median_ratio_low > 1.0 || c.scaled_dead_low > 0.01) return "fails";
  if (c.median_ratio_high < 1.0 && c.unscaled_dead_low > c.scaled_dead_high &&
      c.scaled_dead_high <= 0.01) {
    return "holds";
  }
  return "undecided";
}

Verdict verdict_saturation_region(const std::vector<C7Cell>& cells, Lang lang) {
  std::map<int, std::vector<std::pair<int, std::string>>> by_n;  // N -> (d, cell verdict)
  int counted = 0, holding = 0;
  bool explode = false;
  for (const C7Cell& c : cells) {
    const std::string v = verdict_c7_cell(c);
    if (v == "equal") continue;
    ++counted;
    holding += v == "holds";
    explode = explode || (v == "holds" && c.mean_ratio > 1.0);
    by_n[c.n].push_back({c.d, v});
  }
  if (counted == 0 || holding == 0) return Verdict::fails();
  const std::string per_row =
      explode ? pick(lang,
                     "read per row (median, dead fraction), not on average: the unscaled mean "
                     "gradient is larger there, carried by a few near-tied rows that explode",
                     "按行（中位数、死亡比例）而不是按平均值来读：那里未缩放的平均梯度更大，"
                     "由少数几乎并列、梯度爆炸的行带动")
              : "";
  if (holding == counted) return per_row.empty() ? Verdict::holds() : Verdict::holds_if(per_row);
  const std::string sep = clause_separator(lang);
  std::string region, against;
  for (auto& [n, list] : by_n) {
    std::sort(list.begin(), list.end());
    // The smallest d from which every larger d of the grid holds.
    int from = -1;
    for (auto it = list.rbegin(); it != list.rend() && it->second == "holds"; ++it)
      from = it->first;
    std::vector<std::string> odd;  // holding cells below that run, failing cells anywhere
    std::vector<std::string> failing;
    for (const auto& [d, v] : list) {
      if (v == "holds" && (from < 0 || d < from)) odd.push_back(fmt::format("{}", d));
      if (v == "fails") failing.push_back(fmt::format("{}", d));
    }
    std::string part = from < 0 ? pick(lang, "nowhere", "无") : fmt::format("d >= {}", from);
    if (!odd.empty()) {
      part += say(lang, " and d = {}", " 以及 d = {}", fmt::join(odd, ", "));
    }
    region += say(lang, "{}N = {}: {}", "{}N = {}：{}", region.empty() ? "" : sep, n, part);
    if (!failing.empty()) {
      against += say(lang, "{}N = {}: d = {}", "{}N = {}：d = {}", against.empty() ? "" : sep, n,
                     fmt::join(failing, ", "));
    }
  }
  return Verdict::holds_if(
      say(lang, "the unscaled logits are frozen deep enough: {} of {} (d, N) cells hold ({})",
          "未缩放的 logits 冻结得足够深：{1} 个 (d, N) 单元中有 {0} 个成立（{2}）", holding,
          counted, region) +
      (against.empty()
           ? ""
           : sep +
                 pick(lang, "it fails (the unscaled typical row gets more gradient) at ",
                      "在以下单元不成立（未缩放的典型行得到更多梯度）：") +
                 against) +
      (per_row.empty() ? "" : sep + per_row));
}

Verdict verdict_temperature(double dead_at_c1, double tail_ratio_at_c1, double dead_unscaled,
                            double tail_ratio_unscaled) {
  const auto healthy = [](double dead, double tail) { return dead <= 0.01 && tail <= 5.0; };
  return (healthy(dead_at_c1, tail_ratio_at_c1) && !healthy(dead_unscaled, tail_ratio_unscaled))
             ? Verdict::holds()
             : Verdict::fails();
}

Verdict verdict_precision(double bits_lost, double naive_nan_unscaled, double naive_nan_scaled) {
  return (bits_lost >= 1.0 && naive_nan_scaled == 0.0 && naive_nan_unscaled > 0.0)
             ? Verdict::holds()
             : Verdict::fails();
}

}  // namespace sdpa::lab
