// Tests of `sdpa lab train` (claim C8): the task generator, the model's gradients against finite
// differences (float64, every parameter, every scale variant), Adam, the summary statistics, the
// verdict (and that it flips with the numbers), determinism over thread counts, and that the
// task is solvable: the scaled model reaches 90% accuracy in the quick configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "lab/lab.h"
#include "lab/random.h"
#include "lab/train_model.h"
#include "lab/train_run.h"
#include "lab/train_study.h"
#include "lab/train_verdict.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab::train {
namespace {

constexpr ScaleKind kAllScales[] = {ScaleKind::one, ScaleKind::inv_sqrt_d, ScaleKind::inv_d,
                                    ScaleKind::qk_norm};

TEST(TrainTask, BatchesAreWellFormedAndReproducible) {
  const TaskSpec task{10, 7, 6};
  Stream s1(42, 5), s2(42, 5), s3(42, 6);
  const Batch a = make_batch(task, 200, s1), b = make_batch(task, 200, s2),
              c = make_batch(task, 200, s3);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.query, b.query);
  EXPECT_NE(a.keys, c.keys) << "another stream id must give other sequences";
  std::set<int> targets;
  for (int s = 0; s < a.size; ++s) {
    std::set<int> keys;
    int found = -1;
    for (int i = 0; i < a.pairs; ++i) {
      const int k = a.keys[s * a.pairs + i], v = a.values[s * a.pairs + i];
      ASSERT_GE(k, 0);
      ASSERT_LT(k, task.n_keys);
      ASSERT_GE(v, 0);
      ASSERT_LT(v, task.n_values);
      keys.insert(k);
      if (k == a.query[s]) found = v;
    }
    EXPECT_EQ(keys.size(), static_cast<std::size_t>(a.pairs)) << "keys repeat in sequence " << s;
    EXPECT_EQ(found, a.target[s]) << "sequence " << s << ": target is not the query's value";
    targets.insert(a.target[s]);
  }
  EXPECT_EQ(targets.size(), static_cast<std::size_t>(task.n_values)) << "200 draws, 7 values";
}

// Every parameter's gradient against central differences of the float64 loss.
// Error budget: truncation h^2/6 |L'''| ~ 1e-12 for h = 1e-5 on this O(1) problem, rounding
// ~ eps |L| / h ~ 1e-16 * 3 / 1e-5 = 3e-11; the bound 1e-7 (relative to max(1, |g|)) leaves a
// margin of 1000x yet catches any wrong term (those are O(|g|)).
TEST(TrainModel, GradientsMatchFiniteDifferences) {
  // One head (n_keys, n_values, width D, head dim d); three heads of d = 2 in D = 6, whose k
  // and v go through the kernel as strided (B, h, P, d) views; the kernel's softcap; muP's
  // zero query; and the majority task (repeated keys).
  ModelShape heads{6, 5, 6, 2};
  heads.heads = 3;
  ModelShape capped{6, 5, 4, 3};
  capped.softcap = 1.5;
  ModelShape zero_q{6, 5, 4, 3};
  zero_q.zero_query = true;
  TaskSpec majority{6, 5, 4};
  majority.matches = 3;
  const std::pair<ModelShape, TaskSpec> cases[] = {{ModelShape{6, 5, 4, 3}, TaskSpec{6, 5, 4}},
                                                   {heads, TaskSpec{6, 5, 4}},
                                                   {capped, TaskSpec{6, 5, 4}},
                                                   {zero_q, majority}};
  for (const auto& [shape, task] : cases)
    for (const ScaleKind kind : kAllScales) {
      SCOPED_TRACE(std::string(scale_name(kind)) + " heads " + std::to_string(shape.heads) +
                   " softcap " + std::to_string(shape.softcap) + " matches " +
                   std::to_string(task.matches));
      // q / |q| has no derivative at q = 0: the zero query goes with the fixed scales (muP).
      if (shape.zero_query && kind == ScaleKind::qk_norm) continue;
      Stream init(7, 1), data(7, 2);
      Params<double> p = init_params<double>(shape, init);
      p.log_tau = 0.3;  // away from the initial value so that tau's gradient is non-trivial
      const Batch batch = make_batch(task, 3, data);
      Workspace<double> ws;
      Params<double> grad(shape);
      forward_backward(p, kind, batch, &grad, false, ws);
      const auto values = p.tensors();
      const auto grads = grad.tensors();
      const auto sizes = p.sizes();
      const char* names[] = {"emb_k", "emb_v", "wq", "wk", "wv", "wo", "log_tau"};
      constexpr double h = 1e-5, bound = 1e-7;
      double worst = 0, worst_g = 0, worst_fd = 0;
      std::string worst_where;
      for (std::size_t t = 0; t < values.size(); ++t) {
        if (kind != ScaleKind::qk_norm && t == 6) {
          EXPECT_EQ(grads[t][0], 0.0) << "a fixed scale has no temperature gradient";
          continue;
        }
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          const double saved = values[t][i];
          values[t][i] = saved + h;
          const double up = forward_backward<double>(p, kind, batch, nullptr, false, ws).loss;
          values[t][i] = saved - h;
          const double down = forward_backward<double>(p, kind, batch, nullptr, false, ws).loss;
          values[t][i] = saved;
          const double fd = (up - down) / (2 * h);
          const double err = std::fabs(fd - grads[t][i]) / std::max(1.0, std::fabs(fd));
          if (err > worst) {
            worst = err;
            worst_g = grads[t][i];
            worst_fd = fd;
            worst_where = std::string(names[t]) + "[" + std::to_string(i) + "]";
          }
        }
      }
      EXPECT_LE(worst, bound) << "worst at " << worst_where << ": analytic " << worst_g
                              << ", finite difference " << worst_fd;
    }
}

