// Validators for the options several commands share, so that each option has one message:
// CLI11 runs them on the text before converting it (a seed of '-1' never wraps to 2^64 - 1).
#pragma once

#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <map>
#include <string>

#include "core/options.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {

/// --seed: a decimal integer in [0, 2^64 - 1].
inline CLI::Validator seed_validator() {
  return CLI::Validator([](std::string& text) { return detail::seed_problem(text); },
                        "UINT64 in [0, 2^64-1]", "seed");
}

/// --threads: 0 (one per core) or 1..1024.
inline CLI::Validator threads_validator() {
  return CLI::Validator([](std::string& text) { return detail::threads_problem(text); }, "0..1024",
                        "threads");
}

/// A finite number (--scale), with the text that came in the message: '1e400' is not a finite
/// float64, and '' is no number (an unset shell variable), not the option's absence.
inline CLI::Validator finite_number_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v)) {
          return "expected a finite number, got '" + text + "'";
        }
        return "";
      },
      "NUMBER", "finite number");
}

/// A positive number of seconds, with a message that names what came (CLI11's PositiveNumber
/// prints DBL_MAX in full and says 0 is not in the range [0, DBL_MAX]).
inline CLI::Validator positive_seconds_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !(v > 0) || !std::isfinite(v)) {
          return "expected a positive number of seconds, got '" + text + "'";
        }
        return "";
      },
      "SECONDS > 0", "positive seconds");
}

/// Runs `f`, rethrowing an sdpa::Error whose argument is an API parameter (`dropout_p`) with
/// the name the command line gave it (`--dropout-p`, or `--sinks FILE`): `names` maps one to
/// the other. Other errors pass through unchanged.
template <class F>
decltype(auto) naming_flags(const std::map<std::string, std::string>& names, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    const auto it = names.find(e.argument());
    if (it == names.end() || e.argument().empty()) throw;
    const std::string what = e.what();
    std::string text = what.substr(e.argument().size() + 2);
    // A message may point to another parameter by its API name ("or enable_gqa ..."): use the
    // command's spelling there too. Only names with an underscore, never a plain word.
    for (const auto& [api, flag] : names) {
      if (api.find('_') == std::string::npos) continue;
      const std::string spelling = flag.substr(0, flag.find(' '));
      auto word_char = [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      };
      std::size_t at = text.find(api);
      while (at != std::string::npos) {
        const std::size_t end = at + api.size();
        std::size_t next = end;
        if ((at == 0 || !word_char(text[at - 1])) &&
            (end == text.size() || !word_char(text[end]))) {
          text.replace(at, api.size(), spelling);
          next = at + spelling.size();
        }
        at = text.find(api, next);
      }
    }
    throw Error(e.kind(), it->second, text);
  }
}

}  // namespace sdpa::cli
