// From the collected results to the document: the sections C1..C8, the sections beyond the
// article, the kernel; every figure drawn with gnuplot on the way.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "report/collect.h"
#include "report/document.h"
#include "report/plot.h"

namespace sdpa::report {

struct Built {
  Document document;
  std::map<std::string, std::string> figure_svgs;  // id -> gnuplot's SVG file, as written
  std::map<std::string, std::string> data_files;   // file name in data/ -> contents
  std::vector<std::string> missing;                // what could not be shown, and why
};

/// Builds the document; `work_dir` holds gnuplot's scripts while it runs.
Built build_document(const Inputs& inputs, const ReportOptions& options,
                     const std::filesystem::path& work_dir);

/// The header lines: what was run, on what, when, for how long.
std::vector<std::pair<std::string, std::string>> header_meta(const Inputs& inputs,
                                                             const ReportOptions& options,
                                                             double seconds);

}  // namespace sdpa::report
