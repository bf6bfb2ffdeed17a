// Parsing option values given as text (command lines), with one message per option.
#pragma once

#include <cstdint>
#include <string>

namespace sdpa::detail {

/// A seed: a decimal integer in [0, 2^64 - 1], nothing else ('-1', '', '2^64', '1e23' and
/// '0x10' are refused). Throws sdpa::Error (bad_value) naming `argument` and the range.
std::uint64_t parse_seed(const std::string& text, const std::string& argument);

/// A thread count: a decimal integer, 0 (one per core) or 1..1024. Throws sdpa::Error naming
/// `argument` and the range.
int parse_threads(const std::string& text, const std::string& argument);

/// The messages of the two parsers, for validators that report without throwing: "" when
/// `text` is valid.
std::string seed_problem(const std::string& text);
std::string threads_problem(const std::string& text);

}  // namespace sdpa::detail
