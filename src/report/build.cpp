// The document: its header and summary, the sections in the order of the page (each defined in
// the file of its experiment, report/sections.h), the list of data files; every lab table as
// CSV with its columns in the order the lab declares them.
#include "report/build.h"

#include <fmt/format.h>

#include <cstdint>
#include <ctime>
#include <set>
#include <string>

#include "bench/bench.h"
#include "lab/claims.h"
#include "lab/common.h"
#include "lab/schema.h"
#include "report/sections.h"
#include "sdpa/sdpa.h"

namespace sdpa::report {
namespace fs = std::filesystem;
namespace {

// The benchmark's columns first, in this order; the others after them.
const std::vector<std::string> kBenchColumns = {
    "label",           "impl",        "seconds_median", "gflops_median",
    "percent_of_peak", "peak_gflops", "threads",        "target"};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

void write_table_csvs(const Inputs& in, Built& out) {
  for (const auto& [exp, result] : in.lab) {
    if (!result.contains("tables") || !result["tables"].is_object()) continue;
    for (const auto& [name, rows] : result["tables"].items()) {
      if (!rows.is_array()) continue;
      const lab::Table* declared = lab::find_table(exp, name);
      out.data_files[csv_name(exp, name)] =
          table_to_csv(rows, declared ? declared->column_names() : std::vector<std::string>{});
    }
  }
  if (in.bench.is_object() && in.bench.contains("rows")) {
    out.data_files["bench.csv"] = table_to_csv(in.bench["rows"], kBenchColumns);
  }
}

// The header summary: how to read the page, every claim with the lab's verdicts, what is absent.
void summary(Page& page) {
  auto& sum = page.built().document.summary;
  sum.push_back(Paragraph{page.tr(
      "How to read this page: each claim has a section with the article's sentence, a figure, "
      "the key rows of the measurement and the verdict. “Holds” means the measurement agrees "
      "with the claim within its 95% confidence interval; “holds only if” names the condition; "
      "“does not hold” says what was seen instead. Every figure's numbers are in data/ as CSV.",
      "阅读方法：每条论断一节，依次给出原文、图、测量的关键行和结论。“成立”表示测量在 95% "
      "置信区间内与论断一致；“有条件成立”给出条件；“不成立”说明实际看到了什么。每张图的数据都以 "
      "CSV "
      "形式保存在 data/ 中。")});
  TableBlock t;
  t.header = {page.tr("claim", "论断"), page.tr("the article says", "原文"),
              page.tr("verdicts of the lab", "实验结论")};
  for (int i = 0; i < lab::kClaims; ++i) {
    const lab::ClaimText& c = lab::claim_texts()[i];
    std::string verdict_list;
    for (const auto& name : page.inputs().experiment_order) {
      const json* e = page.experiment(name);
      if (!e || !e->contains("claims")) continue;
      for (const auto& cl : (*e)["claims"]) {
        if (str(&cl, "id") != c.id) continue;
        if (!verdict_list.empty()) verdict_list += clause_separator(page.options().lang);
        // The experiment, the mode that produced its numbers, the verdict, its condition, and
        // the first sentence of the measurement: what the verdict rests on (seeds, cells,
        // optimizers), so that no verdict appears without its qualifiers.
        verdict_list += fmt::format("{} [{}]: {}", name, str(e, "mode"),
                                    verdict_word(str(&cl, "verdict"), page.options().lang));
        const std::string cond = str(&cl, "condition");
        if (!cond.empty()) verdict_list += page.zh() ? "（" + cond + "）" : " (" + cond + ")";
        std::string first = str(&cl, "measurement");
        if (const auto dot = first.find(". "); dot != std::string::npos) first.resize(dot);
        if (const auto dot = first.find("。"); dot != std::string::npos) first.resize(dot);
        if (!first.empty() && first.back() == '.') first.pop_back();  // "; " or the cell's end
        // (not again when the condition already carries it)
        if (!first.empty() && cond.find(first) == std::string::npos) verdict_list += " — " + first;
      }
    }
    if (verdict_list.empty()) verdict_list = page.tr("not measured in this run", "本次未测量");
    t.rows.push_back({c.id, page.zh() ? c.heading_zh : c.heading_en, verdict_list});
  }
  sum.push_back(std::move(t));
  std::vector<std::string> absent_parts;
  for (const auto& [name, why] : page.inputs().missing) absent_parts.push_back(name + ": " + why);
  if (!page.inputs().bench_missing.empty())
    absent_parts.push_back("bench: " + page.inputs().bench_missing);
  for (const auto& a : absent_parts) {
    sum.push_back(Note{page.tr("Missing from this run — ", "本次缺失——") + a});
    page.built().missing.push_back(a);
  }
}

void data_files(Page& page) {
  Section& s = page.section("data", page.tr("Data files", "数据文件"));
  s.blocks.push_back(Paragraph{page.tr(
      "Everything drawn above, as files beside this page: data/<experiment>.json is the lab's "
      "raw output (sdpa lab <experiment> --json), data/<experiment>-<table>.csv each of its "
      "tables, data/fig-<figure>.csv the points of each figure, figures/*.svg the figures.",
      "上面画出的一切都以文件形式放在本页旁边：data/<实验>.json 是实验的原始输出（sdpa lab "
      "<实验> "
      "--json），data/<实验>-<表>.csv 是各表，data/fig-<图>.csv 是各图的数据点，figures/*.svg "
      "是各图。")});
  TableBlock t;
  t.header = {page.tr("experiment", "实验"), page.tr("table", "表"), page.tr("rows", "行数"),
              page.tr("file", "文件")};
  for (const auto& name : page.inputs().experiment_order) {
    const json* e = page.experiment(name);
    if (!e || !e->contains("tables")) continue;
    for (const auto& [tname, rows] : (*e)["tables"].items()) {
      t.rows.push_back({name, tname, std::to_string(rows.size()), "data/" + csv_name(name, tname)});
    }
  }
  s.blocks.push_back(std::move(t));
}

// The seed and mode the page's numbers came from: the options' for a run, the lab results'
// for --from (one value when every file agrees, else each value, "mixed"). `unique` is false
// when the files disagree or record none.
struct Provenance {
  std::string seed, mode;
  bool unique = true;
};

Provenance provenance(const Inputs& inputs, const ReportOptions& options) {
  if (!options.from) return {std::to_string(options.seed), lab::mode_name(options.mode), true};
  std::set<std::string> seeds, modes;
  for (const auto& [name, result] : inputs.lab) {
    if (!result.is_object()) continue;
    if (result.contains("seed") && result["seed"].is_number_unsigned()) {
      seeds.insert(std::to_string(result["seed"].get<std::uint64_t>()));
    }
    if (result.contains("mode") && result["mode"].is_string()) {
      modes.insert(result["mode"].get<std::string>());
    }
  }
  auto join = [](const std::set<std::string>& values) {
    if (values.empty()) return std::string("?");
    std::string text;
    for (const auto& v : values) text += (text.empty() ? "" : ", ") + v;
    return values.size() == 1 ? text : "mixed: " + text;
  };
  return {join(seeds), join(modes), seeds.size() == 1 && modes.size() == 1};
}

}  // namespace

Built build_document(const Inputs& inputs, const ReportOptions& options, const fs::path& work_dir) {
  Page page(inputs, options, work_dir);
  write_table_csvs(inputs, page.built());
  auto& d = page.built().document;
  const ReportOptions& o = options;
  d.lang = page.zh() ? "zh-CN" : "en";
  d.title = page.tr("Why attention divides by √d: the article's claims, measured",
                    "注意力为什么除以 √d：逐条测量原文的论断");
  d.subtitle = page.tr(
      "Every claim of the interview explainer “大模型面试必备13-Softmax 前为什么要除以根号 d？” "
      "turned into a measurement with its uncertainty and a verdict, by the sdpa lab; then "
      "where the article stops; then the attention kernel that ran it all.",
      "面试文章《大模型面试必备13-Softmax 前为什么要除以根号 d？》中的每一条论断，都由 sdpa "
      "实验室变成带不确定度的测量和结论；然后是原文没有讨论的部分；最后是运行这一切的注意力计算核"
      "。");
  d.contents_label = page.tr("Contents", "目录");
  summary(page);
  for (auto* section :
       {section_c1, section_c2, section_c3, section_c4, section_c5, section_c6, section_c7,
        section_c8, section_non_ideal, section_freezing, section_alternatives, section_temperature,
        section_precision, section_training, section_kernel}) {
    section(page);
  }
  data_files(page);
  // With --from the numbers are the files': their seed and mode, and a command that
  // regenerates them only when every file agrees on both.
  const Provenance pv = provenance(inputs, o);
  const std::string again =
      pv.unique ? fmt::format("sdpa report --{} --seed {}", pv.mode, pv.seed) : std::string();
  d.footer = page.tr(
      fmt::format("sdpa {} · seed {} · every figure drawn by gnuplot from the CSV beside it in "
                  "data/ · {}",
                  version(), pv.seed,
                  pv.unique ? "regenerate with: " + again
                            : "the data's files differ in seed or mode: regenerate each with "
                              "sdpa lab <experiment> --json"),
      fmt::format("sdpa {} · 种子 {} · 每张图都由 gnuplot 根据 data/ 中对应的 CSV 绘制 · {}",
                  version(), pv.seed,
                  pv.unique
                      ? "重新生成：" + again + " --lang zh"
                      : "数据文件的种子或模式不一致：请用 sdpa lab <实验> --json 分别重新生成"));
  return std::move(page.built());
}

std::vector<std::pair<std::string, std::string>> header_meta(const Inputs& inputs,
                                                             const ReportOptions& options,
                                                             double seconds) {
  const bool zh = options.lang == Lang::zh;
  std::string target;
  if (inputs.bench.is_object() && inputs.bench.contains("rows") && !inputs.bench["rows"].empty()) {
    target = str(&inputs.bench["rows"][0], "target");
  }
  const Provenance pv = provenance(inputs, options);
  std::string mode = pv.mode;
  if (options.from)
    mode += zh ? "（从 " + options.from->string() + " 重新绘制）"
               : " (re-rendered from " + options.from->string() + ")";
  std::vector<std::pair<std::string, std::string>> m = {
      {zh ? "版本" : "version", std::string("sdpa ") + version()},
      {zh ? "种子" : "seed", pv.seed},
      {zh ? "模式" : "mode", mode},
      {zh ? "机器" : "machine",
       bench::cpu_description() + (target.empty() ? "" : ", SIMD " + target)},
  };
  // The lab's numbers are the same for any thread count; the count is this run's, so a page
  // re-rendered from files does not state one.
  if (!options.from) {
    m.emplace_back(zh ? "线程" : "threads", std::to_string(resolve_threads(options.threads)));
  }
  m.emplace_back(zh ? "日期" : "date", utc_now());
  m.emplace_back(zh ? "耗时" : "time taken", fmt::format("{:.1f} s", seconds));
  return m;
}

}  // namespace sdpa::report
