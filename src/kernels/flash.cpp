// The fused attention kernel (--impl fast): FlashAttention-2 on the CPU, forward and backward.
//
// Contract (asserted by tests/kernels/test_kernels.cpp on every compiled SIMD target):
//   shapes and layout as in core/problem.h (flattened batch; every operand read and written
//   through its own batch, head and row strides, in place: the packed copies below are the
//   kernel's own, made whatever the layout, and no other copy is made); float16 and bfloat16
//   query, key, value and grad_out are widened exactly while packed and computed in float32 like
//   float32 inputs holding the same values, P kept in float32 before P V (the products run in
//   float32 anyway, so rounding P would only add error), out, dq, dk, dv rounded once to their
//   operand's dtype (nearest even), lse float32 (tests/strided/test_half_packing.cpp: the bits
//   of the float32 kernel on the widened values, rounded once), except on CPUs with
//   AVX512_BF16, where all-bfloat16 inputs multiply bfloat16 pairs on vdpbf16ps with float32
//   accumulation (the forward rounding P to bfloat16; the backward's S and dP only): see
//   "forward on bfloat16 inputs" and BackwardPairs below, tests/bf16/; float32 inputs compute in
//   float32 (float64 inputs in float64, same algorithm); masking exactly as the reference: a key
//   is visible iff the causal rule allows it and the mask's additive value is not -inf; an
//   invisible key's score is overwritten with -inf (never added to), and a tile whose values (or,
//   in the backward, keys) hold inf or NaN takes a product that skips zero probabilities, so a
//   non-finite number stored at a masked-out position never reaches a result; a row that sees
//   no key gives out = 0, lse = -inf, zero gradients. Error: out, lse, dq, dk, dv within
//   2 x the error of the naive float32 three-pass implementation (+ a floor of a few float32
//   epsilons) and within 2e-5 of the largest magnitude, against the float64 reference.
//   Results are bit-identical for any thread count: every output element is written by one
//   work item, whose order of summation does not depend on the thread that runs it.
//
// Variants (core/variants.h; FlashAttention's semantics), in both passes: the sliding window
// narrows each query tile's key tiles to [first, last] (flash::key_tiles) and each key tile's
// query tiles (flash::query_tiles), so tiles outside it are never visited, and its edges are
// masked by mask_row like the causal diagonal; softcap and ALiBi transform each row of scores
// before the mask (variants-inl.h; the backward keeps tanh for the softcap's derivative
// 1 - tanh^2 on dS); a sink joins each row's max and sum when the row is normalised (AddSink),
// so lse includes it and the backward's P = exp(S - lse) needs nothing more; its gradient is
// -sum_rows exp(sink - lse) D. Dropout multiplies P by the Philox mask of core/variants.h after
// the running sum is formed (forward), and dP and the P of dV by the same mask (backward): the
// mask is regenerated from (seed, batch, head, i, j) in every pass, never stored, so it is the
// same for any tiling and thread count.
//
// Algorithm: FlashAttention-2 (Tri Dao, "FlashAttention-2: Faster Attention with Better
// Parallelism and Work Partitioning", 2023; Algorithm 1 forward, Algorithm 2 backward), with
// the online softmax of Milakov & Gimelshein (2018). Glossary: B, Hq, Hkv, L, S, E, Ev as in
// sdpa.h; G = Hq / Hkv; Br x Bc = kQueryTile x kKeyTile = 64 x 128.
//
// Forward. Work item = (batch, kv head, block of up to four query tiles of Br rows); the item
// runs the tiles of every query head of the GQA group against each K/V tile in turn, so a K/V
// tile is read once per group and block (ForwardBlock: about four query tiles per K/V tile). Per
// key tile: S = (scale Q) K^T (micro-kernel, scores vectorised along the keys, K pre-transposed),
// softcap and ALiBi when asked, mask pass (only tiles straddling the causal diagonal or a window
// edge, the short last tile, or with a user mask), online softmax per row (running max from -inf,
// running sum, rescale of the accumulator only when the max moved), acc += P V (micro-kernel,
// vectorised along Ev). Causal tiles above the diagonal of the tile's last row, and tiles outside
// the window, are never visited, in both alignments. Items are scheduled dynamically (causal items
// differ in cost).
//
// Backward. Recompute P = exp(S - lse) from the saved lse; D = rowsum(dO * O) once per row,
// with the arithmetic of one element of the dP product (SequentialDot). A row whose lse cannot
// normalise P (|lse| > 64, or NaN, or +inf: see kLseResolvable), and every row of a
// decode-sized problem (whose forward ran on the decode kernel), first has its running max and
// sum recomputed exactly as the forward computes them (RenormaliseQueryTile, one extra product
// for its query tile only) and takes P = exp(S - m) / l. A row that sees no key
// (lse = -inf) is zeroed in the packed copies of scale * Q and dO. The work plan is a function
// of the shape alone (PlanBackward, near the end of this file):
//   one pass (B * Hkv >= 8, or a few key chunks per kv head whose partial dQ fit 16 MiB): work
//     item = (batch, kv head, chunk of key tiles); for each key tile j in order, every query
//     head of the group and every query tile i that can see j:
//     S, P, dP = dO_i V_j^T, dS = P * (dP - D); dV_j += P^T dO_i, dK_j += dS^T (scale Q_i),
//     dQ_i += dS K_j (into the item's own dQ buffer; a chunked head's partials are summed in
//     chunk order afterwards): five products per (i, j) pair, each once;
//   two passes (long single sequences, whose partials would not fit):
//     pass A, work item = (batch, kv head, key tile j), owns dK_j and dV_j, as above;
//     pass B, work item = (batch, query head, query tile i), owns dQ_i: for every visible key
//     tile, S, P, dP, dS again, dQ_i += dS K_j: S and dP computed twice (7 products instead of
//     5), so the standard FLOP count (2.5 x forward) credits it with only 5/7 of its arithmetic.
// No atomics and no reduction across threads in either plan: every output element is summed by
// one work item in an order fixed by the shape, which makes the result bit-identical for any
// thread count.
//
// Memory traffic per tiling (one kv head, float32, L = S = N; Q, K, V, O read or written once
// from memory are not repeated below):
//   forward: each query tile streams all visible K and V tiles: (N / Br) * N * (E + Ev) * 4
//     bytes; at N = 4096, E = Ev = 64, Br = 64: 134 MB for 4.3 GFLOP, 0.031 byte/flop, i.e.
//     3 GB/s per core at 100 GFLOP/s: far below L2 (~200 GB/s) and DRAM (34 GB/s per core).
//     A K/V head (2 MiB at E = 64) does not fit the 1 MiB L2, so those tiles come from L3/DRAM;
//     one K^T tile (E x Bc: 32 KiB at E = 64, 64 KiB at E = 128), the score tile (Br x Bc =
//     32 KiB), the V tile and the accumulator (G x Br x Ev: 16-32 KiB per head) together fit
//     the 1 MiB L2 many times over; the 48 KiB L1d holds the K^T tile and the row panel of the
//     micro-kernel sweeping it at E = 64 (at E = 128 the tile is served by L2, which the
//     measurements below show costs nothing visible).
//   backward, one pass: each key tile streams Q, dO (and lse, D) and the dQ rows of every
//     query tile: (N / Bc) * N * (2 E + Ev) * 4 bytes; two passes: pass A as the one pass
//     without dQ, pass B: each query tile streams K^T, V^T and K tiles:
//     (N / Br) * N * (2 E + Ev) * 4 bytes. All again ~0.03 byte/flop.
//   Larger Br or Bc cut that traffic further but grow the tiles past L1; smaller ones raise the
//   per-tile overheads (one row max, exp, sum and accumulator rescale per row per tile).
//   Never materialised: L x S. Extra memory: the packed K^T (forward; a copy of K), plus in the
//   backward V^T, scale * Q and padded copies: linear in the sequence lengths.
//
// Micro-kernel (gemm-inl.h): MR x NV = 6 x 4 vectors of C in registers on AVX-512 (24
// accumulators + 4 B vectors + 1 broadcast of 32 registers; >= 8 independent FMAs in flight
// for Zen 5's 2 pipes x 4 cycles), 6 x 2 on 16-register targets.
//
// Measurements that chose the constants (this 2-core Zen 5 VM under a load average of ~12 from
// other builds, so per-CPU-second efficiency from `sdpa bench`, 1 thread, H = 2, N = 4096; the
// same binary varies by +-5 points between runs): single runs of Br x Bc = 32x64, 64x64, 96x64,
// 48x128, 64x128, 96x128 all gave 53-70% of the FMA loop's rate on the forward (E = 64 and 128)
// and 47-52% on the backward (E = 64): no size is far off. Four alternating A/B rounds of 64x64
// against 64x128 then had 64x128 ahead in every round on the forward (medians E = 64: 59.7% vs
// 56.6%; E = 128: 64.4% vs 62.3%) and level on the backward (49.4% vs 49.2%): fewer per-tile
// overheads (row max and sum, accumulator rescale, loads and stores of the accumulator in P V)
// outweigh the L1 spill. Br = 64 leaves a 4-row remainder panel after ten 6-row panels; 96
// (= 16 x 6, no remainder) measured no better. Bc = 128 coarsens the causal skip to 128 keys
// (< 2% extra work at N = 4096).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "core/problem.h"
#include "kernels/cpu_vendor.h"
#include "kernels/decode.h"
#include "kernels/dispatch.h"
#include "kernels/flash_common.h"
#include "kernels/gemm_bf16.h"
#include "kernels/kernels.h"
#include "kernels/workspace.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/gemm-inl.h"
#include "kernels/variants-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace bf16 = sdpa::detail::bf16;
using flash::ceil_div;
using flash::kKeyTile;
using flash::kPad;
using flash::kQueryTile;
using flash::round_up;
using std::int64_t;
using std::size_t;

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// ---- storage types ----------------------------------------------------------------------------
// An operand is stored in the compute type T, or, when T is float, in float16 or bfloat16 (the
// query, key, value and grad_out inputs; out and the gradients in their input's dtype; lse is
// always T). Inputs of 16-bit types are widened, exactly, while they are packed (a vector
// PromoteTo: F16C's vcvtph2ps for float16 on AVX2 and later, a 16-bit shift for bfloat16), so
// every product, the softmax and the sums run in float32 exactly as for float32 inputs holding
// the same values; P is kept in float32 before P V. Outputs are rounded to their dtype once, to
// nearest even (core/half.h).

template <typename S>
struct Storage {
  using type = S;
};

/// Calls f(Storage<S>{}) with S the C++ type of an operand of `dtype` (T, hwy::float16_t or
/// hwy::bfloat16_t).
template <typename T, typename F>
HWY_INLINE void WithStorage(DType dtype, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (dtype == DType::float16) return f(Storage<hwy::float16_t>{});
    if (dtype == DType::bfloat16) return f(Storage<hwy::bfloat16_t>{});
  }
  f(Storage<T>{});
}

template <typename T>
bool IsComputeType(DType dtype) {
  return dtype == (std::is_same_v<T, float> ? DType::float32 : DType::float64);
}

template <typename T>
HWY_INLINE T Widen(T x) {
  return x;
}
HWY_INLINE float Widen(hwy::float16_t x) { return float16_to_float(x.bits); }
HWY_INLINE float Widen(hwy::bfloat16_t x) { return bfloat16_to_float(x.bits); }

/// x in storage type S, rounded to nearest even when S is 16-bit.
template <typename S, typename T>
HWY_INLINE S Narrow(T x) {
  if constexpr (std::is_same_v<S, hwy::float16_t>) {
    return S{float_to_float16(x)};
  } else if constexpr (std::is_same_v<S, hwy::bfloat16_t>) {
    return S{float_to_bfloat16(x)};
  } else {
    return x;
  }
}

/// dst[0..n) = factor * src[0..n), src widened to T (vectorised).
template <typename T, typename S>
HWY_INLINE void ScaledRow(const S* HWY_RESTRICT src, int64_t n, T factor, T* HWY_RESTRICT dst) {
  int64_t i = 0;
  if constexpr (!std::is_same_v<S, T>) {
    const hn::ScalableTag<T> d;
    const hn::Rebind<S, decltype(d)> ds;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto f = hn::Set(d, factor);
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Mul(f, WidenExact(d, hn::LoadU(ds, src + i))), d, dst + i);
    }
  }
  for (; i < n; ++i) dst[i] = factor * Widen(src[i]);
}

// ---- packing (once per call, shared by all threads) ------------------------------------------
// Every read of an input goes through these functions and the Rows views below, with the
// input's own row stride (src_ld: elements between consecutive rows), so that any strided
// layout is read in place.

/// Rows of a (B, H, rows, width) operand, typed: row (b, h, l) starts at data + b * sb + h * sh +
/// l * sl. Either an input where it lies (its OperandView's strides) or a packed copy (C order
/// with padded rows).
template <typename T>
struct Rows {
  const T* data = nullptr;
  int64_t sb = 0, sh = 0, sl = 0;
  const T* row(int64_t b, int64_t h, int64_t l) const { return data + b * sb + h * sh + l * sl; }
};

template <typename T>
Rows<T> RowsOf(const InputView& v) {
  return Rows<T>{static_cast<const T*>(v.data), v.sb, v.sh, v.sl};
}
/// A packed C-order copy of H heads of L rows, each row ld elements.
template <typename T>
Rows<T> PackedRows(const T* data, int64_t H, int64_t L, int64_t ld) {
  return Rows<T>{data, H * L * ld, L * ld, ld};
}