TEST(TrainTask, MajorityBatchesNeedSeveralKeys) {
  TaskSpec task{32, 16, 16};
  task.matches = 3;
  Stream s(9, 1);
  const Batch a = make_batch(task, 300, s);
  for (int b = 0; b < a.size; ++b) {
    std::map<int, int> key_count, target_votes;
    for (int i = 0; i < a.pairs; ++i) {
      const int k = a.keys[b * a.pairs + i];
      ++key_count[k];
      if (k == a.query[b]) ++target_votes[a.values[b * a.pairs + i]];
    }
    ASSERT_EQ(key_count[a.query[b]], 3) << "sequence " << b;
    for (const auto& [k, n] : key_count) {
      if (k != a.query[b]) {
        ASSERT_EQ(n, 1) << "sequence " << b << ": key " << k << " repeats";
      }
    }
    // The target carries 2 of the 3 matching positions, the third another value: attending to
    // one matching position is right with probability 2/3.
    ASSERT_EQ(target_votes[a.target[b]], 2) << "sequence " << b;
    ASSERT_EQ(target_votes.size(), 2u) << "sequence " << b;
  }
  EXPECT_EQ(task_name(task), "majority-3");
  EXPECT_EQ(task_name(TaskSpec{}), "recall");
}

TEST(TrainModel, QkNormGradientIsNotTrivial) {
  // The check above would pass vacuously if the temperature gradient were always ~0.
  const ModelShape shape{6, 5, 4, 3};
  Stream init(3, 1), data(3, 2);
  Params<double> p = init_params<double>(shape, init);
  const Batch batch = make_batch(TaskSpec{6, 5, 4}, 8, data);
  Workspace<double> ws;
  Params<double> grad(shape);
  forward_backward(p, ScaleKind::qk_norm, batch, &grad, false, ws);
  EXPECT_GT(std::fabs(grad.log_tau), 1e-4);
}

