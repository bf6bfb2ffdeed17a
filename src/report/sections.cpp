#include "report/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <set>
#include <stdexcept>

#include "lab/claims.h"
#include "lab/schema.h"

namespace sdpa::report {
std::string verdict_word(const std::string& verdict, Lang lang) {
  const bool zh = lang == Lang::zh;
  if (verdict == "holds") return zh ? "成立" : "Holds";
  if (verdict == "fails") return zh ? "不成立" : "Does not hold";
  if (verdict == "holds-if") return zh ? "有条件成立" : "Holds only if";
  if (verdict == "inconclusive") return zh ? "无法判断" : "Inconclusive";
  return zh ? "结论：" + verdict : "Verdict: " + verdict;
}

// ---- a view of the lab's tables ------------------------------------------------------------

double num(Row row, const std::string& column) {
  if (!row || !row->is_object() || !row->contains(column)) return std::nan("");
  return to_number((*row)[column]);
}

std::string str(Row row, const std::string& column) {
  if (!row || !row->is_object() || !row->contains(column)) return "";
  const json& v = (*row)[column];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string cell(const json& v) {
  if (v.is_null()) return "—";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::abs(d) < 1e9) return fmt::format("{:.0f}", d);
    return fmt::format("{:.4g}", d);
  }
  return v.dump();
}

std::string fmt_num(double v, const char* spec) {
  if (std::isnan(v)) return "—";
  return fmt::format(fmt::runtime(spec), v);
}

Rows where(const json* t, const std::function<bool(Row)>& keep) {
  Rows r;
  if (!t) return r;
  for (const auto& row : *t) {
    if (keep(&row)) r.push_back(&row);
  }
  return r;
}

Rows all_rows(const json* t) {
  return where(t, [](Row) { return true; });
}

json where_table(const json* t, const std::string& column, const std::string& value) {
  json out = json::array();
  if (t) {
    for (const auto& row : *t) {
      if (str(&row, column) == value) out.push_back(row);
    }
  }
  return out;
}

std::vector<std::string> distinct(const json& t, const std::string& column) {
  return distinct(&t, column);
}

std::vector<std::string> distinct(const json* t, const std::string& column) {
  std::vector<std::string> values;
  if (!t) return values;
  for (const auto& row : *t) {
    const std::string v = str(&row, column);
    if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
  }
  return values;
}

std::vector<double> distinct_numbers(const json* t, const std::string& column) {
  std::set<double> values;
  if (t) {
    for (const auto& row : *t) {
      const double v = num(&row, column);
      if (!std::isnan(v)) values.insert(v);
    }
  }
  return {values.begin(), values.end()};
}

std::string csv_name(const std::string& exp, const std::string& name) {
  return exp + "-" + name + ".csv";
}

// ---- chart helpers -------------------------------------------------------------------------

Series series(const std::string& title, const Rows& rows, const std::vector<std::string>& columns,
              const std::string& using_spec, const std::string& style) {
  Series s{title, columns, {}, using_spec, style};
  for (Row r : rows) {
    std::vector<double> v;
    for (const auto& c : columns) v.push_back(num(r, c));
    s.rows.push_back(std::move(v));
  }
  return s;
}

// 7 filled circle, 5 filled square, 9 filled triangle, 13 filled diamond, 11 filled
// down-triangle, then open shapes.
int point_type(std::size_t i) {
  static const int pts[] = {7, 5, 9, 13, 11, 1, 2, 3};
  return pts[i % 8];
}

Panel grouped_bars(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                   const std::vector<std::string>& labels, const std::vector<std::string>& columns,
                   const std::vector<BarGroup>& groups, const std::string& setup) {
  // Two bars of width 0.35 per category, centred 0.18 either side of its tick.
  assert(groups.size() <= 2);
  Panel p{title, xlabel, ylabel, false, false, setup, {}};
  std::string xtics = "set xtics (";
  for (std::size_t k = 0; k < labels.size(); ++k) {
    xtics += fmt::format("{}{} {}", k ? ", " : "", labels[k], k);
  }
  p.setup += "\n" + xtics + ")\n" +
             fmt::format("set xrange [-0.6:{}]", static_cast<double>(labels.size()) - 0.4);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    p.series.push_back(Series{groups[i].title, columns, groups[i].rows,
                              fmt::format("($1 {} 0.18):2", i == 0 ? "-" : "+"),
                              fmt::format("boxes lt {}", i + 1)});
  }
  return p;
}

// ---- the page --------------------------------------------------------------------------------

Page::Page(const Inputs& inputs, const ReportOptions& options, std::filesystem::path work_dir)
    : inputs_(inputs), options_(options), work_(std::move(work_dir)) {}

std::string Page::tr(const std::string& en, const std::string& zh_text) const {
  return zh() ? zh_text : en;
}

const json* Page::experiment(const std::string& exp) const {
  auto it = inputs_.lab.find(exp);
  return it == inputs_.lab.end() ? nullptr : &it->second;
}

const json* Page::table(const std::string& exp, const std::string& name) const {
  const json* e = experiment(exp);
  if (!e || !e->contains("tables") || !(*e)["tables"].contains(name)) return nullptr;
  const json& t = (*e)["tables"][name];
  return t.is_array() && !t.empty() ? &t : nullptr;
}

const json* Page::table_or_note(Section& s, const std::string& exp, const std::string& name) {
  const json* t = table(exp, name);
  if (!t) note(s, absent(exp, name));
  return t;
}

