// What the report's sections share: the Page they are written into (the inputs, the page's
// language, the document being built, the figures drawn on the way), a view of the lab's tables
// (rows as pointers, filtered by predicates), the chart helpers, and one function per section,
// defined in the file of its experiment (section_<experiment>.cpp).
//
// Each claim section follows one pattern: the article's sentence (Chinese original beside the
// English), the figure(s), the key rows of the lab's tables, and the lab's verdicts on that
// claim in plain words. Every number drawn comes from a lab table (declared in src/lab, listed
// in docs/lab.md); the plotted points are also written to data/fig-<id>.csv so that a test (and
// a reader) can check them against the table's CSV.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "lab/scales.h"
#include "report/build.h"

namespace sdpa::report {

// ---- a view of the lab's tables ------------------------------------------------------------

using Row = const json*;
using Rows = std::vector<Row>;

/// The cell as a number (NaN when absent or not a number), as text ("" when absent).
double num(Row row, const std::string& column);
std::string str(Row row, const std::string& column);

/// A cell for a key-rows table: 4 significant digits, integers as integers, "—" for null.
std::string cell(const json& v);
/// `v` formatted with `spec`, "—" for NaN.
std::string fmt_num(double v, const char* spec = "{:.3g}");

/// The rows of `t` that `keep` accepts (none when `t` is null).
Rows where(const json* t, const std::function<bool(Row)>& keep);
/// Every row of `t`.
Rows all_rows(const json* t);
/// The rows of `t` whose `column` reads `value`, as a table.
json where_table(const json* t, const std::string& column, const std::string& value);
/// The distinct values of `column`, in order of first appearance (text), or sorted (numbers).
std::vector<std::string> distinct(const json* t, const std::string& column);
std::vector<std::string> distinct(const json& t, const std::string& column);
std::vector<double> distinct_numbers(const json* t, const std::string& column);

/// data/<experiment>-<table>.csv
std::string csv_name(const std::string& exp, const std::string& name);

// ---- chart helpers -------------------------------------------------------------------------

/// A series of `columns` of `rows` drawn with gnuplot's `using_spec` and `style`.
Series series(const std::string& title, const Rows& rows, const std::vector<std::string>& columns,
              const std::string& using_spec, const std::string& style);

/// Point types that stay distinguishable in print.
int point_type(std::size_t i);

/// The legend title of an attention scale of the lab ("1" -> "scale 1", "1/sqrt(d)" -> "1/√d").
using lab::scale_title;

/// A grouped bar chart: one category per x position (labelled `labels`), one bar per group
/// beside it (the first group left of the tick, the second right). Each group's rows are
/// (category index, value, extra columns...), written to the figure's CSV under `columns`.
struct BarGroup {
  std::string title;
  std::vector<std::vector<double>> rows;
};
Panel grouped_bars(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                   const std::vector<std::string>& labels, const std::vector<std::string>& columns,
                   const std::vector<BarGroup>& groups, const std::string& setup);

/// "Holds", "成立", ... for a lab verdict string ("holds", "fails", "holds-if").
std::string verdict_word(const std::string& verdict, Lang lang);

// ---- the page --------------------------------------------------------------------------------

class Page {
 public:
  Page(const Inputs& inputs, const ReportOptions& options, std::filesystem::path work_dir);

  bool zh() const { return options_.lang == Lang::zh; }
  /// `en` or `zh`, in the page's language.
  std::string tr(const std::string& en, const std::string& zh) const;
  const Inputs& inputs() const { return inputs_; }
  const ReportOptions& options() const { return options_; }
  Built& built() { return out_; }

  /// The experiment's result, or null when absent.
  const json* experiment(const std::string& exp) const;
  /// The table's rows, or null when the experiment or the table is absent or empty.
  const json* table(const std::string& exp, const std::string& name) const;
  /// The table, or null after noting in `s` why it is missing: the "table, or a note when
  /// absent" opening of most sections.
  const json* table_or_note(Section& s, const std::string& exp, const std::string& name);
  /// Why a table is missing, in the page's language.
  std::string absent(const std::string& exp, const std::string& name) const;

  Section& section(const std::string& id, const std::string& heading);
  /// The section of claim `index` (0 for C1), headed with the article's sentence.
  Section& claim_section(int index);

  /// Something that could not be shown: in the section and in the summary's list.
  void note(Section& s, const std::string& text);
  /// Draws the figure (or notes why not) and appends it to the section.
  void figure(Section& s, const Figure& f);
  /// A few rows of a table, with the named columns (each must be declared by the lab).
  void key_rows(Section& s, const std::string& exp, const std::string& name, const Rows& rows,
                const std::vector<std::string>& columns, const std::string& caption);
  /// Every verdict of the lab on claim `id` (several experiments may test one claim).
  void verdicts(Section& s, const std::string& id);
  /// The verdicts of experiment `exp` on claims other than C1..C8.
  void other_verdicts(Section& s, const std::string& exp);
  VerdictBlock verdict_block(const std::string& exp, const json& claim) const;
  /// " [quick mode]" (the mode that produced experiment `exp`'s numbers), or "" when unknown:
  /// appended to the caption of every table and figure drawn from it.
  std::string mode_tag(const std::string& exp) const;

 private:
  const Inputs& inputs_;
  const ReportOptions& options_;
  std::filesystem::path work_;
  Built out_;
};

// ---- the sections, in the order of the page ------------------------------------------------

void section_c1(Page& page);            // section_softmax.cpp
void section_c2(Page& page);            // section_softmax.cpp
void section_c3(Page& page);            // section_variance.cpp
void section_c4(Page& page);            // section_variance.cpp
void section_c5(Page& page);            // section_variance.cpp
void section_c6(Page& page);            // section_variance.cpp
void section_c7(Page& page);            // section_saturation.cpp
void section_c8(Page& page);            // section_train.cpp
void section_non_ideal(Page& page);     // section_variance.cpp
void section_freezing(Page& page);      // section_saturation.cpp
void section_alternatives(Page& page);  // section_saturation.cpp
void section_temperature(Page& page);   // section_temperature.cpp
void section_precision(Page& page);     // section_precision.cpp
void section_training(Page& page);      // section_train.cpp
void section_kernel(Page& page);        // section_kernel.cpp

}  // namespace sdpa::report
