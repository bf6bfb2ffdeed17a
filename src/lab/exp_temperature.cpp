// Experiment `temperature` (claims C1, C7): softmax(c Q K^T / sqrt(d)) for c from 1e-3 to 1e2 on
// one set of random inputs: entropy, Jacobian, the gradient reaching Q, K and the logits through
// the library's attention backward, and how much the output still depends on the query.
#include <fmt/format.h>

#include <cmath>

#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/probe.h"
#include "lab/rem.h"
#include "lab/stats.h"
#include "lab/streams.h"

namespace sdpa::lab {

json run_temperature(const LabOptions& options) {
  json result = make_result("temperature", options);
  const bool full = options.mode == Mode::full;
  const int per_decade = full ? 8 : 4;
  const int n = 128, rows = full ? 1024 : 256;
  std::vector<int> ds = {64};
  if (full) ds.push_back(256);
  std::vector<double> cs;
  int c1 = 0;  // index of c = 1
  for (int k = -3 * per_decade; k <= 2 * per_decade; ++k) {
    if (k == 0) c1 = static_cast<int>(cs.size());
    cs.push_back(std::pow(10.0, static_cast<double>(k) / per_decade));
  }

  json table = json::array();
  Progress progress(options.progress, "temperature",
                    static_cast<std::int64_t>(ds.size() * cs.size()));
  std::string claim7_measure, claim1_measure;
  Verdict v1, v7;
  for (int d : ds) {
    const ProbeInputs in =
        make_probe_inputs(options.seed, streams::kTemperature, d, n, rows, options.threads);
    std::vector<ProbeResult> res;
    for (double c : cs) {
      res.push_back(probe(in, c / std::sqrt(static_cast<double>(d)), options.threads));
      progress.advance();
    }
    // The closed-form uniform-attention norms at 1/sqrt(d) (c = 1): fixed by (d, N) before
    // measuring, so that c = 1 is not "healthy" by construction.
    const double dead_q = kDeadFactor * uniform_grad_q(d, n);
    const double dead_k = kDeadFactor * uniform_grad_k(d, n, rows);
    const double dead_s = kDeadFactor * uniform_grad_logits(d, n);
    double peak = 0, c_peak = 0, s_peak = 0, c_s_peak = 0;
    for (std::size_t k = 0; k < cs.size(); ++k) {
      const ProbeResult& r = res[k];
      const NormStats gq = norm_stats(r.grad_q, dead_q), gk = norm_stats(r.grad_k, dead_k),
                      gs = norm_stats(r.grad_logits, dead_s);
      if (gq.median > peak) peak = gq.median, c_peak = cs[k];
      if (gs.median > s_peak) s_peak = gs.median, c_s_peak = cs[k];
      const double h = mean(r.entropy);
      json row = {{"d", d},
                  {"n_keys", n},
                  {"rows", rows},
                  {"c", cs[k]},
                  {"scale_value", cs[k] / std::sqrt(static_cast<double>(d))},
                  {"entropy", h},
                  {"entropy_theory", or_null(rem_entropy(cs[k], n))},
                  {"entropy_annealed", rem_annealed_entropy(cs[k], n)},
                  {"regime", rem_regime(cs[k], n)},
                  {"normalized_entropy", h / std::log(static_cast<double>(n))},
                  {"max_prob", mean(r.max_prob)},
                  {"effective_support", std::exp(h)},
                  {"jacobian_norm", mean(r.jacobian_norm)},
                  {"output_diversity", r.output_diversity}};
      for (const auto& [name, s] : {std::pair{"grad_q", gq}, {"grad_k", gk}, {"grad_logits", gs}}) {
        row[std::string(name) + "_norm"] = num(s.median);
        row[std::string(name) + "_mean"] = num(s.mean);
        row[std::string(name) + "_p99"] = num(s.p99);
        row[std::string(name) + "_dead"] = num(s.dead);
      }
      table.push_back(row);
    }
    if (d != ds.front()) continue;  // the verdicts read the first d (64, as in quick mode)
    const double grad_c1 = quantile(res[c1].grad_q, 0.5);
    const double maxp_large = quantile(res.back().max_prob, 0.5);
    const double h_small = mean(res.front().entropy) / std::log(static_cast<double>(n));
    // The grid point nearest c = sqrt(d), where the scores are those of unscaled attention.
    std::size_t cu = 0;
    for (std::size_t k = 0; k < cs.size(); ++k) {
      if (std::fabs(std::log(cs[k]) - 0.5 * std::log(d)) <
          std::fabs(std::log(cs[cu]) - 0.5 * std::log(d))) {
        cu = k;
      }
    }
    const NormStats at1 = norm_stats(res[c1].grad_q, dead_q);
    const NormStats atu = norm_stats(res[cu].grad_q, dead_q);
    v1 = verdict_sensitivity(maxp_large, h_small);
    v7 = verdict_temperature(at1.dead, at1.p99 / at1.median, atu.dead, atu.p99 / atu.median);
    claim1_measure =
        say(options.lang,
            "d = {}, N = {}: median max prob {:.4f} at c = {:g}; normalized entropy {:.5f} at c = "
            "{:g}; "
            "output diversity {:.2e} at c = {:g} against {:.3f} at c = 1",
            "d = {}，N = {}：最大概率的中位数 {:.4f}（c = {:g}）；归一化熵 {:.5f}（c = {:g}）；"
            "输出多样性 {:.2e}（c = {:g}），c = 1 时为 {:.3f}",
            d, n, maxp_large, cs.back(), h_small, cs.front(), res.front().output_diversity,
            cs.front(), res[c1].output_diversity);
    claim7_measure = say(
        options.lang,
        "d = {}, N = {}: at c = 1, {:.1f}% of rows' dQ dead, p99/median {:.2f}; at c = {:.3g} "
        "(~sqrt(d), unscaled), {:.1f}% dead, p99/median {:.1f}. Median |dQ| peaks at c = {:.3g} "
        "({:.3g}; at c = 1: {:.3g}); the gradient on the logits peaks at c = {:.3g}",
        "d = {}，N = {}：c = 1 时 {:.1f}% 的行 dQ 死亡，p99/中位数 {:.2f}；c = {:.3g}（约 sqrt(d)，"
        "即未缩放）时 {:.1f}% 死亡，p99/中位数 {:.1f}。|dQ| 的中位数在 c = {:.3g} 处达到峰值"
        "（{:.3g}；c = 1 时为 {:.3g}）；logits 上的梯度在 c = {:.3g} 处达到峰值",
        d, n, 100 * at1.dead, at1.p99 / at1.median, cs[cu], 100 * atu.dead, atu.p99 / atu.median,
        c_peak, peak, grad_c1, c_s_peak);
  }
  result["tables"]["temperature"] = table;
  auto& claims = result["claims"];
  const Lang lang = options.lang;
  claims.push_back(make_claim(
      "C1", lang,
      pick(lang,
           "c -> 0: uniform attention (entropy ln N), every query gets the mean of V; c -> inf: "
           "one-hot.",
           "c -> 0：均匀注意力（熵 ln N），每个查询得到 V 的均值；c -> inf：one-hot。"),
      claim1_measure, v1,
      pick(lang,
           "Too small a scale keeps the gradient alive on the logits but the output no longer "
           "depends on the query (output diversity -> 0): no preference is left to learn from.",
           "缩放太小时，logits 上的梯度仍然存在，但输出不再依赖于查询（输出多样性 -> 0）："
           "已经没有可供学习的偏好了。")));
  claims.push_back(make_claim(
      "C7", lang,
      pick(lang,
           "dQ = scale * dS K: it grows with the scale while softmax is soft, and dies once it "
           "saturates; the useful scales lie in between.",
           "dQ = scale * dS K：softmax 还软的时候，它随缩放增大；一旦饱和，它就消失；有用的缩放"
           "位于两者之间。"),
      claim7_measure, v7,
      pick(lang,
           "Stable means few dead rows and a short tail. The largest median gradient is not at "
           "c = 1 but where softmax starts to sharpen: 1/sqrt(d) sits on the soft side of the "
           "useful range.",
           "稳定意味着死亡的行少、尾部短。最大的梯度中位数不在 c = 1，而在 softmax 开始变尖锐的"
           "地方：1/sqrt(d) 位于有用范围偏软的一侧。")));
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

const Experiment& temperature_experiment() {
  auto columns = [] {
    std::vector<Column> c = {
        {"d", Kind::integer, "", "dimension of q and k (64; full: also 256)"},
        {"n_keys", Kind::integer, "", "N = 128"},
        {"rows", Kind::integer, "", "query rows measured"},
        {"c", Kind::number, "",
         "the multiplier, log-spaced from 1e-3 to 1e2 (quick 4 per decade, full 8)"},
        {"scale_value", Kind::number, "", "`c/sqrt(d)`"},
        {"entropy", Kind::number, "nats", "mean over rows"},
        {"entropy_theory", Kind::number, "nats",
         "the random energy model at logit standard deviation `s = c`: `ln N − c²/2` below "
         "`s_c = sqrt(2 ln N)` (3.1 at N = 128), `ψ(1) − ψ(1 − s_c/c)` from `1.5 s_c` on, null "
         "in between",
         true},
        {"entropy_annealed", Kind::number, "nats", "`ln N − c²/2`"},
        {"regime", Kind::text, "",
         "`\"liquid\"`, `\"crossover\"` or `\"frozen\"` at s = c (as in `saturation`)"},
        {"normalized_entropy", Kind::number, "", "`entropy/ln N`"},
        {"max_prob", Kind::number, "", "largest probability, mean over rows"},
        {"effective_support", Kind::number, "keys", "`exp(entropy)`"},
        {"jacobian_norm", Kind::number, "", "mean Frobenius norm of `diag(p) − p pᵀ`"},
        {"output_diversity", Kind::number, "",
         "the variance across queries of the attention output divided by the variance of V's "
         "entries (0 when attention is uniform: every query gets the same output; near 1 when "
         "one-hot)"}};
    for (auto& g : gradient_columns("d of the row, N = 128")) c.push_back(g);
    return c;
  };
  static const Experiment e{
      "temperature",
      "C1, C7: softmax(c QK^T/sqrt(d)) for c = 1e-3..1e2, where the gradient peaks",
      run_temperature,
      {{"temperature", "one per (d, c)", columns()}},
      {{"temperature",
        {"d", "c", "entropy", "max_prob", "jacobian_norm", "grad_q_norm", "grad_q_p99",
         "grad_q_dead", "grad_logits_norm", "output_diversity"},
        is_decade}}};
  return e;
}

}  // namespace sdpa::lab
