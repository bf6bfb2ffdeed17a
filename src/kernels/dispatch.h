// Introspection of the fused kernel's run-time dispatch, for tests and benchmarks.
#pragma once

#include <cstddef>

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

}  // namespace sdpa::detail