/// The row stride of an operand that the backward's products read as B over a whole key tile or
/// E rows (the transposed K and V tiles, the key rows of dQ = dS K): ld, or, where the CPU's
/// BackwardMemory spreads them, ld plus 32 bytes where ld is a multiple of 512 bytes. Rows 512
/// bytes apart (kKeyTile = 128 floats, or E = 128) put the columns of one block of B in a quarter
/// to a half of a 64-set L1's sets, more lines each than it has ways at K = 128, so that the block
/// falls out of L1 while the row panels of A pass; 32 bytes more spread the rows over every set.
/// One Zen 5 thread, gemm_f32 at M = 64, N = 128, K = 128 over 64 distinct B tiles: ld 128 187-193
/// GFLOP/s, 136 206-208, 144 199-204 (peak 216). The whole kernel, calls alternating in one
/// process, 2 Zen 5 threads: backward at (1, 8, 4096, 128) 1.010-1.018x (the AVX2 code 1.012x), at
/// E = 64 1.002x; the forward between 0.991x and 1.006x, so its K tiles keep the plain stride. On
/// an Intel Xeon the backward at (1, 8, 4096, 64) ran 0.97x with the spread strides
/// (flash::backward_memory).
template <typename T>
constexpr int64_t SpreadLd(int64_t ld, bool spread) {
  constexpr auto size = static_cast<int64_t>(sizeof(T));
  return spread && (ld * size) % 512 == 0 ? ld + 32 / size : ld;
}

/// dst[e * dst_ld + c] = src[(s0 + c) * src_ld + e] for c < kc, 0 for kc <= c < kKeyTile: one key
/// tile transposed so that the scores of a query row are a sum over e of q[e] *
/// dst[e][0..kKeyTile), vectorised along the keys. A 16-bit S is widened a block at a time with
/// vector conversions (F16C's vcvtph2ps, a shift for bfloat16) into a small buffer that the
/// transposition then reads: converting element by element in the transposing loop (core/half.h's
/// scalar conversion) made the float16 forward slower than the float32 one at (1, 8, 4096, 128).
template <typename T, typename S>
void TransposeTile(const S* src, int64_t src_ld, int64_t width, int64_t s0, int64_t kc, T* dst,
                   int64_t dst_ld) {
  if constexpr (std::is_same_v<S, T>) {
    for (int64_t e = 0; e < width; ++e) {
      T* d = dst + e * dst_ld;
      for (int64_t c = 0; c < kc; ++c) d[c] = src[(s0 + c) * src_ld + e];
      for (int64_t c = kc; c < kKeyTile; ++c) d[c] = T(0);
    }
  } else {
    constexpr int64_t kRows = 16, kCols = 256;  // 16 KiB of float32 on the stack
    T block[kRows * kCols];
    for (int64_t e0 = 0; e0 < width; e0 += kCols) {
      const int64_t ew = std::min(kCols, width - e0);
      for (int64_t c0 = 0; c0 < kc; c0 += kRows) {
        const int64_t cw = std::min(kRows, kc - c0);
        for (int64_t c = 0; c < cw; ++c) {
          ScaledRow(src + (s0 + c0 + c) * src_ld + e0, ew, T(1), block + c * kCols);
        }
        for (int64_t e = 0; e < ew; ++e) {
          T* d = dst + (e0 + e) * dst_ld + c0;
          for (int64_t c = 0; c < cw; ++c) d[c] = block[c * kCols + e];
        }
      }
      for (int64_t e = e0; e < e0 + ew; ++e)
        std::fill(dst + e * dst_ld + kc, dst + e * dst_ld + kKeyTile, T(0));
    }
  }
}

/// dst[r][0..ld) = factor * src[r * src_ld + 0..width) (widened to T) followed by zeros.
template <typename T, typename S>
void CopyRowsPadded(const S* src, int64_t src_ld, int64_t rows, int64_t width, T factor, int64_t ld,
                    T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const S* s = src + r * src_ld;
    if constexpr (std::is_same_v<S, T>) {
      for (int64_t e = 0; e < width; ++e) dst[r * ld + e] = factor * s[e];
    } else {
      ScaledRow(s, width, factor, dst + r * ld);
    }
    for (int64_t e = width; e < ld; ++e) dst[r * ld + e] = T(0);
  }
}

/// CopyRowsPadded from rows (b, h, l0 .. l0 + rows) of input view v, of v's storage type.
template <typename T>
void PackRows(const InputView& v, int64_t b, int64_t h, int64_t l0, int64_t rows, int64_t width,
              T factor, int64_t ld, T* dst) {
  WithStorage<T>(v.dtype, [&](auto st) {
    using S = typename decltype(st)::type;
    CopyRowsPadded(v.row<S>(b, h, l0), v.sl, rows, width, factor, ld, dst);
  });
}

/// The output row (b, h, l) of view o = src[0..n) * factor, rounded to o's dtype.
template <typename T>
void StoreRow(const OutputView& o, int64_t b, int64_t h, int64_t l, const T* src, int64_t n,
              T factor) {
  WithStorage<T>(o.dtype, [&](auto st) {
    using S = typename decltype(st)::type;
    S* d = o.row<S>(b, h, l);
    int64_t e = 0;
#if HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
    // Two nested tests: clang checks the non-dependent body of a generic lambda's discarded
    // branch once T is known, so T's test must be a branch of its own.
    if constexpr (std::is_same_v<T, float>) {
      if constexpr (std::is_same_v<S, hwy::float16_t>) {
        // F16C's vcvtps2ph rounds to nearest even and quiets NaN keeping the top payload bits,
        // as core/half.h's float_to_float16 does (the scalar loop was ~1% of a float16 forward).
        const hn::ScalableTag<float> df;
        const hn::Rebind<hwy::float16_t, decltype(df)> dh;
        const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
        const auto f = hn::Set(df, factor);
        for (; e + lanes <= n; e += lanes) {
          hn::StoreU(hn::DemoteTo(dh, hn::Mul(hn::LoadU(df, src + e), f)), dh, d + e);
        }
      }
    }
#endif
    for (; e < n; ++e) d[e] = Narrow<S>(src[e] * factor);
  });
}

/// True when every element of row (b, h, l) of input view v (width elements) is finite.
template <typename T>
bool RowFinite(const InputView& v, int64_t b, int64_t h, int64_t l, int64_t width) {
  bool finite = true;
  WithStorage<T>(v.dtype, [&](auto st) {
    using S = typename decltype(st)::type;
    const S* x = v.row<S>(b, h, l);
    if constexpr (std::is_same_v<S, T>) {
      finite = AllFinite(x, width);
    } else {
      for (int64_t e = 0; e < width && finite; ++e) finite = std::isfinite(Widen(x[e]));
    }
  });
  return finite;
}

/// True when every element of rows x[r * ld + 0..width), r < rows, is finite.
template <typename T>
bool AllFiniteRows(const T* x, int64_t ld, int64_t rows, int64_t width) {
  if (ld == width || rows <= 1) return AllFinite(x, rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    if (!AllFinite(x + r * ld, width)) return false;
  }
  return true;
}

// Inside a parallel region an exception cannot leave a thread: scratch allocation failures are
// recorded and rethrown by the calling thread after the region.
struct RegionError {
  bool failed = false;
  void* reserve(size_t bytes) {
    try {
      return thread_scratch().reserve(bytes);
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
      return nullptr;
    }
  }
};

// ---- the online softmax of a tile's rows --------------------------------------------------------

// The online softmax of FlashAttention-2 (Dao 2023, Algorithm 1, lines 8-10) over one key tile,
// for rows [0, rows) of the score tile s (row stride kKeyTile): each row's masked scores S_j
// become P_j = exp(S_j - m_new), and its running max m[r] and sum l[r] move on,
//   m_new = max(m, rowmax(S_j))     l = exp(m - m_new) * l + rowsum(P_j),
// and the row of acc (stride ldv, when given) is multiplied by exp(m - m_new) when any row of
// its vector needs it (a factor of 1 changes no bit). m starts at -inf and l at 0; while a row
// sees nothing, m stays -inf and P_j is 0 (exp(-inf - -inf) would be NaN). m[] and l[] have room
// for `rows` rounded up to the lanes, every entry initialised.
// N rows go at a time as the N lanes of one vector: each row's lane-wise maximum, then one
// LaneTree turns the N rows' vectors into the vector of their maxima (and another their sums),
// so that m, l and the factors exp(m - m_new) are computed lane-wise, with no horizontal
// reduction and no branch per row. Each row's result depends on its own scores only, never on
// the rows that share its vector.
// NaN: x86's max drops NaN, and the maximum does not look for it; instead P = exp(S - m_new)
// keeps NaN (kKeepNaN), so a NaN score makes its row's sum l NaN, which then stays NaN, and the
// row's out and lse NaN, as the maths says. A tile that leaves a row with nothing visible yet
// (m_new = -inf: no P is computed) is scanned for NaN instead.
template <typename T>
HWY_INLINE void OnlineSoftmaxRows(T* HWY_RESTRICT s, int64_t rows, T* HWY_RESTRICT m,
                                  T* HWY_RESTRICT l, T* HWY_RESTRICT acc, int64_t ldv) {
  const hn::ScalableTag<T> d;
  using V = hn::Vec<decltype(d)>;
  constexpr size_t N = hn::MaxLanes(d);
  const V neg_inf = hn::Set(d, kNegInf<T>), one = hn::Set(d, T(1));
  for (int64_t r0 = 0; r0 < rows; r0 += static_cast<int64_t>(N)) {
    const auto nr = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(N), rows - r0));
    T* HWY_RESTRICT s0 = s + r0 * kKeyTile;
    V part[N];
    for (size_t r = 0; r < N; ++r)
      part[r] = r < nr ? LaneMax(d, s0 + r * kKeyTile, kKeyTile) : neg_inf;
    const V m_old = hn::LoadU(d, m + r0);
    const V m_new = hn::Max(m_old, LaneTree<N, /*kMax=*/true>::Run(d, part));
    hn::StoreU(m_new, d, m + r0);
    V sum[N];
    for (size_t r = 0; r < N; ++r) {
      sum[r] = hn::Zero(d);
      if (r >= nr) continue;
      T* HWY_RESTRICT row = s0 + r * kKeyTile;
      const T shift = m[r0 + static_cast<int64_t>(r)];
      if (shift == kNegInf<T>) {  // nothing visible yet: P = 0, l stays 0 unless NaN is seen
        if (std::any_of(row, row + kKeyTile, [](T x) { return std::isnan(x); })) {
          sum[r] = hn::Set(d, std::numeric_limits<T>::quiet_NaN());
        }
        std::fill_n(row, kKeyTile, T(0));
        continue;
      }
      ExpShiftRow</*kNonPositive=*/true, T, /*kKeepNaN=*/true>(row, kKeyTile, shift, &sum[r]);
    }
    // exp(m_old - m_new) is 0 when m_old = -inf (the accumulator is 0 then), 1 when the max did
    // not move, and taken as 1 while nothing is visible (-inf - -inf).
    const V alpha = hn::IfThenElse(
        hn::Eq(m_new, neg_inf), one,
        ExpSoftmax</*kNonPositive=*/true, /*kKeepNaN=*/true>(d, hn::Sub(m_old, m_new)));
    hn::StoreU(hn::MulAdd(hn::LoadU(d, l + r0), alpha, LaneTree<N>::Run(d, sum)), d, l + r0);
    if (acc != nullptr && !hn::AllTrue(d, hn::Eq(alpha, one))) {
      T factor[N];
      hn::StoreU(alpha, d, factor);
      for (size_t r = 0; r < nr; ++r)
        ScaleRow(acc + (r0 + static_cast<int64_t>(r)) * ldv, ldv, factor[r]);
    }
  }
}

// A sink joins a row's denominator: with the row's running max m and sum l, the new max is
// M = max(m, sink) and the sum l exp(m - M) + exp(sink - M); the accumulator (summed under
// exp(. - m)) is then normalised by inv = exp(m - M) / l'. On return m = M, l = l', so that
// lse = m + log(l). NaN rows stay NaN.
template <typename T>
HWY_INLINE void AddSink(T sink, T& m, T& l, T& inv) {
  if (std::isnan(m)) return;
  const T top = std::max(m, sink);
  const T a = std::exp(m - top);
  l = l * a + std::exp(sink - top);
  inv = a / l;
  m = top;
}

/// P[c] *= factor[c] for c < kc: factor[c] = z[c] / (1 - p') for keys s0 + c of the row (z from
/// Philox, p' = p rounded to a multiple of 2^-16, see core/variants.h; DropoutFactors).
template <typename T>
HWY_INLINE void ApplyDropout(int64_t kc, const T* HWY_RESTRICT factor, T* HWY_RESTRICT row) {
  for (int64_t c = 0; c < kc; ++c) row[c] *= factor[c];
}
static_assert(kKeyTile <= kMaxDropoutKeys, "DropoutFactors serves one key tile at a time");

// ---- forward ---------------------------------------------------------------------------------

template <typename T>
struct ForwardShared {
  const T* kt;  // [B*Hkv][nkt][E][kKeyTile]: key tiles, transposed, zero-padded
  Rows<T> v;    // (B, Hkv, S) value rows: the input where it lies when ldv == Ev, else padded
  int64_t ldv;  // Ev rounded up to 64 bytes: the columns of the P V product
  const uint8_t* v_unsafe;  // [B*Hkv][nkt]: 1 when the value tile holds inf or NaN
  int64_t nkt;
};

// A work item of the forward covers `block` (<= kMaxForwardBlock) consecutive query tiles
// (ForwardQueryBlock) and the G heads of the group: block * G slots, each one query tile of one
// head.
inline constexpr int64_t kMaxForwardBlock = 4;
template <typename T>
struct ForwardScratch {
  T* qs;    // [slots][kQueryTile][E]: the query tile of each slot, times scale
  T* s;     // [kQueryTile][kKeyTile]: scores, then probabilities
  T* acc;   // [slots][kQueryTile][ldv]: unnormalised output
  T* rmax;  // [slots][kQueryTile]: running max of the scores (m in FlashAttention-2)
  T* rsum;  // [slots][kQueryTile]: running sum of exp(score - m) (l in FlashAttention-2)
  T* drop;  // [kKeyTile]: one row's dropout factors

