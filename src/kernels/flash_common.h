// Target-independent pieces of the fused kernel: tile sizes, index helpers, masking of one row
// of scores. Included by every Highway target's pass over flash.cpp (hence inline templates).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/problem.h"

namespace sdpa::detail::flash {

// Tile sizes; the reasoning and the measurements are in the design comment of flash.cpp
// (64 x 128 measured 3-5% ahead of 64 x 64 on the forward, level on the backward).
// SDPA_QUERY_TILE / SDPA_KEY_TILE may be defined to rerun those measurements.
#ifndef SDPA_QUERY_TILE
#define SDPA_QUERY_TILE 64
#endif
#ifndef SDPA_KEY_TILE
#define SDPA_KEY_TILE 128
#endif
inline constexpr std::int64_t kQueryTile = SDPA_QUERY_TILE;  // Br: query rows per tile
inline constexpr std::int64_t kKeyTile = SDPA_KEY_TILE;      // Bc: keys per tile (multiple of 16)

/// Rows are padded to 64 bytes so that every SIMD target's vectors (at most 64 bytes) tile them.
template <class T>
inline constexpr std::int64_t kPad = 64 / sizeof(T);

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

/// The first query row that the causal rule lets see key s (0 without causal); may be >= L.
inline std::int64_t first_query_seeing(const Problem& p, std::int64_t s) {
  switch (p.causal) {
    case Causal::upper_left:
      return std::max<std::int64_t>(0, s);
    case Causal::lower_right:
      return std::max<std::int64_t>(0, s - (p.S - p.L));
    case Causal::none:
      break;
  }
  return 0;
}

/// Applies the causal rule, the key-tile tail and the user's mask to one row of scaled scores
/// row[0..width) for query l and keys s0 + c: an invisible key gets -inf (overwriting whatever
/// q.k gave, so a NaN stored in a masked-out key never survives); a visible key gets the
/// additive mask added. Columns c >= kc (past the end of the keys) are invisible.
template <class T>
void mask_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s0,
              std::int64_t kc, std::int64_t width, T* row) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const std::int64_t visible = std::clamp<std::int64_t>(p.last_causal_key(l) - s0 + 1, 0, kc);
  for (std::int64_t c = visible; c < width; ++c) row[c] = kNegInf;
  if (!p.mask.present || visible == 0) return;
  const MaskView& m = p.mask;
  const std::int64_t base = m.offset(b, h, l, s0), st = m.stride_s;
  switch (m.dtype) {
    case DType::boolean: {
      const std::uint8_t* mk = static_cast<const std::uint8_t*>(m.data) + base;
      for (std::int64_t c = 0; c < visible; ++c) {
        if (mk[c * st] == 0) row[c] = kNegInf;
      }
      break;
    }
    case DType::float32: {
      const float* mk = static_cast<const float*>(m.data) + base;
      for (std::int64_t c = 0; c < visible; ++c) {
        const float v = mk[c * st];
        row[c] = v == -std::numeric_limits<float>::infinity() ? kNegInf : row[c] + T(v);
      }
      break;
    }
    case DType::float64: {
      const double* mk = static_cast<const double*>(m.data) + base;
      for (std::int64_t c = 0; c < visible; ++c) {
        const double v = mk[c * st];
        row[c] = v == -std::numeric_limits<double>::infinity() ? kNegInf : T(row[c] + v);
      }
      break;
    }
  }
}

}  // namespace sdpa::detail::flash
