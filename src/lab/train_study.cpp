#include "lab/train_study.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "lab/common.h"
#include "lab/random.h"
#include "lab/rem.h"
#include "lab/scales.h"
#include "lab/stats.h"
#include "lab/streams.h"

namespace sdpa::lab::train {

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::sgd:
      return "sgd";
    case Optimizer::momentum:
      return "momentum";
    case Optimizer::adam:
      return "adam";
  }
  return "?";
}

std::string regime_name(const RegimeSpec& r) {
  return fmt::format("{} {} P={} D={} h={} d={}", optimizer_name(r.optimizer), task_name(r.task),
                     r.task.pairs, r.width, r.heads, r.d);
}

StudyConfig study_config_for(Mode mode) {
  StudyConfig c;
  // Half-decade grids wide enough that every variant's best rate lies inside (SGD's steps
  // scale with the gradient, so its rates are 30-100x Adam's).
  c.lrs = {
      {0.03, 0.1, 0.3, 1.0, 3.0}, {0.003, 0.01, 0.03, 0.1, 0.3}, {3e-4, 1e-3, 3e-3, 1e-2, 3e-2}};
  const bool quick = mode == Mode::quick;
  // D = 64 carries the study in both modes. A width of 128 costs 4x per run (projections and
  // attention scale with D h d), so only full mode adds it, for head dimensions up to 128.
  const int D = 64;
  const std::vector<Optimizer> all = {Optimizer::sgd, Optimizer::momentum, Optimizer::adam};
  const TaskSpec recall{};  // P = 16
  TaskSpec majority = recall;
  majority.matches = 3;
  auto add = [&c](Optimizer o, TaskSpec t, int width, int heads, int d, const char* family) {
    c.regimes.push_back({o, t, width, heads, d, family});
  };
  // Multi-head at fixed width D: h = D / d heads (d = D is the single head of that width).
  const std::vector<int> head_ds = quick ? std::vector<int>{16, 64} : std::vector<int>{16, 32, 64};
  for (Optimizer o : all) {
    for (int d : head_ds) add(o, recall, D, D / d, d, d == D ? "single" : "heads");
  }
  // Full mode: the width D = 128, with h = 128 / d heads for d = 16, 64 and the single head
  // d = 128, under SGD and Adam.
  if (!quick) {
    for (Optimizer o : {Optimizer::sgd, Optimizer::adam}) {
      for (int d : {16, 64, 128}) add(o, recall, 128, 128 / d, d, d == 128 ? "single" : "heads");
    }
  }
  // Single heads with d = D at the smaller widths.
  const std::vector<int> single = quick ? std::vector<int>{16} : std::vector<int>{16, 32};
  for (Optimizer o : all) {
    for (int w : single) add(o, recall, w, 1, w, "single");
  }
  // Majority recall: one-hot attention is right 2/3 of the time at best.
  for (Optimizer o : quick ? std::vector<Optimizer>{Optimizer::sgd, Optimizer::adam} : all) {
    add(o, majority, D, 1, D, "soft");
    if (!quick || o == Optimizer::adam) add(o, majority, D, D / 16, 16, "soft");
  }
  // The number of keys P (ln P sets the freezing point sqrt(2 ln P) of the initial logits), at
  // (h, d) = (D/16, 16); P = 16 is the `heads` regime of the same optimizer.
  for (int P : quick ? std::vector<int>{4, 32} : std::vector<int>{4, 8, 32, 64}) {
    TaskSpec t = recall;
    t.pairs = P;
    t.n_keys = std::max(32, 2 * P);
    add(Optimizer::adam, t, D, D / 16, 16, "pairs");
    if (!quick && (P == 4 || P == 64)) add(Optimizer::sgd, t, D, D / 16, 16, "pairs");
  }
  // The temperature sweep and the alternatives: Adam, recall, the single head of width D.
  for (std::size_t i = 0; i < c.regimes.size(); ++i) {
    const RegimeSpec& r = c.regimes[i];
    if (r.family == "single" && r.width == D && r.task.matches == 1) {
      if (r.optimizer == Optimizer::adam) c.temperature_regime = i;
      if (r.optimizer == Optimizer::adam || (!quick && r.optimizer == Optimizer::sgd))
        c.alternative_regimes.push_back(i);
    }
  }
  c.transfer_widths = quick ? std::vector<int>{16, 64} : std::vector<int>{16, 32, 64, 128};
  if (quick) {
    // Quick mode: 4 rates per grid (the 5-rate grid without the end no variant chose in a
    // 5-rate quick run) and 256 evaluation sequences (evaluation was 23% of a run's cost at
    // 512), to stay within 3 minutes of report on 2 cores.
    c.lrs = {{0.03, 0.1, 0.3, 1.0}, {0.003, 0.01, 0.03, 0.1}, {1e-3, 3e-3, 1e-2, 3e-2}};
    c.eval_size = 256;
  }
  c.eval_seeds = quick ? 3 : 10;
  c.steps = quick ? 400 : 500;
  c.temperatures =
      quick ? std::vector<double>{0.25, 4.0} : std::vector<double>{0.25, 0.5, 2.0, 4.0};
  c.replicates = quick ? 2000 : 4000;
  return c;
}

