#include "reference/reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

namespace sdpa::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Scores of one query row in float64: scores[s] = softcap(scale * q.k_s) + alibi(s) + mask(s),
// or -inf for keys the row may not see (outside the causal rule and the window, or masked).
// Returns the row's log-sum-exp (-inf when no key is visible and there is no sink; with a sink
// it joins the sum) and fills `probs` with exp(score - lse) (0 for invisible keys). `dcap`, when
// given, receives d score / d (scale * q.k): 1 - tanh^2 under a softcap, else 1.
template <class T>
double row_probabilities(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l,
                         std::vector<double>& scores, std::vector<double>& probs,
                         std::vector<double>* dcap = nullptr) {
  const T* q = static_cast<const T*>(p.query) + ((b * p.Hq + h) * p.L + l) * p.E;
  const std::int64_t hk = h / p.group;
  const T* k = static_cast<const T*>(p.key) + (b * p.Hkv + hk) * p.S * p.E;
  const Variants& var = p.variants;
  const KeyRange range = p.key_range(l);
  const double cap = var.softcap;
  const double slope = var.alibi != nullptr ? var.slope(b, h) : 0.0;
  const std::int64_t diagonal = l + (p.S - p.L);  // i + d
  double max_score = kNegInf;
  bool any_nan = false;
  for (std::int64_t s = 0; s < p.S; ++s) {
    double bias = 0.0;
    if (s < range.first || s > range.last) {
      bias = kNegInf;
    } else if (p.mask.present) {
      bias = p.mask.additive(b, h, l, s);
    }
    if (bias == kNegInf) {
      scores[s] = kNegInf;  // masked: q.k is never computed, NaN in k cannot leak
      if (dcap != nullptr) (*dcap)[s] = 0.0;
      continue;
    }
    double dot = 0.0;
    for (std::int64_t e = 0; e < p.E; ++e) dot += double(q[e]) * double(k[s * p.E + e]);
    double x = p.scale * dot;
    if (cap > 0.0) {
      const double t = std::tanh(x / cap);
      x = cap * t;
      if (dcap != nullptr) (*dcap)[s] = 1.0 - t * t;
    } else if (dcap != nullptr) {
      (*dcap)[s] = 1.0;
    }
    if (var.alibi != nullptr) x -= slope * double(std::abs(diagonal - s));
    scores[s] = x + bias;
    if (scores[s] > max_score) max_score = scores[s];
    if (std::isnan(scores[s])) any_nan = true;
  }
  if (any_nan) {  // NaN in, NaN out: a NaN score must not pass for a row without visible keys
    for (std::int64_t s = 0; s < p.S; ++s) probs[s] = std::numeric_limits<double>::quiet_NaN();
    return std::numeric_limits<double>::quiet_NaN();
  }
  const bool has_sink = var.sinks != nullptr;
  const double sink = has_sink ? var.sinks[h] : kNegInf;
  if (max_score == kNegInf) {  // no visible key: only the sink (if any) is in the denominator
    for (std::int64_t s = 0; s < p.S; ++s) probs[s] = 0.0;
    return sink;
  }
  // pass 2: sum of exp(score - max); max_score may be +inf only if the inputs hold inf.
  const double top = has_sink ? std::max(max_score, sink) : max_score;
  double sum = has_sink ? std::exp(sink - top) : 0.0;
  for (std::int64_t s = 0; s < p.S; ++s) {
    probs[s] = scores[s] == kNegInf ? 0.0 : std::exp(scores[s] - top);
    sum += probs[s];
  }
  for (std::int64_t s = 0; s < p.S; ++s) probs[s] /= sum;
  return top + std::log(sum);
}

// The dropout factors of one row (0 or 1 / (1 - p') per key, p' = p rounded to a
// multiple of 2^-16; all 1 without dropout).
void row_dropout(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l,
                 std::vector<double>& factor) {
  if (!p.variants.dropout()) {
    std::fill(factor.begin(), factor.end(), 1.0);
    return;
  }
  dropout_row(p.variants, b, h, l, 0, p.S, factor.data());
}

// Copies one row's scores, P and dS into the caller's matrices, those it asked for.
void store_row(const Problem& p, const ReferenceMatrices& m, std::int64_t row,
               const std::vector<double>& scores, const std::vector<double>& probs,
               const std::vector<double>& drop, const std::vector<double>* ds) {
  const std::int64_t at = row * p.S;
  if (m.scores != nullptr) std::copy(scores.begin(), scores.end(), m.scores + at);
  if (m.dropout != nullptr) std::copy(drop.begin(), drop.end(), m.dropout + at);
  if (m.probs != nullptr) std::copy(probs.begin(), probs.end(), m.probs + at);
  if (m.dscores != nullptr && ds != nullptr) std::copy(ds->begin(), ds->end(), m.dscores + at);
}

template <class T>
void forward_impl(const Problem& p, T* out, T* lse, const ReferenceMatrices& m) {
  const std::int64_t rows = p.B * p.Hq * p.L;
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<double> scores(static_cast<std::size_t>(p.S)), probs(scores.size());
    std::vector<double> drop(scores.size());
    std::vector<double> acc(static_cast<std::size_t>(p.Ev));
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t l = row % p.L, h = (row / p.L) % p.Hq, b = row / (p.L * p.Hq);
      const double row_lse = row_probabilities<T>(p, b, h, l, scores, probs);
      row_dropout(p, b, h, l, drop);
      if (lse != nullptr) lse[row] = static_cast<T>(row_lse);
      store_row(p, m, row, scores, probs, drop, nullptr);
      if (out == nullptr) continue;
      const T* v = static_cast<const T*>(p.value) + (b * p.Hkv + h / p.group) * p.S * p.Ev;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t s = 0; s < p.S; ++s) {
        // Also skips masked and dropped keys: their v is never read.
        const double w = probs[s] * drop[s];
        if (w == 0.0) continue;
        for (std::int64_t e = 0; e < p.Ev; ++e) acc[e] += w * double(v[s * p.Ev + e]);
      }
      for (std::int64_t e = 0; e < p.Ev; ++e) out[row * p.Ev + e] = static_cast<T>(acc[e]);
    }
  }
}

