// The decode kernel: a few query rows per GQA group against a long run of keys (inference).
//
// Contract (asserted by tests/decode on every compiled SIMD target): tensors as described by
// DecodeProblem (decode.h); float32 computes in float32 (also over float16 or bfloat16 caches,
// widened exactly), float64 in float64; visibility exactly as the fused kernel's (flash.cpp):
// an invisible key's value row never enters the sum and its score is -inf; a row that sees no
// key gives out = 0, lse = -inf. Error against the float64 reference
// within 2 x that of the naive same-precision implementation plus a floor of a few epsilons.
// Results are bit-identical for any thread count (see the chunk rule below).
//
// Why a second kernel. Decoding attends L = 1..16 new queries to S = thousands of cached keys:
// 2 * (E + Ev) flops per key and query row, against (E + Ev) * sizeof(T) bytes per key read
// from memory, so for G * L rows (G = Hq / Hkv) the work is ~G * L / 2 flops per byte of
// float32: far below what the FMA units could use (~10 flops per byte at 400 GFLOP/s and
// 40 GB/s). What matters is to read every K/V byte once, at streaming speed, and to spend few
// instructions per byte. The fused kernel cannot: it packs a transposed copy of K on every call
// (a read and a write of K before any work), and its 64-row query tiles are mostly empty.
//
// Design. Work item = (sequence b, group of kv heads, chunk of keys). An item takes the query
// rows of its kv heads (G * L per head, scaled by `scale` once) and walks its chunk in tiles
// of kDecodeTile keys:
//   read:   direct path (plain attention, E a multiple of the lanes, Ev of kPVWidth vectors,
//           a native SIMD target):
//           K and V read where they lie, per tile and kv head the G * L rows in blocks of
//           kDecodeRows; each K (then V) vector loaded feeds every row of the block, so at
//           G * L = 4 each K/V byte enters a register once. An item holds whole cache rows
//           (every head of a position, then the next), read front to back; where the L1
//           data cache is at most 32 KiB (on every target), each tile of a position-major
//           cache is first copied, in memory order and in its own dtype, into a contiguous
//           buffer that the blocks then read (decode_copies_tiles). Packed path (masks,
//           ragged sizes): the tile's K and V rows copied in memory order into a zero-padded
//           buffer (one head's rows sit Hkv * E elements apart, 4 KiB at Hkv = 8, E = 128: one
//           L1 set for a tile's 16 rows; copied, they stay in L1 while the G rows reuse them).
//   scores: for one query row and N keys (N = lanes), N accumulators along E (one vertical FMA
//           per key and vector of E: no horizontal sum per key), then one transpose-and-add
//           tree, log2(N) levels of ConcatEven + ConcatOdd + Add, turns the N accumulators
//           into one vector holding the N scores (3 (N - 1) operations per N keys, against
//           ~2 log2(N) per key for a horizontal sum each).
//   softmax: online, per row (Milakov & Gimelshein 2018; FlashAttention-2, Dao 2023,
//           Algorithm 1 lines 8-10): running max from -inf, P = exp(S - m), running sum; the
//           accumulator's rescale is folded into the P V pass and done only when the max moved.
//   P V:    acc += P V with up to eight vectors of acc in registers for the tile; keys whose
//           probability is exactly 0 (masked) are skipped, so a NaN stored in a masked value
//           row never reaches the output.
//
// Chunk rule and determinism. The keys of a sequence of length S are cut into
// n = ceil(S / c) chunks of c = decode_chunk_keys(S) keys: at most kDecodeMaxChunks, at least
// kDecodeMinChunk keys each, a multiple of the tile. Each chunk leaves a partial (m, l, acc) per
// row; a second pass merges the partials of a row in chunk order:
//   M = max_c m_c,   l = sum_c exp(m_c - M) l_c,   out = sum_c exp(m_c - M) acc_c / l,
//   lse = M + log(l).
// A chunk that saw no visible key has m_c = -inf and is skipped, so the merge is exact (no
// exp(-inf - -inf)); a row with M = -inf gives zeros and lse = -inf. The head groups depend on
// the shape only. Neither the cut nor the order of any sum depends on the thread count or on
// which thread runs an item.
//
// Memory traffic: K and V once per GQA group, plus the partials (Hq * L * (Ev + 2) values per
// chunk, 0.1% of K/V at S = 32768, E = 128, L = 1). Extra memory: those partials and, per
// thread, the scaled queries, one packed tile (<= kDecodePackBytes) and one row of scores.
#include "kernels/decode.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "core/half.h"
#include "core/half_attention.h"
#include "kernels/cpu_vendor.h"
#include "kernels/flash_common.h"
#include "kernels/gemm_bf16.h"
#include "kernels/workspace.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/gemm-inl.h"  // RowMax, ExpShiftSum (n % Lanes == 0), TreeLevel

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

using std::int64_t;
using std::size_t;

template <typename T>
constexpr T kDecodeNegInf = -std::numeric_limits<T>::infinity();

// The tree of LaneTree (gemm-inl.h), evaluated depth first while the K keys' products are formed,
// so that at most log2(K) + 1 partial vectors are live (the 16 accumulators of all keys at once
// spill on AVX-512 next to the 8 vectors of q).
template <size_t K, int kC>
struct KeyTree {
  template <class D, class V, typename T>
  static HWY_INLINE V Run(D d, const V* qv, const T* HWY_RESTRICT kt) {
#if HWY_TARGET != HWY_SCALAR
    if constexpr (K > 1) {
      constexpr int64_t NN = static_cast<int64_t>(hn::MaxLanes(D()));
      const V lo = KeyTree<K / 2, kC>::Run(d, qv, kt);
      const V hi = KeyTree<K / 2, kC>::Run(d, qv, kt + static_cast<int64_t>(K / 2) * kC * NN);
      return TreeLevel(d, lo, hi);
    }
#endif
    constexpr int64_t NN = static_cast<int64_t>(hn::MaxLanes(D()));
    V a = hn::Mul(qv[0], hn::LoadU(d, kt));
    for (int c = 1; c < kC; ++c) a = hn::MulAdd(qv[c], hn::LoadU(d, kt + c * NN), a);
    return a;
  }
};

// scores[j] = q . k_j for the N keys k_j = kt + j * C * N (C * N elements each, zero-padded
// like q). kC > 0 is C known at compile time (E = 64 or 128, the common head sizes): q then
// stays in registers and every K address is one base plus a constant, which frees the
// registers that 16 row pointers would take.
template <int kC, class D, typename T>
HWY_INLINE void ScoresN(D d, const T* HWY_RESTRICT q, const T* HWY_RESTRICT kt, int64_t C_rt,
                        T* HWY_RESTRICT scores) {
  constexpr size_t N = hn::MaxLanes(D());
  constexpr int64_t NN = static_cast<int64_t>(N);
  using V = hn::Vec<D>;
  if constexpr (kC > 0) {
    V qv[kC];
    for (int c = 0; c < kC; ++c) qv[c] = hn::LoadU(d, q + c * NN);
    hn::StoreU(KeyTree<N, kC>::Run(d, qv, kt), d, scores);
  } else {
    V acc[N];
    const int64_t ld = C_rt * NN;
    for (size_t j = 0; j < N; ++j) acc[j] = hn::Zero(d);
    for (int64_t e = 0; e < ld; e += NN) {
      const V qv = hn::LoadU(d, q + e);
      for (size_t j = 0; j < N; ++j) {
        acc[j] = hn::MulAdd(qv, hn::LoadU(d, kt + static_cast<int64_t>(j) * ld + e), acc[j]);
      }
    }
    hn::StoreU(LaneTree<N>::Run(d, acc), d, scores);
  }
}

// acc[0..C * N) = alpha * acc + sum_i p[idx[i]] * v_{idx[i]} over the n keys listed in idx
// (those with a nonzero probability); v_j = vt + j * C * N. Up to eight vectors of acc stay in
// registers over all keys; kC > 0 is C known at compile time.
template <int kC, typename T>
HWY_INLINE void AccumulatePV(const T* HWY_RESTRICT p, const int* HWY_RESTRICT idx, int64_t n,
                             const T* HWY_RESTRICT vt, int64_t C_rt, T alpha, T* HWY_RESTRICT acc) {
  const hn::ScalableTag<T> d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<T>()));
  const int64_t C = kC > 0 ? kC : C_rt;
  const int64_t ld = C * N;
  const auto va = hn::Set(d, alpha);
  const bool rescale = alpha != T(1);
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    using V = hn::Vec<decltype(d)>;
    V a[8];
    for (int u = 0; u < 8; ++u) a[u] = hn::LoadU(d, acc + (c + u) * N);
    if (rescale) {
      for (int u = 0; u < 8; ++u) a[u] = hn::Mul(a[u], va);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int j = idx[i];
      const auto pj = hn::Set(d, p[j]);
      const T* vr = vt + j * ld + c * N;
      for (int u = 0; u < 8; ++u) a[u] = hn::MulAdd(pj, hn::LoadU(d, vr + u * N), a[u]);
    }
    for (int u = 0; u < 8; ++u) hn::StoreU(a[u], d, acc + (c + u) * N);
  }
  for (; c + 2 <= C; c += 2) {
    auto a0 = hn::LoadU(d, acc + c * N), a1 = hn::LoadU(d, acc + c * N + N);
    if (rescale) a0 = hn::Mul(a0, va), a1 = hn::Mul(a1, va);
    for (int64_t i = 0; i < n; ++i) {
      const int j = idx[i];
      const auto pj = hn::Set(d, p[j]);
      a0 = hn::MulAdd(pj, hn::LoadU(d, vt + j * ld + c * N), a0);
      a1 = hn::MulAdd(pj, hn::LoadU(d, vt + j * ld + c * N + N), a1);
    }
    hn::StoreU(a0, d, acc + c * N), hn::StoreU(a1, d, acc + c * N + N);
  }
  for (; c < C; ++c) {
    auto a = hn::LoadU(d, acc + c * N);
    if (rescale) a = hn::Mul(a, va);
    for (int64_t i = 0; i < n; ++i) {
      a = hn::MulAdd(hn::Set(d, p[idx[i]]), hn::LoadU(d, vt + idx[i] * ld + c * N), a);
    }
    hn::StoreU(a, d, acc + c * N);
  }
}

// dst[0..n) = src[0..n) converted to T.
template <typename T, typename Tc>
HWY_INLINE void CopyRow(const Tc* HWY_RESTRICT src, int64_t n, T* HWY_RESTRICT dst) {
  if constexpr (std::is_same_v<T, Tc>) {
    const hn::ScalableTag<T> d;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    int64_t e = 0;
    for (; e + 4 * N <= n; e += 4 * N) {
      const auto x0 = hn::LoadU(d, src + e), x1 = hn::LoadU(d, src + e + N);
      const auto x2 = hn::LoadU(d, src + e + 2 * N), x3 = hn::LoadU(d, src + e + 3 * N);
      hn::StoreU(x0, d, dst + e), hn::StoreU(x1, d, dst + e + N);
      hn::StoreU(x2, d, dst + e + 2 * N), hn::StoreU(x3, d, dst + e + 3 * N);
    }
    for (; e + N <= n; e += N) hn::StoreU(hn::LoadU(d, src + e), d, dst + e);
    for (; e < n; ++e) dst[e] = src[e];
  } else {
    // float16 (F16C's vcvtph2ps on AVX2 and up) or bfloat16 (a 16-bit shift) widened to
    // float32 exactly, in registers, as the tile is packed.
    static_assert(std::is_same_v<T, float>, "16-bit caches are read by the float32 kernel");
    int64_t e = 0;
#if HWY_TARGET != HWY_SCALAR
    const hn::ScalableTag<float> d;
    const hn::Rebind<Tc, decltype(d)> dh;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    for (; e + 2 * N <= n; e += 2 * N) {
      const auto x0 = WidenExact(d, hn::LoadU(dh, src + e));
      const auto x1 = WidenExact(d, hn::LoadU(dh, src + e + N));
      hn::StoreU(x0, d, dst + e), hn::StoreU(x1, d, dst + e + N);
    }
    for (; e + N <= n; e += N) hn::StoreU(WidenExact(d, hn::LoadU(dh, src + e)), d, dst + e);
#endif
    for (; e < n; ++e) {
      std::uint16_t bits;
      std::memcpy(&bits, src + e, sizeof bits);
      dst[e] =
          std::is_same_v<Tc, hwy::float16_t> ? float16_to_float(bits) : bfloat16_to_float(bits);
    }
  }
}

