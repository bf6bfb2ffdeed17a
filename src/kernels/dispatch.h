// Introspection of the fused kernel's run-time dispatch, for tests and benchmarks.
#pragma once

#include <cstddef>

#include "core/problem.h"

namespace sdpa::detail {

/// Name of the Highway target ("AVX3_DL", "AVX2", "SCALAR", ...) that the next fast_forward or
/// fast_backward call would run on (honours hwy::SetSupportedTargetsForTest).
const char* fast_kernel_target();

/// y = exp(x) with the kernel's exp on the dispatched target; n must be a multiple of 16.
/// Contract (tested): for x in [-87, 0] within 2 ULP of exp; exactly 0 for x = -inf.
void fast_exp_for_test(const float* x, float* y, std::size_t n);

/// Pins the fused backward's work plan (see PlanBackward in flash.cpp), so that tests reach
/// every plan on small shapes: -1 (the default) chooses by the shape, 0 forces the two-pass
/// plan, k >= 1 forces k key chunks per (batch, kv head). Not thread-safe against running
/// calls; tests only.
void set_backward_chunks_for_test(int chunks);

/// A float32 fast_backward whose q, k, v and grad_out all hold bfloat16 values takes S and dP
/// from bfloat16 pairs on vdpbf16ps where the CPU has it (exact: the same products). false
/// keeps it on the float32 products, true (the default) restores that choice. Tests only.
void set_bf16_pairs_allowed_for_test(bool allowed);

/// The fused forward on bfloat16 operands with vdpbf16ps (flash.cpp's ForwardBf16Native): reads
/// p.q, p.k, p.v as bfloat16 bits (uint16_t) through their views, writes p.out as bfloat16 and
/// p.lse (if any) as float32; the views' dtypes are not consulted. Only where bf16::native();
/// tests only.
void fast_forward_bf16_for_test(const Problem& p);

}  // namespace sdpa::detail
