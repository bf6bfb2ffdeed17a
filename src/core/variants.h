// The attention variants of modern models, resolved once per call and read by every
// implementation: sliding window, logit softcap, ALiBi, attention sinks and dropout, with
// FlashAttention's semantics (i the query row, j the key, d = S - L the bottom-right offset):
//   window (left, right): query i sees keys j in [i + d - left, i + d + right]; -1 = unbounded
//     on that side. It combines with causal and the mask: a key must pass all three.
//   softcap c > 0: the score is c * tanh(scale * q.k / c), before ALiBi and the mask.
//   ALiBi: the score gets -slope(b, h) * |i + d - j| added (after the softcap).
//   sinks: one logit per query head joins each row's softmax denominator,
//     p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k)); lse includes it; a row that sees no key
//     gives out = 0 and lse = sink.
//   dropout p: out = sum_j p_j z_j / (1 - p) v_j, z_j = 0 with probability p, from Philox4x32-10
//     keyed by the seed and counted by (batch, head, i, j), so any pass, thread count or tiling
//     regenerates the same mask; lse is the softmax's (before dropout).
#pragma once

#include <Random123/philox.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace sdpa::detail {

struct Variants {
  std::int64_t window_left = -1, window_right = -1;  // -1: unbounded
  double softcap = 0.0;                              // 0: off
  const double* alibi = nullptr;  // slope(b, h) = alibi[b * alibi_stride_b + h]; null: off
  std::int64_t alibi_stride_b = 0;
  const double* sinks = nullptr;  // [Hq]; null: off
  double dropout_p = 0.0;         // 0: off
  std::uint64_t seed = 0;
  // The dropout counter's batch index of flattened batch b is b + rng_batch_offset (a
  // variable-length batch runs its sequences as separate problems of B = 1).
  std::int64_t rng_batch_offset = 0;

  bool window() const { return window_left >= 0 || window_right >= 0; }
  /// Something changes the scores themselves (not only which keys are visible).
  bool transforms_scores() const { return softcap > 0.0 || alibi != nullptr; }
  bool dropout() const { return dropout_p > 0.0; }
  bool any() const { return window() || transforms_scores() || sinks != nullptr || dropout(); }
  double slope(std::int64_t b, std::int64_t h) const { return alibi[b * alibi_stride_b + h]; }
};

/// While one lives, resolve_variants gives the problems that this thread resolves the dropout
/// batch index `b` (rng_batch_offset): a variable-length batch runs sequence b as a problem of
/// B = 1 whose dropout mask must still be that of sequence b.
class RngBatchIndex {
 public:
  explicit RngBatchIndex(std::int64_t b);
  ~RngBatchIndex();
  RngBatchIndex(const RngBatchIndex&) = delete;
  RngBatchIndex& operator=(const RngBatchIndex&) = delete;
  static std::int64_t current();

 private:
  std::int64_t saved_;
};

/// The keys [first, last] that the causal rule and the window let query l see (not clamped to
/// [0, S): first may be negative, last may be >= S, first > last means none). Both ends are
/// non-decreasing in l, which the kernels' tile ranges rely on.
struct KeyRange {
  std::int64_t first, last;
};

/// 2^32 * p rounded down: a Philox word below it drops its key.
inline std::uint32_t dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 0xffffffffu : static_cast<std::uint32_t>(t);
}

/// The dropout keep-mask of one row: keep[c] for keys j0 .. j0 + n, written as 0 or
/// 1 / (1 - p) into `factor` (of type T). One Philox4x32-10 call gives four 32-bit words, used
/// for the four keys 4m .. 4m + 3 with counter (m, i, head, batch) and key (seed low, seed high);
/// key j is kept when its word is >= dropout_threshold(p).
template <class T>
void dropout_row(const Variants& v, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                 std::int64_t n, T* factor) {
  using Rng = r123::Philox4x32;
  const Rng rng;
  const Rng::key_type key = {
      {static_cast<std::uint32_t>(v.seed), static_cast<std::uint32_t>(v.seed >> 32)}};
  const std::uint32_t threshold = dropout_threshold(v.dropout_p);
  const T keep = static_cast<T>(1.0 / (1.0 - v.dropout_p));
  const auto bi = static_cast<std::uint32_t>(b + v.rng_batch_offset);
  std::int64_t c = 0;
  while (c < n) {
    const std::int64_t j = j0 + c, m = j >> 2;
    const Rng::ctr_type ctr = {{static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(i),
                                static_cast<std::uint32_t>(h), bi}};
    const Rng::ctr_type r = rng(ctr, key);
    for (std::int64_t lane = j & 3; lane < 4 && c < n; ++lane, ++c) {
      factor[c] = r.v[lane] >= threshold ? keep : T(0);
    }
  }
}

/// The fused kernel's dropout factors for keys j0 .. j0 + n of query i (n <= 256), on the SIMD
/// target chosen for the next call (kernels/flash.cpp): tests compare them with dropout_row.
void fast_dropout_factors_for_test(const Variants& v, std::int64_t b, std::int64_t h,
                                   std::int64_t i, std::int64_t j0, std::int64_t n, float* factor);
/// The fused kernel's float32 softcap: x[c] = cap * tanh(x[c] / cap), t[c] = tanh(x[c] / cap)
/// (t may be null), n a multiple of 16.
void fast_softcap_for_test(float* x, std::size_t n, float cap, float* t);

}  // namespace sdpa::detail
