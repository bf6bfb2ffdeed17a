// The bfloat16 product of gemm_bf16.h: a register-tiled micro-kernel on vdpbf16ps, compiled for
// AVX512F + AVX512_BF16 whatever the build's -march and run only where CPUID reports both, and
// a converting fallback on the float32 micro-kernel of gemm-inl.h (every Highway target).
//
// Native micro-kernel: an MR x NV = 6 x 4 block of C (float32, 16 lanes per vector) stays in
// registers for the whole K2 loop; per pair k2 it loads NV vectors of B (16 columns x 1 pair),
// broadcasts MR 32-bit pairs of A and issues MR * NV independent vdpbf16ps, each 2 products and
// 2 additions per lane: twice the arithmetic of an FMA per instruction. 24 accumulators + 4 B
// vectors + 1 broadcast = 29 of the 32 zmm registers, the float32 kernel's block; 24 independent
// chains cover a latency of up to 12 cycles at 2 per cycle.
#include "kernels/gemm_bf16.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_bf16.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {

void GemmF32(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const float* a,
             std::size_t lda, const float* b, std::size_t ldb, float* c, std::size_t ldc) {
  if (accumulate) {
    Gemm<true>(M, N, K, a, lda, 1, b, ldb, c, ldc);
  } else {
    Gemm<false>(M, N, K, a, lda, 1, b, ldb, c, ldc);
  }
}

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SDPA_BF16_NATIVE 1
#define SDPA_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#else
#define SDPA_BF16_NATIVE 0
#endif

namespace sdpa::detail {
HWY_EXPORT(GemmF32);

namespace bf16 {
namespace {

std::atomic<bool> forced_fallback{false};
std::atomic<int> forced_pairs{-1};

bool cpu_has_bf16() {
#if SDPA_BF16_NATIVE
  // libgcc's (and compiler-rt's) CPUID reading: avx512bf16 is leaf 7 subleaf 1 EAX bit 5, and
  // both AVX-512 features are reported only when XGETBV says the OS saves the zmm registers.
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

#if SDPA_BF16_NATIVE
// ---- native: vdpbf16ps ---------------------------------------------------------------------

template <int MR, int NV>
SDPA_BF16_TARGET inline void MicroTile(bool accumulate, std::size_t K2, __m512 alpha,
                                       const std::uint32_t* a, std::size_t lda,
                                       const std::uint32_t* b, std::size_t ldb, float* c,
                                       std::size_t ldc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  }
  for (std::size_t k = 0; k < K2; ++k) {
    const std::uint32_t* bk = b + k * ldb;
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(bk + 16 * v);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[m * lda + k]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], av, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* cp = c + m * ldc + 16 * v;
      const __m512 r = accumulate ? _mm512_fmadd_ps(alpha, acc[m][v], _mm512_loadu_ps(cp))
                                  : _mm512_mul_ps(alpha, acc[m][v]);
      _mm512_storeu_ps(cp, r);
    }
  }
}

template <int MR>
SDPA_BF16_TARGET inline void RowPanel(bool accumulate, std::size_t N, std::size_t K2, __m512 alpha,
                                      const std::uint32_t* a, std::size_t lda,
                                      const std::uint32_t* b, std::size_t ldb, float* c,
                                      std::size_t ldc) {
  constexpr int kNV = 4;
  const auto vectors = static_cast<std::uint32_t>(N / 16);
  std::uint32_t v = 0;
  for (; v + kNV <= vectors; v += kNV) {
    MicroTile<MR, kNV>(accumulate, K2, alpha, a, lda, b + 16 * v, ldb, c + 16 * v, ldc);
  }
  for (; v < vectors; ++v) {
    MicroTile<MR, 1>(accumulate, K2, alpha, a, lda, b + 16 * v, ldb, c + 16 * v, ldc);
  }
}

SDPA_BF16_TARGET void GemmNative(bool accumulate, std::size_t M, std::size_t N, std::size_t K2,
                                 float alpha_s, const std::uint32_t* a, std::size_t lda,
                                 const std::uint32_t* b, std::size_t ldb, float* c,
                                 std::size_t ldc) {
  constexpr std::size_t kMR = 6;
  const __m512 alpha = _mm512_set1_ps(alpha_s);
  std::size_t m = 0;
  for (; m + kMR <= M; m += kMR) {
    RowPanel<kMR>(accumulate, N, K2, alpha, a + m * lda, lda, b, ldb, c + m * ldc, ldc);
  }
  const std::uint32_t* ar = a + m * lda;
  float* cr = c + m * ldc;
  switch (M - m) {
    case 5:
      RowPanel<5>(accumulate, N, K2, alpha, ar, lda, b, ldb, cr, ldc);
      break;
    case 4:
      RowPanel<4>(accumulate, N, K2, alpha, ar, lda, b, ldb, cr, ldc);
      break;
    case 3:
      RowPanel<3>(accumulate, N, K2, alpha, ar, lda, b, ldb, cr, ldc);
      break;
    case 2:
      RowPanel<2>(accumulate, N, K2, alpha, ar, lda, b, ldb, cr, ldc);
      break;
    case 1:
      RowPanel<1>(accumulate, N, K2, alpha, ar, lda, b, ldb, cr, ldc);
      break;
    default:
      break;
  }
}

// 32 float32 to 32 bfloat16 (round to nearest even; denormals flushed) per step.
SDPA_BF16_TARGET void PackRowsRoundedNative(const float* src, std::size_t M, std::size_t K,
                                            std::size_t ld_src, std::uint32_t* dst,
                                            std::size_t lda) {
  for (std::size_t m = 0; m < M; ++m) {
    const float* s = src + m * ld_src;
    std::uint32_t* d = dst + m * lda;
    std::size_t k = 0;
    for (; k + 32 <= K; k += 32) {
      const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + k + 16), _mm512_loadu_ps(s + k));
      _mm512_storeu_si512(d + k / 2, (__m512i)r);
    }
    for (; k + 1 < K; k += 2) {
      d[k / 2] = std::uint32_t{from_float(s[k])} | std::uint32_t{from_float(s[k + 1])} << 16;
    }
    std::size_t k2 = k / 2;
    if (k < K) d[k2++] = from_float(s[k]);
    std::fill(d + k2, d + lda, 0u);
  }
}
#endif  // SDPA_BF16_NATIVE

