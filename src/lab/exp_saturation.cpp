// Experiment `saturation` (claim C7): over d and the number of keys N, for scales 1, 1/sqrt(d)
// and 1/d, the softmax's entropy against the random-energy-model theory ln N - s^2/2, and the
// distribution (median, mean, tail, dead fraction) of the gradient reaching Q, K and the logits
// through the library's attention backward.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>

#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/probe.h"
#include "lab/random.h"
#include "lab/rem.h"
#include "lab/scales.h"
#include "lab/stats.h"
#include "lab/streams.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

// A cell's verdict ("holds", "fails", "undecided") in the claim's sentence; the table keeps the
// English word.
std::string cell_word(const std::string& verdict, Lang lang) {
  if (lang == Lang::en) return verdict;
  return verdict == "holds" ? "成立" : verdict == "fails" ? "不成立" : "无法判断";
}

// From d = 1 so that the freezing boundary d = 2 ln N (5.5 to 18) crosses the grid.
constexpr int kDs[] = {1, 4, 8, 16, 32, 64, 256, 1024};
// The largest cell (d = 1024, N = 8192) costs half the grid: quick mode stops at N = 4096.
constexpr int kNsQuick[] = {16, 128, 1024, 4096};
constexpr int kNsFull[] = {16, 128, 1024, 8192};
std::span<const int> grid_ns(bool full) {
  return full ? std::span<const int>(kNsFull) : std::span<const int>(kNsQuick);
}
constexpr int kHistDs[] = {16, 256, 1024};
constexpr int kHistN = 1024;
constexpr int kHistBins = 40;
// The frozen side is compared with Poisson-Dirichlet from 1.5 s_c on (lab/rem.h).
constexpr double kDeepFrozen = kRemDeepFrozen;

constexpr Scale kScales[] = {Scale::one, Scale::inv_sqrt_d, Scale::inv_d};
constexpr int kReference = 1;  // 1/sqrt(d): the ratios are relative to it

// Query rows per cell: `draws` independent K/V draws of `rows per draw` queries each, 256 rows
// in quick mode (a dead fraction of 1% is then 2.6 rows, and its bootstrap interval is
// meaningful), 1024 in full.
constexpr int kDrawsQuick = 4, kRowsPerDrawQuick = 64;
constexpr int kDrawsFull = 8, kRowsPerDrawFull = 128;

void put_stats(json& row, const std::string& prefix, const NormStats& s) {
  row[prefix + "_norm"] = num(s.median);
  row[prefix + "_mean"] = num(s.mean);
  row[prefix + "_p99"] = num(s.p99);
  row[prefix + "_dead"] = num(s.dead);
}

// The entropy of softmax over N independent N(0, s^2) logits, for s = 0.25, 0.5, ..., 8: where
// the random-energy-model result ln N - s^2/2 holds and where it parts from the measurement.
// The same standard-normal draws serve every s (rows x N per N), through the library's softmax.
struct Curve {
  std::vector<double> s;
  std::vector<std::vector<double>> entropy;  // [n index][s index], mean over rows
};

Curve entropy_curve(const LabOptions& options) {
  const std::span<const int> kNs = grid_ns(options.mode == Mode::full);
  Curve c;
  for (int k = 1; k <= 32; ++k) c.s.push_back(0.25 * k);
  const int rows = options.mode == Mode::full ? 512 : 64;
  const auto n_n = static_cast<std::int64_t>(std::size(kNs));
  std::vector<double> h(static_cast<std::size_t>(n_n) * rows * c.s.size());
  parallel_for(n_n * rows, options.threads, [&](std::int64_t item) {
    const int ni = static_cast<int>(item / rows), row = static_cast<int>(item % rows);
    const int n = kNs[ni];
    Stream st(options.seed, stream_id({streams::kEntropyCurve, static_cast<std::uint64_t>(n),
                                       static_cast<std::uint64_t>(row)}));
    std::vector<double> g(n), p(n);
    for (double& v : g) v = st.normal();
    for (std::size_t k = 0; k < c.s.size(); ++k) {
      softmax<double>(g, p, c.s[k]);
      h[(static_cast<std::size_t>(item)) * c.s.size() + k] = entropy(p);
    }
  });
  c.entropy.assign(n_n, std::vector<double>(c.s.size(), 0.0));
  for (std::int64_t ni = 0; ni < n_n; ++ni) {
    for (int row = 0; row < rows; ++row) {
      for (std::size_t k = 0; k < c.s.size(); ++k) {
        c.entropy[ni][k] += h[(static_cast<std::size_t>(ni) * rows + row) * c.s.size() + k] / rows;
      }
    }
  }
  return c;
}

}  // namespace