std::string regime_outcome(const RegimeStats& r) {
  if (r.seeds <= 0 || r.scaled_reached < r.seeds) return "inconclusive";
  if (r.unscaled_reached == 0) return "stuck";
  if (r.ratio_low > 1.0) return "slower";
  if (r.ratio_high < 1.0) return "faster";
  return "similar";
}

StudyVerdict judge_study(const std::vector<RegimeStats>& regimes, const std::string& qualifiers,
                         Lang lang) {
  const bool zh = lang == Lang::zh;
  std::vector<std::string> stuck, slower, other;
  int inconclusive = 0;
  for (const RegimeStats& r : regimes) {
    const std::string o = regime_outcome(r);
    const std::string nums =
        zh ? fmt::format("{}（{}x [{:.3g}, {:.3g}]，不缩放时 {}/{} 个种子达到 90%）", r.name,
                         fmt::format("{:.3g}", r.ratio), r.ratio_low, r.ratio_high,
                         r.unscaled_reached, r.seeds)
           : fmt::format("{} ({}x [{:.3g}, {:.3g}], unscaled reached 90% on {}/{})", r.name,
                         fmt::format("{:.3g}", r.ratio), r.ratio_low, r.ratio_high,
                         r.unscaled_reached, r.seeds);
    if (o == "stuck") stuck.push_back(r.name);
    if (o == "slower") slower.push_back(nums);
    if (o == "similar" || o == "faster") {
      other.push_back((zh ? (o == "faster" ? "更快" : "相近") : o) + std::string(zh ? "：" : ": ") +
                      nums);
    }
    inconclusive += o == "inconclusive";
  }
  auto join = [zh](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? (zh ? "；" : "; ") : "") + v[i];
    return s.empty() ? std::string(zh ? "无" : "none") : s;
  };
  StudyVerdict v;
  v.measurement =
      zh ? fmt::format(
               "{}。卡住（1/sqrt(d) 在每个种子上都学会，不缩放时一个也没有）：{}。更慢（达到 "
               "90% 准确率的步数之比，不缩放 / 缩放，种子上的几何平均，其 95% 自助法区间高于 "
               "1）：{}。其余：{}。无法判断（1/sqrt(d) 本身未达到）：{} 个区域中的 {} 个。",
               qualifiers, join(stuck), join(slower), join(other), regimes.size(), inconclusive)
         : fmt::format(
               "{}. Stuck (1/sqrt(d) learns on every seed, unscaled on none): {}. Slower (steps "
               "to 90% accuracy, unscaled / scaled, geometric mean over seeds with its 95% "
               "bootstrap interval above 1): {}. Otherwise: {}. Inconclusive (1/sqrt(d) itself "
               "missed): {} of {} regimes.",
               qualifiers, join(stuck), join(slower), join(other), inconclusive, regimes.size());
  const std::size_t decided = regimes.size() - static_cast<std::size_t>(inconclusive);
  if (regimes.empty() || decided == 0) {
    v.verdict = "inconclusive";
    v.condition = qualifiers;
  } else if (stuck.size() == decided) {
    v.verdict = "holds";
    v.condition = qualifiers;
  } else if (!stuck.empty()) {
    v.verdict = "holds-if";
    v.condition = zh ? "在这些区域中（" + qualifiers + "）：" + join(stuck)
                     : "in these regimes (" + qualifiers + "): " + join(stuck);
  } else {
    v.verdict = "fails";
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const RegimeStats& r : regimes) {
      if (regime_outcome(r) == "slower") lo = std::min(lo, r.ratio), hi = std::max(hi, r.ratio);
    }
    v.condition = zh ? fmt::format("{}；不缩放时从未卡住，在 {} 个可判断区域中的 {} 个更慢",
                                   qualifiers, decided, slower.size())
                     : fmt::format("{}; unscaled never stuck, slower in {} of {} decided regimes",
                                   qualifiers, slower.size(), decided);
    if (!slower.empty()) {
      v.condition += zh ? fmt::format("（{:.3g}x 至 {:.3g}x）", lo, hi)
                        : fmt::format(" ({:.3g}x to {:.3g}x)", lo, hi);
    }
  }
  return v;
}

