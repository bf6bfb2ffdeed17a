// `sdpa report`: validate, collect, draw, write into a temporary folder, rename into place.
#include "report/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>

#include "io/output.h"
#include "report/build.h"
#include "report/collect.h"
#include "sdpa/sdpa.h"

namespace sdpa::report {
namespace fs = std::filesystem;
namespace {

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) {
    const int e = errno;
    throw Error(ErrorKind::io, "--out",
                fmt::format("cannot write {}: {}", path.string(),
                            e != 0 ? std::strerror(e) : "write failed"));
  }
}

// Refuse to replace a folder that is not an earlier report: --out ~ must not empty a home.
void check_out(const fs::path& out) {
  if (out.empty()) throw Error("--out: expected a folder path, got an empty string");
  std::error_code ec;
  const auto status = fs::status(out, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) {
      throw Error(
          fmt::format("--out: expected a folder (new, or an earlier report), got {} which "
                      "is a file",
                      out.string()));
    }
    const bool empty = fs::is_empty(out, ec);
    const bool report = fs::exists(out / "index.html") || fs::exists(out / "report.md");
    if (!empty && !report) {
      throw Error(
          fmt::format("--out: expected a new or empty folder or an earlier report (with "
                      "index.html), got {} which holds other files; refusing to replace it",
                      out.string()));
    }
  }
  const fs::path parent = fs::absolute(out).parent_path();
  if (fs::exists(parent) && !fs::is_directory(parent)) {
    throw Error(
        fmt::format("--out: expected a path inside a folder, got {} whose parent {} is a "
                    "file",
                    out.string(), parent.string()));
  }
}

}  // namespace

ReportSummary write_report(const ReportOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  check_out(options.out);
  resolve_threads(options.threads);  // throws sdpa::Error naming --threads on a bad count
  if (options.from && !fs::is_directory(*options.from)) {
    throw Error(
        fmt::format("--from: expected a folder with the lab's JSON files (an earlier "
                    "report's data/), got {} which is not a folder",
                    options.from->string()));
  }
  const fs::path out = fs::absolute(options.out).lexically_normal();
  const fs::path final_dir = out.has_filename() ? out : out.parent_path();
  // The folder is built in a temporary beside --out, created now: an unwritable place fails
  // before minutes of experiments. The commit swaps it in whole, and it is removed on an error
  // or on SIGINT, SIGTERM, SIGHUP or a crash (io/output.h).
  io::OutputCommit commit;
  const fs::path tmp = commit.directory(commit.add_directory("--out", final_dir.string()));
  // Before running minutes of experiments: the figures need gnuplot.
  if (find_gnuplot().empty()) {
    throw std::runtime_error(
        "gnuplot: not found on PATH; the report draws its figures with it: install Debian's "
        "package gnuplot-nox (apt-get install gnuplot-nox)");
  }
  const Progress progress = [&](const std::string& what) {
    if (!options.progress) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << fmt::format("[report {:6.1f} s] {}\n", s, what) << std::flush;
  };

  const Inputs inputs = collect(options, progress);
  ReportSummary summary;
  fs::create_directories(tmp / "figures");
  fs::create_directories(tmp / "data");
  progress("figures");
  Built built;
  try {
    built = build_document(inputs, options, tmp / ".gnuplot");
  } catch (const nlohmann::json::exception& e) {
    // The sections read what collect() checked; a value of another type deeper down still
    // names the folder it came from.
    if (!options.from) throw;
    throw Error(ErrorKind::io, "--from",
                fmt::format("{}: expected the lab's and the benchmark's results, got a value of "
                            "another type: {}",
                            options.from->string(), e.what()));
  }
  for (const auto& [id, svg] : built.figure_svgs) write_file(tmp / "figures" / (id + ".svg"), svg);
  for (const auto& [name, text] : built.data_files) write_file(tmp / "data" / name, text);
  for (const auto& [name, result] : inputs.lab) {
    write_file(tmp / "data" / (name + ".json"), result.dump(1) + "\n");
  }
  if (!inputs.bench.is_null()) write_file(tmp / "data" / "bench.json", inputs.bench.dump(1) + "\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  built.document.meta = header_meta(inputs, options, seconds);
  write_file(tmp / "report.md", render_markdown(built.document));
  write_file(tmp / "index.html", render_html(built.document));
  fs::remove_all(tmp / ".gnuplot");
  summary.figures = static_cast<int>(built.figure_svgs.size());
  summary.tables = static_cast<int>(built.data_files.size());
  summary.missing = built.missing;
  summary.seconds = seconds;
  commit.commit();
  summary.index_html = final_dir / "index.html";
  summary.report_md = final_dir / "report.md";
  return summary;
}

}  // namespace sdpa::report
