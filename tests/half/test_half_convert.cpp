// The scalar float16/bfloat16 conversions of core/half.h against an independent float64 oracle:
// every 16-bit pattern round-trips, and narrowing float32 and float64 rounds to the nearest
// representable value (ties to even), with inf, NaN, signed zero and float16 subnormals right.
// Also: Array::astype and .npy files of both formats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::detail::bfloat16_to_float;
using sdpa::detail::float16_to_float;
using sdpa::detail::float64_to_bfloat16;
using sdpa::detail::float64_to_float16;
using sdpa::detail::float_to_bfloat16;
using sdpa::detail::float_to_float16;

// ---- The oracle: formats described by their fields, values computed in float64 -------------

struct Format {
  const char* name;
  int exp_bits, man_bits;
  std::uint16_t (*from_float)(float);
  float (*to_float)(std::uint16_t);
  std::uint16_t (*from_double)(double);

  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  std::uint16_t exp_mask() const {
    return static_cast<std::uint16_t>(((1u << exp_bits) - 1u) << man_bits);
  }
  std::uint16_t man_mask() const { return static_cast<std::uint16_t>((1u << man_bits) - 1u); }
  bool is_nan(std::uint16_t b) const {
    return (b & exp_mask()) == exp_mask() && (b & man_mask()) != 0;
  }
  /// The value of a non-NaN pattern, from the definition (subnormals: exponent 1 - bias).
  double value(std::uint16_t b) const {
    const int e = (b & exp_mask()) >> man_bits;
    const int m = b & man_mask();
    const double sign = (b & 0x8000u) ? -1.0 : 1.0;
    if (e == (1 << exp_bits) - 1) return sign * std::numeric_limits<double>::infinity();
    if (e == 0) return sign * std::ldexp(m, 1 - bias() - man_bits);
    return sign * std::ldexp((1 << man_bits) + m, e - bias() - man_bits);
  }
  std::uint16_t max_finite() const { return static_cast<std::uint16_t>(exp_mask() - 1u); }
};

const Format kFloat16{"float16", 5, 10, float_to_float16, float16_to_float, float64_to_float16};
const Format kBFloat16{"bfloat16", 8, 7, float_to_bfloat16, bfloat16_to_float, float64_to_bfloat16};

/// The correctly rounded pattern of a non-NaN x: the nearest finite value (ties to the even
/// pattern), or inf from max + half an ulp on (IEEE 754: overflow is judged as if the exponent
/// range were unbounded, which puts the cut exactly there).
std::uint16_t oracle_round(const Format& f, double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(x);
  const std::uint16_t top = f.max_finite();
  const double max = f.value(top);
  const double cut = max + (max - f.value(static_cast<std::uint16_t>(top - 1))) / 2;
  if (a >= cut) return static_cast<std::uint16_t>(sign | f.exp_mask());
  // Positive patterns 0..top are ordered like their values: binary search the first >= a.
  std::uint32_t lo = 0, hi = top;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (f.value(static_cast<std::uint16_t>(mid)) < a) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  std::uint32_t best = lo;
  if (lo > 0) {
    const double above = f.value(static_cast<std::uint16_t>(lo)) - a;
    const double below = a - f.value(static_cast<std::uint16_t>(lo - 1));
    if (below < above || (below == above && ((lo - 1) & 1u) == 0)) best = lo - 1;
  }
  return static_cast<std::uint16_t>(sign | best);
}

std::string hex(std::uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", x);
  return buf;
}

class Convert : public ::testing::TestWithParam<const Format*> {};

TEST_P(Convert, EveryPatternWidensExactlyAndRoundTrips) {
  const Format& f = *GetParam();
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float w = f.to_float(h);
    if (f.is_nan(h)) {
      ASSERT_TRUE(std::isnan(w)) << hex(b);
      ASSERT_EQ(std::signbit(w), (b & 0x8000u) != 0) << hex(b);
      ASSERT_NE(std::bit_cast<std::uint32_t>(w) & 0x400000u, 0u) << hex(b) << " widens quiet";
      // Back to the same NaN, made quiet (the top mantissa bit set), payload kept.
      const std::uint16_t quiet = static_cast<std::uint16_t>(b | (1u << (f.man_bits - 1)));
      ASSERT_EQ(f.from_float(w), quiet) << hex(b);
      ASSERT_EQ(f.from_double(w), quiet) << hex(b);
      continue;
    }
    ASSERT_EQ(static_cast<double>(w), f.value(h)) << f.name << " " << hex(b);
    ASSERT_EQ(std::signbit(w), (b & 0x8000u) != 0) << hex(b);  // -0 stays -0
    ASSERT_EQ(f.from_float(w), h) << f.name << " " << hex(b);
    ASSERT_EQ(f.from_double(static_cast<double>(w)), h) << f.name << " " << hex(b);
  }
}

