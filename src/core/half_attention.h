// Attention on 16-bit inputs (float16, bfloat16) where no kernel reads them where they lie.
//
// The dispatcher (core/attention.cpp) validates a call as usual, then hands it here when
// needs_half_path() says so. Each implementation keeps its meaning:
//   reference  the inputs converted exactly to float64, the float64 reference, the results
//              rounded once to the outputs' dtypes (the oracle);
//   fast       the inputs converted exactly to float32, the float32 fused kernel, the results
//              rounded once: float32 arithmetic throughout, P kept in float32 (except where
//              the fused forward reads bfloat16 itself, on AVX512_BF16: docs/precision.md);
//   naive      the three-pass baseline in the working precision (half_naive.cpp): the accuracy
//              baseline of the contract in docs/precision.md.
// A 16-bit mask (PyTorch's bfloat16 models pass one) is converted exactly to float32 first, on
// every path. Outputs may be strided; inputs too.
#pragma once

#include <optional>

#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

inline bool is_16bit(DType d) { return d == DType::float16 || d == DType::bfloat16; }

/// Whether any of query, key and value is 16-bit.
inline bool any_16bit(const TensorRef& q, const TensorRef& k, const TensorRef& v) {
  return is_16bit(q.dtype) || is_16bit(k.dtype) || is_16bit(v.dtype);
}

/// The dtype of lse for a query of dtype `query`: float32 for 16-bit queries, else the query's.
inline DType lse_dtype(DType query) { return is_16bit(query) ? DType::float32 : query; }

/// True when the call has a 16-bit mask, or 16-bit inputs and `native` is false. native: the
/// kernel that serves the call reads its 16-bit inputs itself (today: the fused forward on
/// bfloat16 inputs where the CPU has AVX512_BF16, kernels.h's fast_forward_reads_bfloat16).
bool needs_half_path(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                     const TensorRef* mask, bool native);

/// The forward and backward of a call validated by attention_forward / attention_backward
/// (native as above: then only a 16-bit mask is converted and the call goes back there).
void half_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                  const TensorRef* mask, const AttentionOptions& options,
                  const MutableTensorRef& out, const MutableTensorRef* lse, bool native);
void half_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                   const TensorRef* mask, const TensorRef& out, const TensorRef& lse,
                   const TensorRef& grad_out, const AttentionOptions& options,
                   const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                   const MutableTensorRef& grad_value);

/// A C-contiguous copy of (possibly strided) `t` converted to `dtype` (one rounding).
Array converted_copy(const TensorRef& t, DType dtype);
/// Writes C-contiguous `a` into (possibly strided) `t`, converting to t.dtype (one rounding).
void store_converted(const Array& a, const MutableTensorRef& t);

/// The naive three-pass baseline on inputs of which at least one is 16-bit (half_naive.cpp).
/// The working precision W is the query's dtype: products accumulate in float32, and the scores,
/// P, the output and (backward) dP and dS are rounded to W as they are formed; dk and dv are
/// accumulated over the heads of a group in float32 and rounded once to the key's dtype.
void naive_half_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const AttentionOptions& options,
                        const MutableTensorRef& out, const MutableTensorRef* lse);
void naive_half_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                         const TensorRef* mask, const TensorRef& grad_out,
                         const AttentionOptions& options, const MutableTensorRef& grad_query,
                         const MutableTensorRef& grad_key, const MutableTensorRef& grad_value);

}  // namespace sdpa::detail
