// Claim C8: does attention without 1/sqrt(d) stop learning? Trains small attention models over a
// grid of (scale, d, learning rate) and judges the claim from the numbers. See docs/train.md.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "lab/claims.h"
#include "lab/common.h"
#include "lab/lab.h"
#include "lab/random.h"
#include "lab/streams.h"
#include "lab/train_run.h"
#include "lab/train_study.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace train {
namespace {

constexpr std::uint64_t kInitStream = streams::kTrainInit;
constexpr std::uint64_t kBatchStream = streams::kTrainBatch;
constexpr std::uint64_t kEvalStream = streams::kTrainEval;

std::vector<double> log_spaced(double lo_exp10, double hi_exp10, int n) {
  std::vector<double> r;
  for (int i = 0; i < n; ++i) {
    r.push_back(std::pow(10.0, lo_exp10 + (hi_exp10 - lo_exp10) * i / (n - 1)));
  }
  return r;
}

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

TrainConfig config_for(Mode mode) {
  TrainConfig c;
  c.scales = {ScaleKind::one, ScaleKind::inv_sqrt_d, ScaleKind::inv_d, ScaleKind::qk_norm};
  if (mode == Mode::quick) {
    c.ds = {16, 256};
    // 6 rates over 2.5 decades, half-decade steps: the unscaled model does best near 1e-3 and
    // 1/d near 3e-2 (d = 256, 400 steps), so both optima lie inside the sweep.
    c.lrs = log_spaced(-3.5, -1.0, 6);
    c.steps = 400;
    c.eval_every = 20;
  } else {
    // 512 is the article's own example (C5), beside the smaller 16, 64, 256.
    c.ds = {16, 64, 256, 512};
    c.lrs = log_spaced(-4.0, -1.0, 7);  // 7 rates over three decades
    c.steps = 1000;
    c.eval_every = 20;
  }
  return c;
}

Data make_data(const TrainConfig& config, std::uint64_t seed) {
  Data data;
  data.batches.reserve(config.steps + 1);
  for (int t = 0; t <= config.steps; ++t) {
    Stream stream(seed, kBatchStream + static_cast<std::uint64_t>(t));
    data.batches.push_back(make_batch(config.task, config.batch, stream));
  }
  Stream eval_stream(seed, kEvalStream);
  data.eval = make_batch(config.task, config.eval_size, eval_stream);
  return data;
}

RunResult train_one(const TrainConfig& config, const Data& data, std::uint64_t seed, ScaleKind kind,
                    int d, double lr) {
  const ModelShape shape{config.task.n_keys, config.task.n_values, config.width, d};
  // The same initial parameters for every scale and rate of a given d: paired comparisons.
  Stream init_stream(seed, kInitStream + static_cast<std::uint64_t>(d));
  Params<float> params = init_params<float>(shape, init_stream);
  Params<float> grad(shape);
  Adam<float> adam(params, lr);
  Workspace<float> ws;
  RunResult result;
  double train_loss_sum = 0;
  int train_loss_count = 0;
  for (int t = 0; t <= config.steps; ++t) {
    const Stats st = forward_backward(params, kind, data.batches[t], &grad, false, ws);
    if (!std::isfinite(st.loss) || !all_finite(grad.wq) || !all_finite(grad.wk) ||
        !all_finite(grad.wv) || !all_finite(grad.wo) || !std::isfinite(grad.log_tau)) {
      result.diverged = true;
      break;
    }
    train_loss_sum += st.loss;
    ++train_loss_count;
    if (t % config.eval_every == 0 || t == config.steps) {
      const Stats ev = forward_backward<float>(params, kind, data.eval, nullptr, true, ws);
      if (!std::isfinite(ev.loss)) {
        result.diverged = true;
        break;
      }
      CurvePoint p;
      p.step = t;
      p.loss = ev.loss;
      p.accuracy = ev.accuracy;
      p.train_loss = train_loss_sum / train_loss_count;
      p.entropy = ev.entropy;
      p.max_logit = ev.max_logit;
      p.grad_norm_wq = norm(grad.wq);
      p.grad_norm_wk = norm(grad.wk);
      p.temperature =
          kind == ScaleKind::qk_norm ? std::exp(double(params.log_tau)) : scale_value(kind, d);
      result.curve.push_back(p);
      if (!result.steps_to_acc90 && p.accuracy >= kLearnedAccuracy) result.steps_to_acc90 = t;
      train_loss_sum = 0;
      train_loss_count = 0;
    }
    if (t < config.steps) adam.step(params, grad);
  }
  if (!result.curve.empty()) {
    result.final_loss = result.curve.back().loss;
    result.final_accuracy = result.curve.back().accuracy;
  }
  return result;
}

SummaryRow summarize(const TrainConfig& config, ScaleKind kind, int d,
                     const std::vector<RunResult>& runs) {
  SummaryRow row;
  row.scale = scale_name(kind);
  row.d = d;
  row.n_lrs = static_cast<int>(runs.size());
  // A loss above that of the uniform prediction, ln(n_values), says nothing more about the
  // rate than "no better than chance"; a diverged run counts as that too.
  const double cap = std::log(double(config.task.n_values));
  auto capped_loss = [cap](const RunResult& r) {
    return (r.diverged || r.curve.empty()) ? cap : std::min(r.final_loss, cap);
  };
  std::size_t best = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunResult& r = runs[i];
    row.diverged += r.diverged;
    row.lrs_reaching_90 += r.final_accuracy >= kLearnedAccuracy;
    if (r.steps_to_acc90 && (!row.steps_to_acc90 || *r.steps_to_acc90 < *row.steps_to_acc90)) {
      row.steps_to_acc90 = r.steps_to_acc90;
    }
    const bool better =
        r.final_accuracy > runs[best].final_accuracy ||
        (r.final_accuracy == runs[best].final_accuracy && capped_loss(r) < capped_loss(runs[best]));
    if (better) best = i;
  }
  row.best_accuracy = runs[best].final_accuracy;
  row.best_lr = config.lrs[best];
  row.steps_to_90 = 0;
  for (const CurvePoint& p : runs[best].curve) {
    if (p.accuracy >= 0.9 * row.best_accuracy) {
      row.steps_to_90 = p.step;
      break;
    }
  }
  double best_loss = cap;
  for (const RunResult& r : runs) best_loss = std::min(best_loss, capped_loss(r));
  double gap = 0;
  for (const RunResult& r : runs) gap += capped_loss(r) - best_loss;
  row.best_final_loss = best_loss;
  row.lr_sensitivity = runs.empty() ? 0.0 : gap / double(runs.size());
  // Step 0 is the same for every rate (same parameters and batch): take it from any run.
  for (const RunResult& r : runs) {
    if (!r.curve.empty()) {
      row.init_entropy = r.curve.front().entropy;
      row.init_max_logit = r.curve.front().max_logit;
      row.init_grad_norm_wq = r.curve.front().grad_norm_wq;
      row.init_grad_norm_wk = r.curve.front().grad_norm_wk;
      break;
    }
  }
  return row;
}

