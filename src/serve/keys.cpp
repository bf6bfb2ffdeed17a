#include "keys.h"

#include <algorithm>
#include <cstring>

namespace sdpa::serve {

lab::Dist dist_of(const InputSpec& in) {
  if (in.dist == "uniform") return lab::Dist::uniform;
  if (in.dist == "rademacher") return lab::Dist::rademacher;
  if (in.dist == "laplace") return lab::Dist::laplace;
  if (in.dist == "student-t") return lab::Dist::student_t5;
  return lab::Dist::normal;
}

double draw_query(const InputSpec& in, int row, int d, double* x) {
  const lab::Dist dist = dist_of(in);
  lab::Stream st(in.seed, kQueryStream + static_cast<std::uint64_t>(row));
  const double shared = lab::sample(st, dist);
  const double a = in.mean + in.sigma * std::sqrt(in.corr) * shared;
  const double b = in.sigma * std::sqrt(1.0 - in.corr);
  double sum = 0;
  for (int i = 0; i < d; ++i) {
    x[i] = a + b * lab::sample(st, dist);
    sum += x[i];
  }
  return sum;
}

namespace {

std::mutex cache_mutex;
std::shared_ptr<const KeyBlock> cache;

// Extends `old` (may be null or of another law) to n keys of d components.
std::shared_ptr<const KeyBlock> grow(const KeyBlock* old, lab::Dist dist, std::uint64_t seed, int n,
                                     int d) {
  auto block = std::make_shared<KeyBlock>();
  block->dist = dist;
  block->seed = seed;
  block->n = n;
  block->d = d;
  block->z.resize(static_cast<std::size_t>(n) * d);
  block->shared.resize(n);
  block->streams.resize(n, lab::Stream(seed, 0));
  const int old_n = old ? old->n : 0, old_d = old ? old->d : 0;
#pragma omp parallel for schedule(dynamic, 64)
  for (int j = 0; j < n; ++j) {
    float* out = block->z.data() + static_cast<std::size_t>(j) * d;
    lab::Stream st(seed, kKeyStream + static_cast<std::uint64_t>(j));
    int from = 0;
    if (j < old_n) {
      // Continue the key's stream where the old block stopped.
      std::memcpy(out, old->row(j), sizeof(float) * old_d);
      block->shared[j] = old->shared[j];
      st = old->streams[j];
      from = old_d;
    } else {
      block->shared[j] = static_cast<float>(lab::sample(st, dist));
    }
    for (int i = from; i < d; ++i) out[i] = static_cast<float>(lab::sample(st, dist));
    block->streams[j] = st;
  }
  return block;
}

}  // namespace

std::shared_ptr<const KeyBlock> key_block(const InputSpec& in, int n, int d) {
  const lab::Dist dist = dist_of(in);
  std::lock_guard lock(cache_mutex);
  const KeyBlock* c = cache.get();
  const bool same_law = c && c->dist == dist && c->seed == in.seed;
  if (same_law && n <= c->n && d <= c->d) return cache;
  const int new_n = same_law ? std::max(n, c->n) : n;
  const int new_d = same_law ? std::max(d, c->d) : d;
  // Beyond the cap, keep exactly what was asked for (requests stay within it).
  const bool fits = std::int64_t(new_n) * new_d <= kMaxKeyComponents;
  cache = fits ? grow(same_law ? c : nullptr, dist, in.seed, new_n, new_d)
               : grow(nullptr, dist, in.seed, n, d);
  return cache;
}

}  // namespace sdpa::serve
