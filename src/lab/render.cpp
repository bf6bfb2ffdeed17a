// The human-readable text of a lab result: claims first, then the key rows of its tables.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>

#include "lab/lab.h"

namespace sdpa::lab {
namespace {

struct View {
  std::string table;
  std::vector<std::string> columns;
  std::function<bool(const json&)> keep;  // null: every row
};

bool is_decade(double c) {
  const double l = std::log10(c);
  return std::fabs(l - std::round(l)) < 1e-9;
}

bool in(int v, std::initializer_list<int> set) {
  for (int s : set) {
    if (v == s) return true;
  }
  return false;
}

const std::map<std::string, std::vector<View>>& views() {
  static const std::map<std::string, std::vector<View>> v = {
      {"softmax",
       {{"article",
         {"i", "logit", "probability", "log10_probability", "naive_float16", "naive_float32",
          "naive_float64", "log10_jacobian_row_norm"},
         nullptr},
        {"overflow",
         {"format", "max_finite", "ln_max", "exp_overflow_measured", "naive_article_p0"},
         nullptr},
        {"sweep",
         {"logits", "c", "entropy", "normalized_entropy", "max_prob", "effective_support",
          "jacobian_norm"},
         [](const json& r) { return is_decade(r["c"].get<double>()); }}}},
      {"derive",
       {{"derive",
         {"distribution", "term", "theory", "estimate", "ci_low", "ci_high", "covered"},
         nullptr}}},
      {"variance",
       {{"variance",
         {"distribution", "d", "mean", "mean_ci_low", "mean_ci_high", "variance", "variance_ci_low",
          "variance_ci_high", "scaled_variance", "variance_covered"},
         [](const json& r) {
           return in(r["d"].get<int>(), {1, 16, 512, 4096});
         }},
        {"variance_noniid",
         {"case", "parameter", "d", "mean", "theory_mean", "variance", "theory_variance",
          "within_row_variance", "within_row_theory", "right_scale_ratio"},
         nullptr}}},
      {"saturation",
       {{"saturation",
         {"d", "n_keys", "scale", "entropy", "entropy_theory", "regime", "max_prob", "grad_q_norm",
          "grad_q_mean", "grad_q_p99", "grad_q_dead", "grad_logits_dead"},
         [](const json& r) { return r["n_keys"].get<int>() == 1024; }},
        {"freezing", {"n_keys", "freezing_d", "freezing_s", "parted_s", "parted_d"}, nullptr}}},
      {"temperature",
       {{"temperature",
         {"d", "c", "entropy", "max_prob", "jacobian_norm", "grad_q_norm", "grad_q_p99",
          "grad_q_dead", "grad_logits_norm", "output_diversity"},
         [](const json& r) { return is_decade(r["c"].get<double>()); }}}},
      // C8, from docs/train.md (its curves table is for plots, too long to print).
      {"train",
       {{"summary",
         {"scale", "d", "best_accuracy", "best_lr", "steps_to_acc90", "lrs_reaching_90", "n_lrs",
          "lr_sensitivity", "init_entropy", "init_grad_norm_wq", "diverged"},
         nullptr},
        {"runs",
         {"scale", "d", "lr", "final_loss", "final_accuracy", "diverged", "steps_to_acc90"},
         nullptr}}},
      {"precision",
       {{"precision",
         {"format", "scale", "logit_rms", "logit_rounding_rms", "prob_rel_error_rms",
          "effective_bits", "bits_lost", "bits_lost_theory"},
         nullptr},
        {"naive_nan",
         {"format", "scale", "d", "nan_fraction", "max_logit_median", "ln_max",
          "theory_d_threshold"},
         [](const json& r) {
           return in(r["d"].get<int>(), {16, 64, 512, 4096});
         }}}},
  };
  return v;
}

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
                  std::size_t max_rows) {
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
  out += fmt::format("\n{} ({} of {} rows; all of them with --json):\n", name, kept, rows.size());
  auto emit = [&](const std::vector<std::string>& line) {
    out += " ";
    for (std::size_t j = 0; j < line.size(); ++j) {
      out += std::string(width[j] + 2 - display_width(line[j]), ' ') + line[j];
    }
    out += "\n";
  };
  emit(columns);
  for (const auto& line : cells) emit(line);
  if (total > kept) out += fmt::format("  ... {} more\n", total - kept);
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
        verdict += verdict == "holds"   ? "（成立）"
                   : verdict == "fails" ? "（不成立）"
                                        : "（有条件成立）";
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
  const auto it = views().find(name);
  if (it != views().end()) {
    for (const auto& v : it->second) {
      if (tables.contains(v.table))
        render_table(out, v.table, tables[v.table], v.columns, v.keep, 64);
    }
  } else {
    for (const auto& [table, rows] : tables.items())
      render_table(out, table, rows, {}, nullptr, 12);
  }
  return out;
}

}  // namespace sdpa::lab