TEST(TrainModel, StatsMeasureTheAttention) {
  // With the same q and k, scale 1 on d = 256 saturates (low entropy, large logits) where
  // 1/sqrt(d) does not; entropy never exceeds ln(pairs).
  const ModelShape shape{32, 16, 32, 256};
  Stream init(1, 1), data(1, 2);
  const Params<float> p = init_params<float>(shape, init);
  const Batch batch = make_batch(TaskSpec{32, 16, 16}, 256, data);
  Workspace<float> ws;
  const Stats one = forward_backward<float>(p, ScaleKind::one, batch, nullptr, true, ws);
  const Stats scaled = forward_backward<float>(p, ScaleKind::inv_sqrt_d, batch, nullptr, true, ws);
  EXPECT_NEAR(one.max_logit / scaled.max_logit, 16.0, 1e-3);  // the logits differ by sqrt(256)
  EXPECT_LT(one.entropy, scaled.entropy);
  EXPECT_LE(scaled.entropy, std::log(16.0) + 1e-6);
  EXPECT_GE(one.entropy, 0.0);
  EXPECT_GE(scaled.accuracy, 0.0);
  EXPECT_LE(scaled.accuracy, 1.0);
  // Dead rows (1 - max p < 1e-3): a good share of the unscaled rows at d = 256 over 16 keys
  // (the top-two gap is about 16 E / 1.8 nats), hardly any scaled one.
  EXPECT_GT(one.dead, 0.2);
  EXPECT_LT(scaled.dead, 0.02);
  // muP's zero query: every score is 0, uniform attention, no row dead.
  ModelShape zq = shape;
  zq.zero_query = true;
  Stream init2(1, 1);
  const Params<float> pz = init_params<float>(zq, init2);
  const Stats uniform = forward_backward<float>(pz, ScaleKind::inv_d, batch, nullptr, true, ws);
  EXPECT_NEAR(uniform.entropy, std::log(16.0), 1e-6);
  EXPECT_EQ(uniform.dead, 0.0);
  EXPECT_EQ(uniform.max_logit, 0.0);
}

TEST(TrainModel, AdamFirstStepMovesEveryParameterByTheRate) {
  // Adam's first step is lr * g / (|g| + eps): lr * sign(g) for |g| >> eps.
  const ModelShape shape{3, 2, 2, 2};
  Stream init(1, 1);
  Params<double> p = init_params<double>(shape, init), before = p, g(shape);
  Stream gs(1, 2);
  for (auto& x : g.wq) x = gs.normal();
  g.wq[1] = 0.0;
  Adam<double> adam(p, 0.01);
  adam.step(p, g);
  for (std::size_t i = 0; i < p.wq.size(); ++i) {
    const double expected = g.wq[i] == 0 ? 0.0 : (g.wq[i] > 0 ? -0.01 : 0.01);
    EXPECT_NEAR(p.wq[i] - before.wq[i], expected, 1e-8) << "wq[" << i << "]";
  }
  EXPECT_EQ(p.wk, before.wk) << "a zero gradient moves nothing";
}

RunResult fake_run(double final_acc, double final_loss, std::vector<double> acc_curve,
                   bool diverged = false) {
  RunResult r;
  for (std::size_t i = 0; i < acc_curve.size(); ++i) {
    CurvePoint p;
    p.step = static_cast<int>(i) * 10;
    p.accuracy = acc_curve[i];
    p.loss = final_loss;
    p.entropy = 1.5;
    p.grad_norm_wq = 0.5;
    r.curve.push_back(p);
    if (!r.steps_to_acc90 && acc_curve[i] >= kLearnedAccuracy) r.steps_to_acc90 = p.step;
  }
  r.final_accuracy = final_acc;
  r.final_loss = final_loss;
  r.diverged = diverged;
  return r;
}

