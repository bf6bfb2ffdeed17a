// HTML and Markdown from the document model. The HTML carries its CSS inline and the figures
// as inline SVG: no <script>, <link>, <img>, web font or external URL, so it renders offline.
#include <fmt/format.h>

#include <cstdlib>

#include "report/document.h"
#include "report/report.h"

namespace sdpa::report {
namespace {

constexpr const char* kCss = R"css(
:root { --ink: #1d2330; --muted: #5b6475; --line: #d9dee7; --bg: #ffffff; --soft: #f5f7fa;
        --holds: #1b7f3b; --fails: #b3261e; --cond: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 16px/1.55 system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK SC",
             "PingFang SC", "Microsoft YaHei", sans-serif; }
main { max-width: 1000px; margin: 0 auto; padding: 24px 20px 60px; }
header.top { border-bottom: 2px solid var(--ink); margin-bottom: 18px; }
h1 { font-size: 1.9em; margin: 0.2em 0; }
h2 { font-size: 1.45em; margin: 2.2em 0 0.6em; padding-top: 0.4em; border-top: 1px solid var(--line); }
.subtitle { color: var(--muted); margin-top: 0; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; font-size: 0.92em; }
dl.meta dt { color: var(--muted); } dl.meta dd { margin: 0; font-family: ui-monospace, monospace; }
nav.toc ol { columns: 2; font-size: 0.95em; }
nav.toc a, a { color: #1f5fbf; }
.quote { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; background: var(--soft);
         border-left: 4px solid #8c96a8; padding: 10px 14px; margin: 12px 0; }
.quote p { margin: 0; } .quote .zh { font-size: 1.02em; } .quote .en { color: #333c4d; font-style: italic; }
.quote .tag { display: block; font-size: 0.75em; color: var(--muted); font-style: normal;
              text-transform: uppercase; letter-spacing: 0.05em; }
figure { margin: 16px 0; } figure svg.figure { width: 100%; height: auto; display: block;
         border: 1px solid var(--line); background: #fff; }
figcaption { font-size: 0.9em; color: var(--muted); margin-top: 4px; }
table { border-collapse: collapse; font-size: 0.86em; margin: 10px 0; width: 100%; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
th { background: var(--soft); }
.table-wrap { overflow-x: auto; } .caption { font-size: 0.9em; color: var(--muted); }
.verdict { border: 1px solid var(--line); border-left: 6px solid var(--muted); padding: 8px 14px;
           margin: 12px 0; background: #fff; }
.verdict.holds { border-left-color: var(--holds); } .verdict.fails { border-left-color: var(--fails); }
.verdict.holds-if { border-left-color: var(--cond); }
.verdict .label { font-weight: 700; } .verdict.holds .label { color: var(--holds); }
.verdict.fails .label { color: var(--fails); } .verdict.holds-if .label { color: var(--cond); }
.verdict p { margin: 4px 0; } .verdict .k { color: var(--muted); }
.note { background: #fff8e1; border: 1px solid #f0d890; padding: 8px 12px; margin: 12px 0; }
footer { margin-top: 40px; color: var(--muted); font-size: 0.85em; }
@media (max-width: 700px) { .quote { grid-template-columns: 1fr; } nav.toc ol { columns: 1; } }
)css";

std::string verdict_class(const std::string& verdict) {
  if (verdict == "holds" || verdict == "fails" || verdict == "holds-if") return verdict;
  return "other";
}

// Numbers align right in tables; everything else reads left to right.
bool looks_numeric(const std::string& text) {
  if (text.empty()) return false;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return end && *end == '\0';
}

struct HtmlBlock {
  std::string& out;
  void operator()(const Paragraph& p) const { out += "<p>" + html_escape(p.text) + "</p>\n"; }
  void operator()(const Quote& q) const {
    out +=
        "<blockquote class=\"quote\"><p class=\"zh\" lang=\"zh-CN\"><span "
        "class=\"tag\">原文</span>" +
        html_escape(q.zh) + "</p><p class=\"en\" lang=\"en\"><span class=\"tag\">English</span>" +
        html_escape(q.en) + "</p></blockquote>\n";
  }
  void operator()(const FigureBlock& f) const {
    out += "<figure id=\"fig-" + f.id + "\">\n" + f.svg + "\n<figcaption>" + html_escape(f.caption);
    out += " <a href=\"data/" + html_escape(f.csv) + "\">" + html_escape(f.csv) + "</a>";
    for (const auto& s : f.sources) {
      out += " · <a href=\"data/" + html_escape(s) + "\">" + html_escape(s) + "</a>";
    }
    out += "</figcaption></figure>\n";
  }
  void operator()(const TableBlock& t) const {
    out += "<div class=\"table-wrap\">";
    if (!t.caption.empty() || !t.csv.empty()) {
      out += "<p class=\"caption\">" + html_escape(t.caption);
      if (!t.csv.empty()) {
        out += " <a href=\"data/" + html_escape(t.csv) + "\">" + html_escape(t.csv) + "</a>";
      }
      out += "</p>";
    }
    out += "<table><thead><tr>";
    for (const auto& h : t.header) out += "<th>" + html_escape(h) + "</th>";
    out += "</tr></thead><tbody>\n";
    for (const auto& row : t.rows) {
      out += "<tr>";
      for (const auto& c : row) {
        out += (looks_numeric(c) ? "<td class=\"num\">" : "<td>") + html_escape(c) + "</td>";
      }
      out += "</tr>\n";
    }
    out += "</tbody></table></div>\n";
  }
  void operator()(const VerdictBlock& v) const {
    out += "<div class=\"verdict " + verdict_class(v.verdict) + "\">";
    out += "<p><span class=\"label\">" + html_escape(v.label) + "</span>";
    if (!v.condition.empty()) out += " — " + html_escape(v.condition);
    out += "</p>";
    for (const auto& [k, text] : v.lines) {
      if (text.empty()) continue;
      out += "<p><span class=\"k\">" + html_escape(k) + "</span> " + html_escape(text) + "</p>";
    }
    out += "</div>\n";
  }
  void operator()(const Note& n) const {
    out += "<p class=\"note\">" + html_escape(n.text) + "</p>\n";
  }
};

std::string md_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

struct MdBlock {
  std::string& out;
  void operator()(const Paragraph& p) const { out += p.text + "\n\n"; }
  void operator()(const Quote& q) const {
    out += "> **原文**：" + q.zh + "\n>\n> *English*: " + q.en + "\n\n";
  }
  void operator()(const FigureBlock& f) const {
    out += "![" + md_escape(f.caption) + "](figures/" + f.id + ".svg)\n\n*" + f.caption + "* ([" +
           f.csv + "](data/" + f.csv + ")";
    for (const auto& s : f.sources) out += ", [" + s + "](data/" + s + ")";
    out += ")\n\n";
  }
  void operator()(const TableBlock& t) const {
    if (!t.caption.empty() || !t.csv.empty()) {
      out += t.caption;
      if (!t.csv.empty()) out += " ([" + t.csv + "](data/" + t.csv + "))";
      out += "\n\n";
    }
    out += "|";
    // Appended piece by piece: `" " + md_escape(h)` trips GCC 12's false -Wrestrict (PR 105651).
    for (const auto& h : t.header) out.append(" ").append(md_escape(h)).append(" |");
    out += "\n|";
    for (std::size_t i = 0; i < t.header.size(); ++i) out += i == 0 ? "---|" : "---:|";
    out += "\n";
    for (const auto& row : t.rows) {
      out += "|";
      for (const auto& c : row) out.append(" ").append(md_escape(c)).append(" |");
      out += "\n";
    }
    out += "\n";
  }
  void operator()(const VerdictBlock& v) const {
    out += "**" + v.label + "**";
    if (!v.condition.empty()) out += " — " + v.condition;
    out += "\n\n";
    for (const auto& [k, text] : v.lines) {
      if (!text.empty()) out += "- " + k + " " + text + "\n";
    }
    out += "\n";
  }
  void operator()(const Note& n) const { out += "> ⚠ " + n.text + "\n\n"; }
};

}  // namespace

std::string render_html(const Document& d) {
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"" + d.lang + "\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>" + html_escape(d.title) + "</title>\n<style>" + kCss + "</style>\n</head>\n";
  out += "<body>\n<main>\n<header class=\"top\">\n<h1>" + html_escape(d.title) + "</h1>\n";
  out += "<p class=\"subtitle\">" + html_escape(d.subtitle) + "</p>\n<dl class=\"meta\">\n";
  for (const auto& [k, v] : d.meta) {
    out += "<dt>" + html_escape(k) + "</dt><dd>" + html_escape(v) + "</dd>\n";
  }
  out += "</dl>\n</header>\n";
  for (const auto& b : d.summary) std::visit(HtmlBlock{out}, b);
  out += "<nav class=\"toc\"><h2>" + html_escape(d.contents_label) + "</h2><ol>\n";
  for (const auto& s : d.sections) {
    out += "<li><a href=\"#" + s.id + "\">" + html_escape(s.heading) + "</a></li>\n";
  }
  out += "</ol></nav>\n";
  for (const auto& s : d.sections) {
    out += "<section id=\"" + s.id + "\">\n<h2>" + html_escape(s.heading) + "</h2>\n";
    for (const auto& b : s.blocks) std::visit(HtmlBlock{out}, b);
    out += "</section>\n";
  }
  out += "<footer>" + html_escape(d.footer) + "</footer>\n</main>\n</body>\n</html>\n";
  return out;
}

std::string render_markdown(const Document& d) {
  std::string out = "# " + d.title + "\n\n" + d.subtitle + "\n\n";
  for (const auto& [k, v] : d.meta) out += "- **" + k + "**: " + v + "\n";
  out += "\n";
  for (const auto& b : d.summary) std::visit(MdBlock{out}, b);
  out += "## " + d.contents_label + "\n\n";
  for (const auto& s : d.sections) out += "1. [" + s.heading + "](#" + s.id + ")\n";
  out += "\n";
  for (const auto& s : d.sections) {
    out += "<a id=\"" + s.id + "\"></a>\n\n## " + s.heading + "\n\n";
    for (const auto& b : s.blocks) std::visit(MdBlock{out}, b);
  }
  out += "---\n\n" + d.footer + "\n";
  return out;
}

}  // namespace sdpa::report
