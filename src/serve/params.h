// Reading a request's JSON object: every parameter is looked up by name, checked against its
// range and type, and any name the endpoint does not know is rejected, so that a typo gets a
// 400 naming it instead of a silently used default.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "serve.h"

namespace sdpa::serve {

/// A JSON integer, or a float with an integral value (64.0 is 64: JavaScript has one number
/// type), finite and exact in a double.
bool integral_number(const json& v);

class Params {
 public:
  /// Throws ParamError("body", ...) unless `body` is a JSON object.
  explicit Params(const json& body);

  int integer(const std::string& name, int lo, int hi, int fallback);
  std::uint64_t seed(const std::string& name, std::uint64_t fallback);
  double number(const std::string& name, double lo, double hi, double fallback);
  bool boolean(const std::string& name, bool fallback);
  /// One of `choices`; the error lists them.
  std::string choice(const std::string& name, std::initializer_list<const char*> choices,
                     const std::string& fallback);
  /// True when the body names `name`.
  bool has(const std::string& name) const;
  /// The raw value (marked as used); null when absent.
  const json& raw(const std::string& name);
  /// Throws ParamError for the first name that no call above asked for.
  void finish() const;

 private:
  const json& body_;
  std::set<std::string> used_;
};

/// The q and k inputs shared by the scores and freezing panels: each component is
/// mean + sigma * u with u of unit variance, correlated across dimensions by `corr`
/// (u_i = sqrt(corr) z_0 + sqrt(1 - corr) z_i, all z drawn from `dist`).
struct InputSpec {
  std::string dist = "normal";  // normal, uniform, rademacher, laplace, student-t
  double mean = 0, sigma = 1, corr = 0;
  std::uint64_t seed = 1;
};
InputSpec read_inputs(Params& p);

/// The scale applied to q.k: a fixed factor, or q and k normalised (then sqrt(d) cos(q, k),
/// the lab's QK-norm), or 1/sqrt(d) followed by cap * tanh(y / cap).
struct ScaleSpec {
  enum Kind { one, inv_sqrt_d, inv_d, qk_norm, softcap, value } kind = inv_sqrt_d;
  double number = 1;  // kind == value
  double cap = 50;    // kind == softcap (Gemma 2's attention cap)
  std::string name() const;
  /// The factor on q.k (qk_norm: on cos(q, k); softcap: before the cap).
  double factor(double d) const;
};
ScaleSpec read_scale(Params& p);

/// Closed forms for q.k with q, k independent, of the InputSpec's law (components of mean mu,
/// variance sigma^2, pairwise correlation rho):
///   E[q.k]   = d mu^2
///   Var[q.k] = sigma^4 d (1 + (d-1) rho^2) + 2 mu^2 sigma^2 d (1 + (d-1) rho)   (pooled)
///   E[Var_k(q.k | q)] = sigma^4 d (1 + (d-1) rho^2) + mu^2 sigma^2 d (1 + (d-1) rho)  (in a row)
/// None depends on the distribution's kurtosis: q and k are independent.
double dot_mean(const InputSpec& in, double d);
double dot_variance(const InputSpec& in, double d);
double dot_row_variance(const InputSpec& in, double d);

/// The scaled scores' mean and variance by the closed forms (qk_norm by the delta method,
/// softcap by quadrature of the capped normal); `exact` is false for those two.
struct ScoreMoments {
  double mean = 0, variance = 0, row_variance = 0;
  bool exact = true;
};
ScoreMoments score_moments(const InputSpec& in, const ScaleSpec& scale, double d);

/// Finite JSON numbers; NaN and infinities as the strings "nan", "inf", "-inf" (the lab's form).
json num(double x);

}  // namespace sdpa::serve
