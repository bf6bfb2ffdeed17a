// Experiment `softmax` (claims C1, C2): the article's [1000, 10, 5] through the library's stable
// softmax, its Jacobian, the naive formula overflowing, and a sweep of softmax(c x) over c.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/lowp.h"
#include "lab/random.h"
#include "lab/stats.h"
#include "lab/streams.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

constexpr double kLn10 = std::numbers::ln10;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double log_sum_exp(const std::vector<double>& a) {
  double m = kNegInf;
  for (double v : a) m = std::max(m, v);
  if (m == kNegInf) return kNegInf;
  double s = 0;
  for (double v : a) s += std::exp(v - m);
  return m + std::log(s);
}

// The Jacobian diag(p) - p p^T, column j = the library's vector-Jacobian product with e_j
// (J is symmetric).
std::vector<std::vector<double>> jacobian(const std::vector<double>& p) {
  const std::size_t n = p.size();
  std::vector<std::vector<double>> J(n, std::vector<double>(n));
  std::vector<double> e(n), col(n);
  for (std::size_t j = 0; j < n; ++j) {
    std::fill(e.begin(), e.end(), 0.0);
    e[j] = 1.0;
    softmax_backward<double>(p, e, col);
    for (std::size_t i = 0; i < n; ++i) J[i][j] = col[i];
  }
  return J;
}

double frobenius(const std::vector<std::vector<double>>& J) {
  double s = 0;
  for (const auto& row : J) {
    for (double v : row) s += v * v;
  }
  return std::sqrt(s);
}

}  // namespace