  static size_t Carve(Carver& c, const Problem& p, int64_t ldv, int64_t block,
                      ForwardScratch* out) {
    const auto g = static_cast<size_t>(p.group * block);
    ForwardScratch w;
    w.qs = c.take<T>(g * kQueryTile * static_cast<size_t>(p.E));
    w.s = c.take<T>(kQueryTile * kKeyTile);
    w.acc = c.take<T>(g * kQueryTile * static_cast<size_t>(ldv));
    w.rmax = c.take<T>(g * kQueryTile);
    w.rsum = c.take<T>(g * kQueryTile);
    w.drop = c.take<T>(kKeyTile);
    if (out != nullptr) *out = w;
    return c.used();
  }
};

// acc[rows][ldv] += P[rows][kc] V[kc][ldv] (P with row stride kKeyTile, V with row stride v_ld);
// v_unsafe: the value tile holds inf or NaN, so zero probabilities are skipped.
template <typename T>
HWY_INLINE void AccumulatePV(int64_t rows, int64_t ldv, int64_t kc, const T* P, const T* v,
                             int64_t v_ld, bool v_unsafe, T* acc) {
  if (v_unsafe) {
    GemmSkipZeros(rows, ldv, kc, P, kKeyTile, 1, v, v_ld, acc, ldv);
  } else {
    Gemm<true>(rows, ldv, kc, P, kKeyTile, 1, v, v_ld, acc, ldv);
  }
}

// Query tiles i0 .. i0 + block (rows l0 .. l0 + rows each, of every query head that reads
// key/value head hkv) against all the key tiles they can see: per key tile j, for each tile and
// head, S_j = (scale * Q) K_j^T + mask, then OnlineSoftmaxRows, then acc = exp(m - m_new) * acc +
// P_j V_j; at the end out = acc / l and lse = m + log(l). Every row's arithmetic is the same for
// any block: the block only decides how many query tiles use a K/V tile while it is in cache.
template <typename T>
void ForwardQueryBlock(const Problem& p, const ForwardShared<T>& sh, const ForwardScratch<T>& w,
                       int64_t b, int64_t hkv, int64_t i0, int64_t block) {
  const int64_t G = p.group, E = p.E, Ev = p.Ev, ldv = sh.ldv, S = p.S;
  const int64_t bh = b * p.Hkv + hkv;
  const Variants& var = p.variants;
  const T scale = static_cast<T>(p.scale);
  const int64_t nqt = ceil_div(p.L, kQueryTile);
  const int64_t nb = std::min(block, nqt - i0);
  // Causal and window: key tiles outside the reach of every row of a tile are never visited.
  flash::TileSpan tiles[kMaxForwardBlock];
  flash::TileSpan all{sh.nkt, 0};  // the union of the tiles' spans
  for (int64_t t = 0; t < nb; ++t) {
    const int64_t l0 = (i0 + t) * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
    tiles[t] = flash::key_tiles(p, l0, rows, kKeyTile);
    if (tiles[t].begin < tiles[t].end) {
      all.begin = std::min(all.begin, tiles[t].begin);
      all.end = std::max(all.end, tiles[t].end);
    }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hkv * G + g, slot = t * G + g;
      PackRows(p.q, b, h, l0, rows, E, scale, E, w.qs + slot * kQueryTile * E);
      std::fill_n(w.rmax + slot * kQueryTile, kQueryTile, kNegInf<T>);
      std::fill_n(w.rsum + slot * kQueryTile, kQueryTile, T(0));
      std::fill_n(w.acc + slot * kQueryTile * ldv, rows * ldv, T(0));
    }
  }

  for (int64_t j = all.begin; j < all.end; ++j) {
    const int64_t s0 = j * kKeyTile, kc = std::min(kKeyTile, S - s0);
    const T* kt = sh.kt + (bh * sh.nkt + j) * E * kKeyTile;
    const T* v = sh.v.row(b, hkv, s0);
    const int64_t v_ld = sh.v.sl;
    const bool v_unsafe = sh.v_unsafe[bh * sh.nkt + j] != 0;
    for (int64_t t = 0; t < nb; ++t) {
      if (j < tiles[t].begin || j >= tiles[t].end) continue;
      const int64_t l0 = (i0 + t) * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
      // Only tiles that straddle the diagonal or a window edge, the last (short) tile, or a
      // user mask need the per-element masking pass.
      const bool masked = flash::tile_needs_mask(p, l0, rows, s0, kc, kKeyTile);
      const flash::ColumnSpan cols = flash::visible_columns(p, l0, rows, s0, kc, kKeyTile, kPad<T>);
      for (int64_t g = 0; g < G; ++g) {  // GQA: this K/V tile serves every head of the group
        const int64_t h = hkv * G + g, slot = t * G + g;
        T* acc = w.acc + slot * kQueryTile * ldv;
        T* rmax = w.rmax + slot * kQueryTile;
        T* rsum = w.rsum + slot * kQueryTile;
        // pass 1: S = (scale * Q) K^T, on the columns some row sees (flash::visible_columns)
        Gemm<false>(rows, static_cast<size_t>(cols.end - cols.begin), E,
                    w.qs + slot * kQueryTile * E, E, 1, kt + cols.begin, kKeyTile, w.s + cols.begin,
                    kKeyTile);
        // pass 2: mask, running max, P = exp(S - m), running sum, rescale acc
        if (var.transforms_scores() || masked) {
          for (int64_t r = 0; r < rows; ++r) {
            T* srow = w.s + r * kKeyTile;
            if (var.transforms_scores()) {
              TransformScoresRow(p, b, h, l0 + r, s0, srow, kKeyTile, static_cast<T*>(nullptr));
            }
            if (masked) flash::mask_row(p, b, h, l0 + r, s0, kc, kKeyTile, srow);
          }
        }
        OnlineSoftmaxRows(w.s, rows, rmax, rsum, acc, ldv);
        // Dropout acts on P V only: the running sum l above is the softmax's own.
        if (var.dropout()) {
          for (int64_t r = 0; r < rows; ++r) {
            DropoutFactors(var, b, h, l0 + r, s0, kc, w.drop);
            ApplyDropout(kc, w.drop, w.s + r * kKeyTile);
          }
        }
        // pass 3: acc += P V (P is 0 outside the visible columns: skipping it changes no bit)
        AccumulatePV(rows, ldv, std::min(kc, cols.end) - cols.begin, w.s + cols.begin,
                     v + cols.begin * v_ld, v_ld, v_unsafe, acc);
      }
    }
  }

  const bool want_lse = p.lse.data != nullptr;
  for (int64_t t = 0; t < nb; ++t) {
    const int64_t l0 = (i0 + t) * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hkv * G + g, slot = t * G + g;
      const T sink = var.sinks != nullptr ? static_cast<T>(var.sinks[h]) : kNegInf<T>;
      for (int64_t r = 0; r < rows; ++r) {
        const T* acc = w.acc + (slot * kQueryTile + r) * ldv;
        T l = w.rsum[slot * kQueryTile + r], m = w.rmax[slot * kQueryTile + r];
        if (l == T(0)) {  // no visible key: out = 0, lse = -inf (the sink's logit with one)
          StoreRow(p.out, b, h, l0 + r, acc, Ev, T(0));
          if (want_lse) *p.lse.row<T>(b, h, l0 + r) = sink;
          continue;
        }
        T inv = T(1) / l;
        if (var.sinks != nullptr) AddSink(sink, m, l, inv);
        StoreRow(p.out, b, h, l0 + r, acc, Ev, inv);
        if (want_lse) *p.lse.row<T>(b, h, l0 + r) = m + std::log(l);
      }
    }
  }
}

// One key tile of key/value head (b, hkv), keys s0 .. s0 + kc, transposed and zero-padded into
// dst [E][dst_ld]; the key's own strides are read.
template <typename T>
void PackKeyTile(const Problem& p, int64_t b, int64_t hkv, int64_t s0, int64_t kc, T* dst,
                 int64_t dst_ld) {
  WithStorage<T>(p.k.dtype, [&](auto st) {
    using S = typename decltype(st)::type;
    TransposeTile(p.k.row<S>(b, hkv, 0), p.k.sl, p.E, s0, kc, dst, dst_ld);
  });
}

// Query tiles per forward work item: enough that each K/V tile serves kForwardReuse query
// tiles (the G heads of a GQA group count) while it is in L1/L2, halved while that would leave
// fewer than four items per thread. One thread of an AVX2 core with a 512 KiB L2 (AMD EPYC family
// 23), one query tile against all 32 key tiles of a head at E = 64 / 128 with the softmax: 72.4
// / 75.5% of the FMA peak with one tile per K/V tile, 75.2 / 79.5% with two, 81.6% (E = 128) with
// four (medians of 60 interleaved runs). The block never changes a row's arithmetic.
inline constexpr int64_t kForwardReuse = 4;
static_assert(kForwardReuse <= kMaxForwardBlock);
inline int64_t ForwardBlock(const Problem& p, int64_t BH, int64_t nqt) {
  int64_t block = std::max<int64_t>(1, kForwardReuse / p.group);
  block = std::min(block, nqt);
  while (block > 1 && BH * ceil_div(nqt, block) < 4 * int64_t{p.threads}) block /= 2;
  const int forced = flash::forward_block_for_test.load(std::memory_order_relaxed);
  if (forced >= 1) block = std::min<int64_t>(forced, kMaxForwardBlock);
  return block;
}

template <typename T>
void ForwardT(const Problem& p) {
  const int64_t BH = p.B * p.Hkv, S = p.S, E = p.E, Ev = p.Ev;
  const int64_t nkt = ceil_div(S, kKeyTile), nqt = ceil_div(p.L, kQueryTile);
  const int64_t ldv = round_up(Ev, kPad<T>);
  const bool v_in_place = ldv == Ev && IsComputeType<T>(p.v.dtype);

  Carver measure;
  measure.take<T>(static_cast<size_t>(BH * nkt * E * kKeyTile));
  if (!v_in_place) measure.take<T>(static_cast<size_t>(BH * S * ldv));
  measure.take<uint8_t>(static_cast<size_t>(BH * nkt));
  Carver carve(call_shared().reserve(measure.used()));
  T* kt = carve.take<T>(static_cast<size_t>(BH * nkt * E * kKeyTile));
  T* vp = v_in_place ? nullptr : carve.take<T>(static_cast<size_t>(BH * S * ldv));
  uint8_t* v_unsafe = carve.take<uint8_t>(static_cast<size_t>(BH * nkt));
  const ForwardShared<T> sh{.kt = kt,
                            .v = v_in_place ? RowsOf<T>(p.v) : PackedRows<T>(vp, p.Hkv, S, ldv),
                            .ldv = ldv,
                            .v_unsafe = v_unsafe,
                            .nkt = nkt};

  const int64_t block = ForwardBlock(p, BH, nqt);
  const int64_t items = BH * ceil_div(nqt, block);
  Carver scratch_measure;
  const size_t scratch_bytes = ForwardScratch<T>::Carve(scratch_measure, p, ldv, block, nullptr);
  RegionError err;
#pragma omp parallel num_threads(p.threads)
  {
    // Pack the key tiles (transposed) and, when Ev is not a multiple of 64 bytes, the values.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < BH * nkt; ++t) {
      const int64_t bh = t / nkt, s0 = (t % nkt) * kKeyTile, kc = std::min(kKeyTile, S - s0);
      const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv;
      PackKeyTile(p, b, hkv, s0, kc, kt + t * E * kKeyTile, kKeyTile);
      if (!v_in_place) PackRows(p.v, b, hkv, s0, kc, Ev, T(1), ldv, vp + (bh * S + s0) * ldv);
      const T* vread = sh.v.row(b, hkv, s0);  // what the P V product reads
      v_unsafe[t] = AllFiniteRows(vread, sh.v.sl, kc, Ev) ? 0 : 1;
    }
    void* mem = err.reserve(scratch_bytes);
    ForwardScratch<T> w{};
    if (mem != nullptr) {
      Carver c(mem);
      ForwardScratch<T>::Carve(c, p, ldv, block, &w);
    }
    // Blocks of query tiles of all (batch, kv head) pairs; dynamic because causal tiles differ
    // in cost.
    const int64_t per_head = items / BH;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (mem == nullptr) continue;
      const int64_t bh = item / per_head;
      ForwardQueryBlock(p, sh, w, bh / p.Hkv, bh % p.Hkv, (item % per_head) * block, block);
    }
  }
  if (err.failed) throw std::bad_alloc();
}

// ---- forward on bfloat16 inputs with vdpbf16ps -------------------------------------------------
// The float32 forward's algorithm with both products on bfloat16 pairs (kernels/gemm_bf16.h),
// run only where bf16::pairs_in_kernel() (elsewhere bfloat16 inputs are converted to float32 and
// take ForwardT<float>). Arithmetic: each product of two bfloat16 is exact in float32 and
// accumulates in float32; S = scale * (Q K^T) (the scale is applied to the float32 product, not
// rounded into Q); the softmax (max, exp, sum, rescale) is float32 as in ForwardT; P is rounded to
// bfloat16 before P V, as FlashAttention-2 and PyTorch's CPU flash kernel round it to the input
// type, while the row sum l is taken over the unrounded P (as they do): that halves the P V
// product's cost, and the rounding (relative 2^-9 per probability, independent across keys) stays
// within the error of the naive bfloat16 implementation, which stores P in bfloat16 too. out is
// rounded to bfloat16 once, at the end; lse is float32. vdpbf16ps treats bfloat16 denormals
// (below 2^-126) as zero, far below any score or value that moves a bfloat16 result.
// Packed per call: K^T tiles as pairs along E ([B*Hkv][nkt][E2][kKeyTile], E2 = ceil(E / 2))
// and V tiles as pairs of rows ([B*Hkv][nkt][kKeyTile / 2][ldv]); per query tile: Q as pairs.

