// The report's sections for the saturation experiment: C7, the (d, N) freezing boundary, the
// alternatives to 1/sqrt(d).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {
namespace {

// The N the C7 figure shows: 128 when present (the verdict's cell, d = 1024, N = 128), else the
// middle of the grid.
double pick_n(const json* t) {
  const auto ns = distinct_numbers(t, "n_keys");
  if (ns.empty()) return std::nan("");
  if (std::find(ns.begin(), ns.end(), 128.0) != ns.end()) return 128;
  return ns[ns.size() / 2];
}

}  // namespace

void section_c7(Page& page) {
  Section& s = page.claim_section(6);
  if (const json* t = page.table_or_note(s, "saturation", "saturation")) {
    const double n = pick_n(t);
    s.blocks.push_back(Paragraph{page.tr(
        fmt::format(
            "Random unit-variance Q, K, V and upstream gradient, N = {} keys, through "
            "the project's attention forward and backward. The gradient is shown as a "
            "distribution over query rows: median (solid) and 99th percentile (dashed), "
            "and the fraction of dead rows (norm below 1/1000 of the norm uniform attention at "
            "1/√d gives, sqrt(d(N−1))/N: a closed form, the same for every scale), with its "
            "95% bootstrap interval over rows and, dashed, the top-two-gap prediction.",
            n),
        fmt::format(
            "随机的单位方差 Q、K、V 与上游梯度，N = {} 个键，经过本项目的注意力前向与反向。"
            "梯度以各查询行的分布呈现：中位数（实线）与第 99 百分位（虚线），以及“死”行的比例"
            "（范数低于 1/√d 下均匀注意力梯度 sqrt(d(N−1))/N 的千分之一：闭式值，各缩放相同），"
            "附行自助法 95% 区间，虚线为最大两项间隔的预测。",
            n))});
    Figure f;
    f.id = "c7-saturation";
    f.caption = page.tr(
        fmt::format("C7: saturation against d for each scale (N = {} keys): "
                    "entropy (dashed: the random-energy-model theory, ln N − s²/2 below s_c = "
                    "√(2 ln N), Poisson-Dirichlet from 1.5 s_c on, a gap between), largest "
                    "probability, "
                    "gradient reaching Q, dead rows.",
                    n),
        fmt::format(
            "C7：各缩放下饱和程度随 d 的变化（N = {} 个键）：熵（虚线：随机能量模型的理论值，"
            "s_c = √(2 ln N) 以下为 ln N − s²/2，1.5 s_c 起为 Poisson-Dirichlet，"
            "两者之间留空）、最大概率、到达 Q 的梯度、死行比例。",
            n));
    f.sources = {csv_name("saturation", "saturation")};
    f.columns = 2;
    f.width = 980;
    f.height = 720;
    const std::string d_label = page.tr("dimension d", "维度 d");
    Panel pe{
        page.tr("attention entropy", "注意力熵"),
        d_label,
        page.tr("entropy (nats)", "熵（nats）"),
        true,
        false,
        fmt::format("set xtics 1,4\nset key bottom left\nset yrange [0:{}]", 1.1 * std::log(n)),
        {}};
    Panel pm{page.tr("largest attention probability", "最大注意力概率"),
             d_label,
             page.tr("max p (mean over rows)", "max p（行平均）"),
             true,
             false,
             "set xtics 1,4\nset key top left\nset yrange [0:1.05]",
             {}};
    Panel pg{page.tr("‖dQ‖ per query row", "每个查询行的 ‖dQ‖"),
             d_label,
             page.tr("gradient norm", "梯度范数"),
             true,
             true,
             "set xtics 1,4\nset key top left",
             {}};
    Panel pd{page.tr("dead rows of dQ", "dQ 的死行"),
             d_label,
             page.tr("fraction of rows (norm < 1e-3 × uniform-attention norm)",
                     "行比例（范数 < 1e-3 × 均匀注意力范数）"),
             true,
             false,
             "set xtics 1,4\nset key top left\nset yrange [-0.02:1.02]",
             {}};
    std::size_t i = 0;
    for (const auto& scale : distinct(t, "scale")) {
      const Rows rows =
          where(t, [&](Row r) { return num(r, "n_keys") == n && str(r, "scale") == scale; });
      const int lt = static_cast<int>(i) + 1;
      const std::string style = fmt::format("linespoints lt {} pt {} ps 0.8", lt, point_type(i));
      const std::string title = scale_title(scale);
      pe.series.push_back(series(title, rows, {"d", "entropy"}, "1:2", style));
      pe.series.push_back(series("", rows, {"d", "entropy_theory"}, "1:($2 >= 0 ? $2 : NaN)",
                                 fmt::format("lines dt 2 lt {}", lt)));
      pm.series.push_back(series(title, rows, {"d", "max_prob"}, "1:2", style));
      // Only the medians get a legend entry; the caption says that dashed is the p99.
      pg.series.push_back(
          series(title, rows, {"d", "grad_q_norm"}, "1:($2 > 0 ? $2 : NaN)", style));
      pg.series.push_back(series("", rows, {"d", "grad_q_p99"}, "1:($2 > 0 ? $2 : NaN)",
                                 fmt::format("lines dt 2 lt {}", lt)));
      pd.series.push_back(
          series(title, rows, {"d", "grad_q_dead", "grad_q_dead_ci_low", "grad_q_dead_ci_high"},
                 "1:2:3:4", fmt::format("yerrorlines lt {} pt {} ps 0.8", lt, point_type(i))));
      if (scale == "1") {
        pd.series.push_back(series(page.tr("prediction", "预测"), rows, {"d", "grad_q_dead_theory"},
                                   "1:2", fmt::format("lines dt 2 lt {}", lt)));
      }
      ++i;
    }
    f.panels = {pe, pm, pg, pd};
    page.figure(s, f);
    page.key_rows(
        s, "saturation", "saturation", where(t, [&](Row r) { return num(r, "n_keys") == n; }),
        {"scale", "d", "n_keys", "logit_std", "entropy", "entropy_theory", "regime", "max_prob",
         "grad_q_norm", "grad_q_mean", "grad_q_p99", "grad_q_dead", "grad_logits_norm"},
        page.tr(fmt::format("Key rows (N = {}); grad_*_norm is the median over rows:", n),
                fmt::format("关键行（N = {}）；grad_*_norm 为各行中位数：", n)));
  }
  if (const json* region = page.table_or_note(s, "saturation", "c7_region")) {
    page.key_rows(
        s, "saturation", "c7_region", all_rows(region),
        {"d", "n_keys", "regime_unscaled", "median_ratio", "median_ratio_ci_low",
         "median_ratio_ci_high", "unscaled_dead", "unscaled_dead_ci_low", "unscaled_dead_ci_high",
         "unscaled_dead_theory", "scaled_dead_ci_high", "mean_ratio", "verdict"},
        page.tr(
            "The verdict cell by cell over (d, N): median |dQ| unscaled over scaled on the same "
            "rows, with its 95% paired bootstrap interval; dead fractions with their intervals "
            "and the top-two-gap prediction exp(−t*·a_N/√d):",
            "逐格结论 (d, N)：同一批行上未缩放与缩放的 |dQ| 中位数之比及其配对自助法 95% "
            "区间；死行比例及其区间与最大两项间隔预测 exp(−t*·a_N/√d)："));
  }
  page.verdicts(s, "C7");
}

