// Experiment `variance` (claims C3-C6): mean and variance of q.k for d = 1 ... 4096 and five
// component distributions, each with its interval; then the article's assumptions relaxed one at
// a time (a mean in q, a mean in k, correlation between q and k, correlation across dimensions),
// each against its closed form.
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
namespace {

constexpr int kBlock = 250;  // samples per stream: the unit of parallel work

struct NonIid {
  const char* name;
  double parameter;
};

// The cases of variance_noniid. mean_q uses m = 2 (variance 5d) so the needed normaliser,
// 1/sqrt(5) of 1/sqrt(d), is far from the factor-sqrt(2) band of verdict_variance; corr_dims
// uses r = 0.05, small enough to look harmless, yet r^2 d^2 overtakes d once d > 1/r^2 = 400.
constexpr NonIid kCases[] = {
    {"mean_q", 2.0}, {"mean_k", 2.0}, {"corr_qk", 0.5}, {"corr_dims", 0.05}, {"corr_dims", 0.2}};
constexpr int kNonIidD[] = {16, 128, 1024};
constexpr int kKeysPerRow = 8;

struct Theory {
  double mean, variance, within;
};

Theory noniid_theory(const NonIid& c, double d) {
  const double p = c.parameter;
  const std::string name = c.name;
  if (name == "mean_q") return {0.0, d * (1 + p * p), d * (1 + p * p)};
  if (name == "mean_k") return {0.0, d * (1 + p * p), d};
  if (name == "corr_qk") return {d * p, d * (1 + p * p), d * (1 - p * p)};
  const double v = d * (1 - p * p) + p * p * d * d;  // corr_dims
  return {0.0, v, v};
}

// One query and kKeysPerRow keys of a case; returns q.k_j in scores.
void noniid_row(const NonIid& c, int d, Stream& s, std::vector<double>& q, std::vector<double>& k,
                std::vector<double>& scores) {
  const std::string name = c.name;
  const double p = c.parameter;
  auto fill = [&](std::vector<double>& v, double mean) {
    if (name == "corr_dims") {
      const double g = s.normal(), a = std::sqrt(p), b = std::sqrt(1 - p);
      for (int i = 0; i < d; ++i) v[i] = a * g + b * s.normal();
    } else {
      for (int i = 0; i < d; ++i) v[i] = mean + s.normal();
    }
  };
  fill(q, name == "mean_q" ? p : 0.0);
  for (int j = 0; j < kKeysPerRow; ++j) {
    if (name == "corr_qk") {
      const double b = std::sqrt(1 - p * p);
      for (int i = 0; i < d; ++i) k[i] = p * q[i] + b * s.normal();
    } else {
      fill(k, name == "mean_k" ? p : 0.0);
    }
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += q[i] * k[i];
    scores[j] = dot;
  }
}

}  // namespace

