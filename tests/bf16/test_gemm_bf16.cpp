// The bfloat16 micro-kernel of kernels/gemm_bf16.h against a float64 product of the same
// bfloat16 values, on each of its paths: AMX tiles (skipped where the CPU lacks AMX-BF16),
// vdpbf16ps (skipped where it lacks AVX512_BF16; the tiles turned off through the test hook)
// and the converting fallback (forced through the test hook). Asserted, per the header's
// contract:
//   - every element within (K + 3) float32 roundoffs of |alpha| sum_k |A B| + |C_in|, on odd
//     shapes (M not a multiple of the 6-row panel nor of the 16-row tile, N not of the 4-vector
//     block nor of the two-tile block, K odd, so the zero pad pair is used, and K2 not a
//     multiple of a tile's 16 pairs), with both B packings, leading dimensions past the row ends
//     (their padding holds NaN, which must never be read) and C's columns past N left untouched;
//   - the rounding of float32 to bfloat16 (nearest even, NaN, inf, overflow, -0);
//   - denormals: the native path counts a bfloat16 denormal input as 0 and flushes a denormal
//     product to 0; the fallback computes both exactly; normal tiny products are exact on both.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/gemm_bf16.h"

namespace {

namespace bf16 = sdpa::detail::bf16;
using std::size_t;
using std::uint16_t;
using std::uint32_t;

constexpr uint16_t kBf16NaN = 0x7fc0;
constexpr double kU = 0x1p-24;  // float32 unit roundoff

enum class Path { amx, native, fallback };  // native: vdpbf16ps

class Bf16Gemm : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    bf16::force_fallback_for_test(false);
    bf16::force_amx_off_for_test(false);
    if (GetParam() == Path::amx && !bf16::amx()) GTEST_SKIP() << "this CPU has no AMX-BF16";
    if (GetParam() == Path::native && !bf16::native()) {
      GTEST_SKIP() << "this CPU has no AVX512_BF16";
    }
    bf16::force_fallback_for_test(GetParam() == Path::fallback);
    bf16::force_amx_off_for_test(GetParam() != Path::amx);
    ASSERT_EQ(bf16::native(), GetParam() != Path::fallback);
    ASSERT_EQ(bf16::amx(), GetParam() == Path::amx);
  }
  void TearDown() override {
    bf16::force_fallback_for_test(false);
    bf16::force_amx_off_for_test(false);
  }
};

std::string PathName(const ::testing::TestParamInfo<Path>& info) {
  switch (info.param) {
    case Path::amx:
      return "amx";
    case Path::native:
      return "native";
    case Path::fallback:
      break;
  }
  return "fallback";
}

// A row-major K x N bfloat16 matrix with leading dimension ld; the padding holds NaN.
std::vector<uint16_t> random_bf16(size_t rows, size_t cols, size_t ld, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> x(rows * ld, kBf16NaN);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) x[r * ld + c] = bf16::from_float(normal(rng));
  }
  return x;
}

size_t ceil_half(size_t k) { return (k + 1) / 2; }

