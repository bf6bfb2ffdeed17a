#include "params.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace sdpa::serve {

namespace {

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace

json num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

Params::Params(const json& body) : body_(body) {
  if (!body.is_object()) {
    throw ParamError("body", "the request body must be a JSON object, got " + show(body));
  }
}

bool Params::has(const std::string& name) const { return body_.contains(name); }

const json& Params::raw(const std::string& name) {
  used_.insert(name);
  static const json null_value;
  auto it = body_.find(name);
  return it == body_.end() ? null_value : *it;
}

bool integral_number(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double x = v.get<double>();
  return std::isfinite(x) && x == std::floor(x) && std::fabs(x) <= 9007199254740992.0;
}

int Params::integer(const std::string& name, int lo, int hi, int fallback) {
  const json& v = raw(name);
  if (v.is_null()) return fallback;
  if (!integral_number(v) || v.get<double>() < lo || v.get<double>() > hi) {
    throw ParamError(
        name, fmt::format("{} must be an integer in [{}, {}], got {}", name, lo, hi, show(v)));
  }
  return static_cast<int>(v.get<double>());
}

std::uint64_t Params::seed(const std::string& name, std::uint64_t fallback) {
  const json& v = raw(name);
  if (v.is_null()) return fallback;
  // 2^53: the largest integer a JavaScript number holds exactly.
  constexpr double kMax = 9007199254740992.0;
  // An integer is compared as one: 2^53 + 1 would round to 2^53 as a double.
  const bool too_big = (v.is_number_unsigned() && v.get<std::uint64_t>() > (1ULL << 53)) ||
                       (v.is_number_integer() && !v.is_number_unsigned() &&
                        v.get<std::int64_t>() > (std::int64_t{1} << 53));
  if (!v.is_number() || too_big || v.get<double>() < 0 || v.get<double>() > kMax ||
      v.get<double>() != std::floor(v.get<double>())) {
    throw ParamError(name,
                     fmt::format("{} must be an integer in [0, 2^53], got {}", name, show(v)));
  }
  return v.is_number_unsigned() ? v.get<std::uint64_t>()
                                : static_cast<std::uint64_t>(v.get<double>());
}

double Params::number(const std::string& name, double lo, double hi, double fallback) {
  const json& v = raw(name);
  if (v.is_null()) return fallback;
  if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
    throw ParamError(name,
                     fmt::format("{} must be a number in [{}, {}], got {}", name, lo, hi, show(v)));
  }
  return v.get<double>();
}

bool Params::boolean(const std::string& name, bool fallback) {
  const json& v = raw(name);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) {
    throw ParamError(name, fmt::format("{} must be true or false, got {}", name, show(v)));
  }
  return v.get<bool>();
}

std::string Params::choice(const std::string& name, std::initializer_list<const char*> choices,
                           const std::string& fallback) {
  const json& v = raw(name);
  if (v.is_null()) return fallback;
  std::string list;
  for (const char* c : choices) {
    if (v.is_string() && v.get<std::string>() == c) return c;
    list += list.empty() ? "" : ", ";
    list += c;
  }
  throw ParamError(name, fmt::format("{} must be one of {}, got {}", name, list, show(v)));
}

void Params::finish() const {
  for (const auto& [key, value] : body_.items()) {
    if (!used_.count(key)) {
      throw ParamError(key, fmt::format("unknown parameter {}", show(json(key))));
    }
  }
}

InputSpec read_inputs(Params& p) {
  InputSpec in;
  in.dist = p.choice("dist", {"normal", "uniform", "rademacher", "laplace", "student-t"}, in.dist);
  in.mean = p.number("mean", -4, 4, in.mean);
  in.sigma = p.number("sigma", 0.01, 8, in.sigma);
  in.corr = p.number("corr", 0, 0.99, in.corr);
  in.seed = p.seed("seed", in.seed);
  return in;
}

std::string ScaleSpec::name() const {
  switch (kind) {
    case one:
      return "1";
    case inv_sqrt_d:
      return "1/sqrt(d)";
    case inv_d:
      return "1/d";
    case qk_norm:
      return "qk-norm";
    case softcap:
      return "softcap";
    case value:
      return fmt::format("{}", number);
  }
  return "?";
}

