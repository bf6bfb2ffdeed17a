// The decode kernel: few queries against a long run of keys, at the speed of reading K and V.
//
// Two callers: attention_forward (core/attention.cpp) when the query is short (decode_applies),
// and the KV-cache API (include/sdpa/kvcache.h, core/kvcache.cpp), whose caches may be paged.
// Both describe their tensors to the kernel by strides, so the kernel reads the caller's K and
// V where they lie and never copies them. The contract and the design are written above the
// kernel in decode.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "core/problem.h"

namespace sdpa::detail {

/// Queries with L <= kDecodeMaxQueries go to the decode kernel when attention_forward is asked
/// for the fast implementation. Above that the fused kernel's register-blocked products win:
/// the decode kernel takes one dot product per (query row, key), so its arithmetic grows with L
/// while its memory traffic does not.
inline constexpr std::int64_t kDecodeMaxQueries = 16;

/// The keys of each sequence are cut into at most kDecodeMaxChunks chunks of at least
/// kDecodeMinChunk keys (a multiple of the kernel's key tile). The cut depends only on the
/// sequence's length, never on the thread count, so the order of every sum, and with it the
/// result, is the same for any number of threads. 16 chunks give 16 * Hkv * batch work items:
/// 128 for one Llama-3-8B layer (Hkv = 8), enough to balance 2..16 threads; 512 keys per chunk
/// keep the per-chunk costs (a partial result of G * L * Ev values and its merge) below 1%.
inline constexpr std::int64_t kDecodeMaxChunks = 16;
inline constexpr std::int64_t kDecodeMinChunk = 512;

/// Keys per tile of the kernel: a multiple of every target's lane count (the score tree and the
/// row operations need it); 16 keys of K and V of one head at E = Ev = 128 float32 are 16 KiB,
/// within the 32-48 KiB L1d of both machines this was measured on.
#ifndef SDPA_DECODE_TILE
#define SDPA_DECODE_TILE 16
#endif
inline constexpr std::int64_t kDecodeTile = SDPA_DECODE_TILE;

/// The packed K/V tile of one work item (its kv heads' rows of one tile) stays within this many
/// bytes: 64 KiB, four heads at E = Ev = 128 float32, is read back from L2 (0.5-1 MiB) head by
/// head, one head's 16 KiB then staying in L1 while the rows of its group use it.
inline constexpr std::int64_t kDecodePackBytes = 64 * 1024;

/// Keys per chunk for a sequence of S keys (>= 1 even for S = 0).
std::int64_t decode_chunk_keys(std::int64_t S);

/// One decode call, described by strides (in elements) so that both callers' layouts fit.
///   query (b, h, l, e)   at q   + b * q_sb + h * q_sh + l * q_sl + e      (h < Hq, l < L, e < E)
///   out   (b, h, l, e)   at out + b * o_sb + h * o_sh + l * o_sl + e      (e < Ev)
///   lse   (b, h, l)      at lse + b * lse_sb + h * lse_sh + l * lse_sl    (lse may be null)
///   key (b, hkv, s, e)   at k + page(b, s) * k_page + (s % page_size) * k_row + hkv * k_head + e
///   value                the same with v_page, v_row, v_head (e < Ev)
/// with page(b, s) = block_table[b * max_blocks + s / page_size] when block_table is given,
/// else b (one page per sequence: page_size is then the sequence capacity).
/// Sequence b has seq_lens[b] keys; query row l of it sees key s when s <= last key, where the
/// last key is l (upper-left), l + seq_lens[b] - L (lower-right) or seq_lens[b] - 1 (none).
/// mask_problem, when not null, is the attention_forward problem whose mask (and causal rule)
/// then decide visibility, exactly as in the fused kernel.
struct DecodeProblem {
  DType dtype = DType::float32;     // of q, out and lse, and of the arithmetic: float32 or float64
  DType kv_dtype = DType::float32;  // of the caches: dtype, or float16 / bfloat16 with float32
  std::int64_t batch = 0, Hq = 1, Hkv = 1, L = 0, E = 0, Ev = 0;
  double scale = 1.0;
  Causal causal = Causal::none;
  int threads = 1;