void check_product(size_t M, size_t N, size_t K, bool accumulate, float alpha, bool transposed,
                   std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K
                                  << " accumulate=" << accumulate << " alpha=" << alpha
                                  << " transposed=" << transposed);
  const size_t K2 = ceil_half(K), lda = K2 + 3, ldb = N + 16, ldc = N + 5;
  const size_t ld_a_src = K + 3;
  const std::vector<uint16_t> a = random_bf16(M, K, ld_a_src, rng);
  // B as K x N rows (pack_row_pairs) or as its transpose T = N x K (pack_transposed).
  const size_t ld_b_src = transposed ? K + 1 : N + 7;
  const std::vector<uint16_t> b =
      transposed ? random_bf16(N, K, ld_b_src, rng) : random_bf16(K, N, ld_b_src, rng);
  const auto B = [&](size_t k, size_t n) {
    return double(bf16::to_float(transposed ? b[n * ld_b_src + k] : b[k * ld_b_src + n]));
  };
  std::vector<uint32_t> ap(M * lda, 0xdeadbeef), bp(K2 * ldb, 0xdeadbeef);
  bf16::pack_rows(a.data(), M, K, ld_a_src, ap.data(), lda);
  if (transposed) {
    bf16::pack_transposed(b.data(), N, K, ld_b_src, bp.data(), ldb);
  } else {
    bf16::pack_row_pairs(b.data(), K, N, ld_b_src, bp.data(), ldb);
  }

  constexpr float kSentinel = 12345.f;
  std::normal_distribution<float> normal;
  std::vector<float> c(M * ldc, kSentinel), c_in(M * N);
  for (size_t m = 0; m < M; ++m) {
    for (size_t n = 0; n < N; ++n) c[m * ldc + n] = c_in[m * N + n] = normal(rng);
  }
  bf16::gemm(accumulate, M, N, K2, alpha, ap.data(), lda, bp.data(), ldb, c.data(), ldc);

  double worst = 0;
  for (size_t m = 0; m < M; ++m) {
    for (size_t n = 0; n < N; ++n) {
      double exact = 0, magnitude = 0;
      for (size_t k = 0; k < K; ++k) {
        const double p = double(bf16::to_float(a[m * ld_a_src + k])) * B(k, n);
        exact += p;
        magnitude += std::fabs(p);
      }
      exact *= alpha;
      magnitude *= std::fabs(alpha);
      if (accumulate) {
        exact += c_in[m * N + n];
        magnitude += std::fabs(c_in[m * N + n]);
      }
      const double err = std::fabs(double(c[m * ldc + n]) - exact);
      const double bound = double(K + 3) * kU * magnitude;
      ASSERT_LE(err, bound) << "at m=" << m << " n=" << n << ": " << c[m * ldc + n] << " vs "
                            << exact;
      worst = std::max(worst, magnitude > 0 ? err / (kU * magnitude) : 0.0);
    }
    for (size_t n = N; n < ldc; ++n) ASSERT_EQ(c[m * ldc + n], kSentinel) << "overrun at " << m;
  }
  ::testing::Test::RecordProperty("worst_error_in_roundoffs", std::to_string(worst));
}

