// Training runs of `sdpa lab train`: the grid of (scale, d, learning rate), one run per cell,
// and the tables built from them. run_train (lab.h) is run_experiment(config_for(mode), ...).
#pragma once

#include <optional>
#include <vector>

#include "lab/lab.h"
#include "lab/train_model.h"
#include "lab/train_verdict.h"

namespace sdpa::lab::train {

struct TrainConfig {
  TaskSpec task;
  int width = 32;  // D
  std::vector<int> ds;
  std::vector<ScaleKind> scales;
  std::vector<double> lrs;
  int steps = 0;
  int batch = 32;
  int eval_every = 20;
  int eval_size = 512;
};

/// The grid of --quick and --full.
TrainConfig config_for(Mode mode);

/// One checkpoint of a run (a row of the `curves` table).
struct CurvePoint {
  int step = 0;
  double loss = 0, accuracy = 0, train_loss = 0, entropy = 0, max_logit = 0;
  double grad_norm_wq = 0, grad_norm_wk = 0, temperature = 0;
};

struct RunResult {
  std::vector<CurvePoint> curve;
  double final_loss = 0, final_accuracy = 0;
  bool diverged = false;
  std::optional<long> steps_to_acc90;
};

/// The data every run of one experiment shares (generated once from the seed): training batch
/// t is the same for every scale, d and rate; so is the evaluation set.
struct Data {
  std::vector<Batch> batches;  // steps + 1 (the last one only measures gradient norms)
  Batch eval;
};
Data make_data(const TrainConfig& config, std::uint64_t seed);

/// One training run; single-threaded and deterministic.
RunResult train_one(const TrainConfig& config, const Data& data, std::uint64_t seed, ScaleKind kind,
                    int d, double lr);

/// The summary row of one variant from its runs (one per rate of config.lrs, in that order).
SummaryRow summarize(const TrainConfig& config, ScaleKind kind, int d,
                     const std::vector<RunResult>& runs);

/// The whole experiment as the lab's JSON object.
json run_experiment(const TrainConfig& config, const LabOptions& options);

}  // namespace sdpa::lab::train
