// An independent float64 attention written from the semantics in include/sdpa/sdpa.h, for the
// property and catalogue tests: the plainest loops over the full shape, NumPy broadcasting of
// the mask done by index arithmetic, no code shared with src/reference. Also small helpers to
// build, transform and compare tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::oracle {

// Element access shared with the other suites (tests/common/test_util.h).
using sdpa::test::get;
using sdpa::test::set;
inline double at(const Array& a, std::int64_t i) { return get(a, i); }
inline void put(Array& a, std::int64_t i, double v) { set(a, i, v); }

/// Flat index of `idx` (one per dimension of `shape`), broadcasting dimensions of size 1 and
/// aligning `shape` to the right of a longer index, as NumPy does.
inline std::int64_t broadcast_index(const std::vector<std::int64_t>& shape,
                                    const std::vector<std::int64_t>& idx) {
  std::int64_t flat = 0;
  const std::size_t lead = idx.size() - shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t j = shape[i] == 1 ? 0 : idx[lead + i];
    flat = flat * shape[i] + j;
  }
  return flat;
}

struct Result {
  std::vector<double> out;  // (..., Hq, L, Ev)
  std::vector<double> lse;  // (..., Hq, L)
  /// max over rows and visible keys of |scale| * sum_e |q_e k_e|: a computed score's rounding
  /// error is at most (E + 1) u times this (dot product of length E, then the scale).
  double score_terms = 0.0;
};

/// softmax(q k^T * scale + mask) v in float64 over explicit loops.
inline Result attention(const Array& q, const Array& k, const Array& v, const Array* mask,
                        const AttentionOptions& o) {
  const auto& qs = q.shape();
  const std::size_t r = qs.size();
  const std::int64_t L = qs[r - 2], E = qs[r - 1], S = k.shape()[r - 2], Ev = v.shape()[r - 1];
  const std::int64_t Hq = r >= 3 ? qs[r - 3] : 1, Hkv = r >= 3 ? k.shape()[r - 3] : 1;
  std::int64_t B = 1;
  for (std::size_t i = 0; i + 3 < r; ++i) B *= qs[i];
  const double scale = o.scale.value_or(E > 0 ? 1.0 / std::sqrt(double(E)) : 1.0);
  const std::int64_t group = Hkv > 0 ? Hq / Hkv : 1;
  Result res;
  res.out.assign(static_cast<std::size_t>(B * Hq * L * Ev), 0.0);
  res.lse.assign(static_cast<std::size_t>(B * Hq * L), 0.0);
  std::vector<double> score(static_cast<std::size_t>(S));
  std::vector<std::int64_t> idx;
  for (std::int64_t b = 0; b < B; ++b) {
    // The leading multi-index of b, for the mask.
    std::vector<std::int64_t> lead_idx(r >= 3 ? r - 3 : 0);
    for (std::int64_t rest = b, i = std::int64_t(lead_idx.size()) - 1; i >= 0; --i) {
      lead_idx[i] = rest % qs[i];
      rest /= qs[i];
    }
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / group;
      for (std::int64_t l = 0; l < L; ++l) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t s = 0; s < S; ++s) {
          bool visible = true;
          if (o.causal == Causal::upper_left) visible = s <= l;
          if (o.causal == Causal::lower_right) visible = s <= l + (S - L);
          double add = 0.0;
          if (mask != nullptr) {
            idx = lead_idx;
            if (r >= 3) idx.push_back(h);
            idx.push_back(l);
            idx.push_back(s);
            const double mv = at(*mask, broadcast_index(mask->shape(), idx));
            if (mask->dtype() == DType::boolean) {
              visible = visible && mv != 0.0;
            } else if (mv == -std::numeric_limits<double>::infinity()) {
              visible = false;
            } else {
              add = mv;
            }
          }
          if (!visible) {
            score[s] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0.0, terms = 0.0;
          for (std::int64_t e = 0; e < E; ++e) {
            const double t =
                at(q, ((b * Hq + h) * L + l) * E + e) * at(k, ((b * Hkv + hk) * S + s) * E + e);
            dot += t;
            terms += std::fabs(t);
          }
          res.score_terms = std::max(res.score_terms, std::fabs(scale) * terms);
          score[s] = scale * dot + add;
          m = std::max(m, score[s]);
        }
        const std::int64_t row = (b * Hq + h) * L + l;
        if (m == -std::numeric_limits<double>::infinity()) {
          res.lse[row] = m;
          continue;  // out stays 0
        }
        double sum = 0.0;
        for (std::int64_t s = 0; s < S; ++s) sum += std::exp(score[s] - m);
        res.lse[row] = m + std::log(sum);
        for (std::int64_t s = 0; s < S; ++s) {
          const double p = std::exp(score[s] - m) / sum;
          if (p == 0.0) continue;
          for (std::int64_t e = 0; e < Ev; ++e) {
            res.out[row * Ev + e] += p * at(v, ((b * Hkv + hk) * S + s) * Ev + e);
          }
        }
      }
    }
  }
  return res;
}

// Unit roundoff of a path: the reference accumulates in float64 and rounds once, so float64
// inputs get 2^-53; float32 inputs, and any input on the fast path, get float32's 2^-24.
inline double unit_roundoff(DType dtype, Impl impl) {
  return dtype == DType::float64 && impl == Impl::reference ? std::ldexp(1.0, -53)
                                                            : std::ldexp(1.0, -24);
}

// |out - exact| bound from rounding: a score carries (E + 1) u score_terms (see
// oracle::Result), each probability twice that plus (2S + 18) u (exp, max, division, the sum of
// S terms), out adds (S + 2) u; doubled, as FlashAttention's tests allow twice a plain
// implementation's error. `floor` covers results that underflow (subnormals may be flushed).
inline double out_bound(DType dtype, Impl impl, std::int64_t S, std::int64_t E, double score_terms,
                        double max_v, double floor) {
  const double u = unit_roundoff(dtype, impl);
  const double score = (E + 1) * u * score_terms;
  return 2 * (2 * score + (3.0 * S + 20) * u) * max_v + floor;
}

}  // namespace sdpa::oracle