namespace {

json summary_json(const SummaryRow& r) {
  json j = {{"scale", r.scale},
            {"d", r.d},
            {"best_accuracy", r.best_accuracy},
            {"best_lr", r.best_lr},
            {"steps_to_90", r.steps_to_90},
            {"steps_to_acc90", nullptr},
            {"lrs_reaching_90", r.lrs_reaching_90},
            {"n_lrs", r.n_lrs},
            {"lr_sensitivity", r.lr_sensitivity},
            {"best_final_loss", r.best_final_loss},
            {"init_entropy", r.init_entropy},
            {"init_max_logit", r.init_max_logit},
            {"init_grad_norm_wq", r.init_grad_norm_wq},
            {"init_grad_norm_wk", r.init_grad_norm_wk},
            {"diverged", r.diverged}};
  if (r.steps_to_acc90) j["steps_to_acc90"] = *r.steps_to_acc90;
  return j;
}

std::string theory_text(Lang lang) {
  if (lang == Lang::zh) {
    return "初始化时 q、k 每个分量方差为 1，q·k 的方差为 d：不缩放时注意力分数的标准差为 "
           "sqrt(d)，d 大时 softmax 在训练开始时已接近 one-hot，流向 W_q、W_k 的梯度很小。"
           "但 Adam 按梯度大小归一化更新步长，小梯度不一定意味着学不动：只有训练才能回答。";
  }
  return "At initialisation q and k have unit-variance components, so Var(q.k) = d: unscaled "
         "scores have standard deviation sqrt(d) and for large d softmax starts near one-hot, "
         "with little gradient into W_q and W_k. Adam, however, normalises its steps by the "
         "gradient's size, so a small gradient need not mean no learning: only training tells.";
}

}  // namespace

