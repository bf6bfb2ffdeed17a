// Experiment `precision` (claims C2, C7): the same logits q.k in float16 and bfloat16 (emulated)
// and float32. How many bits of the attention probabilities unscaled logits lose against scaled
// ones at d = 512, and where the naive exp(x)/sum(exp(x)) turns to NaN.
//
// Why bits are lost: rounding a logit z to p significant bits moves it by up to |z| 2^-p, and a
// probability moves by the same amount relatively (d log p_i = dz_i - sum_j p_j dz_j). Unscaled
// logits are sqrt(d) times larger in rms, which suggests log2(sqrt(d)) = 4.5 fewer bits at
// d = 512; the significant probabilities sit at the largest logits, whose rms ratio is larger,
// and 6.1 bits are lost (bits_lost_theory), whatever the format.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/half.h"
#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/lowp.h"
#include "lab/random.h"
#include "lab/stats.h"
#include "lab/streams.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

// "float16: 1.2 bits scaled, 3.4 unscaled", after a separator unless it is the first clause.
std::string bits_lost_clause(Lang lang, bool first, const char* name, double scaled,
                             double unscaled) {
  return say(lang, "{}{}: {:.1f} bits scaled, {:.1f} unscaled",
             "{}{}：缩放时 {:.1f} 位，未缩放时 {:.1f} 位", first ? "" : clause_separator(lang),
             name, scaled, unscaled);
}

}  // namespace
namespace {

constexpr Format kFormats[] = {kFloat16, kBFloat16, kFloat32};
constexpr int kBitsD = 512;
constexpr int kN = 1024;
// Probabilities below a thousandth of the row's largest carry no weight worth measuring.
constexpr double kSignificant = 1e-3;

// rows x kN logits q.k at dimension d. The kN keys are drawn once and shared by the rows (one
// stream per key row and per query row): generating rows x kN x d normals would cost 30 times
// more, and sharing keys changes no expectation measured here.
std::vector<double> logits(std::uint64_t seed, int d, int rows, int threads) {
  std::vector<double> k(static_cast<std::size_t>(kN) * d), z(static_cast<std::size_t>(rows) * kN);
  const auto ud = static_cast<std::uint64_t>(d);
  parallel_for(kN, threads, [&](std::int64_t j) {
    Stream s(seed, stream_id({streams::kPrecision, ud, 1, static_cast<std::uint64_t>(j)}));
    for (int e = 0; e < d; ++e) k[static_cast<std::size_t>(j) * d + e] = s.normal();
  });
  parallel_for(rows, threads, [&](std::int64_t i) {
    Stream s(seed, stream_id({streams::kPrecision, ud, 0, static_cast<std::uint64_t>(i)}));
    std::vector<double> q(d);
    for (double& x : q) x = s.normal();
    for (int j = 0; j < kN; ++j) {
      double dot = 0;
      for (int e = 0; e < d; ++e) dot += q[e] * k[static_cast<std::size_t>(j) * d + e];
      z[static_cast<std::size_t>(i) * kN + j] = dot;
    }
  });
  return z;
}

// Attention as pipelines run it: Q, K, V of `rows` x d, `n` x d, `n` x d standard normals
// (float64), through sdpa::attention_forward in bfloat16 (inputs rounded to bfloat16; products
// and softmax in float32; the fused kernel rounds P to bfloat16 before P·V where it runs on
// vdpbf16ps, the naive path rounds S, P and O as PyTorch's CPU composite does) or float32, each
// against the float64 reference on the unrounded inputs.
struct PipelineError {
  double out_rel_rms = 0;  // rms of (out - exact) / rms(exact out)
  double lse_rms = 0;      // rms of lse - exact lse, nats
};

PipelineError pipeline_error(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, int rows, int n, int d, double scale,
                             DType dtype, Impl impl) {
  const std::vector<std::int64_t> qs{1, 1, rows, d}, ks{1, 1, n, d};
  AttentionOptions opt;
  opt.scale = scale;
  opt.threads = 1;  // the naive baseline's GEMMs are bit-identical only for a fixed count
  opt.impl = Impl::reference;
  std::vector<double> out_exact(static_cast<std::size_t>(rows) * d), lse_exact(rows);
  {
    const MutableTensorRef o{out_exact.data(), DType::float64, qs};
    const MutableTensorRef l{lse_exact.data(), DType::float64, {1, 1, rows}};
    attention_forward(TensorRef{q.data(), DType::float64, qs},
                      TensorRef{k.data(), DType::float64, ks},
                      TensorRef{v.data(), DType::float64, ks}, nullptr, opt, o, &l);
  }
  opt.impl = impl;
  std::vector<double> out(out_exact.size()), lse(rows);
  if (dtype == DType::bfloat16) {
    auto to_bf16 = [](const std::vector<double>& x) {
      std::vector<std::uint16_t> y(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) y[i] = detail::float64_to_bfloat16(x[i]);
      return y;
    };
    const auto qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
    std::vector<std::uint16_t> ob(out.size());
    std::vector<float> lf(rows);  // lse is float32 for 16-bit queries
    const MutableTensorRef o{ob.data(), DType::bfloat16, qs};
    const MutableTensorRef l{lf.data(), DType::float32, {1, 1, rows}};
    attention_forward(TensorRef{qb.data(), DType::bfloat16, qs},
                      TensorRef{kb.data(), DType::bfloat16, ks},
                      TensorRef{vb.data(), DType::bfloat16, ks}, nullptr, opt, o, &l);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = detail::bfloat16_to_float(ob[i]);
    for (int i = 0; i < rows; ++i) lse[i] = lf[i];
  } else {
    auto to_f32 = [](const std::vector<double>& x) {
      return std::vector<float>(x.begin(), x.end());
    };
    const auto qf = to_f32(q), kf = to_f32(k), vf = to_f32(v);
    std::vector<float> of(out.size()), lf(rows);
    const MutableTensorRef o{of.data(), DType::float32, qs};
    const MutableTensorRef l{lf.data(), DType::float32, {1, 1, rows}};
    attention_forward(TensorRef{qf.data(), DType::float32, qs},
                      TensorRef{kf.data(), DType::float32, ks},
                      TensorRef{vf.data(), DType::float32, ks}, nullptr, opt, o, &l);
    std::copy(of.begin(), of.end(), out.begin());
    std::copy(lf.begin(), lf.end(), lse.begin());
  }
  double e2 = 0, x2 = 0, l2 = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    e2 += (out[i] - out_exact[i]) * (out[i] - out_exact[i]);
    x2 += out_exact[i] * out_exact[i];
  }
  for (int i = 0; i < rows; ++i) l2 += (lse[i] - lse_exact[i]) * (lse[i] - lse_exact[i]);
  return {std::sqrt(e2 / x2), std::sqrt(l2 / rows)};
}

}  // namespace

