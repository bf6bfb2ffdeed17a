// The result tables of the lab, declared once: every experiment lists its tables and, for each,
// the columns in their documented order with a type, a unit and a meaning. Everything else is
// generated from or checked against these declarations:
//
//   - run_experiment() checks every row it returns against them (check_tables): a row with an
//     undeclared column, a missing column or a value of another type is a bug in the lab;
//   - the CSV files of the report list the columns in the declared order;
//   - the text of `sdpa lab` prints the columns of each experiment's text view (View), which a
//     test checks are declared;
//   - the column tables of docs/lab.md are schema_markdown()'s output (a test compares them).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sdpa::lab {

using json = nlohmann::json;

/// The JSON type of a cell. `number` is a JSON number or one of the strings "inf", "-inf",
/// "nan" (lab/common.h's num()); `nullable` columns may also hold null ("does not apply").
enum class Kind { integer, number, text, boolean };

struct Column {
  std::string name;
  Kind kind;
  std::string unit;     // "" when dimensionless or not a quantity
  std::string meaning;  // one sentence, Markdown
  bool nullable = false;
};

struct Table {
  std::string name;
  std::string rows;  // what one row is, e.g. "one per (d, N, scale)"
  std::vector<Column> columns;

  const Column* find(const std::string& column) const;
  std::vector<std::string> column_names() const;
};

/// What `sdpa lab` prints of a table: these columns of the rows that `keep` accepts (null:
/// every row).
struct View {
  std::string table;
  std::vector<std::string> columns;
  std::function<bool(const json&)> keep;
};

/// The declared table `table` of experiment `experiment`, or nullptr.
const Table* find_table(const std::string& experiment, const std::string& table);

/// Throws std::logic_error naming the experiment, table, row and column when a table of
/// `result` is undeclared or a row does not match its declaration.
void check_tables(const std::string& experiment, const std::vector<Table>& tables,
                  const json& result);

/// docs/lab.md's column tables: for every experiment and every table, a Markdown heading and a
/// `| column | type | unit | meaning |` table.
std::string schema_markdown();

/// "integer", "number", "text", "boolean".
const char* kind_name(Kind kind);

}  // namespace sdpa::lab
