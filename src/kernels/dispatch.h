// Introspection of the fused kernel's run-time dispatch, for tests and benchmarks.
#pragma once

#include <cstddef>

namespace sdpa::detail {

/// Name of the Highway target ("AVX3_DL", "AVX2", "SCALAR", ...) that the next fast_forward or
/// fast_backward call would run on (honours hwy::SetSupportedTargetsForTest).
const char* fast_kernel_target();

/// y = exp(x) with the kernel's exp on the dispatched target; n must be a multiple of 16.
/// non_positive: the variant without the clamp at 88, for arguments <= 0 (and -inf, NaN).
/// Contract (tested): for x in [-87.33, 88] (non_positive: [-87.33, 0]) within 1 ULP of exp;
/// exactly 1 at +-0; exactly 0 for x = -inf, NaN and below -87.34.
void fast_exp_for_test(const float* x, float* y, std::size_t n, bool non_positive = false);

/// Pins the fused backward's work plan (see PlanBackward in flash.cpp), so that tests reach
/// every plan on small shapes: -1 (the default) chooses by the shape, 0 forces the two-pass
/// plan, k >= 1 forces k key chunks per (batch, kv head). Not thread-safe against running
/// calls; tests only.
void set_backward_chunks_for_test(int chunks);

/// Pins the number of query tiles per work item of the fused float32/float64 forward (see
/// ForwardBlock in flash.cpp), which small shapes would otherwise always run at 1: -1 (the
/// default) chooses by the shape, k >= 1 forces min(k, 4) tiles. Every row's arithmetic is the
/// same for any block. Not thread-safe against running calls; tests only.
void set_forward_block_for_test(int block);

/// Pins how the fused backward lays out and prefetches its operands (flash::BackwardMemory):
/// -1 (the default) this CPU's choice, 0 plain strides and no prefetch, 1 spread strides and
/// prefetch. The results are the same bits either way. Not thread-safe against running calls;
/// tests and benchmarks only.
void set_backward_memory_for_test(int mode);

}  // namespace sdpa::detail
