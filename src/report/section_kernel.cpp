// The report's sections for the benchmark: speed and accuracy of the kernel.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/sections.h"

namespace sdpa::report {

void section_kernel(Page& page) {
  Section& s =
      page.section("kernel", page.tr("The kernel: speed and accuracy", "计算核：速度与精度"));
  s.blocks.push_back(Paragraph{page.tr(
      "The fused kernel (--impl fast, FlashAttention-2 style, never materialising L × S) beside "
      "the naive three-pass float32 baseline (--impl naive), as `sdpa bench` measures them on "
      "this machine: median of the repeats, GFLOP/s with forward 4·B·H·L·S·E (halved when "
      "causal, backward 2.5×), and the percentage of the machine's measured FP32 FMA peak.",
      "融合计算核（--impl fast，FlashAttention-2 式，从不生成 L × S 矩阵）与朴素的三遍 float32 "
      "基线"
      "（--impl naive）并列，数据来自本机上的 `sdpa bench`：重复测量的中位数；GFLOP/s 按前向 "
      "4·B·H·L·S·E 计（因果减半，反向 2.5 倍），以及占本机实测 FP32 FMA 峰值的百分比。")});
  const json rows = page.inputs().bench.is_object() && page.inputs().bench.contains("rows")
                        ? page.inputs().bench["rows"]
                        : json();
  if (!rows.is_array() || rows.empty()) {
    page.note(s, page.tr("Not shown: no benchmark rows (", "未显示：没有基准测试数据（") +
                     (page.inputs().bench_missing.empty() ? std::string("—")
                                                          : page.inputs().bench_missing) +
                     ")");
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
    f.caption = page.tr(
        "GFLOP/s of the fused kernel and the naive baseline per shape (B = 1, "
        "H = 8), median of the repeats; dashed: the measured FP32 peak.",
        "各形状下融合计算核与朴素基线的 GFLOP/s（B = 1，H = 8），重复测量的中位数；虚线：实测 "
        "FP32 峰值。");
    f.sources = {"bench.csv"};
    f.height = 420;
    std::vector<std::string> ticks;
    for (const auto& label : labels) {
      // The shape goes in the tick label: "fwd E=64\nL=S=1024".
      Row r = nullptr;
      for (const auto& row : rows) {
        if (str(&row, "label") == label) r = &row;
      }
      const double seq = num(r, "seq");
      // double quotes: gnuplot turns \n into a line break only there
      ticks.push_back(
          fmt::format("\"{}{}\"", label, std::isnan(seq) ? "" : fmt::format("\\nL=S={}", seq)));
    }
    std::vector<BarGroup> groups;
    for (const std::string impl : {"fast", "naive"}) {
      BarGroup g{impl == "fast" ? page.tr("fused (fast)", "融合（fast）")
                                : page.tr("naive three-pass", "朴素三遍（naive）"),
                 {}};
      for (std::size_t k = 0; k < labels.size(); ++k) {
        for (const auto& r : rows) {
          if (str(&r, "label") == labels[k] && str(&r, "impl") == impl) {
            g.rows.push_back({double(k), num(&r, "gflops_median"), num(&r, "percent_of_peak")});
          }
        }
      }
      groups.push_back(std::move(g));
    }
    Panel p =
        grouped_bars("", page.tr("shape", "形状"), "GFLOP/s", ticks,
                     {"shape_index", "gflops_median", "percent_of_peak"}, groups,
                     "set style fill solid 0.85 border -1\nset boxwidth 0.35\nset key top right");
    p.setup += fmt::format("\nset yrange [0:{}]", peak > 0 ? 1.12 * peak : 0.0) +
               (peak > 0 ? "" : "\nset yrange [0:*]");
    if (peak > 0) {
      Series pk{page.tr(fmt::format("measured peak {:.0f} GFLOP/s", peak),
                        fmt::format("实测峰值 {:.0f} GFLOP/s", peak)),
                {"x", "peak_gflops"},
                {{-0.6, peak}, {labels.size() - 0.4, peak}},
                "1:2",
                "lines dt 2 lw 2 lc rgb 'black'"};
      p.series.push_back(pk);
    }
    f.panels = {p};
    page.figure(s, f);
    TableBlock t;
    t.caption = page.tr("Benchmark rows:", "基准测试数据：");
    t.csv = "bench.csv";
    t.header = {"shape",   "impl",      "B,H,L,S,E", "seconds (median)",
                "GFLOP/s", "% of peak", "threads",   "target"};
    for (const auto& r : rows) {
      t.rows.push_back({str(&r, "label"), str(&r, "impl"),
                        fmt::format("{},{},{},{},{}", cell(r.value("batch", json())),
                                    cell(r.value("heads", json())), cell(r.value("seq", json())),
                                    cell(r.value("kv_seq", json())), cell(r.value("dim", json()))),
                        fmt_num(num(&r, "seconds_median"), "{:.4g}"),
                        fmt_num(num(&r, "gflops_median"), "{:.1f}"),
                        fmt_num(num(&r, "percent_of_peak"), "{:.1f}"), str(&r, "threads"),
                        str(&r, "target")});
    }
    s.blocks.push_back(std::move(t));
  }
  if (page.inputs().bench.is_object() && page.inputs().bench.contains("accuracy")) {
    const json& a = page.inputs().bench["accuracy"];
    TableBlock t;
    t.caption = page.tr("Accuracy against the float64 reference (" + str(&a, "shape") +
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

}  // namespace sdpa::report
