#include "core/options.h"

#include <fmt/format.h>

#include <charconv>

#include "sdpa/sdpa.h"

namespace sdpa::detail {
namespace {

// Only the digits 0-9 (std::from_chars accepts no sign, space or exponent for unsigned types;
// a leading '-' is refused here, where strtoull would wrap it around).
template <class T>
bool parse_decimal(const std::string& text, T& value) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  return ec == std::errc() && ptr == end;
}

constexpr int kMaxThreads = 1024;  // resolve_threads' limit

}  // namespace

std::string seed_problem(const std::string& text) {
  std::uint64_t v = 0;
  if (parse_decimal(text, v)) return "";
  return fmt::format("expected an integer in [0, 2^64-1] (0 to 18446744073709551615), got '{}'",
                     text);
}

std::string threads_problem(const std::string& text) {
  std::uint32_t v = 0;
  if (parse_decimal(text, v) && v <= kMaxThreads) return "";
  return fmt::format("expected 0 (one per core) or 1..{}, got {}", kMaxThreads,
                     text.empty() ? std::string("''") : text);
}

std::uint64_t parse_seed(const std::string& text, const std::string& argument) {
  const std::string problem = seed_problem(text);
  if (!problem.empty()) throw Error(ErrorKind::bad_value, argument, problem);
  std::uint64_t v = 0;
  parse_decimal(text, v);
  return v;
}

int parse_threads(const std::string& text, const std::string& argument) {
  const std::string problem = threads_problem(text);
  if (!problem.empty()) throw Error(ErrorKind::bad_value, argument, problem);
  std::uint32_t v = 0;
  parse_decimal(text, v);
  return static_cast<int>(v);
}

}  // namespace sdpa::detail