// The sizes of one item's per-thread scratch, fixed per call.
struct Dims {
  int64_t G, L, E, Ev, Epad, Evpad, ldv, heads_per_item, rows_per_item;
  bool direct;      // DecodeItemDirect serves the call
  bool copy_tiles;  // ... reading each tile from a copy in the cache's own dtype
  bool pairs;       // ... on bfloat16 pairs (a bfloat16 query and cache, AVX3_DL)
  // Tiles in page order: groups of page_rows tiles whose keys interleave, tile i of a group
  // taking its keys i, i + page_rows, ... (1: each tile's keys consecutive; "Page order").
  int64_t page_rows;
  bool far_prefetch;  // the far prefetches of 16-bit caches (kDecodeAheadTiles) are issued
  // Items of one kv head take the near prefetches too (the next tile's rows of their head).
  bool near_one_head;
  // The copied tile: each head's kDecodeTile rows of Epad (Evpad) elements of the cache's
  // dtype, then one cache line of padding (CopyLayout).
  int64_t kcopy_head, vcopy_head;
  int64_t copy_bytes;  // of the K copy and of the V copy, each (a multiple of 64)
};

// Query rows per block of the direct path: every K and V vector loaded feeds this many rows
// (G * L = 4 for Llama-style GQA at L = 1).
constexpr int kDecodeRows = 4;

struct Segment {
  const char* p;
  int64_t bytes;
};

template <typename T>
struct Scratch {
  T* qs;              // [rows_per_item][Epad]: the item's query rows times scale, zero-padded
  T* kt;              // [heads_per_item][kDecodeTile][Epad]: the packed K tile (or copied, in Tc)
  T* vt;              // [heads_per_item][kDecodeTile][Evpad]
  T* s;               // [kDecodeRows][kDecodeTile]: scores, then probabilities, of a block of rows
  T* zero;            // [max(Epad, Evpad)]: zeros, the K and V row read past a partial tile
  std::uint32_t* p2;  // [kDecodeRows][kDecodeTile / 2]: bfloat16 pairs of P (pairs path)
  T* tmp;             // [Evpad]: one row of acc (pairs path)
  int* nz;            // [kDecodeTile]: keys of the tile with a nonzero probability
  int* iota;          // [kDecodeTile]: 0, 1, 2, ...
  int64_t* last;      // [rows_per_item]: last visible key of each row (may be < 0)
  Segment* pf;        // [2 * heads_per_item * kDecodeTile]: the next tile's K and V rows

  static size_t Carve(Carver& c, const Dims& m, Scratch* out) {
    Scratch w;
    w.qs = c.take<T>(static_cast<size_t>(m.rows_per_item * m.Epad));
    // The packed tile (T), or the direct path's copied tile (the cache's dtype, no larger).
    const int64_t packed = m.direct ? 0 : m.heads_per_item * kDecodeTile;
    const auto bytes = [&](int64_t packed_elements) {
      return std::max(packed_elements * static_cast<int64_t>(sizeof(T)),
                      m.direct && m.copy_tiles ? m.copy_bytes : 0);
    };
    w.kt = c.take<T>(static_cast<size_t>(bytes(packed * m.Epad)) / sizeof(T));
    w.vt = c.take<T>(static_cast<size_t>(bytes(packed * m.Evpad)) / sizeof(T));
    w.s = c.take<T>(static_cast<size_t>(kDecodeRows * kDecodeTile));
    w.zero = c.take<T>(static_cast<size_t>(std::max(m.Epad, m.Evpad)));
    w.p2 = c.take<std::uint32_t>(static_cast<size_t>(kDecodeRows * kDecodeTile / 2));
    w.tmp = c.take<T>(static_cast<size_t>(m.Evpad));
    w.nz = c.take<int>(kDecodeTile);
    w.iota = c.take<int>(kDecodeTile);
    w.last = c.take<int64_t>(static_cast<size_t>(m.rows_per_item));
    w.pf = c.take<Segment>(static_cast<size_t>(2 * m.heads_per_item * kDecodeTile));
    if (out != nullptr) *out = w;
    return c.used();
  }
};

struct Item {
  int64_t b, h0, nh, s0, s1, slot;  // keys [s0, s1) of sequence b, kv heads [h0, h0 + nh)
};

int64_t LastKey(const DecodeProblem& p, int64_t S, int64_t l) {
  switch (p.causal) {
    case Causal::upper_left:
      return std::min(l, S - 1);
    case Causal::lower_right:
      return std::min(l + (S - p.L), S - 1);
    case Causal::none:
      break;
  }
  return S - 1;
}

// Element offsets of rows s .. s + n - 1 of sequence b in the K and V caches (head 0): one
// division for the run, then a step per row (one 64-bit division per row cost ~4% of the direct
// path's time with K/V in L2, nothing measurable when they come from memory).
void RowOffsets(const DecodeProblem& p, int64_t b, int64_t s, int64_t n, int64_t* ko, int64_t* vo) {
  if (n <= 0) return;  // reads no table entry: s may lie past the sequence
  int64_t block = s / p.page_size, off = s % p.page_size;
  const std::int32_t* table = p.block_table != nullptr ? p.block_table + b * p.max_blocks : nullptr;
  int64_t page = table != nullptr ? table[block] : b;
  for (int64_t j = 0; j < n; ++j) {
    if (off == p.page_size) {
      off = 0;
      ++block;
      page = table != nullptr ? table[block] : b;
    }
    ko[j] = page * p.k_page + off * p.k_row;
    vo[j] = page * p.v_page + off * p.v_row;
    ++off;
  }
}

// RowOffsets for the n keys s, s + step, s + 2 step, ... of sequence b.
void RowOffsetsStrided(const DecodeProblem& p, int64_t b, int64_t s, int64_t step, int64_t n,
                       int64_t* ko, int64_t* vo) {
  const std::int32_t* table = p.block_table != nullptr ? p.block_table + b * p.max_blocks : nullptr;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t key = s + j * step;
    const int64_t page = table != nullptr ? table[key / p.page_size] : b;
    const int64_t off = table != nullptr ? key % p.page_size : key;
    ko[j] = page * p.k_page + off * p.k_row;
    vo[j] = page * p.v_page + off * p.v_row;
  }
}

// Copies keys [s0, s0 + kc) of sequence b, kv heads [h0, h0 + nh), into the packed tile; rows
// kc.. of the tile become zero. The walk follows memory: position-major when the heads of one
// position lie together (the cache layouts), head-major when each head's rows do (B, Hkv, S, E).
template <typename T, typename Tc>
void PackTile(const DecodeProblem& p, const Dims& m, const Item& it, int64_t s0, int64_t kc, T* kt,
              T* vt) {
  const Tc* k = static_cast<const Tc*>(p.k);
  const Tc* v = static_cast<const Tc*>(p.v);
  const auto copy = [&](int64_t j, int64_t hh, int64_t ko, int64_t vo) {
    const int64_t h = it.h0 + hh;
    CopyRow(k + ko + h * p.k_head, m.E, kt + (hh * kDecodeTile + j) * m.Epad);
    CopyRow(v + vo + h * p.v_head, m.Ev, vt + (hh * kDecodeTile + j) * m.Evpad);
  };
  int64_t ko[kDecodeTile], vo[kDecodeTile];
  RowOffsets(p, it.b, s0, kc, ko, vo);
  if (p.k_head <= p.k_row) {
    for (int64_t j = 0; j < kc; ++j) {
      for (int64_t hh = 0; hh < it.nh; ++hh) copy(j, hh, ko[j], vo[j]);
    }
  } else {
    for (int64_t hh = 0; hh < it.nh; ++hh) {
      for (int64_t j = 0; j < kc; ++j) copy(j, hh, ko[j], vo[j]);
    }
  }
  if (kc < kDecodeTile) {
    for (int64_t hh = 0; hh < it.nh; ++hh) {
      std::fill_n(kt + (hh * kDecodeTile + kc) * m.Epad, (kDecodeTile - kc) * m.Epad, T(0));
      std::fill_n(vt + (hh * kDecodeTile + kc) * m.Evpad, (kDecodeTile - kc) * m.Evpad, T(0));
    }
  }
}

// Sets up the item's rows, in (kv head, group member, query) order: scale * q padded to Epad in
// w.qs, each row's last visible key in w.last, running max -inf, sum 0, accumulator 0. Returns
// the last key any row sees (-1: none).
template <typename T>
int64_t StartRows(const DecodeProblem& p, const Dims& m, const Item& it, const Scratch<T>& w,
                  T* acc, T* mx, T* l) {
  const int64_t G = m.G, L = m.L;
  const int64_t nrows = it.nh * G * L;
  const int64_t S = p.seq_lens[static_cast<size_t>(it.b)];
  const T scale = static_cast<T>(p.scale);
  const T* q = static_cast<const T*>(p.q);
  int64_t last_any = -1;
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t h = it.h0 * G + r / L, i = r % L;  // query head, query row
    const T* src = q + it.b * p.q_sb + h * p.q_sh + i * p.q_sl;
    T* dst = w.qs + r * m.Epad;
    for (int64_t e = 0; e < m.E; ++e) dst[e] = scale * src[e];
    std::fill(dst + m.E, dst + m.Epad, T(0));
    w.last[r] = LastKey(p, S, i);
    last_any = std::max(last_any, w.last[r]);
    mx[r] = kDecodeNegInf<T>;
    l[r] = T(0);
    std::fill_n(acc + r * m.ldv, m.ldv, T(0));
  }
  return last_any;
}

// One work item: the query rows of kv heads [h0, h0 + nh) of sequence b against keys
// [s0, s1); leaves the partial running max m, sum l and unnormalised accumulator acc (leading
// dimension ldv) of every row, rows in (kv head, group member, query) order.
template <typename T, typename Tc, int kC>
void DecodeItem(const DecodeProblem& p, const Dims& m, const Item& it, const Scratch<T>& w, T* acc,
                T* mx, T* l) {
  const hn::ScalableTag<T> d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<T>()));
  const int64_t G = m.G, L = m.L;
  const int64_t nrows = it.nh * G * L;
  const int64_t last_any = StartRows(p, m, it, w, acc, mx, l);
  // Keys past every row's last visible key are never read.
  const int64_t end = std::min(it.s1, last_any + 1);
  for (int64_t s0 = it.s0; s0 < end; s0 += kDecodeTile) {
    const int64_t kc = std::min(kDecodeTile, end - s0);
    PackTile<T, Tc>(p, m, it, s0, kc, w.kt, w.vt);
    // The next tile's rows, prefetched a share per row while this tile is computed, so that
    // memory keeps streaming while the FMAs run (without it the loads of the packing wait on
    // DRAM: 13 against 15 GB/s of K/V per CPU-second on one Zen 5 thread, S = 65536).
    // Segments of consecutive bytes (K first, then V): in a cache (S, Hkv, E) the rows of
    // every head of consecutive positions merge into one, so the walk below is one prefetch
    // per 64-byte line and little else.
    int64_t nseg = 0, lines = 0;
    if (s0 + kDecodeTile < end) {
      const int64_t n1 = std::min(kDecodeTile, end - s0 - kDecodeTile);
      const auto es = static_cast<int64_t>(sizeof(Tc));
      for (int kv = 0; kv < 2; ++kv) {
        const auto* base = reinterpret_cast<const char*>(kv == 0 ? p.k : p.v);
        const int64_t head = kv == 0 ? p.k_head : p.v_head;
        const int64_t bytes = (kv == 0 ? m.E : m.Ev) * es;
        int64_t ko[kDecodeTile], vo[kDecodeTile];
        RowOffsets(p, it.b, s0 + kDecodeTile, n1, ko, vo);
        for (int64_t j = 0; j < n1; ++j) {
          for (int64_t hh = 0; hh < it.nh; ++hh) {
            const char* q0 = base + ((kv == 0 ? ko[j] : vo[j]) + (it.h0 + hh) * head) * es;
            if (nseg > 0 && w.pf[nseg - 1].p + w.pf[nseg - 1].bytes == q0) {
              w.pf[nseg - 1].bytes += bytes;
            } else {
              w.pf[nseg++] = {q0, bytes};
            }
          }
        }
      }
      for (int64_t i = 0; i < nseg; ++i) lines += (w.pf[i].bytes + 63) / 64;
    }
    int64_t seg = 0, off = 0;  // the prefetch cursor
    for (int64_t r = 0; r < nrows; ++r) {
      for (int64_t todo = (r + 1) * lines / nrows - r * lines / nrows; todo > 0; --todo) {
        hwy::Prefetch(w.pf[seg].p + off);
        off += 64;
        if (off >= w.pf[seg].bytes) ++seg, off = 0;
      }
      const int64_t vis = std::clamp<int64_t>(w.last[r] - s0 + 1, 0, kc);
      if (vis == 0) continue;
      const int64_t hh = r / (G * L);
      const T* kt = w.kt + hh * kDecodeTile * m.Epad;
      const T* vt = w.vt + hh * kDecodeTile * m.Evpad;
      T* srow = w.s;
      for (int64_t j = 0; j < kDecodeTile; j += N) {
        ScoresN<kC>(d, w.qs + r * m.Epad, kt + j * m.Epad, m.Epad / N, srow + j);
        const int64_t in = std::clamp<int64_t>(vis - j, 0, N);
        if (in < N) {
          const auto s = hn::LoadU(d, srow + j);
          hn::StoreU(hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(in)), s,
                                    hn::Set(d, kDecodeNegInf<T>)),
                     d, srow + j);
        }
      }
      if (p.mask_problem != nullptr) {
        flash::mask_row(*p.mask_problem, it.b, it.h0 * G + r / L, r % L, s0, kc, kDecodeTile, srow);
      }
      const T m_old = mx[r];
      const T tile_max = RowMax(srow, kDecodeTile);
      // A NaN score makes the row NaN (std::max would drop it), as in the fused kernel.
      const T m_new = std::isnan(tile_max) ? tile_max : std::max(m_old, tile_max);
      if (m_new == kDecodeNegInf<T>) continue;  // nothing visible so far: P row = 0
      const T row_sum = ExpShiftSum(srow, kDecodeTile, m_new);
      T alpha = T(1);  // the factor on acc: 1 while acc is still all zeros
      if (m_new != m_old) {
        if (m_old != kDecodeNegInf<T>) alpha = std::exp(m_old - m_new);
        l[r] = l[r] * alpha + row_sum;
        mx[r] = m_new;
      } else {
        l[r] += row_sum;
      }
      // The keys to add: all visible ones unless a probability is exactly 0 (masked, or
      // underflowed), which is then skipped.
      const int* idx = w.iota;
      int64_t n = vis;
      bool dense = true;
      for (int64_t j = 0; j < vis; j += N) {
        const auto pz = hn::Eq(hn::LoadU(d, srow + j), hn::Zero(d));
        const auto in = hn::FirstN(d, static_cast<size_t>(std::min<int64_t>(N, vis - j)));
        dense = dense && hn::AllFalse(d, hn::And(pz, in));
      }
      if (!dense) {
        n = 0;
        for (int64_t j = 0; j < vis; ++j) {
          w.nz[n] = static_cast<int>(j);
          n += srow[j] != T(0);
        }
        idx = w.nz;
      }
      AccumulatePV<kC>(srow, idx, n, vt, m.Evpad / N, alpha, acc + r * m.ldv);
    }
  }
}