// Scratch of one query row of the backward.
struct RowWork {
  std::vector<double> scores, probs, ds, drop, dcap, out;
  double lse = 0.0, D = 0.0;
  explicit RowWork(const Problem& p)
      : scores(static_cast<std::size_t>(p.S)),
        probs(scores.size()),
        ds(scores.size()),
        drop(scores.size()),
        dcap(scores.size()),
        out(static_cast<std::size_t>(p.Ev)) {}
};

// The backward of one query row up to dS: scores and P (recomputed), the dropout factors z,
// out = (P z) V in float64, D = dout . out, dP_s = z_s (dout . v_s) and
// ds[s] = P_s (dP_s - D) (0 where P_s is 0): the gradient on the score after the softcap
// (ALiBi and the mask are additive, so it is also theirs); dcap carries it through the softcap.
template <class T>
void row_dscores(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l, const T* g,
                 RowWork& w) {
  w.lse = row_probabilities<T>(p, b, h, l, w.scores, w.probs, &w.dcap);
  row_dropout(p, b, h, l, w.drop);
  const T* v = static_cast<const T*>(p.value) + (b * p.Hkv + h / p.group) * p.S * p.Ev;
  std::fill(w.out.begin(), w.out.end(), 0.0);
  for (std::int64_t s = 0; s < p.S; ++s) {
    const double pz = w.probs[s] * w.drop[s];
    if (pz == 0.0) continue;
    for (std::int64_t e = 0; e < p.Ev; ++e) w.out[e] += pz * double(v[s * p.Ev + e]);
  }
  double D = 0.0;
  for (std::int64_t e = 0; e < p.Ev; ++e) D += double(g[e]) * w.out[e];
  w.D = D;
  for (std::int64_t s = 0; s < p.S; ++s) {
    if (w.probs[s] == 0.0) {
      w.ds[s] = 0.0;
      continue;
    }
    double dps = 0.0;
    if (w.drop[s] != 0.0) {
      for (std::int64_t e = 0; e < p.Ev; ++e) dps += double(g[e]) * double(v[s * p.Ev + e]);
      dps *= w.drop[s];
    }
    w.ds[s] = w.probs[s] * (dps - D);  // dS = P * (dP - D)
  }
}

// d loss / d sink of one row: the sink is a key with value 0, so its dS is -p_sink * D with
// p_sink = exp(sink - lse) (0 for a NaN row's NaN, which then propagates).
double row_sink_grad(const Problem& p, std::int64_t h, const RowWork& w) {
  if (p.variants.sinks == nullptr) return 0.0;
  return -std::exp(p.variants.sinks[h] - w.lse) * w.D;
}

// Backward, organised by key/value head so that each dk/dv element has one writer:
// one (b, hk) pair per task; inside it the query heads of its group and their rows run in order.
template <class T>
void backward_impl(const Problem& p, const T* dout, T* dq, T* dk, T* dv, T* dsinks,
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
        store_row(p, m, row, w.scores, w.probs, w.drop, &w.ds);
      }
    }
    return;
  }
  const std::int64_t tasks = p.B * p.Hkv;
  // Each task's sink gradients, per (b, h), summed over b in order after the region.
  std::vector<double> sink_part(static_cast<std::size_t>(p.B * p.Hq), 0.0);
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
          store_row(p, m, row, w.scores, w.probs, w.drop, &w.ds);
          sink_part[static_cast<std::size_t>(b * p.Hq + h)] += row_sink_grad(p, h, w);
          // dV += (P z)^T dout; dQ = scale dS' K; dK += scale dS'^T Q, dS' = dS * dcap
          std::fill(dq_row.begin(), dq_row.end(), 0.0);
          for (std::int64_t s = 0; s < p.S; ++s) {
            if (w.probs[s] == 0.0) continue;
            const double ds = w.ds[s] * w.dcap[s];
            const double pz = w.probs[s] * w.drop[s];
            for (std::int64_t e = 0; e < p.Ev; ++e) dv_acc[s * p.Ev + e] += pz * double(g[e]);
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
  if (dsinks != nullptr) {
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      double sum = 0.0;
      for (std::int64_t b = 0; b < p.B; ++b)
        sum += sink_part[static_cast<std::size_t>(b * p.Hq + h)];
      dsinks[h] = static_cast<T>(sum);
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
                        const ReferenceMatrices& m, void* dsinks) {
  assert((dq == nullptr) == (dk == nullptr) && (dq == nullptr) == (dv == nullptr));
  if (p.dtype == DType::float64) {
    backward_impl<double>(p, static_cast<const double*>(grad_out), static_cast<double*>(dq),
                          static_cast<double*>(dk), static_cast<double*>(dv),
                          static_cast<double*>(dsinks), m);
  } else {
    backward_impl<float>(p, static_cast<const float*>(grad_out), static_cast<float*>(dq),
                         static_cast<float*>(dk), static_cast<float*>(dv),
                         static_cast<float*>(dsinks), m);
  }
}

}  // namespace sdpa::detail