bool use_native() { return cpu_has_bf16() && !forced_fallback.load(std::memory_order_relaxed); }

// ---- fallback: convert, then the float32 micro-kernel -----------------------------------------

void GemmFallback(bool accumulate, std::size_t M, std::size_t N, std::size_t K2, float alpha,
                  const std::uint32_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb,
                  float* c, std::size_t ldc) {
  // Per thread, kept between calls: the converted operands and the product before alpha.
  thread_local std::vector<float> af, bf, cf;
  const std::size_t K = 2 * K2;
  af.resize(M * K);
  bf.resize(K * N);
  cf.resize(M * N);
  for (std::size_t m = 0; m < M; ++m) {
    for (std::size_t k2 = 0; k2 < K2; ++k2) {
      const std::uint32_t w = a[m * lda + k2];
      af[m * K + 2 * k2] = to_float(static_cast<std::uint16_t>(w));
      af[m * K + 2 * k2 + 1] = to_float(static_cast<std::uint16_t>(w >> 16));
    }
  }
  for (std::size_t k2 = 0; k2 < K2; ++k2) {
    for (std::size_t n = 0; n < N; ++n) {
      const std::uint32_t w = b[k2 * ldb + n];
      bf[2 * k2 * N + n] = to_float(static_cast<std::uint16_t>(w));
      bf[(2 * k2 + 1) * N + n] = to_float(static_cast<std::uint16_t>(w >> 16));
    }
  }
  HWY_DYNAMIC_DISPATCH(GemmF32)(false, M, N, K, af.data(), K, bf.data(), N, cf.data(), N);
  for (std::size_t m = 0; m < M; ++m) {
    for (std::size_t n = 0; n < N; ++n) {
      const float p = alpha * cf[m * N + n];
      c[m * ldc + n] = accumulate ? c[m * ldc + n] + p : p;
    }
  }
}

}  // namespace

bool native() { return use_native(); }

bool pairs_in_kernel() {
  const int forced = forced_pairs.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1 && use_native();
#if SDPA_BF16_NATIVE
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
  }();
  return amd && use_native();
#else
  return false;
#endif
}

void force_pairs_in_kernel_for_test(int mode) {
  forced_pairs.store(mode < 0 ? -1 : mode > 0 ? 1 : 0, std::memory_order_relaxed);
}

void force_fallback_for_test(bool fallback) {
  forced_fallback.store(fallback, std::memory_order_relaxed);
}

void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K2, float alpha,
          const std::uint32_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb,
          float* c, std::size_t ldc) {
#if SDPA_BF16_NATIVE
  if (use_native()) {
    GemmNative(accumulate, M, N, K2, alpha, a, lda, b, ldb, c, ldc);
    return;
  }
#endif
  GemmFallback(accumulate, M, N, K2, alpha, a, lda, b, ldb, c, ldc);
}