std::string Page::absent(const std::string& exp, const std::string& name) const {
  auto it = inputs_.missing.find(exp);
  if (it != inputs_.missing.end()) {
    return tr(fmt::format("Not shown: the lab experiment `{}` is absent ({}).", exp, it->second),
              fmt::format("未显示：实验 `{}` 缺失（{}）。", exp, it->second));
  }
  return tr(fmt::format("Not shown: the experiment `{}` has no table `{}`.", exp, name),
            fmt::format("未显示：实验 `{}` 没有表 `{}`。", exp, name));
}

Section& Page::section(const std::string& id, const std::string& heading) {
  out_.document.sections.push_back(Section{id, heading, {}});
  return out_.document.sections.back();
}

Section& Page::claim_section(int index) {
  const lab::ClaimText& c = lab::claim_texts()[index];
  Section& s = section(c.id, fmt::format("{} · {}", c.id, zh() ? c.heading_zh : c.heading_en));
  s.blocks.push_back(Quote{c.passage_zh, c.claim_en});
  return s;
}

void Page::note(Section& s, const std::string& text) {
  // A section notes an absent experiment once, however many of its tables it lacks.
  for (const Block& b : s.blocks) {
    if (const Note* n = std::get_if<Note>(&b); n != nullptr && n->text == text) return;
  }
  s.blocks.push_back(Note{text});
  out_.missing.push_back(s.id + ": " + text);
}

void Page::figure(Section& s, const Figure& f) {
  if (!has_data(f)) {
    note(s, tr(fmt::format("Figure {} not drawn: its tables hold no finite points.", f.id),
               fmt::format("图 {} 未绘制：对应的表中没有有限的数据点。", f.id)));
    return;
  }
  const std::string svg = render_svg(f, work_);
  FigureBlock b;
  b.id = f.id;
  b.caption = f.caption;
  // The mode of the experiment whose table the figure draws (sources are <exp>-<table>.csv).
  if (!f.sources.empty())
    b.caption += mode_tag(f.sources.front().substr(0, f.sources.front().find('-')));
  b.svg = embeddable_svg(svg, "f-" + f.id, f.caption);
  b.csv = "fig-" + f.id + ".csv";
  b.sources = f.sources;
  out_.figure_svgs[f.id] = svg;
  out_.data_files[b.csv] = figure_csv(f);
  s.blocks.push_back(std::move(b));
}

void Page::key_rows(Section& s, const std::string& exp, const std::string& name, const Rows& rows,
                    const std::vector<std::string>& columns, const std::string& caption) {
  if (const lab::Table* declared = lab::find_table(exp, name)) {
    for (const auto& c : columns) {
      if (!declared->find(c)) {
        throw std::logic_error(
            fmt::format("report: column '{}' of {}/{} is not declared by the lab", c, exp, name));
      }
    }
  }
  if (rows.empty()) return;
  TableBlock t;
  t.caption = caption + mode_tag(exp);
  t.csv = csv_name(exp, name);
  t.header = columns;
  for (Row r : rows) {
    std::vector<std::string> line;
    for (const auto& c : columns) line.push_back(r->contains(c) ? cell((*r)[c]) : "—");
    t.rows.push_back(std::move(line));
  }
  s.blocks.push_back(std::move(t));
}

void Page::verdicts(Section& s, const std::string& id) {
  bool any = false;
  for (const auto& name : inputs_.experiment_order) {
    const json* e = experiment(name);
    if (!e || !e->contains("claims")) continue;
    for (const auto& c : (*e)["claims"]) {
      if (str(&c, "id") != id) continue;
      any = true;
      s.blocks.push_back(verdict_block(name, c));
    }
  }
  if (!any) {
    note(s, tr(fmt::format("No verdict on {}: no lab experiment that tests it ran.", id),
               fmt::format("{} 没有结论：检验它的实验没有运行。", id)));
  }
}

void Page::other_verdicts(Section& s, const std::string& exp) {
  const json* e = experiment(exp);
  if (!e || !e->contains("claims")) return;
  for (const auto& c : (*e)["claims"]) {
    const std::string id = str(&c, "id");
    if (id.size() == 2 && id[0] == 'C' && id[1] >= '1' && id[1] <= '8') continue;
    s.blocks.push_back(verdict_block(exp, c));
  }
}

std::string Page::mode_tag(const std::string& exp) const {
  const json* e = experiment(exp);
  if (!e || str(e, "mode").empty()) return "";
  return tr(fmt::format(" [{} mode]", str(e, "mode")), fmt::format("［{} 模式］", str(e, "mode")));
}

VerdictBlock Page::verdict_block(const std::string& exp, const json& c) const {
  VerdictBlock v;
  v.claim_id = str(&c, "id");
  v.verdict = str(&c, "verdict");
  const json* e = experiment(exp);
  v.label = fmt::format("{} [{} {}, {}]", verdict_word(v.verdict, options_.lang), tr("lab", "实验"),
                        exp, e ? str(e, "mode") : std::string("?"));
  v.condition = str(&c, "condition");
  v.lines = {{tr("Theory:", "理论："), str(&c, "theory")},
             {tr("Measured:", "测量："), str(&c, "measurement")},
             {tr("Evidence:", "证据："), str(&c, "evidence")}};
  return v;
}

}  // namespace sdpa::report
