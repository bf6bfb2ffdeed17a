// The C8 study of `sdpa lab train`: unscaled against 1/sqrt(d) attention over paired seeds, per
// regime (optimizer, task, number of pairs P, width D, heads h, head dimension d), each variant's
// learning rate tuned on a held-out seed, time to 90% accuracy interpolated from frequent early
// evaluations, and a verdict per regime from a bootstrap interval of the step ratio over seeds.
// Beside it: an initial-temperature sweep, the alternatives (QK-norm, softcap, muP) on the same
// seeds, and muP's rate transfer across widths. See docs/train.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lab/lab.h"
#include "lab/train_model.h"

namespace sdpa::lab::train {

enum class Optimizer { sgd, momentum, adam };
/// "sgd", "momentum", "adam".
const char* optimizer_name(Optimizer o);

/// One regime: an optimizer on a task with a model of width D and h heads of dimension d
/// (h d <= D; h = D / d is the multi-head layout at fixed width, h = 1 with d = D the single
/// head).
struct RegimeSpec {
  Optimizer optimizer = Optimizer::adam;
  TaskSpec task;
  int width = 64, heads = 1, d = 64;
  /// Where it is reported: "heads" (h = D / d at fixed D), "single" (d = D), "soft" (a task
  /// one-hot attention cannot solve), "pairs" (the number of keys P varied).
  std::string family;
};

/// "adam recall P=16 D=64 h=4 d=16".
std::string regime_name(const RegimeSpec& r);

struct StudyConfig {
  std::vector<RegimeSpec> regimes;
  std::vector<std::vector<double>> lrs;  // per optimizer (index Optimizer): the tuning grid
  int tune_seeds = 1;                    // held-out seeds the rate is chosen on
  int eval_seeds = 3;                    // paired seeds the verdict is computed on
  int steps = 400, batch = 32, eval_size = 512;
  int dense_until = 100, dense_every = 10, sparse_every = 25;  // evaluation schedule
  std::size_t temperature_regime = 0;  // the initial-temperature sweep runs on this regime
  std::vector<double> temperatures;    // c of c/sqrt(d) (1 and sqrt(d) come from the main grid)
  std::vector<std::size_t> alternative_regimes;  // QK-norm, softcap and muP run on these
  double softcap = 5;                            // the softcap variant: scale 1, cap c
  std::vector<int> transfer_widths;              // muP against 1/sqrt(d), Adam, single head d = D
  int replicates = 2000;                         // bootstrap over seeds
};

StudyConfig study_config_for(Mode mode);

/// A regime's numbers over the paired seeds (unscaled "1" against "1/sqrt(d)").
struct RegimeStats {
  std::string name;  // regime_name
  int seeds = 0;
  int unscaled_reached = 0, scaled_reached = 0;     // seeds reaching 90% accuracy
  double ratio = 0, ratio_low = 0, ratio_high = 0;  // geometric mean steps ratio and interval
};

/// "stuck": 1/sqrt(d) reaches 90% on every seed, unscaled on none; "inconclusive": 1/sqrt(d)
/// misses on some seed; "slower": the step ratio's interval lies above 1; "faster": below 1;
/// "similar" otherwise.
std::string regime_outcome(const RegimeStats& r);

struct StudyVerdict {
  std::string verdict, condition, measurement;
};

/// C8 over the regimes: holds when stuck in every decided regime, holds-if (naming the regimes)
/// when in some, fails when in none, inconclusive when every regime is. The condition always
/// carries the qualifiers (for "fails" too, so that the front table shows them); the
/// measurement's first sentence carries them as well. The text is in `lang` (the qualifiers
/// are given in it).
StudyVerdict judge_study(const std::vector<RegimeStats>& regimes, const std::string& qualifiers,
                         Lang lang = Lang::en);

/// Rate transfer across widths: "transfers" when the rate chosen at every width is within one
/// grid step (a factor `step`, with 1% slack) of the one chosen at the smallest width, "shifts"
/// otherwise; "inconclusive" with fewer than two widths.
std::string rate_transfer(const std::vector<double>& chosen, double step);

/// Linear interpolation of the first crossing of `threshold` in (step, accuracy) checkpoints;
/// nullopt when never reached.
std::optional<double> interpolated_crossing(const std::vector<std::pair<int, double>>& points,
                                            double threshold);

/// The study's tables (study_runs, study_curves, study_regimes, study_temperature,
/// study_alternatives, study_transfer) and its C8 claim, added to `result`.
void run_study(const StudyConfig& config, const LabOptions& options, json& result);

}  // namespace sdpa::lab::train
