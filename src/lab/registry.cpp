// The experiments of `sdpa lab`, in the order `sdpa lab list` shows them (train last).
#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "lab/experiments.h"
#include "lab/lab.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {

const std::vector<Experiment>& experiments() {
  static const std::vector<Experiment> all = {
      {"softmax", "C1, C2: softmax([1000, 10, 5]), its Jacobian, the naive formula overflowing",
       run_softmax},
      {"derive", "C3-C6: each step of Var(q.k) = d as an expectation with its interval",
       run_derive},
      {"variance", "C3-C6: mean and variance of q.k, d = 1..4096, five distributions, non-iid",
       run_variance},
      {"saturation", "C7: entropy and gradient distributions over (d, N), scales 1, 1/sqrt(d), 1/d",
       run_saturation},
      {"temperature", "C1, C7: softmax(c QK^T/sqrt(d)) for c = 1e-3..1e2, where the gradient peaks",
       run_temperature},
      {"precision", "C2, C7: float16/bfloat16/float32 logits, bits lost, where naive softmax NaNs",
       run_precision},
      {"train", "C8: small attention models trained with scale 1, 1/sqrt(d), 1/d", run_train},
  };
  return all;
}

const Experiment& find_experiment(const std::string& name) {
  std::string names;
  for (const auto& e : experiments()) {
    if (e.name == name) return e;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  throw Error(fmt::format("lab: expected an experiment name ({}), got '{}'", names, name));
}

json run_experiment(const std::string& name, const LabOptions& options) {
  const Experiment& e = find_experiment(name);
  const auto t0 = std::chrono::steady_clock::now();
  json result = e.run(options);
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  result["seconds"] = std::round(dt.count() * 100.0) / 100.0;
  return result;
}

Lang parse_lang(const std::string& text, const std::string& what) {
  if (text == "en") return Lang::en;
  if (text == "zh") return Lang::zh;
  throw Error(fmt::format("{}: expected en or zh, got '{}'", what, text));
}

Mode parse_mode(const std::string& text, const std::string& what) {
  if (text == "quick") return Mode::quick;
  if (text == "full") return Mode::full;
  throw Error(fmt::format("{}: expected quick or full, got '{}'", what, text));
}

}  // namespace sdpa::lab
