// Unit tests of the report's pieces: CSV, SVG clean-up, the gnuplot driver, the renderers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "report/document.h"
#include "report/plot.h"
#include "report/report.h"

namespace sdpa::report {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1);
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(field);
      field.clear();
    } else if (c == '\n') {
      rows.back().push_back(field);
      field.clear();
      rows.emplace_back();
    } else {
      field += c;
    }
  }
  rows.pop_back();  // after the final newline
  return rows;
}

TEST(Csv, RoundTripsEveryNumberAndQuotesStrings) {
  const json rows = json::parse(R"([
    {"name": "a,b", "x": 0.1, "n": 3, "s": "say \"hi\"", "z": null, "f": true},
    {"name": "plain", "x": 1e-300, "n": -7, "s": "inf", "z": 2.5, "f": false}])");
  const std::string csv = table_to_csv(rows, {"name", "x"});
  const auto parsed = parse_csv(csv);
  ASSERT_EQ(parsed.size(), 3u) << csv;
  // preferred columns first, then the others in order of appearance (nlohmann sorts keys)
  EXPECT_EQ(parsed[0], (std::vector<std::string>{"name", "x", "f", "n", "s", "z"}));
  EXPECT_EQ(parsed[1][0], "a,b");
  EXPECT_EQ(parsed[1][4], "say \"hi\"");
  EXPECT_EQ(parsed[1][5], "");  // null is empty
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(std::stod(parsed[r + 1][1]), rows[r]["x"].get<double>()) << "row " << r;
    EXPECT_EQ(std::stoll(parsed[r + 1][3]), rows[r]["n"].get<long long>()) << "row " << r;
  }
}

TEST(Csv, RejectsANonArray) { EXPECT_THROW(table_to_csv(json::object()), std::runtime_error); }

TEST(ToNumber, ReadsTheLabsSpellingsOfNonFiniteValues) {
  EXPECT_EQ(to_number(json(2.5)), 2.5);
  EXPECT_EQ(to_number(json("inf")), INFINITY);
  EXPECT_EQ(to_number(json("-inf")), -INFINITY);
  EXPECT_TRUE(std::isnan(to_number(json("nan"))));
  EXPECT_TRUE(std::isnan(to_number(json("normal"))));
  EXPECT_TRUE(std::isnan(to_number(json(nullptr))));
}

TEST(HtmlEscape, EscapesMarkup) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}

const char* kGnuplotLikeSvg = R"(<?xml version="1.0" encoding="utf-8"  standalone="no"?>
<svg
 width="600" height="400"
 viewBox="0 0 600 400"
 xmlns="http://www.w3.org/2000/svg"
 xmlns:xlink="http://www.w3.org/1999/xlink"
>
<title>Gnuplot</title>
<g id="gnuplot_canvas">
<defs>
	<path id='gpPt1' d='M-1,-1 L1,1'/>
	<use xlink:href='#gpPt1' id='gpPt10' fill='currentColor'/>
	<filter id='textbox'><feFlood/></filter>
</defs>
<use xlink:href='#gpPt10' x='3' y='4'/>
<g filter='url(#textbox)'><text>x</text></g>
</g>
</svg>
)";

TEST(EmbeddableSvg, PrefixesEveryIdAndEveryReference) {
  const std::string out = embeddable_svg(kGnuplotLikeSvg, "f-one", "Title <1>");
  EXPECT_EQ(out.find("<?xml"), std::string::npos);
  EXPECT_EQ(out.rfind("<svg", 0), 0u);
  // every id is prefixed, and every local reference resolves to an id of this figure
  std::set<std::string> ids;
  const std::regex id_re(R"re(\bid=['"]([^'"]+)['"])re");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), id_re); it != std::sregex_iterator();
       ++it) {
    ids.insert((*it)[1].str());
    EXPECT_EQ((*it)[1].str().rfind("f-one-", 0), 0u) << (*it)[1].str();
  }
  EXPECT_EQ(ids.size(), 4u);
  const std::regex ref_re(R"re((?:href=['"]#|url\(#)([^'")]+))re");
  int refs = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), ref_re); it != std::sregex_iterator();
       ++it) {
    ++refs;
    EXPECT_TRUE(ids.count((*it)[1].str())) << "dangling reference " << (*it)[1].str();
  }
  EXPECT_EQ(refs, 3);
  EXPECT_NE(out.find("<title>Title &lt;1&gt;</title>"), std::string::npos);
  // the namespace names stay: they are names, not loads
  EXPECT_NE(out.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
}

TEST(EmbeddableSvg, RefusesExternalReferencesAndScripts) {
  std::string ext = kGnuplotLikeSvg;
  ext.replace(ext.find("#gpPt10"), 7, "http://example.com/a.svg#p");
  EXPECT_THROW(embeddable_svg(ext, "f", "t"), std::runtime_error);
  std::string script = kGnuplotLikeSvg;
  script.replace(script.find("</svg>"), 6, "<script href='#x'></script></svg>");
  EXPECT_THROW(embeddable_svg(script, "f", "t"), std::runtime_error);
  EXPECT_THROW(embeddable_svg("not svg", "f", "t"), std::runtime_error);
}

