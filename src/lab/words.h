// The lab's prose in the two languages of --lang: every sentence an experiment or a verdict
// writes (theory, measurement, condition, evidence) comes in English and in Chinese. Numbers,
// names of tables, columns and formats stay as they are in both.
#pragma once

#include <fmt/format.h>

#include <string>

namespace sdpa::lab {

enum class Lang { en, zh };

/// `en` or `zh`, by `lang`.
inline std::string pick(Lang lang, const char* en, const char* zh) {
  return lang == Lang::zh ? zh : en;
}

/// The same arguments formatted into the English or the Chinese sentence; both format strings
/// are checked against the arguments when compiled.
template <class... T>
std::string say(Lang lang, fmt::format_string<T...> en, fmt::format_string<T...> zh, T&&... args) {
  const fmt::string_view text = lang == Lang::zh ? fmt::string_view(zh) : fmt::string_view(en);
  return fmt::vformat(text, fmt::make_format_args(args...));
}

/// The separator of a list of clauses: "; " or "；".
inline const char* clause_separator(Lang lang) { return lang == Lang::zh ? "；" : "; "; }

}  // namespace sdpa::lab
