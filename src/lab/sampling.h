// The component distributions of the variance experiments, each scaled to mean 0, variance 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "lab/random.h"

namespace sdpa::lab {

enum class Dist : std::uint8_t { normal, uniform, rademacher, laplace, student_t5 };

inline constexpr Dist kAllDists[] = {Dist::normal, Dist::uniform, Dist::rademacher, Dist::laplace,
                                     Dist::student_t5};

/// "normal", "uniform", "rademacher", "laplace", "student-t5" (the names in the JSON).
inline const char* dist_name(Dist d) {
  switch (d) {
    case Dist::normal:
      return "normal";
    case Dist::uniform:
      return "uniform";
    case Dist::rademacher:
      return "rademacher";
    case Dist::laplace:
      return "laplace";
    case Dist::student_t5:
      return "student-t5";
  }
  return "?";
}

/// The kurtosis E[x^4] of each unit-variance distribution (3, 9/5, 1, 6, 9).
inline double dist_kurtosis(Dist d) {
  switch (d) {
    case Dist::normal:
      return 3.0;
    case Dist::uniform:
      return 1.8;
    case Dist::rademacher:
      return 1.0;
    case Dist::laplace:
      return 6.0;
    case Dist::student_t5:
      return 9.0;  // 3 + 6 / (nu - 4)
  }
  return 0;
}

/// One draw with mean 0 and variance 1.
inline double sample(Stream& s, Dist d) {
  switch (d) {
    case Dist::normal:
      return s.normal();
    case Dist::uniform:  // U(-sqrt 3, sqrt 3)
      return (2.0 * s.uniform() - 1.0) * 1.7320508075688772;
    case Dist::rademacher:
      return (s.next_u32() & 1U) ? 1.0 : -1.0;
    case Dist::laplace: {  // Laplace(b = 1/sqrt 2): exponential of mean b with a random sign
      const double e = -std::log(s.uniform()) * 0.70710678118654752;
      return (s.next_u32() & 1U) ? e : -e;
    }
    case Dist::student_t5: {
      // Bailey's polar method (Math. Comp. 62, 1994): with (u, v) uniform in the unit disc and
      // w = u^2 + v^2, u * sqrt(nu (w^(-2/nu) - 1) / w) is Student-t with nu degrees of freedom.
      // Two uniforms per draw instead of the six normals of z / sqrt(chi2_5 / 5). Var t5 = 5/3.
      for (;;) {
        const double u = 2.0 * s.uniform() - 1.0, v = 2.0 * s.uniform() - 1.0;
        const double w = u * u + v * v;
        if (w >= 1.0) continue;
        const double t = u * std::sqrt(5.0 * (std::pow(w, -0.4) - 1.0) / w);
        return t * 0.7745966692414834;  // sqrt(3/5)
      }
    }
  }
  return 0;
}

}  // namespace sdpa::lab