TEST(TrainSummary, BestRateSensitivityAndSteps) {
  TrainConfig c;
  c.task.n_values = 16;
  c.lrs = {0.001, 0.01, 0.1};
  const double cap = std::log(16.0);
  const std::vector<RunResult> runs = {
      fake_run(0.5, 1.0, {0.1, 0.3, 0.5}), fake_run(0.95, 0.2, {0.1, 0.5, 0.86, 0.95}),
      fake_run(0.06, 9.0, {0.1, 0.06}, true),  // diverged: its loss counts as ln(16)
  };
  const SummaryRow r = summarize(c, ScaleKind::one, 64, runs);
  EXPECT_EQ(r.scale, "1");
  EXPECT_EQ(r.best_accuracy, 0.95);
  EXPECT_EQ(r.best_lr, 0.01);
  EXPECT_EQ(r.steps_to_90, 20);  // 0.86 >= 0.9 * 0.95 at step 20
  ASSERT_TRUE(r.steps_to_acc90.has_value());
  EXPECT_EQ(*r.steps_to_acc90, 30);
  EXPECT_EQ(r.lrs_reaching_90, 1);
  EXPECT_EQ(r.diverged, 1);
  EXPECT_DOUBLE_EQ(r.best_final_loss, 0.2);
  EXPECT_DOUBLE_EQ(r.lr_sensitivity, ((1.0 - 0.2) + 0.0 + (cap - 0.2)) / 3.0);
  EXPECT_EQ(r.init_entropy, 1.5);
}

TEST(TrainSummary, TiesGoToTheLowerLoss) {
  TrainConfig c;
  c.lrs = {0.001, 0.01};
  const SummaryRow r =
      summarize(c, ScaleKind::inv_d, 16, {fake_run(1.0, 0.3, {1.0}), fake_run(1.0, 0.1, {1.0})});
  EXPECT_EQ(r.best_lr, 0.01);
}

SummaryRow row(const std::string& scale, int d, std::optional<long> steps, double acc = 1.0) {
  SummaryRow r;
  r.scale = scale;
  r.d = d;
  r.best_accuracy = acc;
  r.best_lr = 0.01;
  r.steps_to_acc90 = steps;
  r.n_lrs = 5;
  r.lrs_reaching_90 = steps ? 3 : 0;
  r.init_entropy = scale == "1" ? 0.1 : 2.3;
  r.init_grad_norm_wq = scale == "1" ? 0.01 : 0.4;
  r.init_max_logit = scale == "1" ? 60 : 4;
  return r;
}

std::vector<SummaryRow> rows_for(std::optional<long> u16, std::optional<long> s16,
                                 std::optional<long> u256, std::optional<long> s256) {
  return {row("1", 16, u16),      row("1/sqrt(d)", 16, s16), row("1/d", 16, 100),
          row("qk-norm", 16, 50), row("1", 256, u256),       row("1/sqrt(d)", 256, s256),
          row("1/d", 256, 100),   row("qk-norm", 256, 50)};
}

TEST(TrainVerdict, FollowsTheNumbersAndFlipsWithThem) {
  const VerdictContext ctx{16, 400};
  // Unscaled stuck at 256 only: holds where it is stuck.
  Verdict v = judge_c8(rows_for(60, 40, std::nullopt, 40), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "holds-if");
  EXPECT_EQ(v.condition, "d >= 256");
  EXPECT_NE(v.evidence.find("every one of the 5 rates"), std::string::npos) << v.evidence;
  // The same, but now unscaled learns at 256 too (2.5x slower): the verdict flips.
  v = judge_c8(rows_for(60, 40, 100, 40), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "fails");
  EXPECT_EQ(v.condition, "");
  EXPECT_NE(v.evidence.find("slower"), std::string::npos) << v.evidence;
  EXPECT_NE(v.evidence.find("at d = 256."), std::string::npos) << v.evidence;  // not at 16 (1.5x)
  EXPECT_NE(v.evidence.find("2.5x"), std::string::npos) << v.evidence;
  EXPECT_NE(v.evidence.find("at 3/5 rates (1/sqrt(d): 3/5)"), std::string::npos) << v.evidence;
  // Within a factor 2 everywhere: fails, no slowdown claimed.
  v = judge_c8(rows_for(50, 40, 60, 40), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "fails");
  EXPECT_EQ(v.evidence.find("slower"), std::string::npos) << v.evidence;
  // Stuck everywhere: holds.
  v = judge_c8(rows_for(std::nullopt, 40, std::nullopt, 40), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "holds");
  // Stuck at the small d only: the condition lists it rather than claiming "d >= 16".
  v = judge_c8(rows_for(std::nullopt, 40, 60, 40), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "holds-if");
  EXPECT_EQ(v.condition, "d in {16}");
  // The scaled model did not learn at 256: that d says nothing; 16 decides.
  v = judge_c8(rows_for(std::nullopt, 40, std::nullopt, std::nullopt), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "holds");
  EXPECT_NE(v.evidence.find("inconclusive"), std::string::npos) << v.evidence;
  v = judge_c8(rows_for(std::nullopt, std::nullopt, std::nullopt, std::nullopt), ctx, Lang::en);
  EXPECT_EQ(v.verdict, "inconclusive");
}

