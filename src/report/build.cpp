// The sections of the report. Each claim section follows one pattern: the article's sentence
// (Chinese original beside the English), the figure(s), the key rows of the lab's tables, and
// the lab's verdicts on that claim in plain words. Every number drawn comes from a lab table
// (docs/lab.md, docs/train.md name them); the plotted points are also written to
// data/fig-<id>.csv so that a test (and a reader) can check them against the table's CSV.
#include "report/build.h"

#include <fmt/format.h>
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <numbers>
#include <set>

#include "report/text.h"
#include "sdpa/sdpa.h"

namespace sdpa::report {
namespace fs = std::filesystem;
namespace {

using Row = const json*;
using Rows = std::vector<Row>;

// Preferred column order of the tables' CSVs (nlohmann sorts keys; the docs' order reads better).
const std::map<std::string, std::vector<std::string>>& preferred_columns() {
  static const std::map<std::string, std::vector<std::string>> m = {
      {"variance",
       {"distribution", "d", "samples", "mean", "mean_ci_low", "mean_ci_high", "variance",
        "variance_ci_low", "variance_ci_high", "theory_variance", "scaled_variance",
        "scaled_variance_ci_low", "scaled_variance_ci_high"}},
      {"variance_noniid",
       {"case", "parameter", "d", "samples", "mean", "mean_ci_low", "mean_ci_high", "theory_mean",
        "variance", "variance_ci_low", "variance_ci_high", "theory_variance"}},
      {"saturation",
       {"d", "n_keys", "scale", "scale_value", "entropy", "entropy_theory", "max_prob",
        "effective_support", "jacobian_norm", "grad_q_norm", "grad_k_norm"}},
      {"derive",
       {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low", "ci_high"}},
      {"summary", {"scale", "d", "best_accuracy", "best_lr", "steps_to_90", "lr_sensitivity"}},
      {"curves", {"scale", "d", "lr", "step", "loss", "accuracy"}},
      {"runs", {"scale", "d", "lr", "final_loss", "final_accuracy"}},
      {"temperature", {"d", "n_keys", "c", "scale_value", "entropy"}},
      {"sweep", {"logits", "c", "entropy"}},
      {"article", {"i", "logit", "probability", "log_probability", "log10_probability"}},
      {"bench",
       {"label", "impl", "seconds_median", "gflops_median", "percent_of_peak", "peak_gflops",
        "threads", "target"}},
  };
  return m;
}

double num(Row row, const std::string& column) {
  if (!row || !row->is_object() || !row->contains(column)) return std::nan("");
  return to_number((*row)[column]);
}

std::string str(Row row, const std::string& column) {
  if (!row || !row->is_object() || !row->contains(column)) return "";
  const json& v = (*row)[column];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// A cell for a key-rows table: 4 significant digits, integers as integers.
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

std::string fmt_num(double v, const char* spec = "{:.3g}") {
  if (std::isnan(v)) return "—";
  return fmt::format(fmt::runtime(spec), v);
}

std::string scale_title(const std::string& scale) {
  if (scale == "1") return "scale 1";
  if (scale == "1/sqrt(d)") return "1/√d";
  return scale;
}

// Point types that stay distinguishable in print: 7 filled circle, 5 filled square, 9 filled
// triangle, 13 filled diamond, 11 filled down-triangle.
int point_type(std::size_t i) {
  static const int pts[] = {7, 5, 9, 13, 11, 1, 2, 3};
  return pts[i % 8];
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  int cores = 0;
  std::string model;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      ++cores;
      if (model.empty()) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) model = line.substr(colon + 2);
      }
    }
  }
  if (model.empty()) {
    utsname u{};
    uname(&u);
    model = u.machine;
  }
  return cores > 0 ? fmt::format("{} ({} logical CPUs)", model, cores) : model;
}

class Builder {
 public:
  Builder(const Inputs& in, const ReportOptions& options, fs::path work)
      : in_(in), o_(options), zh_(options.lang == Lang::zh), work_(std::move(work)) {}

  Built build() {
    write_table_csvs();
    auto& d = out_.document;
    d.lang = zh_ ? "zh-CN" : "en";
    d.title = tr("Why attention divides by √d: the article's claims, measured",
                 "注意力为什么除以 √d：逐条测量原文的论断");
    d.subtitle = tr(
        "Every claim of the interview explainer “大模型面试必备13-Softmax 前为什么要除以根号 d？” "
        "turned into a measurement with its uncertainty and a verdict, by the sdpa lab; then "
        "where the article stops; then the attention kernel that ran it all.",
        "面试文章《大模型面试必备13-Softmax 前为什么要除以根号 d？》中的每一条论断，都由 sdpa "
        "实验室变成带不确定度的测量和结论；然后是原文没有讨论的部分；最后是运行这一切的注意力计算核"
        "。");
    d.contents_label = tr("Contents", "目录");
    summary();
    claim_c1();
    claim_c2();
    claim_c3();
    claim_c4();
    claim_c5();
    claim_c6();
    claim_c7();
    claim_c8();
    beyond_noniid();
    beyond_freezing();
    beyond_alternatives();
    beyond_temperature();
    beyond_precision();
    beyond_training();
    kernel();
    data_files();
    d.footer =
        tr(fmt::format("sdpa {} · seed {} · every figure drawn by gnuplot from the CSV "
                       "beside it in data/ · regenerate with: sdpa report --{} --seed {}",
                       version(), o_.seed, o_.mode == Mode::quick ? "quick" : "full", o_.seed),
           fmt::format("sdpa {} · 种子 {} · 每张图都由 gnuplot 根据 data/ 中对应的 CSV 绘制 · "
                       "重新生成：sdpa report --{} --seed {} --lang zh",
                       version(), o_.seed, o_.mode == Mode::quick ? "quick" : "full", o_.seed));
    return std::move(out_);
  }

 private:
  // ---- helpers ----------------------------------------------------------------------------

  std::string tr(const std::string& en, const std::string& zh) const { return zh_ ? zh : en; }

  const json* experiment(const std::string& exp) const {
    auto it = in_.lab.find(exp);
    return it == in_.lab.end() ? nullptr : &it->second;
  }

  // The table's rows, or nullptr when the experiment or the table is absent or empty.
  const json* table(const std::string& exp, const std::string& name) const {
    const json* e = experiment(exp);
    if (!e || !e->contains("tables") || !(*e)["tables"].contains(name)) return nullptr;
    const json& t = (*e)["tables"][name];
    return t.is_array() && !t.empty() ? &t : nullptr;
  }

  std::string csv_name(const std::string& exp, const std::string& name) const {
    return exp + "-" + name + ".csv";
  }

  // Why a table is missing, in the page's language.
  std::string absent(const std::string& exp, const std::string& name) const {
    auto it = in_.missing.find(exp);
    if (it != in_.missing.end()) {
      return tr(fmt::format("Not shown: the lab experiment `{}` is absent ({}).", exp, it->second),
                fmt::format("未显示：实验 `{}` 缺失（{}）。", exp, it->second));
    }
    return tr(fmt::format("Not shown: the experiment `{}` has no table `{}`.", exp, name),
              fmt::format("未显示：实验 `{}` 没有表 `{}`。", exp, name));
  }

  void note(Section& s, const std::string& text) {
    s.blocks.push_back(Note{text});
    out_.missing.push_back(s.id + ": " + text);
  }

  static Rows where(const json* t, const std::function<bool(Row)>& keep) {
    Rows r;
    if (!t) return r;
    for (const auto& row : *t) {
      if (keep(&row)) r.push_back(&row);
    }
    return r;
  }

  // The rows of `t` whose `column` reads `value`, as a table (for distinct()).
  static json where_table(const json* t, const std::string& column, const std::string& value) {
    json out = json::array();
    if (t) {
      for (const auto& row : *t) {
        if (str(&row, column) == value) out.push_back(row);
      }
    }
    return out;
  }
  static std::vector<std::string> distinct(const json& t, const std::string& column) {
    return distinct(&t, column);
  }

  static std::vector<std::string> distinct(const json* t, const std::string& column) {
    std::vector<std::string> values;
    if (!t) return values;
    for (const auto& row : *t) {
      const std::string v = str(&row, column);
      if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
    }
    return values;
  }

  static std::vector<double> distinct_numbers(const json* t, const std::string& column) {
    std::set<double> values;
    if (t) {
      for (const auto& row : *t) {
        const double v = num(&row, column);
        if (!std::isnan(v)) values.insert(v);
      }
    }
    return {values.begin(), values.end()};
  }

  static Series series(const std::string& title, const Rows& rows,
                       const std::vector<std::string>& columns, const std::string& using_spec,
                       const std::string& style) {
    Series s{title, columns, {}, using_spec, style};
    for (Row r : rows) {
      std::vector<double> v;
      for (const auto& c : columns) v.push_back(num(r, c));
      s.rows.push_back(std::move(v));
    }
    return s;
  }

  // Draws the figure (or notes why not) and appends it to the section.
  void figure(Section& s, Figure f) {
    if (!has_data(f)) {
      note(s, tr(fmt::format("Figure {} not drawn: its tables hold no finite points.", f.id),
                 fmt::format("图 {} 未绘制：对应的表中没有有限的数据点。", f.id)));
      return;
    }
    const std::string svg = render_svg(f, work_);
    FigureBlock b;
    b.id = f.id;
    b.caption = f.caption;
    b.svg = embeddable_svg(svg, "f-" + f.id, f.caption);
    b.csv = "fig-" + f.id + ".csv";
    b.sources = f.sources;
    out_.figure_svgs[f.id] = svg;
    out_.data_files[b.csv] = figure_csv(f);
    s.blocks.push_back(std::move(b));
  }