std::string rate_transfer(const std::vector<double>& chosen, double step) {
  if (chosen.size() < 2) return "inconclusive";
  for (double r : chosen) {
    const double f = std::fabs(std::log(r / chosen.front()));
    if (!(f <= std::log(step) * 1.01)) return "shifts";
  }
  return "transfers";
}

std::optional<double> interpolated_crossing(const std::vector<std::pair<int, double>>& points,
                                            double threshold) {
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (points[i].second < threshold) continue;
    if (i == 0) return points[0].first;
    const auto [a, fa] = points[i - 1];
    const auto [b, fb] = points[i];
    return a + (threshold - fa) / (fb - fa) * (b - a);
  }
  return std::nullopt;
}

namespace {

constexpr double kThreshold = 0.90;

// SGD, SGD with heavy-ball momentum 0.9, and Adam (beta1 0.9, beta2 0.999, eps 1e-8); constant
// rate, no clipping, no weight decay; `mult` scales the rate per tensor (Params::tensors order).
class Stepper {
 public:
  Stepper(Optimizer o, const Params<float>& p, double lr, std::vector<double> mult)
      : o_(o), lr_(lr), mult_(std::move(mult)), m_(p.shape), v_(p.shape) {
    m_.set_zero();
    v_.set_zero();
  }
  void step(Params<float>& params, Params<float>& grad) {
    ++t_;
    const auto p = params.tensors(), g = grad.tensors(), m = m_.tensors(), v = v_.tensors();
    const auto n = params.sizes();
    const double c1 = 1.0 - std::pow(0.9, double(t_)), c2 = 1.0 - std::pow(0.999, double(t_));
    for (std::size_t t = 0; t < p.size(); ++t) {
      const double lr = lr_ * mult_[t];
      for (std::size_t i = 0; i < n[t]; ++i) {
        const double gi = g[t][i];
        switch (o_) {
          case Optimizer::sgd:
            p[t][i] = static_cast<float>(p[t][i] - lr * gi);
            break;
          case Optimizer::momentum: {
            const double mi = 0.9 * m[t][i] + gi;
            m[t][i] = static_cast<float>(mi);
            p[t][i] = static_cast<float>(p[t][i] - lr * mi);
            break;
          }
          case Optimizer::adam: {
            const double mi = 0.9 * m[t][i] + 0.1 * gi, vi = 0.999 * v[t][i] + 0.001 * gi * gi;
            m[t][i] = static_cast<float>(mi);
            v[t][i] = static_cast<float>(vi);
            p[t][i] = static_cast<float>(p[t][i] - lr * (mi / c1) / (std::sqrt(vi / c2) + 1e-8));
            break;
          }
        }
      }
    }
  }

