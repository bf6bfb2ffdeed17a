// Panel 2: one typed row of logits through softmax at temperature T, in four formats.
//   stable: y = x / T, m = max y, p = exp(y - m) / sum exp(y - m)
//   naive:  p = exp(y) / sum exp(y) (the article's formula, lab::naive_softmax)
// with every operation rounded to the format (lab::round_to), and the gradient of p[target]
// with respect to each logit, d p_t / d x_i = p_t (delta_ti - p_i) / T (sdpa::softmax_backward
// with a one-hot upstream gradient) from each format's own probabilities.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "lab/lowp.h"
#include "lab/stats.h"
#include "params.h"
#include "serve.h"

namespace sdpa::serve {

namespace {

constexpr int kMaxLogits = 64;

std::vector<double> parse_logits(const json& v) {
  std::vector<double> x;
  if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_number()) {
        throw ParamError("logits", "logits must be numbers, got " + e.dump());
      }
      x.push_back(e.get<double>());
    }
  } else if (v.is_string()) {
    // "1000, 10, 5" or "1000 10 5": numbers separated by commas and/or spaces.
    const std::string s = v.get<std::string>();
    const char* c = s.c_str();
    for (;;) {
      while (*c == ',' || std::isspace(static_cast<unsigned char>(*c))) ++c;
      if (*c == '\0') break;
      char* end = nullptr;
      const double value = std::strtod(c, &end);
      // A decimal number (no hex, inf or nan that strtod would also read), followed by a
      // separator or the end ("1-2" is not two numbers).
      const bool decimal =
          end != c && std::string_view(c, static_cast<std::size_t>(end - c))
                              .find_first_not_of("0123456789.eE+-") == std::string_view::npos;
      const bool separated =
          *end == '\0' || *end == ',' || std::isspace(static_cast<unsigned char>(*end));
      if (!decimal || !separated || !std::isfinite(value)) {
        throw ParamError("logits",
                         fmt::format("logits must be finite numbers separated by commas, could "
                                     "not read \"{}\"",
                                     std::string(c).substr(0, 20)));
      }
      x.push_back(value);
      c = end;
      if (x.size() > kMaxLogits) break;
    }
  } else if (v.is_null()) {
    x = {1000, 10, 5};  // absent: the default /api/info states
  } else {
    throw ParamError("logits", "logits must be a list of numbers or a string like \"1000, 10, 5\"");
  }
  if (x.empty() || x.size() > kMaxLogits) {
    throw ParamError("logits", fmt::format("logits must hold 1 to {} numbers, got {}", kMaxLogits,
                                           x.size() > kMaxLogits ? "more" : "none"));
  }
  return x;
}

std::vector<double> stable_softmax(const std::vector<double>& y, const lab::Format& f) {
  std::vector<double> yr(y.size()), e(y.size()), p(y.size());
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < y.size(); ++i) {
    yr[i] = lab::round_to(y[i], f);
    m = std::max(m, yr[i]);
  }
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    e[i] = lab::round_to(std::exp(lab::round_to(yr[i] - m, f)), f);
    sum = lab::round_to(sum + e[i], f);
  }
  for (std::size_t i = 0; i < y.size(); ++i) p[i] = lab::round_to(e[i] / sum, f);
  return p;
}

json numbers(const std::vector<double>& v) {
  json a = json::array();
  for (double x : v) a.push_back(num(x));
  return a;
}

}  // namespace

json compute_softmax(const json& request) {
  Params p(request);
  const std::vector<double> x = parse_logits(p.raw("logits"));
  const double temperature = p.number("temperature", 1e-3, 1e6, 1.0);
  const int target = p.integer("target", 0, kMaxLogits - 1, 0);
  p.finish();
  if (target >= static_cast<int>(x.size())) {
    throw ParamError("target", fmt::format("target must index a logit, in [0, {}], got {}",
                                           x.size() - 1, target));
  }
  const std::size_t n = x.size();
  std::vector<double> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = x[i] / temperature;
    // 1e300: far beyond every format's range, and x / T stays finite in float64.
    if (!(std::fabs(y[i]) <= 1e300)) {
      throw ParamError("logits", fmt::format("logits / temperature must stay within 1e300 in "
                                             "magnitude, got {} / {}",
                                             x[i], temperature));
    }
  }

  // The library's own row (float64 accumulation): the reference of the errors below.
  std::vector<double> ref(n);
  softmax<double>(x, ref, 1.0 / temperature);

  std::vector<double> onehot(n, 0.0);
  onehot[target] = 1.0;
  json formats = json::array();
  for (const lab::Format& f : {lab::kFloat16, lab::kBFloat16, lab::kFloat32, lab::kFloat64}) {
    json entry = {{"format", f.name}};
    for (const char* method : {"stable", "naive"}) {
      const std::vector<double> pr =
          std::string(method) == "stable" ? stable_softmax(y, f) : lab::naive_softmax(y, f);
      std::vector<double> grad(n);
      softmax_backward<double>(pr, onehot, grad, 1.0 / temperature);
      for (double& g : grad) g = lab::round_to(g, f);
      double sum = 0, err = 0;
      bool finite = true;
      for (std::size_t i = 0; i < n; ++i) {
        sum += pr[i];
        finite = finite && std::isfinite(pr[i]);
        err = std::max(err, std::fabs(pr[i] - ref[i]));
      }
      entry[method] = {{"probs", numbers(pr)},
                       {"grad", numbers(grad)},
                       {"sum", num(sum)},
                       {"max_error", finite ? json(err) : json("nan")},
                       {"ok", finite}};
    }
    formats.push_back(entry);
  }
  std::vector<double> ref_grad(n);
  softmax_backward<double>(ref, onehot, ref_grad, 1.0 / temperature);
  std::vector<float> xf(x.begin(), x.end()), pf(n);
  softmax<float>(xf, pf, 1.0 / temperature);
  std::vector<double> pf_d(pf.begin(), pf.end());
  return {{"logits", x},
          {"temperature", temperature},
          {"target", target},
          {"library",
           {{"float64", numbers(ref)},
            {"float32", numbers(pf_d)},
            {"grad", numbers(ref_grad)},
            {"entropy", lab::entropy(ref)},
            {"jacobian_norm", lab::jacobian_frobenius(ref)}}},
          {"formats", formats}};
}

}  // namespace sdpa::serve
