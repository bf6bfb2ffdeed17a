// The report's sections for the softmax experiment: C1 (softmax(c x) against c) and C2 (the
// article's [1000, 10, 5]).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {

void section_c1(Page& page) {
  Section& s = page.claim_section(0);
  s.blocks.push_back(Paragraph{page.tr(
      "softmax(c·x) for a sweep of the multiplier c: the article's logits [1000, 10, 5] and 64 "
      "standard-normal logits. Normalised entropy 1 is uniform, 0 is one-hot.",
      "对乘数 c 扫描 softmax(c·x)：原文的 [1000, 10, 5] 和 64 个标准正态 logits。归一化熵为 1 "
      "表示均匀，0 表示 one-hot。")});
  if (const json* sweep = page.table_or_note(s, "softmax", "sweep")) {
    Figure f;
    f.id = "c1-softmax-sweep";
    f.caption = page.tr("C1: softmax(c·x) against c: entropy, largest probability, Jacobian norm.",
                        "C1：softmax(c·x) 随 c 的变化：熵、最大概率、雅可比范数。");
    f.sources = {csv_name("softmax", "sweep")};
    f.columns = 3;
    f.width = 980;
    f.height = 380;
    Panel pe{page.tr("entropy / ln N", "熵 / ln N"),
             page.tr("multiplier c", "乘数 c"),
             page.tr("normalised entropy (1 = uniform)", "归一化熵（1 = 均匀）"),
             true,
             false,
             "set yrange [-0.05:1.05]\nset key bottom left",
             {}};
    Panel pm{page.tr("largest probability", "最大概率"),
             page.tr("multiplier c", "乘数 c"),
             page.tr("max p (1 = one-hot)", "max p（1 = one-hot）"),
             true,
             false,
             "set yrange [0:1.05]\nset key top left",
             {}};
    Panel pj{page.tr("‖diag(p) − p pᵀ‖_F", "‖diag(p) − p pᵀ‖_F"),
             page.tr("multiplier c", "乘数 c"),
             page.tr("Jacobian norm (how much gradient passes)", "雅可比范数（可通过的梯度）"),
             true,
             true,
             "set key bottom left",
             {}};
    std::size_t i = 0;
    for (const auto& logits : distinct(sweep, "logits")) {
      const Rows rows = where(sweep, [&](Row r) { return str(r, "logits") == logits; });
      const std::string style = fmt::format("linespoints pt {} ps 0.6", point_type(i++));
      pe.series.push_back(series(logits, rows, {"c", "normalized_entropy"}, "1:2", style));
      pm.series.push_back(series(logits, rows, {"c", "max_prob"}, "1:2", style));
      // Jacobian norms of a one-hot output are exactly 0 (or below 1e-300): drawn as gaps on
      // the log axis, they are listed in the CSV.
      pj.series.push_back(
          series(logits, rows, {"c", "jacobian_norm"}, "1:($2 > 0 ? $2 : NaN)", style));
    }
    f.panels = {pe, pm, pj};
    page.figure(s, f);
    const Rows key = where(sweep, [](Row r) {
      const double c = num(r, "c");
      return str(r, "logits") == "normal-64" &&
             (std::abs(std::log10(c) - std::round(std::log10(c))) < 1e-9);
    });
    page.key_rows(s, "softmax", "sweep", key,
                  {"logits", "c", "entropy", "normalized_entropy", "max_prob", "effective_support",
                   "jacobian_norm"},
                  page.tr("Key rows (64 normal logits, c at powers of ten):",
                          "关键行（64 个正态 logits，c 取 10 的整数次幂）："));
  }
  page.verdicts(s, "C1");
}

void section_c2(Page& page) {
  Section& s = page.claim_section(1);
  if (const json* article = page.table_or_note(s, "softmax", "article")) {
    s.blocks.push_back(Paragraph{page.tr(
        "The stable softmax (maximum subtracted before exp) gives [1, e^-990, e^-995] exactly, "
        "with no overflow; the figure shows log10 of each probability and of the Jacobian row "
        "norm, i.e. how much gradient can reach each logit.",
        "稳定的 softmax（exp 之前先减去最大值）精确给出 [1, e^-990, "
        "e^-995]，不会溢出；图中是每个概率"
        "及雅可比矩阵每行范数的 log10，即能到达每个 logit 的梯度大小。")});
    Figure f;
    f.id = "c2-article-logits";
    f.caption = page.tr(
        "C2: softmax([1000, 10, 5]): log10 of each probability and of the gradient "
        "that can reach each logit.",
        "C2：softmax([1000, 10, 5])：各概率及可到达各 logit 的梯度的 log10。");
    f.sources = {csv_name("softmax", "article")};
    f.height = 380;
    Panel p{"",
            page.tr("logit position i (x = [1000, 10, 5])", "logit 位置 i（x = [1000, 10, 5]）"),
            page.tr("log10 (value)", "log10（数值）"),
            false,
            false,
            "set style fill solid 0.8 border -1\nset boxwidth 0.35\nset xtics 1\n"
            "set xrange [-0.6:2.6]\nset key bottom left",
            {}};
    const Rows rows = where(article, [](Row) { return true; });
    p.series.push_back(series(page.tr("log10 probability", "log10 概率"), rows,
                              {"i", "log10_probability"}, "($1 - 0.18):2", "boxes"));
    p.series.push_back(series(page.tr("log10 ‖Jacobian row i‖", "log10 ‖雅可比第 i 行‖"), rows,
                              {"i", "log10_jacobian_row_norm"}, "($1 + 0.18):2", "boxes"));
    f.panels = {p};
    page.figure(s, f);
    page.key_rows(
        s, "softmax", "article", rows,
        {"i", "logit", "probability", "log10_probability", "naive_float16", "naive_float32",
         "naive_float64", "log10_jacobian_row_norm"},
        page.tr("The article's row, stable and naive (naive = exp(x)/Σexp(x) in that format):",
                "原文的这一行，稳定算法与朴素算法（朴素 = 在该格式下计算 exp(x)/Σexp(x)）："));
  }
  if (const json* overflow = page.table("softmax", "overflow")) {
    page.key_rows(s, "softmax", "overflow", where(overflow, [](Row) { return true; }),
                  {"format", "max_finite", "ln_max", "exp_overflow_measured", "naive_article_p0"},
                  page.tr("Where exp overflows in each format (theory ln(max finite)):",
                          "各格式中 exp 溢出的位置（理论值 ln(最大有限值)）："));
  }
  page.verdicts(s, "C2");
}

}  // namespace sdpa::report
