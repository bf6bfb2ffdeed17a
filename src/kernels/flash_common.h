// Target-independent pieces of the fused kernel: tile sizes, index helpers, masking of one row
// of scores. Included by every Highway target's pass over flash.cpp (hence inline templates).
#pragma once

#include <algorithm>
#include <atomic>
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

/// Tests pin the backward's plan with set_backward_chunks_for_test (kernels.h): -1 chooses by
/// the shape (the only setting outside tests), 0 forces the two-pass plan, k >= 1 forces k key
/// chunks per (batch, kv head) (at most one per key tile).
inline std::atomic<int> backward_chunks_for_test{-1};
/// Tests pin the forward's query tiles per work item with set_forward_block_for_test: -1 by the
/// shape, k >= 1 forces min(k, 4).
inline std::atomic<int> forward_block_for_test{-1};

/// How the fused backward places and fetches its operands: row strides spread off multiples of
/// 512 bytes (SpreadLd in flash.cpp) and the next query tile's rows prefetched into L2. Neither
/// changes a bit of any result; each is worth a few percent on some CPUs and costs as much on
/// others (the measurements are at backward_memory's definition in flash.cpp).
struct BackwardMemory {
  bool spread = true;
  bool prefetch = true;
};
/// The choice for this CPU, made once; set_backward_memory_for_test overrides it.
BackwardMemory backward_memory();
/// -1: the CPU's choice (the only setting outside tests); 0: neither; 1: both.
inline std::atomic<int> backward_memory_for_test{-1};

/// Rows are padded to 64 bytes so that every SIMD target's vectors (at most 64 bytes) tile them.
template <class T>
inline constexpr std::int64_t kPad = 64 / sizeof(T);

/// Prefetches the 64-byte lines of the bytes bytes from p: kLocality as __builtin_prefetch's (3
/// into L1, 2 into L2).
template <int kLocality>
inline void prefetch_lines(const void* p, std::int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, kLocality);
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

/// The first query row that the causal rule and the window let see key s (0 without either);
/// may be >= L. key_range(l).last is non-decreasing in l, so every later row sees s too, up
/// to last_query_seeing(s).
inline std::int64_t first_query_seeing(const Problem& p, std::int64_t s) {
  const std::int64_t d = p.S - p.L;
  std::int64_t first = 0;
  switch (p.causal) {
    case Causal::upper_left:
      first = s;
      break;
    case Causal::lower_right:
      first = s - d;
      break;
    case Causal::none:
      break;
  }
  if (p.variants.window_right >= 0) first = std::max(first, s - d - p.variants.window_right);
  return std::max<std::int64_t>(0, first);
}

/// The last query row whose window reaches back to key s (L - 1 without a left bound); may be
/// negative.
inline std::int64_t last_query_seeing(const Problem& p, std::int64_t s) {
  if (p.variants.window_left < 0) return p.L - 1;
  return std::min(p.L - 1, s - (p.S - p.L) + p.variants.window_left);
}

/// The key tiles [begin, end) that query rows l0 .. l0 + rows - 1 can see: tiles outside the
/// causal rule's and the window's reach are never visited, in either pass.
struct TileSpan {
  std::int64_t begin = 0, end = 0;
};
inline TileSpan key_tiles(const Problem& p, std::int64_t l0, std::int64_t rows,
                          std::int64_t key_tile) {
  const std::int64_t first = p.key_range(l0).first, last = p.key_range(l0 + rows - 1).last;
  if (last < first) return {0, 0};
  return {first / key_tile, last / key_tile + 1};
}

/// The query tiles [begin, end) that can see some key of s0 .. s0 + kc - 1.
inline TileSpan query_tiles(const Problem& p, std::int64_t s0, std::int64_t kc,
                            std::int64_t query_tile) {
  const std::int64_t first = first_query_seeing(p, s0);
  const std::int64_t last = last_query_seeing(p, s0 + kc - 1);
  if (first >= p.L || last < first) return {0, 0};
  return {first / query_tile, last / query_tile + 1};
}

/// Whether rows l0 .. l0 + rows - 1 against keys s0 .. s0 + kc - 1 (of a tile of width
/// key_tile) need mask_row: a user mask, a short tile, or a causal or window edge inside it.
inline bool tile_needs_mask(const Problem& p, std::int64_t l0, std::int64_t rows, std::int64_t s0,
                            std::int64_t kc, std::int64_t key_tile) {
  if (p.mask.present || kc < key_tile) return true;
  return p.key_range(l0 + rows - 1).first > s0 || p.key_range(l0).last < s0 + kc - 1;
}

