// What the report shows, gathered before anything is drawn: the lab's results (run in-process,
// or read back from an earlier report's data/ folder) and the benchmark with the accuracy check.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "report/report.h"

namespace sdpa::report {

struct Inputs {
  std::vector<std::string> experiment_order;   // every experiment the lab knows, in order
  std::map<std::string, json> lab;             // name -> the lab's JSON object
  std::map<std::string, std::string> missing;  // name -> why it is absent
  json bench;                                  // {"rows": [...], "accuracy": {...}} or null
  std::string bench_missing;                   // why the benchmark is absent ("" if present)
};

using Progress = std::function<void(const std::string&)>;

/// The experiments the lab has (in order); the built-in list when the lab is not linked.
std::vector<std::string> lab_experiment_names();

/// Runs every experiment and the benchmark, or reads them from options.from. A failing or
/// missing experiment is recorded in `missing`, never fatal: the page says what is absent.
Inputs collect(const ReportOptions& options, const Progress& progress);

/// The accuracy of Impl::fast and Impl::naive against the float64 reference on one moderate
/// float32 problem: max |error| / max |reference| for out, lse, dq, dk, dv.
json measure_accuracy(std::uint64_t seed, int threads);

}  // namespace sdpa::report
