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
      softmax_experiment(),    derive_experiment(),      variance_experiment(),
      saturation_experiment(), temperature_experiment(), precision_experiment(),
      train_experiment(),
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
#ifndef NDEBUG
  check_tables(e.name, e.tables, result);  // the tests check it in every build
#endif
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