 private:
  Optimizer o_;
  double lr_;
  std::vector<double> mult_;
  long t_ = 0;
  Params<float> m_, v_;
};

struct SeedData {
  std::vector<Batch> batches;
  Batch eval;
};

SeedData make_seed_data(const StudyConfig& c, const TaskSpec& task, std::uint64_t task_id,
                        std::uint64_t seed, int k) {
  SeedData d;
  for (int t = 0; t <= c.steps; ++t) {
    Stream s(seed, stream_id({streams::kTrainStudy, static_cast<std::uint64_t>(k), 1,
                              static_cast<std::uint64_t>(t), task_id}));
    d.batches.push_back(make_batch(task, c.batch, s));
  }
  Stream s(seed, stream_id({streams::kTrainStudy, static_cast<std::uint64_t>(k), 2, task_id}));
  d.eval = make_batch(task, c.eval_size, s);
  return d;
}

struct Point {
  int step;
  double loss, accuracy, entropy, max_logit, dead, grad_wq, grad_wk;
};

struct Run {
  std::vector<Point> curve;
  std::optional<double> t90;
  double auc = 0;  // mean evaluation loss over the run (trapezoid over steps)
  bool diverged = false;
};

bool finite_params(const Params<float>& g) {
  for (const auto* t : {&g.wq, &g.wk, &g.wv, &g.wo}) {
    for (float x : *t) {
      if (!std::isfinite(x)) return false;
    }
  }
  return true;
}

// One variant of a regime: a scale (with its temperature multiplier c), optionally the
// kernel's softcap, or muP (scale 1/d, W_q = 0, hidden-matrix rates x D0 / D).
struct Variant {
  std::size_t regime;
  Scale scale;
  double c = 1.0;
  double softcap = 0.0;
  bool mup = false;
  std::string name;  // the `scale` column
};

Run train_run(const StudyConfig& c, const RegimeSpec& rg, const Variant& var, const SeedData& data,
              std::uint64_t seed, int k, double lr, bool stats) {
  ModelShape shape{rg.task.n_keys, rg.task.n_values, rg.width, rg.d, var.c};
  shape.heads = rg.heads;
  shape.softcap = var.softcap;
  shape.zero_query = var.mup;
  // The same initial parameters for every variant of a (seed, D, h, d): paired comparisons
  // (muP then zeroes W_q).
  Stream init(seed,
              stream_id({streams::kTrainStudy, static_cast<std::uint64_t>(k), 3,
                         static_cast<std::uint64_t>(rg.d), static_cast<std::uint64_t>(rg.width),
                         static_cast<std::uint64_t>(rg.heads)}));
  Params<float> params = init_params<float>(shape, init);
  Params<float> grad(shape);
  // muP (Adam): the hidden matrices W_q, W_k, W_v, W_o learn at lr x D0 / D, D0 the smallest
  // width of the transfer check; embeddings and log_tau at lr.
  std::vector<double> mult(params.tensors().size(), 1.0);
  if (var.mup && !c.transfer_widths.empty()) {
    for (std::size_t t = 2; t <= 5; ++t) mult[t] = double(c.transfer_widths.front()) / rg.width;
  }
  Stepper stepper(rg.optimizer, params, lr, mult);
  Workspace<float> ws;
  Run run;
  const double cap = std::log(double(rg.task.n_values));
  for (int t = 0; t <= c.steps; ++t) {
    const Stats st = forward_backward(params, var.scale, data.batches[t], &grad, false, ws);
    if (!std::isfinite(st.loss) || !finite_params(grad)) {
      run.diverged = true;
      break;
    }
    const bool eval =
        t == c.steps || (t <= c.dense_until ? t % c.dense_every == 0 : t % c.sparse_every == 0);
    if (eval) {
      // The attention statistics (a float64 reference pass) only where the curve is kept.
      const Stats ev = forward_backward<float>(params, var.scale, data.eval, nullptr, stats, ws);
      if (!std::isfinite(ev.loss)) {
        run.diverged = true;
        break;
      }
      run.curve.push_back({t, ev.loss, ev.accuracy, ev.entropy, ev.max_logit, ev.dead,
                           norm(grad.wq), norm(grad.wk)});
    }
    if (t < c.steps) stepper.step(params, grad);
  }
  std::vector<std::pair<int, double>> acc;
  for (const Point& p : run.curve) acc.push_back({p.step, p.accuracy});
  run.t90 = interpolated_crossing(acc, kThreshold);
  // Area under the evaluation loss (capped at chance, ln n_values), per step; a diverged run
  // sits at the cap from where it stopped.
  double area = 0;
  int last = 0;
  double last_loss = cap;
  for (std::size_t i = 0; i < run.curve.size(); ++i) {
    const double l = std::min(run.curve[i].loss, cap);
    if (i > 0) area += 0.5 * (l + last_loss) * (run.curve[i].step - last);
    last = run.curve[i].step;
    last_loss = l;
  }
  if (last < c.steps) area += cap * (c.steps - last);
  run.auc = area / c.steps;
  return run;
}

bool same_task(const TaskSpec& a, const TaskSpec& b) {
  return a.n_keys == b.n_keys && a.n_values == b.n_values && a.pairs == b.pairs &&
         a.matches == b.matches;
}

}  // namespace

