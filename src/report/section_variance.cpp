// The report's sections for the derive and variance experiments: C3 to C6 and the non-ideal inputs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {
namespace {

// One series per distribution, using the given columns. The five distributions share every d:
// each is drawn shifted by a factor 2^(±0.06·k) along the (log) d axis so that their error bars
// do not hide one another; the CSV keeps the d.
std::vector<Series> per_distribution(const json* t, const std::vector<std::string>& columns,
                                     const std::string& using_spec, const std::string& with) {
  std::vector<Series> out;
  const auto dists = distinct(t, "distribution");
  for (std::size_t i = 0; i < dists.size(); ++i) {
    const Rows rows = where(t, [&](Row r) { return str(r, "distribution") == dists[i]; });
    const double shift =
        std::exp2(0.06 * (static_cast<double>(i) - 0.5 * static_cast<double>(dists.size() - 1)));
    const std::string spec =
        fmt::format("($1*{:.6f}){}", shift, using_spec.substr(using_spec.find(':')));
    out.push_back(
        series(dists[i], rows, columns, spec, fmt::format("{} pt {} ps 0.7", with, point_type(i))));
  }
  return out;
}

}  // namespace

void section_c3(Page& page) {
  Section& s = page.claim_section(2);
  if (const json* v = page.table_or_note(s, "variance", "variance")) {
    s.blocks.push_back(Paragraph{page.tr(
        "The mean of q·k in units of its theoretical standard deviation √d, with the 95% "
        "confidence interval, for five distributions of the components (all mean 0, variance 1).",
        "q·k 的均值（以理论标准差 √d 为单位）及其 95% 置信区间，分量取五种分布（均值 0、方差 "
        "1）。")});
    Figure f;
    f.id = "c3-mean";
    f.caption = page.tr("C3: mean of q·k / √d against d, with 95% confidence intervals; theory 0.",
                        "C3：q·k / √d 的均值随 d 的变化，含 95% 置信区间；理论值 0。");
    f.sources = {csv_name("variance", "variance")};
    Panel p{"",
            page.tr("dimension d", "维度 d"),
            page.tr("mean of q·k / √d", "q·k / √d 的均值"),
            true,
            false,
            "set xtics 1,4\nset key top right",
            {}};
    p.series = per_distribution(v, {"d", "mean", "mean_ci_low", "mean_ci_high"},
                                "1:($2/sqrt($1)):($3/sqrt($1)):($4/sqrt($1))", "yerrorbars");
    Series zero{page.tr("theory: 0", "理论：0"),
                {"d", "theory_mean"},
                {},
                "1:2",
                "lines dt 2 lc rgb 'black'"};
    for (double d : distinct_numbers(v, "d")) zero.rows.push_back({d, 0.0});
    p.series.push_back(zero);
    f.panels = {p};
    page.figure(s, f);
    page.key_rows(
        s, "variance", "variance",
        where(v,
              [](Row r) {
                const double d = num(r, "d");
                return str(r, "distribution") == "normal" &&
                       (d == 1 || d == 64 || d == 512 || d == 4096);
              }),
        {"distribution", "d", "samples", "mean", "mean_ci_low", "mean_ci_high", "mean_covered"},
        page.tr("Key rows (normal components):", "关键行（正态分量）："));
  }
  if (const json* dv = page.table("derive", "derive")) {
    page.key_rows(s, "derive", "derive",
                  where(dv,
                        [](Row r) {
                          return str(r, "distribution") == "normal" &&
                                 str(r, "term") == "E[q_i k_i]";
                        }),
                  {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low",
                   "ci_high", "covered"},
                  page.tr("The derivation's first step:", "推导的第一步："));
  }
  page.verdicts(s, "C3");
}

void section_c4(Page& page) {
  Section& s = page.claim_section(3);
  if (const json* v = page.table_or_note(s, "variance", "variance")) {
    Figure f;
    f.id = "c4-variance";
    f.caption = page.tr(
        "C4: Var(q·k) against d on log-log axes, 95% confidence intervals (from the "
        "sample's fourth moment), theory Var = d.",
        "C4：Var(q·k) 随 d 的变化（双对数坐标），95% 置信区间（由样本四阶矩得到），理论 Var = "
        "d。");
    f.sources = {csv_name("variance", "variance")};
    f.height = 480;
    Panel p{"",
            page.tr("dimension d", "维度 d"),
            page.tr("Var(q·k)", "Var(q·k)"),
            true,
            true,
            "set xtics 1,4\nset key top left",
            {}};
    const Rows normal = where(v, [](Row r) { return str(r, "distribution") == "normal"; });
    const Series theory =
        series(page.tr("theory: Var = d", "理论：Var = d"), normal, {"d", "theory_variance"}, "1:2",
               "lines dt 2 lw 1.5 lc rgb 'black'");
    p.series = per_distribution(v, {"d", "variance", "variance_ci_low", "variance_ci_high"},
                                "1:2:3:4", "yerrorbars");
    p.series.push_back(theory);
    f.panels = {p};
    page.figure(s, f);
    page.key_rows(s, "variance", "variance",
                  where(v,
                        [](Row r) {
                          const double d = num(r, "d");
                          return str(r, "distribution") == "normal" &&
                                 (d == 1 || d == 16 || d == 256 || d == 4096);
                        }),
                  {"distribution", "d", "samples", "variance", "variance_ci_low",
                   "variance_ci_high", "theory_variance", "variance_covered"},
                  page.tr("Key rows (normal components):", "关键行（正态分量）："));
  }
  if (const json* dv = page.table("derive", "derive")) {
    page.key_rows(
        s, "derive", "derive", where(dv, [](Row r) { return str(r, "distribution") == "normal"; }),
        {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low", "ci_high",
         "covered"},
        page.tr("Each step of the derivation at d = 512 (normal components; the CSV has all "
                "five distributions):",
                "d = 512 时推导的每一步（正态分量；CSV 中有全部五种分布）："));
  }
  page.verdicts(s, "C4");
}

