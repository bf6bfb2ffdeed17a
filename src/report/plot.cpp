// Figures through gnuplot's svg terminal. Why gnuplot: Debian ships it (gnuplot-nox, no X
// needed), it draws real axes, log scales, error bars, legends and colour maps, and its svg
// terminal without `mouse` writes plain static SVG with no script, so the page stays
// self-contained. We only write the numbers and a few settings; gnuplot draws.
#include "report/plot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace sdpa::report {
namespace fs = std::filesystem;
namespace {

// gnuplot single-quoted string: only ' needs escaping, by doubling it.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

// 17 significant digits: the plotted number is the double in the CSV, bit for bit.
std::string number(double v) { return std::isfinite(v) ? fmt::format("{:.17g}", v) : "?"; }

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool series_has_point(const Series& s) {
  for (const auto& row : s.rows) {
    bool ok = !row.empty();
    for (double v : row) ok = ok && std::isfinite(v);
    if (ok) return true;
  }
  return false;
}

}  // namespace

bool has_data(const Figure& figure) {
  if (figure.panels.empty()) return false;
  for (const auto& panel : figure.panels) {
    bool any = false;
    for (const auto& s : panel.series) any = any || series_has_point(s);
    if (!any) return false;
  }
  return true;
}

std::string gnuplot_script(const Figure& figure, const fs::path& svg_path) {
  std::string g;
  // fixed size: width/height attributes plus a viewBox, so the page can scale it down.
  // noenhanced: labels are literal text (d_k would otherwise become a subscript).
  g += fmt::format(
      "set terminal svg size {},{} fixed noenhanced font 'sans-serif,12' background '#ffffff' "
      "linewidth 1.4\n",
      figure.width, figure.height);
  g += "set encoding utf8\nset datafile missing '?'\n";
  g += "set output " + quoted(svg_path.string()) + "\n";
  for (std::size_t p = 0; p < figure.panels.size(); ++p) {
    for (std::size_t i = 0; i < figure.panels[p].series.size(); ++i) {
      g += fmt::format("$s{}_{} << EOD\n", p, i);
      for (const auto& row : figure.panels[p].series[i].rows) {
        // append, not `(c ? " " : "") + number(...)`: GCC 12 warns falsely on that (PR 105651)
        for (std::size_t c = 0; c < row.size(); ++c) g.append(c ? " " : "").append(number(row[c]));
        g += "\n";
      }
      g += "EOD\n";
    }
  }
  const int n = static_cast<int>(figure.panels.size());
  const int cols = std::max(1, std::min(figure.columns, n));
  if (n > 1) g += fmt::format("set multiplot layout {},{}\n", (n + cols - 1) / cols, cols);
  for (std::size_t p = 0; p < figure.panels.size(); ++p) {
    const Panel& panel = figure.panels[p];
    g += "reset\nset grid lc rgb '#dddddd'\nset key top left box opaque\nset border lc rgb "
         "'#444444'\n";
    if (!panel.title.empty()) g += "set title " + quoted(panel.title) + "\n";
    g += "set xlabel " + quoted(panel.xlabel) + "\nset ylabel " + quoted(panel.ylabel) + "\n";
    if (panel.logx) {
      g += "set logscale x\nset format x '%g'\n";
      // Autoscaling a log axis extends it to the next major tic (a 16..1024 grid got an axis
      // to 8192); fit it to the data with a margin of a factor 1.25 on each side instead.
      double lo = HUGE_VAL, hi = -HUGE_VAL;
      for (const auto& s : panel.series) {
        for (const auto& row : s.rows) {
          if (!row.empty() && std::isfinite(row[0]) && row[0] > 0) {
            lo = std::min(lo, row[0]);
            hi = std::max(hi, row[0]);
          }
        }
      }
      if (lo <= hi) g += fmt::format("set xrange [{:.17g}:{:.17g}]\n", lo / 1.25, hi * 1.25);
      // Over more than four decades a label per decade collides: one every two decades.
      if (lo <= hi && hi / lo > 1e4 && panel.setup.find("xtics") == std::string::npos) {
        g += "set xtics 1e-12,100\n";
      }
    }
    if (panel.logy) g += "set logscale y\nset format y '%g'\n";
    g += panel.setup + "\n";
    std::string plot;
    for (std::size_t i = 0; i < panel.series.size(); ++i) {
      const Series& s = panel.series[i];
      if (!series_has_point(s)) continue;  // gnuplot stops on a series with no valid point
      plot += plot.empty() ? "plot " : ", \\\n     ";
      plot += fmt::format("$s{}_{} using {} with {} ", p, i, s.using_spec, s.style);
      plot += s.title.empty() ? "notitle" : "title " + quoted(s.title);
    }
    g += plot.empty() ? "set label 1 'no data' at graph 0.5,0.5 center\nplot NaN notitle\n"
                      : plot + "\n";
  }
  if (n > 1) g += "unset multiplot\n";
  g += "set output\n";
  return g;
}

fs::path find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t colon = dirs.find(':', start);
    const std::string dir = dirs.substr(start, colon == std::string::npos ? colon : colon - start);
    if (!dir.empty()) {
      const fs::path candidate = fs::path(dir) / "gnuplot";
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return {};
}

std::string render_svg(const Figure& figure, const fs::path& work_dir) {
  const fs::path gnuplot = find_gnuplot();
  if (gnuplot.empty()) {
    throw std::runtime_error(
        "gnuplot: not found on PATH; the report draws its figures with it: install Debian's "
        "package gnuplot-nox (apt-get install gnuplot-nox)");
  }
  fs::create_directories(work_dir);
  const fs::path script = work_dir / (figure.id + ".gp");
  const fs::path svg = work_dir / (figure.id + ".svg");
  const fs::path log = work_dir / (figure.id + ".log");
  {
    std::ofstream out(script, std::ios::binary);
    out << gnuplot_script(figure, svg);
    if (!out) throw std::runtime_error("cannot write " + script.string());
  }
  // posix_spawn rather than system(): no shell, so no quoting of paths.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::string arg0 = gnuplot.string(), arg1 = script.string();
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, arg0.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + arg0 + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid on gnuplot failed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(svg)) {
    throw std::runtime_error(fmt::format("gnuplot failed on figure {} (script {}): {}", figure.id,
                                         script.string(), slurp(log)));
  }
  return slurp(svg);
}

std::string figure_csv(const Figure& figure) {
  std::size_t width = 0;
  for (const auto& panel : figure.panels) {
    for (const auto& s : panel.series) width = std::max(width, s.columns.size());
  }
  auto field = [](const std::string& text) {
    if (text.find_first_of(",\"\n") == std::string::npos) return text;
    std::string out = "\"";
    for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
  };
  std::string csv = "panel,series";
  for (std::size_t c = 0; c < width; ++c) csv += fmt::format(",c{}", c);
  csv += ",columns\n";
  for (const auto& panel : figure.panels) {
    for (const auto& s : panel.series) {
      std::string names;
      for (std::size_t c = 0; c < s.columns.size(); ++c)
        names.append(c ? ";" : "").append(s.columns[c]);
      for (const auto& row : s.rows) {
        csv += field(panel.title) + "," + field(s.title);
        for (std::size_t c = 0; c < width; ++c) {
          csv += ",";
          if (c < row.size()) csv += std::isfinite(row[c]) ? fmt::format("{:.17g}", row[c]) : "";
        }
        csv.append(",").append(field(names)).append("\n");
      }
    }
  }
  return csv;
}

}  // namespace sdpa::report