TEST(TrainVerdict, QuotesTheMeasuredNumbers) {
  const Verdict v = judge_c8(rows_for(80, 40, std::nullopt, 40), VerdictContext{16, 400}, Lang::en);
  EXPECT_NE(v.evidence.find("entropy 0.1 nats"), std::string::npos) << v.evidence;
  EXPECT_NE(v.evidence.find("0.025x"), std::string::npos) << v.evidence;  // 0.01 / 0.4
  EXPECT_NE(v.measurement.find("qk-norm"), std::string::npos) << v.measurement;
  EXPECT_NE(v.measurement.find("1/d"), std::string::npos) << v.measurement;
}

TEST(TrainVerdict, ChineseHasTheSameVerdict) {
  for (const auto& rows : {rows_for(80, 40, std::nullopt, 40), rows_for(80, 40, 100, 40)}) {
    const Verdict en = judge_c8(rows, VerdictContext{16, 400}, Lang::en);
    const Verdict zh = judge_c8(rows, VerdictContext{16, 400}, Lang::zh);
    EXPECT_EQ(en.verdict, zh.verdict);
    EXPECT_EQ(en.condition, zh.condition);
    EXPECT_NE(zh.evidence, en.evidence);
    EXPECT_NE(zh.evidence.find("学"), std::string::npos) << zh.evidence;
  }
}

TrainConfig tiny_config() {
  TrainConfig c;
  c.task = TaskSpec{8, 4, 4};
  c.width = 8;
  c.ds = {4, 8};
  c.scales = {ScaleKind::one, ScaleKind::inv_sqrt_d, ScaleKind::qk_norm};
  c.lrs = {0.003, 0.03};
  c.steps = 30;
  c.batch = 8;
  c.eval_every = 10;
  c.eval_size = 64;
  return c;
}

TEST(TrainExperiment, SameNumbersForAnyThreadCount) {
  LabOptions one, three;
  one.threads = 1;
  three.threads = 3;
  json a = run_experiment(tiny_config(), one), b = run_experiment(tiny_config(), three);
  EXPECT_EQ(a["tables"].dump(), b["tables"].dump());
  EXPECT_EQ(a["claims"].dump(), b["claims"].dump());
  LabOptions other_seed = one;
  other_seed.seed = 2;
  json c = run_experiment(tiny_config(), other_seed);
  EXPECT_NE(a["tables"]["curves"].dump(), c["tables"]["curves"].dump());
}