// ---- The direct path: K and V read where they lie, every row of a head's group at once ------

// N elements of a cache row as T: 16-bit caches widened exactly in registers (F16C's
// vcvtph2ps for float16, a 16-bit shift for bfloat16).
template <class D, typename Tc>
HWY_INLINE hn::Vec<D> LoadRow(D d, const Tc* HWY_RESTRICT src) {
  using T = hn::TFromD<D>;
  if constexpr (std::is_same_v<T, Tc>) {
    return hn::LoadU(d, src);
  } else {
#if HWY_TARGET != HWY_SCALAR
    const hn::Rebind<Tc, D> dh;
    return WidenExact(d, hn::LoadU(dh, src));
#else
    std::uint16_t bits;
    std::memcpy(&bits, src, sizeof bits);
    return hn::Set(d, static_cast<T>(std::is_same_v<Tc, hwy::float16_t> ? float16_to_float(bits)
                                                                        : bfloat16_to_float(bits)));
#endif
  }
}

// Keeps v in a register: GCC otherwise folds a vector loaded for two FMAs into each of them as a
// memory operand, two loads instead of one (on AVX2 to spare registers, on AVX-512 by choice).
template <class V>
HWY_INLINE void InRegister(V& v) {
#if (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && \
    (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// out[r] = the first level of the transpose-and-add tree (LaneTree) for q_r . k_0 and q_r . k_1,
// the scores of query rows q + r * ldq (r < R) against the two keys kp[0], kp[1]. Each K vector
// is loaded once and feeds the R rows. Two keys at once give 2 R independent FMA chains (one key
// gives R = 4, too few to fill two FMA pipes of 4 cycles' latency) and load each q vector once
// for both keys.
template <int R, int kC>
struct PairLeaves {
  template <class D, typename Tc>
  static HWY_INLINE void Run(D d, const hn::TFromD<D>* HWY_RESTRICT q, int64_t ldq,
                             const Tc* const* kp, int64_t C_rt, hn::Vec<D>* out) {
#if HWY_TARGET != HWY_SCALAR
    using V = hn::Vec<D>;
    constexpr int64_t NN = static_cast<int64_t>(hn::MaxLanes(D()));
    const int64_t C = kC > 0 ? kC : C_rt;
    const Tc* HWY_RESTRICT k0 = kp[0];
    const Tc* HWY_RESTRICT k1 = kp[1];
    V lo[R], hi[R];
    {
      const V kv0 = LoadRow(d, k0), kv1 = LoadRow(d, k1);
      for (int r = 0; r < R; ++r) {
        V qv = hn::LoadU(d, q + r * ldq);
        InRegister(qv);
        lo[r] = hn::Mul(qv, kv0);
        hi[r] = hn::Mul(qv, kv1);
      }
    }
    for (int64_t c = 1; c < C; ++c) {
      const V kv0 = LoadRow(d, k0 + c * NN), kv1 = LoadRow(d, k1 + c * NN);
      for (int r = 0; r < R; ++r) {
        V qv = hn::LoadU(d, q + r * ldq + c * NN);
        InRegister(qv);
        lo[r] = hn::MulAdd(qv, kv0, lo[r]);
        hi[r] = hn::MulAdd(qv, kv1, hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      out[r] = TreeLevel(d, lo[r], hi[r]);
    }
#endif
  }
};

// s[r * kDecodeTile + j] = q_r . k_j for the R rows and the kDecodeTile keys kp[j]. All R rows
// at once on every target, so that each K vector is loaded (and a 16-bit one widened) once. Per
// N keys (N = lanes): the N / 2 pairs' leaves (PairLeaves) go to a small buffer, then the
// transpose-and-add tree's remaining levels run over it, level by level (the same operations on
// the same operands as depth first: the same bits). Depth first, the partial vectors held while
// the next leaves ran spilled on AVX2 (16 registers), and GCC folded the q loads into the FMAs
// to spare registers. One AVX2 thread of an AMD EPYC family 23, per key and kv head of four
// rows (before the pairs): the scores alone (K in L1/L2) float32 58-90 -> 44 ns, bfloat16 70 ->
// 47 ns with all R rows at once instead of two blocks of two. Zen 5, Hq 32, Hkv 8, E 128,
// S 32768, 2 threads unless said, output bit-identical: leaves in pairs (depth first) against
// single keys, paired in one process, AVX2 code 1.03x (bfloat16 cache), 1.09x (float32).
// Then this (level by level, InRegister) against the pairs depth first, the two compiled as
// separate instances chosen per work item, paired in one process: AVX2 code 1.11x over a
// bfloat16 cache (one thread 1.16x, copied tiles 1.13x), 1.03x float32; AVX3_DL 1.05x bfloat16
// (one thread 1.05x), 1.10x float32. Separate binaries, three alternations of a driver over four
// caches: AVX2 code 7.3-8.0 -> 6.5-6.7 ms (bfloat16), AVX3_DL 5.8-6.4 -> 5.9-6.2 ms.
template <int R, int kC, class D, typename Tc>
HWY_INLINE void TileScores(D d, const hn::TFromD<D>* HWY_RESTRICT q, int64_t ldq,
                           const Tc* const* kp, int64_t C, hn::TFromD<D>* HWY_RESTRICT s) {
#if HWY_TARGET != HWY_SCALAR
  constexpr size_t N = hn::MaxLanes(D());
  static_assert(N >= 2, "the direct path runs on the SIMD targets only (kDirectTarget)");
  constexpr size_t P = N / 2;
  HWY_ALIGN hn::TFromD<D> level[P][R][N];
  for (int64_t j = 0; j < kDecodeTile; j += static_cast<int64_t>(N)) {
    for (size_t i = 0; i < P; ++i) {
      hn::Vec<D> out[R];
      PairLeaves<R, kC>::Run(d, q, ldq, kp + j + 2 * static_cast<int64_t>(i), C, out);
      for (int r = 0; r < R; ++r) hn::Store(out[r], d, level[i][r]);
    }
    // Node i of the next level from nodes 2i (lo) and 2i + 1 (hi), written over node i.
    for (size_t n = P; n > 1; n /= 2) {
      for (size_t i = 0; i < n / 2; ++i) {
        for (int r = 0; r < R; ++r) {
          const auto lo = hn::Load(d, level[2 * i][r]), hi = hn::Load(d, level[2 * i + 1][r]);
          hn::Store(TreeLevel(d, lo, hi), d, level[i][r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) hn::StoreU(hn::Load(d, level[0][r]), d, s + r * kDecodeTile + j);
  }
#endif
}

// Vectors of acc per row kept in registers by TilePV: R * W accumulators, W value vectors and a
// broadcast (21 of 32 registers on AVX-512 at R = 4, 11 of 16 on AVX2).
template <class D>
constexpr int64_t kPVWidth = hn::MaxLanes(D()) >= 16 ? 4 : 2;

// acc_r = alpha_r * acc_r + sum_i p_r[j_i] v_{j_i} for the R rows (acc_r at acc + r * ldv,
// p_r at p + r * kDecodeTile) over the n keys j_i = idx[i] (or i when idx is null); the
// value rows vp[j] are read where they lie, once per block of W vectors of Ev for all R rows.
// Cv (vectors per value row) is a multiple of kPVWidth.
template <int R, class D, typename Tc>
HWY_INLINE void TilePV(D d, const hn::TFromD<D>* HWY_RESTRICT p, const int* idx, int64_t n,
                       const Tc* const* vp, int64_t Cv, const hn::TFromD<D>* alpha, bool rescale,
                       hn::TFromD<D>* HWY_RESTRICT acc, int64_t ldv) {
  using V = hn::Vec<D>;
  constexpr int64_t NN = static_cast<int64_t>(hn::MaxLanes(D()));
  constexpr int64_t W = kPVWidth<D>;
  for (int64_t c0 = 0; c0 < Cv; c0 += W) {
    V a[R][W];
    for (int r = 0; r < R; ++r) {
      for (int64_t u = 0; u < W; ++u) a[r][u] = hn::LoadU(d, acc + r * ldv + (c0 + u) * NN);
    }
    if (rescale) {
      for (int r = 0; r < R; ++r) {
        const V va = hn::Set(d, alpha[r]);
        for (int64_t u = 0; u < W; ++u) a[r][u] = hn::Mul(a[r][u], va);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = idx != nullptr ? idx[i] : i;
      const Tc* HWY_RESTRICT vr = vp[j] + c0 * NN;
      V vv[W];
      for (int64_t u = 0; u < W; ++u) vv[u] = LoadRow(d, vr + u * NN);
      for (int r = 0; r < R; ++r) {
        const V pj = hn::Set(d, p[r * kDecodeTile + j]);
        for (int64_t u = 0; u < W; ++u) a[r][u] = hn::MulAdd(pj, vv[u], a[r][u]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int64_t u = 0; u < W; ++u) hn::StoreU(a[r][u], d, acc + r * ldv + (c0 + u) * NN);
    }
  }
}

// The visibility and the online softmax of one block of R query rows (r0..r0 + R of the item,
// all of one kv head) over one tile, shared by the float32 products and the bfloat16 pairs.
template <int R, typename T>
struct BlockState {
  int64_t vis[R];  // keys of the tile each row sees
  T alpha[R];      // the factor on each row's acc
  bool live[R];    // the row has a visible key so far
  bool uniform;    // every row sees vis[0] keys
  bool dense;      // uniform, and no visible key's probability is exactly 0
  bool rescale;    // some alpha differs from 1
};

// Fills b.vis and b.uniform; false when no row of the block sees a key of the tile.
template <int R, typename T>
HWY_INLINE bool BlockVisible(const Scratch<T>& w, int64_t r0, int64_t s0, int64_t kc,
                             BlockState<R, T>& b) {
  bool any = false;
  b.uniform = true;
  for (int r = 0; r < R; ++r) {
    b.vis[r] = std::clamp<int64_t>(w.last[r0 + r] - s0 + 1, 0, kc);
    any = any || b.vis[r] > 0;
    b.uniform = b.uniform && b.vis[r] == b.vis[0];
  }
  return any;
}

// With the block's scores in w.s (row r at w.s + r * kDecodeTile): the invisible keys' scores
// set to -inf, then per row the running max, P = exp(S - m) in place, the running sum and the
// factor alpha on acc.
template <int R, typename T>
HWY_INLINE void BlockSoftmax(const Scratch<T>& w, int64_t r0, T* mx, T* l, BlockState<R, T>& b) {
  const hn::ScalableTag<T> d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<T>()));
  b.dense = b.uniform;
  b.rescale = false;
  for (int r = 0; r < R; ++r) {
    T* srow = w.s + r * kDecodeTile;
    b.live[r] = false;
    b.alpha[r] = T(1);  // the factor on acc: 1 while acc is still all zeros
    if (b.vis[r] == 0) {
      b.dense = false;
      continue;
    }
    for (int64_t j = 0; j < kDecodeTile; j += N) {
      const int64_t in = std::clamp<int64_t>(b.vis[r] - j, 0, N);
      if (in < N) {
        const auto s = hn::LoadU(d, srow + j);
        hn::StoreU(
            hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(in)), s, hn::Set(d, kDecodeNegInf<T>)),
            d, srow + j);
      }
    }
    const T m_old = mx[r0 + r];
    const T tile_max = RowMax(srow, kDecodeTile);
    // A NaN score makes the row NaN (std::max would drop it), as in the fused kernel.
    const T m_new = std::isnan(tile_max) ? tile_max : std::max(m_old, tile_max);
    if (m_new == kDecodeNegInf<T>) {  // nothing visible so far: P row = 0
      b.dense = false;
      continue;
    }
    b.live[r] = true;
    const T row_sum = ExpShiftSum(srow, kDecodeTile, m_new);
    if (m_new != m_old) {
      if (m_old != kDecodeNegInf<T>) b.alpha[r] = std::exp(m_old - m_new);
      l[r0 + r] = l[r0 + r] * b.alpha[r] + row_sum;
      mx[r0 + r] = m_new;
    } else {
      l[r0 + r] += row_sum;
    }
    b.rescale = b.rescale || b.alpha[r] != T(1);
    for (int64_t j = 0; j < b.vis[r] && b.dense; j += N) {
      const auto pz = hn::Eq(hn::LoadU(d, srow + j), hn::Zero(d));
      const auto in = hn::FirstN(d, static_cast<size_t>(std::min<int64_t>(N, b.vis[r] - j)));
      b.dense = hn::AllFalse(d, hn::And(pz, in));
    }
  }
}

// Prefetches into L2 part `part` of `parts` (ascending, cut at cache lines) of the bytes
// [0, bytes) at run.
HWY_INLINE void PrefetchRunPart(const char* run, int64_t bytes, int64_t part, int64_t parts) {
  const int64_t b0 = flash::round_up(bytes * part / parts, 64);
  const int64_t b1 = flash::round_up(bytes * (part + 1) / parts, 64);
  for (int64_t b = b0; b < b1; b += 64) __builtin_prefetch(run + b, 0, 2);
}

// Prefetches that wait until a kv head's first block of rows has formed its scores: the next
// head's value rows into L1 (over caches of the arithmetic's dtype) and the head's part of the
// far runs into L2 (over 16-bit caches); see "Prefetches of the direct path" below.
struct AfterScores {
  const char* row[kDecodeTile];
  int64_t n = 0, bytes = 0;
  const char* run[2] = {nullptr, nullptr};
  int64_t run_bytes[2] = {0, 0};
  int64_t part = 0, parts = 1;
  bool runs = false;

  HWY_INLINE void Issue() {
    for (int64_t j = 0; j < n; ++j) flash::prefetch_lines<3>(row[j], bytes);
    n = 0;
    if (runs) {
      PrefetchRunPart(run[0], run_bytes[0], part, parts);
      PrefetchRunPart(run[1], run_bytes[1], part, parts);
      runs = false;
    }
  }
};

// One block of R query rows over one tile: scores from one read of each K row, the online
// softmax per row, then P V from one read of each V row. Rows that see a different number of
// the tile's keys (causal, L > 1), or whose probabilities include an exact 0 (skipped, as in
// the packed path), take the per-row way.
template <int R, int kC, typename T, typename Tc>
HWY_INLINE void BlockStep(const Dims& m, const Scratch<T>& w, int64_t r0, int64_t s0, int64_t kc,
                          const Tc* const* kp, const Tc* const* vp, T* acc, T* mx, T* l,
                          AfterScores& after_scores) {
  const hn::ScalableTag<T> d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<T>()));
  BlockState<R, T> b;
  if (!BlockVisible(w, r0, s0, kc, b)) return;
  TileScores<R, kC>(d, w.qs + r0 * m.Epad, m.Epad, kp, m.Epad / N, w.s);
  after_scores.Issue();
  BlockSoftmax(w, r0, mx, l, b);
  const int64_t Cv = m.Evpad / N;
  if (b.dense) {
    // acc * 1 is acc exactly: rows whose max did not move are rescaled by 1 with the others.
    TilePV<R>(d, w.s, nullptr, b.vis[0], vp, Cv, b.alpha, b.rescale, acc + r0 * m.ldv, m.ldv);
    return;
  }
  for (int r = 0; r < R; ++r) {
    if (!b.live[r]) continue;
    const T* srow = w.s + r * kDecodeTile;
    int64_t n = 0;
    for (int64_t j = 0; j < b.vis[r]; ++j) {
      w.nz[n] = static_cast<int>(j);
      n += srow[j] != T(0);
    }
    TilePV<1>(d, srow, w.nz, n, vp, Cv, &b.alpha[r], b.alpha[r] != T(1), acc + (r0 + r) * m.ldv,
              m.ldv);
  }
}

// ---- bfloat16 pairs: a bfloat16 query over a bfloat16 cache, on vdpbf16ps ------------------
//
// Where the call's query is bfloat16 (DecodeProblem::q_bf16), the cache bfloat16, and the CPU
// multiplies bfloat16 pairs on vdpbf16ps at twice the FMA's rate (bf16::dot_pairs_in_kernel():
// AMD's AVX512_BF16; not Intel's, AMX or not, where it is half that),
// the AVX3_DL target multiplies the bfloat16 values as they lie instead of widening them:
//   scores: q . k on vdpbf16ps (each product of two bfloat16 exact in float32, the pairs'
//           sums in float32), the unscaled bfloat16 query against each K row, then times
//           scale in float32: S = scale * (q . k), as the naive composite forms it;
//   P V:    P rounded to bfloat16 (round to nearest even), as FlashAttention-2, PyTorch's CPU
//           flash kernel and the half-precision naive baseline (docs/precision.md) round it,
//           and two keys at a time: each vdpbf16ps lane takes the pair (P_j, P_j+1) of a row
//           and the pair (V_j[e], V_j+1[e]) of two value rows interleaved by vpunpck[lh]wd.
//           The running sum l uses the unrounded P.
// vpunpck[lh]wd interleave within each 128-bit lane, so an accumulator's lanes hold the
// elements of a 32-element block of Ev in the order Interleaved() gives; the item's rows are
// put back in element order when it ends. Per key and kv head at E = Ev = 128 and four rows:
// 16 + 16 vdpbf16ps and 8 loads, against 32 + 32 FMAs, 16 loads and 16 widenings on float32
// products. The softmax, the visibility rules, the skipped keys of probability 0 (their value
// rows replaced by zeros, so that a NaN in an unused row never reaches out) and the chunk rule
// are the float32 path's. vdpbf16ps treats bfloat16 denormals as zero (docs/precision.md).
#if HWY_TARGET == HWY_AVX3_DL
#define SDPA_DECODE_PAIRS 1
#define SDPA_PAIRS_ATTR __attribute__((target("avx512bf16")))

SDPA_PAIRS_ATTR HWY_INLINE __m512 Dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

// Position, within its 32-element block, of the element that accumulator lane i of half hi
// holds: vpunpcklwd takes elements 0..3 of each 128-bit lane of 8 elements, vpunpckhwd 4..7.
constexpr int64_t Interleaved(int64_t i, bool hi) { return 8 * (i / 4) + (hi ? 4 : 0) + i % 4; }

// The scores of R rows (bfloat16 q at q + r * ldq) against keys kp[0..K) in one vector per row
// (lane j: q_r . k_j, unscaled), the tree of LaneTree evaluated depth first.
template <size_t K, int R, int kC>
struct PairsKeyTree {
  template <class D>
  static SDPA_PAIRS_ATTR HWY_INLINE void Run(D d, const std::uint16_t* HWY_RESTRICT q, int64_t ldq,
                                             const std::uint16_t* const* kp, int64_t C_rt,
                                             hn::Vec<D>* out) {
    using V = hn::Vec<D>;
    if constexpr (K > 1) {
      V lo[R], hi[R];
      PairsKeyTree<K / 2, R, kC>::Run(d, q, ldq, kp, C_rt, lo);
      PairsKeyTree<K / 2, R, kC>::Run(d, q, ldq, kp + K / 2, C_rt, hi);
      for (int r = 0; r < R; ++r) {
        out[r] = TreeLevel(d, lo[r], hi[r]);
      }
    } else {
      const int64_t C = kC > 0 ? kC : C_rt;  // vectors of 32 bfloat16 per row
      const std::uint16_t* HWY_RESTRICT k = kp[0];
      __m512 a[R];
      for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
      for (int64_t c = 0; c < C; ++c) {
        const __m512i kv = _mm512_loadu_si512(k + 32 * c);
        for (int r = 0; r < R; ++r) {
          a[r] = Dp(a[r], _mm512_loadu_si512(q + r * ldq + 32 * c), kv);
        }
      }
      for (int r = 0; r < R; ++r) out[r] = V{a[r]};
    }
  }
};

// acc_r = alpha_r * acc_r + sum_j P_r[j] v_j over the key pairs (2 i, 2 i + 1), i < npairs:
// p2[r * kDecodeTile / 2 + i] holds row r's pair of bfloat16 probabilities, vp[j] the value rows
// (bfloat16, Ev elements, Ev % 64 == 0); acc rows in the interleaved order.
template <int R>
SDPA_PAIRS_ATTR HWY_INLINE void TilePVPairs(const std::uint32_t* HWY_RESTRICT p2, int64_t npairs,
                                            const std::uint16_t* const* vp, int64_t Ev,
                                            const float* alpha, bool rescale,
                                            float* HWY_RESTRICT acc, int64_t ldv) {
  constexpr int64_t kP = kDecodeTile / 2;
  for (int64_t c0 = 0; c0 < Ev; c0 += 64) {
    __m512 a[R][4];
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < 4; ++u) a[r][u] = _mm512_loadu_ps(acc + r * ldv + c0 + 16 * u);
    }
    if (rescale) {
      for (int r = 0; r < R; ++r) {
        const __m512 va = _mm512_set1_ps(alpha[r]);
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_mul_ps(a[r][u], va);
      }
    }
    for (int64_t i = 0; i < npairs; ++i) {
      const std::uint16_t* v0 = vp[2 * i] + c0;
      const std::uint16_t* v1 = vp[2 * i + 1] + c0;
      const __m512i x0 = _mm512_loadu_si512(v0), y0 = _mm512_loadu_si512(v1);
      const __m512i x1 = _mm512_loadu_si512(v0 + 32), y1 = _mm512_loadu_si512(v1 + 32);
      const __m512i w0 = _mm512_unpacklo_epi16(x0, y0), w1 = _mm512_unpackhi_epi16(x0, y0);
      const __m512i w2 = _mm512_unpacklo_epi16(x1, y1), w3 = _mm512_unpackhi_epi16(x1, y1);
      for (int r = 0; r < R; ++r) {
        const __m512i pr = _mm512_set1_epi32(static_cast<int>(p2[r * kP + i]));
        a[r][0] = Dp(a[r][0], w0, pr);
        a[r][1] = Dp(a[r][1], w1, pr);
        a[r][2] = Dp(a[r][2], w2, pr);
        a[r][3] = Dp(a[r][3], w3, pr);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + r * ldv + c0 + 16 * u, a[r][u]);
    }
  }
}

// BlockStep on bfloat16 pairs: the rows' bfloat16 queries at w.qs viewed as uint16_t (row
// stride m.Epad * 2), kp / vp the tile's bfloat16 rows, zero a row of zeros.
// Not inlined: its callers lack the avx512bf16 attribute (one call per block and tile).
template <int R, int kC>
SDPA_PAIRS_ATTR HWY_NOINLINE void BlockStepPairs(const Dims& m, const Scratch<float>& w, int64_t r0,
                                                 int64_t s0, int64_t kc,
                                                 const std::uint16_t* const* kp,
                                                 const std::uint16_t* const* vp,
                                                 const std::uint16_t* zero, float scale, float* acc,
                                                 float* mx, float* l, AfterScores& after_scores) {
  static_assert(kDecodeTile == 16, "one vector of scores per row and tile");
  const hn::ScalableTag<float> d;
  constexpr int64_t kP = kDecodeTile / 2;
  BlockState<R, float> b;
  if (!BlockVisible(w, r0, s0, kc, b)) return;
  {
    const int64_t ldq = 2 * m.Epad;
    hn::Vec<decltype(d)> out[R];
    PairsKeyTree<kDecodeTile, R, kC>::Run(
        d, reinterpret_cast<const std::uint16_t*>(w.qs) + r0 * ldq, ldq, kp, m.E / 32, out);
    const auto vs = hn::Set(d, scale);
    for (int r = 0; r < R; ++r) hn::StoreU(hn::Mul(out[r], vs), d, w.s + r * kDecodeTile);
  }
  after_scores.Issue();
  BlockSoftmax(w, r0, mx, l, b);
  for (int r = 0; r < R; ++r) {
    // Rows that are not live hold -inf scores or zeros; their pairs are never read.
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(w.s + r * kDecodeTile));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.p2 + r * kP), reinterpret_cast<__m256i>(h));
  }
  if (b.dense) {
    // Keys past vis (the tile's end, or the last visible key) have P = 0 and read zeros.
    const std::uint16_t* vz[kDecodeTile];
    for (int64_t j = 0; j < kDecodeTile; ++j) vz[j] = j < b.vis[0] ? vp[j] : zero;
    TilePVPairs<R>(w.p2, (b.vis[0] + 1) / 2, vz, m.Ev, b.alpha, b.rescale, acc + r0 * m.ldv, m.ldv);
    return;
  }
  for (int r = 0; r < R; ++r) {
    if (!b.live[r]) continue;
    const float* srow = w.s + r * kDecodeTile;
    const std::uint16_t* vz[kDecodeTile];
    for (int64_t j = 0; j < kDecodeTile; ++j) {
      vz[j] = j < b.vis[r] && srow[j] != 0.0f ? vp[j] : zero;
    }
    TilePVPairs<1>(w.p2 + r * kP, (b.vis[r] + 1) / 2, vz, m.Ev, &b.alpha[r], b.alpha[r] != 1.0f,
                   acc + (r0 + r) * m.ldv, m.ldv);
  }
}