Figure two_series_figure() {
  Figure f;
  f.id = "unit";
  f.caption = "unit";
  Panel p{"panel", "x", "y", true, true, "", {}};
  p.series.push_back(
      Series{"line", {"x", "y"}, {{1, 1}, {10, 100}, {100, 1e4}}, "1:2", "linespoints"});
  p.series.push_back(Series{"bars",
                            {"x", "y", "lo", "hi"},
                            {{2, 4, 3, 5}, {20, 400, 300, 500}},
                            "1:2:3:4",
                            "yerrorbars"});
  // A series with no finite point is left out (gnuplot would stop on it).
  p.series.push_back(Series{"empty", {"x", "y"}, {{NAN, 1}}, "1:2", "lines"});
  f.panels = {p, p};
  f.columns = 2;
  return f;
}

TEST(Gnuplot, DrawsAStaticSvgWithOneGroupPerSeries) {
  if (find_gnuplot().empty()) GTEST_FAIL() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const fs::path work =
      fs::temp_directory_path() / ("sdpa-report-unit-" + std::to_string(getpid()));
  const Figure f = two_series_figure();
  ASSERT_TRUE(has_data(f));
  const std::string svg = render_svg(f, work);
  fs::remove_all(work);
  EXPECT_NE(svg.find("width=\"760\""), std::string::npos);
  EXPECT_NE(svg.find("viewBox=\"0 0 760 440\""), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  // two panels x two drawn series: four plot groups (gnuplot names them 1a 2a 1b 2b)
  const std::regex plot_re("id=\"(gnuplot_plot_[0-9]+[a-z]?)\"");
  std::set<std::string> groups;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), plot_re);
       it != std::sregex_iterator(); ++it) {
    groups.insert((*it)[1].str());
  }
  EXPECT_EQ(groups.size(), 4u) << svg.substr(0, 2000);
  // once embedded, no id repeats (gnuplot writes each plot group's id twice)
  const std::string embedded = embeddable_svg(svg, "f-unit", "unit");
  const std::regex id_re(R"re(\bid=['"]([^'"]+)['"])re");
  std::set<std::string> ids;
  for (auto it = std::sregex_iterator(embedded.begin(), embedded.end(), id_re);
       it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(ids.insert((*it)[1].str()).second) << "repeated id " << (*it)[1].str();
  }
}

TEST(Gnuplot, ScriptCarriesEveryNumberExactly) {
  const Figure f = two_series_figure();
  const std::string script = gnuplot_script(f, "out.svg");
  EXPECT_NE(script.find("set logscale x"), std::string::npos);
  EXPECT_EQ(script.find("mouse"), std::string::npos);
  EXPECT_NE(script.find("\n20 400 300 500\n"), std::string::npos) << script;
  const auto csv = parse_csv(figure_csv(f));
  // header + 2 panels x (3 + 2 + 1) points
  ASSERT_EQ(csv.size(), 1u + 2 * 6) << figure_csv(f);
  EXPECT_EQ(csv[1][1], "line");
  EXPECT_EQ(std::stod(csv[3][3]), 1e4);
  EXPECT_EQ(csv.back()[2], "");  // the NaN is an empty field
}

TEST(Gnuplot, HasDataNeedsAFinitePointInEveryPanel) {
  Figure f = two_series_figure();
  f.panels[1].series = {Series{"empty", {"x", "y"}, {{NAN, 1}}, "1:2", "lines"}};
  EXPECT_FALSE(has_data(f));
  f.panels.clear();
  EXPECT_FALSE(has_data(f));
}

TEST(Render, HtmlAndMarkdownCarryTheSameBlocks) {
  Document d;
  d.lang = "en";
  d.title = "T & T";
  d.meta = {{"seed", "1"}};
  d.contents_label = "Contents";
  Section s{"C1", "C1 · heading", {}};
  s.blocks.push_back(Quote{"中文原句", "English sentence"});
  s.blocks.push_back(TableBlock{"cap", {"a", "b|c"}, {{"1", "2"}}, "x-y.csv"});
  s.blocks.push_back(VerdictBlock{"C1", "holds-if", "Holds only if", "d < 64", {{"Theory:", "t"}}});
  s.blocks.push_back(Note{"missing <x>"});
  d.sections.push_back(s);
  const std::string html = render_html(d);
  const std::string md = render_markdown(d);
  EXPECT_NE(html.find("<section id=\"C1\">"), std::string::npos);
  EXPECT_NE(html.find("中文原句"), std::string::npos);
  EXPECT_NE(html.find("class=\"verdict holds-if\""), std::string::npos);
  EXPECT_NE(html.find("T &amp; T"), std::string::npos);
  EXPECT_NE(html.find("missing &lt;x&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(md.find("## C1 · heading"), std::string::npos);
  EXPECT_NE(md.find("中文原句"), std::string::npos);
  EXPECT_NE(md.find("b\\|c"), std::string::npos);
  EXPECT_NE(md.find("**Holds only if** — d < 64"), std::string::npos);
}

}  // namespace
}  // namespace sdpa::report