json run_saturation(const LabOptions& options) {
  json result = make_result("saturation", options);
  const bool full = options.mode == Mode::full;
  json table = json::array(), hist = json::array(), freezing = json::array(),
       region = json::array();
  const int draws = full ? kDrawsFull : kDrawsQuick;
  const int per_draw = full ? kRowsPerDrawFull : kRowsPerDrawQuick;
  const int rows = draws * per_draw;
  const int replicates = full ? 2000 : 1000;
  const std::span<const int> kNs = grid_ns(full);

  std::vector<C7Cell> cells;
  std::string cell_text;
  Progress progress(options.progress, "saturation",
                    static_cast<std::int64_t>(std::size(kDs)) * std::size(kNs));
  std::vector<double> first_parted(std::size(kNs), -1);
  for (int d : kDs) {
    for (std::size_t ni = 0; ni < std::size(kNs); ++ni) {
      const int n = kNs[ni];
      const bool want_hist =
          n == kHistN && std::find(std::begin(kHistDs), std::end(kHistDs), d) != std::end(kHistDs);
      // The three scales of a cell see the same inputs: `draws` independent K, V (each with its
      // own queries and dO); the rows of all draws are pooled, draw by draw.
      std::vector<ProbeResult> res(3);
      std::vector<double> logit_var(3, 0.0);
      for (int draw = 0; draw < draws; ++draw) {
        const ProbeInputs in = make_probe_inputs(
            options.seed, stream_id({streams::kSaturation, static_cast<std::uint64_t>(draw)}), d, n,
            per_draw, options.threads);
        for (int si = 0; si < 3; ++si) {
          ProbeResult r = probe(in, scale_value(kScales[si], d), options.threads,
                                want_hist && si < 2 && draw == 0);
          ProbeResult& acc = res[si];
          auto append = [](std::vector<double>& to, const std::vector<double>& from) {
            to.insert(to.end(), from.begin(), from.end());
          };
          append(acc.entropy, r.entropy);
          append(acc.max_prob, r.max_prob);
          append(acc.jacobian_norm, r.jacobian_norm);
          append(acc.grad_q, r.grad_q);
          append(acc.grad_k, r.grad_k);
          append(acc.grad_logits, r.grad_logits);
          if (draw == 0) acc.logits = std::move(r.logits);
          logit_var[si] += r.logit_std * r.logit_std / draws;
        }
      }
      // Dead: below a thousandth of the gradient uniform attention at 1/sqrt(d) would give,
      // a closed form of (d, N): the same threshold for every scale, fixed before measuring.
      const double dead_q = kDeadFactor * uniform_grad_q(d, n);
      const double dead_k = kDeadFactor * uniform_grad_k(d, n, per_draw);
      const double dead_s = kDeadFactor * uniform_grad_logits(d, n);
      // Paired bootstrap over query rows (the same rows under the three scales), within draws:
      // per scale the median |dQ|, the dead fraction, the mean max probability, and the ratio of
      // the median to that of 1/sqrt(d).
      const auto ci =
          bootstrap(rows, draws, replicates, options.seed,
                    stream_id({streams::kSaturation, 0xB0075, static_cast<std::uint64_t>(d),
                               static_cast<std::uint64_t>(n)}),
                    0.95, [&](const std::vector<int>& idx) {
                      std::vector<double> out;
                      std::vector<double> med(3);
                      std::vector<double> g(idx.size());
                      for (int si = 0; si < 3; ++si) {
                        std::size_t dead = 0;
                        double mp = 0;
                        for (std::size_t i = 0; i < idx.size(); ++i) {
                          g[i] = res[si].grad_q[idx[i]];
                          dead += g[i] < dead_q;
                          mp += res[si].max_prob[idx[i]];
                        }
                        med[si] = quantile(g, 0.5);
                        out.push_back(med[si]);
                        out.push_back(static_cast<double>(dead) / idx.size());
                        out.push_back(mp / idx.size());
                      }
                      for (int si = 0; si < 3; ++si) out.push_back(med[si] / med[kReference]);
                      return out;
                    });
      auto at = [&](int si, int k) { return ci[3 * si + k]; };  // k: 0 median, 1 dead, 2 max p
      auto ratio = [&](int si) { return ci[9 + si]; };
      const double ln_n = std::log(static_cast<double>(n));
      for (int si = 0; si < 3; ++si) {
        const ProbeResult& r = res[si];
        const double sv = scale_value(kScales[si], d);
        const double s = sv * std::sqrt(static_cast<double>(d));
        const double h = mean(r.entropy), h_theory = rem_entropy(s, n);
        std::vector<double> support(r.entropy.size());
        for (std::size_t i = 0; i < support.size(); ++i) support[i] = std::exp(r.entropy[i]);
        const NormStats gq = norm_stats(r.grad_q, dead_q), gk = norm_stats(r.grad_k, dead_k),
                        gs = norm_stats(r.grad_logits, dead_s);
        json row = {
            {"d", d},
            {"n_keys", n},
            {"scale", scale_name(kScales[si])},
            {"scale_value", sv},
            {"rows", rows},
            {"draws", draws},
            {"logit_std", s},
            {"logit_std_measured", std::sqrt(logit_var[si])},
            {"entropy", h},
            {"entropy_theory", or_null(h_theory)},
            {"entropy_annealed", rem_annealed_entropy(s, n)},
            {"entropy_frozen", s > rem_freezing_s(n) ? json(rem_frozen_entropy(s, n)) : json()},
            {"z_relative_variance", num(rem_z_relative_variance(s, n))},
            {"regime", rem_regime(s, n)},
            {"max_prob", mean(r.max_prob)},
            {"max_prob_ci_low", at(si, 2).low},
            {"max_prob_ci_high", at(si, 2).high},
            {"effective_support", mean(support)},
            {"jacobian_norm", mean(r.jacobian_norm)}};
        put_stats(row, "grad_q", gq);
        row["grad_q_norm_ci_low"] = at(si, 0).low;
        row["grad_q_norm_ci_high"] = at(si, 0).high;
        row["grad_q_median_ratio"] = num(ratio(si).estimate);
        row["grad_q_median_ratio_ci_low"] = num(ratio(si).low);
        row["grad_q_median_ratio_ci_high"] = num(ratio(si).high);
        row["grad_q_dead_ci_low"] = at(si, 1).low;
        row["grad_q_dead_ci_high"] = at(si, 1).high;
        row["grad_q_dead_theory"] = predicted_dead_fraction(sv, d, n, dead_q);
        row["dead_threshold_q"] = dead_q;
        put_stats(row, "grad_k", gk);
        put_stats(row, "grad_logits", gs);
        table.push_back(row);
        if (si == 0 && first_parted[ni] < 0 && std::fabs(h - h_theory) > 0.1 * ln_n) {
          first_parted[ni] = d;
        }
        if (want_hist && si < 2) {
          // Bins over +-5 s of the theory's standard deviation s.
          std::vector<std::int64_t> count(kHistBins, 0);
          const double lo = -5 * s, width = 10 * s / kHistBins;
          for (double z : r.logits) {
            const auto b = static_cast<std::int64_t>(std::floor((z - lo) / width));
            if (b >= 0 && b < kHistBins) ++count[b];
          }
          const double total = static_cast<double>(r.logits.size());
          for (int b = 0; b < kHistBins; ++b) {
            const double c = lo + (b + 0.5) * width;
            hist.push_back({{"d", d},
                            {"scale", scale_name(kScales[si])},
                            {"bin_low", lo + b * width},
                            {"bin_high", lo + (b + 1) * width},
                            {"count", count[b]},
                            {"density", count[b] / (total * width)},
                            {"theory_density", std::exp(-0.5 * c * c / (s * s)) /
                                                   (s * std::sqrt(2 * std::numbers::pi))}});
          }
        }
      }
      // The C7 cell: unscaled (0) against 1/sqrt(d) (kReference) on the same rows.
      C7Cell cell;
      cell.d = d;
      cell.n = n;
      cell.median_ratio_low = ratio(0).low;
      cell.median_ratio_high = ratio(0).high;
      cell.unscaled_dead_low = at(0, 1).low;
      cell.scaled_dead_low = at(kReference, 1).low;
      cell.scaled_dead_high = at(kReference, 1).high;
      cell.mean_ratio = mean(res[0].grad_q) / mean(res[kReference].grad_q);
      cells.push_back(cell);
      const std::string cv = verdict_c7_cell(cell);
      region.push_back({{"d", d},
                        {"n_keys", n},
                        {"rows", rows},
                        {"draws", draws},
                        {"regime_unscaled", rem_regime(std::sqrt(static_cast<double>(d)), n)},
                        {"unscaled_max_prob", at(0, 2).estimate},
                        {"unscaled_dead", at(0, 1).estimate},
                        {"unscaled_dead_ci_low", at(0, 1).low},
                        {"unscaled_dead_ci_high", at(0, 1).high},
                        {"unscaled_dead_theory", predicted_dead_fraction(1.0, d, n, dead_q)},
                        {"scaled_dead", at(kReference, 1).estimate},
                        {"scaled_dead_ci_high", at(kReference, 1).high},
                        {"median_ratio", num(ratio(0).estimate)},
                        {"median_ratio_ci_low", num(ratio(0).low)},
                        {"median_ratio_ci_high", num(ratio(0).high)},
                        {"mean_ratio", num(cell.mean_ratio)},
                        {"verdict", cv}});
      if (n == 128 && (d == 64 || d == 1024)) {
        cell_text += say(
            options.lang,
            "{}d = {}, N = {}: median |dQ| unscaled / scaled {:.3g} [{:.3g}, {:.3g}], mean ratio "
            "{:.3g}, unscaled dead {:.1f}% [{:.1f}, {:.1f}] (top-two-gap prediction {:.1f}%), "
            "scaled dead {:.1f}% (upper {:.1f}%), unscaled max prob {:.3f}: {}",
            "{}d = {}，N = {}：|dQ| 中位数之比（未缩放/缩放）{:.3g} [{:.3g}, {:.3g}]，均值之比 "
            "{:.3g}，未缩放时死亡 {:.1f}% [{:.1f}, {:.1f}]（由最大两个 logits 的间隔预测 "
            "{:.1f}%），"
            "缩放时死亡 {:.1f}%（上界 {:.1f}%），未缩放时最大概率 {:.3f}：{}",
            cell_text.empty() ? "" : clause_separator(options.lang), d, n, ratio(0).estimate,
            ratio(0).low, ratio(0).high, cell.mean_ratio, 100 * at(0, 1).estimate,
            100 * at(0, 1).low, 100 * at(0, 1).high,
            100 * predicted_dead_fraction(1.0, d, n, dead_q), 100 * at(kReference, 1).estimate,
            100 * at(kReference, 1).high, at(0, 2).estimate, cell_word(cv, options.lang));
      }
      progress.advance();
    }
  }
  // Both sides of the freezing transition along s, for Gaussian logits.
  const Curve curve = entropy_curve(options);
  json curve_table = json::array();
  std::vector<double> parted_s(std::size(kNs), -1), frozen_err(std::size(kNs), 0),
      liquid_err(std::size(kNs), 0);
  std::vector<int> frozen_count(std::size(kNs), 0), liquid_count(std::size(kNs), 0);
  for (std::size_t ni = 0; ni < std::size(kNs); ++ni) {
    const double n = kNs[ni], ln_n = std::log(n);
    for (std::size_t k = 0; k < curve.s.size(); ++k) {
      const double sv = curve.s[k], h = curve.entropy[ni][k];
      const double annealed = rem_annealed_entropy(sv, n);
      const std::string regime = rem_regime(sv, n);
      if (parted_s[ni] < 0 && std::fabs(h - annealed) > 0.1 * ln_n) parted_s[ni] = sv;
      if (regime == "frozen" && sv >= kDeepFrozen * rem_freezing_s(n)) {
        frozen_err[ni] = std::max(frozen_err[ni], std::fabs(h - rem_frozen_entropy(sv, n)));
        ++frozen_count[ni];
      } else if (regime == "liquid") {
        liquid_err[ni] = std::max(liquid_err[ni], std::fabs(h - annealed));
        ++liquid_count[ni];
      }
      curve_table.push_back(
          {{"n_keys", kNs[ni]},
           {"s", sv},
           {"d_unscaled", sv * sv},
           {"entropy", h},
           {"entropy_theory", or_null(rem_entropy(sv, n))},
           {"entropy_annealed", annealed},
           {"entropy_frozen", sv > rem_freezing_s(n) ? json(rem_frozen_entropy(sv, n)) : json()},
           {"z_relative_variance", num(rem_z_relative_variance(sv, n))},
           {"regime", regime}});
    }
  }
  std::string freeze_text;
  for (std::size_t ni = 0; ni < std::size(kNs); ++ni) {
    const double n = kNs[ni];
    const double fd = 2 * std::log(n);
    const json ps = parted_s[ni] < 0 ? json() : json(parted_s[ni]);
    const json pd = parted_s[ni] < 0 ? json() : json(parted_s[ni] * parted_s[ni]);
    freezing.push_back({{"n_keys", kNs[ni]},
                        {"freezing_d", fd},
                        {"freezing_s", std::sqrt(fd)},
                        {"crossover_s", rem_crossover_s(n)},
                        {"parted_s", ps},
                        {"parted_d", pd},
                        {"first_parted_d", first_parted[ni] < 0 ? json() : json(first_parted[ni])},
                        {"liquid_max_error", liquid_count[ni] ? json(liquid_err[ni]) : json()},
                        {"frozen_max_error", frozen_count[ni] ? json(frozen_err[ni]) : json()}});
    freeze_text += say(
        options.lang,
        "{}N = {}: crossover (Var Z/(EZ)^2 = 1) at s = {:.2f}, annealed line parted by 10% of ln N "
        "at s = {}, freezing at s = {:.2f} (d = {:.1f}); largest |measured - theory| {} nats on "
        "the liquid side, {} nats deep on the frozen side (s >= 1.5 s_c, against "
        "Poisson-Dirichlet)",
        "{}N = {}：交叉点（Var Z/(EZ)^2 = 1）在 s = {:.2f}，退火线在 s = {} 处偏离 ln N 的 10%，"
        "冻结点 s = {:.2f}（d = {:.1f}）；|测量 - 理论| 的最大值在液相一侧为 {} nats，在冻结相深处"
        "（s >= 1.5 s_c，对照 Poisson-Dirichlet）为 {} nats",
        freeze_text.empty() ? "" : clause_separator(options.lang), kNs[ni], rem_crossover_s(n),
        parted_s[ni] < 0 ? std::string("-") : fmt::format("{:g}", parted_s[ni]), std::sqrt(fd), fd,
        liquid_count[ni] ? fmt::format("{:.2f}", liquid_err[ni]) : "-",
        frozen_count[ni] ? fmt::format("{:.2f}", frozen_err[ni]) : "-");
  }
  result["tables"]["entropy_curve"] = curve_table;
  result["tables"]["saturation"] = table;
  result["tables"]["c7_region"] = region;
  result["tables"]["freezing"] = freezing;
  result["tables"]["score_histogram"] = hist;
  result["tables"]["alternatives"] = alternatives_table(options);
  // What the alternatives say when q and k have grown 4x, at the table's largest d.
  const json& alternatives = result["tables"]["alternatives"];
  int alt_d = 0;
  for (const auto& row : alternatives) alt_d = std::max(alt_d, row["d"].get<int>());
  std::string alt_text;
  for (const auto& row : alternatives) {
    if (row["sigma"] != 4.0 || row["d"] != alt_d || row["method"] == "1") {
      continue;
    }
    alt_text += say(
        options.lang, "{}{} std {:.3g}, max prob {:.2f}", "{}{}：标准差 {:.3g}，最大概率 {:.2f}",
        alt_text.empty() ? "" : clause_separator(options.lang), row["method"].get<std::string>(),
        row["logit_std"].get<double>(), row["max_prob"].get<double>());
  }

  int holds = 0, fails = 0, undecided = 0;
  for (const auto& c : cells) {
    const std::string v = verdict_c7_cell(c);
    holds += v == "holds";
    fails += v == "fails";
    undecided += v == "undecided";
  }
  const Lang lang = options.lang;
  result["claims"].push_back(make_claim(
      "C7", lang,
      pick(
          lang,
          "Scores of standard deviation s over N keys: entropy ln N - s^2/2 while (e^{s^2} - "
          "1)/N << 1 (random energy model), Poisson-Dirichlet weights with entropy psi(1) - "
          "psi(1 - s_c/s) past s_c = sqrt(2 ln N). Unscaled, s = sqrt(d): frozen once d > 2 ln N "
          "(5.5 at N = 16, 18 at N = 8192); scaled, s = 1: never. In a frozen row the top two "
          "logits lie about s Exp/sqrt(2 ln N) apart, so a fraction exp(-t* a_N/sqrt(d)) of rows "
          "keeps a gradient below the dead threshold (t* = ln(gradient scale / threshold)).",
          "N 个键、标准差为 s 的分数：当 (e^{s^2} - 1)/N << 1 时熵为 ln N - s^2/2（随机能量模型），"
          "超过 s_c = sqrt(2 ln N) 后权重服从 Poisson-Dirichlet 分布，熵为 psi(1) - "
          "psi(1 - s_c/s)。未缩放时 s = sqrt(d)：一旦 d > 2 ln N 就冻结（N = 16 时为 5.5，"
          "N = 8192 时为 18）；缩放后 s = 1：永不冻结。在冻结的行中，最大的两个 logits 相距约 "
          "s Exp/sqrt(2 ln N)，因此有 exp(-t* a_N/sqrt(d)) 比例的行梯度低于死亡阈值"
          "（t* = ln(梯度尺度 / 阈值)）。"),
      say(lang,
          "{} (d, N) cells, {} query rows each from {} K/V draws, 95% bootstrap intervals over "
          "rows: holds in {}, fails in {}, undecided in {} (d = 1, where the scales coincide, not "
          "counted). {}",
          "{} 个 (d, N) 单元，每个单元 {} 个查询行，来自 {} 次 K/V 抽样，按行的 95% bootstrap "
          "区间：{} 个成立，{} 个不成立，{} 个无法判断（d = 1 时两种缩放相同，不计入）。{}",
          cells.size(), rows, draws, holds, fails, undecided, cell_text),
      verdict_saturation_region(cells, lang),
      pick(lang,
           "A cell holds when the unscaled median |dQ| is below the scaled one (the ratio's "
           "interval below 1), significantly more unscaled rows are dead, and at most 1% of "
           "scaled rows are (upper bound); dead = below 1e-3 x the uniform-attention |dQ| at "
           "1/sqrt(d), sqrt(d(N-1))/N. Entropy of N Gaussian logits against the theory: ",
           "一个单元成立，当且仅当未缩放的 |dQ| 中位数低于缩放的（比值的区间低于 1）、未缩放时"
           "死亡的行显著更多、且缩放时至多 1% 的行死亡（上界）；死亡 = 低于 1/sqrt(d) 下均匀注意力"
           "的 |dQ|（sqrt(d(N-1))/N）的 1e-3 倍。N 个高斯 logits 的熵与理论对比：") +
          freeze_text +
          pick(lang,
               ". The mean gradient misleads: unscaled, most rows die while near-tied rows "
               "explode. ",
               "。平均梯度会误导人：未缩放时大多数行死亡，而几乎并列的行梯度爆炸。") +
          say(lang,
              "1/sqrt(d) assumes unit-variance q and k; with both grown 4x (d = {}, N = 1024, "
              "table alternatives): ",
              "1/sqrt(d) 假定 q 和 k 为单位方差；两者都放大 4 倍时（d = {}，N = 1024，"
              "alternatives 表）：",
              alt_d) +
          alt_text +
          pick(lang, ". Only QK-norm keeps the logits at std 1 whatever their size.",
               "。只有 QK-norm 能让 logits 无论 q、k 多大都保持标准差 1。")));
  return result;
}

}  // namespace sdpa::lab

