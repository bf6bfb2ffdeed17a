// A matrix product of bfloat16 operands with float32 accumulation, for the fused kernel's
// bfloat16 path: on AMX tiles (tdpbf16ps) where the CPU has AMX-BF16, else on vdpbf16ps
// (AVX512_BF16) where it has that, elsewhere by converting to float32 (a 16-bit shift) and
// running the float32 micro-kernel of gemm-inl.h.
//
// Packed pair format. vdpbf16ps multiplies, in each float32 lane, a pair of bfloat16 of A by a
// pair of B and adds both products to the lane:
//   C[m][n] (+)= alpha * sum_{k2 < K2} (A[m][2 k2] B[2 k2][n] + A[m][2 k2 + 1] B[2 k2 + 1][n])
// so K is walked in pairs and both operands keep a pair in one 32-bit word (the lower 16 bits
// the even k, the upper the odd one, i.e. little-endian memory order of two bfloat16):
//   A: a[m * lda + k2], rows of pairs; a row of bfloat16 along k is already in this format.
//   B: b[k2 * ldb + n], the pair (B[2 k2][n], B[2 k2 + 1][n]) of column n: two rows of B
//      interleaved (pack_row_pairs), or the rows of B^T read as pairs (pack_transposed).
// An odd K is padded with a zero k (the pack functions write it). N must be a multiple of 16
// (one 512-bit vector of float32); callers pad their rows, as the float32 kernel's do.
//
// Contract (tests/bf16/test_gemm_bf16.cpp, on every path): every C element is within
// (K + 3) float32 units of roundoff of |alpha| sum_k |A B| + |C_in| of the exact result on the
// same bfloat16 values (each bfloat16 product is exact in float32; vdpbf16ps rounds once
// per pair and once per accumulation, K2 + 2 in all; tdpbf16ps at most once per product and
// once each for alpha and C_in, K + 2; the fallback once per FMA). Denormals: vdpbf16ps and
// tdpbf16ps treat bfloat16 denormal inputs as zero and flush denormal results to zero whatever
// MXCSR says, so on the native paths an input below 2^-126 in magnitude counts as 0 and a
// product or partial sum below it becomes 0; the fallback computes them exactly (under the
// default MXCSR).
// Either way an element differs from the exact product by at most the bound above plus |alpha|
// 2^-126 (sum_k (|A(m,k)| + |B(k,n)|) + 2 K2): for attention's scores and probabilities, far below
// float32's resolution of any result.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/half.h"

namespace sdpa::detail::bf16 {

/// The float32 value of bfloat16 bits (exact; core/half.h's conversion, under the name the
/// packing code below uses).
inline float to_float(std::uint16_t h) { return bfloat16_to_float(h); }

/// float32 to bfloat16, rounding to nearest even (core/half.h's conversion): NaN stays NaN
/// (quiet), overflow gives inf, denormals are kept (vcvtne2ps2bf16 of the native path flushes
/// them; see the contract above).
inline std::uint16_t from_float(float f) { return float_to_bfloat16(f); }

/// True when gemm runs on vdpbf16ps: the CPU reports AVX512F and AVX512_BF16 (CPUID leaf 7
/// subleaf 1, EAX bit 5, with the OS saving the 512-bit state) and the test hook does not force
/// the fallback. hwy::SupportedTargets cannot tell: Highway 1.0.3 has no target with BF16.
bool native();

/// True when gemm runs on AMX tiles: native(), the CPU reports AMX-TILE and AMX-BF16 (CPUID
/// leaf 7, EDX bits 24 and 22), Linux granted the process the tile state (arch_prctl
/// ARCH_REQ_XCOMP_PERM, asked once, on first use), and the test hook does not turn it off.
/// Intel's Sapphire Rapids and later have it; no AMD CPU does yet.
bool amx();

/// Tests only: true makes every function here take the converting fallback; false restores the
/// CPU's choice. Not thread-safe against running calls.
void force_fallback_for_test(bool fallback);

/// Tests and benchmarks only: true makes gemm take vdpbf16ps instead of the tiles (amx() false);
/// false restores the CPU's choice. Not thread-safe against running calls.
void force_amx_off_for_test(bool off);

/// Holds force_amx_off_for_test(true) for a scope (tests and benchmarks).
class ScopedAmxOff {
 public:
  ScopedAmxOff() { force_amx_off_for_test(true); }
  ~ScopedAmxOff() { force_amx_off_for_test(false); }
  ScopedAmxOff(const ScopedAmxOff&) = delete;
  ScopedAmxOff& operator=(const ScopedAmxOff&) = delete;
};

/// True when the fused kernel takes all-bfloat16 problems through these pairs (its bfloat16
/// forward, and S and dP in the backward) instead of widening the inputs to float32 for its
/// float32 products: amx(), or native() on a CPU whose vdpbf16ps multiplies and adds twice as
/// many elements per cycle as its float32 FMAs. AMD's AVX512_BF16 cores (Zen 4, Zen 5) do;
/// Intel's (Cooper Lake to Granite Rapids) issue one 512-bit vdpbf16ps per cycle against two
/// float32 FMAs, the same rate before the pairs are packed, so without AMX the pair path is the
/// slower one there (docs/precision.md has the machines' figures). Chosen from the CPU's vendor
/// and features alone, so that a machine always gives the same bits; the test hooks override it.
bool pairs_in_kernel();

/// True when kernels that multiply bfloat16 pairs on vdpbf16ps itself (the decode kernel's
/// pairs; not bf16::gemm, which takes AMX tiles where it can) are the faster path: native() on a
/// CPU whose vdpbf16ps does twice the multiply-adds of a float32 FMA at the same rate (AMD's).
/// On Intel's AVX512_BF16 cores, AMX or not, it issues at half that rate: an all-bfloat16 decode
/// on them ran 1.22x the float32 decode against 1.33x widened (a Xeon with AMX, 2026-12-07).
/// The same test hook as pairs_in_kernel(): forced 1 gives native(), 0 false.
bool dot_pairs_in_kernel();

/// Tests and benchmarks only: 1 makes pairs_in_kernel() equal native() on any CPU, 0 makes it
/// false, -1 restores the CPU's choice. Not thread-safe against running calls.
void force_pairs_in_kernel_for_test(int mode);

/// Holds force_pairs_in_kernel_for_test(mode) for a scope (tests and benchmarks).
class ScopedPairsInKernel {
 public:
  explicit ScopedPairsInKernel(int mode) { force_pairs_in_kernel_for_test(mode); }
  ~ScopedPairsInKernel() { force_pairs_in_kernel_for_test(-1); }
  ScopedPairsInKernel(const ScopedPairsInKernel&) = delete;
  ScopedPairsInKernel& operator=(const ScopedPairsInKernel&) = delete;
};

/// C[m][n] = alpha * (A B)[m][n] + (accumulate ? C[m][n] : 0), m < M, n < N, as described at
/// the top of this file. N % 16 == 0; lda >= K2, ldb >= N, ldc >= N (in words of their type).
void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K2, float alpha,
          const std::uint32_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb,
          float* c, std::size_t ldc);