// Puts each of the item's rows of acc back in element order (TilePVPairs leaves them
// interleaved); tmp holds Ev floats.
inline void DeinterleaveRows(int64_t nrows, int64_t Ev, int64_t ldv, float* acc, float* tmp) {
  for (int64_t r = 0; r < nrows; ++r) {
    float* a = acc + r * ldv;
    for (int64_t c = 0; c < Ev; c += 32) {
      for (int64_t i = 0; i < 16; ++i) {
        tmp[c + Interleaved(i, false)] = a[c + i];
        tmp[c + Interleaved(i, true)] = a[c + 16 + i];
      }
    }
    std::copy_n(tmp, Ev, a);
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

// Prefetches of the direct path when it reads the cache in place, at two distances:
// - far: over 16-bit caches, the K and V rows of the tile kDecodeAheadTiles tiles ahead, into L2
//   (Hq 32, Hkv 8, S 32768, E 128, 2 Zen 5 threads, into L1 at the time: float16 10.6 -> 7.1
//   ms, bfloat16 10.4 -> 6.7 ms). Over float32 caches, whose rows the hardware prefetchers
//   already stream, the same prefetches made the call slower (11.9 -> 13.0 ms), so they are left
//   out there.
// - near: over every dtype, while one kv head's blocks run, the rows of the next head (of this
//   tile, or the first head of the next tile), into L1, where an item walks several heads of a
//   position-major cache. A tile of all heads (64 KiB at Hkv 8, E 128, bfloat16) does not fit a
//   48 KiB L1, so the far prefetches reach L2 only; without the near ones the first loads of
//   each value row stalled (a third of the pairs kernel's samples). Paired against the far
//   prefetches alone (same shape, 2 Zen 5 threads, three to four rounds): bfloat16 query and
//   cache 5.6-5.8 -> 4.9-5.1 ms, float32 query over a bfloat16 cache 6.3 -> 5.6 ms, float16
//   6.5 -> 5.6 ms, float32 cache 9.6-12.2 -> 9.6-10.1 ms (minimums 9.4-11.4 -> 8.9-9.5).
// Far distances of 1 and 4 tiles measured the same or slower than 2.
// On Intel CPUs, and wherever the keys are taken in page order, there are no far prefetches
// (Dims::far_prefetch; measured with page order below).
constexpr int64_t kDecodeAheadTiles = 2;

// Where an item holds every kv head and a position's heads lie one after the other (the
// position-major caches of attention_with_kvcache), the rows a tile reads are whole cache rows,
// and where those rows are also consecutive in memory (a contiguous cache, or a run within one
// page) the far prefetches take them as one run of memory instead: the run of kDecodeAheadRows
// positions ahead, cut into one part per kv head, each head's blocks issuing its part's lines in
// ascending order. Row by row, the far prefetches ask for 4-line pieces 2 KiB apart (bfloat16,
// Hkv 8, E 128), and the same lines asked for front to back arrive sooner. Paired calls in one
// process, run against row by row at 2 tiles (2 Zen 5 threads, Hq 32, Hkv 8, S 32768, E 128):
// float32 query over a bfloat16 cache 1.22-1.27x, bfloat16 query and cache 1.21x; Hkv 1 (S
// 131072) 1.06x, Hkv 2 1.08x, E 64 1.10x, S 8192 1.19x, one thread 1.29x, S 2048 (K/V in L3)
// 1.00x. Runs of 6, 8, 16 and 20 positions ahead measured 0.97, 0.97, 0.96 and 0.92 times as fast
// as 12. Over float32 caches there are no far prefetches (above).
//
// When each prefetch is issued (AfterScores): a head's part of the far runs once the head's first
// block of rows has formed its scores, not before the block, where it came as a burst in front
// of the block's own first loads (paired as above: float32 query over a bfloat16 cache 1.17x,
// all-bfloat16 1.06x, one thread 1.15x, Hkv 2 1.06x, Hkv 1 1.03x, S 8192 1.05x, E 64 1.00x;
// issued after the softmax or after P V instead, 0.99x and 1.01x). The near prefetches of the
// next head's key rows go before the block; its value rows' go with them over 16-bit caches, and
// after the scores over caches of the arithmetic's dtype (float32: E 128 1.07-1.09x, one thread
// 1.10x, Hkv 2 1.04x, E 64 1.01x; over a bfloat16 cache the later value prefetches measured
// 0.93x). Unrolling the prefetch loops (a constant row size) measured 0.92-0.96x from memory.
constexpr int64_t kDecodeAheadRows = 12;

// Page order (DecodeKeyOrder in decode.h). A kv head's pass over a tile reads E elements of each
// of its 16 rows. Where a cache row (every kv head of a position) is shorter than a 4 KiB page,
// a page holds several consecutive rows, and in memory order the pass reads it in as many
// interleaved pieces (bfloat16, Hkv 8, E 128: lines 0-3 and 32-35 of each page, then 4-7 and
// 36-39 for the next head, ...). Intel's L2 streamer follows one ascending walk per page, so
// there most lines came in on the L1's own requests (the near prefetches), whose few fill
// buffers bound the read: 16-bit caches read at ~55% of the streaming read against ~82% for
// float32 caches, whose 4 KiB rows are each one page read front to back. In page order the P =
// 4096 / (row bytes in 16-bit elements) tiles of a group interleave their keys (tile i takes
// keys i, i + P, ...), so that every page is read front to back, one row after the other, over
// the group's passes. P comes from the logical sizes alone (decode_page_rows: 16-bit elements
// whatever the cache's dtype), so that a 16-bit cache and its widened float32 copy, a
// position-major cache and a head-major one, and a sequence alone or among others whose
// items split the heads differently, all sum their keys in one order. A group is taken in
// page order only where every row of the item sees all of its keys (so each of its tiles is
// whole and seen whole), else in memory order. Measured on an Intel Xeon (family 6 model 167,
// 48 KiB L1d, AVX3_DL, 2 threads; sdpa_ab_builds, paired calls of the two builds, float32
// query, 12-16 pairs each), page order with no far prefetches against memory order with them:
//   Hq 32, Hkv 8, S 32768, E 128: bfloat16 1.35x, float16 1.34x, float32 1.02x (its rows are
//   a page: P = 2 only spreads the tiles, at the same speed);
//   bfloat16 / float32: Hkv 4 1.23x / 1.35x; Hkv 2 (S 65536) 1.14x / 1.33x; Hkv 1 (S 131072)
//   1.04x / 1.22x; E 64 1.20x / 1.21x; S 8192 1.34x / 1.04x; batch 4 at S 8192 1.33x / 1.04x;
//   L 4 1.11x / 1.05x; one thread 1.34x / 1.06x.
// Parts of it, bfloat16 at the first shape: without the far prefetches alone 1.09x (float16
// 1.13x); page order alone, far prefetches kept, 0.99x of page order without them; page order
// without the near prefetches 0.79x (the streamer does not replace them); the far prefetches
// at every other line (128 bytes) or every fourth 0.80x and 0.86x of none; near prefetches at
// every other line 0.64x. `sdpa bench --kv-cache --kv-order memory|page` forces either order.
// Where page order buys nothing it costs little: attention_forward at L 1 over head-major K/V
// (each head's rows one block) 0.98x at Hkv 8 (E 128 and E 64) and 1.20x at Hkv 2; a
// position-major cache whose items split the heads (S 4096, batch 1) bfloat16 1.07x, float32
// 0.99x (paired builds, page order for every item against only where an item held every kv
// head of a position-major cache).
// Not measured on AMD's cores, whose rule stays memory order with the far prefetches.

// True when rows off[0..n) lie `row` elements apart, one after the other. Unused by the targets
// whose decode never reads rows in place.
[[maybe_unused]] HWY_INLINE bool Consecutive(const int64_t* off, int64_t n, int64_t row) {
  for (int64_t j = 1; j < n; ++j) {
    if (off[j] != off[0] + j * row) return false;
  }
  return true;
}

// Copied tiles. The direct path can first copy each tile, every head of each position in memory
// order, into a contiguous buffer in the cache's own dtype, and run the blocks of rows on the
// copy (decode_copies_tiles decides; DecodeTileRead in decode.h). In a position-major cache one
// head's rows lie Hkv * E elements apart (4 KiB at Hkv 8, E 128, float32): read in place, a
// tile's 16 rows of a head fall in one or two sets of a 32 KiB 8-way L1, and the memory is
// walked in 2 Hkv interleaved streams. Hq 32, Hkv 8, E 128, paired calls in one process, copied
// against in place:
//   AVX2, one AMD EPYC family 23 core pair: S = 32768 float32 1.51x, bfloat16 1.45x; S = 8192
//   1.57x and 1.46x; S = 2048 (K/V in L3) 1.14x and 1.05x; software prefetch of each head's
//   rows two tiles ahead on top of the copy 0.95-0.98x.
//   AVX3_DL, one AMD EPYC family 25 (Zen 4, 32 KiB 8-way L1d) core pair, three paired rounds:
//   S = 32768 float32 1.10-1.42x, bfloat16 1.49-1.91x, float16 1.46-1.86x; S = 8192 float32
//   1.10-1.23x, bfloat16 1.43-1.56x; with L = 4 (16 rows per kv head) at S = 32768 float32
//   0.92x, bfloat16 1.08x. When repeated calls find K/V in L3 (S <= 2048) the copy is slower
//   (S = 2048 0.78-0.93x, S = 512 0.6-0.7x); in a model each layer's cache is read once per
//   token after the other layers' caches have passed through L3, so the rule follows the
//   from-memory figures.
// Over 16-bit caches the copy takes the far prefetches as runs of memory (kDecodeAheadRows),
// issued while the previous tile's blocks run, so that the copy reads from L2; row by row (the
// runs cut by a page edge) it takes none. Paired against the copy without them (AVX2 code on a
// Zen 5, S = 32768, 2 threads unless said): bfloat16 1.04-1.11x, one thread 1.13x, E 64 1.16x,
// Hkv 2 1.09x, S 8192 1.07x, float16 1.03x; the AVX3_DL code made to copy (as on Zen 4):
// bfloat16 1.07x, float16 1.07x. Runs 8, 20 or 28 positions ahead measured the same as 12.
// Float32 caches take none here either (1.00x).
// Where the L1d is larger (48 KiB 12-way: Zen 5, the Xeon measured, Intel's AVX2-only client
// cores) the automatic rule reads in place, with the prefetches above, whatever the target.
// Zen 5, S = 32768, 2 threads, two rounds: in place against copied, bfloat16 (query and cache)
// 4.7-4.8 against 6.2-6.3 ms, float16 5.4 against 7.0-7.1 ms, float32 8.2-8.4 against 9.7-10.1
// ms. The AVX2 code on the same core, paired (copied time over in-place time, medians of 30-40
// pairs): bfloat16 1.35x, float16 1.39x, float32 1.10x; one thread bfloat16 1.39x, float32
// 1.17x; S = 8192 1.35x / 1.11x; E = 64 1.31x / 1.19x; Hkv 2 1.37x / 0.95x. Head-major caches
// (each head's rows one block) are read in place on every target.

// One work item read in place (or from a copy of each tile, m.copy_tiles): for each tile, for each
// kv head, the head's G * L query rows in blocks of up to kDecodeRows. Same contract and partials
// as DecodeItem (and the same order of every sum per row, whatever the blocking), without the
// packed path's widened, zero-padded copy. Needs no mask problem, E a multiple of the lanes and
// Ev of kPVWidth vectors (direct_applies).
// kPairs: on bfloat16 pairs (BlockStepPairs), the item's bfloat16 query rows in w.qs.
template <typename T, typename Tc, int kC, bool kPairs = false>
void DecodeItemDirect(const DecodeProblem& p, const Dims& m, const Item& it, const Scratch<T>& w,
                      T* acc, T* mx, T* l) {
  const int64_t G = m.G, L = m.L;
  const int64_t last_any = StartRows(p, m, it, w, acc, mx, l);
  if constexpr (kPairs) {
    // The rows' bfloat16 queries, unscaled, over the float32 ones StartRows wrote (2 Epad
    // uint16_t per row, E of them used).
    auto* q16 = reinterpret_cast<std::uint16_t*>(w.qs);
    const auto* src = static_cast<const std::uint16_t*>(p.q_bf16);
    for (int64_t r = 0; r < it.nh * G * L; ++r) {
      const int64_t h = it.h0 * G + r / L, i = r % L;
      std::copy_n(src + it.b * p.q_sb + h * p.q_sh + i * p.q_sl, m.E, q16 + r * 2 * m.Epad);
    }
  }
  const Tc* k = static_cast<const Tc*>(p.k);
  const Tc* v = static_cast<const Tc*>(p.v);
  const Tc* zero = reinterpret_cast<const Tc*>(w.zero);
  int64_t ko[kDecodeTile], vo[kDecodeTile];
  const Tc* kp[kDecodeTile];
  const Tc* vp[kDecodeTile];
  const int64_t gl = G * L;
  // Keys past every row's last visible key are never read.
  const int64_t end = std::min(it.s1, last_any + 1);
  int64_t ko_pf[kDecodeTile], vo_pf[kDecodeTile], ko_next[kDecodeTile], vo_next[kDecodeTile];
  const int64_t kbytes = m.E * static_cast<int64_t>(sizeof(Tc));
  const int64_t vbytes = m.Ev * static_cast<int64_t>(sizeof(Tc));
  // The item reads whole cache rows: every kv head, each head's E (Ev) elements right after the
  // previous head's.
  const bool whole_rows = it.nh == p.Hkv && p.k_head == m.E && p.v_head == m.Ev &&
                          p.k_row == p.Hkv * m.E && p.v_row == p.Hkv * m.Ev;
  const int64_t kbytes_row = p.Hkv * kbytes, vbytes_row = p.Hkv * vbytes;
  // The near prefetches of the next head's value rows wait for the scores of the head's first
  // block where the cache has the arithmetic's dtype (see kDecodeAheadRows).
  constexpr bool kVNearAfterScores = sizeof(Tc) == sizeof(T) && !kPairs;
  AfterScores later;
  later.bytes = vbytes;
  // The copied tile (m.copy_tiles): [head][kDecodeTile][Epad | Evpad] in the cache's dtype, its
  // 16-bit elements moved as uint16_t.
  using Bits = std::conditional_t<sizeof(Tc) == 2, std::uint16_t, Tc>;
  Tc* kcopy = reinterpret_cast<Tc*>(w.kt);
  Tc* vcopy = reinterpret_cast<Tc*>(w.vt);
  // Keys [it.s0, all_see) are visible to every row; a group of tiles in page order lies within
  // them, so that each of its tiles is whole and seen whole by every row.
  int64_t all_see = end;
  for (int64_t r = 0; r < it.nh * gl; ++r) all_see = std::min(all_see, w.last[r] + 1);
  const int64_t group_keys = m.page_rows * kDecodeTile;
  // The rows of the tile at keys [s, s + n): consecutive keys, or in page order.
  const auto tile_rows = [&](int64_t s, int64_t n, int64_t* k_off, int64_t* v_off) {
    const int64_t t = (s - it.s0) / kDecodeTile;
    const int64_t first = it.s0 + (t / m.page_rows) * group_keys;
    if (m.page_rows > 1 && first + group_keys <= all_see) {
      RowOffsetsStrided(p, it.b, first + t % m.page_rows, m.page_rows, kDecodeTile, k_off, v_off);
    } else {
      RowOffsets(p, it.b, s, n, k_off, v_off);
    }
  };
  for (int64_t s0 = it.s0; s0 < end; s0 += kDecodeTile) {
    const int64_t kc = std::min(kDecodeTile, end - s0);
    tile_rows(s0, kc, ko, vo);
    const int64_t s_pf = s0 + (whole_rows ? kDecodeAheadRows : kDecodeAheadTiles * kDecodeTile);
    // Copied tiles take the far rows only as runs (see "Copied tiles").
    const int64_t n_pf = m.far_prefetch && sizeof(Tc) < sizeof(T) && (whole_rows || !m.copy_tiles)
                             ? std::clamp<int64_t>(end - s_pf, 0, kDecodeTile)
                             : 0;
    RowOffsets(p, it.b, s_pf, n_pf, ko_pf, vo_pf);
    // The far rows as two runs of memory (K's and V's), when they are.
    const bool runs = whole_rows && n_pf > 0 && Consecutive(ko_pf, n_pf, p.k_row) &&
                      Consecutive(vo_pf, n_pf, p.v_row);
    // The near prefetches' rows of the next tile (for the item's first head).
    const bool near = !m.copy_tiles && (it.nh > 1 || m.near_one_head);
    const int64_t n_next = near ? std::clamp<int64_t>(end - (s0 + kDecodeTile), 0, kDecodeTile) : 0;
    tile_rows(s0 + kDecodeTile, n_next, ko_next, vo_next);
    if (m.copy_tiles) {
      for (int64_t j = 0; j < kc; ++j) {
        for (int64_t hh = 0; hh < it.nh; ++hh) {
          const int64_t h = it.h0 + hh;
          CopyRow(reinterpret_cast<const Bits*>(k + ko[j] + h * p.k_head), m.E,
                  reinterpret_cast<Bits*>(kcopy + hh * m.kcopy_head + j * m.Epad));
          CopyRow(reinterpret_cast<const Bits*>(v + vo[j] + h * p.v_head), m.Ev,
                  reinterpret_cast<Bits*>(vcopy + hh * m.vcopy_head + j * m.Evpad));
        }
      }
    }
    for (int64_t hh = 0; hh < it.nh; ++hh) {
      const int64_t h = it.h0 + hh;
      for (int64_t j = 0; j < kDecodeTile; ++j) {
        if (j >= kc) {
          kp[j] = vp[j] = zero;
        } else if (m.copy_tiles) {
          kp[j] = kcopy + hh * m.kcopy_head + j * m.Epad;
          vp[j] = vcopy + hh * m.vcopy_head + j * m.Evpad;
        } else {
          kp[j] = k + ko[j] + h * p.k_head;
          vp[j] = v + vo[j] + h * p.v_head;
        }
      }
      if (runs) {
        later.run[0] = reinterpret_cast<const char*>(k + ko_pf[0]);
        later.run[1] = reinterpret_cast<const char*>(v + vo_pf[0]);
        later.run_bytes[0] = n_pf * kbytes_row;
        later.run_bytes[1] = n_pf * vbytes_row;
        later.part = hh;
        later.parts = it.nh;
        later.runs = true;
      } else if (!m.copy_tiles) {  // row by row (a copy takes only runs)
        for (int64_t j = 0; j < n_pf; ++j) {
          flash::prefetch_lines<2>(k + ko_pf[j] + h * p.k_head, kbytes);  // into L2
          flash::prefetch_lines<2>(v + vo_pf[j] + h * p.v_head, vbytes);
        }
      }
      if (near) {
        const bool last = hh + 1 == it.nh;
        const int64_t* kn = last ? ko_next : ko;
        const int64_t* vn = last ? vo_next : vo;
        const int64_t h_next = last ? it.h0 : h + 1;
        for (int64_t j = 0; j < (last ? n_next : kc); ++j) {
          flash::prefetch_lines<3>(k + kn[j] + h_next * p.k_head, kbytes);  // into L1
          if constexpr (kVNearAfterScores) {
            later.row[later.n++] = reinterpret_cast<const char*>(v + vn[j] + h_next * p.v_head);
          } else {
            flash::prefetch_lines<3>(v + vn[j] + h_next * p.v_head, vbytes);
          }
        }
      }
      const int64_t rb = hh * gl;
      const auto step = [&](auto rows, int64_t r1) {
        constexpr int R = decltype(rows)::value;
#ifdef SDPA_DECODE_PAIRS
        if constexpr (kPairs) {
          BlockStepPairs<R, kC>(m, w, rb + r1, s0, kc,
                                reinterpret_cast<const std::uint16_t* const*>(kp),
                                reinterpret_cast<const std::uint16_t* const*>(vp),
                                reinterpret_cast<const std::uint16_t*>(zero),
                                static_cast<float>(p.scale), acc, mx, l, later);
        } else  // NOLINT(readability/braces)
#endif
        {
          BlockStep<R, kC>(m, w, rb + r1, s0, kc, kp, vp, acc, mx, l, later);
        }
      };
      int64_t r = 0;
      for (; r + kDecodeRows <= gl; r += kDecodeRows) {
        step(std::integral_constant<int, kDecodeRows>(), r);
      }
      switch (gl - r) {
        case 3:
          step(std::integral_constant<int, 3>(), r);
          break;
        case 2:
          step(std::integral_constant<int, 2>(), r);
          break;
        case 1:
          step(std::integral_constant<int, 1>(), r);
          break;
        default:
          break;
      }
      later.Issue();  // where no block of the head formed scores
    }
  }
#ifdef SDPA_DECODE_PAIRS
  if constexpr (kPairs) DeinterleaveRows(it.nh * gl, m.Ev, m.ldv, acc, w.tmp);
#endif
}

// The targets that compile the direct path: not the emulated ones (EMU128, SCALAR), where its
// unrolled blocks are many times slower to compile than to matter (no x86-64 machine without
// SSSE3 serves models); they take the packed path for every call.
constexpr bool kDirectTarget = HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR;

// DecodeItemDirect with the chunk count E / N as a constant where E is 64 or 128 (most models'
// head sizes) and the count at most 16 vectors: two instances per type and target besides the
// general one. Sanitizer builds (SDPA_DECODE_GENERIC_ONLY) compile the general one alone: the
// fixed counts are the same code with constant trip counts, and their clang -O1 instrumented
// compile otherwise takes most of an hour.
template <typename T, typename Tc>
void DirectItem(const DecodeProblem& p, const Dims& m, const Item& it, const Scratch<T>& w, T* acc,
                T* mx, T* l) {
#ifdef SDPA_DECODE_PAIRS
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Tc, hwy::bfloat16_t>) {
    if (m.pairs) {
#ifndef SDPA_DECODE_GENERIC_ONLY
      if (m.E == 128) return DecodeItemDirect<T, Tc, 4, true>(p, m, it, w, acc, mx, l);
      if (m.E == 64) return DecodeItemDirect<T, Tc, 2, true>(p, m, it, w, acc, mx, l);
#endif
      return DecodeItemDirect<T, Tc, 0, true>(p, m, it, w, acc, mx, l);
    }
  }
#endif
#ifndef SDPA_DECODE_GENERIC_ONLY
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<T>()));
  constexpr int kSmall = static_cast<int>(64 / N), kLarge = static_cast<int>(128 / N);
  const int64_t Ck = m.Epad / N;
  if constexpr (N > 1 && kSmall <= 16) {
    if (Ck == kSmall) return DecodeItemDirect<T, Tc, kSmall>(p, m, it, w, acc, mx, l);
  }
  if constexpr (N > 1 && kLarge <= 16) {
    if (Ck == kLarge) return DecodeItemDirect<T, Tc, kLarge>(p, m, it, w, acc, mx, l);
  }