void section_freezing(Page& page) {
  Section& s = page.section("freezing", page.tr("Beyond the article: the (d, N) freezing boundary",
                                                "超出原文：(d, N) 冻结边界"));
  s.blocks.push_back(Paragraph{page.tr(
      "Saturation depends on the number of keys N as well as on d. For N Gaussian logits of "
      "standard deviation s the entropy is ln N − s²/2 while s² < 2 ln N, and collapses beyond "
      "(the freezing of the random energy model: past s_c = √(2 ln N) the weights follow a "
      "Poisson-Dirichlet law with m = s_c/s and entropy ψ(1) − ψ(1 − m), of order 1; at finite "
      "N the annealed line already bends once (e^{s²} − 1)/N passes 1). Unscaled logits have "
      "s = √d, so they freeze once d passes 2 ln N (red line; the grid starts at d = 1 so that "
      "both sides show); scaled ones (s = 1) never do. Colour: measured "
      "entropy / ln N (1 = uniform, 0 = one-hot); the number in each cell is that value.",
      "饱和不仅取决于 d，也取决于键的个数 N。对 N 个标准差为 s 的高斯 logits，当 s² < 2 ln N "
      "时熵为 "
      "ln N − s²/2，超过后熵崩塌（随机能量模型的冻结）。未缩放的 logits 有 s = √d，因此 d 超过 2 "
      "ln N"
      "（红线）后冻结；缩放后（s = 1）永远不会。颜色：测得的熵 / ln N（1 = 均匀，0 = "
      "one-hot）；格中数字即此值。")});
  if (const json* t = page.table_or_note(s, "saturation", "saturation")) {
    Figure f;
    f.id = "freezing-boundary";
    f.caption = page.tr(
        "Entropy / ln N over (d, N), unscaled (left) and scaled by 1/√d (right); "
        "red: the boundary d = 2 ln N.",
        "熵 / ln N 在 (d, N) 上的分布，未缩放（左）与 1/√d 缩放（右）；红线：边界 d = 2 ln N。");
    f.sources = {csv_name("saturation", "saturation")};
    f.columns = 2;
    f.width = 980;
    f.height = 430;
    const auto ds = distinct_numbers(t, "d");
    const auto ns = distinct_numbers(t, "n_keys");
    // Cells span half-way (in log space) to the neighbouring grid values.
    auto edges = [](const std::vector<double>& g, std::size_t i) {
      const double lo = i > 0 ? std::sqrt(g[i - 1] * g[i]) : g[i] / std::sqrt(g[1] / g[0]);
      const double hi =
          i + 1 < g.size() ? std::sqrt(g[i] * g[i + 1]) : g[i] * std::sqrt(g[i] / g[i - 1]);
      return std::pair{lo, hi};
    };
    if (ds.size() >= 2 && ns.size() >= 2) {
      const double dlo = edges(ds, 0).first, dhi = edges(ds, ds.size() - 1).second;
      const double nlo = edges(ns, 0).first, nhi = edges(ns, ns.size() - 1).second;
      for (const std::string scale : {"1", "1/sqrt(d)"}) {
        Panel p{scale == "1" ? page.tr("unscaled (scale 1)", "未缩放（scale 1）")
                             : page.tr("scaled (1/√d)", "缩放（1/√d）"),
                page.tr("dimension d", "维度 d"),
                page.tr("number of keys N", "键的个数 N"),
                true,
                true,
                fmt::format("set xrange [{}:{}]\nset yrange [{}:{}]\nset cbrange [0:1]\n"
                            "set palette defined (0 '#440154', 0.25 '#3b528b', 0.5 '#21918c', "
                            "0.75 '#5ec962', 1 '#fde725')\nset cblabel 'entropy / ln N'\n"
                            "set xtics 1,4\nset ytics 2,8\nset key bottom right opaque\nunset grid",
                            dlo, dhi, nlo, nhi),
                {}};
        Series cells{"",
                     {"d", "n_keys", "d_low", "d_high", "n_low", "n_high", "entropy", "ln_n"},
                     {},
                     "1:2:3:4:5:6:($7/$8)",
                     "boxxyerror fs solid 1.0 noborder lc palette"};
        for (std::size_t i = 0; i < ds.size(); ++i) {
          for (std::size_t j = 0; j < ns.size(); ++j) {
            const Rows r = where(t, [&](Row row) {
              return num(row, "d") == ds[i] && num(row, "n_keys") == ns[j] &&
                     str(row, "scale") == scale;
            });
            if (r.empty()) continue;
            const auto [a, b] = edges(ds, i);
            const auto [c, e] = edges(ns, j);
            cells.rows.push_back({ds[i], ns[j], a, b, c, e, num(r[0], "entropy"), std::log(ns[j])});
          }
        }
        // The value in each cell: white on the dark half of the palette, black on the light.
        Series labels = cells;
        labels.title = "";
        labels.using_spec = "1:($7/$8 >= 0.5 ? $2 : NaN):(sprintf('%.2f', $7/$8))";
        labels.style = "labels tc rgb '#000000' font ',10'";
        Series dark_labels = labels;
        dark_labels.using_spec = "1:($7/$8 < 0.5 ? $2 : NaN):(sprintf('%.2f', $7/$8))";
        dark_labels.style = "labels tc rgb '#ffffff' font ',10'";
        Series boundary{page.tr("d = 2 ln N", "d = 2 ln N"),
                        {"boundary_d", "boundary_n"},
                        {},
                        "1:2",
                        "lines lw 3 lc rgb '#e8112d'"};
        for (int k = 0; k <= 60; ++k) {
          const double nn = nlo * std::pow(nhi / nlo, k / 60.0);
          boundary.rows.push_back({2 * std::log(nn), nn});
        }
        p.series = {cells, labels, dark_labels, boundary};
        f.panels.push_back(p);
      }
      page.figure(s, f);
    } else {
      page.note(s, page.tr("The saturation grid has fewer than two values of d or N.",
                           "saturation 网格中 d 或 N 的取值少于两个。"));
    }
  }
  if (const json* curve = page.table_or_note(s, "saturation", "entropy_curve")) {
    Figure f;
    f.id = "freezing-theory";
    f.caption = page.tr(
        "Softmax entropy of N Gaussian logits of standard deviation s (points) against the two "
        "sides of the theory: the annealed line ln N − s²/2 (solid) and the Poisson-Dirichlet "
        "frozen phase ψ(1) − ψ(1 − s_c/s) past s_c = √(2 ln N) (dashed).",
        "N 个标准差为 s 的高斯 logits 的 softmax 熵（点）与理论的两侧：退火直线 ln N − s²/2"
        "（实线）与 s_c = √(2 ln N) 之后的 Poisson-Dirichlet 冻结相 ψ(1) − ψ(1 − s_c/s)（虚线）。");
    f.sources = {csv_name("saturation", "entropy_curve")};
    f.width = 760;
    f.height = 460;
    Panel p{page.tr("both sides of the freezing point", "冻结点两侧"),
            "s",
            page.tr("entropy (nats)", "熵（nats）"),
            false,
            false,
            "set key top right\nset yrange [0:*]",
            {}};
    std::size_t i = 0;
    for (double n : distinct_numbers(curve, "n_keys")) {
      const Rows rows = where(curve, [&](Row r) { return num(r, "n_keys") == n; });
      const int lt = static_cast<int>(i) + 1;
      p.series.push_back(series(fmt::format("N = {}", n), rows, {"s", "entropy"}, "1:2",
                                fmt::format("points lt {} pt {} ps 0.6", lt, point_type(i))));
      p.series.push_back(series("", rows, {"s", "entropy_annealed"}, "1:($2 >= 0 ? $2 : NaN)",
                                fmt::format("lines lt {}", lt)));
      p.series.push_back(series("", rows, {"s", "entropy_frozen", "n_keys"},
                                "1:($2 <= log($3) ? $2 : NaN)",
                                fmt::format("lines dt 2 lt {}", lt)));
      ++i;
    }
    f.panels = {p};
    page.figure(s, f);
  }
  if (const json* fr = page.table("saturation", "freezing")) {
    page.key_rows(
        s, "saturation", "freezing", where(fr, [](Row) { return true; }),
        {"n_keys", "freezing_d", "crossover_s", "freezing_s", "parted_s", "first_parted_d",
         "liquid_max_error", "frozen_max_error"},
        page.tr("Per N: the finite-N crossover s = √ln(N+1) (where Var Z/(EZ)² = (e^{s²} − 1)/N "
                "reaches 1), the freezing point s_c = √(2 ln N) (d = 2 ln N), where the annealed "
                "line parts from the measurement, and the largest gap between measurement and "
                "theory on the liquid side (ln N − s²/2) and deep on the frozen side "
                "(Poisson-Dirichlet, ψ(1) − ψ(1 − s_c/s), the N → ∞ law):",
                "每个 N：有限 N 交叉点 s = √ln(N+1)（Var Z/(EZ)² = (e^{s²} − 1)/N 达到 1 处）、"
                "冻结点 s_c = √(2 ln N)（d = 2 ln N）、退火直线与测量分离处，以及液相一侧"
                "（ln N − s²/2）与深冻结相一侧（Poisson-Dirichlet，ψ(1) − ψ(1 − s_c/s)，N → ∞ "
                "极限）测量与理论的最大差距："));
  }
  page.other_verdicts(s, "saturation");
}