json run_precision(const LabOptions& options) {
  json result = make_result("precision", options);
  const bool full = options.mode == Mode::full;
  const int rows = full ? 256 : 32;

  // ---- bits kept by the probabilities at d = 512 -------------------------------------------
  const std::vector<double> z = logits(options.seed, kBitsD, rows, options.threads);
  json precision = json::array();
  bool stable_finite = true;
  double bits_lost_bf16 = 0, bits_theory_bf16 = 0;
  std::string bits_text;
  for (const Format& f : kFormats) {
    double bits[2] = {0, 0}, sig_rms[2] = {0, 0};
    for (int unscaled = 1; unscaled >= 0; --unscaled) {
      const double scale = unscaled ? 1.0 : 1.0 / std::sqrt(static_cast<double>(kBitsD));
      double sum_z2 = 0, sum_dz2 = 0, sum_rel2 = 0, sum_sig2 = 0;
      std::int64_t count_rel = 0;
      std::vector<double> exact(kN), rounded(kN), p(kN), pr(kN);
      for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < kN; ++j) {
          exact[j] = scale * z[static_cast<std::size_t>(i) * kN + j];
          rounded[j] = round_to(exact[j], f);
          sum_z2 += exact[j] * exact[j];
          sum_dz2 += (rounded[j] - exact[j]) * (rounded[j] - exact[j]);
        }
        softmax<double>(exact, p);
        softmax<double>(rounded, pr);
        const double pmax = *std::max_element(p.begin(), p.end());
        for (int j = 0; j < kN; ++j) {
          stable_finite = stable_finite && std::isfinite(pr[j]);
          if (p[j] >= kSignificant * pmax) {
            const double rel = pr[j] / p[j] - 1;
            sum_rel2 += rel * rel;
            sum_sig2 += exact[j] * exact[j];
            ++count_rel;
          }
        }
      }
      const double rel_rms = std::sqrt(sum_rel2 / count_rel);
      bits[unscaled] = -std::log2(rel_rms);
      sig_rms[unscaled] = std::sqrt(sum_sig2 / count_rel);
      const double n_all = static_cast<double>(rows) * kN;
      precision.push_back(
          {{"format", f.name},
           {"scale", unscaled ? "1" : "1/sqrt(d)"},
           {"d", kBitsD},
           {"n_keys", kN},
           {"rows", rows},
           {"logit_rms", std::sqrt(sum_z2 / n_all)},
           {"logit_rounding_rms", std::sqrt(sum_dz2 / n_all)},
           {"prob_rel_error_rms", rel_rms},
           {"effective_bits", bits[unscaled]},
           {"bits_lost", unscaled ? json() : json(0.0)},  // filled in below for unscaled rows
           {"significant_logit_rms", sig_rms[unscaled]},
           {"bits_lost_theory", unscaled ? json() : json(0.0)},
           {"bits_lost_sqrt_d", unscaled ? 0.5 * std::log2(static_cast<double>(kBitsD)) : 0.0}});
    }
    const double lost = bits[0] - bits[1];
    precision[precision.size() - 2]["bits_lost"] = lost;
    // Each significant probability moves relatively by about the rounding error of its logit,
    // |z| 2^-p: the bits lost are log2 of the ratio of the significant logits' sizes.
    precision[precision.size() - 2]["bits_lost_theory"] = std::log2(sig_rms[1] / sig_rms[0]);
    if (std::string(f.name) == "bfloat16") {
      bits_lost_bf16 = lost;
      bits_theory_bf16 = std::log2(sig_rms[1] / sig_rms[0]);
    }
    bits_text += bits_lost_clause(options.lang, bits_text.empty(), f.name, bits[0], bits[1]);
  }
  result["tables"]["precision"] = precision;

  // ---- where the naive softmax breaks --------------------------------------------------------
  const int nan_rows = full ? 128 : 16;
  std::vector<int> ds;
  for (int d = 2; d <= 4096; d *= 2) ds.push_back(d);
  json naive = json::array();
  double nan_fp16_unscaled_512 = 0, nan_scaled_max = 0;
  for (int d : ds) {
    const std::vector<double> zd = logits(options.seed, d, nan_rows, options.threads);
    for (const Format& f : kFormats) {
      for (int unscaled = 1; unscaled >= 0; --unscaled) {
        const double scale = unscaled ? 1.0 : 1.0 / std::sqrt(static_cast<double>(d));
        int nan_count = 0;
        std::vector<double> maxima(nan_rows), x(kN);
        for (int i = 0; i < nan_rows; ++i) {
          for (int j = 0; j < kN; ++j) x[j] = scale * zd[static_cast<std::size_t>(i) * kN + j];
          maxima[i] = *std::max_element(x.begin(), x.end());
          const std::vector<double> p = naive_softmax(x, f);
          nan_count += std::any_of(p.begin(), p.end(), [](double v) { return std::isnan(v); });
        }
        const double frac = static_cast<double>(nan_count) / nan_rows;
        const double ln_max = std::log(max_finite(f));
        if (unscaled && d == kBitsD && std::string(f.name) == "float16")
          nan_fp16_unscaled_512 = frac;
        if (!unscaled) nan_scaled_max = std::max(nan_scaled_max, frac);
        naive.push_back({{"format", f.name},
                         {"scale", unscaled ? "1" : "1/sqrt(d)"},
                         {"d", d},
                         {"n_keys", kN},
                         {"rows", nan_rows},
                         {"nan_fraction", frac},
                         {"max_logit_median", quantile(maxima, 0.5)},
                         {"ln_max", ln_max},
                         {"theory_d_threshold",
                          unscaled ? json(ln_max * ln_max / (2 * std::log(static_cast<double>(kN))))
                                   : json()}});
      }
    }
  }
  result["tables"]["naive_nan"] = naive;

  // ---- attention as pipelines run it: bfloat16 Q, K, V through the library ------------------
  json pipeline = json::array();
  const int prow = full ? 128 : 32;
  double pipe_bits_lost = 0;
  std::string pipe_text;
  for (int d : {64, kBitsD}) {
    const auto ud = static_cast<std::uint64_t>(d);
    std::vector<double> q(static_cast<std::size_t>(prow) * d), k(static_cast<std::size_t>(kN) * d),
        v(k.size());
    Stream sq(options.seed, stream_id({streams::kPrecision, ud, 7, 0})),
        sk(options.seed, stream_id({streams::kPrecision, ud, 7, 1})),
        sv(options.seed, stream_id({streams::kPrecision, ud, 7, 2}));
    for (double& x : q) x = sq.normal();
    for (double& x : k) x = sk.normal();
    for (double& x : v) x = sv.normal();
    struct Path {
      const char* name;
      DType dtype;
      Impl impl;
    };
    const Path paths[] = {{"bfloat16 fast", DType::bfloat16, Impl::fast},
                          {"bfloat16 naive", DType::bfloat16, Impl::naive},
                          {"float32 fast", DType::float32, Impl::fast}};
    for (const Path& path : paths) {
      double bits[2] = {0, 0};
      for (int unscaled = 0; unscaled <= 1; ++unscaled) {
        const double scale = unscaled ? 1.0 : 1.0 / std::sqrt(static_cast<double>(d));
        const PipelineError e = pipeline_error(q, k, v, prow, kN, d, scale, path.dtype, path.impl);
        bits[unscaled] = -std::log2(e.out_rel_rms);
        pipeline.push_back({{"path", path.name},
                            {"scale", unscaled ? "1" : "1/sqrt(d)"},
                            {"d", d},
                            {"n_keys", kN},
                            {"rows", prow},
                            {"out_rel_error_rms", e.out_rel_rms},
                            {"out_bits", bits[unscaled]},
                            {"lse_error_rms", e.lse_rms},
                            {"bits_lost", unscaled ? json() : json(0.0)}});
      }
      pipeline[pipeline.size() - 1]["bits_lost"] = bits[0] - bits[1];
      if (d == kBitsD && std::string(path.name) == "bfloat16 fast")
        pipe_bits_lost = bits[0] - bits[1];
      if (d == kBitsD) {
        pipe_text += bits_lost_clause(options.lang, pipe_text.empty(), path.name, bits[0], bits[1]);
      }
    }
  }
  result["tables"]["pipeline"] = pipeline;

  // ---- claims -------------------------------------------------------------------------------
  const double ln_n = std::log(static_cast<double>(kN));
  auto& claims = result["claims"];
  const Lang lang = options.lang;
  claims.push_back(make_claim(
      "C2", lang,
      say(lang,
          "the naive exp(x)/sum(exp(x)) overflows once the row max passes ln(max float): 11.09 in "
          "float16, 88.72 in bfloat16 and float32; unscaled scores of N = {} keys reach about "
          "sqrt(2 d ln N), so from d = {:.0f} (float16) and d = {:.0f} (float32)",
          "行最大值一旦超过 ln(max float)，朴素的 exp(x)/sum(exp(x)) 就会溢出：float16 为 11.09，"
          "bfloat16 和 float32 为 88.72；N = {} 个键时，未缩放的分数大约达到 sqrt(2 d ln N)，"
          "所以从 d = {:.0f}（float16）和 d = {:.0f}（float32）起溢出",
          kN, 11.09 * 11.09 / (2 * ln_n), 88.72 * 88.72 / (2 * ln_n)),
      say(lang,
          "float16, unscaled, d = 512: NaN in {:.0f}% of rows; scaled logits: NaN in at most "
          "{:.0f}% of rows of any format and d; the library's stable softmax: {}",
          "float16、未缩放、d = 512：{:.0f}% 的行为 NaN；缩放后的 logits：任何格式和 d 下至多 "
          "{:.0f}% 的行为 NaN；本库的稳定 softmax：{}",
          100 * nan_fp16_unscaled_512, 100 * nan_scaled_max,
          stable_finite ? pick(lang, "always finite", "始终有限")
                        : pick(lang, "NOT finite", "出现了非有限值")),
      verdict_stable_vs_naive(stable_finite, nan_fp16_unscaled_512, lang),
      pick(lang, "The naive_nan table gives the NaN fraction for every format, scale and d.",
           "naive_nan 表给出了每种格式、缩放和 d 下的 NaN 比例。")));
  claims.push_back(make_claim(
      "C7", lang,
      say(lang,
          "rounding a logit z to p bits moves each probability by about |z| 2^-p relatively; "
          "unscaled logits are sqrt(d) larger ({:.1f} bits at d = {}), and their significant "
          "probabilities sit at the row maximum, about 3 standard deviations out, so more is lost",
          "把 logit z 舍入到 p 位，每个概率大约相对移动 |z| 2^-p；未缩放的 logits 大 sqrt(d) 倍"
          "（d = {1} 时为 {0:.1f} 位），而它们的显著概率位于行最大值处，约在 3 个标准差之外，"
          "所以损失更多",
          0.5 * std::log2(static_cast<double>(kBitsD)), kBitsD),
      say(lang,
          "rms relative error of the significant probabilities (p >= 1e-3 max): {}; bfloat16 "
          "loses {:.2f} bits unscaled (predicted from the logits' sizes: {:.2f})",
          "显著概率（p >= 1e-3 max）的均方根相对误差：{}；bfloat16 未缩放时损失 {:.2f} 位"
          "（由 logits 的大小预测：{:.2f}）",
          bits_text, bits_lost_bf16, bits_theory_bf16),
      verdict_precision(bits_lost_bf16, nan_fp16_unscaled_512, nan_scaled_max),
      say(lang,
          "Scaling keeps the softmax input in the range where low-precision formats are accurate "
          "and where exp cannot overflow. As pipelines run it (table pipeline: bfloat16 Q, K, V "
          "through sdpa::attention_forward, float32 accumulation, the output rounded to "
          "bfloat16), d = {}: the output keeps {}; unscaled attention loses {:.1f} bits on the "
          "fused kernel (no verdict rests on this table).",
          "缩放让 softmax 的输入留在低精度格式准确、exp 不会溢出的范围内。按实际流水线运行时"
          "（pipeline 表：bfloat16 的 Q、K、V 经过 sdpa::attention_forward，float32 累加，输出"
          "舍入为 bfloat16），d = {}：输出保留 {}；未缩放的注意力在融合内核上损失 {:.1f} 位"
          "（没有结论依赖此表）。",
          kBitsD, pipe_text, pipe_bits_lost)));
  return result;
}

}  // namespace sdpa::lab

