#include "reference/reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

namespace sdpa::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Scores of one query row in float64: scores[s] = scale * q.k_s + mask(s), or -inf for keys
// the row may not see. Returns the row's log-sum-exp (-inf when no key is visible) and fills
// `probs` with exp(score - lse) (0 for invisible keys).
template <class T>
double row_probabilities(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l,
                         std::vector<double>& scores, std::vector<double>& probs) {
  const T* q = static_cast<const T*>(p.query) + ((b * p.Hq + h) * p.L + l) * p.E;
  const std::int64_t hk = h / p.group;
  const T* k = static_cast<const T*>(p.key) + (b * p.Hkv + hk) * p.S * p.E;
  const std::int64_t last = p.last_causal_key(l);
  double max_score = kNegInf;
  bool any_nan = false;
  for (std::int64_t s = 0; s < p.S; ++s) {
    double bias = 0.0;
    if (s > last) {
      bias = kNegInf;
    } else if (p.mask.present) {
      bias = p.mask.additive(b, h, l, s);
    }
    if (bias == kNegInf) {
      scores[s] = kNegInf;  // masked: q.k is never computed, NaN in k cannot leak
      continue;
    }
    double dot = 0.0;
    for (std::int64_t e = 0; e < p.E; ++e) dot += double(q[e]) * double(k[s * p.E + e]);
    scores[s] = p.scale * dot + bias;
    if (scores[s] > max_score) max_score = scores[s];
    if (std::isnan(scores[s])) any_nan = true;
  }
  if (any_nan) {  // NaN in, NaN out: a NaN score must not pass for a row without visible keys
    for (std::int64_t s = 0; s < p.S; ++s) probs[s] = std::numeric_limits<double>::quiet_NaN();
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (max_score == kNegInf) {  // no visible key
    for (std::int64_t s = 0; s < p.S; ++s) probs[s] = 0.0;
    return kNegInf;
  }
  // pass 2: sum of exp(score - max); max_score may be +inf only if the inputs hold inf.
  double sum = 0.0;
  for (std::int64_t s = 0; s < p.S; ++s) {
    probs[s] = scores[s] == kNegInf ? 0.0 : std::exp(scores[s] - max_score);
    sum += probs[s];
  }
  for (std::int64_t s = 0; s < p.S; ++s) probs[s] /= sum;
  return max_score + std::log(sum);
}

// Copies one row's scores, P and dS into the caller's matrices, those it asked for.
void store_row(const Problem& p, const ReferenceMatrices& m, std::int64_t row,
               const std::vector<double>& scores, const std::vector<double>& probs,
               const std::vector<double>* ds) {
  const std::int64_t at = row * p.S;
  if (m.scores != nullptr) std::copy(scores.begin(), scores.end(), m.scores + at);
  if (m.probs != nullptr) std::copy(probs.begin(), probs.end(), m.probs + at);
  if (m.dscores != nullptr && ds != nullptr) std::copy(ds->begin(), ds->end(), m.dscores + at);
}

template <class T>
void forward_impl(const Problem& p, T* out, T* lse, const ReferenceMatrices& m) {
  const std::int64_t rows = p.B * p.Hq * p.L;
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<double> scores(static_cast<std::size_t>(p.S)), probs(scores.size());
    std::vector<double> acc(static_cast<std::size_t>(p.Ev));
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t l = row % p.L, h = (row / p.L) % p.Hq, b = row / (p.L * p.Hq);
      const double row_lse = row_probabilities<T>(p, b, h, l, scores, probs);
      if (lse != nullptr) lse[row] = static_cast<T>(row_lse);
      store_row(p, m, row, scores, probs, nullptr);
      if (out == nullptr) continue;
      const T* v = static_cast<const T*>(p.value) + (b * p.Hkv + h / p.group) * p.S * p.Ev;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t s = 0; s < p.S; ++s) {
        if (probs[s] == 0.0) continue;  // also skips masked keys: their v is never read
        for (std::int64_t e = 0; e < p.Ev; ++e) acc[e] += probs[s] * double(v[s * p.Ev + e]);
      }
      for (std::int64_t e = 0; e < p.Ev; ++e) out[row * p.Ev + e] = static_cast<T>(acc[e]);
    }
  }
}

// Scratch of one query row of the backward.
struct RowWork {
  std::vector<double> scores, probs, ds, out;
  explicit RowWork(const Problem& p)
      : scores(static_cast<std::size_t>(p.S)),
        probs(scores.size()),
        ds(scores.size()),
        out(static_cast<std::size_t>(p.Ev)) {}
};