/// The columns [begin, end) of a key tile (keys s0 .. s0 + kc - 1, width columns) that some row
/// of l0 .. l0 + rows - 1 can see, widened to whole blocks of `block` columns (64 bytes: every
/// product's N must be a multiple of the vector length): the products of a tile may skip the
/// rest, which mask_row sets to -inf (so P is exactly 0 there). A window's edge tiles are often
/// half invisible to every row (1024 keys in 64 x 128 tiles: the left edge when l0 = 64 mod 128,
/// the right edge when l0 = 0 mod 128), as is every other causal diagonal tile. The ends of
/// key_range are non-decreasing in the row, so the first row's first and the last row's last
/// bound the tile. Empty (begin == end) when no row sees any key of the tile.
struct ColumnSpan {
  std::int64_t begin = 0, end = 0;
};
inline ColumnSpan visible_columns(const Problem& p, std::int64_t l0, std::int64_t rows,
                                  std::int64_t s0, std::int64_t kc, std::int64_t width,
                                  std::int64_t block) {
  const std::int64_t first = std::clamp<std::int64_t>(p.key_range(l0).first - s0, 0, kc);
  const std::int64_t last =
      std::clamp<std::int64_t>(p.key_range(l0 + rows - 1).last - s0 + 1, first, kc);
  if (last == first) return {0, 0};
  return {first / block * block, std::min(width, round_up(last, block))};
}

/// row[c] += mk[c * stride] for c < n, with the rules for -inf, +inf and values below T's
/// range that mask_row states. The sum is formed in double and rounded once.
template <class T, class M>
void add_additive_mask(const M* mk, std::int64_t stride, std::int64_t n, T* row) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kLowest = std::numeric_limits<T>::lowest();
  for (std::int64_t c = 0; c < n; ++c) {
    const double v = mk[c * stride];
    if (v == -kInf) {
      row[c] = -std::numeric_limits<T>::infinity();
    } else if (v == kInf) {
      row[c] = std::numeric_limits<T>::quiet_NaN();
    } else {
      const double x = double(row[c]) + v;
      row[c] = x < kLowest && x != -kInf ? T(kLowest) : T(x);
    }
  }
}

/// Applies the causal rule, the window, the key-tile tail and the user's mask to one row of scaled
/// scores row[0..width) for query l and keys s0 + c: an invisible key gets -inf (overwriting
/// whatever q.k gave, so a NaN stored in a masked-out key never survives); a visible key gets the
/// additive mask added. Columns c >= kc (past the end of the keys) are invisible.
/// Two mask values need care, so that the result is the reference's:
///   - +inf makes the score NaN, as the softmax of a row holding +inf is (inf - inf), whatever
///     the score's own value; adding it would make the row look fully masked to the online
///     softmax (its exp(x - inf) sums to 0).
///   - a finite value whose sum with the score falls below T's lowest (a float64 -1e300 on
///     float32 scores, or finfo.min added to a negative score) stays finite: the key is
///     visible, with the lowest score T can hold, instead of rounding to -inf, which would mask
///     it.
template <class T>
void mask_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s0,
              std::int64_t kc, std::int64_t width, T* row) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const KeyRange range = p.key_range(l);
  const std::int64_t lo = std::clamp<std::int64_t>(range.first - s0, 0, kc);
  const std::int64_t hi = std::clamp<std::int64_t>(range.last - s0 + 1, lo, kc);
  for (std::int64_t c = 0; c < lo; ++c) row[c] = kNegInf;
  for (std::int64_t c = hi; c < width; ++c) row[c] = kNegInf;
  if (!p.mask.present || hi == lo) return;
  const MaskView& m = p.mask;
  const std::int64_t base = m.offset(b, h, l, s0 + lo), st = m.stride_s;
  T* vis = row + lo;
  switch (m.dtype) {
    case DType::boolean: {
      const std::uint8_t* mk = static_cast<const std::uint8_t*>(m.data) + base;
      for (std::int64_t c = 0; c < hi - lo; ++c) {
        if (mk[c * st] == 0) vis[c] = kNegInf;
      }
      break;
    }
    case DType::float32:
      add_additive_mask(static_cast<const float*>(m.data) + base, st, hi - lo, vis);
      break;
    case DType::float64:
      add_additive_mask(static_cast<const double*>(m.data) + base, st, hi - lo, vis);
      break;
    case DType::float16:  // refused for masks by resolve_problem
    case DType::bfloat16:
      break;
  }
}

}  // namespace sdpa::detail::flash
