// Experiment `saturation` (claim C7): over d and the number of keys N, for scales 1, 1/sqrt(d)
// and 1/d, the softmax's entropy against the random-energy-model theory ln N - s^2/2, and the
// distribution (median, mean, tail, dead fraction) of the gradient reaching Q, K and the logits
// through the library's attention backward.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/probe.h"
#include "lab/random.h"
#include "lab/scales.h"
#include "lab/stats.h"
#include "lab/streams.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

constexpr int kDs[] = {16, 64, 256, 1024};
constexpr int kNs[] = {16, 128, 1024, 8192};
constexpr int kHistDs[] = {16, 256, 1024};
constexpr int kHistN = 1024;
constexpr int kHistBins = 40;

constexpr Scale kScales[] = {Scale::one, Scale::inv_sqrt_d, Scale::inv_d};
constexpr int kReference = 1;  // 1/sqrt(d): the dead threshold is relative to it

// Query rows per cell. The cost of a cell is rows * N * d; rows are fewer where N * d is large
// so that quick mode stays within seconds, yet never below 64 (a 99th percentile needs them).
int rows_for(int d, int n, bool full) {
  const double budget = full ? 6.0e7 : 6.0e6;  // rows * N * d per cell
  const int cap = full ? 1024 : 256;
  const int r = static_cast<int>(budget / (static_cast<double>(n) * d));
  return std::clamp(r, 64, cap);
}

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
  json table = json::array(), hist = json::array(), freezing = json::array();

  SaturationSummary summary;
  std::string evidence_rows;
  Progress progress(options.progress, "saturation",
                    static_cast<std::int64_t>(std::size(kDs)) * std::size(kNs));
  std::vector<double> first_parted(std::size(kNs), -1);
  for (int d : kDs) {
    for (std::size_t ni = 0; ni < std::size(kNs); ++ni) {
      const int n = kNs[ni];
      const int rows = rows_for(d, n, full);
      const ProbeInputs in =
          make_probe_inputs(options.seed, streams::kSaturation, d, n, rows, options.threads);
      const bool want_hist =
          n == kHistN && std::find(std::begin(kHistDs), std::end(kHistDs), d) != std::end(kHistDs);
      std::vector<ProbeResult> res;
      for (int si = 0; si < 3; ++si) {
        res.push_back(probe(in, scale_value(kScales[si], d), options.threads, want_hist && si < 2));
      }
      const ProbeResult& ref = res[kReference];
      const double dead_q = kDeadFactor * quantile(ref.grad_q, 0.5);
      const double dead_k = kDeadFactor * quantile(ref.grad_k, 0.5);
      const double dead_s = kDeadFactor * quantile(ref.grad_logits, 0.5);
      for (int si = 0; si < 3; ++si) {
        const ProbeResult& r = res[si];
        const double sv = scale_value(kScales[si], d);
        const double s = sv * std::sqrt(static_cast<double>(d));
        const double ln_n = std::log(static_cast<double>(n));
        const double h = mean(r.entropy), h_theory = ln_n - s * s / 2;
        std::vector<double> support(r.entropy.size());
        for (std::size_t i = 0; i < support.size(); ++i) support[i] = std::exp(r.entropy[i]);
        const NormStats gq = norm_stats(r.grad_q, dead_q), gk = norm_stats(r.grad_k, dead_k),
                        gs = norm_stats(r.grad_logits, dead_s);
        json row = {{"d", d},
                    {"n_keys", n},
                    {"scale", scale_name(kScales[si])},
                    {"scale_value", sv},
                    {"rows", rows},
                    {"logit_std", s},
                    {"logit_std_measured", r.logit_std},
                    {"entropy", h},
                    {"entropy_theory", h_theory},
                    {"regime", s * s < 2 * ln_n ? "liquid" : "frozen"},
                    {"max_prob", mean(r.max_prob)},
                    {"effective_support", mean(support)},
                    {"jacobian_norm", mean(r.jacobian_norm)}};
        put_stats(row, "grad_q", gq);
        put_stats(row, "grad_k", gk);
        put_stats(row, "grad_logits", gs);
        table.push_back(row);
        if (si == 0 && first_parted[ni] < 0 && std::fabs(h - h_theory) > 0.1 * ln_n) {
          first_parted[ni] = d;
        }
        if (n == 128) {
          if (si == 0) {
            evidence_rows += fmt::format(
                "{}d = {}: median |dQ| {:.3g} (1/sqrt(d): {:.3g}), mean "
                "{:.3g}, p99 {:.3g}, dead {:.0f}%",
                evidence_rows.empty() ? "" : "; ", d, gq.median, quantile(ref.grad_q, 0.5), gq.mean,
                gq.p99, 100 * gq.dead);
          }
          if (d == kDs[std::size(kDs) - 1]) {
            if (si == 0) {
              summary.unscaled_max_prob = mean(r.max_prob);
              summary.unscaled_dead = gq.dead;
              summary.unscaled_mean_ratio = gq.mean / mean(ref.grad_q);
            } else if (si == kReference) {
              summary.scaled_dead = gq.dead;
              summary.scaled_max_prob = mean(r.max_prob);
            }
          }
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
      progress.advance();
    }
  }
  // Where theory and measurement part along s, for Gaussian logits.
  const Curve curve = entropy_curve(options);
  json curve_table = json::array();
  std::vector<double> parted_s(std::size(kNs), -1);
  for (std::size_t ni = 0; ni < std::size(kNs); ++ni) {
    const double ln_n = std::log(static_cast<double>(kNs[ni]));
    for (std::size_t k = 0; k < curve.s.size(); ++k) {
      const double sv = curve.s[k], h = curve.entropy[ni][k], theory = ln_n - sv * sv / 2;
      if (parted_s[ni] < 0 && std::fabs(h - theory) > 0.1 * ln_n) parted_s[ni] = sv;
      curve_table.push_back({{"n_keys", kNs[ni]},
                             {"s", sv},
                             {"d_unscaled", sv * sv},
                             {"entropy", h},
                             {"entropy_theory", theory},
                             {"regime", sv * sv < 2 * ln_n ? "liquid" : "frozen"}});
    }
  }
  std::string freeze_text;
  for (std::size_t ni = 0; ni < std::size(kNs); ++ni) {
    const double fd = 2 * std::log(static_cast<double>(kNs[ni]));
    const json ps = parted_s[ni] < 0 ? json() : json(parted_s[ni]);
    const json pd = parted_s[ni] < 0 ? json() : json(parted_s[ni] * parted_s[ni]);
    freezing.push_back(
        {{"n_keys", kNs[ni]},
         {"freezing_d", fd},
         {"freezing_s", std::sqrt(fd)},
         {"parted_s", ps},
         {"parted_d", pd},
         {"first_parted_d", first_parted[ni] < 0 ? json() : json(first_parted[ni])}});
    freeze_text += fmt::format(
        "{}N = {}: freezes at s = sqrt(2 ln N) = {:.2f} (d = {:.1f}), "
        "parted at s = {}",
        freeze_text.empty() ? "" : "; ", kNs[ni], std::sqrt(fd), fd,
        parted_s[ni] < 0 ? std::string("-") : fmt::format("{:g}", parted_s[ni]));
  }
  result["tables"]["entropy_curve"] = curve_table;
  result["tables"]["saturation"] = table;
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
    alt_text += fmt::format("{}{} std {:.3g}, max prob {:.2f}", alt_text.empty() ? "" : "; ",
                            row["method"].get<std::string>(), row["logit_std"].get<double>(),
                            row["max_prob"].get<double>());
  }

  result["claims"].push_back(make_claim(
      "C7", options.lang,
      "Scores of standard deviation s over N keys: entropy -> ln N - s^2/2 while s < sqrt(2 ln N) "
      "(random energy model), then the softmax freezes onto a few keys. Unscaled, s = sqrt(d): "
      "frozen once d > 2 ln N (5.5 at N = 16, 18 at N = 8192); scaled, s = 1: never.",
      fmt::format("d = 1024, N = 128: unscaled max prob {:.3f}, {:.0f}% of rows' dQ dead, mean "
                  "|dQ| {:.3g} x the scaled mean; scaled max prob {:.3f}, {:.1f}% dead. "
                  "Unscaled, N = 128: {}",
                  summary.unscaled_max_prob, 100 * summary.unscaled_dead,
                  summary.unscaled_mean_ratio, summary.scaled_max_prob, 100 * summary.scaled_dead,
                  evidence_rows),
      verdict_saturation(summary),
      "Entropy of N Gaussian logits against ln N - s^2/2 (parted: off by more than 10% of "
      "ln N): " +
          freeze_text +
          ". The mean gradient misleads: unscaled, most rows die while near-tied rows "
          "explode. " +
          fmt::format("1/sqrt(d) assumes unit-variance q and k; with both grown 4x (d = {}, "
                      "N = 1024, table alternatives): ",
                      alt_d) +
          alt_text + ". Only QK-norm keeps the logits at std 1 whatever their size."));
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
         "query rows measured: `6e6/(N·d)` clamped to 64…256 in quick mode, `6e7/(N·d)` clamped "
         "to 64…1024 in full; the same Q, K, V, dO for the three scales of a cell"},
        {"logit_std", Kind::number, "", "theory `s = scale·sqrt(d)`"},
        {"logit_std_measured", Kind::number, "", "measured standard deviation of `scale·q·k`"},
        {"entropy", Kind::number, "nats", "mean over rows"},
        {"entropy_theory", Kind::number, "nats",
         "`ln N − s²/2`, the random-energy-model result, valid while `s < sqrt(2 ln N)`; can be "
         "negative beyond, where it no longer applies"},
        {"regime", Kind::text, "", "`\"liquid\"` if `s² < 2 ln N`, else `\"frozen\"`"},
        {"max_prob", Kind::number, "", "largest probability, mean over rows"},
        {"effective_support", Kind::number, "keys", "mean of `exp(H)`"},
        {"jacobian_norm", Kind::number, "", "mean Frobenius norm of `diag(p) − p pᵀ`"}};
    for (auto& g : gradient_columns("`1/sqrt(d)` at the same d and N")) c.push_back(g);
    return c;
  };
  static const Experiment e{
      "saturation",
      "C7: entropy and gradient distributions over (d, N), scales 1, 1/sqrt(d), 1/d",
      run_saturation,
      {{"saturation", "one per (d, N, scale), d ∈ {16, 64, 256, 1024}, N ∈ {16, 128, 1024, 8192}",
        saturation_columns()},
       {"freezing",
        "one per N",
        {{"n_keys", Kind::integer, "", "N"},
         {"freezing_d", Kind::number, "", "`2 ln N`: unscaled attention freezes past it"},
         {"freezing_s", Kind::number, "", "`sqrt(2 ln N)`"},
         {"parted_s", Kind::number, "",
          "the smallest s of `entropy_curve` where measured entropy and theory differ by more "
          "than 10% of `ln N` (null if none)",
          true},
         {"parted_d", Kind::number, "", "`parted_s²`", true},
         {"first_parted_d", Kind::number, "",
          "the same test on the coarse d grid of `saturation`, scale `\"1\"` (null if none)",
          true}}},
       {"entropy_curve",
        "one per (N, s), s = 0.25, 0.5, …, 8: softmax over N independent `N(0, s²)` logits (64 "
        "rows quick, 512 full)",
        {{"n_keys", Kind::integer, "", "N"},
         {"s", Kind::number, "", "standard deviation of the logits"},
         {"d_unscaled", Kind::number, "", "`s²`: the d whose unscaled scores have this s"},
         {"entropy", Kind::number, "nats", "the library's softmax, mean over rows"},
         {"entropy_theory", Kind::number, "nats", "`ln N − s²/2`"},
         {"regime", Kind::text, "", "`\"liquid\"` if `s² < 2 ln N`, else `\"frozen\"`"}}},
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
         "grad_q_mean", "grad_q_p99", "grad_q_dead", "grad_logits_dead"},
        [](const json& r) { return r["n_keys"].get<int>() == 1024; }},
       {"freezing", {"n_keys", "freezing_d", "freezing_s", "parted_s", "parted_d"}, nullptr}}};
  return e;
}

}  // namespace sdpa::lab