json run_softmax(const LabOptions& options) {
  json result = make_result("softmax", options);
  auto& tables = result["tables"];

  // ---- the article's row ------------------------------------------------------------------
  const std::vector<double> x = {1000.0, 10.0, 5.0};
  const std::size_t n = x.size();
  std::vector<double> p(n), logp(n);
  softmax<double>(x, p);
  log_softmax<double>(x, logp);
  bool stable_finite = true;
  for (double v : p) stable_finite = stable_finite && std::isfinite(v);

  // log|J_ij| exactly, from the log-probabilities: J_ii = p_i (1 - p_i) with 1 - p_i the sum
  // of the other probabilities; J_ij = -p_i p_j.
  std::vector<std::vector<double>> log_abs_j(n, std::vector<double>(n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) {
        std::vector<double> others;
        for (std::size_t k = 0; k < n; ++k) {
          if (k != i) others.push_back(logp[k]);
        }
        log_abs_j[i][j] = logp[i] + log_sum_exp(others);
      } else {
        log_abs_j[i][j] = logp[i] + logp[j];
      }
    }
  }
  const auto J = jacobian(p);

  const Format naive_formats[] = {kFloat16, kBFloat16, kFloat32, kFloat64};
  std::vector<std::vector<double>> naive;
  for (const auto& f : naive_formats) naive.push_back(naive_softmax(x, f));

  json article = json::array();
  double worst_nonmax = kNegInf;  // log10 of the largest row norm of J at a non-max position
  std::vector<double> row_norm_log10(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> twice(n);
    for (std::size_t j = 0; j < n; ++j) twice[j] = 2 * log_abs_j[i][j];
    row_norm_log10[i] = 0.5 * log_sum_exp(twice) / kLn10;
    if (i != 0) worst_nonmax = std::max(worst_nonmax, row_norm_log10[i]);
    article.push_back({{"i", i},
                       {"logit", x[i]},
                       {"probability", num(p[i])},
                       {"log_probability", num(logp[i])},
                       {"log10_probability", num(logp[i] / kLn10)},
                       {"naive_float16", num(naive[0][i])},
                       {"naive_bfloat16", num(naive[1][i])},
                       {"naive_float32", num(naive[2][i])},
                       {"naive_float64", num(naive[3][i])},
                       {"log10_jacobian_row_norm", num(row_norm_log10[i])}});
  }
  tables["article"] = article;

  json jac = json::array();
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      jac.push_back({{"i", i},
                     {"j", j},
                     {"value", num(J[i][j])},
                     {"log10_abs_exact", num(log_abs_j[i][j] / kLn10)}});
    }
  }
  tables["article_jacobian"] = jac;

  json overflow = json::array();
  bool naive_nan = true;
  for (std::size_t k = 0; k < std::size(naive_formats); ++k) {
    const auto& f = naive_formats[k];
    naive_nan = naive_nan && std::isnan(naive[k][0]);
    overflow.push_back({{"format", f.name},
                        {"max_finite", max_finite(f)},
                        {"ln_max", std::log(max_finite(f))},
                        {"exp_overflow_measured", num(exp_overflow_point(f))},
                        {"naive_article_p0", num(naive[k][0])}});
  }
  tables["overflow"] = overflow;

  // ---- the sweep of softmax(c x) ----------------------------------------------------------
  const int per_decade = options.mode == Mode::full ? 8 : 4;
  std::vector<double> cs;
  for (int k = -4 * per_decade; k <= 2 * per_decade; ++k) {
    cs.push_back(std::pow(10.0, static_cast<double>(k) / per_decade));
  }
  std::vector<double> normal64(64);
  Stream stream(options.seed, stream_id({streams::kSoftmaxSweep, 64}));
  for (double& v : normal64) v = stream.normal();

  json sweep = json::array();
  double article_maxp_large = 0, article_h_small = 0, normal_maxp_large = 0, normal_h_small = 0;
  for (int which = 0; which < 2; ++which) {
    const std::vector<double>& logits = which == 0 ? x : normal64;
    std::vector<double> q(logits.size());
    for (std::size_t k = 0; k < cs.size(); ++k) {
      softmax<double>(logits, q, cs[k]);
      const double h = entropy(q);
      double maxp = 0;
      for (double v : q) maxp = std::max(maxp, v);
      const double hn = h / std::log(static_cast<double>(q.size()));
      sweep.push_back({{"logits", which == 0 ? "article" : "normal-64"},
                       {"c", cs[k]},
                       {"entropy", h},
                       {"normalized_entropy", hn},
                       {"max_prob", maxp},
                       {"effective_support", std::exp(h)},
                       {"jacobian_norm", frobenius(jacobian(q))}});
      if (k == 0) (which == 0 ? article_h_small : normal_h_small) = hn;
      if (k + 1 == cs.size()) (which == 0 ? article_maxp_large : normal_maxp_large) = maxp;
    }
  }
  tables["sweep"] = sweep;

  // ---- claims -----------------------------------------------------------------------------
  auto& claims = result["claims"];
  const Lang lang = options.lang;
  claims.push_back(make_claim(
      "C1", lang,
      pick(lang,
           "softmax(c x) tends to one-hot as c grows (entropy -> 0) and to uniform as c -> 0 "
           "(entropy -> ln N); the Jacobian diag(p) - p p^T vanishes at the one-hot end and, at "
           "the uniform end, is (I - 11^T/N)/N: alive, but the same for every input.",
           "softmax(c x) 随 c 增大趋于 one-hot（熵 -> 0），随 c -> 0 趋于均匀分布（熵 -> ln N）；"
           "雅可比矩阵 diag(p) - p p^T 在 one-hot 一端消失，在均匀一端等于 (I - 11^T/N)/N："
           "梯度仍在，但对每个输入都一样。"),
      say(lang,
          "[1000, 10, 5]: max prob {:.6g} at c = {:g}, normalized entropy {:.6g} at c = {:g}; 64 "
          "normal logits: max prob {:.4g}, normalized entropy {:.6g}",
          "[1000, 10, 5]：最大概率 {:.6g}（c = {:g}），归一化熵 {:.6g}（c = {:g}）；64 个正态 "
          "logits：最大概率 {:.4g}，归一化熵 {:.6g}",
          article_maxp_large, cs.back(), article_h_small, cs.front(), normal_maxp_large,
          normal_h_small),
      verdict_sensitivity(article_maxp_large, article_h_small),
      pick(lang,
           "The sweep table shows the entropy falling from ln N to 0 as c grows over six decades; "
           "the Jacobian norm peaks in between.",
           "sweep 表显示：c 在六个数量级上增大时，熵从 ln N 降到 0；雅可比矩阵的范数在两端之间"
           "达到峰值。")));
  const std::string naive_p0 = naive_nan ? std::string("NaN") : pick(lang, "finite", "有限值");
  claims.push_back(make_claim(
      "C2", lang,
      pick(lang,
           "stable softmax: p = [1, e^-990, e^-995] exactly representable only in log space; "
           "J = diag(p) - p p^T has every entry of order e^-990 ~ 1e-430.",
           "稳定的 softmax：p = [1, e^-990, e^-995] 只有在对数空间里才能精确表示；"
           "J = diag(p) - p p^T 的每个元素都在 e^-990 ~ 1e-430 量级。"),
      say(lang,
          "p = [{:.17g}, {:.17g}, {:.17g}], log10 p = [{:.6g}, {:.6g}, {:.6g}]; log10 of the "
          "Jacobian row norms = [{:.6g}, {:.6g}, {:.6g}]; naive exp(x)/sum: p0 = {} in float16, "
          "bfloat16, float32 and float64",
          "p = [{:.17g}, {:.17g}, {:.17g}]，log10 p = [{:.6g}, {:.6g}, {:.6g}]；雅可比矩阵各行"
          "范数的 log10 = [{:.6g}, {:.6g}, {:.6g}]；朴素的 exp(x)/sum：在 float16、bfloat16、"
          "float32 和 float64 中 p0 = {}",
          p[0], p[1], p[2], logp[0] / kLn10, logp[1] / kLn10, logp[2] / kLn10, row_norm_log10[0],
          row_norm_log10[1], row_norm_log10[2], naive_p0),
      verdict_article_row(stable_finite, p[0], worst_nonmax, naive_nan, lang),
      say(lang,
          "No gradient reaches any position, the maximal one included (its row norm is 10^{:.1f} "
          "too): a saturated softmax passes nothing back. exp overflows past 11.09 (float16), "
          "88.72 (float32, bfloat16), 709.78 (float64).",
          "没有梯度能到达任何位置，最大的那个也不例外（它的行范数同样只有 10^{:.1f}）：饱和的 "
          "softmax 什么也传不回去。exp 在超过 11.09（float16）、88.72（float32、bfloat16）、"
          "709.78（float64）后溢出。",
          row_norm_log10[0])));
  return result;
}

}  // namespace sdpa::lab

