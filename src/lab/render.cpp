// The human-readable text of a lab result: claims first, then the key rows of its tables.
#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "lab/lab.h"

namespace sdpa::lab {
namespace {

std::string cell(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (x == std::round(x) && std::fabs(x) < 1e7) return fmt::format("{:.0f}", x);
    return fmt::format("{:.4g}", x);
  }
  return v.dump();
}

// Width in terminal columns: CJK characters take two. Counts UTF-8 lead bytes.
std::size_t display_width(const std::string& s) {
  std::size_t w = 0;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    w += len >= 3 ? 2 : 1;
    i += len;
  }
  return w;
}

void render_table(std::string& out, const std::string& name, const json& rows,
                  std::vector<std::string> columns, const std::function<bool(const json&)>& keep,
                  std::size_t max_rows, Lang lang) {
  if (!rows.is_array() || rows.empty()) return;
  if (columns.empty()) {
    for (const auto& [k, v] : rows[0].items()) columns.push_back(k);
  }
  std::vector<std::vector<std::string>> cells;
  std::size_t kept = 0, total = 0;
  for (const auto& r : rows) {
    if (keep && !keep(r)) continue;
    ++total;
    if (kept >= max_rows) continue;
    ++kept;
    std::vector<std::string> line;
    for (const auto& c : columns) line.push_back(r.contains(c) ? cell(r[c]) : "-");
    cells.push_back(std::move(line));
  }
  std::vector<std::size_t> width(columns.size());
  for (std::size_t j = 0; j < columns.size(); ++j) {
    width[j] = display_width(columns[j]);
    for (const auto& line : cells) width[j] = std::max(width[j], display_width(line[j]));
  }
  out += say(lang, "\n{} ({} of {} rows; all of them with --json):\n",
             "\n{}（显示 {} 行，共 {} 行；--json 给出全部）：\n", name, kept, rows.size());
  auto emit = [&](const std::vector<std::string>& line) {
    out += " ";
    for (std::size_t j = 0; j < line.size(); ++j) {
      out += std::string(width[j] + 2 - display_width(line[j]), ' ') + line[j];
    }
    out += "\n";
  };
  emit(columns);
  for (const auto& line : cells) emit(line);
  if (total > kept) out += say(lang, "  ... {} more\n", "  …… 另有 {} 行\n", total - kept);
}

}  // namespace

std::string render_text(const json& result, Lang lang) {
  const bool zh = lang == Lang::zh;
  std::string out;
  const std::string name = result.value("experiment", std::string("?"));
  out += fmt::format("{} {}  (seed {}, {}, {:.2f} s)\n", zh ? "实验" : "experiment", name,
                     cell(result.value("seed", json())), cell(result.value("mode", json())),
                     result.value("seconds", 0.0));
  if (result.contains("claims")) {
    for (const auto& c : result["claims"]) {
      const std::string key = zh ? "claim_zh" : "claim_en";
      const std::string claim =
          c.contains(key) ? c[key].get<std::string>() : c.value("claim", std::string());
      out += fmt::format("\n[{}] {}\n", c.value("id", std::string("?")), claim);
      out += fmt::format("  {}: {}\n", zh ? "理论" : "theory", c.value("theory", std::string()));
      out += fmt::format("  {}: {}\n", zh ? "测量" : "measured",
                         c.value("measurement", std::string()));
      std::string verdict = c.value("verdict", std::string());
      if (zh) {
        if (verdict == "holds") verdict += "（成立）";
        if (verdict == "fails") verdict += "（不成立）";
        if (verdict == "holds-if") verdict += "（有条件成立）";
        if (verdict == "inconclusive") verdict += "（无法判断）";
      }
      const std::string condition = c.value("condition", std::string());
      out += fmt::format("  {}: {}{}\n", zh ? "结论" : "verdict", verdict,
                         condition.empty() ? "" : ": " + condition);
      const std::string evidence = c.value("evidence", std::string());
      if (!evidence.empty()) out += fmt::format("  {}: {}\n", zh ? "依据" : "evidence", evidence);
    }
  }
  if (!result.contains("tables")) return out;
  const auto& tables = result["tables"];
  const Experiment* e = nullptr;
  for (const auto& candidate : experiments()) {
    if (candidate.name == name) e = &candidate;
  }
  if (e) {
    for (const auto& v : e->views) {
      if (tables.contains(v.table))
        render_table(out, v.table, tables[v.table], v.columns, v.keep, 64, lang);
    }
  } else {
    for (const auto& [table, rows] : tables.items())
      render_table(out, table, rows, {}, nullptr, 12, lang);
  }
  return out;
}

}  // namespace sdpa::lab
