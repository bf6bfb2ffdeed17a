// CSV, HTML escaping and the SVG clean-up that lets many gnuplot figures share one page.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>

#include "report/report.h"

namespace sdpa::report {

double to_number(const json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  if (value.is_string()) {
    std::string s = value.get<std::string>();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "inf" || s == "+inf" || s == "infinity")
      return std::numeric_limits<double>::infinity();
    if (s == "-inf" || s == "-infinity") return -std::numeric_limits<double>::infinity();
  }
  return std::numeric_limits<double>::quiet_NaN();
}

namespace {

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_cell(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return csv_field(v.get<std::string>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // nlohmann writes the shortest round-trip form; JSON has no inf/nan, so spell them out.
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  }
  return csv_field(v.dump());
}

}  // namespace

std::string table_to_csv(const json& rows, const std::vector<std::string>& preferred) {
  if (!rows.is_array()) throw std::runtime_error("table_to_csv: expected an array of rows");
  std::vector<std::string> columns;
  std::set<std::string> seen;
  for (const auto& name : preferred) {
    for (const auto& row : rows) {
      if (row.is_object() && row.contains(name) && seen.insert(name).second) {
        columns.push_back(name);
        break;
      }
    }
  }
  for (const auto& row : rows) {
    if (!row.is_object()) continue;
    for (const auto& item : row.items()) {
      if (seen.insert(item.key()).second) columns.push_back(item.key());
    }
  }
  std::string csv;
  for (std::size_t c = 0; c < columns.size(); ++c)
    csv.append(c ? "," : "").append(csv_field(columns[c]));
  csv += "\n";
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < columns.size(); ++c) {
      if (c) csv += ",";
      if (row.is_object() && row.contains(columns[c])) csv += csv_cell(row[columns[c]]);
    }
    csv += "\n";
  }
  return csv;
}

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string embeddable_svg(const std::string& svg, const std::string& prefix,
                           const std::string& title) {
  std::size_t start = svg.find("<svg");
  if (start == std::string::npos) throw std::runtime_error("gnuplot output holds no <svg> element");
  std::string out = svg.substr(start);  // drops <?xml ...?> and any doctype
  // gnuplot reuses the same ids (gpPt0, textbox, gnuplot_canvas, ...) in every file: two figures
  // on one page would then share them and a later figure's markers would resolve to an earlier
  // one's. Prefix each id and each local reference to it.
  static const std::regex id_re(R"re(\bid\s*=\s*(['"])([^'"]+)\1)re");
  std::set<std::string> ids;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), id_re); it != std::sregex_iterator();
       ++it) {
    ids.insert((*it)[2].str());
  }
  static const std::regex ref_re(
      R"re((\bid\s*=\s*['"]|\bhref\s*=\s*['"]#|url\(\s*['"]?#)([A-Za-z_][-A-Za-z0-9_.:]*))re");
  // gnuplot also repeats an id inside one file (each plot's group appears once for the curve and
  // once for its key entry: two id="gnuplot_plot_1a"): the second and later definitions get a
  // suffix -2, -3, ...; references (href, url) keep pointing at the first.
  std::string rewritten;
  std::size_t last = 0;
  std::map<std::string, int> defined;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), ref_re); it != std::sregex_iterator();
       ++it) {
    const auto& m = *it;
    rewritten.append(out, last, static_cast<std::size_t>(m.position(0)) - last);
    rewritten += m[1].str();
    const std::string name = m[2].str();
    if (!ids.count(name)) {
      rewritten += name;
    } else {
      rewritten += prefix + "-" + name;
      const bool is_definition = m[1].str().rfind("id", 0) == 0;
      if (is_definition && ++defined[name] > 1) rewritten += fmt::format("-{}", defined[name]);
    }
    last = static_cast<std::size_t>(m.position(0) + m.length(0));
  }
  rewritten.append(out, last, std::string::npos);
  out = std::move(rewritten);
  // Nothing outside the figure may be referenced: every href must be local (#...), and no
  // url() may point elsewhere. xmlns attributes are names, not loads, and stay.
  static const std::regex href_re(R"re(\bhref\s*=\s*(['"])([^'"]*)\1)re");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), href_re);
       it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[2].str();
    if (target.empty() || target[0] != '#') {
      throw std::runtime_error("figure " + prefix + ": the SVG references " + target);
    }
  }
  if (out.find("<script") != std::string::npos || out.find("onload=") != std::string::npos) {
    throw std::runtime_error("figure " + prefix + ": the SVG holds a script");
  }
  const auto t0 = out.find("<title>"), t1 = out.find("</title>");
  if (t0 != std::string::npos && t1 != std::string::npos && t1 > t0) {
    out.replace(t0, t1 + 8 - t0, "<title>" + html_escape(title) + "</title>");
  }
  // The page scales figures to its width; a class lets CSS do it (viewBox keeps the aspect).
  out.replace(0, 4, "<svg class=\"figure\" role=\"img\"");
  return out;
}

}  // namespace sdpa::report
