// Entry points of the fast implementations, called by src/attention.cpp after validation.
// Shapes and layout: see core/problem.h. Pointers are of dtype p.dtype; lse may be null in
// fast_forward. The contracts of each kernel are written above its definition.
#pragma once

#include "core/problem.h"

namespace sdpa::detail {

void fast_forward(const Problem& p, void* out, void* lse);
/// dsinks [Hq] (nullable, only with sinks): d loss / d sink.
void fast_backward(const Problem& p, const void* out, const void* lse, const void* grad_out,
                   void* dq, void* dk, void* dv, void* dsinks = nullptr);

/// True when an intermediate of a float32 problem (scores plus mask, the forward's accumulator,
/// and with grad_out given the backward's dP, dS and gradients) might pass float32's range; the
/// dispatcher (core/attention.cpp) then hands the call to the float64 reference instead of the
/// fast or naive kernel. Defined in range.cpp.
bool float32_may_overflow(const Problem& p, const void* grad_out = nullptr);

void naive_forward(const Problem& p, void* out, void* lse);
void naive_backward(const Problem& p, const void* out, const void* lse, const void* grad_out,
                    void* dq, void* dk, void* dv);

}  // namespace sdpa::detail