// The backward of one query row up to dS: scores and P (recomputed), out = P V in float64,
// D = dout . out, and ds[s] = P_s (dP_s - D) with dP_s = dout . v_s (0 where P_s is 0).
template <class T>
void row_dscores(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l, const T* g,
                 RowWork& w) {
  row_probabilities<T>(p, b, h, l, w.scores, w.probs);
  const T* v = static_cast<const T*>(p.value) + (b * p.Hkv + h / p.group) * p.S * p.Ev;
  std::fill(w.out.begin(), w.out.end(), 0.0);
  for (std::int64_t s = 0; s < p.S; ++s) {
    if (w.probs[s] == 0.0) continue;
    for (std::int64_t e = 0; e < p.Ev; ++e) w.out[e] += w.probs[s] * double(v[s * p.Ev + e]);
  }
  double D = 0.0;
  for (std::int64_t e = 0; e < p.Ev; ++e) D += double(g[e]) * w.out[e];
  for (std::int64_t s = 0; s < p.S; ++s) {
    if (w.probs[s] == 0.0) {
      w.ds[s] = 0.0;
      continue;
    }
    double dps = 0.0;
    for (std::int64_t e = 0; e < p.Ev; ++e) dps += double(g[e]) * double(v[s * p.Ev + e]);
    w.ds[s] = w.probs[s] * (dps - D);  // dS = P * (dP - D)
  }
}

// Backward, organised by key/value head so that each dk/dv element has one writer:
// one (b, hk) pair per task; inside it the query heads of its group and their rows run in order.
template <class T>
void backward_impl(const Problem& p, const T* dout, T* dq, T* dk, T* dv,
                   const ReferenceMatrices& m) {
  if (dq == nullptr) {  // the matrices only: no shared accumulator, so rows run in parallel
    const std::int64_t rows = p.B * p.Hq * p.L;
#pragma omp parallel num_threads(p.threads)
    {
      RowWork w(p);
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int64_t l = row % p.L, h = (row / p.L) % p.Hq, b = row / (p.L * p.Hq);
        row_dscores<T>(p, b, h, l, dout + row * p.Ev, w);
        store_row(p, m, row, w.scores, w.probs, &w.ds);
      }
    }
    return;
  }
  const std::int64_t tasks = p.B * p.Hkv;
#pragma omp parallel num_threads(p.threads)
  {
    RowWork w(p);
    std::vector<double> dq_row(static_cast<std::size_t>(p.E));
    std::vector<double> dk_acc, dv_acc;
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / p.Hkv, hk = task % p.Hkv;
      const T* k = static_cast<const T*>(p.key) + task * p.S * p.E;
      dk_acc.assign(static_cast<std::size_t>(p.S * p.E), 0.0);
      dv_acc.assign(static_cast<std::size_t>(p.S * p.Ev), 0.0);
      for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        for (std::int64_t l = 0; l < p.L; ++l) {
          const std::int64_t row = (b * p.Hq + h) * p.L + l;
          const T* q = static_cast<const T*>(p.query) + row * p.E;
          const T* g = dout + row * p.Ev;
          row_dscores<T>(p, b, h, l, g, w);
          store_row(p, m, row, w.scores, w.probs, &w.ds);
          // dV += P^T dout; dQ = scale dS K; dK += scale dS^T Q
          std::fill(dq_row.begin(), dq_row.end(), 0.0);
          for (std::int64_t s = 0; s < p.S; ++s) {
            if (w.probs[s] == 0.0) continue;
            const double ds = w.ds[s];
            for (std::int64_t e = 0; e < p.Ev; ++e)
              dv_acc[s * p.Ev + e] += w.probs[s] * double(g[e]);
            for (std::int64_t e = 0; e < p.E; ++e) {
              dq_row[e] += p.scale * ds * double(k[s * p.E + e]);
              dk_acc[s * p.E + e] += p.scale * ds * double(q[e]);
            }
          }
          for (std::int64_t e = 0; e < p.E; ++e) dq[row * p.E + e] = static_cast<T>(dq_row[e]);
        }
      }
      for (std::int64_t i = 0; i < p.S * p.E; ++i)
        dk[task * p.S * p.E + i] = static_cast<T>(dk_acc[i]);
      for (std::int64_t i = 0; i < p.S * p.Ev; ++i)
        dv[task * p.S * p.Ev + i] = static_cast<T>(dv_acc[i]);
    }
  }
}

}  // namespace

void reference_forward(const Problem& p, void* out, void* lse, const ReferenceMatrices& m) {
  if (p.dtype == DType::float64) {
    forward_impl<double>(p, static_cast<double*>(out), static_cast<double*>(lse), m);
  } else {
    forward_impl<float>(p, static_cast<float*>(out), static_cast<float*>(lse), m);
  }
}

void reference_backward(const Problem& p, const void* grad_out, void* dq, void* dk, void* dv,
                        const ReferenceMatrices& m) {
  assert((dq == nullptr) == (dk == nullptr) && (dq == nullptr) == (dv == nullptr));
  if (p.dtype == DType::float64) {
    backward_impl<double>(p, static_cast<const double*>(grad_out), static_cast<double*>(dq),
                          static_cast<double*>(dk), static_cast<double*>(dv), m);
  } else {
    backward_impl<float>(p, static_cast<const float*>(grad_out), static_cast<float*>(dq),
                         static_cast<float*>(dk), static_cast<float*>(dv), m);
  }
}

}  // namespace sdpa::detail