// Each value, the midpoints between neighbours, and one float32 ulp either side of both: where
// rounding goes wrong if it goes wrong anywhere.
TEST_P(Convert, NarrowingFloat32RoundsToNearestEvenAtEveryBoundary) {
  const Format& f = *GetParam();
  std::int64_t checked = 0;
  for (std::uint32_t b = 0; b <= f.max_finite(); ++b) {
    const double v = f.value(static_cast<std::uint16_t>(b));
    const double next = b < f.max_finite() ? f.value(static_cast<std::uint16_t>(b + 1))
                                           : 2 * v - f.value(static_cast<std::uint16_t>(b - 1));
    const float points[] = {static_cast<float>(v), static_cast<float>((v + next) / 2)};
    for (const float p : points) {
      const float around[] = {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY)};
      for (const float x : around) {
        for (const float s : {x, -x}) {
          ASSERT_EQ(f.from_float(s), oracle_round(f, s))
              << f.name << " of " << s << " (" << hex(std::bit_cast<std::uint32_t>(s)) << ")";
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 6 * static_cast<std::int64_t>(f.max_finite()));
}

TEST_P(Convert, NarrowingRandomFloat32BitPatterns) {
  const Format& f = *GetParam();
  std::mt19937 rng(20);
  for (int i = 0; i < 1000000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (std::isnan(x)) {
      const std::uint16_t h = f.from_float(x);
      ASSERT_TRUE(f.is_nan(h)) << hex(std::bit_cast<std::uint32_t>(x));
      ASSERT_EQ((h & 0x8000u) != 0, std::signbit(x));
      continue;
    }
    ASSERT_EQ(f.from_float(x), oracle_round(f, x)) << f.name << " of " << x;
  }
}

TEST_P(Convert, SpecialValues) {
  const Format& f = *GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f.from_float(inf), f.exp_mask());
  EXPECT_EQ(f.from_float(-inf), 0x8000u | f.exp_mask());
  EXPECT_EQ(f.from_float(0.0f), 0u);
  EXPECT_EQ(f.from_float(-0.0f), 0x8000u);
  EXPECT_EQ(f.from_float(std::numeric_limits<float>::denorm_min()), 0u);
  EXPECT_EQ(f.from_float(std::numeric_limits<float>::max()), f.exp_mask());  // overflow: inf
  EXPECT_TRUE(std::isinf(f.to_float(f.exp_mask())));
  // Signalling float32 NaNs (quiet bit clear), with a payload only in the low bits that a
  // truncation would drop: still NaN, and quiet.
  for (const std::uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fc00000u}) {
    const std::uint16_t h = f.from_float(std::bit_cast<float>(nan));
    EXPECT_TRUE(f.is_nan(h)) << hex(nan);
    EXPECT_NE(h & (1u << (f.man_bits - 1)), 0u) << hex(nan) << " quiet";
    EXPECT_EQ((h & 0x8000u) != 0, (nan & 0x80000000u) != 0);
    EXPECT_TRUE(f.is_nan(f.from_double(std::bit_cast<float>(nan))));
  }
}

// Narrowing float64 in one rounding: just above or below a midpoint, where rounding first to
// float32 would land on the midpoint and then tie to even, the wrong way half of the time.
TEST_P(Convert, NarrowingFloat64HasNoDoubleRounding) {
  const Format& f = *GetParam();
  std::mt19937_64 rng(7);
  std::int64_t differs_from_via_float = 0;
  for (int i = 0; i < 200000; ++i) {
    const auto b = static_cast<std::uint16_t>(rng() % f.max_finite());
    const double lo = f.value(b), hi = f.value(static_cast<std::uint16_t>(b + 1));
    const double mid = (lo + hi) / 2;
    const double tiny = (hi - lo) * std::ldexp(1.0, -30 - static_cast<int>(rng() % 8));
    for (const double x : {mid + tiny, mid - tiny, mid, lo + tiny, hi - tiny,
                           lo + (hi - lo) * std::ldexp(static_cast<double>(rng() >> 11), -53)}) {
      for (const double s : {x, -x}) {
        const std::uint16_t want = oracle_round(f, s);
        ASSERT_EQ(f.from_double(s), want) << f.name << " of " << s;
        if (f.from_float(static_cast<float>(s)) != want) ++differs_from_via_float;
      }
    }
  }
  // The test has teeth: the naive float64 -> float32 -> 16-bit path fails on many of these.
  EXPECT_GT(differs_from_via_float, 1000);
  EXPECT_EQ(f.from_double(1e300), f.exp_mask());
  EXPECT_EQ(f.from_double(-1e300), 0x8000u | f.exp_mask());
  EXPECT_EQ(f.from_double(1e-300), 0u);
  EXPECT_EQ(f.from_double(-1e-300), 0x8000u);
}

