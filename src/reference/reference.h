// The reference attention: the oracle of this project.
//
// What it is for: every fast path, every lab experiment and every test compares against it.
// It is written to be read, not to be fast: one query row at a time, two passes over the keys.
//
// Contract:
//   - inputs float32 or float64; every product and sum is accumulated in float64 and rounded to
//     the output dtype once at the end. For float64 inputs the result is within a few ULP of the
//     exact value times the condition number of the sum; for float32 inputs out is the correctly
//     computed float64 result rounded once (error <= 0.5 ULP of float32 plus the float64 error).
//   - memory: O(S) scratch per row; the L x S matrix is never formed.
//   - the variants of core/variants.h (window, softcap, ALiBi, sinks, dropout) exactly as
//     written there, in float64;
//   - a key is visible to query l iff the causal rule and the window allow it and the mask's
//     additive value is not -inf; invisible keys are skipped (their q.k, k and v are never read
//     into a sum). A row without any visible key gives out = 0, lse = -inf, zero gradients.
//   - backward recomputes the forward in float64 from the inputs (the `out`/`lse` a caller has
//     are not trusted), then dS = P * (dP - D), D = rowsum(dout * out), per row.
//   - deterministic and identical for any thread count: each output element is written by one
//     thread, in a fixed order of summation.
//   - on request, the float64 matrices behind the result (the scores, P and dS, as
//     FlashAttention's tests get with return_attn_probs): the values the same code uses for out
//     and the gradients, copied out row by row, not a second computation. They are O(L S) memory,
//     so they are for tests and experiments, not for large problems.
#pragma once

#include "core/problem.h"

namespace sdpa::detail {

/// Optional float64 outputs, each [B][Hq][L][S] in C order; a null pointer is not written.
struct ReferenceMatrices {
  double* scores = nullptr;   // scale * q.k + mask; -inf where the key is invisible to the row
  double* probs = nullptr;    // P = exp(score - lse); 0 where invisible, a row of 0 without keys
  double* dscores = nullptr;  // backward only: dS = P * (dP - D), the gradient on the scores
  double* dropout = nullptr;  // the dropout factors: 0 (dropped) or 1 / (1 - p'); 1 without
};

/// out [B][Hq][L][Ev], lse [B][Hq][L], of dtype p.dtype; each nullable. Without out the P V
/// product is skipped: scores and P alone cost one pass of q.k and one of exp per row.
void reference_forward(const Problem& p, void* out, void* lse, const ReferenceMatrices& m = {});

/// grad_out [B][Hq][L][Ev] -> dq [B][Hq][L][E], dk [B][Hkv][S][E], dv [B][Hkv][S][Ev].
/// dq, dk and dv are all given or all null; when null only the matrices are computed (the
/// accumulation of the gradients is skipped, and rows run in parallel instead of key heads).
/// dsinks [Hq] (nullable; only with sinks and dq given): d loss / d sink.
void reference_backward(const Problem& p, const void* grad_out, void* dq, void* dk, void* dv,
                        const ReferenceMatrices& m = {}, void* dsinks = nullptr);

}  // namespace sdpa::detail