json run_variance(const LabOptions& options) {
  json result = make_result("variance", options);
  const bool full = options.mode == Mode::full;

  // ---- iid table --------------------------------------------------------------------------
  const int n = full ? 20000 : 2000;
  const int blocks = n / kBlock;
  std::vector<int> ds;
  for (int d = 1; d <= 4096; d *= 2) ds.push_back(d);
  const int n_dists = static_cast<int>(std::size(kAllDists));
  const int n_rows = n_dists * static_cast<int>(ds.size());
  std::vector<double> dots(static_cast<std::size_t>(n_rows) * n);

  const int nr = full ? 10000 : 1000;  // query rows of each non-iid case
  const int nr_blocks = nr / kBlock;
  const int n_cases = static_cast<int>(std::size(kCases)) * static_cast<int>(std::size(kNonIidD));
  std::vector<double> first(static_cast<std::size_t>(n_cases) * nr), within(first.size());

  const std::int64_t iid_items = static_cast<std::int64_t>(n_rows) * blocks;
  const std::int64_t items = iid_items + static_cast<std::int64_t>(n_cases) * nr_blocks;
  Progress progress(options.progress, "variance", items);
  parallel_for(items, options.threads, [&](std::int64_t item) {
    if (item < iid_items) {
      const int row = static_cast<int>(item / blocks), blk = static_cast<int>(item % blocks);
      const Dist dist = kAllDists[row / ds.size()];
      const int d = ds[row % ds.size()];
      Stream s(options.seed, stream_id({streams::kVariance, static_cast<std::uint64_t>(row),
                                        static_cast<std::uint64_t>(blk)}));
      for (int t = 0; t < kBlock; ++t) {
        double dot = 0;
        for (int i = 0; i < d; ++i) {
          const double q = sample(s, dist);
          dot += q * sample(s, dist);
        }
        dots[static_cast<std::size_t>(row) * n + blk * kBlock + t] = dot;
      }
    } else {
      const std::int64_t rest = item - iid_items;
      const int cs = static_cast<int>(rest / nr_blocks), blk = static_cast<int>(rest % nr_blocks);
      const NonIid& c = kCases[cs / std::size(kNonIidD)];
      const int d = kNonIidD[cs % std::size(kNonIidD)];
      Stream s(options.seed, stream_id({streams::kVarianceNonIid, static_cast<std::uint64_t>(cs),
                                        static_cast<std::uint64_t>(blk)}));
      std::vector<double> q(d), k(d), scores(kKeysPerRow);
      for (int t = 0; t < kBlock; ++t) {
        noniid_row(c, d, s, q, k, scores);
        const std::size_t at = static_cast<std::size_t>(cs) * nr + blk * kBlock + t;
        first[at] = scores[0];
        within[at] = sample_variance(scores);
      }
    }
    progress.advance();
  });

  json table = json::array();
  std::vector<double> log_d(n_rows), log_var(n_rows);
  int mean_cov = 0, var_cov = 0;
  Interval c5{};
  double scaled_min = INFINITY, scaled_max = 0;
  for (int row = 0; row < n_rows; ++row) {
    const Dist dist = kAllDists[row / ds.size()];
    const int d = ds[row % ds.size()];
    const std::span<const double> x(dots.data() + static_cast<std::size_t>(row) * n, n);
    const Interval m = mean_ci(x), v = variance_ci(x);
    const bool mc = m.contains(0.0), vc = v.contains(d);
    mean_cov += mc;
    var_cov += vc;
    if (dist == Dist::normal && d == 512) c5 = variance_ci(x, kZ999);
    log_d[static_cast<std::size_t>(row)] = std::log(static_cast<double>(d));
    log_var[static_cast<std::size_t>(row)] = std::log(v.estimate);
    const double kq = dist_kurtosis(dist);
    scaled_min = std::min(scaled_min, v.estimate / d);
    scaled_max = std::max(scaled_max, v.estimate / d);
    table.push_back({{"distribution", dist_name(dist)},
                     {"d", d},
                     {"samples", n},
                     {"mean", m.estimate},
                     {"mean_ci_low", m.low},
                     {"mean_ci_high", m.high},
                     {"variance", v.estimate},
                     {"variance_ci_low", v.low},
                     {"variance_ci_high", v.high},
                     {"theory_variance", d},
                     {"scaled_variance", v.estimate / d},
                     {"scaled_variance_ci_low", v.low / d},
                     {"scaled_variance_ci_high", v.high / d},
                     {"mean_covered", mc},
                     {"variance_covered", vc},
                     {"kurtosis", kurtosis(x)},
                     {"kurtosis_theory", 3 + (kq * kq - 3) / d}});
  }
  result["tables"]["variance"] = table;

  // ---- the log-log slope of Var against d: 1 if Var = d ------------------------------------
  json slopes = json::array();
  const auto n_ds = ds.size();
  auto slope_row = [&](const std::string& name, std::size_t first, std::size_t count) {
    const Interval b = slope_ci(std::span<const double>(log_d.data() + first, count),
                                std::span<const double>(log_var.data() + first, count));
    slopes.push_back({{"distribution", name},
                      {"points", count},
                      {"slope", b.estimate},
                      {"slope_ci_low", b.low},
                      {"slope_ci_high", b.high},
                      {"covered", b.contains(1.0)}});
    return b;
  };
  for (int di = 0; di < n_dists; ++di) slope_row(dist_name(kAllDists[di]), di * n_ds, n_ds);
  const Interval pooled = slope_row("pooled", 0, log_d.size());
  result["tables"]["variance_slope"] = slopes;

  // ---- non-iid table ----------------------------------------------------------------------
  json noniid = json::array();
  std::vector<Departure> departures;
  std::string noniid_evidence;
  for (int cs = 0; cs < n_cases; ++cs) {
    const NonIid& c = kCases[cs / std::size(kNonIidD)];
    const int d = kNonIidD[cs % std::size(kNonIidD)];
    const Theory th = noniid_theory(c, d);
    const std::span<const double> f(first.data() + static_cast<std::size_t>(cs) * nr, nr);
    const std::span<const double> w(within.data() + static_cast<std::size_t>(cs) * nr, nr);
    const Interval m = mean_ci(f), v = variance_ci(f), wr = mean_ci(w);
    const double ratio = std::sqrt(d / wr.estimate);
    noniid.push_back({{"case", c.name},
                      {"parameter", c.parameter},
                      {"d", d},
                      {"samples", nr},
                      {"mean", m.estimate},
                      {"mean_ci_low", m.low},
                      {"mean_ci_high", m.high},
                      {"theory_mean", th.mean},
                      {"variance", v.estimate},
                      {"variance_ci_low", v.low},
                      {"variance_ci_high", v.high},
                      {"theory_variance", th.variance},
                      {"within_row_variance", wr.estimate},
                      {"within_row_ci_low", wr.low},
                      {"within_row_ci_high", wr.high},
                      {"within_row_theory", th.within},
                      {"mean_covered", m.contains(th.mean)},
                      {"variance_covered", v.contains(th.variance)},
                      {"within_row_covered", wr.contains(th.within)},
                      {"right_scale_ratio", ratio}});
    if (d == kNonIidD[std::size(kNonIidD) - 1]) {
      const std::string label = fmt::format("{} {:g} (d = {})", c.name, c.parameter, d);
      departures.push_back({label, ratio, wr.contains(th.within)});
      if (!noniid_evidence.empty()) noniid_evidence += clause_separator(options.lang);
      noniid_evidence +=
          say(options.lang, "{}: Var {:.4g} (theory {:.4g}), within-row {:.4g} (theory {:.4g})",
              "{}：Var {:.4g}（理论 {:.4g}），行内 {:.4g}（理论 {:.4g}）", label, v.estimate,
              th.variance, wr.estimate, th.within);
    }
  }
  result["tables"]["variance_noniid"] = noniid;

  // ---- claims -----------------------------------------------------------------------------
  auto& claims = result["claims"];
  const Lang lang = options.lang;
  claims.push_back(make_claim(
      "C3", lang,
      pick(lang, "E[q.k] = 0 for independent zero-mean components, any d.",
           "各分量相互独立、均值为零时，对任意 d 都有 E[q.k] = 0。"),
      say(lang,
          "{} of {} mean intervals contain 0 (5 distributions x d = 1..4096, {} samples each)",
          "{1} 个均值区间中有 {0} 个包含 0（5 种分布 × d = 1..4096，各 {2} 个样本）", mean_cov,
          n_rows, n),
      verdict_coverage(mean_cov, n_rows),
      pick(lang,
           "A 95% interval should miss about 1 time in 20; the verdict fails only if the misses "
           "are more than a Binomial(n, 0.95) allows at level 1e-3.",
           "95% 区间大约每 20 次错过 1 次；只有错过的次数多于 Binomial(n, 0.95) 在水平 1e-3 下"
           "所允许的次数时，结论才是不成立。")));
  claims.push_back(make_claim(
      "C4", lang,
      pick(lang,
           "Var(q.k) = d for independent components of mean 0 and variance 1 (any distribution); "
           "relaxed: mean m_q in q: d(1 + m_q^2); mean in k: the same in total but d within a "
           "row; correlation rho between q_i and k_i: d(1 + rho^2), within a row d(1 - rho^2); "
           "correlation r across dimensions: d(1 - r^2) + r^2 d^2.",
           "分量相互独立、均值 0、方差 1 时（任何分布），Var(q.k) = d；放宽条件：q 的均值为 "
           "m_q：d(1 + m_q^2)；k 有均值：总方差相同，但行内为 d；q_i 与 k_i 的相关系数为 rho："
           "d(1 + rho^2)，行内 d(1 - rho^2)；各维之间的相关系数为 r：d(1 - r^2) + r^2 d^2。"),
      say(lang,
          "{} of {} variance intervals (fourth-moment based, each from its own samples) contain "
          "d (at least {} needed); pooled log-log slope of Var against d {:.4f}, 95% interval "
          "[{:.4f}, {:.4f}] (theory 1). Relaxed, at d = 1024: {}",
          "{1} 个方差区间（基于四阶矩，各用自己的样本）中有 {0} 个包含 d（至少需要 {2} 个）；"
          "Var 对 d 的合并双对数斜率 {3:.4f}，95% 区间 [{4:.4f}, {5:.4f}]（理论值 1）。"
          "放宽条件，d = 1024：{6}",
          var_cov, n_rows, binomial_lower_bound(n_rows, 0.95, 1e-3), pooled.estimate, pooled.low,
          pooled.high, noniid_evidence),
      verdict_variance(var_cov, n_rows, departures, pooled.contains(1.0), lang),
      pick(lang,
           "What softmax sees is the within-row variance: a mean in k shifts every score of a row "
           "alike and cancels; a mean in q or correlation across dimensions does not, and the "
           "latter grows like d^2.",
           "softmax 看到的是行内方差：k 的均值让一行中的每个分数平移相同的量，因而抵消；q 的均值"
           "或各维之间的相关性则不会抵消，后者按 d^2 增长。")));
  claims.push_back(make_claim(
      "C5", lang,
      pick(lang, "Var(q.k) = 512 at d = 512 (normal components).",
           "d = 512 时 Var(q.k) = 512（正态分量）。"),
      say(lang,
          "Var(q.k) = {:.1f}, 99.9% interval [{:.1f}, {:.1f}] ({} samples; level 1 - 1e-3, as "
          "the coverage counts)",
          "Var(q.k) = {:.1f}，99.9% 区间 [{:.1f}, {:.1f}]（{} 个样本；水平 1 - 1e-3，与覆盖计数"
          "相同）",
          c5.estimate, c5.low, c5.high, n),
      verdict_interval(512.0, c5.low, c5.high),
      pick(lang, "Standard deviation sqrt(512) = 22.6.", "标准差 sqrt(512) = 22.6。")));
  claims.push_back(make_claim(
      "C6", lang,
      pick(lang, "Var(q.k / sqrt(d)) = 1 for every d.", "对每个 d，Var(q.k / sqrt(d)) = 1。"),
      say(lang,
          "a consequence of C4, not a second test: the scaled variance is the variance divided "
          "by d (between {:.3f} and {:.3f} over all rows), so its intervals are C4's and the "
          "verdict is C4's",
          "这是 C4 的推论，不是第二个检验：缩放后的方差就是方差除以 d（在所有行中介于 {:.3f} 与 "
          "{:.3f} 之间），所以它的区间就是 C4 的区间，结论也是 C4 的",
          scaled_min, scaled_max),
      verdict_consequence(claims[1]["verdict"] == "fails" ? Verdict::fails()
                          : claims[1]["verdict"] == "holds"
                              ? Verdict::holds()
                              : Verdict::holds_if(claims[1]["condition"].get<std::string>()),
                          true),
      pick(lang,
           "Var(cX) = c^2 Var(X) is exact; what is measured is the premise Var(q.k) = d at every "
           "d. Kurtosis of q.k: 3 + (k_q k_k - 3)/d for iid products (column kurtosis_theory).",
           "Var(cX) = c^2 Var(X) 是精确的；真正测量的是前提：每个 d 下 Var(q.k) = d。q.k 的峰度："
           "独立同分布的乘积为 3 + (k_q k_k - 3)/d（列 kurtosis_theory）。")));
  return result;
}

}  // namespace sdpa::lab

