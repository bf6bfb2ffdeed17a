#include "lab/schema.h"

#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "lab/lab.h"

namespace sdpa::lab {

const Column* Table::find(const std::string& column) const {
  for (const auto& c : columns) {
    if (c.name == column) return &c;
  }
  return nullptr;
}

std::vector<std::string> Table::column_names() const {
  std::vector<std::string> names;
  names.reserve(columns.size());
  for (const auto& c : columns) names.push_back(c.name);
  return names;
}

const Table* find_table(const std::string& experiment, const std::string& table) {
  for (const auto& e : experiments()) {
    if (e.name != experiment) continue;
    for (const auto& t : e.tables) {
      if (t.name == table) return &t;
    }
  }
  return nullptr;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::integer:
      return "integer";
    case Kind::number:
      return "number";
    case Kind::text:
      return "text";
    case Kind::boolean:
      return "boolean";
  }
  return "?";
}

namespace {

bool matches(const json& v, const Column& c) {
  if (v.is_null()) return c.nullable;
  switch (c.kind) {
    case Kind::integer:
      return v.is_number_integer() || v.is_number_unsigned();
    case Kind::number:
      return v.is_number() || (v.is_string() && (v == "inf" || v == "-inf" || v == "nan"));
    case Kind::text:
      return v.is_string();
    case Kind::boolean:
      return v.is_boolean();
  }
  return false;
}

}  // namespace

void check_tables(const std::string& experiment, const std::vector<Table>& tables,
                  const json& result) {
  if (!result.contains("tables")) return;
  for (const auto& [name, rows] : result["tables"].items()) {
    const Table* t = nullptr;
    for (const auto& candidate : tables) {
      if (candidate.name == name) t = &candidate;
    }
    if (!t)
      throw std::logic_error(fmt::format("lab {}: table '{}' is not declared", experiment, name));
    if (!rows.is_array()) {
      throw std::logic_error(fmt::format("lab {}: table '{}' is not an array", experiment, name));
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const json& row = rows[i];
      for (const auto& [key, value] : row.items()) {
        const Column* c = t->find(key);
        if (!c) {
          throw std::logic_error(fmt::format(
              "lab {}: table '{}' row {}: column '{}' is not declared", experiment, name, i, key));
        }
        if (!matches(value, *c)) {
          throw std::logic_error(fmt::format(
              "lab {}: table '{}' row {}: column '{}' is declared {}{}, got {}", experiment, name,
              i, key, kind_name(c->kind), c->nullable ? " or null" : "", value.dump()));
        }
      }
      for (const auto& c : t->columns) {
        if (!row.contains(c.name)) {
          throw std::logic_error(fmt::format("lab {}: table '{}' row {}: column '{}' is missing",
                                             experiment, name, i, c.name));
        }
      }
    }
  }
}

std::string schema_markdown() {
  std::string out;
  for (const auto& e : experiments()) {
    for (const auto& t : e.tables) {
      out += fmt::format("#### `{}` / `{}`: {}\n\n", e.name, t.name, t.rows);
      out += "| column | type | unit | meaning |\n|---|---|---|---|\n";
      for (const auto& c : t.columns) {
        out += fmt::format("| `{}` | {}{} | {} | {} |\n", c.name, kind_name(c.kind),
                           c.nullable ? " or null" : "", c.unit, c.meaning);
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace sdpa::lab