#endif
  DecodeItemDirect<T, Tc, 0>(p, m, it, w, acc, mx, l);
}

// Merges the partials of the chunks of one output row in chunk order (exact for empty chunks).
template <typename T>
void MergeRow(int64_t chunks, int64_t stride_acc, int64_t stride_ml, const T* acc, const T* m,
              const T* l, int64_t Ev, T* out, T* lse) {
  T M = kDecodeNegInf<T>;
  for (int64_t c = 0; c < chunks; ++c) {
    const T mc = m[c * stride_ml];
    M = std::isnan(mc) || std::isnan(M) ? std::numeric_limits<T>::quiet_NaN() : std::max(M, mc);
  }
  if (M == kDecodeNegInf<T>) {  // no visible key: out = 0, lse = -inf
    std::fill_n(out, Ev, T(0));
    if (lse != nullptr) *lse = kDecodeNegInf<T>;
    return;
  }
  std::fill_n(out, Ev, T(0));
  T sum = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const T mc = m[c * stride_ml];
    if (mc == kDecodeNegInf<T>) continue;  // an empty chunk adds nothing
    const T wc = std::exp(mc - M);
    sum += wc * l[c * stride_ml];
    const T* a = acc + c * stride_acc;
    for (int64_t e = 0; e < Ev; ++e) out[e] += wc * a[e];
  }
  const T inv = T(1) / sum;
  for (int64_t e = 0; e < Ev; ++e) out[e] *= inv;
  if (lse != nullptr) *lse = M + std::log(sum);
}

