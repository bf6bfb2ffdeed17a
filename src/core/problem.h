// The resolved form of one attention call, shared by every implementation.
//
// The public API takes shapes as vectors; resolve_problem() validates them once (every error
// message is produced here) and flattens the leading batch dimensions into B, so that an
// implementation only ever sees (B, Hq, L, E) etc. in C order:
//   query  [B][Hq][L][E]     key [B][Hkv][S][E]     value [B][Hkv][S][Ev]
//   out    [B][Hq][L][Ev]    lse [B][Hq][L]
// The mask keeps its own broadcast strides (0 along broadcast dimensions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/variants.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

/// The user's mask, resolved against (B, Hq, L, S). Element (b, h, l, s) lives at
/// data + batch_offset[b] + h * stride_h + l * stride_l + s * stride_s (in elements).
struct MaskView {
  bool present = false;
  DType dtype = DType::boolean;
  const void* data = nullptr;
  std::int64_t numel = 0;                  // elements stored (before broadcasting)
  std::vector<std::int64_t> batch_offset;  // one per flattened batch index b
  std::int64_t stride_h = 0, stride_l = 0, stride_s = 0;

  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s) const {
    return batch_offset[static_cast<std::size_t>(b)] + h * stride_h + l * stride_l + s * stride_s;
  }
  /// The additive value of the mask at (b, h, l, s): 0 or -inf for a boolean mask.
  double additive(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s) const {
    const std::int64_t i = offset(b, h, l, s);
    switch (dtype) {
      case DType::boolean:
        return static_cast<const std::uint8_t*>(data)[i] ? 0.0
                                                         : -std::numeric_limits<double>::infinity();
      case DType::float32:
        return static_cast<const float*>(data)[i];
      case DType::float64:
        return static_cast<const double*>(data)[i];
    }
    return 0.0;
  }
};

struct Problem {
  std::int64_t B = 1, Hq = 1, Hkv = 1, L = 0, S = 0, E = 0, Ev = 0;
  std::int64_t group = 1;  // Hq / Hkv: query head h reads key/value head h / group
  double scale = 1.0;
  Causal causal = Causal::none;
  DType dtype = DType::float32;  // of query, key, value and every output
  int threads = 1;               // resolved, >= 1
  MaskView mask;
  Variants variants;  // window, softcap, ALiBi, sinks, dropout (core/variants.h)

  const void* query = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;

  /// Keys s with s <= last_causal_key(l) are allowed by the causal rule (all keys when
  /// causal is none). The result may be negative (no key) or >= S (every key).
  std::int64_t last_causal_key(std::int64_t l) const {
    switch (causal) {
      case Causal::upper_left:
        return l;
      case Causal::lower_right:
        return l + (S - L);
      case Causal::none:
        break;
    }
    return S - 1;
  }

  /// The keys that the causal rule and the window let query l see, clamped to first in
  /// [0, S] and last in [-1, S - 1] (first > last: none). Mask values come on top.
  KeyRange key_range(std::int64_t l) const {
    const std::int64_t d = S - L;
    std::int64_t first = 0, last = std::min(S - 1, last_causal_key(l));
    if (variants.window_left >= 0) first = std::max<std::int64_t>(0, l + d - variants.window_left);
    if (variants.window_right >= 0) last = std::min(last, l + d + variants.window_right);
    return {std::min(first, S), std::max<std::int64_t>(last, -1)};
  }
};

/// Validates query/key/value/mask and the options, and fills a Problem (data pointers included).
Problem resolve_problem(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const AttentionOptions& options);

/// Validates the options' variants (window, softcap, ALiBi slopes, sinks, dropout) against the
/// resolved shape and fills p.variants (pointing into `options`). Called by resolve_problem.
void resolve_variants(Problem& p, const AttentionOptions& options);

/// Bytes of memory this process can still get: MemAvailable + SwapFree, or less when its cgroup
/// limits it; INT64_MAX when unknown.
std::int64_t available_memory_bytes();

/// Throws sdpa::Error naming `what` when `bytes` exceed available_memory_bytes(). Called before
/// large allocations, so that an absurd request is a clear error instead of the OOM killer.
void check_allocation(std::int64_t bytes, const std::string& what);

/// Throws unless `t` has exactly `dtype` and `shape`; `what` names the argument.
void check_tensor(const TensorRef& t, DType dtype, const std::vector<std::int64_t>& shape,
                  const char* what);

}  // namespace sdpa::detail
