// The verdict on claim C8, as a pure function of the summary rows of `sdpa lab train`, so that a
// test can check that it follows the numbers (and flips when they do).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lab/lab.h"

namespace sdpa::lab::train {

/// One row of the `summary` table: a variant (scale, d) over the learning-rate sweep.
struct SummaryRow {
  std::string scale;  // "1", "1/sqrt(d)", "1/d", "qk-norm"
  int d = 0;
  double best_accuracy = 0;
  double best_lr = 0;
  long steps_to_90 = 0;                // best-lr run: first step with acc >= 0.9 * best_accuracy
  std::optional<long> steps_to_acc90;  // fewest steps over the rates to reach accuracy 0.90
  int lrs_reaching_90 = 0;
  int n_lrs = 0;
  double lr_sensitivity = 0;
  double best_final_loss = 0;
  double init_entropy = 0;
  double init_max_logit = 0;
  double init_grad_norm_wq = 0;
  double init_grad_norm_wk = 0;
  int diverged = 0;
};

/// What the verdict needs besides the rows.
struct VerdictContext {
  int pairs = 8;  // keys per attention row: uniform attention has entropy ln(pairs)
  int steps = 0;  // the training budget of every run
};

struct Verdict {
  std::string verdict;    // "holds", "fails", "holds-if", or "inconclusive" (scaled never learned)
  std::string condition;  // for holds-if: where it holds, e.g. "d >= 256"
  std::string measurement;
  std::string evidence;
};

/// Accuracy a model must reach to count as having learned the task.
inline constexpr double kLearnedAccuracy = 0.90;
/// Unscaled attention is "slower" when it needs at least this many times the steps of 1/sqrt(d).
inline constexpr double kSlowerFactor = 2.0;

/// For each d: unscaled ("1") against "1/sqrt(d)". Stuck: 1/sqrt(d) reaches kLearnedAccuracy and
/// "1" does not at any rate. holds: stuck at every d; holds-if: at some d (condition names
/// them); fails: at none (evidence says whether it was slower). A d where 1/sqrt(d) itself does
/// not learn is inconclusive; if every d is, so is the verdict.
Verdict judge_c8(const std::vector<SummaryRow>& rows, const VerdictContext& context, Lang lang);

}  // namespace sdpa::lab::train
