// judge_c8: the C8 verdict from the summary rows (see train_verdict.h for the rule).
#include "lab/train_verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace sdpa::lab::train {
namespace {

enum class Outcome { stuck, slower, similar, inconclusive };

struct PerD {
  int d = 0;
  Outcome outcome = Outcome::inconclusive;
  const SummaryRow* unscaled = nullptr;
  const SummaryRow* scaled = nullptr;
  const SummaryRow* inv_d = nullptr;
  const SummaryRow* qk_norm = nullptr;
  double step_ratio = 0;  // unscaled / scaled steps to accuracy 0.90 (both reached it)
};

const SummaryRow* find(const std::vector<SummaryRow>& rows, const std::string& scale, int d) {
  for (const SummaryRow& r : rows) {
    if (r.scale == scale && r.d == d) return &r;
  }
  return nullptr;
}

std::string steps_or_never(const SummaryRow& r, Lang lang) {
  if (r.steps_to_acc90) return fmt::format("{}", *r.steps_to_acc90);
  return lang == Lang::zh ? "未达到" : "never";
}

// "scale 1: best accuracy 0.31 (lr 0.01), 90% after never, 0/5 rates"
std::string describe(const SummaryRow& r, Lang lang) {
  if (lang == Lang::zh) {
    return fmt::format(
        "{}：最佳准确率 {:.3f}（lr {:.3g}），达到 90% 用 {} 步，{}/{} 个学习率达到 "
        "90%，学习率敏感度 {:.3g} nats",
        r.scale, r.best_accuracy, r.best_lr, steps_or_never(r, lang), r.lrs_reaching_90, r.n_lrs,
        r.lr_sensitivity);
  }
  return fmt::format(
      "{}: best accuracy {:.3f} (lr {:.3g}), 90% after {} steps, {}/{} rates "
      "reach 90%, lr sensitivity {:.3g} nats",
      r.scale, r.best_accuracy, r.best_lr, steps_or_never(r, lang), r.lrs_reaching_90, r.n_lrs,
      r.lr_sensitivity);
}

std::string ratio_text(double a, double b) {
  if (!(b > 0) || !(a > 0)) return "n/a";
  return fmt::format("{:.3g}", a / b);
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
  return s;
}

// One sentence on unscaled vs 1/sqrt(d) at one d.
std::string evidence_for(const PerD& x, const VerdictContext& ctx, Lang lang) {
  const SummaryRow& u = *x.unscaled;
  const SummaryRow& s = *x.scaled;
  const bool zh = lang == Lang::zh;
  const double uniform = std::log(double(ctx.pairs));
  // The gradient into W_q at step 0, unscaled relative to scaled (the article expects << 1; the
  // mean over a batch can also be larger: a few near-tied rows carry large gradients).
  const std::string grad = ratio_text(u.init_grad_norm_wq, s.init_grad_norm_wq);
  const std::string start =
      zh ? fmt::format(
               "初始注意力熵 {:.3g} nats（1/sqrt(d)：{:.3g}，均匀：{:.3g}），最大分数 "
               "{:.3g}（1/sqrt(d)：{:.3g}），流向 W_q 的初始梯度范数 {:.3g}，是 1/sqrt(d) 的 {} 倍",
               u.init_entropy, s.init_entropy, uniform, u.init_max_logit, s.init_max_logit,
               u.init_grad_norm_wq, grad)
         : fmt::format(
               "starts with attention entropy {:.3g} nats (1/sqrt(d): {:.3g}, uniform: "
               "{:.3g}), largest logit {:.3g} (1/sqrt(d): {:.3g}), and an initial "
               "gradient norm into W_q of {:.3g}, {}x that of 1/sqrt(d)",
               u.init_entropy, s.init_entropy, uniform, u.init_max_logit, s.init_max_logit,
               u.init_grad_norm_wq, grad);
  switch (x.outcome) {
    case Outcome::stuck:
      return zh ? fmt::format(
                      "d={}：不缩放的注意力{}；在全部 {} 个学习率下都未达到 90% 准确率"
                      "（最佳 {:.3f}，{} 步内），而 1/sqrt(d) 用 {} 步达到。",
                      x.d, start, u.n_lrs, u.best_accuracy, ctx.steps, steps_or_never(s, lang))
                : fmt::format(
                      "d={}: unscaled attention {}; it stays below 90% accuracy at every "
                      "one of the {} rates (best {:.3f} in {} steps) while 1/sqrt(d) "
                      "reaches 90% after {} steps.",
                      x.d, start, u.n_lrs, u.best_accuracy, ctx.steps, steps_or_never(s, lang));
    case Outcome::slower:
      return zh ? fmt::format(
                      "d={}：不缩放的注意力{}；它能学会，但达到 90% 需要 {} 步，是 "
                      "1/sqrt(d)（{} 步）的 {:.3g} 倍；{}/{} 个学习率达到 "
                      "90%（1/sqrt(d)：{}/{}）。",
                      x.d, start, *u.steps_to_acc90, *s.steps_to_acc90, x.step_ratio,
                      u.lrs_reaching_90, u.n_lrs, s.lrs_reaching_90, s.n_lrs)
                : fmt::format(
                      "d={}: unscaled attention {}; it learns, but needs {} steps to "
                      "reach 90%, {:.3g}x the {} of 1/sqrt(d), and reaches it at {}/{} rates "
                      "(1/sqrt(d): {}/{}).",
                      x.d, start, *u.steps_to_acc90, x.step_ratio, *s.steps_to_acc90,
                      u.lrs_reaching_90, u.n_lrs, s.lrs_reaching_90, s.n_lrs);
    case Outcome::similar:
      return zh ? fmt::format(
                      "d={}：不缩放的注意力{}；但它达到 90% 只用 {} 步（1/sqrt(d)：{} "
                      "步，比值 {:.3g}，小于 {}），没有明显影响。",
                      x.d, start, *u.steps_to_acc90, *s.steps_to_acc90, x.step_ratio, kSlowerFactor)
                : fmt::format(
                      "d={}: unscaled attention {}; yet it reaches 90% after {} steps "
                      "(1/sqrt(d): {}, ratio {:.3g} < {}): no clear effect.",
                      x.d, start, *u.steps_to_acc90, *s.steps_to_acc90, x.step_ratio,
                      kSlowerFactor);
    case Outcome::inconclusive:
      break;
  }
  return zh ? fmt::format("d={}：无法判断：1/sqrt(d) 本身在 {} 步内也未达到 90%（最佳 {:.3f}）。",
                          x.d, ctx.steps, s.best_accuracy)
            : fmt::format(
                  "d={}: inconclusive: 1/sqrt(d) itself did not reach 90% within {} "
                  "steps (best {:.3f}).",
                  x.d, ctx.steps, s.best_accuracy);
}

}  // namespace

