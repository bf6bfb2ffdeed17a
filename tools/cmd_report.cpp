// sdpa report: run the lab and the benchmark and write a self-contained report folder
// (index.html, report.md, figures/*.svg, data/*.csv and *.json). See docs/report.md.
#include <fmt/format.h>

#include <iostream>
#include <optional>

#include "commands.h"
#include "options.h"
#include "report/report.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

struct ReportArgs {
  std::string out = "report";
  bool quick = false, full = false;
  std::string lang = "en";
  std::uint64_t seed = 1;
  int threads = 0;
  std::string from;
  bool from_given = false;  // --from '' is given, and names no folder
  bool json = false;
};

void run(const ReportArgs& a) {
  if (a.quick && a.full) {
    throw Error("--quick, --full: expected at most one of them, got both");
  }
  report::ReportOptions o;
  o.out = a.out;
  o.mode = a.full ? report::Mode::full : report::Mode::quick;
  if (a.lang == "en") {
    o.lang = report::Lang::en;
  } else if (a.lang == "zh") {
    o.lang = report::Lang::zh;
  } else {
    throw Error(fmt::format("--lang: expected en or zh, got '{}'", a.lang));
  }
  o.seed = a.seed;
  o.threads = a.threads;
  if (a.from_given) {
    if (a.from.empty()) {
      throw Error(ErrorKind::bad_value, "--from",
                  "expected a folder with the lab's JSON files (an earlier report's data/), "
                  "got ''");
    }
    o.from = a.from;
  }
  o.progress = stderr_is_terminal();
  const report::ReportSummary s = report::write_report(o);
  if (a.json) {
    nlohmann::json j = {{"index_html", s.index_html.string()},
                        {"report_md", s.report_md.string()},
                        {"seconds", s.seconds},
                        {"figures", s.figures},
                        {"data_files", s.tables},
                        {"missing", s.missing}};
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << fmt::format("report written in {:.1f} s: {} ({} figures, {} data files)\n",
                           s.seconds, s.index_html.string(), s.figures, s.tables);
  std::cout << fmt::format("Markdown: {}\n", s.report_md.string());
  for (const auto& m : s.missing) std::cout << "missing: " << m << "\n";
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Run the lab and the benchmark and write a self-contained report: DIR/index.html (inline "
      "CSS and SVG, renders offline), DIR/report.md, DIR/figures/*.svg, DIR/data/*.csv|json");
  cmd->add_option("--out", args->out, "output folder (replaced as a whole when complete)")
      ->capture_default_str();
  cmd->add_flag("--quick", args->quick, "quick mode (default): a few minutes at most on 2 cores");
  cmd->add_flag("--full", args->full, "full mode: more samples, finer grids, longer training");
  cmd->add_option("--lang", args->lang, "language of the page: en or zh")->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of every random number")
      ->check(seed_validator())
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads (0: one per core)")
      ->check(threads_validator())
      ->capture_default_str();
  cmd->add_option("--from", args->from,
                  "re-render from earlier results instead of running: a folder with "
                  "<experiment>.json and bench.json (an earlier report's data/)");
  cmd->add_flag("--json", args->json, "print one JSON object describing what was written");
  cmd->callback([args, cmd] {
    args->from_given = cmd->count("--from") > 0;
    run(*args);
  });
}

}  // namespace sdpa::cli