TEST(TrainExperiment, JsonHasTheCommonForm) {
  LabOptions o;
  o.threads = 2;
  o.seed = 5;
  const TrainConfig c = tiny_config();
  const json j = run_experiment(c, o);
  EXPECT_EQ(j["experiment"], "train");
  EXPECT_EQ(j["seed"], 5);
  EXPECT_EQ(j["mode"], "quick");
  EXPECT_EQ(j["lang"], "en");
  EXPECT_TRUE(j["seconds"].is_number());
  ASSERT_EQ(j["claims"].size(), 1u);
  const json& claim = j["claims"][0];
  EXPECT_EQ(claim["id"], "C8");
  const std::set<std::string> verdicts{"holds", "fails", "holds-if", "inconclusive"};
  EXPECT_TRUE(verdicts.count(claim["verdict"].get<std::string>())) << claim["verdict"];
  for (const char* key : {"claim", "theory", "measurement", "condition", "evidence"}) {
    EXPECT_TRUE(claim[key].is_string()) << key;
  }
  const json& summary = j["tables"]["summary"];
  ASSERT_EQ(summary.size(), c.ds.size() * c.scales.size());
  for (const json& r : summary) {
    for (const char* key :
         {"scale", "d", "best_accuracy", "best_lr", "steps_to_90", "steps_to_acc90",
          "lr_sensitivity", "init_entropy", "init_grad_norm_wq"}) {
      EXPECT_TRUE(r.contains(key)) << key;
    }
    EXPECT_GE(r["lr_sensitivity"].get<double>(), 0.0);
  }
  EXPECT_EQ(summary[0]["scale"], "1");
  EXPECT_EQ(summary[1]["scale"], "1/sqrt(d)");
  EXPECT_EQ(summary[2]["scale"], "qk-norm");
  const json& curves = j["tables"]["curves"];
  // Checkpoints 0, 10, 20, 30 of every run (none diverges at these rates).
  EXPECT_EQ(curves.size(), c.ds.size() * c.scales.size() * c.lrs.size() * 4);
  for (const char* key : {"scale", "d", "lr", "step", "loss", "accuracy", "train_loss", "entropy",
                          "max_logit", "grad_norm_wq", "grad_norm_wk", "temperature"}) {
    EXPECT_TRUE(curves[0].contains(key)) << key;
  }
  EXPECT_EQ(j["tables"]["runs"].size(), c.ds.size() * c.scales.size() * c.lrs.size());
}

TEST(TrainExperiment, BadThreadCountIsRefused) {
  LabOptions o;
  o.threads = -1;
  EXPECT_THROW(run_experiment(tiny_config(), o), sdpa::Error);
}

TEST(TrainConfigs, SweepsCoverTwoDecadesWithAtLeastFiveRates) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    const TrainConfig c = config_for(mode);
    ASSERT_GE(c.lrs.size(), 5u);
    EXPECT_GE(c.lrs.back() / c.lrs.front(), 100.0 * (1 - 1e-12));
    EXPECT_EQ(c.scales.size(), 4u);
    EXPECT_NE(std::find(c.ds.begin(), c.ds.end(), 16), c.ds.end());
    EXPECT_NE(std::find(c.ds.begin(), c.ds.end(), 256), c.ds.end());
  }
  const TrainConfig full = config_for(Mode::full);
  EXPECT_NE(std::find(full.ds.begin(), full.ds.end(), 64), full.ds.end());
}

// The task is solvable: in the quick configuration, 1/sqrt(d) reaches 90% accuracy at both
// head dimensions. The rates are tried nearest to 1e-2 first (it learned in 40-60 steps there
// in development) and the test stops at the first success, so it usually costs one run per d.
TEST(TrainExperiment, ScaledModelLearnsTheQuickTask) {
  const TrainConfig c = config_for(Mode::quick);
  const Data data = make_data(c, 1);
  std::vector<double> lrs = c.lrs;
  std::sort(lrs.begin(), lrs.end(), [](double a, double b) {
    return std::fabs(std::log(a / 1e-2)) < std::fabs(std::log(b / 1e-2));
  });
  for (const int d : c.ds) {
    double best = 0;
    for (const double lr : lrs) {
      const RunResult r = train_one(c, data, 1, ScaleKind::inv_sqrt_d, d, lr);
      best = std::max(best, r.final_accuracy);
      if (best >= kLearnedAccuracy) break;
    }
    EXPECT_GE(best, kLearnedAccuracy) << "d = " << d;
  }
}

}  // namespace
}  // namespace sdpa::lab::train

