// Entry points of the fast implementations, called by core/attention.cpp after validation.
// Shapes and layout: see core/problem.h. Every operand is read and written through its view in
// the Problem (p.q, p.k, p.v; p.out and p.lse for the forward, bound by bind_forward, p.lse.data
// null when not asked for; p.fwd_out, p.fwd_lse, p.dout, p.dq, p.dk, p.dv for the backward, bound
// by bind_backward), of dtype p.dtype. The contracts of each kernel are written above its
// definition.
#pragma once

#include "core/problem.h"

namespace sdpa::detail {

void fast_forward(const Problem& p);
/// True when fast_forward reads p.q, p.k, p.v as bfloat16 itself (all three bfloat16 and the CPU
/// has AVX512_BF16: the vdpbf16ps forward of flash.cpp), writing p.out as bfloat16 and p.lse as
/// float32; other half-precision problems need float32 copies.
bool fast_forward_reads_bfloat16(const Problem& p);
/// dsinks [Hq] (nullable, only with sinks): d loss / d sink.
void fast_backward(const Problem& p, void* dsinks = nullptr);

/// True when an intermediate of a float32 problem (scores plus mask, the forward's accumulator,
/// and with grad_out given the backward's dP, dS and gradients) might pass float32's range; the
/// dispatcher (core/attention.cpp) then hands the call to the float64 reference instead of the
/// fast or naive kernel. grad_out is laid out as p.dout, or in C order when it is not p.dout's
/// data. Defined in range.cpp.
bool float32_may_overflow(const Problem& p, const void* grad_out = nullptr);

/// True unless an input's rows overlap (a row stride below the row's width, as a stride-0
/// broadcast along the sequence gives), which BLAS cannot read; such calls get C-order copies.
bool naive_reads_in_place(const Problem& p);
void naive_forward(const Problem& p);
void naive_backward(const Problem& p);

}  // namespace sdpa::detail