  const void* q = nullptr;
  std::int64_t q_sb = 0, q_sh = 0, q_sl = 0;
  // The same query in bfloat16 (bit patterns, the strides above), when the caller's query is
  // bfloat16 and q holds its exact float32 copy: over a bfloat16 cache, on CPUs where
  // bf16::dot_pairs_in_kernel() holds, the kernel then multiplies bfloat16 pairs (vdpbf16ps) and
  // rounds P to bfloat16 before P V ("bfloat16 pairs" in decode.cpp). Null: float32 products.
  const void* q_bf16 = nullptr;
  void* out = nullptr;
  std::int64_t o_sb = 0, o_sh = 0, o_sl = 0;
  void* lse = nullptr;
  std::int64_t lse_sb = 0, lse_sh = 0, lse_sl = 0;

  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t k_page = 0, k_row = 0, k_head = 0;
  std::int64_t v_page = 0, v_row = 0, v_head = 0;
  std::int64_t page_size = 1;
  const std::int32_t* block_table = nullptr;
  std::int64_t max_blocks = 0;
  std::vector<std::int64_t> seq_lens;  // one per sequence

  const Problem* mask_problem = nullptr;
};

/// Runs the decode kernel (float32 or float64; float32 over float16 or bfloat16 caches) on the
/// best SIMD target.
void decode_forward(const DecodeProblem& p);

/// True when attention_forward's fast implementation hands `p` to the decode kernel: plain
/// attention (no variant) with at most kDecodeMaxQueries query rows, and not a block of a larger
/// softmax (Problem::lse_over_more_keys). The fused backward of such a
/// problem renormalises every row (its scores round differently from the decode kernel's, so the
/// forward's lse does not normalise them exactly; kernels/flash.cpp).
bool decode_applies(const Problem& p);

/// The decode kernel for an attention_forward problem: reads p.q, p.k, p.v and writes p.out and
/// p.lse (bind_forward) through their views (core/problem.h), in place whatever their strides.
void decode_forward(const Problem& p);

/// Name of the Highway target the next decode call would run on.
const char* decode_kernel_target();

/// How the direct path reads a position-major cache with several kv heads: `copy` first copies
/// each tile (every head of its positions, in memory order, in the cache's dtype) into a
/// contiguous buffer that the blocks of rows then read; `in_place` reads the rows where they
/// lie. `automatic` copies when the L1 data cache is at most 32 KiB, on every target (decode.cpp,
/// "Copied tiles", gives the measurements behind the rule). Every sum runs in the same order
/// either way, so the results are bit-identical.
enum class DecodeTileRead { automatic, copy, in_place };

/// Sets the rule for the calls that start after it (benchmarks and tests); returns the previous
/// rule.
DecodeTileRead set_decode_tile_read(DecodeTileRead rule);

/// Whether a direct-path call over a position-major cache copies its tiles under the current
/// rule.
bool decode_copies_tiles();

/// The order in which the direct path takes the keys where a position's keys of every kv head,
/// counted in 16-bit elements, take less than a page (4 KiB; decode_page_rows): `memory` takes
/// each tile's 16 keys consecutively; `page` takes groups of P tiles together, tile i of a group
/// holding the group's keys i, i + P, i + 2 P, ..., so that in a position-major cache every kv
/// head's pass over a tile reads each page's bytes front to back, as the hardware prefetchers
/// follow them. `automatic` takes page order on Intel CPUs and memory order elsewhere
/// (decode.cpp, "Page order", gives the measurements behind the rule). Keys are summed in the
/// order taken, so the two orders agree to rounding, not bit for bit; either order is the same
/// for every thread count, layout, tile read and cache dtype, and for any other sequences in the
/// batch.
enum class DecodeKeyOrder { automatic, memory, page };

/// Sets the rule for the calls that start after it (benchmarks and tests); returns the previous
/// rule.
DecodeKeyOrder set_decode_key_order(DecodeKeyOrder rule);

/// Whether the current rule takes page order (where the sizes allow: decode_page_rows).
bool decode_orders_pages();

/// P, the tiles of a page-order group, for a call with these sizes under the current rule: 1
/// (memory order) unless the rule takes page order and Hkv * max(E, Ev) <= 1024; then
/// min(2048 / (Hkv * max(E, Ev)), 16). The same whatever the caches' dtype and layout, the
/// batch and the thread count.
std::int64_t decode_page_rows(std::int64_t Hkv, std::int64_t E, std::int64_t Ev);

}  // namespace sdpa::detail