template <typename T, typename Tc>
void DecodeT(const DecodeProblem& p) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  Dims m{};
  m.G = p.Hq / p.Hkv;
  m.L = p.L;
  m.E = p.E;
  m.Ev = p.Ev;
  m.Epad = flash::round_up(std::max<int64_t>(p.E, 1), N);
  m.Evpad = flash::round_up(std::max<int64_t>(p.Ev, 1), N);
  m.ldv = flash::round_up(m.Evpad, flash::kPad<T>);
  // The direct path reads K and V in place, whole vectors of them; the packed one serves masks,
  // ragged sizes and empty rows (E or Ev = 0, where Epad and Evpad still hold one vector).
  m.direct = kDirectTarget && p.mask_problem == nullptr && p.E > 0 && p.Ev > 0 && p.E % N == 0 &&
             p.Ev % (N * kPVWidth<decltype(d)>) == 0;
  // Heads per item: as many as keep the packed tile within kDecodePackBytes, split evenly. The
  // split depends on the shape only (never on the thread count).
  const int64_t tile_bytes = kDecodeTile * (m.Epad + m.Evpad) * static_cast<int64_t>(sizeof(T));
  const int64_t fit = std::clamp<int64_t>(kDecodePackBytes / tile_bytes, 1, p.Hkv);
  const int64_t groups = flash::ceil_div(p.Hkv, fit);
  m.heads_per_item = flash::ceil_div(p.Hkv, groups);

  m.page_rows = 1;
  if (m.direct) {
    // Every kv head of a position in one item, so that an item walks whole cache rows (all
    // heads of a position, then the next position) and the hardware prefetchers see each
    // page read once, front to back: 11.6-14 GB/s of K/V per CPU-second on one Zen 5 thread
    // against 9.5-11 with four of eight heads per item (Hq 32, Hkv 8, S 32768, E 128, under
    // load). Short batches split the heads again, so that there are about 16 items to share
    // (the split depends on the shape only; no row's arithmetic depends on it).
    int64_t slots = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t S = p.seq_lens[static_cast<size_t>(b)];
      slots += std::max<int64_t>(1, flash::ceil_div(S, decode_chunk_keys(S)));
    }
    const int64_t split =
        std::clamp<int64_t>(flash::ceil_div(16, std::max<int64_t>(slots, 1)), 1, p.Hkv);
    m.heads_per_item = flash::ceil_div(p.Hkv, split);
    // A head-major cache ((B, Hkv, S, E) in C order: each head's rows one block) is walked one
    // head per item instead: the item then reads one stream of K and one of V, front to back,
    // where all heads together would read 2 Hkv streams.
    if (p.Hkv > 1 && p.k_head > p.k_row && p.v_head > p.v_row) m.heads_per_item = 1;
    m.copy_tiles = decode_copies_tiles() && p.Hkv > 1 && p.k_head <= p.k_row && p.v_head <= p.v_row;
    // CopyLayout: one cache line after each head's rows, so that the rows of one position (one
    // per head, written one after the other) fall in different L1 sets.
    const auto es = static_cast<int64_t>(sizeof(Tc));
    m.kcopy_head = kDecodeTile * m.Epad + 64 / es;
    m.vcopy_head = kDecodeTile * m.Evpad + 64 / es;
    m.copy_bytes =
        flash::round_up(std::max(m.kcopy_head, m.vcopy_head) * m.heads_per_item * es, int64_t{64});