Verdict judge_c8(const std::vector<SummaryRow>& rows, const VerdictContext& ctx, Lang lang) {
  const bool zh = lang == Lang::zh;
  std::vector<int> ds;
  for (const SummaryRow& r : rows) {
    if (std::find(ds.begin(), ds.end(), r.d) == ds.end()) ds.push_back(r.d);
  }
  std::sort(ds.begin(), ds.end());

  std::vector<PerD> per_d;
  for (int d : ds) {
    PerD x;
    x.d = d;
    x.unscaled = find(rows, "1", d);
    x.scaled = find(rows, "1/sqrt(d)", d);
    x.inv_d = find(rows, "1/d", d);
    x.qk_norm = find(rows, "qk-norm", d);
    if (x.unscaled == nullptr || x.scaled == nullptr) continue;
    if (!x.scaled->steps_to_acc90) {
      x.outcome = Outcome::inconclusive;
    } else if (!x.unscaled->steps_to_acc90) {
      x.outcome = Outcome::stuck;
    } else {
      // steps_to_acc90 >= 1 for a learned run: step 0 is the untrained model at chance level.
      x.step_ratio =
          double(*x.unscaled->steps_to_acc90) / double(std::max(1L, *x.scaled->steps_to_acc90));
      x.outcome = x.step_ratio >= kSlowerFactor ? Outcome::slower : Outcome::similar;
    }
    per_d.push_back(x);
  }

  Verdict v;
  std::vector<int> stuck, conclusive, slower;
  for (const PerD& x : per_d) {
    if (x.outcome != Outcome::inconclusive) conclusive.push_back(x.d);
    if (x.outcome == Outcome::stuck) stuck.push_back(x.d);
    if (x.outcome == Outcome::slower) slower.push_back(x.d);
  }
  auto list = [](const std::vector<int>& v) {
    std::vector<std::string> s;
    for (int d : v) s.push_back(std::to_string(d));
    return join(s, ", ");
  };

  std::string headline;
  if (conclusive.empty()) {
    v.verdict = "inconclusive";
    headline = zh ? "无法判断：带 1/sqrt(d) 的模型本身在训练预算内没有学会任务。"
                  : "Inconclusive: the scaled model itself did not learn the task within the "
                    "budget.";
  } else if (stuck.size() == conclusive.size()) {
    v.verdict = "holds";
    headline = zh ? fmt::format("成立（d = {}）：不缩放时在任何学习率下都学不会。", list(stuck))
                  : fmt::format(
                        "Holds at every d tested ({}): without scaling the model does "
                        "not learn at any rate.",
                        list(stuck));
  } else if (!stuck.empty()) {
    v.verdict = "holds-if";
    // "d >= X" when the stuck d are exactly the conclusive d from the smallest stuck one up.
    std::vector<int> upper;
    for (int d : conclusive) {
      if (d >= stuck.front()) upper.push_back(d);
    }
    v.condition = upper == stuck ? fmt::format("d >= {}", stuck.front())
                                 : fmt::format("d in {{{}}}", list(stuck));
    headline = zh ? fmt::format("仅在 {} 时成立：不缩放时在任何学习率下都学不会；其余 d 能学会。",
                                v.condition)
                  : fmt::format(
                        "Holds only at {}: there, without scaling, the model does not "
                        "learn at any rate; at the other d it does.",
                        v.condition);
  } else {
    v.verdict = "fails";
    if (!slower.empty()) {
      headline =
          zh ? fmt::format("不成立：不缩放时每个 d 都能学会，只是在 d = {} 时更慢。", list(slower))
             : fmt::format(
                   "Fails: without scaling the model learns at every d tested; "
                   "it is slower (>= {}x the steps) at d = {}.",
                   kSlowerFactor, list(slower));
    } else {
      headline = zh ? "不成立：不缩放时每个 d 都能学会，步数与 1/sqrt(d) 相差不到 2 倍。"
                    : fmt::format(
                          "Fails: without scaling the model learns at every d tested, "
                          "within {}x the steps of 1/sqrt(d).",
                          kSlowerFactor);
    }
  }

  std::vector<std::string> sentences{headline};
  std::vector<std::string> measurements;
  for (const PerD& x : per_d) {
    sentences.push_back(evidence_for(x, ctx, lang));
    std::vector<std::string> parts;
    for (const SummaryRow* r : {x.unscaled, x.scaled, x.inv_d, x.qk_norm}) {
      if (r != nullptr) parts.push_back(describe(*r, lang));
    }
    measurements.push_back(fmt::format("d={}: ", x.d) + join(parts, zh ? "；" : "; "));
  }
  v.evidence = join(sentences, " ");
  v.measurement = join(measurements, zh ? "。" : ". ");
  return v;
}

}  // namespace sdpa::lab::train
