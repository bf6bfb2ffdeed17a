// The report's sections for the train experiment: C8 (training curves) and the learning-rate
// ablation.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {
namespace {

// For each (scale, d) the summary's best_lr; the curves of those runs.
Rows best_curve(const json* curves, const json* summary, const std::string& scale, double d) {
  double lr = std::nan("");
  for (const auto& row : *summary) {
    if (str(&row, "scale") == scale && num(&row, "d") == d) lr = num(&row, "best_lr");
  }
  return where(curves, [&](Row r) {
    return str(r, "scale") == scale && num(r, "d") == d && num(r, "lr") == lr;
  });
}

}  // namespace

void section_c8(Page& page) {
  Section& s = page.claim_section(7);
  const json* curves = page.table("train", "curves");
  const json* summary = page.table("train", "summary");
  if (!curves || !summary) {
    page.note(s, page.absent("train", !curves ? "curves" : "summary"));
  } else {
    s.blocks.push_back(Paragraph{page.tr(
        "Associative recall learned by one attention layer through the project's kernels, for "
        "each attention scale and head dimension d, each at its best learning rate of the "
        "sweep (so that no variant loses to a badly chosen rate). Top: accuracy on the "
        "evaluation set; bottom: attention entropy (ln P is uniform, 0 is one-hot).",
        "一个注意力层通过本项目的计算核学习联想回忆任务；每种注意力缩放和头维度 d "
        "都取学习率扫描中最好的"
        "学习率（避免某个变体输在学习率选得不好）。上：评估集准确率；下：注意力熵（ln P "
        "为均匀，0 为 "
        "one-hot）。")});
    const auto ds = distinct_numbers(summary, "d");
    Figure f;
    f.id = "c8-training";
    f.caption = page.tr(
        "C8: training curves per variant at its best learning rate: accuracy (top) "
        "and attention entropy (bottom) against optimizer steps, one column per d.",
        "C8：各变体在最佳学习率下的训练曲线：准确率（上）与注意力熵（下）随优化步数的变化，每"
        "列一个 d。");
    f.sources = {csv_name("train", "curves"), csv_name("train", "summary")};
    f.columns = static_cast<int>(ds.size());
    f.width = 980;
    f.height = 700;
    std::vector<Panel> acc, ent;
    for (double d : ds) {
      Panel pa{fmt::format("d = {}", d),
               page.tr("optimizer steps", "优化步数"),
               page.tr("accuracy", "准确率"),
               false,
               false,
               "set yrange [0:1.05]\nset key bottom right",
               {}};
      Panel pe{fmt::format("d = {}", d),
               page.tr("optimizer steps", "优化步数"),
               page.tr("attention entropy (nats)", "注意力熵（nats）"),
               false,
               false,
               "set key top right\nset yrange [0:*]",
               {}};
      std::size_t i = 0;
      for (const auto& scale : distinct(summary, "scale")) {
        const Rows rows = best_curve(curves, summary, scale, d);
        const std::string style =
            fmt::format("linespoints lt {} pt {} ps 0.5", i + 1, point_type(i));
        pa.series.push_back(series(scale_title(scale), rows, {"step", "accuracy"}, "1:2", style));
        pe.series.push_back(series(scale_title(scale), rows, {"step", "entropy"}, "1:2", style));
        ++i;
      }
      acc.push_back(pa);
      ent.push_back(pe);
    }
    f.panels = acc;
    f.panels.insert(f.panels.end(), ent.begin(), ent.end());
    page.figure(s, f);
    page.key_rows(s, "train", "summary", where(summary, [](Row) { return true; }),
                  {"scale", "d", "best_accuracy", "best_lr", "steps_to_90", "steps_to_acc90",
                   "lrs_reaching_90", "n_lrs", "lr_sensitivity", "init_entropy", "init_max_logit",
                   "init_grad_norm_wq", "diverged"},
                  page.tr("Per variant (best over the learning-rate sweep):",
                          "每个变体（学习率扫描中的最好结果）："));
  }
  page.verdicts(s, "C8");
}

void section_training(Page& page) {
  Section& s = page.section(
      "training", page.tr("Beyond the article: the training ablation", "超出原文：训练消融"));
  s.blocks.push_back(Paragraph{page.tr(
      "Every learning rate of the sweep, for the four variants: scale 1, 1/√d, 1/d (μP) and "
      "QK-normalisation with a learned temperature. A variant that only works at one rate is "
      "fragile; one that fails at every rate is stuck.",
      "学习率扫描中的每个学习率，四种变体：scale 1、1/√d、1/d（μP）以及带可学习温度的 QK "
      "归一化。只在"
      "一个学习率下有效的变体是脆弱的；在所有学习率下都失败的变体是“卡死”的。")});
  const json* runs = page.table("train", "runs");
  if (!runs) {
    page.note(s, page.absent("train", "runs"));
  } else {
    const auto ds = distinct_numbers(runs, "d");
    Figure f;
    f.id = "training-lr-sweep";
    f.caption = page.tr("Final accuracy against the learning rate, per variant, one panel per d.",
                        "最终准确率随学习率的变化，每个变体一条线，每个 d 一幅子图。");
    f.sources = {csv_name("train", "runs")};
    f.columns = static_cast<int>(ds.size());
    f.width = 980;
    f.height = 400;
    for (double d : ds) {
      Panel p{fmt::format("d = {}", d),
              page.tr("Adam learning rate", "Adam 学习率"),
              page.tr("final accuracy", "最终准确率"),
              true,
              false,
              "set yrange [0:1.05]\nset key bottom left",
              {}};
      std::size_t i = 0;
      for (const auto& scale : distinct(runs, "scale")) {
        const Rows rows =
            where(runs, [&](Row r) { return num(r, "d") == d && str(r, "scale") == scale; });
        p.series.push_back(
            series(scale_title(scale), rows, {"lr", "final_accuracy"}, "1:2",
                   fmt::format("linespoints lt {} pt {} ps 0.7", i + 1, point_type(i))));
        ++i;
      }
      f.panels.push_back(p);
    }
    page.figure(s, f);
  }
  page.other_verdicts(s, "train");
}

}  // namespace sdpa::report
