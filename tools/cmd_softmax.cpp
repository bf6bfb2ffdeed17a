// sdpa softmax: the stable softmax of a list of logits, e.g. the article's [1000, 10, 5].
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "options.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

struct SoftmaxArgs {
  std::string logits;
  double scale = 1.0;
  std::string dtype = "float64";
  bool json = false;
};

// True for the spellings of an infinity strtod reads ("inf", "-Infinity", ...): the one way a
// logit may be infinite. A finite number past the dtype's range is refused, not rounded to one.
bool written_infinite(const std::string& item) {
  std::string t;
  for (char c : item) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) t.erase(0, 1);
  return t == "inf" || t == "infinity";
}

// The logits as float64, each one representable in `dtype` (float64 or float32).
std::vector<double> parse_logits(const std::string& text, const std::string& dtype) {
  std::vector<double> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || end == item.c_str() || *end != '\0' || std::isnan(v)) {
      throw Error(
          fmt::format("--logits: expected comma-separated numbers such as 1000,10,5 (inf "
                      "and -inf allowed), got '{}' in '{}'",
                      item, text));
    }
    const bool narrow = dtype == "float32";
    if (!written_infinite(item) &&
        (std::isinf(v) || (narrow && std::isinf(static_cast<float>(v))))) {
      throw Error(fmt::format(
          "--logits: expected numbers within {}'s range (magnitude at most {:g}; write inf or "
          "-inf for an infinity), got '{}' in '{}'",
          narrow ? "float32" : "float64",
          narrow ? double(std::numeric_limits<float>::max()) : std::numeric_limits<double>::max(),
          item, text));
    }
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// JSON cannot hold inf: write it as a string "inf" / "-inf".
nlohmann::json number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  return v;
}

template <class T>
void run_typed(const SoftmaxArgs& a, const std::vector<double>& x64) {
  std::vector<T> x(x64.begin(), x64.end()), p(x.size()), logp(x.size());
  softmax<T>(x, p, a.scale);
  log_softmax<T>(x, logp, a.scale);
  if (a.json) {
    nlohmann::json j;
    j["dtype"] = a.dtype;
    j["scale"] = a.scale;
    j["logits"] = nlohmann::json::array();
    j["probabilities"] = nlohmann::json::array();
    j["log_probabilities"] = nlohmann::json::array();
    for (std::size_t i = 0; i < x.size(); ++i) {
      j["logits"].push_back(number(x[i]));
      j["probabilities"].push_back(number(p[i]));
      j["log_probabilities"].push_back(number(logp[i]));
    }
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << fmt::format("softmax({} * x) in {}, max subtracted before exp:\n", a.scale, a.dtype);
  std::cout << fmt::format("{:>6} {:>24} {:>24} {:>24}\n", "i", "logit", "probability",
                           "log-probability");
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::cout << fmt::format("{:>6} {:>24.17g} {:>24.17g} {:>24.17g}\n", i, double(x[i]),
                             double(p[i]), double(logp[i]));
  }
}

}  // namespace

void add_softmax_command(CLI::App& app) {
  auto args = std::make_shared<SoftmaxArgs>();
  CLI::App* cmd = app.add_subcommand(
      "softmax", "Numerically stable softmax(scale * logits), e.g. --logits 1000,10,5");
  cmd->add_option("--logits", args->logits, "comma-separated logits, e.g. 1000,10,5")->required();
  cmd->add_option("--scale", args->scale, "multiply the logits by this first")
      ->check(finite_number_validator())
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "float64 or float32")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object with \"probabilities\"");
  cmd->callback([args] {
    if (args->dtype != "float64" && args->dtype != "float32") {
      throw Error(fmt::format("--dtype: expected float64 or float32, got '{}'", args->dtype));
    }
    const auto x = parse_logits(args->logits, args->dtype);
    if (args->dtype == "float64") {
      run_typed<double>(*args, x);
    } else if (args->dtype == "float32") {
      run_typed<float>(*args, x);
    } else {
      throw Error(fmt::format("--dtype: expected float64 or float32, got '{}'", args->dtype));
    }
  });
}

}  // namespace sdpa::cli