void section_c5(Page& page) {
  Section& s = page.claim_section(4);
  if (const json* v = page.table_or_note(s, "variance", "variance")) {
    page.key_rows(
        s, "variance", "variance", where(v, [](Row r) { return num(r, "d") == 512; }),
        {"distribution", "d", "samples", "variance", "variance_ci_low", "variance_ci_high",
         "theory_variance", "variance_covered", "kurtosis"},
        page.tr("The d = 512 rows, one per distribution:", "d = 512 的各行（每种分布一行）："));
  }
  if (const json* h = page.table_or_note(s, "saturation", "score_histogram")) {
    Figure f;
    f.id = "c5-score-histograms";
    f.caption = page.tr(
        "C5: histograms of the scores, unscaled q·k (left) and scaled q·k/√d "
        "(right), at several d; dashed: the normal density N(0, s²).",
        "C5：分数直方图，未缩放的 q·k（左）与缩放后的 q·k/√d（右），不同 d；虚线：正态密度 "
        "N(0, s²)。");
    f.sources = {csv_name("saturation", "score_histogram")};
    f.columns = 2;
    f.width = 980;
    f.height = 400;
    Panel pu{page.tr("unscaled: q·k", "未缩放：q·k"),
             page.tr("score", "分数"),
             page.tr("probability density", "概率密度"),
             false,
             false,
             "set key top right",
             {}};
    Panel ps{page.tr("scaled: q·k / √d", "缩放：q·k / √d"),
             page.tr("score", "分数"),
             page.tr("probability density", "概率密度"),
             false,
             false,
             "set key top right\nset xrange [-5:5]",
             {}};
    std::size_t i = 0;
    for (double d : distinct_numbers(h, "d")) {
      for (auto* panel : {&pu, &ps}) {
        const std::string scale = panel == &pu ? "1" : "1/sqrt(d)";
        const Rows rows =
            where(h, [&](Row r) { return num(r, "d") == d && str(r, "scale") == scale; });
        const int lt = static_cast<int>(i) + 1;
        panel->series.push_back(series(fmt::format("d = {}", d), rows,
                                       {"bin_low", "bin_high", "density"}, "(($1+$2)/2):3",
                                       fmt::format("histeps lw 1.5 lt {}", lt)));
        panel->series.push_back(series("", rows, {"bin_low", "bin_high", "theory_density"},
                                       "(($1+$2)/2):3", fmt::format("lines dt 2 lt {}", lt)));
      }
      ++i;
    }
    f.panels = {pu, ps};
    page.figure(s, f);
  }
  page.verdicts(s, "C5");
}

void section_c6(Page& page) {
  Section& s = page.claim_section(5);
  if (const json* v = page.table_or_note(s, "variance", "variance")) {
    Figure f;
    f.id = "c6-scaled-variance";
    f.caption = page.tr(
        "C6: variance of the scaled score q·k/√d against d, 95% confidence "
        "intervals; theory 1 for every d.",
        "C6：缩放后分数 q·k/√d 的方差随 d 的变化，95% 置信区间；理论值对所有 d 都是 1。");
    f.sources = {csv_name("variance", "variance")};
    Panel p{"",
            page.tr("dimension d", "维度 d"),
            page.tr("Var(q·k / √d)", "Var(q·k / √d)"),
            true,
            false,
            "set xtics 1,4\nset key top right",
            {}};
    p.series = per_distribution(
        v, {"d", "scaled_variance", "scaled_variance_ci_low", "scaled_variance_ci_high"}, "1:2:3:4",
        "yerrorbars");
    Series one{
        page.tr("theory: 1", "理论：1"), {"d", "theory"}, {}, "1:2", "lines dt 2 lc rgb 'black'"};
    for (double d : distinct_numbers(v, "d")) one.rows.push_back({d, 1.0});
    p.series.push_back(one);
    f.panels = {p};
    page.figure(s, f);
  }
  if (const json* dv = page.table("derive", "derive")) {
    page.key_rows(s, "derive", "derive",
                  where(dv, [](Row r) { return str(r, "term") == "Var(q.k/sqrt(d))"; }),
                  {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low",
                   "ci_high", "covered"},
                  page.tr("Var(cX) = c²Var(X) with c = 1/√d, at d = 512:",
                          "Var(cX) = c²Var(X)，c = 1/√d，d = 512："));
  }
  page.verdicts(s, "C6");
}