  // A few rows of a table, with the named columns.
  void key_rows(Section& s, const std::string& exp, const std::string& name, const Rows& rows,
                const std::vector<std::string>& columns, const std::string& caption) {
    if (rows.empty()) return;
    TableBlock t;
    t.caption = caption;
    t.csv = csv_name(exp, name);
    t.header = columns;
    for (Row r : rows) {
      std::vector<std::string> line;
      for (const auto& c : columns) line.push_back(r->contains(c) ? cell((*r)[c]) : "—");
      t.rows.push_back(std::move(line));
    }
    s.blocks.push_back(std::move(t));
  }

  // Every verdict of the lab on claim `id` (several experiments may test one claim).
  void verdicts(Section& s, const std::string& id) {
    bool any = false;
    for (const auto& name : in_.experiment_order) {
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

  VerdictBlock verdict_block(const std::string& exp, const json& c) const {
    VerdictBlock v;
    v.claim_id = str(&c, "id");
    v.verdict = str(&c, "verdict");
    v.label = fmt::format("{} [{} {}]", verdict_word(v.verdict, o_.lang), tr("lab", "实验"), exp);
    v.condition = str(&c, "condition");
    v.lines = {{tr("Theory:", "理论："), str(&c, "theory")},
               {tr("Measured:", "测量："), str(&c, "measurement")},
               {tr("Evidence:", "证据："), str(&c, "evidence")}};
    return v;
  }

  Section& section(const std::string& id, const std::string& heading) {
    out_.document.sections.push_back(Section{id, heading, {}});
    return out_.document.sections.back();
  }

  Section& claim_section(int index) {
    const ClaimText& c = claim_texts()[index];
    Section& s = section(c.id, fmt::format("{} · {}", c.id, zh_ ? c.heading_zh : c.heading_en));
    s.blocks.push_back(Quote{c.article_zh, c.article_en});
    return s;
  }

  void write_table_csvs() {
    for (const auto& [exp, result] : in_.lab) {
      if (!result.contains("tables") || !result["tables"].is_object()) continue;
      for (const auto& [name, rows] : result["tables"].items()) {
        if (!rows.is_array()) continue;
        auto it = preferred_columns().find(name);
        out_.data_files[csv_name(exp, name)] = table_to_csv(
            rows, it == preferred_columns().end() ? std::vector<std::string>{} : it->second);
      }
    }
    if (in_.bench.is_object() && in_.bench.contains("rows")) {
      out_.data_files["bench.csv"] =
          table_to_csv(in_.bench["rows"], preferred_columns().at("bench"));
    }
  }

  // ---- the header summary -------------------------------------------------------------------

  void summary() {
    auto& sum = out_.document.summary;
    sum.push_back(Paragraph{tr(
        "How to read this page: each claim has a section with the article's sentence, a figure, "
        "the key rows of the measurement and the verdict. “Holds” means the measurement agrees "
        "with the claim within its 95% confidence interval; “holds only if” names the condition; "
        "“does not hold” says what was seen instead. Every figure's numbers are in data/ as CSV.",
        "阅读方法：每条论断一节，依次给出原文、图、测量的关键行和结论。“成立”表示测量在 95% "
        "置信区间内与论断一致；“有条件成立”给出条件；“不成立”说明实际看到了什么。每张图的数据都以 "
        "CSV "
        "形式保存在 data/ 中。")});
    TableBlock t;
    t.header = {tr("claim", "论断"), tr("the article says", "原文"),
                tr("verdicts of the lab", "实验结论")};
    for (int i = 0; i < kClaims; ++i) {
      const ClaimText& c = claim_texts()[i];
      std::string verdict_list;
      for (const auto& name : in_.experiment_order) {
        const json* e = experiment(name);
        if (!e || !e->contains("claims")) continue;
        for (const auto& cl : (*e)["claims"]) {
          if (str(&cl, "id") != c.id) continue;
          if (!verdict_list.empty()) verdict_list += "; ";
          verdict_list += fmt::format("{}: {}", name, verdict_word(str(&cl, "verdict"), o_.lang));
          const std::string cond = str(&cl, "condition");
          if (!cond.empty()) verdict_list += " (" + cond + ")";
        }
      }
      if (verdict_list.empty()) verdict_list = tr("not measured in this run", "本次未测量");
      t.rows.push_back({c.id, zh_ ? c.heading_zh : c.heading_en, verdict_list});
    }
    sum.push_back(std::move(t));
    std::vector<std::string> absent_parts;
    for (const auto& [name, why] : in_.missing) absent_parts.push_back(name + ": " + why);
    if (!in_.bench_missing.empty()) absent_parts.push_back("bench: " + in_.bench_missing);
    for (const auto& a : absent_parts) {
      sum.push_back(Note{tr("Missing from this run — ", "本次缺失——") + a});
      out_.missing.push_back(a);
    }
  }

  // ---- C1: softmax(c x) sweep ---------------------------------------------------------------

  void claim_c1() {
    Section& s = claim_section(0);
    s.blocks.push_back(Paragraph{tr(
        "softmax(c·x) for a sweep of the multiplier c: the article's logits [1000, 10, 5] and 64 "
        "standard-normal logits. Normalised entropy 1 is uniform, 0 is one-hot.",
        "对乘数 c 扫描 softmax(c·x)：原文的 [1000, 10, 5] 和 64 个标准正态 logits。归一化熵为 1 "
        "表示均匀，0 表示 one-hot。")});
    const json* sweep = table("softmax", "sweep");
    if (!sweep) {
      note(s, absent("softmax", "sweep"));
    } else {
      Figure f;
      f.id = "c1-softmax-sweep";
      f.caption = tr("C1: softmax(c·x) against c: entropy, largest probability, Jacobian norm.",
                     "C1：softmax(c·x) 随 c 的变化：熵、最大概率、雅可比范数。");
      f.sources = {csv_name("softmax", "sweep")};
      f.columns = 3;
      f.width = 980;
      f.height = 380;
      Panel pe{tr("entropy / ln N", "熵 / ln N"),
               tr("multiplier c", "乘数 c"),
               tr("normalised entropy (1 = uniform)", "归一化熵（1 = 均匀）"),
               true,
               false,
               "set yrange [-0.05:1.05]\nset key bottom left",
               {}};
      Panel pm{tr("largest probability", "最大概率"),
               tr("multiplier c", "乘数 c"),
               tr("max p (1 = one-hot)", "max p（1 = one-hot）"),
               true,
               false,
               "set yrange [0:1.05]\nset key top left",
               {}};
      Panel pj{tr("‖diag(p) − p pᵀ‖_F", "‖diag(p) − p pᵀ‖_F"),
               tr("multiplier c", "乘数 c"),
               tr("Jacobian norm (how much gradient passes)", "雅可比范数（可通过的梯度）"),
               true,
               true,
               "set key bottom left",
               {}};
      std::size_t i = 0;
      for (const auto& logits : distinct(sweep, "logits")) {
        const Rows rows = where(sweep, [&](Row r) { return str(r, "logits") == logits; });
        const std::string style = fmt::format("linespoints pt {} ps 0.6", point_type(i++));
        pe.series.push_back(series(logits, rows, {"c", "normalized_entropy"}, "1:2", style));
        pm.series.push_back(series(logits, rows, {"c", "max_prob"}, "1:2", style));
        // Jacobian norms of a one-hot output are exactly 0 (or below 1e-300): drawn as gaps on
        // the log axis, they are listed in the CSV.
        pj.series.push_back(
            series(logits, rows, {"c", "jacobian_norm"}, "1:($2 > 0 ? $2 : NaN)", style));
      }
      f.panels = {pe, pm, pj};
      figure(s, f);
      const Rows key = where(sweep, [](Row r) {
        const double c = num(r, "c");
        return str(r, "logits") == "normal-64" &&
               (std::abs(std::log10(c) - std::round(std::log10(c))) < 1e-9);
      });
      key_rows(s, "softmax", "sweep", key,
               {"logits", "c", "entropy", "normalized_entropy", "max_prob", "effective_support",
                "jacobian_norm"},
               tr("Key rows (64 normal logits, c at powers of ten):",
                  "关键行（64 个正态 logits，c 取 10 的整数次幂）："));
    }
    verdicts(s, "C1");
  }

  // ---- C2: the article's [1000, 10, 5] --------------------------------------------------------

  void claim_c2() {
    Section& s = claim_section(1);
    const json* article = table("softmax", "article");
    if (!article) {
      note(s, absent("softmax", "article"));
    } else {
      s.blocks.push_back(Paragraph{tr(
          "The stable softmax (maximum subtracted before exp) gives [1, e^-990, e^-995] exactly, "
          "with no overflow; the figure shows log10 of each probability and of the Jacobian row "
          "norm, i.e. how much gradient can reach each logit.",
          "稳定的 softmax（exp 之前先减去最大值）精确给出 [1, e^-990, "
          "e^-995]，不会溢出；图中是每个概率"
          "及雅可比矩阵每行范数的 log10，即能到达每个 logit 的梯度大小。")});
      Figure f;
      f.id = "c2-article-logits";
      f.caption =
          tr("C2: softmax([1000, 10, 5]): log10 of each probability and of the gradient "
             "that can reach each logit.",
             "C2：softmax([1000, 10, 5])：各概率及可到达各 logit 的梯度的 log10。");
      f.sources = {csv_name("softmax", "article")};
      f.height = 380;
      Panel p{"",
              tr("logit position i (x = [1000, 10, 5])", "logit 位置 i（x = [1000, 10, 5]）"),
              tr("log10 (value)", "log10（数值）"),
              false,
              false,
              "set style fill solid 0.8 border -1\nset boxwidth 0.35\nset xtics 1\n"
              "set xrange [-0.6:2.6]\nset key bottom left",
              {}};
      const Rows rows = where(article, [](Row) { return true; });
      p.series.push_back(series(tr("log10 probability", "log10 概率"), rows,
                                {"i", "log10_probability"}, "($1 - 0.18):2", "boxes"));
      p.series.push_back(series(tr("log10 ‖Jacobian row i‖", "log10 ‖雅可比第 i 行‖"), rows,
                                {"i", "log10_jacobian_row_norm"}, "($1 + 0.18):2", "boxes"));
      f.panels = {p};
      figure(s, f);
      key_rows(s, "softmax", "article", rows,
               {"i", "logit", "probability", "log10_probability", "naive_float16", "naive_float32",
                "naive_float64", "log10_jacobian_row_norm"},
               tr("The article's row, stable and naive (naive = exp(x)/Σexp(x) in that format):",
                  "原文的这一行，稳定算法与朴素算法（朴素 = 在该格式下计算 exp(x)/Σexp(x)）："));
    }
    if (const json* overflow = table("softmax", "overflow")) {
      key_rows(s, "softmax", "overflow", where(overflow, [](Row) { return true; }),
               {"format", "max_finite", "ln_max", "exp_overflow_measured", "naive_article_p0"},
               tr("Where exp overflows in each format (theory ln(max finite)):",
                  "各格式中 exp 溢出的位置（理论值 ln(最大有限值)）："));
    }
    verdicts(s, "C2");
  }

  // ---- C3..C6: the variance table -----------------------------------------------------------

  // One series per distribution, using the given columns.
  // The five distributions share every d: each is drawn shifted by a factor 2^(±0.06·k) along
  // the (log) d axis so that their error bars do not hide one another; the CSV keeps the d.
  std::vector<Series> per_distribution(const json* t, const std::vector<std::string>& columns,
                                       const std::string& using_spec, const std::string& with) {
    std::vector<Series> out;
    const auto dists = distinct(t, "distribution");
    for (std::size_t i = 0; i < dists.size(); ++i) {
      const Rows rows = where(t, [&](Row r) { return str(r, "distribution") == dists[i]; });
      const double shift =
          std::exp2(0.06 * (static_cast<double>(i) - 0.5 * static_cast<double>(dists.size() - 1)));
      const std::string spec =
          fmt::format("($1*{:.6f}){}", shift, using_spec.substr(using_spec.find(':')));
      out.push_back(series(dists[i], rows, columns, spec,
                           fmt::format("{} pt {} ps 0.7", with, point_type(i))));
    }
    return out;
  }

  void claim_c3() {
    Section& s = claim_section(2);
    const json* v = table("variance", "variance");
    if (!v) {
      note(s, absent("variance", "variance"));
    } else {
      s.blocks.push_back(Paragraph{tr(
          "The mean of q·k in units of its theoretical standard deviation √d, with the 95% "
          "confidence interval, for five distributions of the components (all mean 0, variance 1).",
          "q·k 的均值（以理论标准差 √d 为单位）及其 95% 置信区间，分量取五种分布（均值 0、方差 "
          "1）。")});
      Figure f;
      f.id = "c3-mean";
      f.caption = tr("C3: mean of q·k / √d against d, with 95% confidence intervals; theory 0.",
                     "C3：q·k / √d 的均值随 d 的变化，含 95% 置信区间；理论值 0。");
      f.sources = {csv_name("variance", "variance")};
      Panel p{"",
              tr("dimension d", "维度 d"),
              tr("mean of q·k / √d", "q·k / √d 的均值"),
              true,
              false,
              "set xtics 1,4\nset key top right",
              {}};
      p.series = per_distribution(v, {"d", "mean", "mean_ci_low", "mean_ci_high"},
                                  "1:($2/sqrt($1)):($3/sqrt($1)):($4/sqrt($1))", "yerrorbars");
      Series zero{
          tr("theory: 0", "理论：0"), {"d", "theory_mean"}, {}, "1:2", "lines dt 2 lc rgb 'black'"};
      for (double d : distinct_numbers(v, "d")) zero.rows.push_back({d, 0.0});
      p.series.push_back(zero);
      f.panels = {p};
      figure(s, f);
      key_rows(
          s, "variance", "variance",
          where(v,
                [](Row r) {
                  const double d = num(r, "d");
                  return str(r, "distribution") == "normal" &&
                         (d == 1 || d == 64 || d == 512 || d == 4096);
                }),
          {"distribution", "d", "samples", "mean", "mean_ci_low", "mean_ci_high", "mean_covered"},
          tr("Key rows (normal components):", "关键行（正态分量）："));
    }
    if (const json* dv = table("derive", "derive")) {
      key_rows(s, "derive", "derive",
               where(dv,
                     [](Row r) {
                       return str(r, "distribution") == "normal" && str(r, "term") == "E[q_i k_i]";
                     }),
               {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low", "ci_high",
                "covered"},
               tr("The derivation's first step:", "推导的第一步："));
    }
    verdicts(s, "C3");
  }

  void claim_c4() {
    Section& s = claim_section(3);
    const json* v = table("variance", "variance");
    if (!v) {
      note(s, absent("variance", "variance"));
    } else {
      Figure f;
      f.id = "c4-variance";
      f.caption =
          tr("C4: Var(q·k) against d on log-log axes, 95% confidence intervals (from the "
             "sample's fourth moment), theory Var = d.",
             "C4：Var(q·k) 随 d 的变化（双对数坐标），95% 置信区间（由样本四阶矩得到），理论 Var = "
             "d。");
      f.sources = {csv_name("variance", "variance")};
      f.height = 480;
      Panel p{"",
              tr("dimension d", "维度 d"),
              tr("Var(q·k)", "Var(q·k)"),
              true,
              true,
              "set xtics 1,4\nset key top left",
              {}};
      const Rows normal = where(v, [](Row r) { return str(r, "distribution") == "normal"; });
      const Series theory =
          series(tr("theory: Var = d", "理论：Var = d"), normal, {"d", "theory_variance"}, "1:2",
                 "lines dt 2 lw 1.5 lc rgb 'black'");
      p.series = per_distribution(v, {"d", "variance", "variance_ci_low", "variance_ci_high"},
                                  "1:2:3:4", "yerrorbars");
      p.series.push_back(theory);
      f.panels = {p};
      figure(s, f);
      key_rows(s, "variance", "variance",
               where(v,
                     [](Row r) {
                       const double d = num(r, "d");
                       return str(r, "distribution") == "normal" &&
                              (d == 1 || d == 16 || d == 256 || d == 4096);
                     }),
               {"distribution", "d", "samples", "variance", "variance_ci_low", "variance_ci_high",
                "theory_variance", "variance_covered"},
               tr("Key rows (normal components):", "关键行（正态分量）："));
    }
    if (const json* dv = table("derive", "derive")) {
      key_rows(s, "derive", "derive",
               where(dv, [](Row r) { return str(r, "distribution") == "normal"; }),
               {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low", "ci_high",
                "covered"},
               tr("Each step of the derivation at d = 512 (normal components; the CSV has all "
                  "five distributions):",
                  "d = 512 时推导的每一步（正态分量；CSV 中有全部五种分布）："));
    }
    verdicts(s, "C4");
  }

  void claim_c5() {
    Section& s = claim_section(4);
    const json* v = table("variance", "variance");
    if (!v) {
      note(s, absent("variance", "variance"));
    } else {
      key_rows(s, "variance", "variance", where(v, [](Row r) { return num(r, "d") == 512; }),
               {"distribution", "d", "samples", "variance", "variance_ci_low", "variance_ci_high",
                "theory_variance", "variance_covered", "kurtosis"},
               tr("The d = 512 rows, one per distribution:", "d = 512 的各行（每种分布一行）："));
    }
    const json* h = table("saturation", "score_histogram");
    if (!h) {
      note(s, absent("saturation", "score_histogram"));
    } else {
      Figure f;
      f.id = "c5-score-histograms";
      f.caption =
          tr("C5: histograms of the scores, unscaled q·k (left) and scaled q·k/√d "
             "(right), at several d; dashed: the normal density N(0, s²).",
             "C5：分数直方图，未缩放的 q·k（左）与缩放后的 q·k/√d（右），不同 d；虚线：正态密度 "
             "N(0, s²)。");
      f.sources = {csv_name("saturation", "score_histogram")};
      f.columns = 2;
      f.width = 980;
      f.height = 400;
      Panel pu{tr("unscaled: q·k", "未缩放：q·k"),
               tr("score", "分数"),
               tr("probability density", "概率密度"),
               false,
               false,
               "set key top right",
               {}};
      Panel ps{tr("scaled: q·k / √d", "缩放：q·k / √d"),
               tr("score", "分数"),
               tr("probability density", "概率密度"),
               false,
               false,
               "set key top right\nset xrange [-5:5]",
               {}};
      std::size_t i = 0;
      for (double d : distinct_numbers(h, "d")) {
        for (auto* panel : {&pu, &ps}) {
          const std::string scale = panel == &pu ? "1" : "1/sqrt(d)";
          const Rows rows =
              where(h, [&](Row r) { return num(r, "d") == d && str(r, "scale") == scale; });
          const int lt = static_cast<int>(i) + 1;
          panel->series.push_back(series(fmt::format("d = {}", d), rows,
                                         {"bin_low", "bin_high", "density"}, "(($1+$2)/2):3",
                                         fmt::format("histeps lw 1.5 lt {}", lt)));
          panel->series.push_back(series("", rows, {"bin_low", "bin_high", "theory_density"},
                                         "(($1+$2)/2):3", fmt::format("lines dt 2 lt {}", lt)));
        }
        ++i;
      }
      f.panels = {pu, ps};
      figure(s, f);
    }
    verdicts(s, "C5");
  }

  void claim_c6() {
    Section& s = claim_section(5);
    const json* v = table("variance", "variance");
    if (!v) {
      note(s, absent("variance", "variance"));
    } else {
      Figure f;
      f.id = "c6-scaled-variance";
      f.caption =
          tr("C6: variance of the scaled score q·k/√d against d, 95% confidence "
             "intervals; theory 1 for every d.",
             "C6：缩放后分数 q·k/√d 的方差随 d 的变化，95% 置信区间；理论值对所有 d 都是 1。");
      f.sources = {csv_name("variance", "variance")};
      Panel p{"",
              tr("dimension d", "维度 d"),
              tr("Var(q·k / √d)", "Var(q·k / √d)"),
              true,
              false,
              "set xtics 1,4\nset key top right",
              {}};
      p.series = per_distribution(
          v, {"d", "scaled_variance", "scaled_variance_ci_low", "scaled_variance_ci_high"},
          "1:2:3:4", "yerrorbars");
      Series one{
          tr("theory: 1", "理论：1"), {"d", "theory"}, {}, "1:2", "lines dt 2 lc rgb 'black'"};
      for (double d : distinct_numbers(v, "d")) one.rows.push_back({d, 1.0});
      p.series.push_back(one);
      f.panels = {p};
      figure(s, f);
    }
    if (const json* dv = table("derive", "derive")) {
      key_rows(s, "derive", "derive",
               where(dv, [](Row r) { return str(r, "term") == "Var(q.k/sqrt(d))"; }),
               {"distribution", "d", "samples", "term", "theory", "estimate", "ci_low", "ci_high",
                "covered"},
               tr("Var(cX) = c²Var(X) with c = 1/√d, at d = 512:",
                  "Var(cX) = c²Var(X)，c = 1/√d，d = 512："));
    }
    verdicts(s, "C6");
  }

  // ---- C7: saturation -----------------------------------------------------------------------

  // The N the C7 figure shows: 128 (the size CLAIMS.md's simulation used) when present.
  static double pick_n(const json* t) {
    const auto ns = distinct_numbers(t, "n_keys");
    if (ns.empty()) return std::nan("");
    if (std::find(ns.begin(), ns.end(), 128.0) != ns.end()) return 128;
    return ns[ns.size() / 2];
  }

  void claim_c7() {
    Section& s = claim_section(6);
    const json* t = table("saturation", "saturation");
    if (!t) {
      note(s, absent("saturation", "saturation"));
    } else {
      const double n = pick_n(t);
      s.blocks.push_back(Paragraph{tr(
          fmt::format("Random unit-variance Q, K, V and upstream gradient, N = {} keys, through "
                      "the project's attention forward and backward. The gradient is shown as a "
                      "distribution over query rows: median (solid) and 99th percentile (dashed), "
                      "and the fraction of dead rows (norm below 1/1000 of the scaled median).",
                      n),
          fmt::format(
              "随机的单位方差 Q、K、V 与上游梯度，N = {} 个键，经过本项目的注意力前向与反向。"
              "梯度以各查询行的分布呈现：中位数（实线）与第 99 百分位（虚线），以及“死”行的比例"
              "（范数低于缩放情形中位数的千分之一）。",
              n))});
      Figure f;
      f.id = "c7-saturation";
      f.caption =
          tr(fmt::format("C7: saturation against d for each scale (N = {} keys): "
                         "entropy (dashed: theory ln N − s²/2), largest probability, "
                         "gradient reaching Q, dead rows.",
                         n),
             fmt::format("C7：各缩放下饱和程度随 d 的变化（N = {} 个键）：熵（虚线：理论值 ln N − "
                         "s²/2）、最大概率、到达 Q 的梯度、死行比例。",
                         n));
      f.sources = {csv_name("saturation", "saturation")};
      f.columns = 2;
      f.width = 980;
      f.height = 720;
      const std::string d_label = tr("dimension d", "维度 d");
      Panel pe{
          tr("attention entropy", "注意力熵"),
          d_label,
          tr("entropy (nats)", "熵（nats）"),
          true,
          false,
          fmt::format("set xtics 1,4\nset key bottom left\nset yrange [0:{}]", 1.1 * std::log(n)),
          {}};
      Panel pm{tr("largest attention probability", "最大注意力概率"),
               d_label,
               tr("max p (mean over rows)", "max p（行平均）"),
               true,
               false,
               "set xtics 1,4\nset key top left\nset yrange [0:1.05]",
               {}};
      Panel pg{tr("‖dQ‖ per query row", "每个查询行的 ‖dQ‖"),
               d_label,
               tr("gradient norm", "梯度范数"),
               true,
               true,
               "set xtics 1,4\nset key top left",
               {}};
      Panel pd{tr("dead rows of dQ", "dQ 的死行"),
               d_label,
               tr("fraction of rows (norm < 1e-3 × scaled median)",
                  "行比例（范数 < 1e-3 × 缩放中位数）"),
               true,
               false,
               "set xtics 1,4\nset key top left\nset yrange [-0.02:1.02]",
               {}};
      std::size_t i = 0;
      for (const auto& scale : distinct(t, "scale")) {
        const Rows rows =
            where(t, [&](Row r) { return num(r, "n_keys") == n && str(r, "scale") == scale; });
        const int lt = static_cast<int>(i) + 1;
        const std::string style = fmt::format("linespoints lt {} pt {} ps 0.8", lt, point_type(i));
        const std::string title = scale_title(scale);
        pe.series.push_back(series(title, rows, {"d", "entropy"}, "1:2", style));
        pe.series.push_back(series("", rows, {"d", "entropy_theory"}, "1:($2 >= 0 ? $2 : NaN)",
                                   fmt::format("lines dt 2 lt {}", lt)));
        pm.series.push_back(series(title, rows, {"d", "max_prob"}, "1:2", style));
        // Only the medians get a legend entry; the caption says that dashed is the p99.
        pg.series.push_back(
            series(title, rows, {"d", "grad_q_norm"}, "1:($2 > 0 ? $2 : NaN)", style));
        pg.series.push_back(series("", rows, {"d", "grad_q_p99"}, "1:($2 > 0 ? $2 : NaN)",
                                   fmt::format("lines dt 2 lt {}", lt)));
        pd.series.push_back(series(title, rows, {"d", "grad_q_dead"}, "1:2", style));
        ++i;
      }
      f.panels = {pe, pm, pg, pd};
      figure(s, f);
      key_rows(
          s, "saturation", "saturation", where(t, [&](Row r) { return num(r, "n_keys") == n; }),
          {"scale", "d", "n_keys", "logit_std", "entropy", "entropy_theory", "regime", "max_prob",
           "grad_q_norm", "grad_q_mean", "grad_q_p99", "grad_q_dead", "grad_logits_norm"},
          tr(fmt::format("Key rows (N = {}); grad_*_norm is the median over rows:", n),
             fmt::format("关键行（N = {}）；grad_*_norm 为各行中位数：", n)));
    }
    verdicts(s, "C7");
  }

  // ---- C8: training ---------------------------------------------------------------------------

  // For each (scale, d) the summary's best_lr; the curves of those runs.
  Rows best_curve(const json* curves, const json* summary, const std::string& scale, double d) {
    double lr = std::nan("");
    for (const auto& row : *summary) {
      if (str(&row, "scale") == scale && num(&row, "d") == d) lr = num(&row, "best_lr");
    }
    return where(curves, [&](Row r) {
      return str(r, "scale") == scale && num(r, "d") == d && num(r, "lr") == lr;
    });
  }

  void claim_c8() {
    Section& s = claim_section(7);
    const json* curves = table("train", "curves");
    const json* summary = table("train", "summary");
    if (!curves || !summary) {
      note(s, absent("train", !curves ? "curves" : "summary"));
    } else {
      s.blocks.push_back(Paragraph{
          tr("Associative recall learned by one attention layer through the project's kernels, for "
             "each attention scale and head dimension d, each at its best learning rate of the "
             "sweep (so that no variant loses to a badly chosen rate). Top: accuracy on the "
             "evaluation set; bottom: attention entropy (ln P is uniform, 0 is one-hot).",
             "一个注意力层通过本项目的计算核学习联想回忆任务；每种注意力缩放和头维度 d "
             "都取学习率扫描中最好的"
             "学习率（避免某个变体输在学习率选得不好）。上：评估集准确率；下：注意力熵（ln P "
             "为均匀，0 为 "
             "one-hot）。")});
      const auto ds = distinct_numbers(summary, "d");
      Figure f;
      f.id = "c8-training";
      f.caption =
          tr("C8: training curves per variant at its best learning rate: accuracy (top) "
             "and attention entropy (bottom) against optimizer steps, one column per d.",
             "C8：各变体在最佳学习率下的训练曲线：准确率（上）与注意力熵（下）随优化步数的变化，每"
             "列一个 d。");
      f.sources = {csv_name("train", "curves"), csv_name("train", "summary")};
      f.columns = static_cast<int>(ds.size());
      f.width = 980;
      f.height = 700;
      std::vector<Panel> acc, ent;
      for (double d : ds) {
        Panel pa{fmt::format("d = {}", d),
                 tr("optimizer steps", "优化步数"),
                 tr("accuracy", "准确率"),
                 false,
                 false,
                 "set yrange [0:1.05]\nset key bottom right",
                 {}};
        Panel pe{fmt::format("d = {}", d),
                 tr("optimizer steps", "优化步数"),
                 tr("attention entropy (nats)", "注意力熵（nats）"),
                 false,
                 false,
                 "set key top right\nset yrange [0:*]",
                 {}};
        std::size_t i = 0;
        for (const auto& scale : distinct(summary, "scale")) {
          const Rows rows = best_curve(curves, summary, scale, d);
          const std::string style =
              fmt::format("linespoints lt {} pt {} ps 0.5", i + 1, point_type(i));
          pa.series.push_back(series(scale_title(scale), rows, {"step", "accuracy"}, "1:2", style));
          pe.series.push_back(series(scale_title(scale), rows, {"step", "entropy"}, "1:2", style));
          ++i;
        }
        acc.push_back(pa);
        ent.push_back(pe);
      }
      f.panels = acc;
      f.panels.insert(f.panels.end(), ent.begin(), ent.end());
      figure(s, f);
      key_rows(s, "train", "summary", where(summary, [](Row) { return true; }),
               {"scale", "d", "best_accuracy", "best_lr", "steps_to_90", "steps_to_acc90",
                "lrs_reaching_90", "n_lrs", "lr_sensitivity", "init_entropy", "init_max_logit",
                "init_grad_norm_wq", "diverged"},
               tr("Per variant (best over the learning-rate sweep):",
                  "每个变体（学习率扫描中的最好结果）："));
    }
    verdicts(s, "C8");
  }

  // ---- beyond the article -------------------------------------------------------------------

  // Claims of an experiment whose id is not one of C1..C8.
  void other_verdicts(Section& s, const std::string& exp) {
    const json* e = experiment(exp);
    if (!e || !e->contains("claims")) return;
    for (const auto& c : (*e)["claims"]) {
      const std::string id = str(&c, "id");
      if (id.size() == 2 && id[0] == 'C' && id[1] >= '1' && id[1] <= '8') continue;
      s.blocks.push_back(verdict_block(exp, c));
    }
  }

  void beyond_noniid() {
    Section& s =
        section("non-ideal", tr("Beyond the article: non-ideal inputs", "超出原文：非理想输入"));
    s.blocks.push_back(Paragraph{
        tr("The derivation assumes independent components with mean 0 and variance 1. Left: other "
           "distributions with the same two moments give the same variance (only the width of the "
           "interval changes, through the fourth moment). Right: what each broken assumption does "
           "to the variance within one row of scores, which is what softmax sees, against its "
           "closed form.",
           "推导假设分量独立、均值 0、方差 "
           "1。左：其他分布只要前两阶矩相同，方差就相同（只是四阶矩改变置信区间"
           "的宽度）。右：每个被打破的假设如何改变同一行分数内部的方差（这正是 softmax "
           "看到的），并与闭式解对比。")});
    const json* v = table("variance", "variance");
    const json* n = table("variance", "variance_noniid");
    if (!v) note(s, absent("variance", "variance"));
    if (!n) note(s, absent("variance", "variance_noniid"));
    if (v || n) {
      Figure f;
      f.id = "beyond-non-ideal";
      f.caption =
          tr("Non-ideal inputs. Left: Var(q·k)/d per distribution with 95% intervals. "
             "Right: within-row variance / d against the parameter of each case "
             "(points: measured with 95% intervals; lines: closed form).",
             "非理想输入。左：各分布的 Var(q·k)/d 及 95% 区间。右：各被打破的假设下行内方差 / d 随 "
             "d 的变化"
             "（点：测量值及 95% 区间；线：闭式解）。");
      if (v) f.sources.push_back(csv_name("variance", "variance"));
      if (n) f.sources.push_back(csv_name("variance", "variance_noniid"));
      f.columns = 2;
      f.width = 980;
      f.height = 420;
      if (v) {
        Panel p{tr("five distributions", "五种分布"),
                tr("dimension d", "维度 d"),
                tr("Var(q·k) / d", "Var(q·k) / d"),
                true,
                false,
                "set xtics 1,4\nset key top right",
                {}};
        p.series = per_distribution(v, {"d", "variance", "variance_ci_low", "variance_ci_high"},
                                    "1:($2/$1):($3/$1):($4/$1)", "yerrorbars");
        f.panels.push_back(p);
      }
      if (n) {
        // One series per (case, parameter), against d: within-row variance / d is 1 when
        // 1/sqrt(d) is the right normaliser, and (1/right_scale_ratio)^2 otherwise.
        Panel p{tr("broken assumptions", "被打破的假设"),
                tr("dimension d", "维度 d"),
                tr("within-row variance / d", "行内方差 / d"),
                true,
                true,
                "set xtics 1,4\nset key top left",
                {}};
        std::size_t i = 0;
        for (const auto& c : distinct(n, "case")) {
          for (const auto& par : distinct(where_table(n, "case", c), "parameter")) {
            const Rows rows =
                where(n, [&](Row r) { return str(r, "case") == c && str(r, "parameter") == par; });
            const int lt = static_cast<int>(i) + 1;
            p.series.push_back(
                series(fmt::format("{} {}", c, par), rows,
                       {"d", "within_row_variance", "within_row_ci_low", "within_row_ci_high"},
                       "1:($2/$1):($3/$1):($4/$1)",
                       fmt::format("yerrorbars lt {} pt {} ps 0.7", lt, point_type(i))));
            p.series.push_back(series("", rows, {"d", "within_row_theory"}, "1:($2/$1)",
                                      fmt::format("lines lt {} dt 2", lt)));
            ++i;
          }
        }
        f.panels.push_back(p);
      }
      figure(s, f);
    }
    if (n) {
      key_rows(
          s, "variance", "variance_noniid", where(n, [](Row) { return true; }),
          {"case", "parameter", "d", "mean", "theory_mean", "variance", "theory_variance",
           "within_row_variance", "within_row_theory", "within_row_covered", "right_scale_ratio"},
          tr("Each case against its closed form; right_scale_ratio is the right normaliser "
             "divided by 1/√d (1: 1/√d is right):",
             "每种情形与其闭式解；right_scale_ratio 为正确的归一化因子除以 1/√d（1 表示 1/√d "
             "正确）："));
    }
    other_verdicts(s, "variance");
    other_verdicts(s, "derive");
  }

  void beyond_freezing() {
    Section& s = section("freezing", tr("Beyond the article: the (d, N) freezing boundary",
                                        "超出原文：(d, N) 冻结边界"));
    s.blocks.push_back(Paragraph{tr(
        "Saturation depends on the number of keys N as well as on d. For N Gaussian logits of "
        "standard deviation s the entropy is ln N − s²/2 while s² < 2 ln N, and collapses beyond "
        "(the freezing of the random energy model). Unscaled logits have s = √d, so they freeze "
        "once d passes 2 ln N (red line); scaled ones (s = 1) never do. Colour: measured "
        "entropy / ln N (1 = uniform, 0 = one-hot); the number in each cell is that value.",
        "饱和不仅取决于 d，也取决于键的个数 N。对 N 个标准差为 s 的高斯 logits，当 s² < 2 ln N "
        "时熵为 "
        "ln N − s²/2，超过后熵崩塌（随机能量模型的冻结）。未缩放的 logits 有 s = √d，因此 d 超过 2 "
        "ln N"
        "（红线）后冻结；缩放后（s = 1）永远不会。颜色：测得的熵 / ln N（1 = 均匀，0 = "
        "one-hot）；格中数字即此值。")});
    const json* t = table("saturation", "saturation");
    if (!t) {
      note(s, absent("saturation", "saturation"));
    } else {
      Figure f;
      f.id = "freezing-boundary";
      f.caption = tr(
          "Entropy / ln N over (d, N), unscaled (left) and scaled by 1/√d (right); "
          "red: the boundary d = 2 ln N.",
          "熵 / ln N 在 (d, N) 上的分布，未缩放（左）与 1/√d 缩放（右）；红线：边界 d = 2 ln N。");
      f.sources = {csv_name("saturation", "saturation")};
      f.columns = 2;
      f.width = 980;
      f.height = 430;
      const auto ds = distinct_numbers(t, "d");
      const auto ns = distinct_numbers(t, "n_keys");
      // Cells span half-way (in log space) to the neighbouring grid values.
      auto edges = [](const std::vector<double>& g, std::size_t i) {
        const double lo = i > 0 ? std::sqrt(g[i - 1] * g[i]) : g[i] / std::sqrt(g[1] / g[0]);
        const double hi =
            i + 1 < g.size() ? std::sqrt(g[i] * g[i + 1]) : g[i] * std::sqrt(g[i] / g[i - 1]);
        return std::pair{lo, hi};
      };
      if (ds.size() >= 2 && ns.size() >= 2) {
        const double dlo = edges(ds, 0).first, dhi = edges(ds, ds.size() - 1).second;
        const double nlo = edges(ns, 0).first, nhi = edges(ns, ns.size() - 1).second;
        for (const std::string scale : {"1", "1/sqrt(d)"}) {
          Panel p{
              scale == "1" ? tr("unscaled (scale 1)", "未缩放（scale 1）")
                           : tr("scaled (1/√d)", "缩放（1/√d）"),
              tr("dimension d", "维度 d"),
              tr("number of keys N", "键的个数 N"),
              true,
              true,
              fmt::format("set xrange [{}:{}]\nset yrange [{}:{}]\nset cbrange [0:1]\n"
                          "set palette defined (0 '#440154', 0.25 '#3b528b', 0.5 '#21918c', "
                          "0.75 '#5ec962', 1 '#fde725')\nset cblabel 'entropy / ln N'\n"
                          "set xtics 1,4\nset ytics 2,8\nset key bottom right opaque\nunset grid",
                          dlo, dhi, nlo, nhi),
              {}};
          Series cells{"",
                       {"d", "n_keys", "d_low", "d_high", "n_low", "n_high", "entropy", "ln_n"},
                       {},
                       "1:2:3:4:5:6:($7/$8)",
                       "boxxyerror fs solid 1.0 noborder lc palette"};
          for (std::size_t i = 0; i < ds.size(); ++i) {
            for (std::size_t j = 0; j < ns.size(); ++j) {
              const Rows r = where(t, [&](Row row) {
                return num(row, "d") == ds[i] && num(row, "n_keys") == ns[j] &&
                       str(row, "scale") == scale;
              });
              if (r.empty()) continue;
              const auto [a, b] = edges(ds, i);
              const auto [c, e] = edges(ns, j);
              cells.rows.push_back(
                  {ds[i], ns[j], a, b, c, e, num(r[0], "entropy"), std::log(ns[j])});
            }
          }
          // The value in each cell: white on the dark half of the palette, black on the light.
          Series labels = cells;
          labels.title = "";
          labels.using_spec = "1:($7/$8 >= 0.5 ? $2 : NaN):(sprintf('%.2f', $7/$8))";
          labels.style = "labels tc rgb '#000000' font ',10'";
          Series dark_labels = labels;
          dark_labels.using_spec = "1:($7/$8 < 0.5 ? $2 : NaN):(sprintf('%.2f', $7/$8))";
          dark_labels.style = "labels tc rgb '#ffffff' font ',10'";
          Series boundary{tr("d = 2 ln N", "d = 2 ln N"),
                          {"boundary_d", "boundary_n"},
                          {},
                          "1:2",
                          "lines lw 3 lc rgb '#e8112d'"};
          for (int k = 0; k <= 60; ++k) {
            const double nn = nlo * std::pow(nhi / nlo, k / 60.0);
            boundary.rows.push_back({2 * std::log(nn), nn});
          }
          p.series = {cells, labels, dark_labels, boundary};
          f.panels.push_back(p);
        }
        figure(s, f);
      } else {
        note(s, tr("The saturation grid has fewer than two values of d or N.",
                   "saturation 网格中 d 或 N 的取值少于两个。"));
      }
    }
    if (const json* fr = table("saturation", "freezing")) {
      key_rows(s, "saturation", "freezing", where(fr, [](Row) { return true; }),
               {"n_keys", "freezing_d", "first_parted_d"},
               tr("Per N: the theoretical freezing point 2 ln N and the first d of the grid where "
                  "measured entropy leaves the theory by more than 10% of ln N (scale 1):",
                  "每个 N：理论冻结点 2 ln N，以及网格中测得的熵偏离理论超过 ln N 的 10% 的最小 "
                  "d（scale 1）："));
    }
    other_verdicts(s, "saturation");
  }

  void beyond_alternatives() {
    Section& s = section("alternatives", tr("Beyond the article: QK-norm, soft-capping and 1/d",
                                            "超出原文：QK-norm、软截断与 1/d"));
    s.blocks.push_back(Paragraph{
        tr("1/√d restores unit variance only if q and k have unit-variance components. Real models "
           "use other normalisers: 1/d (muP), QK-norm (q and k RMS-normalised before the product, "
           "so the logit is √d·cos(q, k)) and logit soft-capping (Gemma 2: 50·tanh(y/50)). Here "
           "they are compared when q and k keep unit variance (σ = 1) and when their activations "
           "have grown four-fold (σ = 4), N = 1024 keys.",
           "只有当 q、k 的分量方差为 1 时，1/√d 才能把方差拉回 1。实际模型还使用其他归一化：1/d"
           "（muP）、QK-norm（点积前对 q、k 做 RMS 归一化，logit 即 √d·cos(q, k)）以及 logit 软截断"
           "（Gemma 2：50·tanh(y/50)）。这里比较 q、k 方差为 1（σ = 1）与激活增大四倍（σ = 4）"
           "两种情形，N = 1024 个键。")});
    const json* t = table("saturation", "alternatives");
    if (!t) {
      note(s, absent("saturation", "alternatives"));
    } else {
      Figure f;
      f.id = "alternatives";
      f.caption = tr(
          "Normalised entropy of the attention row against d for each normaliser, with q and k of "
          "unit variance (left) and grown four-fold (right). 1 = uniform, 0 = one-hot.",
          "各归一化方式下注意力行的归一化熵随 d 的变化：q、k 方差为 1（左）与增大四倍（右）。"
          "1 = 均匀，0 = one-hot。");
      f.sources = {csv_name("saturation", "alternatives")};
      f.columns = 2;
      f.width = 900;
      f.height = 380;
      const std::vector<std::string> methods = {"1", "1/sqrt(d)", "1/d", "qk-norm", "softcap"};
      for (double sigma : distinct_numbers(t, "sigma")) {
        Panel p{fmt::format("σ = {}", sigma),
                "d",
                tr("entropy / ln N", "熵 / ln N"),
                true,
                false,
                "set yrange [-0.05:1.05]\nset key center right",
                {}};
        for (std::size_t i = 0; i < methods.size(); ++i) {
          const Rows rows = where(t, [&](Row r) {
            return num(r, "sigma") == sigma && r->value("method", "") == methods[i];
          });
          p.series.push_back(
              series(methods[i], rows, {"d", "normalized_entropy"}, "1:2",
                     fmt::format("linespoints lt {} pt {} ps 0.6", i + 1, point_type(i))));
        }
        f.panels.push_back(p);
      }
      figure(s, f);
      const double d_max = distinct_numbers(t, "d").back();
      key_rows(s, "saturation", "alternatives",
               where(t, [&](Row r) { return num(r, "d") == d_max; }),
               {"sigma", "d", "method", "logit_std_theory", "logit_std", "entropy", "max_prob",
                "grad_logits_norm", "grad_logits_dead"},
               tr("At the largest d: only QK-norm keeps the logits at standard deviation 1 when "
                  "the activations grow; soft-capping at 50 leaves a standard deviation of 16 "
                  "almost untouched.",
                  "最大 d 处：激活增大时只有 QK-norm 让 logits 的标准差保持为 1；"
                  "在 50 处软截断几乎不改变 16 的标准差。"));
    }
  }

  void beyond_temperature() {
    Section& s = section("temperature",
                         tr("Beyond the article: the temperature sweep", "超出原文：温度扫描"));
    s.blocks.push_back(Paragraph{
        tr("softmax(c·QKᵀ/√d) for c from 1e-3 to 1e2: too large a scale freezes attention, too "
           "small a scale makes it uniform. Uniform attention still passes gradient, but every "
           "query then receives the same output: output diversity (variance of the output across "
           "queries / variance of V) measures the preference that is left.",
           "对 c 从 1e-3 到 1e2 计算 "
           "softmax(c·QKᵀ/√d)：缩放过大则注意力冻结，过小则变均匀。均匀的注意力仍能"
           "传递梯度，但每个查询得到相同的输出：输出多样性（输出在各查询间的方差 / V "
           "的方差）衡量剩下的区分度。")});
    const json* t = table("temperature", "temperature");
    if (!t) {
      note(s, absent("temperature", "temperature"));
    } else {
      Figure f;
      f.id = "temperature";
      f.caption =
          tr("Temperature sweep: normalised entropy, gradient reaching Q (median, solid; "
             "99th percentile, dashed) and output diversity against c.",
             "温度扫描：归一化熵、到达 Q 的梯度（中位数实线，第 99 百分位虚线）及输出多样性随 c "
             "的变化。");
      f.sources = {csv_name("temperature", "temperature")};
      f.columns = 3;
      f.width = 980;
      f.height = 380;
      const std::string c_label = tr("c (scale = c/√d)", "c（缩放 = c/√d）");
      Panel pe{tr("entropy / ln N", "熵 / ln N"),
               c_label,
               tr("normalised entropy", "归一化熵"),
               true,
               false,
               "set yrange [-0.05:1.05]\nset key bottom left",
               {}};
      Panel pg{
          tr("‖dQ‖ per row", "每行 ‖dQ‖"), c_label, tr("gradient norm", "梯度范数"), true, true,
          "set key bottom center",         {}};
      Panel po{tr("output diversity", "输出多样性"),
               c_label,
               tr("Var across queries / Var(V)", "查询间方差 / Var(V)"),
               true,
               false,
               "set key top left\nset yrange [0:*]",
               {}};
      std::size_t i = 0;
      for (double d : distinct_numbers(t, "d")) {
        const Rows rows = where(t, [&](Row r) { return num(r, "d") == d; });
        const int lt = static_cast<int>(i) + 1;
        const std::string style = fmt::format("linespoints lt {} pt {} ps 0.6", lt, point_type(i));
        const std::string title = fmt::format("d = {}", d);
        pe.series.push_back(series(title, rows, {"c", "normalized_entropy"}, "1:2", style));
        pg.series.push_back(series(title + tr(" median", " 中位数"), rows, {"c", "grad_q_norm"},
                                   "1:($2 > 0 ? $2 : NaN)", style));
        pg.series.push_back(series(title + " p99", rows, {"c", "grad_q_p99"},
                                   "1:($2 > 0 ? $2 : NaN)", fmt::format("lines lt {} dt 2", lt)));
        po.series.push_back(series(title, rows, {"c", "output_diversity"}, "1:2", style));
        ++i;
      }
      f.panels = {pe, pg, po};
      figure(s, f);
      // The row with the largest median gradient, per d, and the ends of the sweep.
      Rows key;
      for (double d : distinct_numbers(t, "d")) {
        const Rows rows = where(t, [&](Row r) { return num(r, "d") == d; });
        Row best = nullptr;
        for (Row r : rows) {
          if (!best || num(r, "grad_q_norm") > num(best, "grad_q_norm")) best = r;
        }
        key.push_back(rows.front());
        if (best && best != rows.front() && best != rows.back()) key.push_back(best);
        if (rows.back() != rows.front()) key.push_back(rows.back());
      }
      key_rows(s, "temperature", "temperature", key,
               {"d", "n_keys", "c", "scale_value", "normalized_entropy", "max_prob", "grad_q_norm",
                "grad_q_p99", "grad_q_dead", "output_diversity"},
               tr("The ends of the sweep and the c with the largest median gradient:",
                  "扫描的两端，以及中位梯度最大的 c："));
    }
    other_verdicts(s, "temperature");
  }

  void beyond_precision() {
    Section& s = section("precision", tr("Beyond the article: low precision", "超出原文：低精度"));
    s.blocks.push_back(Paragraph{
        tr("The same logits rounded to float16, bfloat16 (emulated) and float32: an unscaled logit "
           "at d = 512 is √512 ≈ 22.6 times larger, so its rounding error is too, and the "
           "probabilities lose about 0.5·log2(d) = 4.5 bits; in the naive softmax exp overflows in "
           "float16 once the row maximum passes 11.09.",
           "同样的 logits 舍入到 float16、bfloat16（模拟）和 float32：d = 512 时未缩放的 logit 大 "
           "√512 ≈ "
           "22.6 倍，舍入误差也同样变大，概率损失约 0.5·log2(d) = 4.5 位；朴素 softmax 在 float16 "
           "中一旦行"
           "最大值超过 11.09，exp 就会溢出。")});
    const json* t = table("precision", "precision");
    const json* nan = table("precision", "naive_nan");
    if (!t) note(s, absent("precision", "precision"));
    if (t || nan) {
      Figure f;
      f.id = "precision";
      f.caption =
          tr("Precision: effective bits of the probabilities per format (left) and the "
             "fraction of rows where the naive softmax gives NaN (right), unscaled vs "
             "scaled logits.",
             "精度：各格式下概率的有效位数（左），以及朴素 softmax 得到 NaN "
             "的行比例（右），未缩放与缩放对比。");
      f.columns = 2;
      f.width = 980;
      f.height = 380;
      // Formats on the x axis by index; labels through xtic().
      auto bars = [&](const json* table_rows, const std::string& column, const std::string& ylabel,
                      const std::string& title) {
        Panel p{title,
                tr("format", "格式"),
                ylabel,
                false,
                false,
                "set style fill solid 0.8 border -1\nset boxwidth 0.35\nset key top right\n"
                "set yrange [0:*]",
                {}};
        const auto formats = distinct(table_rows, "format");
        std::string xtics = "set xtics (";
        for (std::size_t k = 0; k < formats.size(); ++k) {
          xtics += fmt::format("{}'{}' {}", k ? ", " : "", formats[k], k);
        }
        p.setup += "\n" + xtics + ")\n" +
                   fmt::format("set xrange [-0.6:{}]", static_cast<double>(formats.size()) - 0.4);
        std::size_t i = 0;
        for (const auto& scale : distinct(table_rows, "scale")) {
          Series sr{scale_title(scale),
                    {"format_index", column},
                    {},
                    fmt::format("($1 {} 0.18):2", i == 0 ? "-" : "+"),
                    fmt::format("boxes lt {}", i + 1)};
          for (std::size_t k = 0; k < formats.size(); ++k) {
            for (Row r : where(table_rows, [&](Row r) {
                   return str(r, "format") == formats[k] && str(r, "scale") == scale;
                 })) {
              sr.rows.push_back({static_cast<double>(k), num(r, column)});
            }
          }
          p.series.push_back(sr);
          ++i;
        }
        return p;
      };
      if (t) {
        f.sources.push_back(csv_name("precision", "precision"));
        f.panels.push_back(bars(t, "effective_bits", tr("effective bits of p", "p 的有效位数"),
                                tr("effective bits", "有效位数")));
      }
      if (nan) {
        f.sources.push_back(csv_name("precision", "naive_nan"));
        // Against d: unscaled rows (solid) turn to NaN once the row maximum, about
        // sqrt(2 d ln N), passes ln(max finite) of the format; scaled rows (dashed) never do.
        Panel p{tr("naive softmax: rows with NaN", "朴素 softmax：出现 NaN 的行"),
                tr("dimension d", "维度 d"),
                tr("fraction of rows with NaN", "出现 NaN 的行比例"),
                true,
                false,
                "set xtics 1,4\nset yrange [-0.03:1.08]\nset key top left",
                {}};
        std::size_t i = 0;
        for (const auto& format : distinct(nan, "format")) {
          const int lt = static_cast<int>(i) + 1;
          for (const auto& scale : distinct(nan, "scale")) {
            const Rows rows = where(
                nan, [&](Row r) { return str(r, "format") == format && str(r, "scale") == scale; });
            const bool unscaled = scale == "1";
            p.series.push_back(
                series(format + ", " + scale_title(scale), rows, {"d", "nan_fraction"}, "1:2",
                       unscaled ? fmt::format("linespoints lt {} pt {} ps 0.6", lt, point_type(i))
                                : fmt::format("lines lt {} dt 2", lt)));
          }
          ++i;
        }
        f.panels.push_back(p);
      }
      figure(s, f);
    }
    if (t) {
      key_rows(s, "precision", "precision", where(t, [](Row) { return true; }),
               {"format", "scale", "d", "n_keys", "logit_rms", "logit_rounding_rms",
                "prob_rel_error_rms", "effective_bits", "bits_lost", "bits_lost_theory"},
               tr("Bits lost by unscaled logits (theory 0.5·log2 d):",
                  "未缩放 logits 损失的位数（理论值 0.5·log2 d）："));
    }
    if (nan) {
      key_rows(s, "precision", "naive_nan", where(nan, [](Row) { return true; }),
               {"format", "scale", "d", "n_keys", "nan_fraction", "max_logit_median", "ln_max",
                "theory_d_threshold"},
               tr("Where the naive softmax turns to NaN:", "朴素 softmax 何时变成 NaN："));
    }
    other_verdicts(s, "precision");
    other_verdicts(s, "softmax");
  }

  void beyond_training() {
    Section& s =
        section("training", tr("Beyond the article: the training ablation", "超出原文：训练消融"));
    s.blocks.push_back(Paragraph{
        tr("Every learning rate of the sweep, for the four variants: scale 1, 1/√d, 1/d (μP) and "
           "QK-normalisation with a learned temperature. A variant that only works at one rate is "
           "fragile; one that fails at every rate is stuck.",
           "学习率扫描中的每个学习率，四种变体：scale 1、1/√d、1/d（μP）以及带可学习温度的 QK "
           "归一化。只在"
           "一个学习率下有效的变体是脆弱的；在所有学习率下都失败的变体是“卡死”的。")});
    const json* runs = table("train", "runs");
    if (!runs) {
      note(s, absent("train", "runs"));
    } else {
      const auto ds = distinct_numbers(runs, "d");
      Figure f;
      f.id = "training-lr-sweep";
      f.caption = tr("Final accuracy against the learning rate, per variant, one panel per d.",
                     "最终准确率随学习率的变化，每个变体一条线，每个 d 一幅子图。");
      f.sources = {csv_name("train", "runs")};
      f.columns = static_cast<int>(ds.size());
      f.width = 980;
      f.height = 400;
      for (double d : ds) {
        Panel p{fmt::format("d = {}", d),
                tr("Adam learning rate", "Adam 学习率"),
                tr("final accuracy", "最终准确率"),
                true,
                false,
                "set yrange [0:1.05]\nset key bottom left",
                {}};
        std::size_t i = 0;
        for (const auto& scale : distinct(runs, "scale")) {
          const Rows rows =
              where(runs, [&](Row r) { return num(r, "d") == d && str(r, "scale") == scale; });
          p.series.push_back(
              series(scale_title(scale), rows, {"lr", "final_accuracy"}, "1:2",
                     fmt::format("linespoints lt {} pt {} ps 0.7", i + 1, point_type(i))));
          ++i;
        }
        f.panels.push_back(p);
      }
      figure(s, f);
    }
    other_verdicts(s, "train");
  }

  // ---- the kernel ---------------------------------------------------------------------------

  void kernel() {
    Section& s = section("kernel", tr("The kernel: speed and accuracy", "计算核：速度与精度"));
    s.blocks.push_back(Paragraph{tr(
        "The fused kernel (--impl fast, FlashAttention-2 style, never materialising L × S) beside "
        "the naive three-pass float32 baseline (--impl naive), as `sdpa bench` measures them on "
        "this machine: median of the repeats, GFLOP/s with forward 4·B·H·L·S·E (halved when "
        "causal, backward 2.5×), and the percentage of the machine's measured FP32 FMA peak.",
        "融合计算核（--impl fast，FlashAttention-2 式，从不生成 L × S 矩阵）与朴素的三遍 float32 "
        "基线"
        "（--impl naive）并列，数据来自本机上的 `sdpa bench`：重复测量的中位数；GFLOP/s 按前向 "
        "4·B·H·L·S·E 计（因果减半，反向 2.5 倍），以及占本机实测 FP32 FMA 峰值的百分比。")});
    const json rows =
        in_.bench.is_object() && in_.bench.contains("rows") ? in_.bench["rows"] : json();
    if (!rows.is_array() || rows.empty()) {
      note(s, tr("Not shown: no benchmark rows (", "未显示：没有基准测试数据（") +
                  (in_.bench_missing.empty() ? std::string("—") : in_.bench_missing) + ")");
    } else {
      std::vector<std::string> labels;
      for (const auto& r : rows) {
        const std::string l = str(&r, "label");
        if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
      }
      double peak = 0;
      for (const auto& r : rows) peak = std::max(peak, num(&r, "peak_gflops"));
      Figure f;
      f.id = "kernel-bench";
      f.caption =
          tr("GFLOP/s of the fused kernel and the naive baseline per shape (B = 1, "
             "H = 8), median of the repeats; dashed: the measured FP32 peak.",
             "各形状下融合计算核与朴素基线的 GFLOP/s（B = 1，H = 8），重复测量的中位数；虚线：实测 "
             "FP32 峰值。");
      f.sources = {"bench.csv"};
      f.height = 420;
      std::string xt = "set xtics (";
      for (std::size_t k = 0; k < labels.size(); ++k) {
        // The shape goes in the tick label: "fwd E=64\nL=S=1024".
        Row r = nullptr;
        for (const auto& row : rows) {
          if (str(&row, "label") == labels[k]) r = &row;
        }
        const double seq = num(r, "seq");
        // double quotes: gnuplot turns \n into a line break only there
        xt += fmt::format("{}\"{}{}\" {}", k ? ", " : "", labels[k],
                          std::isnan(seq) ? "" : fmt::format("\\nL=S={}", seq), k);
      }
      Panel p{"",
              tr("shape", "形状"),
              "GFLOP/s",
              false,
              false,
              "set style fill solid 0.85 border -1\nset boxwidth 0.35\nset key top right\n" + xt +
                  ")\n" +
                  fmt::format("set xrange [-0.6:{}]\nset yrange [0:{}]", labels.size() - 0.4,
                              peak > 0 ? 1.12 * peak : 0.0) +
                  (peak > 0 ? "" : "\nset yrange [0:*]"),
              {}};
      std::size_t i = 0;
      for (const std::string impl : {"fast", "naive"}) {
        Series sr{impl == "fast" ? tr("fused (fast)", "融合（fast）")
                                 : tr("naive three-pass", "朴素三遍（naive）"),
                  {"shape_index", "gflops_median", "percent_of_peak"},
                  {},
                  fmt::format("($1 {} 0.18):2", i == 0 ? "-" : "+"),
                  fmt::format("boxes lt {}", i + 1)};
        for (std::size_t k = 0; k < labels.size(); ++k) {
          for (const auto& r : rows) {
            if (str(&r, "label") == labels[k] && str(&r, "impl") == impl) {
              sr.rows.push_back({double(k), num(&r, "gflops_median"), num(&r, "percent_of_peak")});
            }
          }
        }
        p.series.push_back(sr);
        ++i;
      }
      if (peak > 0) {
        Series pk{tr(fmt::format("measured peak {:.0f} GFLOP/s", peak),
                     fmt::format("实测峰值 {:.0f} GFLOP/s", peak)),
                  {"x", "peak_gflops"},
                  {{-0.6, peak}, {labels.size() - 0.4, peak}},
                  "1:2",
                  "lines dt 2 lw 2 lc rgb 'black'"};
        p.series.push_back(pk);
      }
      f.panels = {p};
      figure(s, f);
      TableBlock t;
      t.caption = tr("Benchmark rows:", "基准测试数据：");
      t.csv = "bench.csv";
      t.header = {"shape",   "impl",      "B,H,L,S,E", "seconds (median)",
                  "GFLOP/s", "% of peak", "threads",   "target"};
      for (const auto& r : rows) {
        t.rows.push_back(
            {str(&r, "label"), str(&r, "impl"),
             fmt::format("{},{},{},{},{}", cell(r.value("batch", json())),
                         cell(r.value("heads", json())), cell(r.value("seq", json())),
                         cell(r.value("kv_seq", json())), cell(r.value("dim", json()))),
             fmt_num(num(&r, "seconds_median"), "{:.4g}"),
             fmt_num(num(&r, "gflops_median"), "{:.1f}"),
             fmt_num(num(&r, "percent_of_peak"), "{:.1f}"), str(&r, "threads"), str(&r, "target")});
      }
      s.blocks.push_back(std::move(t));
    }
    if (in_.bench.is_object() && in_.bench.contains("accuracy")) {
      const json& a = in_.bench["accuracy"];
      TableBlock t;
      t.caption = tr("Accuracy against the float64 reference (" + str(&a, "shape") +
                         "): max |error| / max |reference| of each output.",
                     "相对 float64 参考实现的精度（" + str(&a, "shape") +
                         "）：各输出的 max |误差| / max |参考值|。");
      t.header = {"impl", "out", "lse", "dq", "dk", "dv"};
      if (a.contains("impls")) {
        for (const auto& [impl, e] : a["impls"].items()) {
          std::vector<std::string> line = {impl};
          for (const char* k : {"out", "lse", "dq", "dk", "dv"}) {
            line.push_back(e.contains(k)
                               ? fmt_num(to_number(e[k].value("relative_error", json())), "{:.2e}")
                               : "—");
          }
          t.rows.push_back(std::move(line));
        }
      }
      s.blocks.push_back(std::move(t));
    }
  }

  void data_files() {
    Section& s = section("data", tr("Data files", "数据文件"));
    s.blocks.push_back(Paragraph{
        tr("Everything drawn above, as files beside this page: data/<experiment>.json is the lab's "
           "raw output (sdpa lab <experiment> --json), data/<experiment>-<table>.csv each of its "
           "tables, data/fig-<figure>.csv the points of each figure, figures/*.svg the figures.",
           "上面画出的一切都以文件形式放在本页旁边：data/<实验>.json 是实验的原始输出（sdpa lab "
           "<实验> "
           "--json），data/<实验>-<表>.csv 是各表，data/fig-<图>.csv 是各图的数据点，figures/*.svg "
           "是各图。")});
    TableBlock t;
    t.header = {tr("experiment", "实验"), tr("table", "表"), tr("rows", "行数"),
                tr("file", "文件")};
    for (const auto& name : in_.experiment_order) {
      const json* e = experiment(name);
      if (!e || !e->contains("tables")) continue;
      for (const auto& [tname, rows] : (*e)["tables"].items()) {
        t.rows.push_back(
            {name, tname, std::to_string(rows.size()), "data/" + csv_name(name, tname)});
      }
    }
    s.blocks.push_back(std::move(t));
  }

  const Inputs& in_;
  const ReportOptions& o_;
  bool zh_;
  fs::path work_;
  Built out_;
};

}  // namespace

Built build_document(const Inputs& inputs, const ReportOptions& options, const fs::path& work_dir) {
  return Builder(inputs, options, work_dir).build();
}

std::vector<std::pair<std::string, std::string>> header_meta(const Inputs& inputs,
                                                             const ReportOptions& options,
                                                             double seconds) {
  const bool zh = options.lang == Lang::zh;
  std::string target;
  if (inputs.bench.is_object() && inputs.bench.contains("rows") && !inputs.bench["rows"].empty()) {
    target = str(&inputs.bench["rows"][0], "target");
  }
  std::string mode = options.mode == Mode::quick ? "quick" : "full";
  if (options.from)
    mode += zh ? "（从 " + options.from->string() + " 重新绘制）"
               : " (re-rendered from " + options.from->string() + ")";
  std::vector<std::pair<std::string, std::string>> m = {
      {zh ? "版本" : "version", std::string("sdpa ") + version()},
      {zh ? "种子" : "seed", std::to_string(options.seed)},
      {zh ? "模式" : "mode", mode},
      {zh ? "机器" : "machine", cpu_model() + (target.empty() ? "" : ", SIMD " + target)},
      {zh ? "线程" : "threads", std::to_string(resolve_threads(options.threads))},
      {zh ? "日期" : "date", utc_now()},
      {zh ? "耗时" : "time taken", fmt::format("{:.1f} s", seconds)},
  };
  return m;
}

}  // namespace sdpa::report