struct ForwardSharedBf16 {
  const uint32_t* kt;       // [B*Hkv][nkt][E2][kKeyTile]
  const uint32_t* vp;       // [B*Hkv][nkt][kKeyTile / 2][ldv]
  const uint8_t* v_unsafe;  // [B*Hkv][nkt]: 1 when the value tile holds inf or NaN
  int64_t E2, ldv, nkt;
};

struct ForwardScratchBf16 {
  uint32_t* q;  // [group][kQueryTile][E2]: the query tile of each head, as pairs
  float* s;     // [kQueryTile][kKeyTile]: scores, then probabilities
  uint32_t* p;  // [kQueryTile][kKeyTile / 2]: the probabilities rounded to bfloat16
  float* vf;    // [kKeyTile][ldv]: a value tile in float32 (only for tiles holding inf or NaN)
  float* acc;   // [group][kQueryTile][ldv]: unnormalised output
  float* rmax;  // [group][kQueryTile]
  float* rsum;  // [group][kQueryTile]

  static size_t Carve(Carver& c, const Problem& p, int64_t E2, int64_t ldv,
                      ForwardScratchBf16* out) {
    const auto g = static_cast<size_t>(p.group);
    ForwardScratchBf16 w;
    w.q = c.take<uint32_t>(g * kQueryTile * static_cast<size_t>(E2));
    w.s = c.take<float>(kQueryTile * kKeyTile);
    w.p = c.take<uint32_t>(kQueryTile * kKeyTile / 2);
    w.vf = c.take<float>(kKeyTile * static_cast<size_t>(ldv));
    w.acc = c.take<float>(g * kQueryTile * static_cast<size_t>(ldv));
    w.rmax = c.take<float>(g * kQueryTile);
    w.rsum = c.take<float>(g * kQueryTile);
    if (out != nullptr) *out = w;
    return c.used();
  }
};

/// True when every bfloat16 x[0..n) is finite (exponent bits not all ones).
inline bool AllFiniteBf16(const uint16_t* x, int64_t n) {
  uint16_t any = 0;
  for (int64_t i = 0; i < n; ++i) any |= static_cast<uint16_t>((x[i] & 0x7f80u) == 0x7f80u);
  return any == 0;
}

// ForwardQueryBlock on bfloat16 operands, one query tile per item: the same passes, the same
// masking and online softmax.
void ForwardQueryTileBf16(const Problem& p, const ForwardSharedBf16& sh,
                          const ForwardScratchBf16& w, int64_t b, int64_t hkv, int64_t i) {
  const int64_t G = p.group, E = p.E, E2 = sh.E2, Ev = p.Ev, ldv = sh.ldv, S = p.S;
  const int64_t l0 = i * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
  const int64_t bh = b * p.Hkv + hkv;
  const int64_t last_key = std::min(S - 1, p.last_causal_key(l0 + rows - 1));
  const int64_t tiles = last_key < 0 ? 0 : last_key / kKeyTile + 1;
  const auto scale = static_cast<float>(p.scale);
  const auto n = [](int64_t x) { return static_cast<size_t>(x); };

  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hkv * G + g;
    bf16::pack_rows(p.q.row<uint16_t>(b, h, l0), n(rows), n(E), n(p.q.sl),
                    w.q + g * kQueryTile * E2, n(E2));
    std::fill_n(w.rmax + g * kQueryTile, kQueryTile, kNegInf<float>);
    std::fill_n(w.rsum + g * kQueryTile, kQueryTile, 0.0f);
    std::fill_n(w.acc + g * kQueryTile * ldv, rows * ldv, 0.0f);
  }

  for (int64_t j = 0; j < tiles; ++j) {
    const int64_t s0 = j * kKeyTile, kc = std::min(kKeyTile, S - s0), kc2 = (kc + 1) / 2;
    const bool masked = p.mask.present || kc < kKeyTile ||
                        (p.causal != Causal::none && s0 + kc - 1 > p.last_causal_key(l0));
    const uint32_t* kt = sh.kt + (bh * sh.nkt + j) * E2 * kKeyTile;
    const uint32_t* vp = sh.vp + (bh * sh.nkt + j) * (kKeyTile / 2) * ldv;
    const bool v_unsafe = sh.v_unsafe[bh * sh.nkt + j] != 0;
    if (v_unsafe) {  // the tile in float32, for the product that skips zero probabilities
      for (int64_t c = 0; c < kc; ++c) {
        const uint16_t* vr = p.v.row<uint16_t>(b, hkv, s0 + c);
        for (int64_t e = 0; e < Ev; ++e) w.vf[c * ldv + e] = bf16::to_float(vr[e]);
        std::fill(w.vf + c * ldv + Ev, w.vf + (c + 1) * ldv, 0.0f);
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hkv * G + g;
      float* acc = w.acc + g * kQueryTile * ldv;
      float* rmax = w.rmax + g * kQueryTile;
      float* rsum = w.rsum + g * kQueryTile;
      // pass 1: S = scale * (Q K^T)
      bf16::gemm(false, n(rows), n(kKeyTile), n(E2), scale, w.q + g * kQueryTile * E2, n(E2), kt,
                 n(kKeyTile), w.s, n(kKeyTile));
      // pass 2: mask, running max, P = exp(S - m), running sum, rescale acc
      if (masked) {
        for (int64_t r = 0; r < rows; ++r) {
          flash::mask_row(p, b, h, l0 + r, s0, kc, kKeyTile, w.s + r * kKeyTile);
        }
      }
      OnlineSoftmaxRows(w.s, rows, rmax, rsum, acc, ldv);
      // pass 3: acc += bf16(P) V
      bf16::pack_rows_rounded(w.s, n(rows), n(kc), n(kKeyTile), w.p, n(kKeyTile / 2));
      if (v_unsafe) {
        for (int64_t r = 0; r < rows; ++r) {
          float* srow = w.s + r * kKeyTile;
          for (int64_t c = 0; c < kc; ++c) srow[c] = bf16::to_float(bf16::from_float(srow[c]));
        }
        GemmSkipZeros(rows, ldv, kc, w.s, kKeyTile, 1, w.vf, ldv, acc, ldv);
      } else {
        bf16::gemm(true, n(rows), n(ldv), n(kc2), 1.0f, w.p, n(kKeyTile / 2), vp, n(ldv), acc,
                   n(ldv));
      }
    }
  }

  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hkv * G + g;
    for (int64_t r = 0; r < rows; ++r) {
      const float* acc = w.acc + (g * kQueryTile + r) * ldv;
      const float l = w.rsum[g * kQueryTile + r];
      uint16_t* o = p.out.row<uint16_t>(b, h, l0 + r);
      float* lse = p.lse.data != nullptr ? p.lse.row<float>(b, h, l0 + r) : nullptr;
      if (l == 0.0f) {  // no visible key: out = 0, lse = -inf
        std::fill_n(o, Ev, uint16_t{0});
        if (lse != nullptr) *lse = kNegInf<float>;
        continue;
      }
      const float inv = 1.0f / l;
      for (int64_t e = 0; e < Ev; ++e) o[e] = bf16::from_float(acc[e] * inv);
      if (lse != nullptr) *lse = w.rmax[g * kQueryTile + r] + std::log(l);
    }
  }
}

void ForwardBf16Native(const Problem& p) {
  const int64_t BH = p.B * p.Hkv, S = p.S, E = p.E, Ev = p.Ev;
  const int64_t nkt = ceil_div(S, kKeyTile), nqt = ceil_div(p.L, kQueryTile);
  const int64_t E2 = (E + 1) / 2, ldv = round_up(Ev, kPad<float>);
  const auto n = [](int64_t x) { return static_cast<size_t>(x); };
  Carver measure;
  measure.take<uint32_t>(n(BH * nkt * E2 * kKeyTile));
  measure.take<uint32_t>(n(BH * nkt * (kKeyTile / 2) * ldv));
  measure.take<uint8_t>(n(BH * nkt));
  Carver carve(call_shared().reserve(measure.used()));
  auto* kt = carve.take<uint32_t>(n(BH * nkt * E2 * kKeyTile));
  auto* vp = carve.take<uint32_t>(n(BH * nkt * (kKeyTile / 2) * ldv));
  auto* v_unsafe = carve.take<uint8_t>(n(BH * nkt));
  const ForwardSharedBf16 sh{
      .kt = kt, .vp = vp, .v_unsafe = v_unsafe, .E2 = E2, .ldv = ldv, .nkt = nkt};

  Carver scratch_measure;
  const size_t scratch_bytes = ForwardScratchBf16::Carve(scratch_measure, p, E2, ldv, nullptr);
  RegionError err;
#pragma omp parallel num_threads(p.threads)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < BH * nkt; ++t) {
      const int64_t bh = t / nkt, s0 = (t % nkt) * kKeyTile, kc = std::min(kKeyTile, S - s0);
      const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv;
      bf16::pack_transposed(p.k.row<uint16_t>(b, hkv, s0), n(kc), n(E), n(p.k.sl),
                            kt + t * E2 * kKeyTile, n(kKeyTile));
      const uint16_t* vsrc = p.v.row<uint16_t>(b, hkv, s0);
      bf16::pack_row_pairs(vsrc, n(kc), n(Ev), n(p.v.sl), vp + t * (kKeyTile / 2) * ldv, n(ldv));
      bool finite = true;
      for (int64_t c = 0; c < kc && finite; ++c) finite = AllFiniteBf16(vsrc + c * p.v.sl, Ev);
      v_unsafe[t] = finite ? 0 : 1;
    }
    void* mem = err.reserve(scratch_bytes);
    ForwardScratchBf16 w{};
    if (mem != nullptr) {
      Carver c(mem);
      ForwardScratchBf16::Carve(c, p, E2, ldv, &w);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * nqt; ++item) {
      if (mem == nullptr) continue;
      const int64_t bh = item / nqt;
      ForwardQueryTileBf16(p, sh, w, bh / p.Hkv, bh % p.Hkv, item % nqt);
    }
  }
  if (err.failed) throw std::bad_alloc();
}

// ---- backward --------------------------------------------------------------------------------

// |lse| up to which P = exp(S - lse) is normalised well enough by the given lse. lse is rounded
// to T, which multiplies every P of its row by up to exp(ulp(lse) / 2), a relative error of
// |lse| / 2 epsilons: up to 64 that is at most 32 epsilons of T, in float32 and float64 alike
// (a bound in epsilons, not an absolute one: 2^-19 would be 2^34 float64 epsilons). A row past it
// (a mask that shifts every score by -1e9 or finfo.min leaves lse = -1e9 with log(sum) rounded
// away, so that exp(S - lse) sums to up to S instead of 1), or one whose lse is +inf or NaN, has
// its running max m and sum l recomputed from the inputs exactly as the forward computes them, and
// takes P = exp(S - m) / l: the forward's own probabilities.
template <typename T>
constexpr T kLseResolvable = T(64);

template <typename T>
bool LseNormalises(T lse) {
  return std::abs(lse) <= kLseResolvable<T>;  // false for NaN
}

/// sum_e a[e] * b[e] with the arithmetic of one element of Gemm's product: one multiply-add per
/// term in the order e = 0, 1, ..., in blocks of kGemmDepth terms, each summed from zero and
/// added to the blocks before it. D = rowsum(dO * O) computed this way equals dP_s = dO . v_s
/// bit for bit when out is exactly v_s (a one-hot row, as huge scales give), so that
/// dS = P * (dP - D) is exactly 0 there, as the maths says, instead of a rounding error that
/// the scale then multiplies into dQ and dK.
template <typename T, typename S>
HWY_INLINE T SequentialDot(const T* HWY_RESTRICT a, const S* HWY_RESTRICT b, int64_t n) {
  const hn::CappedTag<T, 1> d1;
  auto sum = hn::Zero(d1);
  for (int64_t e0 = 0; e0 < n; e0 += static_cast<int64_t>(kGemmDepth)) {
    const int64_t end = std::min(n, e0 + static_cast<int64_t>(kGemmDepth));
    auto acc = hn::Zero(d1);
    for (int64_t e = e0; e < end; ++e) {
      acc = hn::MulAdd(hn::Set(d1, a[e]), hn::Set(d1, Widen(b[e])), acc);
    }
    sum = e0 == 0 ? acc : hn::Add(sum, acc);
  }
  return hn::GetLane(sum);
}

