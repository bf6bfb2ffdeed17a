// The words of the page in both languages, and the article's sentences behind each claim.
#pragma once

#include <string>

#include "report/report.h"

namespace sdpa::report {

struct ClaimText {
  const char* id;
  const char* heading_en;
  const char* heading_zh;
  const char* article_zh;  // the article's own sentence(s), verbatim
  const char* article_en;  // CLAIMS.md's English
};

/// C1 .. C8, in order.
const ClaimText* claim_texts();
constexpr int kClaims = 8;

/// "Holds", "成立", ... for a lab verdict string ("holds", "fails", "holds-if").
std::string verdict_word(const std::string& verdict, Lang lang);

}  // namespace sdpa::report