namespace sdpa::lab::train {
namespace {

// The study's rules flip when their numbers do.
TEST(StudyVerdict, RegimeOutcomeFollowsTheInterval) {
  RegimeStats r{"sgd recall P=16 D=64 h=1 d=64", 3, 3, 3, 4.0, 3.5, 4.5};
  EXPECT_EQ(regime_outcome(r), "slower");
  r.ratio_low = 0.9;  // the interval reaches below 1
  EXPECT_EQ(regime_outcome(r), "similar");
  r.ratio_high = 0.95;  // entirely below 1
  EXPECT_EQ(regime_outcome(r), "faster");
  r.unscaled_reached = 0;  // unscaled never reaches 90%, scaled always
  EXPECT_EQ(regime_outcome(r), "stuck");
  r.scaled_reached = 2;  // the scaled model itself missed on a seed
  EXPECT_EQ(regime_outcome(r), "inconclusive");
}

TEST(StudyVerdict, JudgeOverRegimesCarriesTheQualifiers) {
  const RegimeStats slow{"adam recall P=16 D=64 h=4 d=16", 3, 3, 3, 5.0, 4.0, 6.0};
  RegimeStats stuck = slow;
  stuck.unscaled_reached = 0;
  stuck.name = "sgd majority-3 P=16 D=64 h=1 d=64";
  RegimeStats lost = slow;
  lost.scaled_reached = 0;
  StudyVerdict v = judge_study({slow, slow}, "Q-QUALIFIERS");
  EXPECT_EQ(v.verdict, "fails");
  EXPECT_EQ(v.measurement.rfind("Q-QUALIFIERS", 0), 0u) << v.measurement;
  // The front table shows the condition: a "fails" carries the qualifiers too.
  EXPECT_EQ(v.condition.rfind("Q-QUALIFIERS", 0), 0u) << v.condition;
  EXPECT_NE(v.condition.find("slower in 2 of 2"), std::string::npos) << v.condition;
  v = judge_study({slow, stuck}, "Q");
  EXPECT_EQ(v.verdict, "holds-if");
  EXPECT_NE(v.condition.find("sgd majority-3 P=16 D=64 h=1 d=64"), std::string::npos)
      << v.condition;
  EXPECT_EQ(judge_study({stuck, stuck}, "Q").verdict, "holds");
  EXPECT_EQ(judge_study({stuck, lost}, "Q").verdict, "holds");
  EXPECT_EQ(judge_study({lost, lost}, "Q").verdict, "inconclusive");
  EXPECT_EQ(judge_study({}, "Q").verdict, "inconclusive");
  // In Chinese: the same verdicts, the text in Chinese around the regimes' names and numbers.
  const auto has_cjk = [](const std::string& t) {
    return t.find("\xe5") != std::string::npos || t.find("\xe4") != std::string::npos ||
           t.find("\xe6") != std::string::npos || t.find("\xe7") != std::string::npos;
  };
  for (const auto& regimes :
       {std::vector<RegimeStats>{slow, slow}, std::vector<RegimeStats>{slow, stuck},
        std::vector<RegimeStats>{lost, lost}}) {
    const StudyVerdict en = judge_study(regimes, "Q"),
                       zh = judge_study(regimes, "Q", sdpa::lab::Lang::zh);
    EXPECT_EQ(zh.verdict, en.verdict);
    EXPECT_TRUE(has_cjk(zh.measurement)) << zh.measurement;
    EXPECT_EQ(zh.measurement.find("Stuck"), std::string::npos) << zh.measurement;
    EXPECT_EQ(zh.condition.find("regimes"), std::string::npos) << zh.condition;
  }
}

TEST(StudyVerdict, CrossingIsInterpolatedBetweenEvaluations) {
  EXPECT_DOUBLE_EQ(*interpolated_crossing({{0, 0.1}, {10, 0.5}, {20, 1.0}}, 0.9), 18.0);
  EXPECT_DOUBLE_EQ(*interpolated_crossing({{0, 0.95}}, 0.9), 0.0);
  EXPECT_FALSE(interpolated_crossing({{0, 0.1}, {10, 0.89}}, 0.9).has_value());
}

TEST(StudyVerdict, RateTransferFlipsAtOneGridStep) {
  EXPECT_EQ(rate_transfer({1e-3, 1e-3, 3e-3}, 10.0 / 3.0), "transfers");
  EXPECT_EQ(rate_transfer({3e-3, 1e-3}, 10.0 / 3.0), "transfers");
  EXPECT_EQ(rate_transfer({1e-3, 1e-2}, 10.0 / 3.0), "shifts");  // two steps
  EXPECT_EQ(rate_transfer({1e-3, 3e-3, 1e-2}, 10.0 / 3.0), "shifts");
  EXPECT_EQ(rate_transfer({1e-3}, 10.0 / 3.0), "inconclusive");
}

TEST(StudyConfigs, SeedsOptimizersWidthsHeadsTasksAndPairs) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    SCOPED_TRACE(mode == Mode::quick ? "quick" : "full");
    const StudyConfig c = study_config_for(mode);
    EXPECT_GE(c.eval_seeds, mode == Mode::quick ? 3 : 10);
    EXPECT_GE(c.tune_seeds, 1);
    std::set<int> opts, pairs, multi;
    bool single = false, soft = false;
    for (const RegimeSpec& r : c.regimes) {
      EXPECT_LE(r.heads * r.d, r.width) << regime_name(r);
      opts.insert(static_cast<int>(r.optimizer));
      pairs.insert(r.task.pairs);
      if (r.heads > 1 && r.heads * r.d == r.width) multi.insert(r.d);
      single = single || (r.heads == 1 && r.d == r.width);
      soft = soft || r.task.matches > 1;
    }
    EXPECT_EQ(opts.size(), 3u);
    EXPECT_TRUE(single);
    EXPECT_TRUE(soft);
    EXPECT_GE(pairs.size(), 3u) << "P must vary";
    EXPECT_TRUE(multi.count(16)) << "h = D/16 heads at fixed D";
    ASSERT_LT(c.temperature_regime, c.regimes.size());
    EXPECT_FALSE(c.alternative_regimes.empty());
    EXPECT_GE(c.transfer_widths.size(), 2u);
  }
  // Full mode reaches the head dimensions of today's models: d = 16 to 128 at width D = 128.
  std::set<int> wide;
  for (const RegimeSpec& r : study_config_for(Mode::full).regimes) {
    if (r.width == 128 && r.heads * r.d == 128) wide.insert(r.d);
  }
  EXPECT_EQ(wide, (std::set<int>{16, 64, 128}));
}