void run_study(const StudyConfig& c, const LabOptions& options, json& result) {
  const std::vector<RegimeSpec>& R = c.regimes;
  std::vector<Variant> variants;
  for (std::size_t r = 0; r < R.size(); ++r) {
    for (Scale s : {Scale::one, Scale::inv_sqrt_d})
      variants.push_back({r, s, 1.0, 0, false, scale_name(s)});
  }
  for (double t : c.temperatures) {
    variants.push_back(
        {c.temperature_regime, Scale::inv_sqrt_d, t, 0, false, fmt::format("{:g}/sqrt(d)", t)});
  }
  const std::string softcap_name = fmt::format("1, softcap {:g}", c.softcap);
  for (std::size_t r : c.alternative_regimes) {
    variants.push_back({r, Scale::qk_norm, 1.0, 0, false, "qk-norm"});
    variants.push_back({r, Scale::one, 1.0, c.softcap, false, softcap_name});
    variants.push_back({r, Scale::inv_d, 1.0, 0, true, "muP"});
  }
  // muP's rate transfer: Adam, recall, single head d = D at each transfer width.
  std::vector<std::size_t> transfer_regimes;
  for (int w : c.transfer_widths) {
    for (std::size_t r = 0; r < R.size(); ++r) {
      if (R[r].optimizer == Optimizer::adam && R[r].task.matches == 1 && R[r].family == "single" &&
          R[r].heads == 1 && R[r].d == w && R[r].width == w) {
        transfer_regimes.push_back(r);
        break;
      }
    }
  }
  auto find_variant = [&](std::size_t r, const std::string& name) {
    for (std::size_t v = 0; v < variants.size(); ++v) {
      if (variants[v].regime == r && variants[v].name == name) return v;
    }
    return variants.size();
  };
  for (std::size_t r : transfer_regimes) {
    if (find_variant(r, "muP") == variants.size())
      variants.push_back({r, Scale::inv_d, 1.0, 0, true, "muP"});
  }
  // The tasks, and every seed's batches per task.
  std::vector<TaskSpec> tasks;
  std::vector<std::size_t> task_of(R.size());
  for (std::size_t r = 0; r < R.size(); ++r) {
    std::size_t t = 0;
    while (t < tasks.size() && !same_task(tasks[t], R[r].task)) ++t;
    if (t == tasks.size()) tasks.push_back(R[r].task);
    task_of[r] = t;
  }
  const int seeds = c.tune_seeds + c.eval_seeds;
  std::vector<SeedData> data(tasks.size() * seeds);
  parallel_for(static_cast<std::int64_t>(data.size()), options.threads, [&](std::int64_t i) {
    const std::size_t t = static_cast<std::size_t>(i) / seeds;
    data[i] = make_seed_data(c, tasks[t], t, options.seed, static_cast<int>(i % seeds));
  });
  auto data_of = [&](std::size_t r, int k) -> const SeedData& {
    return data[task_of[r] * seeds + k];
  };

  // Phase 1: every rate of every variant on the held-out seeds.
  struct Job {
    std::size_t v;
    int k;
    double lr;
  };
  std::vector<Job> tune;
  for (std::size_t v = 0; v < variants.size(); ++v) {
    for (int k = 0; k < c.tune_seeds; ++k) {
      for (double lr : c.lrs[static_cast<std::size_t>(R[variants[v].regime].optimizer)])
        tune.push_back({v, k, lr});
    }
  }
  const std::size_t eval_jobs = variants.size() * c.eval_seeds;
  Progress bar(options.progress, "lab train (study)",
               static_cast<std::int64_t>(tune.size() + eval_jobs));
  std::vector<Run> tune_runs(tune.size());
  parallel_for(static_cast<std::int64_t>(tune.size()), options.threads, [&](std::int64_t i) {
    const Job& j = tune[i];
    const Variant& v = variants[j.v];
    tune_runs[i] =
        train_run(c, R[v.regime], v, data_of(v.regime, j.k), options.seed, j.k, j.lr, false);
    bar.advance();
  });
  // The rate of each variant: the lowest mean area under the loss over the held-out seeds.
  std::vector<double> chosen(variants.size(), 0.0);
  for (std::size_t v = 0; v < variants.size(); ++v) {
    double best = std::numeric_limits<double>::infinity();
    for (double lr : c.lrs[static_cast<std::size_t>(R[variants[v].regime].optimizer)]) {
      double area = 0;
      for (std::size_t i = 0; i < tune.size(); ++i) {
        if (tune[i].v == v && tune[i].lr == lr) area += tune_runs[i].auc;
      }
      if (area < best) best = area, chosen[v] = lr;
    }
  }
  // Phase 2: the evaluation seeds at the chosen rate; the first one keeps its curve.
  std::vector<Run> eval_runs(eval_jobs);
  parallel_for(static_cast<std::int64_t>(eval_jobs), options.threads, [&](std::int64_t i) {
    const std::size_t v = static_cast<std::size_t>(i) / c.eval_seeds;
    const int e = static_cast<int>(i % c.eval_seeds), k = c.tune_seeds + e;
    const Variant& var = variants[v];
    eval_runs[i] = train_run(c, R[var.regime], var, data_of(var.regime, k), options.seed, k,
                             chosen[v], e == 0);
    bar.advance();
  });

  json runs = json::array(), curves = json::array(), regimes = json::array(), temps = json::array(),
       alts = json::array(), transfer = json::array();
  auto regime_cols = [&](json& row, const RegimeSpec& rg) {
    row["optimizer"] = optimizer_name(rg.optimizer);
    row["task"] = task_name(rg.task);
    row["pairs"] = rg.task.pairs;
    row["width"] = rg.width;
    row["heads"] = rg.heads;
    row["d"] = rg.d;
  };
  auto run_row = [&](const Variant& v, double lr, int k, const char* role, const Run& r) {
    const Point* end = r.curve.empty() ? nullptr : &r.curve.back();
    json row;
    regime_cols(row, R[v.regime]);
    row["scale"] = v.name;
    row["c"] = v.c;
    row["lr"] = lr;
    row["seed"] = k;
    row["role"] = role;
    row["steps_to_90"] = r.t90 ? json(*r.t90) : json();
    row["loss_auc"] = r.auc;
    row["final_loss"] = end ? json(end->loss) : json();
    row["final_accuracy"] = end ? end->accuracy : 0.0;
    row["diverged"] = r.diverged;
    runs.push_back(row);
  };
  for (std::size_t i = 0; i < tune.size(); ++i) {
    run_row(variants[tune[i].v], tune[i].lr, tune[i].k, "tune", tune_runs[i]);
  }
  for (std::size_t i = 0; i < eval_jobs; ++i) {
    const std::size_t v = i / c.eval_seeds;
    const int k = c.tune_seeds + static_cast<int>(i % c.eval_seeds);
    run_row(variants[v], chosen[v], k, "eval", eval_runs[i]);
    if (k != c.tune_seeds) continue;  // the dynamics of the first evaluation seed
    for (const Point& p : eval_runs[i].curve) {
      json row;
      regime_cols(row, R[variants[v].regime]);
      row["scale"] = variants[v].name;
      row["c"] = variants[v].c;
      row["lr"] = chosen[v];
      row["step"] = p.step;
      row["loss"] = num(p.loss);
      row["accuracy"] = p.accuracy;
      row["entropy"] = num(p.entropy);
      row["max_logit"] = num(p.max_logit);
      row["dead_rows"] = num(p.dead);
      row["grad_norm_wq"] = num(p.grad_wq);
      row["grad_norm_wk"] = num(p.grad_wk);
      curves.push_back(row);
    }
  }
  // Steps to 90% of one variant per evaluation seed; a seed that never reaches it counts as the
  // whole budget (so an unscaled/scaled ratio is then a lower bound).
  auto steps_of = [&](std::size_t v, int& reached) {
    std::vector<double> t;
    reached = 0;
    for (int e = 0; e < c.eval_seeds; ++e) {
      const Run& r = eval_runs[v * c.eval_seeds + e];
      reached += r.t90.has_value();
      t.push_back(std::max(1.0, r.t90.value_or(double(c.steps))));
    }
    return t;
  };
  auto first_point = [&](std::size_t v) -> const Point* {
    const Run& r = eval_runs[v * c.eval_seeds];
    return r.curve.empty() ? nullptr : &r.curve.front();
  };
  // The paired log ratio a / b of steps and of loss areas, with bootstrap intervals.
  struct Paired {
    Interval steps, auc;
  };
  auto paired = [&](std::size_t a, std::size_t b, std::uint64_t id) {
    int ra = 0, rb = 0;
    const std::vector<double> ta = steps_of(a, ra), tb = steps_of(b, rb);
    std::vector<double> log_ratio, log_auc;
    for (int e = 0; e < c.eval_seeds; ++e) {
      log_ratio.push_back(std::log(ta[e] / tb[e]));
      log_auc.push_back(
          std::log(eval_runs[a * c.eval_seeds + e].auc / eval_runs[b * c.eval_seeds + e].auc));
    }
    return Paired{bootstrap_mean(log_ratio, c.replicates, options.seed, id),
                  bootstrap_mean(log_auc, c.replicates, options.seed, id + 1)};
  };
  auto geo_steps = [&](std::size_t v) {
    int reached = 0;
    double g = 0;
    for (double x : steps_of(v, reached)) g += std::log(x) / c.eval_seeds;
    return std::exp(g);
  };
  std::vector<RegimeStats> stats;
  for (std::size_t r = 0; r < R.size(); ++r) {
    const std::size_t u = find_variant(r, "1"), s = find_variant(r, "1/sqrt(d)");
    RegimeStats st;
    st.name = regime_name(R[r]);
    st.seeds = c.eval_seeds;
    steps_of(u, st.unscaled_reached);
    steps_of(s, st.scaled_reached);
    const Paired pr = paired(u, s, stream_id({streams::kTrainStudy, 4, r}));
    st.ratio = std::exp(pr.steps.estimate);
    st.ratio_low = std::exp(pr.steps.low);
    st.ratio_high = std::exp(pr.steps.high);
    stats.push_back(st);
    const Point *pu = first_point(u), *ps = first_point(s);
    json row;
    regime_cols(row, R[r]);
    row["family"] = R[r].family;
    row["seeds"] = c.eval_seeds;
    row["lr_unscaled"] = chosen[u];
    row["lr_scaled"] = chosen[s];
    row["unscaled_reached"] = st.unscaled_reached;
    row["scaled_reached"] = st.scaled_reached;
    row["steps_unscaled"] = geo_steps(u);
    row["steps_scaled"] = geo_steps(s);
    row["step_ratio"] = st.ratio;
    row["step_ratio_ci_low"] = st.ratio_low;
    row["step_ratio_ci_high"] = st.ratio_high;
    row["auc_ratio"] = std::exp(pr.auc.estimate);
    row["auc_ratio_ci_low"] = std::exp(pr.auc.low);
    row["auc_ratio_ci_high"] = std::exp(pr.auc.high);
    double fu = 0, fs = 0;
    for (int e = 0; e < c.eval_seeds; ++e) {
      const Run &ru = eval_runs[u * c.eval_seeds + e], &rs = eval_runs[s * c.eval_seeds + e];
      fu += (ru.curve.empty() ? 0.0 : ru.curve.back().accuracy) / c.eval_seeds;
      fs += (rs.curve.empty() ? 0.0 : rs.curve.back().accuracy) / c.eval_seeds;
    }
    row["final_accuracy_unscaled"] = fu;
    row["final_accuracy_scaled"] = fs;
    row["init_entropy_unscaled"] = pu ? num(pu->entropy) : json();
    row["init_entropy_scaled"] = ps ? num(ps->entropy) : json();
    // Unscaled logits start with standard deviation sqrt(d) over P keys.
    row["rem_entropy_unscaled"] = or_null(rem_entropy(std::sqrt(double(R[r].d)), R[r].task.pairs));
    row["init_dead_unscaled"] = pu ? num(pu->dead) : json();
    row["outcome"] = regime_outcome(st);
    regimes.push_back(row);
  }
  // The initial-temperature sweep: c/sqrt(d) for c from the sweep, with c = 1 (1/sqrt(d)) and
  // c = sqrt(d) (unscaled) from the main grid.
  const std::size_t tr = c.temperature_regime;
  const int td = R.empty() ? 0 : R[tr].d;
  std::vector<std::pair<double, std::size_t>> sweep;
  for (double t : c.temperatures)
    sweep.push_back({t, find_variant(tr, fmt::format("{:g}/sqrt(d)", t))});
  sweep.push_back({1.0, find_variant(tr, "1/sqrt(d)")});
  sweep.push_back({std::sqrt(double(td)), find_variant(tr, "1")});
  std::sort(sweep.begin(), sweep.end());
  for (const auto& [t, v] : sweep) {
    if (v >= variants.size()) continue;
    int reached = 0;
    const std::vector<double> ts = steps_of(v, reached);
    std::vector<double> logs;
    for (double x : ts) logs.push_back(std::log(x));
    const Interval ci =
        bootstrap_mean(logs, c.replicates, options.seed,
                       stream_id({streams::kTrainStudy, 5, static_cast<std::uint64_t>(t * 1000)}));
    double auc = 0;
    for (int e = 0; e < c.eval_seeds; ++e)
      auc += eval_runs[v * c.eval_seeds + e].auc / c.eval_seeds;
    const Point* p0 = first_point(v);
    temps.push_back({{"c", t},
                     {"d", td},
                     {"lr", chosen[v]},
                     {"seeds", c.eval_seeds},
                     {"reached", reached},
                     {"steps_to_90", std::exp(ci.estimate)},
                     {"steps_ci_low", std::exp(ci.low)},
                     {"steps_ci_high", std::exp(ci.high)},
                     {"loss_auc", auc},
                     {"init_entropy", p0 ? num(p0->entropy) : json()},
                     {"rem_entropy", or_null(rem_entropy(t, R[tr].task.pairs))}});
  }
  // The alternatives against 1/sqrt(d) on the same seeds.
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const Variant& var = variants[v];
    if (var.name != "qk-norm" && var.name != "muP" && var.softcap == 0) continue;
    const std::size_t s = find_variant(var.regime, "1/sqrt(d)");
    int reached = 0;
    steps_of(v, reached);
    const Paired pr = paired(v, s, stream_id({streams::kTrainStudy, 6, v}));
    const Point* p0 = first_point(v);
    json row;
    regime_cols(row, R[var.regime]);
    row["scale"] = var.name;
    row["lr"] = chosen[v];
    row["seeds"] = c.eval_seeds;
    row["reached"] = reached;
    row["steps_to_90"] = geo_steps(v);
    row["ratio_to_scaled"] = std::exp(pr.steps.estimate);
    row["ratio_ci_low"] = std::exp(pr.steps.low);
    row["ratio_ci_high"] = std::exp(pr.steps.high);
    row["auc_ratio"] = std::exp(pr.auc.estimate);
    row["init_entropy"] = p0 ? num(p0->entropy) : json();
    alts.push_back(row);
  }
  // Rate transfer across widths: the rate chosen on the held-out seed, per width, for muP and
  // for 1/sqrt(d) (standard parametrisation).
  const double grid_step = 10.0 / 3.0;  // half-decade grids: neighbours 3-3.3x apart
  for (const std::string param : {"1/sqrt(d)", "muP"}) {
    std::vector<double> rates;
    for (std::size_t r : transfer_regimes) rates.push_back(chosen[find_variant(r, param)]);
    const std::string outcome = rate_transfer(rates, grid_step);
    for (std::size_t i = 0; i < transfer_regimes.size(); ++i) {
      const std::size_t v = find_variant(transfer_regimes[i], param);
      transfer.push_back({{"scale", param},
                          {"width", R[transfer_regimes[i]].width},
                          {"lr", chosen[v]},
                          {"steps_to_90", geo_steps(v)},
                          {"outcome", outcome}});
    }
  }
  result["tables"]["study_runs"] = runs;
  result["tables"]["study_curves"] = curves;
  result["tables"]["study_regimes"] = regimes;
  result["tables"]["study_temperature"] = temps;
  result["tables"]["study_alternatives"] = alts;
  result["tables"]["study_transfer"] = transfer;

  int heads = 0, soft = 0, pmin = 1 << 30, pmax = 0;
  std::string widths;
  for (const RegimeSpec& r : R) {
    heads += r.heads > 1;
    soft += r.task.matches > 1;
    pmin = std::min(pmin, r.task.pairs);
    pmax = std::max(pmax, r.task.pairs);
    const std::string w = std::to_string(r.width);
    if (("/" + widths + "/").find("/" + w + "/") == std::string::npos)
      widths += (widths.empty() ? "" : "/") + w;
  }
  const bool zh = options.lang == Lang::zh;
  const std::string qualifiers =
      zh ? fmt::format(
               "单个注意力层；P = {} 至 {} 个键的关联回忆（独热注意力即可解决），以及 {} "
               "个区域中的多数回忆（需要把注意力分散到 3 个匹配的键上）；宽度 D = {}，{} "
               "个多头区域（h = D/d）以及单头 d = D；SGD、SGD+动量、Adam；每个区域 {} "
               "个配对种子，学习率在 {} 个留出种子上选定；{} 步",
               pmin, pmax, soft, widths, heads, c.eval_seeds, c.tune_seeds, c.steps)
         : fmt::format(
               "one attention layer; associative recall (one-hot attention solves it) with P = "
               "{} to {} keys, and majority recall (needs attention over 3 matching keys) in {} "
               "regimes; widths D = {}, {} multi-head regimes (h = D/d) and single heads d = D; "
               "SGD, SGD+momentum, Adam; {} paired seeds per regime, rates chosen on {} "
               "held-out seed(s); {} steps",
               pmin, pmax, soft, widths, heads, c.eval_seeds, c.tune_seeds, c.steps);
  const StudyVerdict v = judge_study(stats, qualifiers, options.lang);
  const std::string theory =
      zh ? "初始化时 q.k 的方差为 d，所以不缩放的分数一开始就是冻结的（d >> 2 ln P "
           "时熵接近 0，即随机能量模型的冻结点）。普通 SGD "
           "按梯度移动权重，而饱和使大多数行的梯度变小；动量会累积梯度；Adam "
           "用梯度自身的大小去除它。如果原文正确，不缩放的注意力应当卡住，至少也应更慢，"
           "尤其是在 SGD 下、d 较大、P 较小、以及需要把注意力分散到多个键上的任务上。"
         : "At initialisation q.k has variance d, so unscaled scores start frozen (entropy near 0 "
           "for d >> 2 ln P, the random-energy-model freezing point). Plain SGD moves the weights "
           "by the gradient, which saturation shrinks for most rows; momentum accumulates it; "
           "Adam divides it by its own size. If the article is right, unscaled attention should "
           "be stuck, or at least slower, most of all under SGD, at large d, at small P, and on a "
           "task that needs attention spread over several keys.";
  const std::string evidence =
      zh ? fmt::format(
               "达到 90% 准确率的时间在评估点之间插值：到第 {} 步为止每 {} 步评估一次"
               "（之后每 {} 步）；从未达到的种子按整个预算计。表 study_temperature "
               "把初始温度与参数化分开：在 d = {} 时对扫描中的 c 取 c/sqrt(d)。",
               c.dense_until, c.dense_every, c.sparse_every, td)
         : "Time to 90% accuracy is interpolated between evaluations every " +
               std::to_string(c.dense_every) + " steps up to step " +
               std::to_string(c.dense_until) + " (then every " + std::to_string(c.sparse_every) +
               "); a seed that never reaches it counts as the whole budget. "
               "Table study_temperature separates the initial temperature from "
               "the parametrisation: c/sqrt(d) for c from the sweep at d = " +
               std::to_string(td) + ".";
  json claim = make_claim("C8", options.lang, theory, v.measurement,
                          ::sdpa::lab::Verdict{v.verdict, v.condition}, evidence);
  result["claims"].push_back(claim);
}

}  // namespace sdpa::lab::train