namespace sdpa::lab {
namespace {

bool is_decade(const json& row) {
  const double l = std::log10(row["c"].get<double>());
  return std::fabs(l - std::round(l)) < 1e-9;
}

}  // namespace

const Experiment& softmax_experiment() {
  static const Experiment e{
      "softmax",
      "C1, C2: softmax([1000, 10, 5]), its Jacobian, the naive formula overflowing",
      run_softmax,
      {{"article",
        "one per position i of x = [1000, 10, 5]",
        {{"i", Kind::integer, "", "position in x"},
         {"logit", Kind::number, "", "x_i"},
         {"probability", Kind::number, "",
          "stable softmax in float64 (`e^-990` underflows to 0, hence the log columns)"},
         {"log_probability", Kind::number, "nats", "ln p_i, exact from the log-sum-exp"},
         {"log10_probability", Kind::number, "decades", "log10 p_i"},
         {"naive_float16", Kind::number, "",
          "the naive `exp(x)/Σexp(x)` computed in float16: `\"nan\"` where `exp` overflowed"},
         {"naive_bfloat16", Kind::number, "", "the same in bfloat16"},
         {"naive_float32", Kind::number, "", "the same in float32"},
         {"naive_float64", Kind::number, "", "the same in float64"},
         {"log10_jacobian_row_norm", Kind::number, "decades",
          "log10 of the Euclidean norm of row i of `diag(p) − p pᵀ`: how much gradient can reach "
          "logit i, exact from the log-probabilities"}}},
       {"article_jacobian",
        "one per entry (i, j) of the Jacobian of the article's row",
        {{"i", Kind::integer, "", "row"},
         {"j", Kind::integer, "", "column"},
         {"value", Kind::number, "", "J_ij from `sdpa::softmax_backward` in float64"},
         {"log10_abs_exact", Kind::number, "decades",
          "log10 `|J_ij|` from the log-probabilities; `\"-inf\"` for an exact 0"}}},
       {"overflow",
        "one per format",
        {{"format", Kind::text, "", "`float16`, `bfloat16`, `float32`, `float64`"},
         {"max_finite", Kind::number, "", "the largest finite value of the format"},
         {"ln_max", Kind::number, "",
          "theory: `exp` overflows past `ln(max_finite)` (11.09, 88.72, 88.72, 709.78)"},
         {"exp_overflow_measured", Kind::number, "",
          "the smallest x of that format whose exp, rounded to the format, is infinite"},
         {"naive_article_p0", Kind::number, "",
          "the naive softmax of the article's row in that format, first entry"}}},
       {"sweep",
        "one per (logits, c)",
        {{"logits", Kind::text, "",
          "`\"article\"` for `[1000, 10, 5]`, `\"normal-64\"` for 64 standard-normal logits"},
         {"c", Kind::number, "", "the multiplier of the logits"},
         {"entropy", Kind::number, "nats", "entropy of softmax(c·x)"},
         {"normalized_entropy", Kind::number, "", "`entropy/ln N`: 1 is uniform, 0 one-hot"},
         {"max_prob", Kind::number, "", "the largest probability"},
         {"effective_support", Kind::number, "keys", "`exp(entropy)`"},
         {"jacobian_norm", Kind::number, "",
          "Frobenius norm of `diag(p) − p pᵀ`, built column by column with "
          "`sdpa::softmax_backward`"}}}},
      {{"article",
        {"i", "logit", "probability", "log10_probability", "naive_float16", "naive_float32",
         "naive_float64", "log10_jacobian_row_norm"},
        nullptr},
       {"overflow",
        {"format", "max_finite", "ln_max", "exp_overflow_measured", "naive_article_p0"},
        nullptr},
       {"sweep",
        {"logits", "c", "entropy", "normalized_entropy", "max_prob", "effective_support",
         "jacobian_norm"},
        is_decade}}};
  return e;
}

}  // namespace sdpa::lab
