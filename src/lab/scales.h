// The attention scales the lab compares, in one place: their names (the `scale` and `method`
// columns of the tables), their value at dimension d, and the title a plot gives them.
#pragma once

#include <string>

namespace sdpa::lab {

enum class Scale {
  one,         // unscaled q.k
  inv_sqrt_d,  // the article's 1/sqrt(d)
  inv_d,       // 1/d, the scale muP uses (muP proper also changes initialisation and rates)
  qk_norm,     // q and k normalised, then 1/sqrt(d) (train: a learned temperature from there)
  softcap,     // 1/sqrt(d), then 50 tanh(y / 50)
};

/// "1", "1/sqrt(d)", "1/d", "qk-norm", "softcap".
const char* scale_name(Scale scale);

/// The multiplier of q.k at dimension d: 1, 1/sqrt(d), 1/d; qk_norm and softcap multiply by
/// 1/sqrt(d) too (after normalising q and k, before the cap).
double scale_value(Scale scale, int d);

/// A plot's legend title for the scale called `name`: "scale 1", "1/√d", the others as named.
std::string scale_title(const std::string& name);

}  // namespace sdpa::lab