// bfloat16 q, k, v and grad_out on a CPU with vdpbf16ps: S = scale * (Q K^T) and dP = dO V^T,
// whose operands are all inputs (exact in bfloat16), take the bfloat16 micro-kernel with no
// rounding beyond the float32 path's; the other three products (P^T dO, dS^T Q, dS K) would round P
// or dS to bfloat16 and stay float32. S is then computed as the bfloat16 forward computes it (the
// scale applied to the float32 product), so P = exp(S - lse) matches the forward's.
//
// On AMX tiles (bf16::amx()) the other three products take bfloat16 pairs too:
//   dV^T += dO^T P,   dK^T += Q^T dS   (the accumulators transposed: E x kKeyTile),
//   dQ += dS K,       dK = scale * dK^T transposed, written with the key tile.
// P and dS are float32; each enters as the sum of two bfloat16 (hi + lo, bf16::pack_*_split),
// two tile products instead of one, so that they carry a relative error of ~2^-17 instead of
// the 2^-9 of one rounding (FlashAttention-2 rounds them once, to the input type): one rounding
// made dV's error on a causal L > S case 2.2 times the naive bfloat16 implementation's, past
// the accuracy rule, where rows see one or two keys and the naive P is nearly exact.
// Only when every key, and the query and grad_out row of every row that sees a key, is finite:
// these products run over whole tiles, where a masked key's P and dS are exactly 0 and would
// turn an inf in such a row into NaN (the float32 products skip those columns or zeros).
struct BackwardPairs {
  const uint32_t* q;     // [B*Hq][L][E2]: query rows (zero for rows that see no key)
  const uint32_t* kt;    // [B*Hkv][nkt][E2][kKeyTile]: key tiles transposed
  const uint32_t* dout;  // [B*Hq][L][Ev2]: grad_out rows (zero for rows that see no key)
  const uint32_t* vt;    // [B*Hkv][nkt][Ev2][kKeyTile]: value tiles transposed
  int64_t E2, Ev2;
  // Set where the CPU has AMX: the operands of the three other products.
  const uint32_t* qt = nullptr;   // [B*Hq][nqt][E][kQueryTile / 2]: Q^T per query tile
  const uint32_t* dot = nullptr;  // [B*Hq][nqt][Ev][kQueryTile / 2]: dO^T per query tile
  const uint32_t* kr = nullptr;   // [B*Hkv][nkt][kKeyTile / 2][ldq]: key rows as pairs of rows
  bool all = false;               // all five products on pairs (set once the inputs are read)
};

// S = scale * (Q K^T) (dp false) or dP = dO V^T (dp true) of query rows row0 .. row0 + rows
// against key tile `tile`, from the pairs, into c [rows][kKeyTile]; false (nothing done) when
// there are no pairs (T = double never has them).
template <typename T>
bool ProductFromPairs(const Problem& p, const BackwardPairs* pairs, bool dp, int64_t rows,
                      int64_t row0, int64_t tile, T* c) {
  if constexpr (std::is_same_v<T, float>) {
    if (pairs == nullptr) return false;
    const auto n = [](int64_t x) { return static_cast<size_t>(x); };
    const int64_t K2 = dp ? pairs->Ev2 : pairs->E2;
    const uint32_t* a = (dp ? pairs->dout : pairs->q) + row0 * K2;
    const uint32_t* b = (dp ? pairs->vt : pairs->kt) + tile * K2 * kKeyTile;
    bf16::gemm(false, n(rows), n(kKeyTile), n(K2), dp ? 1.0f : static_cast<float>(p.scale), a,
               n(K2), b, n(kKeyTile), c, n(kKeyTile));
    return true;
  } else {
    return false;
  }
}

template <typename T>
struct BackwardShared {
  const T* kt;  // [B*Hkv][nkt][E][tile_ld]: key tiles transposed (for S = Q K^T)
  const T* vt;  // [B*Hkv][nkt][Ev][tile_ld]: value tiles transposed (for dP = dO V^T)
  Rows<T> k;  // (B, Hkv, S) key rows (for dQ = dS K): in place when ldq == E and SpreadLd keeps the
              // stride, else packed with row stride SpreadLd(ldq)
  const T* qs;   // [B*Hq][L][ldq]: scale * query, padded (for S and for dK = dS^T (scale Q))
  Rows<T> dout;  // (B, Hq, L) grad_out rows: in place when ldo == Ev (and clean), else padded
  const T* D;    // [B*Hq][L]: rowsum(dO * O)
  // [B*Hq][L]: P = exp(S - shift) * inv_sum; shift = lse and inv_sum = 1, or for a row whose
  // lse does not normalise P (LseNormalises), the recomputed running max m and 1 / l;
  // shift = -inf for a row that sees no key.
  const T* shift;
  const T* inv_sum;
  const uint8_t* k_unsafe;     // [B*Hkv][nkt]: the key tile holds inf or NaN
  int64_t ldq, ldo, nkt, nqt;  // ldq, ldo: columns of the products (E, Ev padded to 64 bytes)
  int64_t tile_ld;             // SpreadLd(kKeyTile): the row stride of the kt and vt tiles
  bool prefetch;               // BackwardMemory::prefetch: the next query tile's rows into L2
  // Set only for bfloat16 inputs on vdpbf16ps (float32 T): S and dP from bfloat16 pairs.
  const BackwardPairs* pairs = nullptr;
};

template <typename T>
struct BackwardScratch {
  T* p;       // [kQueryTile][kKeyTile]: P
  T* ds;      // [kQueryTile][kKeyTile]: dP, then dS
  T* dk_acc;  // [kKeyTile][ldq]; on all pairs (BackwardPairs::all) dK^T: [ldq][kKeyTile]
  T* dv_acc;  // [kKeyTile][ldo]; on all pairs dV^T: [ldo][kKeyTile]
  T* dq_acc;  // [kQueryTile][ldq]
  T* tanh;    // [kQueryTile][kKeyTile]: tanh(x / cap) of the softcapped scores
  T* drop;    // [kKeyTile]: one row's dropout factors

  T* dq_head;  // [group][L][ldq]: dQ of one kv head's query heads (one-pass plan, one chunk)

  // All pairs only, each as hi and lo: P and dS as pairs of query rows ([kQueryTile / 2]
  // [kKeyTile]), dS as pairs along the keys ([kQueryTile][kKeyTile / 2]); one gradient row
  // ([max(ldq, ldo)]).
  uint32_t* p_pairs[2];
  uint32_t* ds_pairs[2];
  uint32_t* ds_rows[2];
  T* grad_row;

  static size_t Carve(Carver& c, int64_t ldq, int64_t ldo, int64_t dq_head_rows, bool all_pairs,
                      BackwardScratch* out) {
    BackwardScratch w;
    w.p = c.take<T>(kQueryTile * kKeyTile);
    w.ds = c.take<T>(kQueryTile * kKeyTile);
    w.dk_acc = c.take<T>(static_cast<size_t>(kKeyTile * ldq));
    w.dv_acc = c.take<T>(static_cast<size_t>(kKeyTile * ldo));
    w.dq_acc = c.take<T>(static_cast<size_t>(kQueryTile * ldq));
    w.tanh = c.take<T>(kQueryTile * kKeyTile);
    w.drop = c.take<T>(kKeyTile);
    w.dq_head = c.take<T>(static_cast<size_t>(dq_head_rows * ldq));
    const size_t pair_words = all_pairs ? kQueryTile * kKeyTile / 2 : 0;
    for (int part = 0; part < 2; ++part) {
      w.p_pairs[part] = c.take<uint32_t>(pair_words);
      w.ds_pairs[part] = c.take<uint32_t>(pair_words);
      w.ds_rows[part] = c.take<uint32_t>(pair_words);
    }
    w.grad_row = c.take<T>(all_pairs ? static_cast<size_t>(std::max(ldq, ldo)) : 0);
    if (out != nullptr) *out = w;
    return c.used();
  }
};

// Whether this call runs all five products on bfloat16 pairs (BackwardPairs::all).
template <typename T>
bool AllPairs(const BackwardShared<T>& sh) {
  return sh.pairs != nullptr && sh.pairs->all;
}

// dV^T += dO^T P and dK^T += Q^T dS of query tile `qtile` (its index in [B*Hq][nqt], rows rows)
// against the key tile whose P and dS are in w, on bfloat16 pairs (BackwardPairs::all).
template <typename T>
void KeyGradientsFromPairs(const Problem& p, const BackwardShared<T>& sh,
                           const BackwardScratch<T>& w, int64_t qtile, int64_t rows) {
  if constexpr (std::is_same_v<T, float>) {
    const auto n = [](int64_t x) { return static_cast<size_t>(x); };
    const BackwardPairs& pr = *sh.pairs;
    const size_t K2 = n((rows + 1) / 2), lda = kQueryTile / 2;
    bf16::pack_row_pairs_split(w.p, n(rows), kKeyTile, kKeyTile, w.p_pairs[0], w.p_pairs[1],
                               kKeyTile);
    bf16::pack_row_pairs_split(w.ds, n(rows), kKeyTile, kKeyTile, w.ds_pairs[0], w.ds_pairs[1],
                               kKeyTile);
    for (int part = 0; part < 2; ++part) {  // hi, then lo
      bf16::gemm(true, n(p.Ev), kKeyTile, K2, 1.0f, pr.dot + qtile * p.Ev * lda, lda,
                 w.p_pairs[part], kKeyTile, w.dv_acc, kKeyTile);
      bf16::gemm(true, n(p.E), kKeyTile, K2, 1.0f, pr.qt + qtile * p.E * lda, lda, w.ds_pairs[part],
                 kKeyTile, w.dk_acc, kKeyTile);
    }
  }
}

// dq_rows [rows][ldq] += dS K_j for key tile `ktile` (its index in [B*Hkv][nkt], kc keys), on
// bfloat16 pairs (BackwardPairs::all); the scale is applied when dQ is stored.
template <typename T>
void QueryGradientFromPairs(const BackwardShared<T>& sh, const BackwardScratch<T>& w, int64_t ktile,
                            int64_t rows, int64_t kc, T* dq_rows) {
  if constexpr (std::is_same_v<T, float>) {
    const auto n = [](int64_t x) { return static_cast<size_t>(x); };
    bf16::pack_rows_split(w.ds, n(rows), n(kc), kKeyTile, w.ds_rows[0], w.ds_rows[1], kKeyTile / 2);
    for (int part = 0; part < 2; ++part) {
      bf16::gemm(true, n(rows), n(sh.ldq), n((kc + 1) / 2), 1.0f, w.ds_rows[part], kKeyTile / 2,
                 sh.pairs->kr + ktile * (kKeyTile / 2) * sh.ldq, n(sh.ldq), dq_rows, n(sh.ldq));
    }
  }
}

// P and dS of one (query tile, key tile) pair, recomputed from the saved log-sum-exp:
//   P  = exp(S - lse)                 (exactly 0 for masked keys and fully masked rows;
//                                      exp(S - m) / l for rows that are renormalised)
//   dP = dO V^T
//   dS = P * (dP - D),  D = rowsum(dO * O)     (the forward's out = P V differentiated)
// S and dP are formed on the columns some row sees (flash::visible_columns; P and dS are exactly
// 0 elsewhere): returned clipped to the tile's keys, [begin, min(end, kc)), for the products
// that follow, which may skip the rest without changing a bit.
template <typename T>
flash::ColumnSpan ProbabilitiesAndGrad(const Problem& p, const BackwardShared<T>& sh,
                                       const BackwardScratch<T>& w, int64_t b, int64_t h,
                                       int64_t l0, int64_t rows, int64_t bh, int64_t j) {
  const int64_t s0 = j * kKeyTile, kc = std::min(kKeyTile, p.S - s0);
  const int64_t row0 = (b * p.Hq + h) * p.L + l0;
  const bool masked = flash::tile_needs_mask(p, l0, rows, s0, kc, kKeyTile);
  const Variants& var = p.variants;
  const bool softcap = var.softcap > 0.0;
  const int64_t tile = bh * sh.nkt + j;
  const flash::ColumnSpan cols = flash::visible_columns(p, l0, rows, s0, kc, kKeyTile, kPad<T>);
  const auto ncols = static_cast<size_t>(cols.end - cols.begin);
  if (!ProductFromPairs(p, sh.pairs, false, rows, row0, tile, w.p)) {
    Gemm<false>(rows, ncols, p.E, sh.qs + row0 * sh.ldq, sh.ldq, 1,
                sh.kt + tile * p.E * sh.tile_ld + cols.begin, sh.tile_ld, w.p + cols.begin,
                kKeyTile);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* prow = w.p + r * kKeyTile;
    const T shift = sh.shift[row0 + r];
    if (shift == kNegInf<T>) {  // fully masked row: no gradient flows through it
      std::fill_n(prow, kKeyTile, T(0));
      continue;
    }
    if (var.transforms_scores()) {
      TransformScoresRow(p, b, h, l0 + r, s0, prow, kKeyTile,
                         softcap ? w.tanh + r * kKeyTile : static_cast<T*>(nullptr));
    }
    if (masked) flash::mask_row(p, b, h, l0 + r, s0, kc, kKeyTile, prow);
    if (std::isnan(shift)) {  // a NaN row: NaN at every visible key, as the forward's out
      for (int64_t c = 0; c < kKeyTile; ++c) {
        prow[c] = prow[c] == kNegInf<T> ? T(0) : std::numeric_limits<T>::quiet_NaN();
      }
      continue;
    }
    ExpShift(prow, kKeyTile, shift);
    const T inv = sh.inv_sum[row0 + r];
    if (inv != T(1)) ScaleRow(prow, kKeyTile, inv);
  }
  if (!ProductFromPairs(p, sh.pairs, true, rows, row0, tile, w.ds)) {
    Gemm<false>(rows, ncols, p.Ev, sh.dout.row(b, h, l0), sh.dout.sl, 1,
                sh.vt + tile * p.Ev * sh.tile_ld + cols.begin, sh.tile_ld, w.ds + cols.begin,
                kKeyTile);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* prow = w.p + r * kKeyTile;
    T* dsrow = w.ds + r * kKeyTile;
    if (var.dropout()) {
      // out = (P z) V: dP = z (dO V^T), dS = P (dP - D), and dV takes P z, in place of P.
      DropoutFactors(var, b, h, l0 + r, s0, kc, w.drop);
      ApplyDropout(kc, w.drop, dsrow);
      SoftmaxGradRow(prow, dsrow, kKeyTile, sh.D[row0 + r]);
      ApplyDropout(kc, w.drop, prow);
    } else {
      SoftmaxGradRow(prow, dsrow, kKeyTile, sh.D[row0 + r]);
    }
    if (softcap && sh.shift[row0 + r] != kNegInf<T>) {
      // Through the softcap: d(c tanh(x / c)) / dx = 1 - tanh^2 (skipped where dS is 0: a
      // masked key's tanh may be of a NaN stored there).
      const T* t = w.tanh + r * kKeyTile;
      for (int64_t c = 0; c < kc; ++c) {
        if (dsrow[c] != T(0)) dsrow[c] *= T(1) - t[c] * t[c];
      }
    }
  }
  return {cols.begin, std::max(cols.begin, std::min(cols.end, kc))};
}