namespace sdpa::lab {
namespace {

bool is_key_d(const json& row) {
  const int d = row["d"].get<int>();
  return d == 16 || d == 64 || d == 512 || d == 4096;
}

}  // namespace

const Experiment& precision_experiment() {
  static const Experiment e{
      "precision",
      "C2, C7: float16/bfloat16/float32 logits, bits lost, where naive softmax NaNs",
      run_precision,
      {{"precision",
        "one per (format, scale), d = 512, N = 1024",
        {{"format", Kind::text, "", "`float16`, `bfloat16`, `float32`"},
         {"scale", Kind::text, "", "`\"1\"` or `\"1/sqrt(d)\"`"},
         {"d", Kind::integer, "", "dimension of q and k"},
         {"n_keys", Kind::integer, "", "N"},
         {"rows", Kind::integer, "", "query rows"},
         {"logit_rms", Kind::number, "", "rms of the logits"},
         {"logit_rounding_rms", Kind::number, "", "rms of the rounding error of the logits"},
         {"prob_rel_error_rms", Kind::number, "",
          "rms of `p̃_i/p_i − 1` over the significant probabilities (at least 1e-3 times their "
          "row's largest), p̃ the library's stable softmax of the rounded logits, p of the exact "
          "ones"},
         {"effective_bits", Kind::number, "bits", "`−log2(prob_rel_error_rms)`"},
         {"bits_lost", Kind::number, "bits",
          "effective bits of the scaled logits minus those of these logits (0 for the scaled "
          "rows)"},
         {"significant_logit_rms", Kind::number, "",
          "rms of the logits of the significant entries"},
         {"bits_lost_theory", Kind::number, "bits",
          "`log2` of the ratio of the two `significant_logit_rms` (each probability moves by "
          "about its logit's rounding error `|z|·2^-p`)"},
         {"bits_lost_sqrt_d", Kind::number, "bits",
          "`0.5·log2 d`, what one might expect (0 for the scaled rows)"}}},
       {"naive_nan",
        "one per (format, scale, d), d = 2, 4, …, 4096",
        {{"format", Kind::text, "", "`float16`, `bfloat16`, `float32`"},
         {"scale", Kind::text, "", "`\"1\"` or `\"1/sqrt(d)\"`"},
         {"d", Kind::integer, "", "dimension of q and k"},
         {"n_keys", Kind::integer, "", "N"},
         {"rows", Kind::integer, "", "query rows"},
         {"nan_fraction", Kind::number, "",
          "fraction of rows where the naive softmax computed in that format has NaN"},
         {"max_logit_median", Kind::number, "", "median over rows of the largest logit"},
         {"ln_max", Kind::number, "", "the overflow point of exp in that format"},
         {"theory_d_threshold", Kind::number, "",
          "for scale 1, the d where the expected row maximum `sqrt(2 d ln N)` reaches `ln_max`: "
          "`ln_max²/(2 ln N)`; null for scaled rows",
          true}}},
       {"pipeline",
        "one per (path, scale, d), d = 64 and 512, N = 1024: attention through the library",
        {{"path", Kind::text, "",
          "`bfloat16 fast` (the fused kernel on bfloat16 Q, K, V: float32 products and "
          "softmax, P rounded to bfloat16 before P·V where it runs on vdpbf16ps: AMD CPUs with "
          "AVX512_BF16; elsewhere P stays float32, docs/precision.md), `bfloat16 "
          "naive` (PyTorch's CPU composite: S, P, O rounded to bfloat16), `float32 fast`"},
         {"scale", Kind::text, "", "`\"1\"` or `\"1/sqrt(d)\"`"},
         {"d", Kind::integer, "", "dimension of q and k"},
         {"n_keys", Kind::integer, "", "N"},
         {"rows", Kind::integer, "", "query rows"},
         {"out_rel_error_rms", Kind::number, "",
          "rms of the output's error against the float64 reference on the unrounded inputs, "
          "over the rms of that output"},
         {"out_bits", Kind::number, "bits", "`−log2(out_rel_error_rms)`"},
         {"lse_error_rms", Kind::number, "nats", "rms error of the log-sum-exp"},
         {"bits_lost", Kind::number, "bits",
          "`out_bits` of the scaled row minus this row's (0 for the scaled rows)"}}}},
      {{"precision",
        {"format", "scale", "logit_rms", "logit_rounding_rms", "prob_rel_error_rms",
         "effective_bits", "bits_lost", "bits_lost_theory"},
        nullptr},
       {"naive_nan",
        {"format", "scale", "d", "nan_fraction", "max_logit_median", "ln_max",
         "theory_d_threshold"},
        is_key_d},
       {"pipeline",
        {"path", "scale", "d", "out_rel_error_rms", "out_bits", "lse_error_rms", "bits_lost"},
        nullptr}}};
  return e;
}

}  // namespace sdpa::lab
