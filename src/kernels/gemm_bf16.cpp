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
//
// AMX micro-kernel, where the CPU has AMX-TILE and AMX-BF16 and Linux grants the tile state: the
// packed pair formats are the tiles' own (A: 16 rows of 16 pairs; B: 16 pair rows of 16 columns,
// the "VNNI" layout), so tiles load straight from the packed operands. A 32 x 32 block of C is
// four float32 tiles, fed per 16 pairs of K by two A tiles and two B tiles, eight in all: one
// tdpbf16ps does 16 x 16 x 32 products, 16 times an AVX-512 vdpbf16ps's work.
#include "kernels/gemm_bf16.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu_vendor.h"

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
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define SDPA_BF16_NATIVE 1
#define SDPA_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#define SDPA_AMX_TARGET __attribute__((target("avx512f,avx512bf16,amx-tile,amx-bf16")))
#else
#define SDPA_BF16_NATIVE 0
#endif

namespace sdpa::detail {
HWY_EXPORT(GemmF32);

namespace bf16 {
namespace {

std::atomic<bool> forced_fallback{false};
std::atomic<bool> forced_amx_off{false};
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

bool cpu_has_amx() {
#if SDPA_BF16_NATIVE && defined(__linux__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_bf16() || __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = ((edx >> 22) & 1u) != 0, amx_tile = ((edx >> 24) & 1u) != 0;
    if (!amx_bf16 || !amx_tile) return false;
    // Linux keeps the 8 KiB tile data out of a process's state until it asks for it
    // (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a tile instruction before that faults.
    // Refused (an older kernel, a signal stack too small for the larger frame): no AMX.
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
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
// ---- AMX: tdpbf16ps --------------------------------------------------------------------------

// The palette-1 tile configuration (64 bytes, the layout ldtilecfg reads): eight tiles of 16 rows
// of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// GCC's _tile_loadconfig names only the first 8 bytes of the configuration as its operand, so
// the stores of a configuration built on the stack may be dropped as dead; a constant in
// read-only data is always all there.
constexpr TileConfig kTileConfig{};

// The tile instructions' asm statements (GCC's intrinsics) tell the compiler nothing about the
// memory they read: this keeps the plain stores that fill a buffer before its tile load.
inline void CompilerBarrier() { __asm__ __volatile__("" ::: "memory"); }

// An MT x NT block of 16 x 16 C tiles (tile 2 mt + nt) over all K2 pairs: A rows from a (lda
// >= K2 rounded up to 16, zero past K2), B from b for the whole 16-pair blocks and from b_tail
// (16 pair rows, zero past K2 % 16) for the last partial one. C starts from c (load_c) or zero
// and is stored to c.
template <int MT, int NT>
SDPA_AMX_TARGET inline void AmxBlock(std::size_t K2, const std::uint32_t* a, std::size_t lda,
                                     const std::uint32_t* b, std::size_t ldb,
                                     const std::uint32_t* b_tail, std::size_t ld_tail, float* c,
                                     std::size_t ldc, bool load_c) {
  const auto sa = static_cast<long>(lda * 4), sb = static_cast<long>(ldb * 4);
  const auto st = static_cast<long>(ld_tail * 4), sc = static_cast<long>(ldc * 4);
  float* c1 = c + 16 * ldc;
  if (load_c) {
    _tile_loadd(0, c, sc);
    if constexpr (NT == 2) _tile_loadd(1, c + 16, sc);
    if constexpr (MT == 2) _tile_loadd(2, c1, sc);
    if constexpr (MT == 2 && NT == 2) _tile_loadd(3, c1 + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NT == 2) _tile_zero(1);
    if constexpr (MT == 2) _tile_zero(2);
    if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  }
  const std::size_t whole = K2 / 16 * 16;
  for (std::size_t k = 0; k < K2; k += 16) {
    const std::uint32_t* bk = k < whole ? b + k * ldb : b_tail;
    const long sbk = k < whole ? sb : st;
    _tile_loadd(4, a + k, sa);
    if constexpr (MT == 2) _tile_loadd(5, a + 16 * lda + k, sa);
    _tile_loadd(6, bk, sbk);
    if constexpr (NT == 2) _tile_loadd(7, bk + 16, sbk);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  if constexpr (NT == 2) _tile_stored(1, c + 16, sc);
  if constexpr (MT == 2) _tile_stored(2, c1, sc);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c1 + 16, sc);
}

template <int MT>
SDPA_AMX_TARGET inline void AmxRowPanel(std::size_t N, std::size_t K2, const std::uint32_t* a,
                                        std::size_t lda, const std::uint32_t* b, std::size_t ldb,
                                        const std::uint32_t* b_tail, std::size_t ld_tail, float* c,
                                        std::size_t ldc, bool load_c) {
  // b_tail is null when K2 is a whole number of blocks (AmxBlock then never reads it).
  const auto tail = [&](std::size_t n) { return b_tail == nullptr ? nullptr : b_tail + n; };
  std::size_t n = 0;
  for (; n + 32 <= N; n += 32) {
    AmxBlock<MT, 2>(K2, a, lda, b + n, ldb, tail(n), ld_tail, c + n, ldc, load_c);
  }
  if (n < N) AmxBlock<MT, 1>(K2, a, lda, b + n, ldb, tail(n), ld_tail, c + n, ldc, load_c);
}

SDPA_AMX_TARGET void GemmAmx(bool accumulate, std::size_t M, std::size_t N, std::size_t K2,
                             float alpha_s, const std::uint32_t* a, std::size_t lda,
                             const std::uint32_t* b, std::size_t ldb, float* c, std::size_t ldc) {
  // Per thread, kept between calls: A padded to whole tiles, B's last partial pair block, and C
  // for the rows past the last whole tile or when alpha and accumulate need a separate product.
  thread_local std::vector<std::uint32_t> a_pad, b_tail;
  thread_local std::vector<float> c_tmp;
  const std::size_t K2r = (K2 + 15) / 16 * 16, Mr = (M + 15) / 16 * 16;
  if (K2 == 0 || M == 0 || N == 0) {
    for (std::size_t m = 0; m < M; ++m) {
      if (!accumulate) std::fill(c + m * ldc, c + m * ldc + N, 0.0f);
    }
    return;
  }
  if (K2r != K2 || Mr != M) {  // zero pairs past K2 and zero rows past M: whole tiles
    a_pad.assign(Mr * K2r, 0u);
    for (std::size_t m = 0; m < M; ++m) std::copy_n(a + m * lda, K2, a_pad.data() + m * K2r);
    a = a_pad.data();
    lda = K2r;
  }
  if (K2r != K2) {
    b_tail.assign(16 * N, 0u);
    const std::size_t k0 = K2r - 16;
    for (std::size_t k = k0; k < K2; ++k) std::copy_n(b + k * ldb, N, b_tail.data() + (k - k0) * N);
  }
  // Where the tiles store: c itself when every row is whole and no alpha is left to apply to a
  // sum with C, else c_tmp (Mr x N), combined into c afterwards.
  const bool direct = Mr == M && (!accumulate || alpha_s == 1.0f);
  float* cc = c;
  std::size_t ldcc = ldc;
  if (!direct) {
    c_tmp.resize(Mr * N);
    cc = c_tmp.data();
    ldcc = N;
  }
  const bool load_c = direct && accumulate;
  const std::uint32_t* bt = K2r != K2 ? b_tail.data() : nullptr;
  CompilerBarrier();
  _tile_loadconfig(&kTileConfig);
  std::size_t m = 0;
  for (; m + 32 <= Mr; m += 32) {
    AmxRowPanel<2>(N, K2, a + m * lda, lda, b, ldb, bt, N, cc + m * ldcc, ldcc, load_c);
  }
  if (m < Mr) AmxRowPanel<1>(N, K2, a + m * lda, lda, b, ldb, bt, N, cc + m * ldcc, ldcc, load_c);
  _tile_release();
  CompilerBarrier();
  const __m512 alpha = _mm512_set1_ps(alpha_s);
  if (direct) {
    if (alpha_s == 1.0f) return;
    for (std::size_t r = 0; r < M; ++r) {
      float* cr = c + r * ldc;
      for (std::size_t n = 0; n < N; n += 16) {
        _mm512_storeu_ps(cr + n, _mm512_mul_ps(alpha, _mm512_loadu_ps(cr + n)));
      }
    }
    return;
  }
  for (std::size_t r = 0; r < M; ++r) {
    float* cr = c + r * ldc;
    const float* tr = cc + r * ldcc;
    for (std::size_t n = 0; n < N; n += 16) {
      const __m512 t = _mm512_loadu_ps(tr + n);
      _mm512_storeu_ps(cr + n, accumulate ? _mm512_fmadd_ps(alpha, t, _mm512_loadu_ps(cr + n))
                                          : _mm512_mul_ps(alpha, t));
    }
  }
}

#define SDPA_BF16_BW_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// x as hi + lo: 16 float32 to two vectors of 16 bfloat16 (lo = 0 where x is not finite).
SDPA_BF16_BW_TARGET inline void SplitNative(__m512 x, __m256i* hi, __m256i* lo) {
  const __m256bh h = _mm512_cvtneps_pbh(x);
  const __m512 rest = _mm512_sub_ps(x, _mm512_cvtpbh_ps(h));
  // Finite: the exponent bits are not all ones.
  const __m512i bits = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7f800000));
  const __mmask16 finite = _mm512_cmpneq_epi32_mask(bits, _mm512_set1_epi32(0x7f800000));
  *hi = (__m256i)h;
  *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mov_ps(finite, rest));
}

SDPA_BF16_BW_TARGET void PackRowsSplitNative(const float* src, std::size_t M, std::size_t K,
                                             std::size_t ld_src, std::uint32_t* hi,
                                             std::uint32_t* lo, std::size_t lda) {
  for (std::size_t m = 0; m < M; ++m) {
    const float* s = src + m * ld_src;
    auto* h = reinterpret_cast<std::uint16_t*>(hi + m * lda);
    auto* l = reinterpret_cast<std::uint16_t*>(lo + m * lda);
    std::size_t k = 0;
    for (; k + 16 <= K; k += 16) {
      __m256i vh, vl;
      SplitNative(_mm512_loadu_ps(s + k), &vh, &vl);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + k), vh);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + k), vl);
    }
    for (; k < K; ++k) {
      h[k] = from_float(s[k]);
      l[k] = std::isfinite(s[k]) ? from_float(s[k] - to_float(h[k])) : std::uint16_t{0};
    }
    std::fill(h + K, h + 2 * lda, std::uint16_t{0});
    std::fill(l + K, l + 2 * lda, std::uint16_t{0});
  }
}