void section_non_ideal(Page& page) {
  Section& s = page.section(
      "non-ideal", page.tr("Beyond the article: non-ideal inputs", "超出原文：非理想输入"));
  s.blocks.push_back(Paragraph{page.tr(
      "The derivation assumes independent components with mean 0 and variance 1. Left: other "
      "distributions with the same two moments give the same variance (only the width of the "
      "interval changes, through the fourth moment). Right: what each broken assumption does "
      "to the variance within one row of scores, which is what softmax sees, against its "
      "closed form.",
      "推导假设分量独立、均值 0、方差 "
      "1。左：其他分布只要前两阶矩相同，方差就相同（只是四阶矩改变置信区间"
      "的宽度）。右：每个被打破的假设如何改变同一行分数内部的方差（这正是 softmax "
      "看到的），并与闭式解对比。")});
  const json* v = page.table("variance", "variance");
  const json* n = page.table("variance", "variance_noniid");
  if (!v) page.note(s, page.absent("variance", "variance"));
  if (!n) page.note(s, page.absent("variance", "variance_noniid"));
  if (v || n) {
    Figure f;
    f.id = "beyond-non-ideal";
    f.caption = page.tr(
        "Non-ideal inputs. Left: Var(q·k)/d per distribution with 95% intervals. "
        "Right: within-row variance / d against the parameter of each case "
        "(points: measured with 95% intervals; lines: closed form).",
        "非理想输入。左：各分布的 Var(q·k)/d 及 95% 区间。右：各被打破的假设下行内方差 / d 随 "
        "d 的变化"
        "（点：测量值及 95% 区间；线：闭式解）。");
    if (v) f.sources.push_back(csv_name("variance", "variance"));
    if (n) f.sources.push_back(csv_name("variance", "variance_noniid"));
    f.columns = 2;
    f.width = 980;
    f.height = 420;
    if (v) {
      Panel p{page.tr("five distributions", "五种分布"),
              page.tr("dimension d", "维度 d"),
              page.tr("Var(q·k) / d", "Var(q·k) / d"),
              true,
              false,
              "set xtics 1,4\nset key top right",
              {}};
      p.series = per_distribution(v, {"d", "variance", "variance_ci_low", "variance_ci_high"},
                                  "1:($2/$1):($3/$1):($4/$1)", "yerrorbars");
      f.panels.push_back(p);
    }
    if (n) {
      // One series per (case, parameter), against d: within-row variance / d is 1 when
      // 1/sqrt(d) is the right normaliser, and (1/right_scale_ratio)^2 otherwise.
      Panel p{page.tr("broken assumptions", "被打破的假设"),
              page.tr("dimension d", "维度 d"),
              page.tr("within-row variance / d", "行内方差 / d"),
              true,
              true,
              "set xtics 1,4\nset key top left",
              {}};
      std::size_t i = 0;
      for (const auto& c : distinct(n, "case")) {
        for (const auto& par : distinct(where_table(n, "case", c), "parameter")) {
          const Rows rows =
              where(n, [&](Row r) { return str(r, "case") == c && str(r, "parameter") == par; });
          const int lt = static_cast<int>(i) + 1;
          p.series.push_back(
              series(fmt::format("{} {}", c, par), rows,
                     {"d", "within_row_variance", "within_row_ci_low", "within_row_ci_high"},
                     "1:($2/$1):($3/$1):($4/$1)",
                     fmt::format("yerrorbars lt {} pt {} ps 0.7", lt, point_type(i))));
          p.series.push_back(series("", rows, {"d", "within_row_theory"}, "1:($2/$1)",
                                    fmt::format("lines lt {} dt 2", lt)));
          ++i;
        }
      }
      f.panels.push_back(p);
    }
    page.figure(s, f);
  }
  if (n) {
    page.key_rows(
        s, "variance", "variance_noniid", where(n, [](Row) { return true; }),
        {"case", "parameter", "d", "mean", "theory_mean", "variance", "theory_variance",
         "within_row_variance", "within_row_theory", "within_row_covered", "right_scale_ratio"},
        page.tr("Each case against its closed form; right_scale_ratio is the right normaliser "
                "divided by 1/√d (1: 1/√d is right):",
                "每种情形与其闭式解；right_scale_ratio 为正确的归一化因子除以 1/√d（1 表示 1/√d "
                "正确）："));
  }
  page.other_verdicts(s, "variance");
  page.other_verdicts(s, "derive");
}

}  // namespace sdpa::report
