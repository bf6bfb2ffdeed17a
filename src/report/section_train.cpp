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

void section_c8_study(Page& page, Section& s);

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
                  page.tr("Ablation, per variant (best over the learning-rate sweep, one seed, "
                          "Adam):",
                          "消融，每个变体（学习率扫描中的最好结果，单一种子，Adam）："));
  }
  section_c8_study(page, s);
  page.verdicts(s, "C8");
}

namespace {

// The dynamics of the first evaluation seed: one column per regime of `regime_rows`, one row per
// metric, one series per scale that ran on that regime.
void dynamics_figure(Page& page, Section& s, const json* curves, const Rows& regime_rows,
                     const std::string& id, const std::string& caption_en,
                     const std::string& caption_zh) {
  if (regime_rows.empty()) return;
  Figure f;
  f.id = id;
  f.caption = page.tr(caption_en, caption_zh);
  f.sources = {csv_name("train", "study_curves")};
  f.columns = static_cast<int>(regime_rows.size());
  f.width = std::max(700, 260 * f.columns);
  f.height = 1150;
  struct Metric {
    const char* column;
    std::string label;
    bool logy;
  };
  const Metric metrics[] = {
      {"loss", page.tr("evaluation loss (nats)", "评估损失（nats）"), true},
      {"max_logit", page.tr("largest |logit|", "最大 |logit|"), true},
      {"entropy", page.tr("attention entropy (nats)", "注意力熵（nats）"), false},
      {"grad_norm_wq", "|∂L/∂W_q|", true},
      {"dead_rows", page.tr("dead rows (1 − max p < 1e-3)", "死行（1 − max p < 1e-3）"), false}};
  auto same_regime = [](Row a, Row b) {
    for (const char* c : {"optimizer", "task"}) {
      if (str(a, c) != str(b, c)) return false;
    }
    for (const char* c : {"pairs", "width", "heads", "d"}) {
      if (num(a, c) != num(b, c)) return false;
    }
    return true;
  };
  for (const Metric& m : metrics) {
    for (Row rg : regime_rows) {
      Panel p{fmt::format("{} {} P={} D={} h={} d={}", str(rg, "optimizer"), str(rg, "task"),
                          num(rg, "pairs"), num(rg, "width"), num(rg, "heads"), num(rg, "d")),
              page.tr("steps", "步数"),
              m.label,
              false,
              m.logy,
              std::string("set key top right") +
                  (m.column == std::string("dead_rows") ? "\nset yrange [0:1.05]" : ""),
              {}};
      const Rows mine = where(curves, [&](Row r) { return same_regime(r, rg); });
      std::size_t i = 0;
      for (const std::string& scale : distinct(curves, "scale")) {
        Rows rows;
        for (Row r : mine) {
          if (str(r, "scale") == scale) rows.push_back(r);
        }
        if (rows.empty()) continue;
        p.series.push_back(series(
            scale_title(scale), rows, {"step", m.column}, m.logy ? "1:($2 > 0 ? $2 : NaN)" : "1:2",
            fmt::format("linespoints lt {} pt {} ps 0.4", i + 1, point_type(i))));
        ++i;
      }
      f.panels.push_back(p);
    }
  }
  page.figure(s, f);
}

}  // namespace

