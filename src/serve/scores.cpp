// Panel 1: the scores q.k of N keys against a few query rows, their scaling, and what the
// softmax makes of them. The work is bounded: the rows are as many as kDotBudget allows (at
// least kMinRows), so one request costs O(kDotBudget + N d) whatever d and N are.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <vector>

#include "histogram.h"
#include "keys.h"
#include "lab/stats.h"
#include "params.h"
#include "serve.h"

namespace sdpa::serve {

namespace {

// 2^23 multiply-adds of q.k: with N d = 2^22 (N = 4096, d = 1024) that is 2 rows' worth,
// so the kMinRows = 8 floor decides there; drawing the N d key components costs more than the
// products. Measured on Zen 5 with 2 threads: about 60 ms for that case (docs/serve.md).
constexpr double kDotBudget = 8388608.0;
constexpr int kMinRows = 8, kMaxRows = 256;
constexpr int kTopProbs = 64;
// A row's gradient is "dead" below a thousandth of the median under 1/sqrt(d) for the same
// q and k (the threshold of the lab's alternatives table).
constexpr double kDeadFraction = 1e-3;

double normal_pdf(double x, double m, double v) {
  if (!(v > 0)) return 0;
  const double t = (x - m) / std::sqrt(v);
  return std::exp(-0.5 * t * t) / std::sqrt(2 * std::numbers::pi * v);
}

struct RowOut {
  double entropy = 0, max_prob = 0, jacobian = 0, grad = 0, grad_baseline = 0;
};

}  // namespace

json compute_scores(const json& request) {
  const auto t0 = std::chrono::steady_clock::now();
  Params p(request);
  const int d = p.integer("d", 1, 4096, 64);
  const int n = p.integer("n", 1, 16384, 1024);
  const InputSpec in = read_inputs(p);
  const ScaleSpec scale = read_scale(p);
  const int bins = p.integer("bins", 8, 200, 60);
  const bool want_logits = p.boolean("logits", false);
  p.finish();

  if (std::int64_t(n) * d > kMaxKeyComponents) {
    throw ParamError("n",
                     fmt::format("n * d must be at most {} (4096 keys of d = 4096), got {} * {}",
                                 kMaxKeyComponents, n, d));
  }
  const double nd = double(n) * d;
  const int rows =
      static_cast<int>(std::clamp(std::floor(kDotBudget / nd), double(kMinRows), double(kMaxRows)));
  const double c = scale.factor(d), rd = std::sqrt(double(d));

  // pass 1: the query rows, then every key against every row, from the keys' raw draws:
  // q.k = a_j sum(q) + b q.z_j, |k|^2 = d a_j^2 + 2 a_j b sum(z_j) + b^2 |z_j|^2.
  std::vector<double> q(static_cast<std::size_t>(rows) * d), q_sum(rows), q_norm(rows);
  for (int r = 0; r < rows; ++r) {
    double* qr = q.data() + std::size_t(r) * d;
    q_sum[r] = draw_query(in, r, d, qr);
    double s2 = 0;
    for (int i = 0; i < d; ++i) s2 += qr[i] * qr[i];
    q_norm[r] = std::sqrt(s2);
  }
  const std::shared_ptr<const KeyBlock> keys = key_block(in, n, d);
  const KeyMap map(in);
  std::vector<double> x(static_cast<std::size_t>(rows) * n), k_norm(n);
#pragma omp parallel for schedule(static)
  for (int j = 0; j < n; ++j) {
    const float* zj = keys->row(j);
    const double a = map.a(keys->shared[j], in), b = map.b;
    double sz = 0, sz2 = 0;
#pragma omp simd reduction(+ : sz, sz2)
    for (int i = 0; i < d; ++i) {
      sz += zj[i];
      sz2 += double(zj[i]) * zj[i];
    }
    k_norm[j] = std::sqrt(std::max(0.0, d * a * a + 2 * a * b * sz + b * b * sz2));
    for (int r = 0; r < rows; ++r) {
      x[std::size_t(r) * n + j] = a * q_sum[r] + b * dot(q.data() + std::size_t(r) * d, zj, d);
    }
  }

  // pass 2: scale each row, softmax it (the library's), and send a random upstream gradient
  // dP ~ N(0, 1) back through softmax_backward; the same under 1/sqrt(d) sets the dead line.
  std::vector<double> z(static_cast<std::size_t>(rows) * n), row0_p(n);
  std::vector<RowOut> out(rows);
#pragma omp parallel
  {
    std::vector<double> pr(n), dp(n), ds(n), z0(n);
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const double* xr = x.data() + std::size_t(r) * n;
      double* zr = z.data() + std::size_t(r) * n;
      for (int j = 0; j < n; ++j) {
        switch (scale.kind) {
          case ScaleSpec::qk_norm: {
            const double denom = q_norm[r] * k_norm[j];
            zr[j] = denom > 0 ? c * xr[j] / denom : 0.0;
            break;
          }
          case ScaleSpec::softcap:
            zr[j] = scale.cap * std::tanh(c * xr[j] / scale.cap);
            break;
          default:
            zr[j] = c * xr[j];
        }
      }
      softmax<double>(std::span<const double>(zr, n), pr);
      lab::Stream st(in.seed, kGradStream + r);
      for (double& v : dp) v = st.normal();
      softmax_backward<double>(pr, dp, ds);
      double g2 = 0;
      for (int j = 0; j < n; ++j) {
        // softcap: back through the cap, to the logits before it.
        const double t = scale.kind == ScaleSpec::softcap
                             ? 1.0 - (zr[j] / scale.cap) * (zr[j] / scale.cap)
                             : 1.0;
        g2 += ds[j] * t * ds[j] * t;
      }
      RowOut& o = out[r];
      o.entropy = lab::entropy(pr);
      o.max_prob = *std::max_element(pr.begin(), pr.end());
      o.jacobian = lab::jacobian_frobenius(pr);
      o.grad = std::sqrt(g2);
      if (r == 0) row0_p = pr;
      for (int j = 0; j < n; ++j) z0[j] = xr[j] / rd;
      softmax<double>(z0, pr);
      softmax_backward<double>(pr, dp, ds);
      double b2 = 0;
      for (double v : ds) b2 += v * v;
      o.grad_baseline = std::sqrt(b2);
    }
  }