double ScaleSpec::factor(double d) const {
  const double rd = std::sqrt(d);
  switch (kind) {
    case one:
      return 1.0;
    case inv_sqrt_d:
    case softcap:
      return 1.0 / rd;
    case inv_d:
      return 1.0 / d;
    case qk_norm:
      return rd;
    case value:
      return number;
  }
  return 1.0;
}

ScaleSpec read_scale(Params& p) {
  ScaleSpec s;
  const json& v = p.raw("scale");
  if (v.is_number()) {
    const double x = v.get<double>();
    if (!(std::fabs(x) <= 1e3)) {
      throw ParamError("scale",
                       fmt::format("scale as a number must lie in [-1000, 1000], got {}", show(v)));
    }
    s.kind = ScaleSpec::value;
    s.number = x;
  } else if (!v.is_null()) {
    const std::string name = v.is_string() ? v.get<std::string>() : "";
    if (name == "1") {
      s.kind = ScaleSpec::one;
    } else if (name == "1/sqrt(d)") {
      s.kind = ScaleSpec::inv_sqrt_d;
    } else if (name == "1/d") {
      s.kind = ScaleSpec::inv_d;
    } else if (name == "qk-norm") {
      s.kind = ScaleSpec::qk_norm;
    } else if (name == "softcap") {
      s.kind = ScaleSpec::softcap;
    } else {
      throw ParamError("scale",
                       "scale must be one of 1, 1/sqrt(d), 1/d, qk-norm, softcap or a "
                       "number in [-1000, 1000], got " +
                           show(v));
    }
  }
  s.cap = p.number("cap", 0.1, 1e4, s.cap);
  return s;
}

double dot_mean(const InputSpec& in, double d) { return d * in.mean * in.mean; }

namespace {
// sum_ij C_ij^2 and sum_ij C_ij for C = sigma^2 ((1 - rho) I + rho 1 1^T), d x d.
double sum_c2(const InputSpec& in, double d) {
  const double s4 = std::pow(in.sigma, 4);
  return s4 * d * (1.0 + (d - 1.0) * in.corr * in.corr);
}
double sum_c(const InputSpec& in, double d) {
  return in.sigma * in.sigma * d * (1.0 + (d - 1.0) * in.corr);
}
}  // namespace

double dot_variance(const InputSpec& in, double d) {
  return sum_c2(in, d) + 2.0 * in.mean * in.mean * sum_c(in, d);
}

double dot_row_variance(const InputSpec& in, double d) {
  return sum_c2(in, d) + in.mean * in.mean * sum_c(in, d);
}

namespace {

// E[f(y)] and E[f(y)^2] for y ~ N(m, v) and f(y) = cap tanh(y / cap), by the trapezoid rule
// over m +- 10 sd with 801 points (the tails beyond 10 sd weigh below 1e-22; for a smooth
// integrand under a Gaussian the rule converges geometrically, and a step of sd / 40 already
// agrees with 16001 points to 1e-12).
std::pair<double, double> capped_normal_moments(double m, double v, double cap) {
  const double sd = std::sqrt(v);
  if (sd == 0) {
    const double z = cap * std::tanh(m / cap);
    return {z, z * z};
  }
  constexpr int kPoints = 801;
  const double lo = m - 10 * sd, h = 20 * sd / (kPoints - 1);
  double w_sum = 0, s1 = 0, s2 = 0;
  for (int i = 0; i < kPoints; ++i) {
    const double y = lo + i * h, t = (y - m) / sd;
    const double w = std::exp(-0.5 * t * t) * ((i == 0 || i == kPoints - 1) ? 0.5 : 1.0);
    const double z = cap * std::tanh(y / cap);
    w_sum += w;
    s1 += w * z;
    s2 += w * z * z;
  }
  return {s1 / w_sum, s2 / w_sum};
}

}  // namespace

