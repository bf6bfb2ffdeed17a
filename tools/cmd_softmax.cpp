// sdpa softmax: the stable softmax of a list of logits, e.g. the article's [1000, 10, 5].
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

struct SoftmaxArgs {
  std::string logits;
  double scale = 1.0;
  std::string dtype = "float64";
  bool json = false;
};

std::vector<double> parse_logits(const std::string& text) {
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
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "float64 or float32")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object with \"probabilities\"");
  cmd->callback([args] {
    if (!std::isfinite(args->scale)) {
      throw Error(fmt::format("--scale: expected a finite number, got {}", args->scale));
    }
    const auto x = parse_logits(args->logits);
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