#ifdef SDPA_DECODE_PAIRS
    m.pairs = std::is_same_v<Tc, hwy::bfloat16_t> && p.q_bf16 != nullptr && p.E % 32 == 0 &&
              p.Ev % 64 == 0;
#endif
    m.page_rows = decode_page_rows(p.Hkv, p.E, p.Ev);
    m.far_prefetch = m.page_rows == 1 && cpu_vendor() != CpuVendor::intel;
    // Measured on Intel only (docs/kernel.md, "Page order"): attention_forward at L 1 over
    // head-major K/V (one kv head per item) 1.13x float32, 1.32x bfloat16; the KV cache at Hkv 1
    // 0.99-1.00x.
    m.near_one_head = cpu_vendor() == CpuVendor::intel;
  }
  m.rows_per_item = m.heads_per_item * m.G * m.L;
  const int64_t rows = p.Hq * p.L;  // rows of one partial slot (every head of one chunk)

  // Items in a fixed order: sequence, chunk, head group; slot = the (sequence, chunk) partial.
  std::vector<Item> items;
  std::vector<int64_t> first(static_cast<size_t>(p.batch) + 1, 0),
      chunks(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t S = p.seq_lens[static_cast<size_t>(b)];
    const int64_t c = decode_chunk_keys(S);
    const int64_t n = std::max<int64_t>(1, flash::ceil_div(S, c));
    chunks[static_cast<size_t>(b)] = n;
    first[static_cast<size_t>(b) + 1] = first[static_cast<size_t>(b)] + n;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h0 = 0; h0 < p.Hkv; h0 += m.heads_per_item) {
        items.push_back({b, h0, std::min(m.heads_per_item, p.Hkv - h0), i * c,
                         std::min(S, (i + 1) * c), first[static_cast<size_t>(b)] + i});
      }
    }
  }
  const int64_t nitems = static_cast<int64_t>(items.size());
  const int64_t slots = first[static_cast<size_t>(p.batch)];
  Carver measure;
  measure.take<T>(static_cast<size_t>(slots * rows * m.ldv));
  measure.take<T>(static_cast<size_t>(slots * rows));
  measure.take<T>(static_cast<size_t>(slots * rows));
  Carver carve(call_shared().reserve(measure.used()));
  T* part_acc = carve.take<T>(static_cast<size_t>(slots * rows * m.ldv));
  T* part_m = carve.take<T>(static_cast<size_t>(slots * rows));
  T* part_l = carve.take<T>(static_cast<size_t>(slots * rows));

  Carver scratch_measure;
  const size_t scratch_bytes = Scratch<T>::Carve(scratch_measure, m, nullptr);
  bool failed = false;
  T* out = static_cast<T*>(p.out);
  T* lse = static_cast<T*>(p.lse);
  const int64_t G = m.G, Ev = p.Ev;
  // The work of each thread; its loops are shared among the threads of the region it runs in.
  const auto work = [&] {
    // An exception cannot leave a thread of the region: a failed allocation is recorded and
    // rethrown by the calling thread.
    void* mem = nullptr;
    try {
      mem = thread_scratch().reserve(scratch_bytes);
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
    }
    Scratch<T> w{};
    if (mem != nullptr) {
      Carver c(mem);
      Scratch<T>::Carve(c, m, &w);
      // The padding columns of the packed tile are never written by the packing: zero them once.
      if (!m.direct) {
        std::fill_n(w.kt, m.heads_per_item * kDecodeTile * m.Epad, T(0));
        std::fill_n(w.vt, m.heads_per_item * kDecodeTile * m.Evpad, T(0));
      }
      std::fill_n(w.zero, std::max(m.Epad, m.Evpad), T(0));
      for (int j = 0; j < kDecodeTile; ++j) w.iota[j] = j;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < nitems; ++i) {
      if (mem == nullptr) continue;
      const Item& it = items[static_cast<size_t>(i)];
      const int64_t row0 = it.slot * rows + it.h0 * G * p.L;
      T* a = part_acc + row0 * m.ldv;
      if constexpr (kDirectTarget) {
        if (m.direct) {
          DirectItem<T, Tc>(p, m, it, w, a, part_m + row0, part_l + row0);
          continue;
        }
      }
      DecodeItem<T, Tc, 0>(p, m, it, w, a, part_m + row0, part_l + row0);
    }
    // Merge: each output row is written by one iteration, chunks in order.
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < p.batch * p.Hq; ++bh) {
      if (failed) continue;
      const int64_t b = bh / p.Hq, h = bh % p.Hq;
      const int64_t n = chunks[static_cast<size_t>(b)];
      const int64_t base = first[static_cast<size_t>(b)];
      for (int64_t i = 0; i < p.L; ++i) {
        const int64_t r = h * p.L + i;
        T* o = out + b * p.o_sb + h * p.o_sh + i * p.o_sl;
        T* ls = lse != nullptr ? lse + b * p.lse_sb + h * p.lse_sh + i * p.lse_sl : nullptr;
        MergeRow(n, rows * m.ldv, rows, part_acc + (base * rows + r) * m.ldv,
                 part_m + base * rows + r, part_l + base * rows + r, Ev, o, ls);
      }
    }
  };
  // One thread runs the work outside any parallel region: its loops then need no barrier, and
  // each of a region's three barriers costs a futex call (libgomp), ~2 us of a short call. Not
  // when the caller is inside a region, active or not (omp_get_level() counts both): the loops
  // would bind to the caller's team, and there share out the iterations of each thread's call
  // (an active team) or, nested in the caller's own worksharing loop (a team of one thread, e.g.
  // `parallel for num_threads(1)`), be skipped after its first call.
  if (p.threads == 1 && omp_get_level() == 0) {
    work();
  } else {
#pragma omp parallel num_threads(p.threads)
    work();
  }
  if (failed) throw std::bad_alloc();
}

}  // namespace

void DecodeFloat(const DecodeProblem& p) { DecodeT<float, float>(p); }
void DecodeFloat16Cache(const DecodeProblem& p) { DecodeT<float, hwy::float16_t>(p); }
void DecodeBfloat16Cache(const DecodeProblem& p) { DecodeT<float, hwy::bfloat16_t>(p); }
void DecodeDouble(const DecodeProblem& p) { DecodeT<double, double>(p); }
// Whether x[0..n) holds no infinity and no NaN (the output rows' check in decode_forward).
bool DecodeRowFinite(const float* x, int64_t n) { return AllFinite(x, n); }
const char* DecodeTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_EXPORT(DecodeFloat);
HWY_EXPORT(DecodeFloat16Cache);
HWY_EXPORT(DecodeBfloat16Cache);
HWY_EXPORT(DecodeDouble);
HWY_EXPORT(DecodeRowFinite);
HWY_EXPORT(DecodeTargetName);

namespace {
std::atomic<DecodeTileRead> g_tile_read{DecodeTileRead::automatic};
std::atomic<DecodeKeyOrder> g_key_order{DecodeKeyOrder::automatic};

// The L1 data cache is at most 32 KiB (glibc reads it from CPUID); false when unknown.
bool small_l1_data_cache() {
  static const bool small = [] {
#ifdef _SC_LEVEL1_DCACHE_SIZE
    const long bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return bytes > 0 && bytes <= 32 * 1024;
#else
    return false;
#endif
  }();
  return small;
}
}  // namespace

