// Experiment `derive` (claims C3-C6): the article's derivation of Var(q.k) = d, one expectation
// at a time, each estimated by Monte Carlo with its 95% interval, at the article's d = 512.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/random.h"
#include "lab/sampling.h"
#include "lab/stats.h"
#include "lab/streams.h"

namespace sdpa::lab {

json run_derive(const LabOptions& options) {
  json result = make_result("derive", options);
  constexpr int d = 512;
  constexpr int kBlock = 500;  // samples per stream: the unit of parallel work
  const int n = options.mode == Mode::full ? 40000 : 4000;
  const int blocks = n / kBlock;
  const int n_dists = static_cast<int>(std::size(kAllDists));

  // Per sample: the averages over coordinates of q_i k_i and q_i^2 k_i^2, the average cross
  // term over i != j, and q.k itself. Averaging over coordinates inside one sample keeps the
  // samples independent, so the usual interval of a mean applies.
  std::vector<double> a(static_cast<std::size_t>(n_dists) * n), b(a.size()), c(a.size()),
      dot(a.size());
  Progress progress(options.progress, "derive", static_cast<std::int64_t>(n_dists) * blocks);
  parallel_for(
      static_cast<std::int64_t>(n_dists) * blocks, options.threads, [&](std::int64_t item) {
        const int di = static_cast<int>(item / blocks), blk = static_cast<int>(item % blocks);
        const Dist dist = kAllDists[di];
        Stream s(options.seed, stream_id({streams::kDerive, static_cast<std::uint64_t>(di),
                                          static_cast<std::uint64_t>(blk)}));
        std::vector<double> q(d), k(d);
        for (int t = 0; t < kBlock; ++t) {
          for (int i = 0; i < d; ++i) q[i] = sample(s, dist);
          for (int i = 0; i < d; ++i) k[i] = sample(s, dist);
          double sum = 0, sum_sq = 0;
          for (int i = 0; i < d; ++i) {
            const double prod = q[i] * k[i];
            sum += prod;
            sum_sq += prod * prod;
          }
          const std::size_t at = static_cast<std::size_t>(di) * n + blk * kBlock + t;
          a[at] = sum / d;
          b[at] = sum_sq / d;
          c[at] = (sum * sum - sum_sq) / (static_cast<double>(d) * (d - 1));
          dot[at] = sum;
        }
        progress.advance();
      });

  json rows = json::array();
  int c3_cov = 0, c3_tot = 0, c4_cov = 0, c4_tot = 0, c6_cov = 0, c6_tot = 0;
  int steps_cov = 0, steps_tot = 0;
  double identity_error = 0;
  Interval normal_var{};
  for (int di = 0; di < n_dists; ++di) {
    auto span_of = [&](const std::vector<double>& v) {
      return std::span<const double>(v.data() + static_cast<std::size_t>(di) * n, n);
    };
    std::vector<double> dot2(n), scaled(n);
    for (int t = 0; t < n; ++t) {
      const double v = dot[static_cast<std::size_t>(di) * n + t];
      dot2[t] = v * v;
      scaled[t] = v / std::sqrt(static_cast<double>(d));
    }
    struct Term {
      const char* name;
      double theory;
      Interval ci;
      int claim;
      bool counted;  // enters the claim's coverage count
    };
    // One interval per claim and distribution is counted: the others are exact functions of
    // the same samples (E[q_i k_i] = E[q.k]/d; E[(q.k)^2] = d E[q_i^2 k_i^2] + d(d-1) E[cross];
    // Var(q.k/sqrt(d)) = Var(q.k)/d), so counting them would count one draw several times. The
    // five distributions use disjoint streams: their intervals are independent.
    const Interval var_ci = variance_ci(span_of(dot));
    const Term terms[] = {
        {"E[q_i k_i]", 0.0, mean_ci(span_of(a)), 3, false},
        {"E[q.k]", 0.0, mean_ci(span_of(dot)), 3, true},
        {"E[q_i^2 k_i^2]", 1.0, mean_ci(span_of(b)), 4, false},
        {"E[q_i k_i q_j k_j]", 0.0, mean_ci(span_of(c)), 4, false},
        {"E[(q.k)^2]", double(d), mean_ci(dot2), 4, false},
        {"Var(q.k)", double(d), var_ci, 4, true},
        {"Var(q.k/sqrt(d))", 1.0, variance_ci(scaled), 6, false},
    };
    const Interval scaled_ci = terms[6].ci;
    identity_error =
        std::max(identity_error, std::fabs(scaled_ci.estimate * d / var_ci.estimate - 1));
    for (const auto& t : terms) {
      const bool covered = t.ci.contains(t.theory);
      if (t.counted) {
        (t.claim == 3 ? c3_cov : c4_cov) += covered;
        (t.claim == 3 ? c3_tot : c4_tot) += 1;
      } else {
        steps_cov += covered;
        ++steps_tot;
      }
      if (t.claim == 6) {
        c6_cov += covered;
        ++c6_tot;
      }
      if (kAllDists[di] == Dist::normal && std::string(t.name) == "Var(q.k)") {
        normal_var = variance_ci(span_of(dot), kZ999);
      }
      rows.push_back({{"distribution", dist_name(kAllDists[di])},
                      {"d", d},
                      {"samples", n},
                      {"term", t.name},
                      {"theory", t.theory},
                      {"estimate", t.ci.estimate},
                      {"ci_low", t.ci.low},
                      {"ci_high", t.ci.high},
                      {"covered", covered},
                      {"counted", t.counted}});
    }
  }
  result["tables"]["derive"] = rows;

  auto& claims = result["claims"];
  const Lang lang = options.lang;
  const std::string dists = "normal, uniform, rademacher, laplace, student-t5";
  const std::string steps =
      say(lang,
          "The other steps, shown but not counted (exact functions of the same samples): {} of {} "
          "intervals contain their theory.",
          "其余各步只展示、不计数（它们是同一批样本的精确函数）：{1} 个区间中有 {0} 个包含各自的"
          "理论值。",
          steps_cov, steps_tot);
  claims.push_back(make_claim(
      "C3", lang,
      pick(lang, "E[q_i k_i] = E[q_i] E[k_i] = 0, so E[q.k] = 0.",
           "E[q_i k_i] = E[q_i] E[k_i] = 0，所以 E[q.k] = 0。"),
      say(lang,
          "{} of {} independent intervals of E[q.k] (one per distribution; d = {}, {} samples "
          "each; {}) contain 0; at least {} needed (Binomial({}, 0.95) at level 1e-3)",
          "{1} 个相互独立的 E[q.k] 区间（每种分布一个；d = {2}，各 {3} 个样本；{4}）中有 {0} 个"
          "包含 0；至少需要 {5} 个（Binomial({6}, 0.95)，水平 1e-3）",
          c3_cov, c3_tot, d, n, dists, binomial_lower_bound(c3_tot, 0.95, 1e-3), c3_tot),
      verdict_coverage(c3_cov, c3_tot),
      pick(lang, "Each step holds for every zero-mean distribution tried, not only the normal. ",
           "每一步对所试的每种零均值分布都成立，不只是正态分布。") +
          steps));
  const Verdict v4 = verdict_coverage(c4_cov, c4_tot);
  claims.push_back(make_claim(
      "C4", lang,
      pick(lang,
           "E[q_i^2 k_i^2] = E[q_i^2] E[k_i^2] = 1; E[q_i k_i q_j k_j] = 0 for i != j; so "
           "E[(q.k)^2] = Var(q.k) = d.",
           "E[q_i^2 k_i^2] = E[q_i^2] E[k_i^2] = 1；i != j 时 E[q_i k_i q_j k_j] = 0；所以 "
           "E[(q.k)^2] = Var(q.k) = d。"),
      say(lang,
          "{} of {} independent intervals of Var(q.k) (fourth-moment based, one per "
          "distribution) contain d; at least {} needed",
          "{1} 个相互独立的 Var(q.k) 区间（基于四阶矩，每种分布一个）中有 {0} 个包含 d；至少需要 "
          "{2} 个",
          c4_cov, c4_tot, binomial_lower_bound(c4_tot, 0.95, 1e-3)),
      v4,
      pick(lang,
           "The square terms need only unit variance, the cross terms only independence and zero "
           "mean: the fourth moment of the distribution (1 to 9 here) never enters Var(q.k). ",
           "平方项只需要单位方差，交叉项只需要独立和零均值：分布的四阶矩（这里从 1 到 9）从不"
           "进入 Var(q.k)。") +
          steps));
  claims.push_back(make_claim(
      "C5", lang, pick(lang, "Var(q.k) = 512 at d = 512.", "d = 512 时 Var(q.k) = 512。"),
      say(lang,
          "normal: Var(q.k) = {:.1f}, 99.9% interval [{:.1f}, {:.1f}] (level 1 - 1e-3, as the "
          "coverage counts)",
          "正态：Var(q.k) = {:.1f}，99.9% 区间 [{:.1f}, {:.1f}]（水平 1 - 1e-3，与覆盖计数相同）",
          normal_var.estimate, normal_var.low, normal_var.high),
      verdict_interval(512.0, normal_var.low, normal_var.high),
      pick(lang, "The standard deviation of the scores is sqrt(512) = 22.6.",
           "分数的标准差为 sqrt(512) = 22.6。")));
  claims.push_back(make_claim(
      "C6", lang,
      pick(lang, "Var(q.k / sqrt(d)) = Var(q.k) / d = 1.",
           "由方差的性质，Var(q.k / sqrt(d)) = Var(q.k) / d = 1。"),
      say(lang,
          "a consequence of C4, not a second test: Var(cX) = c^2 Var(X) holds in the samples to "
          "{:.1e} (relative), so the verdict is C4's; {} of {} intervals of Var(q.k/sqrt(d)) "
          "contain 1 (C4's intervals divided by d)",
          "这是 C4 的推论，不是第二个检验：Var(cX) = c^2 Var(X) 在样本中成立到 "
          "{0:.1e}（相对误差），"
          "所以结论就是 C4 的；{2} 个 Var(q.k/sqrt(d)) 区间中有 {1} 个包含 1（即 C4 的区间除以 d）",
          identity_error, c6_cov, c6_tot),
      verdict_consequence(v4, identity_error < 1e-12),
      pick(lang, "Scaling by 1/sqrt(d) gives unit variance at d = 512 because Var(q.k) = d does.",
           "在 d = 512 时，按 1/sqrt(d) 缩放得到单位方差，是因为 Var(q.k) = d。")));
  return result;
}

}  // namespace sdpa::lab