/// The float32 product of the same shape on the dispatched Highway target (gemm-inl.h's Gemm):
///   C[m][n] (+)= sum_k A[m * lda + k] B[k * ldb + n].   N % 16 == 0.
/// What the fallback runs after converting; exported for the benchmark that compares the two.
void gemm_f32(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const float* a,
              std::size_t lda, const float* b, std::size_t ldb, float* c, std::size_t ldc);

// ---- packing -------------------------------------------------------------------------------
// Each writes whole rows of its destination: the pairs past K and the columns past N are zero.

/// A from bfloat16 rows: dst[m][k2] = (src[m][2 k2], src[m][2 k2 + 1]) for m < M, with a zero
/// in the odd K's last pair and zero pairs from ceil(K / 2) up to lda.
void pack_rows(const std::uint16_t* src, std::size_t M, std::size_t K, std::size_t ld_src,
               std::uint32_t* dst, std::size_t lda);

/// A from float32 rows, each element rounded to bfloat16 as from_float rounds it, except that a
/// float32 denormal may become zero on the native path (vcvtne2ps2bf16: the SDM says it flushes
/// them, Zen 5 measured to keep them).
void pack_rows_rounded(const float* src, std::size_t M, std::size_t K, std::size_t ld_src,
                       std::uint32_t* dst, std::size_t lda);

/// B from bfloat16 rows of B (K x N, row-major): dst[k2][n] = (src[2 k2][n], src[2 k2 + 1][n]),
/// rows K2 = ceil(K / 2), the odd K's partner row zero; columns N..ldb zero.
void pack_row_pairs(const std::uint16_t* src, std::size_t K, std::size_t N, std::size_t ld_src,
                    std::uint32_t* dst, std::size_t ldb);

/// pack_row_pairs from float32 rows, each element rounded as pack_rows_rounded rounds it (exact
/// for float32 copies of bfloat16 values; on the native path 16 columns at a time).
void pack_row_pairs_rounded(const float* src, std::size_t K, std::size_t N, std::size_t ld_src,
                            std::uint32_t* dst, std::size_t ldb);

/// pack_rows_rounded and pack_row_pairs_rounded as the sum of two bfloat16: hi = x rounded as
/// there, lo = (x - hi) rounded (0 where x is not finite), so that gemm(hi) + gemm(lo) multiplies
/// by x to a relative 2^-16 instead of 2^-8 (the native paths may flush a denormal lo to 0).
void pack_rows_split(const float* src, std::size_t M, std::size_t K, std::size_t ld_src,
                     std::uint32_t* hi, std::uint32_t* lo, std::size_t lda);
void pack_row_pairs_split(const float* src, std::size_t K, std::size_t N, std::size_t ld_src,
                          std::uint32_t* hi, std::uint32_t* lo, std::size_t ldb);

/// A = T^T from bfloat16 rows of T (K x M; the query rows of a tile for dK^T = Q^T dS):
/// dst[m][k2] = (rows[2 k2][m], rows[2 k2 + 1][m]) for m < M, where rows[k] points at row k of T
/// and a null rows[k] is a row of zeros; the odd K's partner row and the pairs from ceil(K / 2)
/// up to lda are zero.
void pack_columns(const std::uint16_t* const* rows, std::size_t K, std::size_t M,
                  std::uint32_t* dst, std::size_t lda);

/// B = T^T from the bfloat16 rows of T (N x K, row-major; the key rows for S = Q K^T):
/// dst[k2][n] = (src[n][2 k2], src[n][2 k2 + 1]) for n < N, zero for N <= n < ldb.
void pack_transposed(const std::uint16_t* src, std::size_t N, std::size_t K, std::size_t ld_src,
                     std::uint32_t* dst, std::size_t ldb);

}  // namespace sdpa::detail::bf16