json run_experiment(const TrainConfig& config, const LabOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Data data = make_data(config, options.seed);

  struct Job {
    std::size_t scale_index, d_index, lr_index;
  };
  std::vector<Job> jobs;
  for (std::size_t di = 0; di < config.ds.size(); ++di) {
    for (std::size_t si = 0; si < config.scales.size(); ++si) {
      for (std::size_t li = 0; li < config.lrs.size(); ++li) jobs.push_back({si, di, li});
    }
  }
  auto job_index = [&](const Job& j) {
    return (j.d_index * config.scales.size() + j.scale_index) * config.lrs.size() + j.lr_index;
  };
  // Largest d first so that the long runs do not end up alone at the tail of the pool.
  std::vector<Job> order = jobs;
  std::stable_sort(order.begin(), order.end(), [&](const Job& a, const Job& b) {
    return config.ds[a.d_index] > config.ds[b.d_index];
  });

  std::vector<RunResult> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::exception_ptr error;
  Progress bar(options.progress, "lab train", static_cast<std::int64_t>(order.size()));
  const int workers =
      std::max(1, std::min(resolve_threads(options.threads), static_cast<int>(jobs.size())));
  auto worker = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= order.size()) return;
      const Job& j = order[i];
      try {
        results[job_index(j)] = train_one(config, data, options.seed, config.scales[j.scale_index],
                                          config.ds[j.d_index], config.lrs[j.lr_index]);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        next = order.size();
        return;
      }
      bar.advance();
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);

  json curves = json::array(), runs = json::array(), summary = json::array();
  std::vector<SummaryRow> rows;
  for (std::size_t di = 0; di < config.ds.size(); ++di) {
    for (std::size_t si = 0; si < config.scales.size(); ++si) {
      const ScaleKind kind = config.scales[si];
      const int d = config.ds[di];
      std::vector<RunResult> variant;
      for (std::size_t li = 0; li < config.lrs.size(); ++li) {
        const RunResult& r = results[job_index({si, di, li})];
        variant.push_back(r);
        const double lr = config.lrs[li];
        for (const CurvePoint& p : r.curve) {
          curves.push_back({{"scale", scale_name(kind)},
                            {"d", d},
                            {"lr", lr},
                            {"step", p.step},
                            {"loss", p.loss},
                            {"accuracy", p.accuracy},
                            {"train_loss", p.train_loss},
                            {"entropy", p.entropy},
                            {"max_logit", p.max_logit},
                            {"grad_norm_wq", p.grad_norm_wq},
                            {"grad_norm_wk", p.grad_norm_wk},
                            {"temperature", p.temperature}});
        }
        json run = {{"scale", scale_name(kind)},
                    {"d", d},
                    {"lr", lr},
                    {"final_loss", r.final_loss},
                    {"final_accuracy", r.final_accuracy},
                    {"diverged", r.diverged},
                    {"steps_to_acc90", nullptr}};
        if (r.steps_to_acc90) run["steps_to_acc90"] = *r.steps_to_acc90;
        runs.push_back(run);
      }
      rows.push_back(summarize(config, kind, d, variant));
      summary.push_back(summary_json(rows.back()));
    }
  }

  const Verdict v = judge_c8(rows, {config.task.pairs, config.steps}, options.lang);
  json claim = {
      {"id", "C8"},
      {"claim", claim_text("C8", options.lang)},
      {"claim_en", claim_text("C8", Lang::en)},
      {"claim_zh", claim_text("C8", Lang::zh)},
      {"theory", theory_text(options.lang)},
      {"measurement",
       (options.lang == Lang::zh ? std::string("消融（Adam，单一种子，学习率扫描取最好，宽度 D = ")
                                 : std::string("Ablation (Adam, one seed, best of a rate sweep, "
                                               "width D = ")) +
           std::to_string(config.width) +
           (options.lang == Lang::zh ? "，d 可大于 D）：" : ", d may exceed D): ") + v.measurement},
      {"verdict", v.verdict},
      {"condition", v.condition},
      {"evidence", v.evidence}};
  json cfg = {{"n_keys", config.task.n_keys},
              {"n_values", config.task.n_values},
              {"pairs", config.task.pairs},
              {"width", config.width},
              {"d", config.ds},
              {"lrs", config.lrs},
              {"steps", config.steps},
              {"batch", config.batch},
              {"eval_every", config.eval_every},
              {"eval_size", config.eval_size},
              {"optimizer", "Adam(beta1=0.9, beta2=0.999, eps=1e-8), constant rate"},
              {"impl", impl_name(Impl::fast)}};
  json scales = json::array();
  for (ScaleKind k : config.scales) scales.push_back(scale_name(k));
  cfg["scales"] = scales;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {{"experiment", "train"},
          {"seed", options.seed},
          {"mode", mode_name(options.mode)},
          {"lang", lang_name(options.lang)},
          {"seconds", seconds},
          {"config", cfg},
          {"claims", json::array({claim})},
          {"tables", {{"curves", curves}, {"runs", runs}, {"summary", summary}}}};
}

}  // namespace train

