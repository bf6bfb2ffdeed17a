// Claim C8 (training with and without 1/sqrt(d)): being written; see issue 5.
#include "lab/lab.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {

json run_train(const LabOptions&) { throw Error("lab train: this experiment is not built yet"); }

}  // namespace sdpa::lab