  // The histogram of every scaled score and its closed form.
  const ScoreMoments th = score_moments(in, scale, d);
  double sz = 0, sz2 = 0, sx = 0, sx2 = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    sz += z[i];
    sx += x[i];
  }
  const double count = double(z.size());
  const double mz = sz / count, mx = sx / count;
  for (std::size_t i = 0; i < z.size(); ++i) {
    sz2 += (z[i] - mz) * (z[i] - mz);
    sx2 += (x[i] - mx) * (x[i] - mx);
  }
  const double var_z = count > 1 ? sz2 / (count - 1) : 0.0;
  const double var_x = count > 1 ? sx2 / (count - 1) : 0.0;
  const Range range = quantile_range(z);
  json hist = histogram(z, range, bins);
  constexpr int kCurve = 161;
  std::vector<double> cx(kCurve), cy(kCurve);
  // softcap: the density of cap tanh(y / cap) for y normal with the pre-cap moments.
  const double pre_m = c * dot_mean(in, d), pre_v = c * c * dot_variance(in, d);
  for (int i = 0; i < kCurve; ++i) {
    const double v = range.lo + (range.hi - range.lo) * i / (kCurve - 1);
    cx[i] = v;
    if (scale.kind == ScaleSpec::softcap) {
      const double u = v / scale.cap;
      cy[i] = std::fabs(u) < 1 ? normal_pdf(scale.cap * std::atanh(u), pre_m, pre_v) / (1 - u * u)
                               : 0.0;
    } else {
      cy[i] = normal_pdf(v, th.mean, th.variance);
    }
  }

  // One row's softmax: its largest probabilities, in order.
  std::vector<double> sorted = row0_p;
  const int top = std::min(n, kTopProbs);
  std::partial_sort(sorted.begin(), sorted.begin() + top, sorted.end(), std::greater<>());
  sorted.resize(top);
  const double ln_n = std::log(double(n));
  // The random energy model: for scores of standard deviation s in a row, the entropy is
  // ln N - s^2 / 2 while s^2 < 2 ln N (liquid); beyond, the softmax freezes onto a few keys.
  const double s2 = th.row_variance;
  const bool liquid = s2 < 2 * ln_n;

  std::vector<double> ent(rows), maxp(rows), g(rows), gb(rows);
  for (int r = 0; r < rows; ++r) {
    ent[r] = out[r].entropy;
    maxp[r] = out[r].max_prob;
    g[r] = out[r].grad;
    gb[r] = out[r].grad_baseline;
  }
  const double baseline_median = lab::quantile(gb, 0.5);
  const lab::NormStats gs = lab::norm_stats(g, kDeadFraction * baseline_median);
  // Gradient sizes on a log10 axis; exact zeros (a one-hot softmax) are counted apart.
  std::vector<double> lg;
  int zeros = 0;
  for (double v : g) {
    if (v > 0) {
      lg.push_back(std::log10(v));
    } else {
      ++zeros;
    }
  }
  Range grange{-1, 1};
  if (!lg.empty()) {
    const auto [mn, mxl] = std::minmax_element(lg.begin(), lg.end());
    grange = {std::floor(*mn * 2) / 2 - 0.25, std::ceil(*mxl * 2) / 2 + 0.25};
  }
  json ghist = histogram(lg, grange, 24);

  json row = {{"probs_sorted", sorted},
              {"entropy", out[0].entropy},
              {"ln_n", ln_n},
              {"max_prob", out[0].max_prob},
              {"jacobian_norm", out[0].jacobian},
              {"grad_norm", out[0].grad}};
  if (want_logits) {
    row["logits"] = std::vector<double>(z.begin(), z.begin() + n);
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return {{"d", d},
          {"n", n},
          {"rows", rows},
          {"samples", z.size()},
          {"scale", scale.name()},
          {"scale_factor", c},
          {"dist", in.dist},
          {"hist", hist},
          {"theory_curve", {{"x", cx}, {"density", cy}}},
          {"variance",
           {{"measured", var_z},
            {"theory", th.variance},
            {"exact", th.exact},
            {"mean", mz},
            {"mean_theory", th.mean}}},
          {"raw_variance",
           {{"measured", var_x},
            {"theory", dot_variance(in, d)},
            {"mean", mx},
            {"mean_theory", dot_mean(in, d)}}},
          {"row", row},
          {"rows_summary",
           {{"entropy_mean", lab::mean(ent)},
            {"max_prob_mean", lab::mean(maxp)},
            {"row_variance_theory", s2},
            {"entropy_theory", liquid ? json(ln_n - s2 / 2) : json(nullptr)},
            {"regime", liquid ? "liquid" : "frozen"}}},
          {"grad",
           {{"log10_hist", ghist},
            {"zeros", zeros},
            {"median", gs.median},
            {"dead_fraction", gs.dead},
            {"dead_threshold", kDeadFraction * baseline_median},
            {"baseline_median", baseline_median}}},
          {"ms", ms}};
}

}  // namespace sdpa::serve