void section_alternatives(Page& page) {
  Section& s =
      page.section("alternatives", page.tr("Beyond the article: QK-norm, soft-capping and 1/d",
                                           "超出原文：QK-norm、软截断与 1/d"));
  s.blocks.push_back(Paragraph{page.tr(
      "1/√d restores unit variance only if q and k have unit-variance components. Real models "
      "use other normalisers: 1/d (the scale μP uses), QK-norm (q and k RMS-normalised before the "
      "product, "
      "so the logit is √d·cos(q, k)) and logit soft-capping (Gemma 2: 50·tanh(y/50)). Here "
      "they are compared when q and k keep unit variance (σ = 1) and when their activations "
      "have grown four-fold (σ = 4), N = 1024 keys.",
      "只有当 q、k 的分量方差为 1 时，1/√d 才能把方差拉回 1。实际模型还使用其他归一化：1/d"
      "（μP 所用的缩放）、QK-norm（点积前对 q、k 做 RMS 归一化，logit 即 √d·cos(q, k)）以及 logit "
      "软截断"
      "（Gemma 2：50·tanh(y/50)）。这里比较 q、k 方差为 1（σ = 1）与激活增大四倍（σ = 4）"
      "两种情形，N = 1024 个键。")});
  if (const json* t = page.table_or_note(s, "saturation", "alternatives")) {
    Figure f;
    f.id = "alternatives";
    f.caption = page.tr(
        "Normalised entropy of the attention row against d for each normaliser, with q and k of "
        "unit variance (left) and grown four-fold (right). 1 = uniform, 0 = one-hot.",
        "各归一化方式下注意力行的归一化熵随 d 的变化：q、k 方差为 1（左）与增大四倍（右）。"
        "1 = 均匀，0 = one-hot。");
    f.sources = {csv_name("saturation", "alternatives")};
    f.columns = 2;
    f.width = 900;
    f.height = 380;
    std::vector<std::string> methods;
    for (auto m : {lab::Scale::one, lab::Scale::inv_sqrt_d, lab::Scale::inv_d, lab::Scale::qk_norm,
                   lab::Scale::softcap}) {
      methods.push_back(lab::scale_name(m));
    }
    for (double sigma : distinct_numbers(t, "sigma")) {
      Panel p{fmt::format("σ = {}", sigma),
              "d",
              page.tr("entropy / ln N", "熵 / ln N"),
              true,
              false,
              "set yrange [-0.05:1.05]\nset key center right",
              {}};
      for (std::size_t i = 0; i < methods.size(); ++i) {
        const Rows rows = where(t, [&](Row r) {
          return num(r, "sigma") == sigma && r->value("method", "") == methods[i];
        });
        p.series.push_back(
            series(methods[i], rows, {"d", "normalized_entropy"}, "1:2",
                   fmt::format("linespoints lt {} pt {} ps 0.6", i + 1, point_type(i))));
      }
      f.panels.push_back(p);
    }
    page.figure(s, f);
    const std::vector<double> ds = distinct_numbers(t, "d");
    if (ds.empty()) {
      page.note(s, page.tr("Not shown: the table `alternatives` has no row with a numeric `d`.",
                           "未显示：表 `alternatives` 没有数值 `d` 的行。"));
      return;
    }
    const double d_max = ds.back();
    page.key_rows(
        s, "saturation", "alternatives", where(t, [&](Row r) { return num(r, "d") == d_max; }),
        {"sigma", "d", "method", "logit_std_theory", "logit_std", "entropy", "max_prob",
         "grad_logits_norm", "grad_logits_dead"},
        page.tr("At the largest d: only QK-norm keeps the logits at standard deviation 1 when "
                "the activations grow; soft-capping at 50 leaves a standard deviation of 16 "
                "almost untouched.",
                "最大 d 处：激活增大时只有 QK-norm 让 logits 的标准差保持为 1；"
                "在 50 处软截断几乎不改变 16 的标准差。"));
  }
}

}  // namespace sdpa::report