namespace sdpa::lab {

const Experiment& saturation_experiment() {
  auto saturation_columns = [] {
    std::vector<Column> c = {
        {"d", Kind::integer, "", "dimension of q and k"},
        {"n_keys", Kind::integer, "", "N, keys per query"},
        {"scale", Kind::text, "", "`\"1\"`, `\"1/sqrt(d)\"` or `\"1/d\"`"},
        {"scale_value", Kind::number, "", "the scale as a number"},
        {"rows", Kind::integer, "",
         "query rows measured, pooled over the draws: 256 in quick mode (4 draws × 64), 1024 in "
         "full (8 × 128); the same Q, K, V, dO for the three scales of a cell"},
        {"draws", Kind::integer, "",
         "independent K/V draws (each with its own queries and dO), the bootstrap's strata"},
        {"logit_std", Kind::number, "", "theory `s = scale·sqrt(d)`"},
        {"logit_std_measured", Kind::number, "",
         "measured standard deviation of `scale·q·k` (root mean square over the draws)"},
        {"entropy", Kind::number, "nats", "mean over rows"},
        {"entropy_theory", Kind::number, "nats",
         "the random-energy-model entropy at `s`: `ln N − s²/2` below `s_c = sqrt(2 ln N)`, the "
         "Poisson-Dirichlet `ψ(1) − ψ(1 − s_c/s)` from `1.5 s_c` on, null in between (neither "
         "law applies there: the first reaches 0 at `s_c`, the second diverges at `s_c`)",
         true},
        {"entropy_annealed", Kind::number, "nats",
         "`ln N − s²/2`, the annealed (liquid-side) result; negative past `s_c`, where it no "
         "longer "
         "applies"},
        {"entropy_frozen", Kind::number, "nats",
         "`ψ(1) − ψ(1 − m)`, m = `s_c/s`: the expected entropy of Poisson-Dirichlet PD(m, 0) "
         "weights, the frozen side; null for `s ≤ s_c`",
         true},
        {"z_relative_variance", Kind::number, "",
         "`(e^{s²} − 1)/N` = Var Z/(E Z)²: the annealed line holds while it is small; it reaches "
         "1 at `s² = ln(N + 1)`"},
        {"regime", Kind::text, "",
         "`\"liquid\"` while `(e^{s²} − 1)/N < 1`, `\"crossover\"` from there to `s_c`, "
         "`\"frozen\"` past `s_c = sqrt(2 ln N)`"},
        {"max_prob", Kind::number, "", "largest probability, mean over rows"},
        {"max_prob_ci_low", Kind::number, "",
         "95% bootstrap interval of `max_prob`, low end (rows resampled within each draw)"},
        {"max_prob_ci_high", Kind::number, "", "the same, high end"},
        {"effective_support", Kind::number, "keys", "mean of `exp(H)`"},
        {"jacobian_norm", Kind::number, "", "mean Frobenius norm of `diag(p) − p pᵀ`"}};
    std::vector<Column> g = gradient_columns("at the cell's d and N");
    // Beside the dQ columns: their bootstrap intervals, the ratio to 1/sqrt(d), the prediction.
    std::vector<Column> q_extra = {
        {"grad_q_norm_ci_low", Kind::number, "",
         "95% bootstrap interval of the median |dQ|, low end (rows resampled within each draw, "
         "1000 replicates quick, 2000 full)"},
        {"grad_q_norm_ci_high", Kind::number, "", "the same, high end"},
        {"grad_q_median_ratio", Kind::number, "",
         "median |dQ| over the median |dQ| of `1/sqrt(d)` on the same rows"},
        {"grad_q_median_ratio_ci_low", Kind::number, "",
         "95% paired bootstrap interval of the ratio, low end"},
        {"grad_q_median_ratio_ci_high", Kind::number, "", "the same, high end"},
        {"grad_q_dead_ci_low", Kind::number, "",
         "95% bootstrap interval of `grad_q_dead`, low end"},
        {"grad_q_dead_ci_high", Kind::number, "", "the same, high end"},
        {"grad_q_dead_theory", Kind::number, "",
         "the top-two-gap prediction `exp(−t*·a_N/s)`, `t* = ln(G/threshold)`, "
         "`G = scale·2d·sqrt(2/π)`, `a_N ≈ sqrt(2 ln N)` to second order (`src/lab/rem.h`); a "
         "frozen-phase approximation"},
        {"dead_threshold_q", Kind::number, "",
         "the dQ norm below which a row is dead: `1e-3·sqrt(d(N−1))/N`"}};
    c.insert(c.end(), g.begin(), g.begin() + 4);
    c.insert(c.end(), q_extra.begin(), q_extra.end());
    c.insert(c.end(), g.begin() + 4, g.end());
    return c;
  };
  static const Experiment e{
      "saturation",
      "C7: entropy and gradient distributions over (d, N), scales 1, 1/sqrt(d), 1/d",
      run_saturation,
      {{"saturation",
        "one per (d, N, scale), d ∈ {1, 4, 8, 16, 32, 64, 256, 1024}, N ∈ {16, 128, 1024, 4096} "
        "(full: 8192 for 4096)",
        saturation_columns()},
       {"c7_region",
        "one per (d, N): the C7 verdict of the cell, unscaled against `1/sqrt(d)` on the same rows",
        {{"d", Kind::integer, "", "dimension of q and k"},
         {"n_keys", Kind::integer, "", "N"},
         {"rows", Kind::integer, "", "query rows (pooled over the draws)"},
         {"draws", Kind::integer, "", "K/V draws"},
         {"regime_unscaled", Kind::text, "", "`regime` of the unscaled logits (s = √d)"},
         {"unscaled_max_prob", Kind::number, "", "mean max probability, scale 1"},
         {"unscaled_dead", Kind::number, "", "fraction of dead dQ rows, scale 1"},
         {"unscaled_dead_ci_low", Kind::number, "", "95% bootstrap interval, low end"},
         {"unscaled_dead_ci_high", Kind::number, "", "95% bootstrap interval, high end"},
         {"unscaled_dead_theory", Kind::number, "", "the top-two-gap prediction"},
         {"scaled_dead", Kind::number, "", "fraction of dead dQ rows, `1/sqrt(d)`"},
         {"scaled_dead_ci_high", Kind::number, "", "its 95% bootstrap upper bound"},
         {"median_ratio", Kind::number, "", "median |dQ| unscaled / scaled"},
         {"median_ratio_ci_low", Kind::number, "", "95% paired bootstrap interval, low end"},
         {"median_ratio_ci_high", Kind::number, "", "95% paired bootstrap interval, high end"},
         {"mean_ratio", Kind::number, "", "mean |dQ| unscaled / scaled"},
         {"verdict", Kind::text, "",
          "`\"holds\"`: ratio interval below 1, unscaled dead low end above the scaled high end, "
          "scaled dead high end ≤ 1%; `\"fails\"`: ratio interval above 1 or scaled dead low "
          "end > 1%; `\"undecided\"` otherwise; `\"equal\"` at d = 1 (the scales coincide)"}}},
       {"freezing",
        "one per N",
        {{"n_keys", Kind::integer, "", "N"},
         {"freezing_d", Kind::number, "", "`2 ln N`: unscaled attention freezes past it"},
         {"freezing_s", Kind::number, "", "`sqrt(2 ln N)`"},
         {"crossover_s", Kind::number, "",
          "`sqrt(ln(N + 1))`: where `Var Z/(E Z)² = (e^{s²} − 1)/N` reaches 1, the finite-N end "
          "of the annealed line"},
         {"parted_s", Kind::number, "",
          "the smallest s of `entropy_curve` where measured entropy and theory differ by more "
          "than 10% of `ln N` (null if none)",
          true},
         {"parted_d", Kind::number, "", "`parted_s²`", true},
         {"first_parted_d", Kind::number, "",
          "the first d of `saturation` (scale `\"1\"`) where the entropy leaves `entropy_theory` "
          "by more than 10% of `ln N` (null if none)",
          true},
         {"liquid_max_error", Kind::number, "nats",
          "largest |measured − annealed| over the `\"liquid\"` points of `entropy_curve`", true},
         {"frozen_max_error", Kind::number, "nats",
          "largest |measured − Poisson-Dirichlet| over the points deep in the frozen phase, "
          "`s ≥ 1.5 s_c` (PD is the N → ∞ law and diverges at `s_c`)",
          true}}},
       {"entropy_curve",
        "one per (N, s), s = 0.25, 0.5, …, 8: softmax over N independent `N(0, s²)` logits (64 "
        "rows quick, 512 full)",
        {{"n_keys", Kind::integer, "", "N"},
         {"s", Kind::number, "", "standard deviation of the logits"},
         {"d_unscaled", Kind::number, "", "`s²`: the d whose unscaled scores have this s"},
         {"entropy", Kind::number, "nats", "the library's softmax, mean over rows"},
         {"entropy_theory", Kind::number, "nats",
          "`ln N − s²/2` below `s_c`, `ψ(1) − ψ(1 − s_c/s)` from `1.5 s_c` on, null in between",
          true},
         {"entropy_annealed", Kind::number, "nats", "`ln N − s²/2`"},
         {"entropy_frozen", Kind::number, "nats", "`ψ(1) − ψ(1 − s_c/s)`; null for `s ≤ s_c`",
          true},
         {"z_relative_variance", Kind::number, "", "`(e^{s²} − 1)/N`"},
         {"regime", Kind::text, "",
          "`\"liquid\"`, `\"crossover\"` or `\"frozen\"`, as in `saturation`"}}},
       {"score_histogram",
        "one per (d, scale, bin): scores `scale·q·k` for scale `\"1\"` and `\"1/sqrt(d)\"` at "
        "d ∈ {16, 256, 1024}, N = 1024, 40 bins over ±5s",
        {{"d", Kind::integer, "", "dimension of q and k"},
         {"scale", Kind::text, "", "`\"1\"` or `\"1/sqrt(d)\"`"},
         {"bin_low", Kind::number, "", "left edge of the bin"},
         {"bin_high", Kind::number, "", "right edge of the bin"},
         {"count", Kind::integer, "scores", "scores in the bin"},
         {"density", Kind::number, "", "`count / (total · width)`"},
         {"theory_density", Kind::number, "", "the normal density `N(0, s²)` at the bin centre"}}},
       alternatives_table_schema()},
      {{"saturation",
        {"d", "n_keys", "scale", "entropy", "entropy_theory", "regime", "max_prob", "grad_q_norm",
         "grad_q_mean", "grad_q_p99", "grad_q_dead", "grad_q_dead_theory", "grad_logits_dead"},
        [](const json& r) { return r["n_keys"].get<int>() == 1024; }},
       {"c7_region",
        {"d", "n_keys", "regime_unscaled", "median_ratio", "median_ratio_ci_low",
         "median_ratio_ci_high", "unscaled_dead", "unscaled_dead_theory", "scaled_dead_ci_high",
         "verdict"},
        nullptr},
       {"freezing",
        {"n_keys", "freezing_d", "crossover_s", "freezing_s", "parted_s", "liquid_max_error",
         "frozen_max_error"},
        nullptr}}};
  return e;
}

}  // namespace sdpa::lab
