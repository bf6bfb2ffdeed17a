// The lab's experiments: one module each, owning its computation, its tables (declared in the
// same file) and its text view. registry.cpp lists them in order.
#pragma once

#include "lab/lab.h"

namespace sdpa::lab {

json run_softmax(const LabOptions& options);      // exp_softmax.cpp: C1, C2
json run_derive(const LabOptions& options);       // exp_derive.cpp: C3-C6
json run_variance(const LabOptions& options);     // exp_variance.cpp: C3-C6
json run_saturation(const LabOptions& options);   // exp_saturation.cpp: C7
json run_temperature(const LabOptions& options);  // exp_temperature.cpp: C1, C7
json run_precision(const LabOptions& options);    // exp_precision.cpp: C2, C7

const Experiment& softmax_experiment();
const Experiment& derive_experiment();
const Experiment& variance_experiment();
const Experiment& saturation_experiment();
const Experiment& temperature_experiment();
const Experiment& precision_experiment();
const Experiment& train_experiment();  // train.cpp: C8

/// The table `alternatives` of `saturation` (alternatives.cpp): 1, 1/sqrt(d), 1/d, QK-norm and
/// logit soft-capping at sigma = 1 and 4; and its declaration.
json alternatives_table(const LabOptions& options);
Table alternatives_table_schema();

}  // namespace sdpa::lab
