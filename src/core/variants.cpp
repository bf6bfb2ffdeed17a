// Validation of the attention variants (core/variants.h): every message names the option.
#include "core/variants.h"

#include <fmt/format.h>

#include <cmath>

#include "core/problem.h"

namespace sdpa::detail {
namespace {

std::int64_t check_window(std::int64_t w, const char* what, std::int64_t unbounded_from) {
  if (w < -1) {
    throw Error(ErrorKind::bad_value, what,
                fmt::format("expected -1 (unbounded) or a number of keys >= 0, got {}", w));
  }
  // Any side longer than L + S reaches every key: stored as L + S so that i + d +- w never
  // overflows.
  return std::min(w, unbounded_from);
}

void check_finite_values(const std::vector<double>& values, const char* what) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      throw Error(ErrorKind::bad_value, what,
                  fmt::format("expected finite values, got {} at index {}", values[i], i));
    }
  }
}

thread_local std::int64_t rng_batch_index = 0;

}  // namespace

RngBatchIndex::RngBatchIndex(std::int64_t b) : saved_(rng_batch_index) { rng_batch_index = b; }
RngBatchIndex::~RngBatchIndex() { rng_batch_index = saved_; }
std::int64_t RngBatchIndex::current() { return rng_batch_index; }

void resolve_variants(Problem& p, const AttentionOptions& o) {
  Variants& v = p.variants;
  v = Variants{};
  const std::int64_t reach = p.L + p.S;
  v.window_left = check_window(o.window_left, "window_left", reach);
  v.window_right = check_window(o.window_right, "window_right", reach);
  if (!(o.softcap >= 0.0) || std::isinf(o.softcap)) {
    throw Error(ErrorKind::bad_value, "softcap",
                fmt::format("expected 0 (off) or a finite number > 0, got {}", o.softcap));
  }
  v.softcap = o.softcap;
  if (!o.alibi_slopes.empty()) {
    const auto n = static_cast<std::int64_t>(o.alibi_slopes.size());
    if (n != p.Hq && n != p.B * p.Hq) {
      throw Error(ErrorKind::bad_shape, "alibi_slopes",
                  fmt::format("expected Hq = {} slopes (one per query head) or B * Hq = {} "
                              "(per batch and head), got {}",
                              p.Hq, p.B * p.Hq, n));
    }
    check_finite_values(o.alibi_slopes, "alibi_slopes");
    v.alibi = o.alibi_slopes.data();
    v.alibi_stride_b = n == p.Hq ? 0 : p.Hq;
  }
  if (!o.sinks.empty()) {
    const auto n = static_cast<std::int64_t>(o.sinks.size());
    if (n != p.Hq) {
      throw Error(ErrorKind::bad_shape, "sinks",
                  fmt::format("expected Hq = {} values (one per query head), got {}", p.Hq, n));
    }
    check_finite_values(o.sinks, "sinks");
    v.sinks = o.sinks.data();
  }
  if (!(o.dropout_p >= 0.0 && o.dropout_p < 1.0)) {
    throw Error(ErrorKind::bad_value, "dropout_p",
                fmt::format("expected a probability in [0, 1), got {}", o.dropout_p));
  }
  v.dropout_p = o.dropout_p;
  v.seed = o.seed;
  v.rng_batch_offset = RngBatchIndex::current();
}

}  // namespace sdpa::detail
