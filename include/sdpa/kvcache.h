// sdpa: attention over a key/value cache, for inference (one decoding step, or a short chunk of
// new tokens, against everything cached so far). Follows FlashAttention's
// flash_attn_with_kvcache, so that code moves between the two unchanged:
//
//   q        (batch, L, Hq, E)            the new queries
//   k_cache  (batch, S_max, Hkv, E)       contiguous cache, or paged:
//            (num_blocks, page_size, Hkv, E) with block_table
//   v_cache  like k_cache with Ev
//   k, v     (batch, L_new, Hkv, E | Ev)  optional new keys/values, written into the cache in
//                                          place at rows cache_seqlens[b] .. + L_new, then
//                                          attended to like every cached row
//   cache_seqlens (batch,) int32           rows of each sequence already in the cache (default:
//                                          the whole capacity, S_max or max_blocks * page_size)
//   block_table   (batch, max_blocks) int32  paged caches: row s of sequence b lives in page
//                                          block_table[b][s / page_size], at s % page_size
//   out      (batch, L, Hq, Ev)           lse (batch, Hq, L), natural log, optional
//
// Sequence b attends to its S_b = cache_seqlens[b] + L_new first rows. causal is lower-right
// aligned (FlashAttention's): query l sees rows s <= l + S_b - L, so the last query sees all of
// them, as in speculative decoding. Grouped-query attention: Hq a multiple of Hkv, query head h
// reads cache head h / (Hq / Hkv). scale defaults to 1/sqrt(E). A sequence with no visible row
// (S_b = 0) gives out = 0, lse = -inf. cache_seqlens is only read: the caller advances it.
//
// Dtypes: q and out share one dtype. The caches (and k, v) have one dtype between them: float64
// under a float64 q; float32, float16 or bfloat16 under a float32, float16 or bfloat16 q. 16-bit
// caches halve the bytes a step reads and are widened to float32 exactly, in registers (the
// arithmetic is float32's; a 16-bit q is widened exactly and out rounded once to its dtype).
// lse is float64 for a float64 q, float32 otherwise. Any other mix is refused. Layout: every
// tensor is C-contiguous (TensorRef::strides empty or in C order); a strided view is refused,
// naming it. The caches are read where they lie, never copied. The computation is the decode
// kernel (src/kernels/decode.cpp): every K/V byte read once per GQA group, bit-identical results
// for any thread count.
//
// Errors: sdpa::Error naming the argument, what was expected and what was given, for bad
// shapes, dtypes or heads, a sequence length past the capacity or an append that would pass
// it, block indices outside [0, num_blocks), a block table too short for a sequence, two
// sequences appending to the same cache row, or k without v. Everything is validated before
// the first byte is written: a refused call leaves the caches and the outputs byte-identical.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa {

/// A read-only, C-contiguous int32 tensor owned by someone else (cache_seqlens, block_table).
struct Int32TensorRef {
  const std::int32_t* data = nullptr;
  std::vector<std::int64_t> shape;
};

struct KVCacheOptions {
  std::optional<double> scale;  ///< default 1/sqrt(E)
  bool causal = false;          ///< lower-right aligned
  int threads = 0;              ///< 0: one per core of this machine; otherwise 1..1024
};

/// The optional inputs of attention_with_kvcache; a null pointer means "not given".
struct KVCacheInputs {
  const TensorRef* k = nullptr;                   ///< (batch, L_new, Hkv, E)
  const TensorRef* v = nullptr;                   ///< (batch, L_new, Hkv, Ev)
  const Int32TensorRef* cache_seqlens = nullptr;  ///< (batch,)
  const Int32TensorRef* block_table = nullptr;    ///< (batch, max_blocks): the caches are paged
};

/// Appends k/v (when given) to the caches in place and writes out (and lse when given).
void attention_with_kvcache(const TensorRef& q, const MutableTensorRef& k_cache,
                            const MutableTensorRef& v_cache, const KVCacheInputs& inputs,
                            const KVCacheOptions& options, const MutableTensorRef& out,
                            const MutableTensorRef* lse = nullptr);

/// The shape of `out` for these arguments, (batch, L, Hq, Ev); validates like the call itself.
std::vector<std::int64_t> kvcache_output_shape(const TensorRef& q, const TensorRef& k_cache,
                                               const TensorRef& v_cache,
                                               const KVCacheInputs& inputs);

}  // namespace sdpa