json run_train(const LabOptions& options) {
  // The ablation (one seed, Adam, a rate sweep, four scales, d up to 512 in width 32) and the
  // study (paired seeds, three optimizers, d <= D, tuned rates) that the C8 verdict rests on.
  json result = train::run_experiment(train::config_for(options.mode), options);
  train::run_study(train::study_config_for(options.mode), options, result);
  return result;
}

}  // namespace sdpa::lab

namespace sdpa::lab {

const Experiment& train_experiment() {
  const Column scale{"scale", Kind::text, "", "`\"1\"`, `\"1/sqrt(d)\"`, `\"1/d\"`, `\"qk-norm\"`"};
  const Column d{"d", Kind::integer, "", "head dimension"};
  const Column lr{"lr", Kind::number, "", "Adam learning rate"};
  // A diverged run writes its non-finite values as null.
  static const Experiment e{
      "train",
      "C8: small attention models trained with scale 1, 1/sqrt(d), 1/d",
      run_train,
      {{"curves",
        "one per (scale, d, lr, checkpoint), every `config.eval_every` steps from step 0",
        {scale,
         d,
         lr,
         {"step", Kind::integer, "steps", "optimizer steps done"},
         {"loss", Kind::number, "nats", "cross-entropy on the evaluation set", true},
         {"accuracy", Kind::number, "", "fraction of the evaluation set answered correctly"},
         {"train_loss", Kind::number, "nats",
          "mean training-batch loss over the steps since the previous checkpoint (step 0: the "
          "loss of the first batch)",
          true},
         {"entropy", Kind::number, "nats",
          "mean attention entropy of the query rows of the evaluation set", true},
         {"max_logit", Kind::number, "", "the largest `|scale·q·k|` over the evaluation set", true},
         {"grad_norm_wq", Kind::number, "",
          "Frobenius norm of the gradient of the batch loss with respect to `W_q` (before the "
          "update)",
          true},
         {"grad_norm_wk", Kind::number, "", "the same for `W_k`", true},
         {"temperature", Kind::number, "",
          "the effective scale: the constant for the fixed scales, `tau` for qk-norm", true}}},
       {"runs",
        "one per (scale, d, lr)",
        {scale,
         d,
         lr,
         {"final_loss", Kind::number, "nats",
          "evaluation loss at the end (a diverged run: its last finite checkpoint)", true},
         {"final_accuracy", Kind::number, "", "evaluation accuracy at the end"},
         {"diverged", Kind::boolean, "", "the loss became NaN or infinite"},
         {"steps_to_acc90", Kind::integer, "steps",
          "first checkpoint step with accuracy ≥ 0.90, or null", true}}},
       {"summary",
        "one per (scale, d)",
        {scale,
         d,
         {"best_accuracy", Kind::number, "", "the best final accuracy over the learning rates"},
         {"best_lr", Kind::number, "", "the rate that gave it (ties: the lower final loss)"},
         {"steps_to_90", Kind::integer, "steps",
          "for the best-lr run: first checkpoint step with accuracy ≥ 0.9 × `best_accuracy`", true},
         {"steps_to_acc90", Kind::integer, "steps",
          "the fewest steps, over all rates, to reach accuracy ≥ 0.90; null if no rate does", true},
         {"lrs_reaching_90", Kind::integer, "", "rates that end with accuracy ≥ 0.90"},
         {"n_lrs", Kind::integer, "", "rates in the sweep"},
         {"lr_sensitivity", Kind::number, "nats",
          "mean over the rates of (final loss − best final loss), a final loss capped at "
          "`ln(n_values)`"},
         {"best_final_loss", Kind::number, "nats", "the best final evaluation loss", true},
         {"init_entropy", Kind::number, "nats", "attention entropy at step 0", true},
         {"init_max_logit", Kind::number, "", "largest logit at step 0", true},
         {"init_grad_norm_wq", Kind::number, "", "gradient norm of `W_q` at step 0", true},
         {"init_grad_norm_wk", Kind::number, "", "gradient norm of `W_k` at step 0", true},
         {"diverged", Kind::integer, "", "rates whose run diverged"}}},
       {"study_runs",
        "one per study run: (optimizer, scale, d, lr, seed) for the tuning runs, (optimizer, "
        "scale, d, seed) at the chosen rate for the evaluation runs",
        {{"optimizer", Kind::text, "", "`sgd`, `momentum` (heavy ball 0.9) or `adam`"},
         {"task", Kind::text, "",
          "`recall` or `majority-3` (the query key at 3 positions, 2 with the target)"},
         {"pairs", Kind::integer, "", "P: keys per sequence"},
         {"width", Kind::integer, "", "model width D"},
         {"heads", Kind::integer, "", "h heads of dimension d (h d ≤ D)"},
         d,
         {"scale", Kind::text, "",
          "`\"1\"`, `\"1/sqrt(d)\"`, `\"c/sqrt(d)\"` of the temperature sweep, `\"qk-norm\"`, "
          "`\"1, softcap 5\"` (scale 1 through the kernel's softcap) or `\"muP\"` (scale 1/d, "
          "`W_q = 0`, hidden-matrix rates × D0/D)"},
         {"c", Kind::number, "", "the temperature multiplier (1 outside the sweep)"},
         {"lr", Kind::number, "", "the learning rate"},
         {"seed", Kind::integer, "", "seed index: 0 is held out for tuning, 1.. evaluate"},
         {"role", Kind::text, "", "`tune` or `eval`"},
         {"steps_to_90", Kind::number, "steps",
          "steps to accuracy 0.90, interpolated linearly between evaluations; null if never", true},
         {"loss_auc", Kind::number, "nats",
          "mean evaluation loss over the run (area under the curve per step, capped at ln "
          "n_values)"},
         {"final_loss", Kind::number, "nats", "evaluation loss at the end", true},
         {"final_accuracy", Kind::number, "", "evaluation accuracy at the end"},
         {"diverged", Kind::boolean, "", "the loss became NaN or infinite"}}},
       {"study_curves",
        "one per evaluation of the first evaluation seed's run of every study variant",
        {{"optimizer", Kind::text, "", "`sgd`, `momentum` (heavy ball 0.9) or `adam`"},
         {"task", Kind::text, "",
          "`recall` or `majority-3` (the query key at 3 positions, 2 with the target)"},
         {"pairs", Kind::integer, "", "P: keys per sequence"},
         {"width", Kind::integer, "", "model width D"},
         {"heads", Kind::integer, "", "h heads of dimension d (h d ≤ D)"},
         d,
         {"scale", Kind::text, "", "as in `study_runs`"},
         {"c", Kind::number, "", "the temperature multiplier"},
         {"lr", Kind::number, "", "the chosen rate"},
         {"step", Kind::integer, "steps", "steps done (every 10 to step 100, then every 25)"},
         {"loss", Kind::number, "nats", "evaluation loss"},
         {"accuracy", Kind::number, "", "evaluation accuracy"},
         {"entropy", Kind::number, "nats", "mean attention entropy of the query rows"},
         {"max_logit", Kind::number, "", "largest `|score|` over the evaluation set"},
         {"dead_rows", Kind::number, "",
          "fraction of the query rows (every head) with `1 − max p < 1e-3`: every entry of their "
          "softmax Jacobian is below 1e-3"},
         {"grad_norm_wq", Kind::number, "", "gradient norm of `W_q` on the step's batch"},
         {"grad_norm_wk", Kind::number, "", "the same for `W_k`"}}},
       {"study_regimes",
        "one per regime (optimizer, task, P, D, h, d): unscaled against `1/sqrt(d)` over the "
        "paired evaluation seeds",
        {{"optimizer", Kind::text, "", "`sgd`, `momentum` (heavy ball 0.9) or `adam`"},
         {"task", Kind::text, "",
          "`recall` or `majority-3` (the query key at 3 positions, 2 with the target)"},
         {"pairs", Kind::integer, "", "P: keys per sequence"},
         {"width", Kind::integer, "", "model width D"},
         {"heads", Kind::integer, "", "h heads of dimension d (h d ≤ D)"},
         d,
         {"family", Kind::text, "",
          "`heads` (h = D/d at fixed D), `single` (d = D), `soft` (majority recall), `pairs` (P "
          "varied)"},
         {"seeds", Kind::integer, "", "paired evaluation seeds"},
         {"lr_unscaled", Kind::number, "", "the rate chosen for scale 1 on the held-out seed"},
         {"lr_scaled", Kind::number, "", "the rate chosen for `1/sqrt(d)`"},
         {"unscaled_reached", Kind::integer, "", "seeds on which scale 1 reached accuracy 0.90"},
         {"scaled_reached", Kind::integer, "", "the same for `1/sqrt(d)`"},
         {"steps_unscaled", Kind::number, "steps",
          "geometric mean over seeds of the steps to 0.90 (a seed that never reaches it: the "
          "budget)"},
         {"steps_scaled", Kind::number, "steps", "the same for `1/sqrt(d)`"},
         {"step_ratio", Kind::number, "",
          "geometric mean over seeds of the paired ratio unscaled / scaled steps"},
         {"step_ratio_ci_low", Kind::number, "",
          "95% percentile bootstrap interval over the seeds (of the mean log ratio), low end"},
         {"step_ratio_ci_high", Kind::number, "", "the same, high end"},
         {"auc_ratio", Kind::number, "", "the same ratio for the area under the loss curve"},
         {"auc_ratio_ci_low", Kind::number, "", "its 95% bootstrap interval, low end"},
         {"auc_ratio_ci_high", Kind::number, "", "the same, high end"},
         {"final_accuracy_unscaled", Kind::number, "",
          "mean over seeds of the final evaluation accuracy, scale 1"},
         {"final_accuracy_scaled", Kind::number, "", "the same for `1/sqrt(d)`"},
         {"init_entropy_unscaled", Kind::number, "nats",
          "attention entropy at step 0, scale 1 (first evaluation seed)", true},
         {"init_entropy_scaled", Kind::number, "nats", "the same for `1/sqrt(d)`", true},
         {"rem_entropy_unscaled", Kind::number, "nats",
          "the random-energy-model entropy for logits of standard deviation sqrt(d) over P "
          "keys (src/lab/rem.h; null between `s_c` and `1.5 s_c`)",
          true},
         {"init_dead_unscaled", Kind::number, "",
          "fraction of dead rows (`1 − max p < 1e-3`) at step 0, scale 1", true},
         {"outcome", Kind::text, "",
          "`stuck` (scaled reaches 0.90 on every seed, unscaled on none), `slower` (ratio "
          "interval above 1), `faster` (below 1), `similar`, or `inconclusive` (scaled missed)"}}},
       {"study_temperature",
        "one per initial temperature c of `c/sqrt(d)` (Adam, recall, the single head d = D; c = "
        "sqrt(d) is scale 1)",
        {{"c", Kind::number, "", "the multiplier: the logits start with standard deviation c"},
         d,
         {"lr", Kind::number, "", "the rate chosen on the held-out seed"},
         {"seeds", Kind::integer, "", "evaluation seeds"},
         {"reached", Kind::integer, "", "seeds reaching accuracy 0.90"},
         {"steps_to_90", Kind::number, "steps", "geometric mean over seeds (the budget if never)"},
         {"steps_ci_low", Kind::number, "", "95% bootstrap interval over seeds, low end"},
         {"steps_ci_high", Kind::number, "", "the same, high end"},
         {"loss_auc", Kind::number, "nats", "mean over seeds of the area under the loss"},
         {"init_entropy", Kind::number, "nats", "attention entropy at step 0 (first seed)", true},
         {"rem_entropy", Kind::number, "nats",
          "the random-energy-model entropy for logits of standard deviation c over P keys "
          "(null between `s_c` and `1.5 s_c`)",
          true}}},
       {"study_alternatives",
        "one per alternative (QK-norm, softcap, muP) and regime, against `1/sqrt(d)` on the "
        "same seeds",
        {{"optimizer", Kind::text, "", "`sgd`, `momentum` (heavy ball 0.9) or `adam`"},
         {"task", Kind::text, "",
          "`recall` or `majority-3` (the query key at 3 positions, 2 with the target)"},
         {"pairs", Kind::integer, "", "P: keys per sequence"},
         {"width", Kind::integer, "", "model width D"},
         {"heads", Kind::integer, "", "h heads of dimension d (h d ≤ D)"},
         d,
         {"scale", Kind::text, "", "`qk-norm`, `1, softcap 5` or `muP` (as in `study_runs`)"},
         {"lr", Kind::number, "", "the rate chosen on the held-out seed"},
         {"seeds", Kind::integer, "", "evaluation seeds"},
         {"reached", Kind::integer, "", "seeds reaching accuracy 0.90"},
         {"steps_to_90", Kind::number, "steps", "geometric mean over seeds (the budget if never)"},
         {"ratio_to_scaled", Kind::number, "",
          "geometric mean of the paired ratio of steps, this variant / `1/sqrt(d)`"},
         {"ratio_ci_low", Kind::number, "", "95% bootstrap interval over seeds, low end"},
         {"ratio_ci_high", Kind::number, "", "the same, high end"},
         {"auc_ratio", Kind::number, "", "the same ratio for the area under the loss"},
         {"init_entropy", Kind::number, "nats", "attention entropy at step 0 (first seed)", true}}},
       {"study_transfer",
        "one per (parametrisation, width): the rate chosen on the held-out seed, Adam, recall, "
        "single head d = D",
        {{"scale", Kind::text, "", "`1/sqrt(d)` (standard) or `muP`"},
         {"width", Kind::integer, "", "D = d"},
         {"lr", Kind::number, "", "the base rate chosen (muP: before the D0/D factor)"},
         {"steps_to_90", Kind::number, "steps", "geometric mean over the evaluation seeds"},
         {"outcome", Kind::text, "",
          "`transfers` when every width's rate is within one grid step of the smallest "
          "width's, `shifts` otherwise"}}}},
      // Its curves table is for plots, too long to print.
      {{"study_regimes",
        {"optimizer", "task", "pairs", "width", "heads", "d", "lr_unscaled", "lr_scaled",
         "unscaled_reached", "scaled_reached", "steps_unscaled", "steps_scaled", "step_ratio",
         "step_ratio_ci_low", "step_ratio_ci_high", "auc_ratio", "outcome"},
        nullptr},
       {"study_temperature",
        {"c", "d", "lr", "reached", "steps_to_90", "steps_ci_low", "steps_ci_high", "loss_auc",
         "init_entropy", "rem_entropy"},
        nullptr},
       {"study_alternatives",
        {"optimizer", "width", "d", "scale", "lr", "reached", "steps_to_90", "ratio_to_scaled",
         "ratio_ci_low", "ratio_ci_high"},
        nullptr},
       {"study_transfer", {"scale", "width", "lr", "steps_to_90", "outcome"}, nullptr},
       {"summary",
        {"scale", "d", "best_accuracy", "best_lr", "steps_to_acc90", "lrs_reaching_90", "n_lrs",
         "lr_sensitivity", "init_entropy", "init_grad_norm_wq", "diverged"},
        nullptr},
       {"runs",
        {"scale", "d", "lr", "final_loss", "final_accuracy", "diverged", "steps_to_acc90"},
        nullptr}}};
  return e;
}

}  // namespace sdpa::lab
