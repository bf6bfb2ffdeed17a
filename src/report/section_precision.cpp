// The report's sections for the precision experiment: bits lost in low precision, where the naive
// softmax turns to NaN.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {

void section_precision(Page& page) {
  Section& s =
      page.section("precision", page.tr("Beyond the article: low precision", "超出原文：低精度"));
  s.blocks.push_back(Paragraph{page.tr(
      "The same logits rounded to float16, bfloat16 (emulated) and float32: an unscaled logit "
      "at d = 512 is √512 ≈ 22.6 times larger, and one might expect the probabilities to lose "
      "0.5·log2(d) = 4.5 bits; they lose about 6 (the lab measures and derives 6.1), because "
      "the significant probabilities sit at the largest logits, whose size grows faster than "
      "the rms (bits_lost_theory: log2 of the ratio of the significant logits' rms). In the "
      "naive softmax exp overflows in float16 once the row maximum passes 11.09. (Here only the "
      "logits are rounded; the whole pipeline, bfloat16 Q, K and V through the library's "
      "kernels, is the lab's table `pipeline`, written beside this page as "
      "data/precision-pipeline.csv.)",
      "同样的 logits 舍入到 float16、bfloat16（模拟）和 float32：d = 512 时未缩放的 logit 大 "
      "√512 ≈ "
      "22.6 倍，人们可能预期概率损失 0.5·log2(d) = 4.5 位；实际约损失 6 位（实验测得并推导出 "
      "6.1），因为显著的概率位于最大的 logits 处，其大小增长快于均方根（bits_lost_theory）。"
      "朴素 softmax 在 float16 中一旦行最大值超过 11.09，exp 就会溢出。（这里只舍入 logits；"
      "整个流水线，即 bfloat16 的 Q、K、V 经过库的计算核，见实验的表 pipeline，"
      "作为 data/precision-pipeline.csv 写在本页旁边。）")});
  const json* t = page.table("precision", "precision");
  const json* nan = page.table("precision", "naive_nan");
  if (!t) page.note(s, page.absent("precision", "precision"));
  if (t || nan) {
    Figure f;
    f.id = "precision";
    f.caption = page.tr(
        "Precision: effective bits of the probabilities per format (left) and the "
        "fraction of rows where the naive softmax gives NaN (right), unscaled vs "
        "scaled logits.",
        "精度：各格式下概率的有效位数（左），以及朴素 softmax 得到 NaN "
        "的行比例（右），未缩放与缩放对比。");
    f.columns = 2;
    f.width = 980;
    f.height = 380;
    // Formats on the x axis by index, one bar per scale.
    auto bars = [&](const json* table_rows, const std::string& column, const std::string& ylabel,
                    const std::string& title) {
      const auto formats = distinct(table_rows, "format");
      std::vector<std::string> labels;
      for (const auto& f : formats) labels.push_back("'" + f + "'");
      std::vector<BarGroup> groups;
      for (const auto& scale : distinct(table_rows, "scale")) {
        BarGroup g{scale_title(scale), {}};
        for (std::size_t k = 0; k < formats.size(); ++k) {
          for (Row r : where(table_rows, [&](Row r) {
                 return str(r, "format") == formats[k] && str(r, "scale") == scale;
               })) {
            g.rows.push_back({static_cast<double>(k), num(r, column)});
          }
        }
        groups.push_back(std::move(g));
      }
      return grouped_bars(title, page.tr("format", "格式"), ylabel, labels,
                          {"format_index", column}, groups,
                          "set style fill solid 0.8 border -1\nset boxwidth 0.35\nset key top "
                          "right\nset yrange [0:*]");
    };
    if (t) {
      f.sources.push_back(csv_name("precision", "precision"));
      f.panels.push_back(bars(t, "effective_bits", page.tr("effective bits of p", "p 的有效位数"),
                              page.tr("effective bits", "有效位数")));
    }
    if (nan) {
      f.sources.push_back(csv_name("precision", "naive_nan"));
      // Against d: unscaled rows (solid) turn to NaN once the row maximum, about
      // sqrt(2 d ln N), passes ln(max finite) of the format; scaled rows (dashed) never do.
      Panel p{page.tr("naive softmax: rows with NaN", "朴素 softmax：出现 NaN 的行"),
              page.tr("dimension d", "维度 d"),
              page.tr("fraction of rows with NaN", "出现 NaN 的行比例"),
              true,
              false,
              "set xtics 1,4\nset yrange [-0.03:1.08]\nset key top left",
              {}};
      std::size_t i = 0;
      for (const auto& format : distinct(nan, "format")) {
        const int lt = static_cast<int>(i) + 1;
        for (const auto& scale : distinct(nan, "scale")) {
          const Rows rows = where(
              nan, [&](Row r) { return str(r, "format") == format && str(r, "scale") == scale; });
          const bool unscaled = scale == "1";
          p.series.push_back(
              series(format + ", " + scale_title(scale), rows, {"d", "nan_fraction"}, "1:2",
                     unscaled ? fmt::format("linespoints lt {} pt {} ps 0.6", lt, point_type(i))
                              : fmt::format("lines lt {} dt 2", lt)));
        }
        ++i;
      }
      f.panels.push_back(p);
    }
    page.figure(s, f);
  }
  if (t) {
    page.key_rows(s, "precision", "precision", where(t, [](Row) { return true; }),
                  {"format", "scale", "d", "n_keys", "logit_rms", "logit_rounding_rms",
                   "prob_rel_error_rms", "effective_bits", "bits_lost", "bits_lost_theory"},
                  page.tr("Bits lost by unscaled logits (theory 0.5·log2 d):",
                          "未缩放 logits 损失的位数（理论值 0.5·log2 d）："));
  }
  if (nan) {
    page.key_rows(s, "precision", "naive_nan", where(nan, [](Row) { return true; }),
                  {"format", "scale", "d", "n_keys", "nan_fraction", "max_logit_median", "ln_max",
                   "theory_d_threshold"},
                  page.tr("Where the naive softmax turns to NaN:", "朴素 softmax 何时变成 NaN："));
  }
  page.other_verdicts(s, "precision");
  page.other_verdicts(s, "softmax");
}

}  // namespace sdpa::report
