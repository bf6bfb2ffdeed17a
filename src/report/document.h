// The report as a document model, rendered twice: to HTML (index.html, figures inline) and to
// Markdown (report.md, figures as files). Both renderings come from the same blocks, so the two
// files cannot drift apart.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace sdpa::report {

struct Paragraph {
  std::string text;
};
/// The article's sentence: the Chinese original beside the English.
struct Quote {
  std::string zh, en;
};
struct FigureBlock {
  std::string id;  // also the SVG file stem
  std::string caption;
  std::string svg;                   // embeddable SVG (ids prefixed)
  std::string csv;                   // data/fig-<id>.csv: the plotted numbers
  std::vector<std::string> sources;  // data/<table>.csv the numbers come from
};
struct TableBlock {
  std::string caption;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string csv;  // the full table, data/<...>.csv ("" when none)
};
/// One verdict of the lab on one claim.
struct VerdictBlock {
  std::string claim_id;  // C1 ... C8 or ""
  std::string verdict;   // holds | fails | holds-if | other text from the lab
  std::string label;     // the verdict in plain words, in the page's language
  std::string condition;
  std::vector<std::pair<std::string, std::string>> lines;  // (label, text): theory, measured, ...
};
/// Something that could not be shown, and why.
struct Note {
  std::string text;
};
using Block = std::variant<Paragraph, Quote, FigureBlock, TableBlock, VerdictBlock, Note>;

struct Section {
  std::string id;       // anchor, e.g. "C4"
  std::string heading;  // e.g. "C4 · Var(q·k) = d"
  std::vector<Block> blocks;
};

struct Document {
  std::string lang;  // "en" or "zh-CN"
  std::string title, subtitle;
  std::vector<std::pair<std::string, std::string>> meta;  // the header: what was run
  std::vector<Block> summary;                             // under the header
  std::string contents_label;
  std::vector<Section> sections;
  std::string footer;
};

std::string render_html(const Document& document);
std::string render_markdown(const Document& document);

}  // namespace sdpa::report