TEST_P(Bf16Gemm, MatchesFloat64ProductOnOddShapes) {
  std::mt19937_64 rng(20);
  for (size_t M : {1, 5, 6, 7, 13, 33, 64, 100}) {
    for (size_t N : {16, 48, 64, 80, 128}) {
      for (size_t K : {1, 2, 3, 17, 64, 129}) {
        const bool transposed = (M + K) % 2 == 0;
        check_product(M, N, K, false, 1.0f, transposed, rng);
        check_product(M, N, K, true, 0.0883883f, !transposed, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(Bf16Gemm, RoundsFloatToNearestEven) {
  // Ties between neighbours: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (odd last bit), so it
  // goes to 1; 1 + 3 * 2^-8 lies between 1 + 2^-7 and 1 + 2^-6 and goes to the even 1 + 2^-6.
  EXPECT_EQ(bf16::from_float(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(bf16::from_float(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(bf16::from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie: up
  EXPECT_EQ(bf16::from_float(-0.0f), 0x8000);
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16::from_float(FLT_MAX), 0x7f80);  // past bfloat16's largest finite: inf
  EXPECT_TRUE(std::isnan(bf16::to_float(bf16::from_float(std::nanf("")))));
  // A signalling NaN whose payload sits in the low 16 bits only must not become inf.
  EXPECT_TRUE(std::isnan(bf16::to_float(bf16::from_float(std::bit_cast<float>(0x7f800001u)))));

  // pack_rows_rounded on this path (native: vcvtne2ps2bf16, 32 at a time) rounds every normal
  // float like from_float, pads the odd K's pair and the row with zeros.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  for (size_t K : {1, 31, 32, 33, 70, 128}) {
    const size_t lda = ceil_half(K) + 2, ld = K + 1;
    std::vector<float> src(3 * ld);
    for (float& x : src) x = normal(rng) * 100.f;
    std::vector<uint32_t> dst(3 * lda, 0xdeadbeef);
    bf16::pack_rows_rounded(src.data(), 3, K, ld, dst.data(), lda);
    for (size_t m = 0; m < 3; ++m) {
      for (size_t k = 0; k < 2 * lda; ++k) {
        const uint32_t w = dst[m * lda + k / 2];
        const auto got = static_cast<uint16_t>(k % 2 == 0 ? w : w >> 16);
        const uint16_t want = k < K ? bf16::from_float(src[m * ld + k]) : 0;
        ASSERT_EQ(got, want) << "K=" << K << " m=" << m << " k=" << k;
        if (k < K) {
          const double x = src[m * ld + k];
          ASSERT_LE(std::fabs(bf16::to_float(got) - x), 0x1p-8 * std::fabs(x));  // half an ulp
        }
      }
    }
  }
}

// pack_row_pairs_rounded (native: 16 columns per vcvtne2ps2bf16 and vpermw, then a scalar tail),
// the two split packings (hi and lo) and pack_columns against their definitions: every pair, the
// odd K's zero partner, the zero padding up to the leading dimension, null rows as zeros.
TEST_P(Bf16Gemm, PairPackingMatchesItsDefinition) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  for (size_t K : {1, 2, 7, 64}) {
    for (size_t N : {1, 16, 21, 128}) {
      const size_t ld_src = N + 3, ldb = N + 9;
      std::vector<float> src(K * ld_src);
      for (float& x : src) x = normal(rng) * 10.f;
      std::vector<uint32_t> dst(ceil_half(K) * ldb, 0xdeadbeef);
      bf16::pack_row_pairs_rounded(src.data(), K, N, ld_src, dst.data(), ldb);
      for (size_t k2 = 0; k2 < ceil_half(K); ++k2) {
        for (size_t n = 0; n < ldb; ++n) {
          const uint16_t even = n < N ? bf16::from_float(src[2 * k2 * ld_src + n]) : 0;
          const uint16_t odd =
              n < N && 2 * k2 + 1 < K ? bf16::from_float(src[(2 * k2 + 1) * ld_src + n]) : 0;
          ASSERT_EQ(dst[k2 * ldb + n], uint32_t{even} | uint32_t{odd} << 16)
              << "K=" << K << " N=" << N << " k2=" << k2 << " n=" << n;
        }
      }
      // The split packings: hi = x rounded, lo = (x - hi) rounded, both in the same layout;
      // an inf gets lo = 0.
      src[0] = std::numeric_limits<float>::infinity();
      const auto split = [](float x) {
        const uint16_t h = bf16::from_float(x);
        const uint16_t l = std::isfinite(x) ? bf16::from_float(x - bf16::to_float(h)) : 0;
        return std::pair<uint32_t, uint32_t>{h, l};
      };
      std::vector<uint32_t> hi(ceil_half(K) * ldb, 0xdeadbeef), lo(hi.size(), 0xdeadbeef);
      bf16::pack_row_pairs_split(src.data(), K, N, ld_src, hi.data(), lo.data(), ldb);
      for (size_t k2 = 0; k2 < ceil_half(K); ++k2) {
        for (size_t n = 0; n < ldb; ++n) {
          const auto even =
              n < N ? split(src[2 * k2 * ld_src + n]) : std::pair<uint32_t, uint32_t>{};
          const auto odd = n < N && 2 * k2 + 1 < K ? split(src[(2 * k2 + 1) * ld_src + n])
                                                   : std::pair<uint32_t, uint32_t>{};
          ASSERT_EQ(hi[k2 * ldb + n], even.first | odd.first << 16) << "K=" << K << " n=" << n;
          ASSERT_EQ(lo[k2 * ldb + n], even.second | odd.second << 16) << "K=" << K << " n=" << n;
        }
      }
      // pack_rows_split: rows of N along k (K rows), lda words per row.
      const size_t lda_rows = ceil_half(N) + 1;
      std::vector<uint32_t> rh(K * lda_rows, 0xdeadbeef), rl(rh.size(), 0xdeadbeef);
      bf16::pack_rows_split(src.data(), K, N, ld_src, rh.data(), rl.data(), lda_rows);
      for (size_t m = 0; m < K; ++m) {
        for (size_t k = 0; k < 2 * lda_rows; ++k) {
          const auto want = k < N ? split(src[m * ld_src + k]) : std::pair<uint32_t, uint32_t>{};
          const uint32_t wh = rh[m * lda_rows + k / 2], wl = rl[m * lda_rows + k / 2];
          ASSERT_EQ(k % 2 == 0 ? wh & 0xffffu : wh >> 16, want.first) << "m=" << m << " k=" << k;
          ASSERT_EQ(k % 2 == 0 ? wl & 0xffffu : wl >> 16, want.second) << "m=" << m << " k=" << k;
        }
      }
      // pack_columns: T is K x N bfloat16 (row 1 null when K > 1), A = T^T as N x ceil(K/2).
      const std::vector<uint16_t> t = random_bf16(K, N, ld_src, rng);
      std::vector<const uint16_t*> rows(K);
      for (size_t k = 0; k < K; ++k) rows[k] = k == 1 ? nullptr : t.data() + k * ld_src;
      const size_t lda = ceil_half(K) + 2;
      std::vector<uint32_t> a(N * lda, 0xdeadbeef);
      bf16::pack_columns(rows.data(), K, N, a.data(), lda);
      for (size_t m = 0; m < N; ++m) {
        for (size_t k2 = 0; k2 < lda; ++k2) {
          const auto at = [&](size_t k) -> uint32_t {
            return k < K && rows[k] != nullptr ? rows[k][m] : 0;
          };
          ASSERT_EQ(a[m * lda + k2], at(2 * k2) | at(2 * k2 + 1) << 16)
              << "K=" << K << " m=" << m << " k2=" << k2;
        }
      }
    }
  }
}

// bfloat16 bits of 2^e for a normal e.
uint16_t pow2(int e) { return static_cast<uint16_t>((127 + e) << 7); }

TEST_P(Bf16Gemm, DenormalsAsTheContractSays) {
  const bool native = GetParam() != Path::fallback;
  const size_t N = 16, K2 = 1;
  std::vector<uint32_t> b(N, pow2(0));  // B[0][n] = 1, B[1][n] = 0
  std::vector<float> c(N);
  const auto product = [&](uint16_t a0, uint16_t b0) {
    const uint32_t a = a0;
    std::fill(b.begin(), b.end(), b0);
    bf16::gemm(false, 1, N, K2, 1.0f, &a, 1, b.data(), N, c.data(), N);
    for (size_t n = 1; n < N; ++n) EXPECT_EQ(c[n], c[0]);
    return c[0];
  };
  // A denormal bfloat16 input (2^-133) times 1.
  const float denormal_in = product(0x0001, pow2(0));
  // Two normal inputs whose product, 2^-140, is a float32 denormal.
  const float denormal_out = product(pow2(-70), pow2(-70));
  // Two normal inputs whose product, 2^-120, is normal: exact on both paths.
  EXPECT_EQ(product(pow2(-60), pow2(-60)), 0x1p-120f);
  if (native) {
    EXPECT_EQ(denormal_in, 0.0f) << "the bfloat16 dot products treat a denormal input as zero";
    EXPECT_EQ(denormal_out, 0.0f) << "the bfloat16 dot products flush a denormal result to zero";
  } else {
    EXPECT_EQ(denormal_in, 0x1p-133f);
    EXPECT_EQ(denormal_out, 0x1p-140f);
  }
  // The path-independent bound: at most 2^-126 from the exact value.
  EXPECT_LE(std::fabs(denormal_in - 0x1p-133), 0x1p-126);
  EXPECT_LE(std::fabs(denormal_out - 0x1p-140), 0x1p-126);

  // The rounding pack: the SDM's vcvtne2ps2bf16 flushes a float32 denormal to zero, Zen 5's
  // keeps it (measured), so the native path may give either; the fallback keeps it.
  const float tiny = 0x1p-130f;
  uint32_t packed = 0xdeadbeef;
  bf16::pack_rows_rounded(&tiny, 1, 1, 1, &packed, 1);
  if (native) {
    EXPECT_TRUE(packed == 0u || packed == bf16::from_float(tiny)) << packed;
  } else {
    EXPECT_EQ(packed, bf16::from_float(tiny));
  }
  EXPECT_NE(bf16::from_float(tiny), 0);
}

TEST_P(Bf16Gemm, NonFiniteOperandsPropagate) {
  const size_t N = 32;
  const uint32_t a = pow2(1) | uint32_t{pow2(0)} << 16;  // (2, 1)
  std::vector<uint32_t> b(N, pow2(0));
  b[3] = 0x7f80;                     // B[0][3] = inf
  b[17] = uint32_t{kBf16NaN} << 16;  // B[1][17] = NaN
  std::vector<float> c(N, 1.0f);
  bf16::gemm(true, 1, N, 1, 1.0f, &a, 1, b.data(), N, c.data(), N);
  EXPECT_EQ(c[0], 3.0f);  // 1 + 2 * 1 + 1 * 0
  EXPECT_EQ(c[3], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(c[17]));
}

INSTANTIATE_TEST_SUITE_P(Paths, Bf16Gemm,
                         ::testing::Values(Path::amx, Path::native, Path::fallback), PathName);

// EAX, EBX, ECX, EDX of CPUID (leaf, subleaf), read directly (zeros off x86-64).
std::array<unsigned, 4> cpuid(unsigned leaf, unsigned subleaf) {
  std::array<unsigned, 4> r{};
#if defined(__x86_64__)
  __asm__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
#else
  (void)leaf;
  (void)subleaf;
#endif
  return r;
}

TEST(Bf16Cpu, NativeIffTheCpuReportsAvx512Bf16) {
  bf16::force_fallback_for_test(false);
  // CPUID leaf 7 subleaf 1, EAX bit 5 (AVX512_BF16).
  const bool has = (cpuid(7, 1)[0] >> 5) & 1u;
  // The kernel also requires the OS to save zmm state; on Linux x86-64 it does when AVX-512 is
  // reported at all, so the two agree.
  EXPECT_EQ(bf16::native(), has);
  bf16::force_fallback_for_test(true);
  EXPECT_FALSE(bf16::native());
  bf16::force_fallback_for_test(false);
}

TEST(Bf16Cpu, KernelTakesPairsOnAmdCpusWithAvx512Bf16) {
  // CPUID leaf 0: the vendor string in EBX, EDX, ECX.
  const std::array<unsigned, 4> r = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  const bool amd = std::string(vendor) == "AuthenticAMD";
  const bool chosen = (amd && bf16::native()) || bf16::amx();
  EXPECT_EQ(bf16::pairs_in_kernel(), chosen);
  // vdpbf16ps itself (the decode's pairs) only where it runs at twice the FMA's rate: AMD's,
  // never Intel's, with AMX or without.
  EXPECT_EQ(bf16::dot_pairs_in_kernel(), amd && bf16::native());
  {
    const bf16::ScopedPairsInKernel on(1);
    EXPECT_EQ(bf16::pairs_in_kernel(), bf16::native());
    EXPECT_EQ(bf16::dot_pairs_in_kernel(), bf16::native());
    bf16::force_fallback_for_test(true);
    EXPECT_FALSE(bf16::pairs_in_kernel()) << "the pairs need vdpbf16ps";
    EXPECT_FALSE(bf16::dot_pairs_in_kernel()) << "the pairs need vdpbf16ps";
    bf16::force_fallback_for_test(false);
  }
  {
    const bf16::ScopedPairsInKernel off(0);
    EXPECT_FALSE(bf16::pairs_in_kernel());
    EXPECT_FALSE(bf16::dot_pairs_in_kernel());
  }
  {
    const bf16::ScopedAmxOff off;
    EXPECT_EQ(bf16::pairs_in_kernel(), amd && bf16::native());
    EXPECT_EQ(bf16::dot_pairs_in_kernel(), amd && bf16::native());
  }
  EXPECT_EQ(bf16::pairs_in_kernel(), chosen);
}

TEST(Bf16Cpu, AmxIffTheCpuReportsItAndLinuxGrantsTheTiles) {
  // CPUID leaf 7 subleaf 0, EDX bit 22 (AMX-BF16) and bit 24 (AMX-TILE).
  const unsigned edx = cpuid(7, 0)[3];
  const bool reported = bf16::native() && ((edx >> 22) & 1u) != 0 && ((edx >> 24) & 1u) != 0;
  EXPECT_LE(bf16::amx(), reported) << "AMX taken on a CPU that does not report it";
#if defined(__linux__) && defined(__x86_64__)
  // ARCH_GET_XCOMP_PERM: the state components this process may use; bit 18 is the tile data,
  // granted once amx() has asked for it.
  unsigned long long permitted = 0;
  ASSERT_EQ(syscall(SYS_arch_prctl, 0x1022, &permitted), 0);
  EXPECT_EQ(bf16::amx(), reported && ((permitted >> 18) & 1u) != 0);
#endif
  bf16::force_amx_off_for_test(true);
  EXPECT_FALSE(bf16::amx());
  bf16::force_amx_off_for_test(false);
}

}  // namespace