namespace sdpa::lab {

const Experiment& derive_experiment() {
  static const Experiment e{
      "derive",
      "C3-C6: each step of Var(q.k) = d as an expectation with its interval",
      run_derive,
      {{"derive",
        "one per (distribution, term), d = 512 (the article's)",
        {{"distribution", Kind::text, "",
          "`normal`, `uniform`, `rademacher`, `laplace`, `student-t5` (mean 0, variance 1)"},
         {"d", Kind::integer, "", "dimension of q and k"},
         {"samples", Kind::integer, "", "independent (q, k) pairs"},
         {"term", Kind::text, "",
          "`\"E[q_i k_i]\"` (theory 0), `\"E[q.k]\"` (0), `\"E[q_i^2 k_i^2]\"` (1), "
          "`\"E[q_i k_i q_j k_j]\"` (i ≠ j, 0), `\"E[(q.k)^2]\"` (d), `\"Var(q.k)\"` (d), "
          "`\"Var(q.k/sqrt(d))\"` (1)"},
         {"theory", Kind::number, "", "the value the derivation gives"},
         {"estimate", Kind::number, "", "the sample's value"},
         {"ci_low", Kind::number, "", "95% confidence interval, low end"},
         {"ci_high", Kind::number, "", "95% confidence interval, high end"},
         {"covered", Kind::boolean, "", "the theory lies inside the interval"},
         {"counted", Kind::boolean, "",
          "the interval enters its claim's coverage count: one per claim and distribution "
          "(`E[q.k]` for C3, `Var(q.k)` for C4); the others are exact functions of the same "
          "samples"}}}},
      {{"derive",
        {"distribution", "term", "theory", "estimate", "ci_low", "ci_high", "covered", "counted"},
        nullptr}}};
  return e;
}

}  // namespace sdpa::lab
