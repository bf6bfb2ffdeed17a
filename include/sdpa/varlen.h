// Variable-length batches: sequences of different lengths packed without padding, as
// FlashAttention's flash_attn_varlen_func takes them.
//
//   query (total_q, Hq, E)   key (total_k, Hkv, E)   value (total_k, Hkv, Ev)
//   out   (total_q, Hq, Ev)  lse (Hq, total_q)
//   cu_seqlens_q, cu_seqlens_k: B + 1 offsets each; sequence b is rows
//   cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of query and cu_seqlens_k[b] .. cu_seqlens_k[b + 1] of
//   key and value. Both start at 0, never decrease and end at the packed totals.
//
// Each sequence attends only within itself, with every option of AttentionOptions (causal and the
// window aligned per sequence, d = S_b - L_b; ALiBi slopes of Hq or B * Hq values; sinks; dropout
// counted by (seed, b, head, i, j) with i and j local to the sequence). There is no mask.
// max_seqlen_q / max_seqlen_k must be at least the longest sequence (FlashAttention sizes its
// launch by them; here they are checked). Dtypes as in attention_forward / attention_backward:
// out and grad_query the query's, lse float32 for a 16-bit query (else the query's), grad_key and
// grad_value the key's and the value's.
#pragma once

#include <cstdint>
#include <span>

#include "sdpa/sdpa.h"

namespace sdpa {

void attention_varlen_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                              std::span<const std::int64_t> cu_seqlens_q,
                              std::span<const std::int64_t> cu_seqlens_k, std::int64_t max_seqlen_q,
                              std::int64_t max_seqlen_k, const AttentionOptions& options,
                              const MutableTensorRef& out, const MutableTensorRef* lse = nullptr);

/// Gradients of sum(out * grad_out); out and lse are the forward's. grad_sinks (Hq,), of the
/// query's dtype, only with sinks.
void attention_varlen_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                               std::span<const std::int64_t> cu_seqlens_q,
                               std::span<const std::int64_t> cu_seqlens_k,
                               std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                               const TensorRef& out, const TensorRef& lse,
                               const TensorRef& grad_out, const AttentionOptions& options,
                               const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                               const MutableTensorRef& grad_value,
                               const MutableTensorRef* grad_sinks = nullptr);

}  // namespace sdpa