DecodeTileRead set_decode_tile_read(DecodeTileRead rule) { return g_tile_read.exchange(rule); }

bool decode_copies_tiles() {
  switch (g_tile_read.load()) {
    case DecodeTileRead::copy:
      return true;
    case DecodeTileRead::in_place:
      return false;
    default:
      return small_l1_data_cache();
  }
}

DecodeKeyOrder set_decode_key_order(DecodeKeyOrder rule) { return g_key_order.exchange(rule); }

bool decode_orders_pages() {
  switch (g_key_order.load()) {
    case DecodeKeyOrder::page:
      return true;
    case DecodeKeyOrder::memory:
      return false;
    default:
      return cpu_vendor() == CpuVendor::intel;
  }
}

std::int64_t decode_page_rows(std::int64_t Hkv, std::int64_t E, std::int64_t Ev) {
  // Decided by the logical sizes alone, whatever the caches' dtype and layout or the batch's
  // other sequences, so that none of them changes a row's bits ("Page order" in decode.cpp).
  constexpr std::int64_t kPageBytes = 4096, kMaxPageRows = 16;
  const std::int64_t row_bytes16 = std::max<std::int64_t>(Hkv * std::max(E, Ev) * 2, 1);
  if (!decode_orders_pages() || row_bytes16 >= kPageBytes) return 1;
  return std::min(kPageBytes / row_bytes16, kMaxPageRows);
}

std::int64_t decode_chunk_keys(std::int64_t S) {
  const std::int64_t even = flash::ceil_div(std::max<std::int64_t>(S, 1), kDecodeMaxChunks);
  return flash::round_up(std::max(even, kDecodeMinChunk), kDecodeTile);
}

namespace {

// Element e of key (or value) row s of kv head hkv of sequence b, widened to double.
double cache_at(const DecodeProblem& p, const void* base, std::int64_t page_stride,
                std::int64_t row_stride, std::int64_t head_stride, std::int64_t b, std::int64_t hkv,
                std::int64_t s, std::int64_t e) {
  const std::int64_t page =
      p.block_table != nullptr ? p.block_table[b * p.max_blocks + s / p.page_size] : b;
  const std::int64_t at =
      page * page_stride + (s % p.page_size) * row_stride + hkv * head_stride + e;
  switch (p.kv_dtype) {
    case DType::float16:
      return float16_to_float(static_cast<const std::uint16_t*>(base)[at]);
    case DType::bfloat16:
      return bfloat16_to_float(static_cast<const std::uint16_t*>(base)[at]);
    default:
      return static_cast<const float*>(base)[at];
  }
}

// Row (b, h, l) of a float32 decode call recomputed in double: scores scale * q . k (mask
// added, as mask_row states), a two-pass softmax and P V, rounded once to float32. Keys with
// score -inf (invisible, masked) never touch their value rows. Serial and O(S (E + Ev)): it
// runs only for the rows that decode_forward finds suspect. scores and acc are scratch of at least
// seq_lens[b] and Ev doubles.
void exact_row(const DecodeProblem& p, std::int64_t b, std::int64_t h, std::int64_t l,
               std::vector<double>& scores, std::vector<double>& acc) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const std::int64_t n = p.seq_lens[static_cast<std::size_t>(b)];
  const std::int64_t hkv = h / (p.Hq / p.Hkv);
  const float* q =
      p.E > 0 ? static_cast<const float*>(p.q) + b * p.q_sb + h * p.q_sh + l * p.q_sl : nullptr;
  double* s = scores.data();
  if (p.mask_problem != nullptr) {
    std::fill(s, s + n, 0.0);
    flash::mask_row(*p.mask_problem, b, h, l, 0, n, n, s);
  } else {
    const std::int64_t last = p.causal == Causal::upper_left    ? l
                              : p.causal == Causal::lower_right ? l + n - p.L
                                                                : n - 1;
    for (std::int64_t j = 0; j < n; ++j) s[j] = j <= last ? 0.0 : kNegInf;
  }
  double m = kNegInf;
  bool nan = false;
  for (std::int64_t j = 0; j < n; ++j) {
    if (s[j] == kNegInf) continue;
    double dot = 0.0;
    for (std::int64_t e = 0; e < p.E; ++e) {
      dot += double(q[e]) * cache_at(p, p.k, p.k_page, p.k_row, p.k_head, b, hkv, j, e);
    }
    s[j] += p.scale * dot;
    if (std::isnan(s[j])) nan = true;
    m = std::max(m, s[j]);
  }
  std::fill(acc.begin(), acc.begin() + p.Ev, 0.0);
  double sum = 0.0;
  if (!nan && m != kNegInf) {
    for (std::int64_t j = 0; j < n; ++j) {
      if (s[j] == kNegInf) continue;
      const double w = std::exp(s[j] - m);  // m = +inf: inf - inf gives NaN, as the maths does
      sum += w;
      for (std::int64_t e = 0; e < p.Ev; ++e) {
        acc[e] += w * cache_at(p, p.v, p.v_page, p.v_row, p.v_head, b, hkv, j, e);
      }
    }
  }
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (p.Ev > 0) {
    float* out = static_cast<float*>(p.out) + b * p.o_sb + h * p.o_sh + l * p.o_sl;
    for (std::int64_t e = 0; e < p.Ev; ++e) {
      out[e] = static_cast<float>(nan ? kNaN : m == kNegInf ? 0.0 : acc[e] / sum);
    }
  }
  static_cast<float*>(p.lse)[b * p.lse_sb + h * p.lse_sh + l * p.lse_sl] =
      static_cast<float>(nan            ? kNaN
                         : m == kNegInf ? kNegInf
                                        : m + std::log(sum));
}

}  // namespace

// Float32 calls are computed in float32 and then verified, instead of bounding every
// intermediate beforehand from the inputs' magnitudes as the fused kernel's callers do
// (kernels/range.cpp): that bound reads all of K and V, as much memory as the decode itself,
// and would double its time. The verification reads only the outputs. An intermediate that
// passes float32's range leaves a trace there: a score of +inf or NaN (from scale * q, q . k or
// a mask value) makes its row's max, exp and sum NaN; an accumulator of +-inf (S values near
// 3e38) makes out non-finite; and scores that all overflow to -inf leave lse = -inf. A score
// that alone overflows to -inf while others stay finite has probability exp(-3e38) = 0 either
// way. So every row whose out is not finite or whose lse is not finite (NaN, -inf: no visible
// key, or all scores overflowed) is recomputed exactly in double (exact_row), and the others
// are the kernel's. Rows that the maths makes non-finite (NaN inputs) or empty (fully masked)
// come out of exact_row as the reference gives them.
void decode_forward(const DecodeProblem& p) {
  if (p.dtype == DType::float64) {
    HWY_DYNAMIC_DISPATCH(DecodeDouble)(p);
    return;
  }
  DecodeProblem d = p;
  if (d.kv_dtype != DType::bfloat16 || !bf16::dot_pairs_in_kernel()) d.q_bf16 = nullptr;
  std::vector<float> lse;  // lse is needed to verify, asked for or not
  if (d.lse == nullptr) {
    lse.resize(static_cast<std::size_t>(d.batch * d.Hq * d.L));
    d.lse = lse.data();
    d.lse_sb = d.Hq * d.L;
    d.lse_sh = d.L;
    d.lse_sl = 1;
  }
  std::int64_t longest = 0;
  for (const std::int64_t n : d.seq_lens) longest = std::max(longest, n);
  // Allocated before anything is written, so that a refused allocation leaves out untouched.
  std::vector<double> scores(static_cast<std::size_t>(longest)),
      acc(static_cast<std::size_t>(d.Ev));
  if (d.kv_dtype == DType::float16) {
    HWY_DYNAMIC_DISPATCH(DecodeFloat16Cache)(d);
  } else if (d.kv_dtype == DType::bfloat16) {
    HWY_DYNAMIC_DISPATCH(DecodeBfloat16Cache)(d);
  } else {
    HWY_DYNAMIC_DISPATCH(DecodeFloat)(d);
  }
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t h = 0; h < d.Hq; ++h) {
      for (std::int64_t l = 0; l < d.L; ++l) {
        bool ok = std::isfinite(
            static_cast<const float*>(d.lse)[b * d.lse_sb + h * d.lse_sh + l * d.lse_sl]);
        if (ok && d.Ev > 0) {  // an empty out may have no data at all
          ok = HWY_DYNAMIC_DISPATCH(DecodeRowFinite)(
              static_cast<const float*>(d.out) + b * d.o_sb + h * d.o_sh + l * d.o_sl, d.Ev);
        }
        if (!ok) exact_row(d, b, h, l, scores, acc);
      }
    }
  }
}

bool decode_applies(const Problem& p) {
  return p.L <= kDecodeMaxQueries && !p.variants.any() && !p.lse_over_more_keys;
}

void decode_forward(const Problem& p) {
  DecodeProblem d;
  d.dtype = p.dtype;
  d.kv_dtype = p.k.dtype;  // the same as p.v.dtype (the caller's rule, fast_reads_16bit)
  // 16-bit K and V are read where they lie, widened in registers as a 16-bit cache is. A 16-bit
  // query's few rows are widened into float32 (C order) and out is formed in float32, then
  // rounded once into its dtype. The same bits as float32 inputs holding the widened values.
  const bool half = is_16bit(p.q.dtype);
  if (is_16bit(d.kv_dtype)) d.dtype = DType::float32;
  std::vector<float> q32, out32;
  if (half) {
    q32.resize(static_cast<std::size_t>(p.B * p.Hq * p.L * p.E));
    out32.resize(static_cast<std::size_t>(p.B * p.Hq * p.L * p.Ev));
    for (std::int64_t b = 0; b < p.B; ++b) {
      for (std::int64_t h = 0; h < p.Hq; ++h) {
        for (std::int64_t l = 0; l < p.L; ++l) {
          const auto* src = p.q.row<std::uint16_t>(b, h, l);
          float* dst = q32.data() + ((b * p.Hq + h) * p.L + l) * p.E;
          for (std::int64_t e = 0; e < p.E; ++e) {
            dst[e] =
                p.q.dtype == DType::float16 ? float16_to_float(src[e]) : bfloat16_to_float(src[e]);
          }
        }
      }
    }
  }
  d.batch = p.B;
  d.Hq = p.Hq;
  d.Hkv = p.Hkv;
  d.L = p.L;
  d.E = p.E;
  d.Ev = p.Ev;
  d.scale = p.scale;
  d.causal = p.causal;
  d.threads = p.threads;
  // Every operand through its view (core/problem.h): rows of E (Ev) contiguous elements, any
  // batch, head and row strides, so (B, L, H, E) views and broadcast heads are read in place.
  d.q = half ? q32.data() : p.q.data;
  d.q_sl = half ? p.E : p.q.sl;
  d.q_sh = half ? p.L * p.E : p.q.sh;
  d.q_sb = half ? p.Hq * p.L * p.E : p.q.sb;
  d.out = half ? out32.data() : p.out.data;
  d.o_sl = half ? p.Ev : p.out.sl;
  d.o_sh = half ? p.L * p.Ev : p.out.sh;
  d.o_sb = half ? p.Hq * p.L * p.Ev : p.out.sb;
  d.lse = p.lse.data;
  d.lse_sl = p.lse.sl;
  d.lse_sh = p.lse.sh;
  d.lse_sb = p.lse.sb;
  // Keys and values: one page per sequence, holding all S rows of every head.
  d.k = p.k.data;
  d.v = p.v.data;
  d.k_row = p.k.sl;
  d.k_head = p.k.sh;
  d.k_page = p.k.sb;
  d.v_row = p.v.sl;
  d.v_head = p.v.sh;
  d.v_page = p.v.sb;
  d.page_size = std::max<std::int64_t>(p.S, 1);
  d.seq_lens.assign(static_cast<std::size_t>(p.B), p.S);
  d.mask_problem = p.mask.present ? &p : nullptr;
  decode_forward(d);
  if (!half) return;
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      for (std::int64_t l = 0; l < p.L; ++l) {
        const float* src = out32.data() + ((b * p.Hq + h) * p.L + l) * p.Ev;
        auto* dst = p.out.row<std::uint16_t>(b, h, l);
        for (std::int64_t e = 0; e < p.Ev; ++e) {
          dst[e] =
              p.out.dtype == DType::float16 ? float_to_float16(src[e]) : float_to_bfloat16(src[e]);
        }
      }
    }
  }
}

const char* decode_kernel_target() { return HWY_DYNAMIC_DISPATCH(DecodeTargetName)(); }

}  // namespace sdpa::detail
#endif  // HWY_ONCE