ScoreMoments score_moments(const InputSpec& in, const ScaleSpec& scale, double d) {
  ScoreMoments m;
  const double c = scale.factor(d);
  switch (scale.kind) {
    case ScaleSpec::qk_norm: {
      // Delta method: |q|^2 concentrates at d (sigma^2 + mu^2), so
      // sqrt(d) cos(q, k) ~ sqrt(d) q.k / (d (sigma^2 + mu^2)).
      const double norm2 = d * (in.sigma * in.sigma + in.mean * in.mean);
      const double f = c / norm2;
      m.mean = f * dot_mean(in, d);
      m.variance = f * f * dot_variance(in, d);
      m.row_variance = f * f * dot_row_variance(in, d);
      m.exact = false;
      return m;
    }
    case ScaleSpec::softcap: {
      const double mu = c * dot_mean(in, d);
      const auto [e1, e2] = capped_normal_moments(mu, c * c * dot_variance(in, d), scale.cap);
      const auto [r1, r2] = capped_normal_moments(mu, c * c * dot_row_variance(in, d), scale.cap);
      m.mean = e1;
      m.variance = std::max(0.0, e2 - e1 * e1);
      m.row_variance = std::max(0.0, r2 - r1 * r1);
      m.exact = false;
      return m;
    }
    default:
      m.mean = c * dot_mean(in, d);
      m.variance = c * c * dot_variance(in, d);
      m.row_variance = c * c * dot_row_variance(in, d);
      return m;
  }
}

}  // namespace sdpa::serve

namespace sdpa::serve {

json parameter_info() {
  const json inputs = {{"dist",
                        {{"choices", {"normal", "uniform", "rademacher", "laplace", "student-t"}},
                         {"default", "normal"}}},
                       {"mean", {{"min", -4}, {"max", 4}, {"default", 0}}},
                       {"sigma", {{"min", 0.01}, {"max", 8}, {"default", 1}}},
                       {"corr", {{"min", 0}, {"max", 0.99}, {"default", 0}}},
                       {"seed", {{"min", 0}, {"max", 9007199254740992.0}, {"default", 1}}},
                       {"scale",
                        {{"choices", {"1", "1/sqrt(d)", "1/d", "qk-norm", "softcap"}},
                         {"number", {{"min", -1000}, {"max", 1000}}},
                         {"default", "1/sqrt(d)"}}},
                       {"cap", {{"min", 0.1}, {"max", 1e4}, {"default", 50}}}};
  json scores = inputs;
  scores["d"] = {{"min", 1}, {"max", 4096}, {"default", 64}};
  scores["n"] = {{"min", 1}, {"max", 16384}, {"default", 1024}};
  scores["bins"] = {{"min", 8}, {"max", 200}, {"default", 60}};
  scores["logits"] = {{"type", "boolean"}, {"default", false}};
  json freeze = inputs;
  freeze["d_max"] = {{"powers_of_two", {1, 4096}}, {"default", 1024}};
  freeze["n_max"] = {{"powers_of_two", {2, 4096}}, {"default", 4096}};
  return {
      {"scores", scores},
      {"freeze", freeze},
      {"softmax",
       {{"logits", {{"count", {1, 64}}, {"default", "1000, 10, 5"}}},
        {"temperature", {{"min", 1e-3}, {"max", 1e6}, {"default", 1}}},
        {"target", {{"min", 0}, {"max", 63}, {"default", 0}}}}},
      {"train",
       {{"scale", {{"choices", {"1", "1/sqrt(d)", "1/d", "qk-norm"}}, {"default", "1/sqrt(d)"}}},
        {"d", {{"min", 1}, {"max", 1024}, {"default", 64}}},
        {"optimizer", {{"choices", {"adam", "sgd"}}, {"default", "adam"}}},
        {"lr", {{"min", 1e-6}, {"max", 10}, {"default", 1e-2}}},
        {"steps", {{"min", 1}, {"max", 5000}, {"default", 300}}},
        {"eval_every", {{"min", 1}, {"max", 1000}, {"default", 10}}},
        {"seed", {{"min", 0}, {"max", 9007199254740992.0}, {"default", 1}}}}},
      {"version", sdpa::version()}};
}

}  // namespace sdpa::serve
