// The C8 study of `sdpa lab train`: unscaled against 1/sqrt(d) attention over paired seeds,
// three optimizers and head dimensions d <= D, each variant's learning rate tuned on a held-out
// seed, time to 90% accuracy interpolated from frequent early evaluations, and a verdict per
// regime (optimizer, d) from a bootstrap interval of the step ratio over seeds. See
// docs/train.md.
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

struct StudyConfig {
  TaskSpec task;
  int width = 64;       // D: every d is at most D
  std::vector<int> ds;  // head dimensions (one head; d = D included)
  std::vector<Optimizer> optimizers;
  std::vector<std::vector<double>> lrs;  // per optimizer: the tuning grid
  int tune_seeds = 1;                    // held-out seeds the rate is chosen on
  int eval_seeds = 3;                    // paired seeds the verdict is computed on
  int steps = 400, batch = 32, eval_size = 512;
  int dense_until = 100, dense_every = 10, sparse_every = 25;  // evaluation schedule
  int temperature_d = 64;            // the initial-temperature sweep: Adam, this d,
  std::vector<double> temperatures;  // c of c/sqrt(d) (1 and sqrt(d) come from the main grid)
  int replicates = 2000;             // bootstrap over seeds
};

StudyConfig study_config_for(Mode mode);

/// A regime's numbers over the paired seeds (unscaled "1" against "1/sqrt(d)").
struct RegimeStats {
  std::string optimizer;
  int d = 0;
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

/// C8 over the regimes: holds when stuck in every regime, holds-if (naming the regimes) when in
/// some, fails when in none, inconclusive when every regime is; the measurement's first
/// sentence carries the qualifiers (task, widths, seeds, how rates were chosen, budget).
StudyVerdict judge_study(const std::vector<RegimeStats>& regimes, const std::string& qualifiers);

/// Linear interpolation of the first crossing of `threshold` in (step, accuracy) checkpoints;
/// nullopt when never reached.
std::optional<double> interpolated_crossing(const std::vector<std::pair<int, double>>& points,
                                            double threshold);

/// The study's tables (study_runs, study_curves, study_regimes, study_temperature) and its C8
/// claim, added to `result`.
void run_study(const StudyConfig& config, const LabOptions& options, json& result);

}  // namespace sdpa::lab::train