// Rows 2 k2 and 2 k2 + 1 of float32, 16 columns at a time: vcvtne2ps2bf16 rounds both into one
// vector (odd row's in the upper half), vpermw interleaves them into the pairs.
alignas(64) constexpr std::uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

SDPA_BF16_BW_TARGET void PackRowPairsRoundedNative(const float* src, std::size_t K, std::size_t N,
                                                   std::size_t ld_src, std::uint32_t* dst,
                                                   std::size_t ldb) {
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (std::size_t k = 0; k < K; k += 2) {
    const float* even = src + k * ld_src;
    std::uint32_t* d = dst + (k / 2) * ldb;
    const bool pair = k + 1 < K;
    std::size_t n = 0;
    for (; n + 16 <= N; n += 16) {
      const __m512 odd = pair ? _mm512_loadu_ps(even + ld_src + n) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(odd, _mm512_loadu_ps(even + n));
      _mm512_storeu_si512(d + n, _mm512_permutexvar_epi16(idx, both));
    }
    for (; n < N; ++n) {
      d[n] = std::uint32_t{from_float(even[n])} |
             (pair ? std::uint32_t{from_float(even[ld_src + n])} << 16 : 0u);
    }
    std::fill(d + N, d + ldb, 0u);
  }
}

// Two vectors of 16 bfloat16 (rows 2 k2 and 2 k2 + 1) as 16 pairs.
SDPA_BF16_BW_TARGET inline __m512i InterleaveNative(__m512i idx, __m256i even, __m256i odd) {
  return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1));
}

