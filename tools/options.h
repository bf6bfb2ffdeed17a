// Validators for the options several commands share, so that each option has one message:
// CLI11 runs them on the text before converting it (a seed of '-1' never wraps to 2^64 - 1).
#pragma once

#include <CLI/CLI.hpp>

#include "core/options.h"

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

}  // namespace sdpa::cli