void gemm_f32(bool accumulate, std::size_t M, std::size_t N, std::size_t K, const float* a,
              std::size_t lda, const float* b, std::size_t ldb, float* c, std::size_t ldc) {
  HWY_DYNAMIC_DISPATCH(GemmF32)(accumulate, M, N, K, a, lda, b, ldb, c, ldc);
}

void pack_rows(const std::uint16_t* src, std::size_t M, std::size_t K, std::size_t ld_src,
               std::uint32_t* dst, std::size_t lda) {
  // Byte copies: the pairs are the little-endian memory order of the bfloat16 row.
  for (std::size_t m = 0; m < M; ++m) {
    auto* d = reinterpret_cast<unsigned char*>(dst + m * lda);
    std::memcpy(d, src + m * ld_src, K * sizeof(std::uint16_t));
    std::memset(d + K * sizeof(std::uint16_t), 0, (2 * lda - K) * sizeof(std::uint16_t));
  }
}

void pack_rows_rounded(const float* src, std::size_t M, std::size_t K, std::size_t ld_src,
                       std::uint32_t* dst, std::size_t lda) {
#if SDPA_BF16_NATIVE
  if (use_native()) {
    PackRowsRoundedNative(src, M, K, ld_src, dst, lda);
    return;
  }
#endif
  for (std::size_t m = 0; m < M; ++m) {
    const float* s = src + m * ld_src;
    std::uint32_t* d = dst + m * lda;
    std::size_t k = 0;
    for (; k + 1 < K; k += 2) {
      d[k / 2] = std::uint32_t{from_float(s[k])} | std::uint32_t{from_float(s[k + 1])} << 16;
    }
    std::size_t k2 = k / 2;
    if (k < K) d[k2++] = from_float(s[k]);
    std::fill(d + k2, d + lda, 0u);
  }
}

void pack_row_pairs(const std::uint16_t* src, std::size_t K, std::size_t N, std::size_t ld_src,
                    std::uint32_t* dst, std::size_t ldb) {
  for (std::size_t k = 0; k < K; k += 2) {
    const std::uint16_t* even = src + k * ld_src;
    const std::uint16_t* odd = k + 1 < K ? even + ld_src : nullptr;
    std::uint32_t* d = dst + (k / 2) * ldb;
    if (odd != nullptr) {
      for (std::size_t n = 0; n < N; ++n)
        d[n] = std::uint32_t{even[n]} | std::uint32_t{odd[n]} << 16;
    } else {
      for (std::size_t n = 0; n < N; ++n) d[n] = even[n];
    }
    std::fill(d + N, d + ldb, 0u);
  }
}

void pack_row_pairs_rounded(const float* src, std::size_t K, std::size_t N, std::size_t ld_src,
                            std::uint32_t* dst, std::size_t ldb) {
  for (std::size_t k = 0; k < K; k += 2) {
    const float* even = src + k * ld_src;
    std::uint32_t* d = dst + (k / 2) * ldb;
    if (k + 1 < K) {
      for (std::size_t n = 0; n < N; ++n) {
        d[n] = std::uint32_t{from_float(even[n])} | std::uint32_t{from_float(even[ld_src + n])}
                                                        << 16;
      }
    } else {
      for (std::size_t n = 0; n < N; ++n) d[n] = from_float(even[n]);
    }
    std::fill(d + N, d + ldb, 0u);
  }
}

void pack_transposed(const std::uint16_t* src, std::size_t N, std::size_t K, std::size_t ld_src,
                     std::uint32_t* dst, std::size_t ldb) {
  const std::size_t K2 = (K + 1) / 2;
  for (std::size_t k2 = 0; k2 < K2; ++k2) {
    std::uint32_t* d = dst + k2 * ldb;
    const std::size_t k = 2 * k2;
    if (k + 1 < K) {
      for (std::size_t n = 0; n < N; ++n) {
        const std::uint16_t* s = src + n * ld_src + k;
        d[n] = std::uint32_t{s[0]} | std::uint32_t{s[1]} << 16;
      }
    } else {
      for (std::size_t n = 0; n < N; ++n) d[n] = src[n * ld_src + k];
    }
    std::fill(d + N, d + ldb, 0u);
  }
}

}  // namespace bf16
}  // namespace sdpa::detail
#endif  // HWY_ONCE