SDPA_BF16_BW_TARGET void PackRowPairsSplitNative(const float* src, std::size_t K, std::size_t N,
                                                 std::size_t ld_src, std::uint32_t* hi,
                                                 std::uint32_t* lo, std::size_t ldb) {
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (std::size_t k = 0; k < K; k += 2) {
    const float* even = src + k * ld_src;
    std::uint32_t* dh = hi + (k / 2) * ldb;
    std::uint32_t* dl = lo + (k / 2) * ldb;
    const bool pair = k + 1 < K;
    std::size_t n = 0;
    for (; n + 16 <= N; n += 16) {
      __m256i eh, el, oh, ol;
      SplitNative(_mm512_loadu_ps(even + n), &eh, &el);
      SplitNative(pair ? _mm512_loadu_ps(even + ld_src + n) : _mm512_setzero_ps(), &oh, &ol);
      _mm512_storeu_si512(dh + n, InterleaveNative(idx, eh, oh));
      _mm512_storeu_si512(dl + n, InterleaveNative(idx, el, ol));
    }
    for (; n < N; ++n) {
      const auto split = [](float x, std::uint16_t* h, std::uint16_t* l) {
        *h = from_float(x);
        *l = std::isfinite(x) ? from_float(x - to_float(*h)) : std::uint16_t{0};
      };
      std::uint16_t he, le, ho = 0, lo_odd = 0;
      split(even[n], &he, &le);
      if (pair) split(even[ld_src + n], &ho, &lo_odd);
      dh[n] = std::uint32_t{he} | std::uint32_t{ho} << 16;
      dl[n] = std::uint32_t{le} | std::uint32_t{lo_odd} << 16;
    }
    std::fill(dh + N, dh + ldb, 0u);
    std::fill(dl + N, dl + ldb, 0u);
  }
}
#endif  // SDPA_BF16_NATIVE

