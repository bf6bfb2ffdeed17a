// Histograms for the charts: bin centres and densities (or counts) over a range chosen from the
// data's quantiles, so that one outlier of a heavy-tailed law does not squash the rest.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "serve.h"

namespace sdpa::serve {

struct Range {
  double lo = 0, hi = 1;
};

/// [q(0.005), q(0.995)] widened by 5% on each side (a unit interval around a constant).
inline Range quantile_range(std::vector<double> x) {
  if (x.empty()) return {};
  const auto at = [&](double q) {
    const std::size_t k = static_cast<std::size_t>(q * double(x.size() - 1));
    std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(k), x.end());
    return x[k];
  };
  const double lo = at(0.005), hi = at(0.995);
  const double w = hi - lo;
  if (!(w > 0)) return {lo - 0.5, lo + 0.5};
  return {lo - 0.05 * w, hi + 0.05 * w};
}

/// {"centers", "counts", "density", "width", "outside"}: values outside the range are counted
/// in "outside" (a fraction), not folded into the end bins.
inline json histogram(const std::vector<double>& x, Range r, int bins) {
  std::vector<double> counts(bins, 0.0), centers(bins), density(bins);
  const double w = (r.hi - r.lo) / bins;
  std::size_t outside = 0;
  for (double v : x) {
    const double t = (v - r.lo) / w;
    if (!(t >= 0 && t < bins)) {
      ++outside;
      continue;
    }
    counts[static_cast<int>(t)] += 1;
  }
  const double n = std::max<double>(1.0, static_cast<double>(x.size()));
  for (int i = 0; i < bins; ++i) {
    centers[i] = r.lo + (i + 0.5) * w;
    density[i] = counts[i] / (n * w);
  }
  return {{"centers", centers},
          {"counts", counts},
          {"density", density},
          {"width", w},
          {"outside", static_cast<double>(outside) / n}};
}

}  // namespace sdpa::serve
