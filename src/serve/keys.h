// The q and k vectors of the scores and freezing panels.
//
// A vector of an InputSpec is drawn from its own Philox stream (src/lab/random.h) with the
// lab's distributions (src/lab/sampling.h): first a shared factor z_0, then z_1, z_2, ...; its
// components are x_i = mean + sigma (sqrt(corr) z_0 + sqrt(1 - corr) z_i). The stream fixes
// the vector: component i is the same whatever d, N or the thread count.
//
// Keys are the expensive part (N d draws). Their raw z are kept, as float, in a process-wide
// cache keyed by (distribution, seed) that grows to the largest N and d asked for, continuing
// each key's stream: moving d, N, the mean, sigma, the correlation or the scale draws nothing
// new, and a request's numbers do not depend on what was asked before. Since
//   q.k = (mean + sigma sqrt(corr) z_0) sum(q) + sigma sqrt(1 - corr) q.z,
// the keys are never materialised: a request needs q.z, sum z and sum z^2 only.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "lab/random.h"
#include "lab/sampling.h"
#include "params.h"

namespace sdpa::serve {

// Stream ids: one range per purpose, so that no two draws share a stream.
inline constexpr std::uint64_t kKeyStream = 1ULL << 40;    // + key index
inline constexpr std::uint64_t kQueryStream = 2ULL << 40;  // + query row
inline constexpr std::uint64_t kGradStream = 3ULL << 40;   // + query row: upstream gradient

/// The largest N d the cache holds (2^24 floats, 64 MiB): N = 4096 keys of d = 4096.
inline constexpr std::int64_t kMaxKeyComponents = std::int64_t(1) << 24;

lab::Dist dist_of(const InputSpec& in);

/// x[0..d) of query `row`; returns sum(x).
double draw_query(const InputSpec& in, int row, int d, double* x);

/// The affine map from a key's raw draws to its components: k_i = a_j + b z_i.
struct KeyMap {
  double b = 1;
  double a(double shared, const InputSpec& in) const {
    return in.mean + in.sigma * std::sqrt(in.corr) * shared;
  }
  explicit KeyMap(const InputSpec& in) : b(in.sigma * std::sqrt(1.0 - in.corr)) {}
};

/// An immutable block of raw key draws: key j's z_1.. at z[j * stride], its z_0 at shared[j].
struct KeyBlock {
  lab::Dist dist = lab::Dist::normal;
  std::uint64_t seed = 0;
  int n = 0, d = 0;
  std::vector<float> z, shared;
  std::vector<lab::Stream> streams;  // each key's stream after its last draw
  const float* row(int j) const { return z.data() + static_cast<std::size_t>(j) * d; }
};

/// Raw draws of keys [0, n) with at least d components each (thread-safe; the block stays
/// valid for as long as it is held).
std::shared_ptr<const KeyBlock> key_block(const InputSpec& in, int n, int d);

/// sum_i a[i] b[i] over i < d, accumulated in double; the simd reduction lets the compiler
/// vectorise the sum without -ffast-math.
inline double dot(const double* a, const float* b, int d) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < d; ++i) s += a[i] * double(b[i]);
  return s;
}

}  // namespace sdpa::serve