namespace sdpa::lab {
namespace {

bool is_key_d(const json& row) {
  const int d = row["d"].get<int>();
  return d == 1 || d == 16 || d == 512 || d == 4096;
}

Column ci(const std::string& name, const std::string& of, const char* end) {
  return {name, Kind::number, "", fmt::format("95% confidence interval of {}, {} end", of, end)};
}

}  // namespace

const Experiment& variance_experiment() {
  static const Experiment e{
      "variance",
      "C3-C6: mean and variance of q.k, d = 1..4096, five distributions, non-iid",
      run_variance,
      {{"variance",
        "one per (distribution, d), d = 1, 2, 4, …, 4096",
        {{"distribution", Kind::text, "",
          "`normal`, `uniform`, `rademacher`, `laplace`, `student-t5` (each scaled to mean 0, "
          "variance 1)"},
         {"d", Kind::integer, "", "dimension of q and k"},
         {"samples", Kind::integer, "", "independent (q, k) pairs"},
         {"mean", Kind::number, "", "sample mean of q·k (theory 0)"},
         ci("mean_ci_low", "the mean", "low"),
         ci("mean_ci_high", "the mean", "high"),
         {"variance", Kind::number, "", "sample variance of q·k (theory d)"},
         ci("variance_ci_low", "the variance", "low"),
         ci("variance_ci_high", "the variance", "high"),
         {"theory_variance", Kind::number, "", "d"},
         {"scaled_variance", Kind::number, "", "`variance/d`: the variance of q·k/√d (theory 1)"},
         ci("scaled_variance_ci_low", "the scaled variance", "low"),
         ci("scaled_variance_ci_high", "the scaled variance", "high"),
         {"mean_covered", Kind::boolean, "", "0 lies inside the mean's interval"},
         {"variance_covered", Kind::boolean, "", "d lies inside the variance's interval"},
         {"kurtosis", Kind::number, "", "sample kurtosis of q·k"},
         {"kurtosis_theory", Kind::number, "",
          "`3 + (κ_q κ_k − 3)/d`: the kurtosis of a sum of d iid products `q_i k_i` of kurtosis "
          "`κ_q κ_k` (κ = 3, 1.8, 1, 6, 9 for the five distributions)"}}},
       {"variance_slope",
        "one per distribution, and `pooled` over all 65 rows: the least-squares slope of "
        "`ln Var(q·k)` against `ln d` (theory 1)",
        {{"distribution", Kind::text, "", "a distribution, or `pooled`"},
         {"points", Kind::integer, "", "(d, variance) points fitted"},
         {"slope", Kind::number, "", "the slope"},
         {"slope_ci_low", Kind::number, "",
          "95% interval of the slope (Student t with points − 2 degrees of freedom), low end"},
         {"slope_ci_high", Kind::number, "", "the same, high end"},
         {"covered", Kind::boolean, "", "1 lies inside the interval"}}},
       {"variance_noniid",
        "one per (case, parameter, d): what the article assumes away, against its closed form",
        {{"case", Kind::text, "",
          "`mean_q` (q has mean `parameter` in every component), `mean_k` (k has that mean), "
          "`corr_qk` (correlation ρ between q_i and k_i), `corr_dims` (correlation r between "
          "every two components of q, and of k)"},
         {"parameter", Kind::number, "", "the mean m, ρ or r of the case"},
         {"d", Kind::integer, "", "dimension of q and k"},
         {"samples", Kind::integer, "", "independent (q, k) pairs"},
         {"mean", Kind::number, "", "sample mean of q·k"},
         ci("mean_ci_low", "the mean", "low"),
         ci("mean_ci_high", "the mean", "high"),
         {"theory_mean", Kind::number, "", "closed form: 0, or `dρ` for `corr_qk`"},
         {"variance", Kind::number, "", "sample variance of q·k over all pairs"},
         ci("variance_ci_low", "the variance", "low"),
         ci("variance_ci_high", "the variance", "high"),
         {"theory_variance", Kind::number, "",
          "closed form: `d(1 + m²)` (mean cases), `d(1 + ρ²)`, `d(1 − r²) + r²d²`"},
         {"within_row_variance", Kind::number, "",
          "the variance of the scores of one query against many keys, averaged over queries: "
          "what softmax sees"},
         ci("within_row_ci_low", "the within-row variance", "low"),
         ci("within_row_ci_high", "the within-row variance", "high"),
         {"within_row_theory", Kind::number, "",
          "closed form: `d(1 + m²)` for `mean_q`, `d` for `mean_k` (softmax ignores a shift of "
          "the whole row), `d(1 − ρ²)`, `d(1 − r²) + r²d²`"},
         {"mean_covered", Kind::boolean, "", "the theory lies inside the mean's interval"},
         {"variance_covered", Kind::boolean, "", "the theory lies inside the variance's interval"},
         {"within_row_covered", Kind::boolean, "",
          "the theory lies inside the within-row interval"},
         {"right_scale_ratio", Kind::number, "",
          "`sqrt(d / within_row_theory)`: the right normaliser divided by `1/sqrt(d)` (1: "
          "`1/sqrt(d)` is right)"}}}},
      {{"variance",
        {"distribution", "d", "mean", "mean_ci_low", "mean_ci_high", "variance", "variance_ci_low",
         "variance_ci_high", "scaled_variance", "variance_covered"},
        is_key_d},
       {"variance_slope",
        {"distribution", "slope", "slope_ci_low", "slope_ci_high", "covered"},
        nullptr},
       {"variance_noniid",
        {"case", "parameter", "d", "mean", "theory_mean", "variance", "theory_variance",
         "within_row_variance", "within_row_theory", "right_scale_ratio"},
        nullptr}}};
  return e;
}

}  // namespace sdpa::lab