// The running max m and sum l of each row of one query tile, recomputed over the key tiles the
// tile sees with the forward's own arithmetic (the same products, masking and OnlineSoftmaxRows,
// in the same order, so the forward's m and l bit for bit), for the rows whose lse does not
// normalise P (see kLseResolvable), or for every row that sees a key (every_row: the forward
// ran on the decode kernel, see BackwardT).
template <typename T>
void RenormaliseQueryTile(const Problem& p, const BackwardShared<T>& sh,
                          const BackwardScratch<T>& w, int64_t b, int64_t h, int64_t i,
                          bool every_row, T* qs, T* shift, T* inv_sum) {
  const int64_t l0 = i * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
  const int64_t bh = b * p.Hkv + h / p.group, row0 = (b * p.Hq + h) * p.L + l0;
  const flash::TileSpan tiles = flash::key_tiles(p, l0, rows, kKeyTile);
  T m[kQueryTile], l[kQueryTile];
  std::fill_n(m, kQueryTile, kNegInf<T>);
  std::fill_n(l, kQueryTile, T(0));
  for (int64_t j = tiles.begin; j < tiles.end; ++j) {
    const int64_t s0 = j * kKeyTile, kc = std::min(kKeyTile, p.S - s0);
    const bool masked = flash::tile_needs_mask(p, l0, rows, s0, kc, kKeyTile);
    if (!ProductFromPairs(p, sh.pairs, false, rows, row0, bh * sh.nkt + j, w.p)) {
      Gemm<false>(rows, kKeyTile, p.E, sh.qs + row0 * sh.ldq, sh.ldq, 1,
                  sh.kt + (bh * sh.nkt + j) * p.E * sh.tile_ld, sh.tile_ld, w.p, kKeyTile);
    }
    if (p.variants.transforms_scores() || masked) {
      for (int64_t r = 0; r < rows; ++r) {
        T* srow = w.p + r * kKeyTile;
        if (p.variants.transforms_scores()) {
          TransformScoresRow(p, b, h, l0 + r, s0, srow, kKeyTile, static_cast<T*>(nullptr));
        }
        if (masked) flash::mask_row(p, b, h, l0 + r, s0, kc, kKeyTile, srow);
      }
    }
    OnlineSoftmaxRows(w.p, rows, m, l, static_cast<T*>(nullptr), 0);
  }
  const bool sinks = p.variants.sinks != nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const T row_lse = *p.fwd_lse.row<T>(b, h, l0 + r);
    if (row_lse == kNegInf<T> || (!every_row && LseNormalises(row_lse))) continue;
    if (l[r] == T(0)) {  // sees no key after all: no gradient, and q must not leak into dK
      shift[row0 + r] = kNegInf<T>;
      std::fill_n(qs + (row0 + r) * sh.ldq, sh.ldq, T(0));
      continue;
    }
    T inv = T(1) / l[r];
    if (sinks) AddSink(static_cast<T>(p.variants.sinks[h]), m[r], l[r], inv);
    shift[row0 + r] = m[r];
    inv_sum[row0 + r] = T(1) / l[r];
  }
}

// dK and dV of the keys s0 .. s0 + kc of key/value head (b, hkv) from the tile's accumulators,
// written through the gradients' strides.
template <typename T>
void WriteKeyGradients(const Problem& p, const BackwardShared<T>& sh, const BackwardScratch<T>& w,
                       int64_t b, int64_t hkv, int64_t s0, int64_t kc, int64_t ldq, int64_t ldo) {
  if (AllPairs(sh)) {  // dK^T (without the scale) and dV^T
    for (int64_t c = 0; c < kc; ++c) {
      for (int64_t e = 0; e < p.E; ++e) w.grad_row[e] = w.dk_acc[e * kKeyTile + c];
      StoreRow(p.dk, b, hkv, s0 + c, w.grad_row, p.E, static_cast<T>(p.scale));
      for (int64_t e = 0; e < p.Ev; ++e) w.grad_row[e] = w.dv_acc[e * kKeyTile + c];
      StoreRow(p.dv, b, hkv, s0 + c, w.grad_row, p.Ev, T(1));
    }
    return;
  }
  for (int64_t c = 0; c < kc; ++c) {
    StoreRow(p.dk, b, hkv, s0 + c, w.dk_acc + c * ldq, p.E, T(1));
    StoreRow(p.dv, b, hkv, s0 + c, w.dv_acc + c * ldo, p.Ev, T(1));
  }
}

// dK and dV of one key tile: the sum over every query head of its group and every query tile
// that can see it, in a fixed order, by one thread:
//   dV_j += P^T dO_i        dK_j += dS^T (scale * Q_i)
template <typename T>
void BackwardKeyTile(const Problem& p, const BackwardShared<T>& sh, const BackwardScratch<T>& w,
                     int64_t bh, int64_t j) {
  const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv, G = p.group;
  const int64_t s0 = j * kKeyTile, kc = std::min(kKeyTile, p.S - s0);
  const int64_t ldq = sh.ldq, ldo = sh.ldo;
  const bool all_pairs = AllPairs(sh);
  std::fill_n(w.dk_acc, (all_pairs ? kKeyTile : kc) * ldq, T(0));
  std::fill_n(w.dv_acc, (all_pairs ? kKeyTile : kc) * ldo, T(0));
  const flash::TileSpan qtiles = flash::query_tiles(p, s0, kc, kQueryTile);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hkv * G + g;
    for (int64_t i = qtiles.begin; i < qtiles.end; ++i) {
      const int64_t l0 = i * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
      const int64_t row0 = (b * p.Hq + h) * p.L + l0;
      const flash::ColumnSpan c = ProbabilitiesAndGrad(p, sh, w, b, h, l0, rows, bh, j);
      if (all_pairs) {
        KeyGradientsFromPairs(p, sh, w, (b * p.Hq + h) * sh.nqt + i, rows);
        continue;
      }
      const auto n = static_cast<size_t>(c.end - c.begin);
      Gemm<true>(n, ldo, rows, w.p + c.begin, 1, kKeyTile, sh.dout.row(b, h, l0), sh.dout.sl,
                 w.dv_acc + c.begin * ldo, ldo);
      Gemm<true>(n, ldq, rows, w.ds + c.begin, 1, kKeyTile, sh.qs + row0 * ldq, ldq,
                 w.dk_acc + c.begin * ldq, ldq);
    }
  }
  WriteKeyGradients(p, sh, w, b, hkv, s0, kc, ldq, ldo);
}

// dQ of one query tile: dQ_i = scale * sum_j dS_ij K_j over the key tiles it sees, in order.
// A separate pass (P and dP are recomputed) so that each thread owns its dQ rows.
template <typename T>
void BackwardQueryTile(const Problem& p, const BackwardShared<T>& sh, const BackwardScratch<T>& w,
                       int64_t b, int64_t h, int64_t i) {
  const int64_t l0 = i * kQueryTile, rows = std::min(kQueryTile, p.L - l0);
  const int64_t hkv = h / p.group, bh = b * p.Hkv + hkv, ldq = sh.ldq;
  const flash::TileSpan tiles = flash::key_tiles(p, l0, rows, kKeyTile);
  std::fill_n(w.dq_acc, rows * ldq, T(0));
  for (int64_t j = tiles.begin; j < tiles.end; ++j) {
    const int64_t s0 = j * kKeyTile;
    const flash::ColumnSpan c = ProbabilitiesAndGrad(p, sh, w, b, h, l0, rows, bh, j);
    if (AllPairs(sh)) {
      QueryGradientFromPairs(sh, w, bh * sh.nkt + j, rows, std::min(kKeyTile, p.S - s0), w.dq_acc);
      continue;
    }
    const int64_t n = c.end - c.begin;
    const T* k = sh.k.row(b, hkv, s0 + c.begin);
    if (sh.k_unsafe[bh * sh.nkt + j] != 0) {
      GemmSkipZeros(rows, ldq, n, w.ds + c.begin, kKeyTile, 1, k, sh.k.sl, w.dq_acc, ldq);
    } else {
      Gemm<true>(rows, ldq, n, w.ds + c.begin, kKeyTile, 1, k, sh.k.sl, w.dq_acc, ldq);
    }
  }
  const T scale = static_cast<T>(p.scale);
  for (int64_t r = 0; r < rows; ++r) StoreRow(p.dq, b, h, l0 + r, w.dq_acc + r * ldq, p.E, scale);
}

// The one-pass backward of one work item: key tiles [j0, j1) of key/value head hkv of batch b,
// against every query tile of every query head of its group that can see them. For each key
// tile, in order, and each (query head, query tile) pair that sees it:
//   S, P, dP, dS (ProbabilitiesAndGrad)
//   dV_j += P^T dO_i        dK_j += dS^T (scale * Q_i)        dQ_i += dS K_j
// five products per pair, each once. dK_j and dV_j are complete when the tile is done (the item
// owns them); dQ accumulates in dq_acc ([G][L][ldq], owned by the item, zeroed here): the item's
// whole contribution to dQ, summed over its key tiles in order.
template <typename T>
void BackwardKeyChunk(const Problem& p, const BackwardShared<T>& sh, const BackwardScratch<T>& w,
                      int64_t bh, int64_t j0, int64_t j1, T* dq_acc) {
  const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv, G = p.group, L = p.L;
  const int64_t ldq = sh.ldq, ldo = sh.ldo;
  const bool all_pairs = AllPairs(sh);
  std::fill_n(dq_acc, G * L * ldq, T(0));
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t s0 = j * kKeyTile, kc = std::min(kKeyTile, p.S - s0);
    std::fill_n(w.dk_acc, (all_pairs ? kKeyTile : kc) * ldq, T(0));
    std::fill_n(w.dv_acc, (all_pairs ? kKeyTile : kc) * ldo, T(0));
    const flash::TileSpan qtiles = flash::query_tiles(p, s0, kc, kQueryTile);
    const T* k = sh.k.row(b, hkv, s0);
    const int64_t k_ld = sh.k.sl;
    const bool k_unsafe = sh.k_unsafe[bh * sh.nkt + j] != 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hkv * G + g;
      for (int64_t i = qtiles.begin; i < qtiles.end; ++i) {
        const int64_t l0 = i * kQueryTile, rows = std::min(kQueryTile, L - l0);
        const int64_t row0 = (b * p.Hq + h) * L + l0;
        {
          // The next pair's query tile (its scale * Q, dO and dQ rows) into L2 while this one
          // runs: the item's dQ rows of a tile were last touched a whole pass over the group's
          // query tiles ago (2 MiB at G = 1, L = 4096, E = 128) and come from L3 otherwise. Calls
          // alternating in one process, (1, 8, 4096, E), 2 Zen 5 threads: E = 64 1.028x, E = 128
          // 1.026x (one thread 1.023x); on an Intel Xeon 0.97x at both (flash::backward_memory).
          int64_t gn = g, in = i + 1;
          if (in == qtiles.end) {
            gn = g + 1;
            in = qtiles.begin;
          }
          if (sh.prefetch && gn < G && in < qtiles.end) {
            const int64_t ln = in * kQueryTile, rn = std::min(kQueryTile, L - ln);
            const int64_t hn = hkv * G + gn;
            const auto size = static_cast<int64_t>(sizeof(T));
            flash::prefetch_lines<2>(sh.qs + ((b * p.Hq + hn) * L + ln) * ldq, rn * ldq * size);
            for (int64_t r = 0; r < rn; ++r) {
              flash::prefetch_lines<2>(sh.dout.row(b, hn, ln + r), ldo * size);
            }
            flash::prefetch_lines<2>(dq_acc + (gn * L + ln) * ldq, rn * ldq * size);
          }
        }
        const flash::ColumnSpan c = ProbabilitiesAndGrad(p, sh, w, b, h, l0, rows, bh, j);
        if (all_pairs) {
          KeyGradientsFromPairs(p, sh, w, (b * p.Hq + h) * sh.nqt + i, rows);
          QueryGradientFromPairs(sh, w, bh * sh.nkt + j, rows, kc, dq_acc + (g * L + l0) * ldq);
          continue;
        }
        const int64_t n = c.end - c.begin;
        Gemm<true>(static_cast<size_t>(n), ldo, rows, w.p + c.begin, 1, kKeyTile,
                   sh.dout.row(b, h, l0), sh.dout.sl, w.dv_acc + c.begin * ldo, ldo);
        Gemm<true>(static_cast<size_t>(n), ldq, rows, w.ds + c.begin, 1, kKeyTile,
                   sh.qs + row0 * ldq, ldq, w.dk_acc + c.begin * ldq, ldq);
        T* dq_rows = dq_acc + (g * L + l0) * ldq;
        if (k_unsafe) {
          GemmSkipZeros(rows, ldq, n, w.ds + c.begin, kKeyTile, 1, k + c.begin * k_ld, k_ld,
                        dq_rows, ldq);
        } else {
          Gemm<true>(rows, ldq, n, w.ds + c.begin, kKeyTile, 1, k + c.begin * k_ld, k_ld, dq_rows,
                     ldq);
        }
      }
    }
    WriteKeyGradients(p, sh, w, b, hkv, s0, kc, ldq, ldo);
  }
}

