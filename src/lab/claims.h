// The article's claims C1..C8, in one place: the lab's results quote them, the report heads its
// sections with them. The Chinese is the article's own wording (an interview explainer on why
// attention divides by sqrt(d)); the English renders the claim.
#pragma once

#include <string>

#include "lab/lab.h"

namespace sdpa::lab {

struct ClaimText {
  const char* id;          // "C1" .. "C8"
  const char* heading_en;  // a short title
  const char* heading_zh;
  const char* passage_zh;  // the article's passage, verbatim (elisions marked ……)
  const char* claim_zh;    // the claim itself, trimmed from the passage
  const char* claim_en;    // the claim in English
};

inline constexpr int kClaims = 8;

/// C1 .. C8, in order.
const ClaimText* claim_texts();

/// The claim `id` ("C1".."C8"); throws sdpa::Error for an unknown id.
const ClaimText& find_claim(const std::string& id);

/// The claim's words in `lang`: claim_en or claim_zh.
std::string claim_text(const std::string& id, Lang lang);

}  // namespace sdpa::lab