bool use_native() { return cpu_has_bf16() && !forced_fallback.load(std::memory_order_relaxed); }

bool use_amx() {
  return use_native() && !forced_amx_off.load(std::memory_order_relaxed) && cpu_has_amx();
}

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

bool amx() { return use_amx(); }

bool dot_pairs_in_kernel() {
  const int forced = forced_pairs.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1 && use_native();
#if SDPA_BF16_NATIVE
  return cpu_vendor() == CpuVendor::amd && use_native();
#else
  return false;
#endif
}

bool pairs_in_kernel() {
  const int forced = forced_pairs.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1 && use_native();
  return dot_pairs_in_kernel() || use_amx();
}

void force_pairs_in_kernel_for_test(int mode) {
  forced_pairs.store(mode < 0 ? -1 : mode > 0 ? 1 : 0, std::memory_order_relaxed);
}

void force_fallback_for_test(bool fallback) {
  forced_fallback.store(fallback, std::memory_order_relaxed);
}

void force_amx_off_for_test(bool off) { forced_amx_off.store(off, std::memory_order_relaxed); }

void gemm(bool accumulate, std::size_t M, std::size_t N, std::size_t K2, float alpha,
          const std::uint32_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb,
          float* c, std::size_t ldc) {
#if SDPA_BF16_NATIVE
  if (use_amx()) {
    GemmAmx(accumulate, M, N, K2, alpha, a, lda, b, ldb, c, ldc);
    return;
  }
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
#if SDPA_BF16_NATIVE
  if (use_native()) {
    PackRowPairsRoundedNative(src, K, N, ld_src, dst, ldb);
    return;
  }
#endif
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

void pack_rows_split(const float* src, std::size_t M, std::size_t K, std::size_t ld_src,
                     std::uint32_t* hi, std::uint32_t* lo, std::size_t lda) {
#if SDPA_BF16_NATIVE
  if (use_native()) {
    PackRowsSplitNative(src, M, K, ld_src, hi, lo, lda);
    return;
  }
#endif
  std::vector<float> rest(K);
  for (std::size_t m = 0; m < M; ++m) {
    const float* s = src + m * ld_src;
    for (std::size_t k = 0; k < K; ++k) {
      rest[k] = std::isfinite(s[k]) ? s[k] - to_float(from_float(s[k])) : 0.0f;
    }
    pack_rows_rounded(s, 1, K, ld_src, hi + m * lda, lda);
    pack_rows_rounded(rest.data(), 1, K, K, lo + m * lda, lda);
  }
}

void pack_row_pairs_split(const float* src, std::size_t K, std::size_t N, std::size_t ld_src,
                          std::uint32_t* hi, std::uint32_t* lo, std::size_t ldb) {
#if SDPA_BF16_NATIVE
  if (use_native()) {
    PackRowPairsSplitNative(src, K, N, ld_src, hi, lo, ldb);
    return;
  }
#endif
  std::vector<float> rest(K * N);
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t n = 0; n < N; ++n) {
      const float x = src[k * ld_src + n];
      rest[k * N + n] = std::isfinite(x) ? x - to_float(from_float(x)) : 0.0f;
    }
  }
  pack_row_pairs_rounded(src, K, N, ld_src, hi, ldb);
  pack_row_pairs_rounded(rest.data(), K, N, N, lo, ldb);
}

void pack_columns(const std::uint16_t* const* rows, std::size_t K, std::size_t M,
                  std::uint32_t* dst, std::size_t lda) {
  const std::size_t K2 = (K + 1) / 2;
  for (std::size_t m = 0; m < M; ++m) {
    std::uint32_t* d = dst + m * lda;
    for (std::size_t k2 = 0; k2 < K2; ++k2) {
      const std::uint16_t* even = rows[2 * k2];
      const std::uint16_t* odd = 2 * k2 + 1 < K ? rows[2 * k2 + 1] : nullptr;
      d[k2] = std::uint32_t{even != nullptr ? even[m] : std::uint16_t{0}} |
              std::uint32_t{odd != nullptr ? odd[m] : std::uint16_t{0}} << 16;
    }
    std::fill(d + K2, d + lda, 0u);
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