// How the backward divides its work: a function of the shape alone, never of the thread count,
// so that every thread count gives the same bits.
//   chunks == 1: one work item per (batch, kv head) runs all five products of its head in order
//     (BackwardKeyChunk), accumulating dQ in its own scratch; PyTorch's CPU flash backward
//     parallelises over B * H the same way.
//   chunks > 1: too few (batch, kv head) pairs to keep kBackwardItems threads busy, so each
//     one's key tiles are split into `chunks` contiguous chunks; each item accumulates its
//     partial dQ in a buffer of its own, and the partials are summed in chunk order afterwards.
//   chunks == 0: the partials would not fit kPartialBudget (long single sequences): two passes,
//     one owning dK and dV by key tile, one owning dQ by query tile, which compute S and dP
//     twice (7 products instead of 5) in linear memory.
#ifndef SDPA_BACKWARD_ITEMS
#define SDPA_BACKWARD_ITEMS 8
#endif
inline constexpr int64_t kBackwardItems = SDPA_BACKWARD_ITEMS;
// 16 MiB: a backward at B = H = 1, L = S = 65536, E = 64 (whose inputs, outputs and packed
// copies already take ~185 MiB) then takes the two-pass plan and stays under 200 MiB in all;
// with two chunks (32 MiB of partials) it measured 218 MiB.
inline constexpr int64_t kPartialBudget = int64_t{16} << 20;  // bytes

struct BackwardPlan {
  int64_t chunks = 1, tiles_per_chunk = 1;
};

inline BackwardPlan PlanBackward(int64_t BH, int64_t nkt, int64_t partial_bytes) {
  BackwardPlan plan;
  plan.tiles_per_chunk = nkt;
  const int forced = flash::backward_chunks_for_test.load(std::memory_order_relaxed);
  if (forced == 0) plan.chunks = 0;
  if (forced >= 0 || BH >= kBackwardItems || nkt <= 1) {
    if (forced > 1 && nkt > 1) {
      plan.tiles_per_chunk = ceil_div(nkt, std::min<int64_t>(forced, nkt));
      plan.chunks = ceil_div(nkt, plan.tiles_per_chunk);
    }
    return plan;
  }
  int64_t chunks = std::min(ceil_div(kBackwardItems, BH), nkt);
  chunks = std::min(chunks, kPartialBudget / std::max<int64_t>(partial_bytes, 1));
  if (chunks < 2) {
    plan.chunks = 0;
    return plan;
  }
  plan.tiles_per_chunk = ceil_div(nkt, chunks);
  plan.chunks = ceil_div(nkt, plan.tiles_per_chunk);
  return plan;
}

// Whether the backward takes S and dP from bfloat16 pairs (BackwardPairs).
template <typename T>
bool BackwardTakesPairs(const Problem& p) {
  // Chosen from the operands' dtypes, never from the values: a float32 caller keeps float32
  // arithmetic (vdpbf16ps would flush its denormals).
  const auto bf = [](const InputView& v) { return v.dtype == DType::bfloat16; };
  return std::is_same_v<T, float> && bf(p.q) && bf(p.k) && bf(p.v) && bf(p.dout) &&
         bf16::pairs_in_kernel();
}

// One transposed tile [rows][tile_ld] of float32 (bfloat16 values) as pairs of rows.
template <typename T>
void PackPairRows(const T* tile, int64_t tile_ld, int64_t rows, uint32_t* dst) {
  if constexpr (std::is_same_v<T, float>) {
    bf16::pack_row_pairs_rounded(tile, static_cast<size_t>(rows), kKeyTile,
                                 static_cast<size_t>(tile_ld), dst, kKeyTile);
  }
}

// One input row of bfloat16 values as pairs along the row.
template <typename T>
void PackInputRowPairs(const T* row, int64_t width, uint32_t* dst) {
  if constexpr (std::is_same_v<T, float>) {
    const auto w = static_cast<size_t>(width);
    bf16::pack_rows_rounded(row, 1, w, w, dst, (w + 1) / 2);
  }
}

// D = rowsum(dO * O) for the bfloat16 pairs path, whose dP = dO V^T comes from vdpbf16ps (or
// tiles), not from SequentialDot: the same product on pairs, one row of dO's pairs against O's
// row as the only non-zero column of a 16-column B, so that D equals dP_s bit for bit where out
// is exactly v_s (every element of bf16::gemm sums its pairs in the same order, whatever M and
// N). `column` holds (Ev + 1) / 2 rows of 16 words whose columns 1..15 are zero.
template <typename T>
T PairRowDot(const uint32_t* dout_pairs, const uint16_t* out_row, int64_t Ev, uint32_t* column) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t Ev2 = (Ev + 1) / 2;
    for (int64_t k2 = 0; k2 < Ev2; ++k2) {
      const uint32_t hi = 2 * k2 + 1 < Ev ? out_row[2 * k2 + 1] : 0u;
      column[k2 * 16] = uint32_t{out_row[2 * k2]} | hi << 16;
    }
    alignas(64) float c[16];
    const auto n = static_cast<size_t>(Ev2);
    bf16::gemm(false, 1, 16, n, 1.0f, dout_pairs, n, column, 16, c, 16);
    return c[0];
  } else {
    return T(0);  // no pairs for float64
  }
}

template <typename T>
void BackwardT(const Problem& p, T* dsinks) {
  const int64_t BH = p.B * p.Hkv, BHq = p.B * p.Hq, S = p.S, L = p.L, E = p.E, Ev = p.Ev;
  const int64_t nkt = ceil_div(S, kKeyTile), nqt = ceil_div(L, kQueryTile);
  const int64_t ldq = round_up(E, kPad<T>), ldo = round_up(Ev, kPad<T>);
  // Row `row` of the flattened (B * Hq * L) rows: its (b, h, l).
  const auto lse_of = [&](int64_t row) {
    const int64_t bh = row / L;
    return *p.fwd_lse.row<T>(bh / p.Hq, bh % p.Hq, row % L);
  };
  // The gradient row `row` of a (B, Hq, L) output view = scale * src, in the view's dtype.
  const auto store_row = [&](const OutputView& view, int64_t row, const T* src, T factor) {
    const int64_t bh = row / L;
    StoreRow(view, bh / p.Hq, bh % p.Hq, row % L, src, E, factor);
  };
  // The fast forward of a decode-sized problem ran on the decode kernel, whose scores round
  // differently from these (its sums over E go in another order): exp(S - lse) with its lse
  // would not sum to 1 over a row (a row of one key would get P = exp(S - S') != 1, and dV an
  // error of |S - S'| however exact the naive P = 1 is). Every row that sees a key is
  // renormalised then, one extra product per query tile of at most kDecodeMaxQueries rows;
  // not where the lse sums over more keys than the call's (a ring block), which the call
  // cannot renormalise over.
  const bool every_row = decode_applies(p) && !p.lse_over_more_keys;
  // A row that sees no key (lse = -inf) contributes nothing, but 0 * NaN would carry a NaN or
  // inf in its dO into dV: such rows are zeroed in a packed copy of dO (q is always copied).
  bool dout_dirty = false;
  for (int64_t row = 0; row < BHq * L && !dout_dirty; ++row) {
    const int64_t bh = row / L;
    dout_dirty =
        lse_of(row) == kNegInf<T> && !RowFinite<T>(p.dout, bh / p.Hq, bh % p.Hq, row % L, Ev);
  }
  // Inputs of a 16-bit type are always packed (widened).
  // The key rows, which dQ = dS K reads as B, are packed too where their stride is a multiple
  // of 512 bytes and the CPU's BackwardMemory spreads them (SpreadLd).
  const flash::BackwardMemory memory = flash::backward_memory();
  const int64_t ldk = SpreadLd<T>(ldq, memory.spread);
  const int64_t tile_ld = SpreadLd<T>(kKeyTile, memory.spread);
  const bool k_in_place =
      ldq == E && IsComputeType<T>(p.k.dtype) && SpreadLd<T>(p.k.sl, memory.spread) == p.k.sl;
  const bool dout_in_place = ldo == Ev && !dout_dirty && IsComputeType<T>(p.dout.dtype);
  const auto n = [](int64_t x) { return static_cast<size_t>(x); };

  const bool use_pairs = BackwardTakesPairs<T>(p);
  const int64_t E2 = (E + 1) / 2, Ev2 = (Ev + 1) / 2;
  const size_t q2_size = use_pairs ? n(BHq * L * E2) : 0,
               kt2_size = use_pairs ? n(BH * nkt * E2 * kKeyTile) : 0;
  const size_t do2_size = use_pairs ? n(BHq * L * Ev2) : 0,
               vt2_size = use_pairs ? n(BH * nkt * Ev2 * kKeyTile) : 0;
  // The operands of the other three products, where they may take pairs too (AMX).
  const bool amx_pairs = use_pairs && bf16::amx();
  const size_t qt2_size = amx_pairs ? n(BHq * nqt * E * (kQueryTile / 2)) : 0,
               dot2_size = amx_pairs ? n(BHq * nqt * Ev * (kQueryTile / 2)) : 0,
               kr2_size = amx_pairs ? n(BH * nkt * (kKeyTile / 2) * ldq) : 0;

  const BackwardPlan plan =
      PlanBackward(BH, nkt, static_cast<int64_t>(n(BHq * L * ldq) * sizeof(T)));
  const size_t partial_size = plan.chunks > 1 ? n(plan.chunks * BHq * L * ldq) : 0;

  Carver measure;
  measure.take<T>(partial_size);
  measure.take<T>(n(BH * nkt * E * tile_ld));
  measure.take<T>(n(BH * nkt * Ev * tile_ld));
  if (!k_in_place) measure.take<T>(n(BH * S * ldk));
  measure.take<T>(n(BHq * L * ldq));
  if (!dout_in_place) measure.take<T>(n(BHq * L * ldo));
  measure.take<T>(n(3 * BHq * L));
  measure.take<uint8_t>(n(BH * nkt));
  measure.take<uint8_t>(n(BHq * nqt));
  measure.take<uint8_t>(amx_pairs ? n(BHq * nqt) : 0);
  for (size_t size : {q2_size, kt2_size, do2_size, vt2_size, qt2_size, dot2_size, kr2_size}) {
    measure.take<uint32_t>(size);
  }
  Carver carve(call_shared().reserve(measure.used()));
  T* partial = carve.take<T>(partial_size);  // [chunks][B*Hq][L][ldq]: partial dQ per key chunk
  T* kt = carve.take<T>(n(BH * nkt * E * tile_ld));
  T* vt = carve.take<T>(n(BH * nkt * Ev * tile_ld));
  T* kp = k_in_place ? nullptr : carve.take<T>(n(BH * S * ldk));
  T* qs = carve.take<T>(n(BHq * L * ldq));
  T* dop = dout_in_place ? nullptr : carve.take<T>(n(BHq * L * ldo));
  T* D = carve.take<T>(n(BHq * L));
  T* shift = carve.take<T>(n(BHq * L));
  T* inv_sum = carve.take<T>(n(BHq * L));
  uint8_t* k_unsafe = carve.take<uint8_t>(n(BH * nkt));
  uint8_t* renormalise = carve.take<uint8_t>(n(BHq * nqt));  // the query tile has such a row
  // [B*Hq][nqt]: a row of the query tile that sees a key has a non-finite query or grad_out
  uint8_t* qdo_unsafe = carve.take<uint8_t>(amx_pairs ? n(BHq * nqt) : 0);
  uint32_t* q2 = carve.take<uint32_t>(q2_size);
  uint32_t* kt2 = carve.take<uint32_t>(kt2_size);
  uint32_t* do2 = carve.take<uint32_t>(do2_size);
  uint32_t* vt2 = carve.take<uint32_t>(vt2_size);
  uint32_t* qt2 = carve.take<uint32_t>(qt2_size);
  uint32_t* dot2 = carve.take<uint32_t>(dot2_size);
  uint32_t* kr2 = carve.take<uint32_t>(kr2_size);
  // Not const: `all` is decided inside the parallel region, once every input has been read.
  BackwardPairs pairs{.q = q2,
                      .kt = kt2,
                      .dout = do2,
                      .vt = vt2,
                      .E2 = E2,
                      .Ev2 = Ev2,
                      .qt = qt2,
                      .dot = dot2,
                      .kr = kr2,
                      .all = false};
  const BackwardShared<T> sh{
      .kt = kt,
      .vt = vt,
      .k = k_in_place ? RowsOf<T>(p.k) : PackedRows<T>(kp, p.Hkv, S, ldk),
      .qs = qs,
      .dout = dout_in_place ? RowsOf<T>(p.dout) : PackedRows<T>(dop, p.Hq, L, ldo),
      .D = D,
      .shift = shift,
      .inv_sum = inv_sum,
      .k_unsafe = k_unsafe,
      .ldq = ldq,
      .ldo = ldo,
      .nkt = nkt,
      .nqt = nqt,
      .tile_ld = tile_ld,
      .prefetch = memory.prefetch,
      .pairs = use_pairs ? &pairs : nullptr};

  Carver scratch_measure;
  const size_t scratch_bytes = BackwardScratch<T>::Carve(
      scratch_measure, ldq, ldo, plan.chunks == 1 ? p.group * L : 0, amx_pairs, nullptr);
  const T scale = static_cast<T>(p.scale);
  RegionError err;
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<uint32_t> o_column;  // PairRowDot's B, made on first use
#pragma omp for schedule(static)
    for (int64_t t = 0; t < BH * nkt; ++t) {
      const int64_t bh = t / nkt, s0 = (t % nkt) * kKeyTile, kc = std::min(kKeyTile, S - s0);
      const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv;
      PackKeyTile(p, b, hkv, s0, kc, kt + t * E * tile_ld, tile_ld);
      WithStorage<T>(p.v.dtype, [&](auto st) {
        using SV = typename decltype(st)::type;
        TransposeTile(p.v.row<SV>(b, hkv, 0), p.v.sl, Ev, s0, kc, vt + t * Ev * tile_ld, tile_ld);
      });
      if (!k_in_place) PackRows(p.k, b, hkv, s0, kc, E, T(1), ldk, kp + (bh * S + s0) * ldk);
      const T* kread = sh.k.row(b, hkv, s0);  // what the dS K product reads
      k_unsafe[t] = AllFiniteRows(kread, sh.k.sl, kc, E) ? 0 : 1;
      if (use_pairs) {  // from the float32 tiles, which hold bfloat16 values exactly
        PackPairRows(kt + t * E * tile_ld, tile_ld, E, kt2 + t * E2 * kKeyTile);
        PackPairRows(vt + t * Ev * tile_ld, tile_ld, Ev, vt2 + t * Ev2 * kKeyTile);
      }
      if (amx_pairs) {  // the key rows as pairs of rows, for dQ = dS K
        bf16::pack_row_pairs(p.k.row<uint16_t>(b, hkv, s0), n(kc), n(E), n(p.k.sl),
                             kr2 + t * (kKeyTile / 2) * ldq, n(ldq));
      }
    }
    // Per query tile: its rows of scale * Q and dO, D, and how each row's P is normalised.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < BHq * nqt; ++t) {
      const int64_t l0 = (t % nqt) * kQueryTile, rows = std::min(kQueryTile, L - l0);
      bool any = false;
      for (int64_t row = (t / nqt) * L + l0; row < (t / nqt) * L + l0 + rows; ++row) {
        inv_sum[row] = T(1);
        const T row_lse = lse_of(row);
        if (row_lse == kNegInf<T>) {
          std::fill_n(qs + row * ldq, ldq, T(0));
          if (!dout_in_place) std::fill_n(dop + row * ldo, ldo, T(0));
          if (use_pairs) {
            std::fill_n(q2 + row * E2, E2, 0u);
            std::fill_n(do2 + row * Ev2, Ev2, 0u);
          }
          D[row] = T(0);
          shift[row] = kNegInf<T>;
          continue;
        }
        const int64_t bh = row / L, b = bh / p.Hq, h = bh % p.Hq, l = row % L;
        PackRows(p.q, b, h, l, 1, E, scale, ldq, qs + row * ldq);
        if (!dout_in_place) PackRows(p.dout, b, h, l, 1, Ev, T(1), ldo, dop + row * ldo);
        const T* dout_row = sh.dout.row(b, h, l);  // T, packed or in place
        if (use_pairs) {  // q straight from its bfloat16 row; dO from its exact float32 copy
          bf16::pack_rows(p.q.row<uint16_t>(b, h, l), 1, static_cast<size_t>(E),
                          static_cast<size_t>(E), q2 + row * E2, static_cast<size_t>(E2));
          PackInputRowPairs(dout_row, Ev, do2 + row * Ev2);
        }
        if (use_pairs && p.fwd_out.dtype == DType::bfloat16) {
          if (o_column.empty()) {
            try {
              o_column.assign(n(Ev2 * 16), 0u);
            } catch (const std::bad_alloc&) {
#pragma omp atomic write
              err.failed = true;
            }
          }
          D[row] = o_column.empty()
                       ? T(0)
                       : PairRowDot<T>(do2 + row * Ev2, p.fwd_out.row<uint16_t>(b, h, l), Ev,
                                       o_column.data());
        } else {
          WithStorage<T>(p.fwd_out.dtype, [&](auto st) {
            using SO = typename decltype(st)::type;
            D[row] = SequentialDot(dout_row, p.fwd_out.row<SO>(b, h, l), Ev);
          });
        }
        shift[row] = row_lse;
        any = any || every_row || !LseNormalises(row_lse);
      }
      renormalise[t] = any ? 1 : 0;
      if (amx_pairs) {  // Q^T and dO^T of the tile, pairs along its rows (zero: sees no key)
        const int64_t bh = t / nqt, b = bh / p.Hq, h = bh % p.Hq;
        const uint16_t* qrows[kQueryTile];
        const uint16_t* drows[kQueryTile];
        bool finite = true;
        for (int64_t r = 0; r < kQueryTile; ++r) {
          const bool sees = r < rows && shift[bh * L + l0 + r] != kNegInf<T>;
          qrows[r] = sees ? p.q.row<uint16_t>(b, h, l0 + r) : nullptr;
          drows[r] = sees ? p.dout.row<uint16_t>(b, h, l0 + r) : nullptr;
          if (sees) finite = finite && AllFiniteBf16(qrows[r], E) && AllFiniteBf16(drows[r], Ev);
        }
        bf16::pack_columns(qrows, kQueryTile, n(E), qt2 + t * E * (kQueryTile / 2), kQueryTile / 2);
        bf16::pack_columns(drows, kQueryTile, n(Ev), dot2 + t * Ev * (kQueryTile / 2),
                           kQueryTile / 2);
        qdo_unsafe[t] = finite ? 0 : 1;
      }
    }
    // Every input is read: whether the other three products may take pairs too.