void section_c8_study(Page& page, Section& s) {
  const json* curves = page.table_or_note(s, "train", "study_curves");
  const json* regimes = curves ? page.table_or_note(s, "train", "study_regimes") : nullptr;
  if (!regimes) return;
  s.blocks.push_back(Paragraph{page.tr(
      "The study: unscaled against 1/√d over paired seeds (the same initialisation and batches "
      "for both), per regime: optimizer (SGD, SGD with momentum, Adam), task (associative "
      "recall, which one-hot attention solves, and majority recall, which needs attention over "
      "three matching keys), the number of keys P, and the model: h = D/d heads at fixed width "
      "D, or one head with d = D. Each variant's rate is chosen on a held-out seed. The figures "
      "show the training dynamics of the first evaluation seed for every regime: evaluation "
      "loss, largest logit, attention entropy, the gradient norm into W_q and the fraction of "
      "dead attention rows.",
      "研究：在成对种子（两者初始化与批次相同）上比较未缩放与 1/√d，按情形划分：优化器（SGD、"
      "带动量的 SGD、Adam）、任务（联想回忆——one-hot 注意力即可解决；多数回忆——需要把注意力"
      "分给三个匹配的键）、键的个数 P，以及模型：固定宽度 D 下 h = D/d 个头，或 d = D 的单头。"
      "每个变体的学习率在留出的种子上选定。下图给出每个情形第一个评估种子的训练动态：评估损失、"
      "最大 logit、注意力熵、流向 W_q 的梯度范数与注意力死行的比例。")});
  for (const std::string& opt : distinct(regimes, "optimizer")) {
    const Rows rows = where(regimes, [&](Row r) {
      return str(r, "optimizer") == opt &&
             (str(r, "family") == "heads" || str(r, "family") == "single");
    });
    dynamics_figure(
        page, s, curves, rows, "c8-dynamics-" + opt,
        fmt::format("C8 study, {}, recall: loss, largest logit, attention entropy, |∂L/∂W_q| "
                    "and the dead-row fraction against steps, one column per (D, h, d).",
                    opt),
        fmt::format("C8 研究，{}，联想回忆：损失、最大 logit、注意力熵、|∂L/∂W_q| 与死行比例随"
                    "步数的变化，每列一个 (D, h, d)。",
                    opt));
  }
  dynamics_figure(
      page, s, curves,
      where(regimes,
            [](Row r) { return str(r, "family") == "soft" || str(r, "family") == "pairs"; }),
      "c8-dynamics-tasks",
      "C8 study: the same dynamics for majority recall (soft attention needed) and for the "
      "number of keys P varied.",
      "C8 研究：多数回忆（需要软注意力）与不同键数 P 下的同样动态。");
  page.key_rows(s, "train", "study_regimes", all_rows(regimes),
                {"optimizer",
                 "task",
                 "pairs",
                 "width",
                 "heads",
                 "d",
                 "lr_unscaled",
                 "lr_scaled",
                 "unscaled_reached",
                 "scaled_reached",
                 "steps_unscaled",
                 "steps_scaled",
                 "step_ratio",
                 "step_ratio_ci_low",
                 "step_ratio_ci_high",
                 "auc_ratio",
                 "init_entropy_unscaled",
                 "rem_entropy_unscaled",
                 "init_dead_unscaled",
                 "outcome"},
                page.tr("Per regime: steps to 90% accuracy (interpolated), geometric means over "
                        "the paired seeds, the ratio with its 95% bootstrap interval over seeds, "
                        "and the outcome of the regime's verdict rule (docs/train.md):",
                        "每个情形：达到 90% 准确率的步数（插值），成对种子上的几何平均，比值"
                        "与其在种子上的 95% 自助法区间，以及该情形判定规则的结果："));
  if (const json* temps = page.table("train", "study_temperature")) {
    page.key_rows(
        s, "train", "study_temperature", all_rows(temps),
        {"c", "d", "lr", "reached", "steps_to_90", "steps_ci_low", "steps_ci_high", "loss_auc",
         "init_entropy", "rem_entropy"},
        page.tr("The initial temperature at fixed d (Adam): logits c·q·k/√d, c = 1 is "
                "1/√d and c = √d is unscaled: if the steps grow with c alone, the initial "
                "saturation, not the parametrisation, is what slows learning.",
                "固定 d 下的初始温度（Adam）：logits 为 c·q·k/√d，c = 1 即 1/√d，c = √d "
                "即不缩放：若步数只随 c 增长，拖慢学习的是初始饱和，而非参数化方式。"));
  }
  if (const json* alts = page.table("train", "study_alternatives")) {
    page.key_rows(s, "train", "study_alternatives", all_rows(alts),
                  {"optimizer", "width", "d", "scale", "lr", "reached", "steps_to_90",
                   "ratio_to_scaled", "ratio_ci_low", "ratio_ci_high", "init_entropy"},
                  page.tr("The alternatives through the kernel, on the same seeds: QK-norm "
                          "(learned temperature, its backward through the normalisation), scale 1 "
                          "under the kernel's softcap, and muP (scale 1/d, zero-initialised "
                          "query, hidden-matrix rates × D0/D); the ratio is to 1/√d's steps.",
                          "通过计算核的替代方案，相同种子：QK 归一化（可学习温度，反向传播穿过"
                          "归一化）、在计算核 softcap 下的 scale 1，以及 muP（scale 1/d、查询零"
                          "初始化、隐藏矩阵学习率 × D0/D）；比值相对于 1/√d 的步数。"));
  }
  if (const json* tr = page.table("train", "study_transfer")) {
    page.key_rows(s, "train", "study_transfer", all_rows(tr),
                  {"scale", "width", "lr", "steps_to_90", "outcome"},
                  page.tr("Rate transfer across widths (Adam, one head d = D): the rate chosen "
                          "on the held-out seed at each width, muP against the standard 1/√d.",
                          "学习率随宽度的迁移（Adam，单头 d = D）：各宽度在留出种子上选出的学习"
                          "率，muP 对比标准的 1/√d。"));
  }
}

void section_training(Page& page) {
  Section& s = page.section(
      "training", page.tr("Beyond the article: the training ablation", "超出原文：训练消融"));
  s.blocks.push_back(Paragraph{page.tr(
      "Every learning rate of the sweep, for the four variants: scale 1, 1/√d, 1/d (the scale "
      "muP uses, alone; the study above runs muP itself: zero-initialised query and "
      "width-scaled rates) and "
      "QK-normalisation with a learned temperature. A variant that only works at one rate is "
      "fragile; one that fails at every rate is stuck.",
      "学习率扫描中的每个学习率，四种变体：scale 1、1/√d、1/d（仅为 muP 所用的缩放；上面的研究"
      "运行了真正的 muP：查询零初始化、随宽度缩放学习率）以及带可学习温度的 QK "
      "归一化。只在"
      "一个学习率下有效的变体是脆弱的；在所有学习率下都失败的变体是“卡死”的。")});
  if (const json* runs = page.table_or_note(s, "train", "runs")) {
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