StudyConfig tiny_study() {
  StudyConfig c;
  TaskSpec t{8, 4, 4};
  TaskSpec m = t;
  m.matches = 3;
  c.regimes = {{Optimizer::adam, t, 8, 1, 8, "single"},
               {Optimizer::sgd, t, 8, 2, 4, "heads"},
               {Optimizer::adam, m, 8, 1, 8, "soft"},
               {Optimizer::adam, TaskSpec{8, 4, 4}, 4, 1, 4, "single"}};
  c.lrs = {{0.3, 1.0}, {0.03, 0.1}, {3e-3, 1e-2}};
  c.eval_seeds = 2;
  c.steps = 20;
  c.batch = 8;
  c.eval_size = 32;
  c.dense_until = 10;
  c.dense_every = 5;
  c.sparse_every = 10;
  c.temperatures = {2.0};
  c.alternative_regimes = {0};
  c.transfer_widths = {4, 8};
  c.replicates = 200;
  return c;
}

TEST(StudyExperiment, SameNumbersForAnyThreadCountAndEveryTable) {
  LabOptions one, three;
  one.threads = 1;
  three.threads = 3;
  json a, b;
  run_study(tiny_study(), one, a);
  run_study(tiny_study(), three, b);
  EXPECT_EQ(a.dump(), b.dump());
  for (const char* t : {"study_runs", "study_curves", "study_regimes", "study_temperature",
                        "study_alternatives", "study_transfer"}) {
    EXPECT_FALSE(a["tables"][t].empty()) << t;
  }
  EXPECT_EQ(a["tables"]["study_regimes"].size(), 4u);
  // qk-norm, softcap, muP on regime 0, and muP on the other transfer width
  EXPECT_EQ(a["tables"]["study_alternatives"].size(), 4u);
  EXPECT_EQ(a["tables"]["study_transfer"].size(), 4u);  // two widths x two parametrisations
  // Multi-head curves log the dead-row fraction.
  for (const auto& row : a["tables"]["study_curves"]) ASSERT_TRUE(row.contains("dead_rows"));
}

}  // namespace
}  // namespace sdpa::lab::train
