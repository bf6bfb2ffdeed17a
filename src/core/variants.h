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
//   dropout p: out = sum_j p_j z_j / (1 - p') v_j, z_j = 0 with probability p', p rounded to
//     p' = a multiple of 2^-16 (dropout_threshold), from 16-bit draws of Philox4x32-10 keyed by
//     the seed and counted by (batch, head, i, j), so any pass, thread count or tiling
//     regenerates the same mask; lse is the softmax's (before dropout).
#pragma once

#include <Random123/philox.h>

#include <algorithm>
#include <cmath>
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
  /// Dropout drops something: p at or above 2^-17 (below, dropout_threshold rounds it to 0).
  bool dropout() const;
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

/// The dropout threshold on 16-bit draws: round(p * 2^16), at most 2^16 - 1. A key whose draw
/// u (uniform on 0 .. 65535) is below it is dropped, so p acts as p' = threshold / 2^16, p
/// rounded to a multiple of 2^-16 (FlashAttention rounds it to 8 bits): |p' - p| <= 2^-17, p
/// below 2^-17 drops nothing, and p from 1 - 1.5 * 2^-16 on drops with probability 1 - 2^-16.
inline std::uint32_t dropout_threshold(double p) {
  const double t = std::round(p * 65536.0);  // exact: p * 2^16 loses no bit
  return t >= 65535.0 ? 65535u : static_cast<std::uint32_t>(t);
}

inline bool Variants::dropout() const { return dropout_threshold(dropout_p) > 0; }

/// A kept key's factor, 1 / (1 - p') = 2^16 / (2^16 - threshold): E[z_j * factor] = 1 exactly
/// for the p' actually drawn, so dropout leaves the expected output unchanged.
inline double dropout_keep_factor(double p) {
  return 65536.0 / (65536.0 - static_cast<double>(dropout_threshold(p)));
}

/// The dropout keep-mask of one row: keys j0 .. j0 + n, written as 0 or dropout_keep_factor(p)
/// into `factor` (of type T). One Philox4x32-10 call, counter (j / 8, i, head, batch) and key
/// (seed low, seed high), gives four 32-bit words w0 .. w3 and serves the eight keys 8m .. 8m + 7:
/// key j draws the 16-bit u_j = half (j mod 2) of word (j mod 8) / 2, the low half for even j,
/// the high half for odd j (so the words stored little-endian are the draws in key order), and
/// is kept when u_j >= dropout_threshold(p).
template <class T>
void dropout_row(const Variants& v, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                 std::int64_t n, T* factor) {
  using Rng = r123::Philox4x32;
  const Rng rng;
  const Rng::key_type key = {
      {static_cast<std::uint32_t>(v.seed), static_cast<std::uint32_t>(v.seed >> 32)}};
  const std::uint32_t threshold = dropout_threshold(v.dropout_p);
  const T keep = static_cast<T>(dropout_keep_factor(v.dropout_p));
  const auto bi = static_cast<std::uint32_t>(b + v.rng_batch_offset);
  std::int64_t c = 0;
  while (c < n) {
    const std::int64_t j = j0 + c, m = j >> 3;
    const Rng::ctr_type ctr = {{static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(i),
                                static_cast<std::uint32_t>(h), bi}};
    const Rng::ctr_type r = rng(ctr, key);
    for (std::int64_t k = j & 7; k < 8 && c < n; ++k, ++c) {
      const std::uint32_t u = (r.v[k >> 1] >> (16 * (k & 1))) & 0xffffu;
      factor[c] = u >= threshold ? keep : T(0);
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
