// Figures as data: a Figure is a few panels of series of numbers; render_svg() turns it into a
// gnuplot script (the numbers inline as datablocks), runs Debian's gnuplot with its static svg
// terminal and returns the SVG. The same numbers go to DIR/data/fig-<id>.csv (figure_csv), so
// that every figure can be redrawn elsewhere from the CSV alone.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace sdpa::report {

struct Series {
  std::string title;                 // legend entry ("" hides it)
  std::vector<std::string> columns;  // names of the columns of `rows` (CSV header)
  std::vector<std::vector<double>> rows;
  std::string using_spec = "1:2";     // gnuplot `using`
  std::string style = "linespoints";  // gnuplot `with` clause, e.g. "yerrorbars pt 7"
};

struct Panel {
  std::string title, xlabel, ylabel;
  bool logx = false, logy = false;
  std::string setup;  // extra gnuplot commands for this panel (ranges, key, palette, ...)
  std::vector<Series> series;
};

struct Figure {
  std::string id;       // file stem and SVG id prefix: [a-z0-9-]+
  std::string caption;  // shown under the figure
  std::vector<Panel> panels;
  int columns = 1;  // panels per row
  int width = 760, height = 440;
  std::vector<std::string> sources;  // the table CSVs the numbers come from (for the caption)
};

/// True when at least one series of every panel has a finite point.
bool has_data(const Figure& figure);

/// The gnuplot script that draws `figure` into `svg_path` (exposed for tests).
std::string gnuplot_script(const Figure& figure, const std::filesystem::path& svg_path);

/// Runs gnuplot in `work_dir` and returns the SVG text (not yet made embeddable). Throws
/// std::runtime_error naming the Debian package when gnuplot is missing, and with gnuplot's
/// message when it fails.
std::string render_svg(const Figure& figure, const std::filesystem::path& work_dir);

/// Every point of every series: columns panel, series, then the series' own columns.
std::string figure_csv(const Figure& figure);

/// The path of gnuplot, or an empty path when it is not installed (searched on PATH).
std::filesystem::path find_gnuplot();

}  // namespace sdpa::report
