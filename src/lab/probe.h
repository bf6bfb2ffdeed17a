// What the saturation and temperature experiments measure on one attention problem: random
// Q, K, V and upstream gradient dO (standard normal, float32), one scale, through the library.
//
// The logits, the probabilities P and the gradient reaching the logits dS = P (dP - D) come
// from the float64 reference's optional matrices (its dS-only backward); the per-row summaries
// (entropy, max, Jacobian norm) are statistics of those rows. dQ, dK and out come from
// sdpa::attention_backward and sdpa::attention_forward (Impl::fast), as a model gets them.
#pragma once

#include <cstdint>
#include <vector>

#include "sdpa/array.h"

namespace sdpa::lab {

struct ProbeInputs {
  int d = 0, n_keys = 0, rows = 0;
  Array q, k, v, dout;  // (1, rows, d), (1, n_keys, d), (1, n_keys, d), (1, rows, d)
};

/// Inputs drawn from Philox streams keyed by (tag, d, n_keys, tensor, row): the same for any
/// thread count, and shared by every scale probed on them.
ProbeInputs make_probe_inputs(std::uint64_t seed, std::uint64_t tag, int d, int n_keys, int rows,
                              int threads);

struct ProbeResult {
  std::vector<double> entropy, max_prob, jacobian_norm;  // per query row
  std::vector<double> grad_q, grad_logits;               // per query row: Euclidean norms
  std::vector<double> grad_k;                            // per key row
  double logit_std = 0;         // measured standard deviation of scale * q.k
  double output_diversity = 0;  // Var over queries of out / Var of v entries (feature mean)
  std::vector<double> logits;   // scale * q.k, all rows, when asked for
};

ProbeResult probe(const ProbeInputs& in, double scale, int threads, bool keep_logits = false);

}  // namespace sdpa::lab
