// Scalar conversions between float32/float64 and the two 16-bit floating-point formats.
//
//   float16  (IEEE 754 binary16): 1 sign, 5 exponent, 10 mantissa bits; largest finite 65504,
//            smallest normal 2^-14, subnormals down to 2^-24.
//   bfloat16: the top 16 bits of a float32 (1 sign, 8 exponent, 7 mantissa bits): the same
//            range as float32 with 8 bits of precision.
//
// Both are stored as std::uint16_t bit patterns. Every narrowing conversion rounds to nearest,
// ties to even; values beyond the largest finite one round to +-inf as IEEE 754 says; inf stays
// inf; NaN stays NaN with its sign, always quiet (the quiet bit set, as F16C's vcvtps2ph and
// vcvtph2ps and AVX512_BF16's vcvtneps2bf16 do). Widening is exact (a NaN comes back quiet).
// float64 narrows in one rounding (no double rounding through float32).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace sdpa::detail {

// ---- float16 -------------------------------------------------------------------------------

inline float float16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) {  // inf, or NaN made quiet (float32's quiet bit is 0x400000)
    return std::bit_cast<float>(sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  }
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float32
    const float magnitude = static_cast<float>(m) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  // Normal: rebias the exponent from 15 to 127 (+112).
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

inline std::uint16_t float_to_float16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, top 9 payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  // 65520 = 65504 + half an ulp (0x477ff000) is a tie that goes to the even neighbour, inf.
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // >= 2^-14: a normal float16
    // Rebias (-112 << 23) and round the 13 dropped mantissa bits; a carry into the exponent is
    // the right result (it cannot reach 0x7c00: a < 0x477ff000).
    const std::uint32_t r = a - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal (or zero): the result counts units of 2^-24. At or below 2^-25 (0x33000000, a tie
  // between 0 and 2^-24 that goes to 0) it is zero.
  if (a <= 0x33000000u) return sign;
  const std::uint32_t e = a >> 23;                      // 102..112
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;  // 24 significant bits
  const std::uint32_t shift = 126u - e;                 // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u) != 0)) ++q;  // may become 0x400: 2^-14
  return static_cast<std::uint16_t>(sign | q);
}

// ---- bfloat16 ------------------------------------------------------------------------------

inline float bfloat16_to_float(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x400000u;  // NaN made quiet
  return std::bit_cast<float>(u);
}

inline std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: quiet, top 6 payload bits kept
    return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  }
  // Round the 16 dropped bits to nearest even; overflow past the largest finite carries into
  // the exponent and gives inf, as it must.
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---- float64 narrowing in one rounding -----------------------------------------------------

/// float64 -> float32 rounded to odd: truncated toward zero, with the last bit set when inexact.
/// Rounding that result to a format with at most 22 mantissa bits (both 16-bit formats) gives
/// the correctly rounded float64 value: the sticky last bit keeps ties and near-ties apart.
inline float float64_to_float_odd(double d) {
  if (d != d) return static_cast<float>(d);
  const float t = static_cast<float>(d);
  if (static_cast<double>(t) == d) return t;
  std::uint32_t bits = std::bit_cast<std::uint32_t>(t);
  const double at = t < 0 ? -static_cast<double>(t) : static_cast<double>(t);
  const double ad = d < 0 ? -d : d;
  if (at > ad) --bits;  // one step toward zero (magnitude > 0 here, so the sign is kept)
  return std::bit_cast<float>(bits | 1u);
}

inline std::uint16_t float64_to_float16(double d) {
  return float_to_float16(float64_to_float_odd(d));
}
inline std::uint16_t float64_to_bfloat16(double d) {
  return float_to_bfloat16(float64_to_float_odd(d));
}

// ---- Typed wrappers, for templates that read several element types ------------------------

/// A float16 element (bit pattern); same size and alignment as std::uint16_t.
struct float16_t {
  std::uint16_t bits;
};
/// A bfloat16 element (bit pattern); same size and alignment as std::uint16_t.
struct bfloat16_t {
  std::uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(float16_t x) { return float16_to_float(x.bits); }
inline float to_float(bfloat16_t x) { return bfloat16_to_float(x.bits); }

/// T(x) rounded to nearest even, for T in float, double, float16_t, bfloat16_t.
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float16_t>) {
    return float16_t{float_to_float16(x)};
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    return bfloat16_t{float_to_bfloat16(x)};
  } else {
    return static_cast<T>(x);
  }
}

/// Rounds x to the precision of T and back to float (the identity for float).
template <class T>
float round_to(float x) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>) {
    return to_float(from_float<T>(x));
  } else {
    return x;
  }
}

}  // namespace sdpa::detail
