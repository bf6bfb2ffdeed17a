// The report: `sdpa report` runs the lab (every experiment of src/lab) and the benchmark
// (src/bench), draws the figures with gnuplot, and writes one self-contained folder:
//
//   DIR/index.html      inline CSS and inline SVG only: no script, font, style or image is
//                       fetched from anywhere, so it renders with the network off
//   DIR/report.md       the same content for Markdown readers; figures as DIR/figures/*.svg
//   DIR/figures/*.svg   one static SVG per figure (gnuplot's svg terminal, no mouse script)
//   DIR/data/*.csv      every lab table as CSV, every figure's plotted points as CSV
//   DIR/data/*.json     the raw lab results and the benchmark object, as the lab printed them
//
// The folder is built beside DIR (a hidden .sdpa-XXXXXX) and renamed into place at the end, so
// DIR is either the previous complete report or the new complete one, never half-written; the
// temporary is removed on an error and on SIGINT, SIGTERM or SIGHUP (io/output.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lab/lab.h"

namespace sdpa::report {

using json = nlohmann::json;

// The lab's: one definition of the run's mode and the page's language.
using Mode = lab::Mode;
using Lang = lab::Lang;

struct ReportOptions {
  std::filesystem::path out = "report";
  Mode mode = Mode::quick;
  Lang lang = Lang::en;
  std::uint64_t seed = 1;
  int threads = 0;  // 0: one per core
  /// Re-render from earlier results instead of running: a folder holding <experiment>.json
  /// (the lab's --json objects) and optionally bench.json, e.g. an earlier report's data/.
  std::optional<std::filesystem::path> from;
  bool progress = false;  // progress lines on stderr (the CLI sets it when stderr is a tty)
};

/// What write_report() did, for the CLI's summary line.
struct ReportSummary {
  std::filesystem::path index_html, report_md;
  double seconds = 0;
  int figures = 0, tables = 0;
  std::vector<std::string> missing;  // experiments or parts that could not be shown, and why
};

/// Runs everything and writes the folder. Throws sdpa::Error for bad options (before anything
/// runs) and std::runtime_error when a tool is missing (gnuplot) or the folder cannot be written.
ReportSummary write_report(const ReportOptions& options);

// ---- pieces, exposed for the tests -----------------------------------------------------------

/// A lab table (a JSON array of flat objects) as CSV (RFC 4180): a header of the column names
/// (`preferred` first in that order, then the others in order of appearance), then one line per
/// row. Numbers are written in the shortest form that reads back to the same double; strings are
/// quoted when they hold a comma, quote or newline; null is empty.
std::string table_to_csv(const json& rows, const std::vector<std::string>& preferred = {});

/// A cell as a double: numbers as they are, the strings "inf", "-inf", "nan" (any case) as such,
/// anything else NaN.
double to_number(const json& value);

/// Makes gnuplot's SVG fit inside an HTML page next to other figures: drops the XML prolog,
/// prefixes every id (and every reference to it: href="#x", url(#x)) with `prefix`, and sets
/// the <title>. Throws std::runtime_error if the SVG references anything outside itself.
std::string embeddable_svg(const std::string& svg, const std::string& prefix,
                           const std::string& title);

/// Text with &, <, >, " and ' escaped for HTML.
std::string html_escape(const std::string& text);

}  // namespace sdpa::report