#pragma omp single
    {
      bool all = amx_pairs;
      for (int64_t t = 0; t < BH * nkt && all; ++t) all = k_unsafe[t] == 0;
      for (int64_t t = 0; t < BHq * nqt && all; ++t) all = qdo_unsafe[t] == 0;
      pairs.all = all;
    }
    void* mem = err.reserve(scratch_bytes);
    BackwardScratch<T> w{};
    if (mem != nullptr) {
      Carver c(mem);
      BackwardScratch<T>::Carve(c, ldq, ldo, plan.chunks == 1 ? p.group * L : 0, amx_pairs, &w);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < BHq * nqt; ++t) {
      const int64_t bh = t / nqt;
      if (mem != nullptr && renormalise[t] != 0) {
        RenormaliseQueryTile(p, sh, w, bh / p.Hq, bh % p.Hq, t % nqt, every_row, qs, shift,
                             inv_sum);
      }
    }
    if (plan.chunks == 0) {
      // pass A: dK, dV by key tile; pass B: dQ by query tile. Independent: no barrier between.
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t t = 0; t < BH * nkt; ++t) {
        if (mem != nullptr) BackwardKeyTile(p, sh, w, t / nkt, t % nkt);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < BHq * nqt; ++item) {
        const int64_t bh = item / nqt;
        if (mem != nullptr) BackwardQueryTile(p, sh, w, bh / p.Hq, bh % p.Hq, item % nqt);
      }
    } else {
      const int64_t C = plan.chunks, G = p.group;
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < BH * C; ++item) {
        if (mem == nullptr) continue;
        const int64_t bh = item / C, c = item % C;
        const int64_t j0 = c * plan.tiles_per_chunk;
        const int64_t j1 = std::min(nkt, j0 + plan.tiles_per_chunk);
        const int64_t first_row = bh * G * L;  // (b * Hq + hkv * G) * L
        T* acc = C == 1 ? w.dq_head : partial + (c * BHq * L + first_row) * ldq;
        BackwardKeyChunk(p, sh, w, bh, j0, j1, acc);
        if (C == 1) {
          for (int64_t r = 0; r < G * L; ++r) store_row(p.dq, first_row + r, acc + r * ldq, scale);
        }
      }
      if (C > 1) {
        // dQ = scale * (((partial_0 + partial_1) + partial_2) + ...), in chunk order.
#pragma omp for schedule(static)
        for (int64_t row = 0; row < BHq * L; ++row) {
          T* sum = partial + row * ldq;  // chunk 0's row becomes the sum (this row's alone)
          for (int64_t e = 0; e < E; ++e) {
            for (int64_t c = 1; c < C; ++c) sum[e] += partial[(c * BHq * L + row) * ldq + e];
          }
          store_row(p.dq, row, sum, scale);
        }
      }
    }
  }
  if (err.failed) throw std::bad_alloc();
  if (dsinks != nullptr && p.variants.sinks != nullptr) {
    // d loss / d sink = -sum over rows of p_sink * D, p_sink = exp(sink - shift) * inv_sum (the
    // sink is a key whose value is 0), summed in float64 in row order.
    for (int64_t h = 0; h < p.Hq; ++h) {
      const double sink = p.variants.sinks[h];
      double sum = 0.0;
      for (int64_t b = 0; b < p.B; ++b) {
        const int64_t row0 = (b * p.Hq + h) * L;
        for (int64_t row = row0; row < row0 + L; ++row) {
          if (D[row] == T(0)) continue;  // also every row that sees no key
          sum -= std::exp(sink - double(shift[row])) * double(inv_sum[row]) * double(D[row]);
        }
      }
      dsinks[h] = static_cast<T>(sum);
    }
  }
}

// ---- exported per-target entry points ---------------------------------------------------------

void ForwardFloat(const Problem& p) { ForwardT<float>(p); }
void ForwardDouble(const Problem& p) { ForwardT<double>(p); }
void BackwardFloat(const Problem& p, void* dsinks) {
  BackwardT<float>(p, static_cast<float*>(dsinks));
}
void BackwardDouble(const Problem& p, void* dsinks) {
  BackwardT<double>(p, static_cast<double*>(dsinks));
}
const char* TargetNameOfKernel() { return hwy::TargetName(HWY_TARGET); }
void ExpForTest(const float* x, float* y, size_t n, bool non_positive) {
  // The softmax's own loop (blocks of kExpBlock vectors, then single vectors) at shift 0.
  std::copy_n(x, n, y);
  using V = hn::Vec<hn::ScalableTag<float>>;
  if (non_positive) {
    ExpShiftRow<true>(y, n, 0.0f, static_cast<V*>(nullptr));
  } else {
    ExpShiftRow<false>(y, n, 0.0f, static_cast<V*>(nullptr));
  }
}
void DropoutFactorsForTest(const Variants& v, int64_t b, int64_t h, int64_t i, int64_t j0,
                           int64_t n, float* factor) {
  DropoutFactors(v, b, h, i, j0, n, factor);
}
void SoftcapForTest(float* x, size_t n, float cap, float* t) { SoftcapRow(x, n, cap, t); }

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_EXPORT(ForwardFloat);
HWY_EXPORT(ForwardDouble);
HWY_EXPORT(ForwardBf16Native);
HWY_EXPORT(BackwardFloat);
HWY_EXPORT(BackwardDouble);
HWY_EXPORT(TargetNameOfKernel);
HWY_EXPORT(ExpForTest);
HWY_EXPORT(DropoutFactorsForTest);
HWY_EXPORT(SoftcapForTest);

// The SIMD target is chosen once per public call; everything below runs on it directly.
bool fast_forward_reads_bfloat16(const Problem& p) {
  // The vdpbf16ps forward computes plain attention: with variants, the float32 kernel serves.
  return p.q.dtype == DType::bfloat16 && p.k.dtype == DType::bfloat16 &&
         p.v.dtype == DType::bfloat16 && bf16::pairs_in_kernel() && !p.variants.any();
}

void fast_forward(const Problem& p) {
  if (fast_forward_reads_bfloat16(p)) {
    HWY_DYNAMIC_DISPATCH(ForwardBf16Native)(p);
    return;
  }
  if (p.dtype == DType::float64) {
    HWY_DYNAMIC_DISPATCH(ForwardDouble)(p);
  } else {
    HWY_DYNAMIC_DISPATCH(ForwardFloat)(p);
  }
}

void fast_backward(const Problem& p, void* dsinks) {
  if (p.dtype == DType::float64) {
    HWY_DYNAMIC_DISPATCH(BackwardDouble)(p, dsinks);
  } else {
    HWY_DYNAMIC_DISPATCH(BackwardFloat)(p, dsinks);
  }
}

const char* fast_kernel_target() { return HWY_DYNAMIC_DISPATCH(TargetNameOfKernel)(); }

void set_backward_chunks_for_test(int chunks) { flash::backward_chunks_for_test = chunks; }
void set_forward_block_for_test(int block) { flash::forward_block_for_test = block; }
void set_backward_memory_for_test(int mode) { flash::backward_memory_for_test = mode; }

// The backward's memory choices by CPU. Both were measured on Zen 5 (+1-3% each, at the
// definitions of SpreadLd and of the prefetch) and both cost on an Intel Xeon (family 6, AVX-512,
// 2 MiB L2 per core, 2026-12-07; two builds' calls alternating in one process, (1, 8, 4096, E),
// 2 threads): without the prefetch 1.031x (E = 64) and 1.032x (E = 128), without the spread
// strides 1.030x and 1.008x, without both 1.060x and 1.047x, and the bfloat16 backward on AMX
// 1.12x; one case went the other way, grouped queries (Hq 8, Hkv 2) at E = 128, 0.974x without
// both. Intel CPUs take neither, others (AMD's, whose figures these are) both. Chosen from the
// vendor, once, so that a machine always runs the same code; the bits are the same either way.
flash::BackwardMemory flash::backward_memory() {
  const int forced = backward_memory_for_test.load(std::memory_order_relaxed);
  if (forced >= 0) return {.spread = forced == 1, .prefetch = forced == 1};
  if (cpu_vendor() == CpuVendor::intel) return {.spread = false, .prefetch = false};
  return {};
}

void fast_exp_for_test(const float* x, float* y, std::size_t n, bool non_positive) {
  HWY_DYNAMIC_DISPATCH(ExpForTest)(x, y, n, non_positive);
}

void fast_dropout_factors_for_test(const Variants& v, std::int64_t b, std::int64_t h,
                                   std::int64_t i, std::int64_t j0, std::int64_t n, float* factor) {
  HWY_DYNAMIC_DISPATCH(DropoutFactorsForTest)(v, b, h, i, j0, n, factor);
}

void fast_softcap_for_test(float* x, std::size_t n, float cap, float* t) {
  HWY_DYNAMIC_DISPATCH(SoftcapForTest)(x, n, cap, t);
}

}  // namespace sdpa::detail
#endif  // HWY_ONCE