INSTANTIATE_TEST_SUITE_P(Formats, Convert, ::testing::Values(&kFloat16, &kBFloat16),
                         [](const auto& info) { return std::string(info.param->name); });

TEST(Float16, KnownValues) {
  EXPECT_EQ(float_to_float16(1.0f), 0x3c00u);
  EXPECT_EQ(float_to_float16(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_float16(65519.0f), 0x7bffu);
  EXPECT_EQ(float_to_float16(65520.0f), 0x7c00u);      // the tie goes to even: inf
  EXPECT_EQ(float_to_float16(0x1p-24f), 0x0001u);      // smallest subnormal
  EXPECT_EQ(float_to_float16(0x1p-25f), 0x0000u);      // its half: a tie, to even (zero)
  EXPECT_EQ(float_to_float16(0x1.8p-24f), 0x0002u);    // 1.5 ulp: a tie, to even (2)
  EXPECT_EQ(float_to_float16(0x1p-14f), 0x0400u);      // smallest normal
  EXPECT_EQ(float_to_float16(0x1.ffcp-15f), 0x0400u);  // largest subnormal + half ulp -> normal
  EXPECT_EQ(float16_to_float(0x3555u), 0x1.554p-2f);
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80u);
  EXPECT_EQ(float_to_bfloat16(0x1.01p0f), 0x3f80u);  // a tie, to even
  EXPECT_EQ(float_to_bfloat16(0x1.03p0f), 0x3f82u);  // a tie, to even (up)
}

// ---- Array::astype and .npy ----------------------------------------------------------------

TEST(HalfArray, AstypeRoundsOnceAndWidensExactly) {
  sdpa::Array d(sdpa::DType::float64, {3, 5});
  const double values[] = {
      1.0,  -2.5,  65504.0, 65520.0, 1e-8,  0x1p-24, 1.0 + 0x1p-11 + 0x1p-40, -0.0, 3.14,
      1e30, -1e30, 0x1p-14, 0.1,     100.0, 1.0 / 3};
  for (int i = 0; i < 15; ++i) d.data_as<double>()[i] = values[i];
  for (const Format* f : {&kFloat16, &kBFloat16}) {
    const sdpa::DType t = f == &kFloat16 ? sdpa::DType::float16 : sdpa::DType::bfloat16;
    const sdpa::Array h = d.astype(t);
    ASSERT_EQ(h.dtype(), t);
    ASSERT_EQ(sdpa::dtype_size(h.dtype()), 2u);
    const sdpa::Array back = h.astype(sdpa::DType::float64);
    const sdpa::Array back32 = h.astype(sdpa::DType::float32);
    for (int i = 0; i < 15; ++i) {
      const std::uint16_t bits = h.data_as<std::uint16_t>()[i];
      EXPECT_EQ(bits, oracle_round(*f, values[i])) << f->name << " of " << values[i];
      EXPECT_EQ(back.data_as<double>()[i], f->value(bits));
      EXPECT_EQ(static_cast<double>(back32.data_as<float>()[i]), f->value(bits));
    }
  }
  EXPECT_STREQ(sdpa::dtype_name(sdpa::DType::float16), "float16");
  EXPECT_STREQ(sdpa::dtype_name(sdpa::DType::bfloat16), "bfloat16");
}

TEST(HalfArray, NpyRoundTripsBothFormats) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdpa_half_npy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const sdpa::DType t : {sdpa::DType::float16, sdpa::DType::bfloat16}) {
    sdpa::Array a(t, {2, 3, 7});
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      a.data_as<std::uint16_t>()[i] = static_cast<std::uint16_t>(i * 977 + 3);
    }
    const std::string p = (dir / (std::string(sdpa::dtype_name(t)) + ".npy")).string();
    sdpa::write_npy(p, a);
    // The header says '<f2' for float16, and '<u2' (the bit patterns) for bfloat16.
    std::FILE* file = std::fopen(p.c_str(), "rb");
    ASSERT_NE(file, nullptr);
    std::string head(128, '\0');
    head.resize(std::fread(head.data(), 1, head.size(), file));
    std::fclose(file);
    EXPECT_NE(head.find(t == sdpa::DType::float16 ? "'<f2'" : "'<u2'"), std::string::npos) << head;
    const sdpa::Array b = sdpa::read_npy(p);
    ASSERT_EQ(b.dtype(), t);
    ASSERT_EQ(b.shape(), a.shape());
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_EQ(b.data_as<std::uint16_t>()[i], a.data_as<std::uint16_t>()[i]);
    }
  }
  fs::remove_all(dir);
}

}  // namespace
