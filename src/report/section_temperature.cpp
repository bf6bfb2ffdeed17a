// The report's sections for the temperature experiment: the sweep of c in softmax(c QK^T/sqrt(d)).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {

void section_temperature(Page& page) {
  Section& s = page.section(
      "temperature", page.tr("Beyond the article: the temperature sweep", "超出原文：温度扫描"));
  s.blocks.push_back(Paragraph{page.tr(
      "softmax(c·QKᵀ/√d) for c from 1e-3 to 1e2: too large a scale freezes attention, too "
      "small a scale makes it uniform. Uniform attention still passes gradient, but every "
      "query then receives the same output: output diversity (variance of the output across "
      "queries / variance of V) measures the preference that is left.",
      "对 c 从 1e-3 到 1e2 计算 "
      "softmax(c·QKᵀ/√d)：缩放过大则注意力冻结，过小则变均匀。均匀的注意力仍能"
      "传递梯度，但每个查询得到相同的输出：输出多样性（输出在各查询间的方差 / V "
      "的方差）衡量剩下的区分度。")});
  if (const json* t = page.table_or_note(s, "temperature", "temperature")) {
    Figure f;
    f.id = "temperature";
    f.caption = page.tr(
        "Temperature sweep: normalised entropy, gradient reaching Q (median, solid; "
        "99th percentile, dashed) and output diversity against c.",
        "温度扫描：归一化熵、到达 Q 的梯度（中位数实线，第 99 百分位虚线）及输出多样性随 c "
        "的变化。");
    f.sources = {csv_name("temperature", "temperature")};
    f.columns = 3;
    f.width = 980;
    f.height = 380;
    const std::string c_label = page.tr("c (scale = c/√d)", "c（缩放 = c/√d）");
    Panel pe{page.tr("entropy / ln N", "熵 / ln N"),
             c_label,
             page.tr("normalised entropy", "归一化熵"),
             true,
             false,
             "set yrange [-0.05:1.05]\nset key bottom left",
             {}};
    Panel pg{page.tr("‖dQ‖ per row", "每行 ‖dQ‖"),
             c_label,
             page.tr("gradient norm", "梯度范数"),
             true,
             true,
             "set key bottom center",
             {}};
    Panel po{page.tr("output diversity", "输出多样性"),
             c_label,
             page.tr("Var across queries / Var(V)", "查询间方差 / Var(V)"),
             true,
             false,
             "set key top left\nset yrange [0:*]",
             {}};
    std::size_t i = 0;
    for (double d : distinct_numbers(t, "d")) {
      const Rows rows = where(t, [&](Row r) { return num(r, "d") == d; });
      const int lt = static_cast<int>(i) + 1;
      const std::string style = fmt::format("linespoints lt {} pt {} ps 0.6", lt, point_type(i));
      const std::string title = fmt::format("d = {}", d);
      pe.series.push_back(series(title, rows, {"c", "normalized_entropy"}, "1:2", style));
      if (i == 0) {
        pe.series.push_back(series(page.tr("theory (REM, s = c)", "理论（REM，s = c）"), rows,
                                   {"c", "entropy_theory", "n_keys"}, "1:($2/log($3))",
                                   "lines dt 2 lc rgb '#e8112d'"));
      }
      pg.series.push_back(series(title + page.tr(" median", " 中位数"), rows, {"c", "grad_q_norm"},
                                 "1:($2 > 0 ? $2 : NaN)", style));
      pg.series.push_back(series(title + " p99", rows, {"c", "grad_q_p99"}, "1:($2 > 0 ? $2 : NaN)",
                                 fmt::format("lines lt {} dt 2", lt)));
      po.series.push_back(series(title, rows, {"c", "output_diversity"}, "1:2", style));
      ++i;
    }
    f.panels = {pe, pg, po};
    page.figure(s, f);
    // The row with the largest median gradient, per d, and the ends of the sweep.
    Rows key;
    for (double d : distinct_numbers(t, "d")) {
      const Rows rows = where(t, [&](Row r) { return num(r, "d") == d; });
      Row best = nullptr;
      for (Row r : rows) {
        if (!best || num(r, "grad_q_norm") > num(best, "grad_q_norm")) best = r;
      }
      key.push_back(rows.front());
      if (best && best != rows.front() && best != rows.back()) key.push_back(best);
      if (rows.back() != rows.front()) key.push_back(rows.back());
    }
    page.key_rows(s, "temperature", "temperature", key,
                  {"d", "n_keys", "c", "scale_value", "normalized_entropy", "max_prob",
                   "grad_q_norm", "grad_q_p99", "grad_q_dead", "output_diversity"},
                  page.tr("The ends of the sweep and the c with the largest median gradient:",
                          "扫描的两端，以及中位梯度最大的 c："));
  }
  page.other_verdicts(s, "temperature");
}

}  // namespace sdpa::report
