// The lab: experiments that turn the article's claims (lab/claims.h, C1-C8) into
// measurements. Every experiment returns one JSON object of the common form
//
//   {"experiment": "variance", "seed": 1, "mode": "quick", "lang": "en", "seconds": 2.1,
//    "claims": [{"id": "C4", "claim": "...", "claim_en": "...", "claim_zh": "...",
//                "theory": "...", "measurement": "...",
//                "verdict": "holds" | "fails" | "holds-if", "condition": "...",
//                "evidence": "..."}],
//    "tables": {"<table>": [{"column": value, ...}, ...]}}
//
// ("claim" is in the --lang language; non-finite numbers are the strings "inf", "-inf", "nan".
// docs/lab.md describes every table and column; src/lab/common.h has the helpers that build
// this form: make_result, make_claim, claim_text, num, stream_id, parallel_for, Progress.)
//
// and is reproducible: the same seed gives the same object byte for byte whatever the thread
// count ("seconds" aside, which is wall time). Experiments call the library (sdpa/sdpa.h:
// softmax, attention forward/backward); they never re-implement it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lab/schema.h"
#include "lab/words.h"

namespace sdpa::lab {

using json = nlohmann::json;

enum class Mode { quick, full };

struct LabOptions {
  std::uint64_t seed = 1;
  Mode mode = Mode::quick;
  Lang lang = Lang::en;
  int threads = 0;        // 0: one per core
  bool progress = false;  // draw a progress bar on stderr (the CLI sets it when stderr is a tty)
};

/// An experiment: its name (part of the interface), a one-line summary, its runner, its result
/// tables (declared once, lab/schema.h) and what `sdpa lab` prints of them. Each experiment's
/// file defines one (softmax_experiment() in exp_softmax.cpp, ...).
struct Experiment {
  std::string name;
  std::string summary;
  std::function<json(const LabOptions&)> run;
  std::vector<Table> tables;
  std::vector<View> views;
};

/// Every experiment, in the order `sdpa lab list` shows them (train last).
const std::vector<Experiment>& experiments();

/// The experiment called `name`, or throws sdpa::Error listing the valid names.
const Experiment& find_experiment(const std::string& name);

/// Claim C8: train small attention models with each scale (src/lab/train.cpp).
json run_train(const LabOptions& options);

/// Runs the experiment `name` (find_experiment) and adds "seconds" (wall time, 0.01 s).
json run_experiment(const std::string& name, const LabOptions& options);

/// The human-readable text of a result (the common form above) in `lang`: for each claim the
/// claim (the article's Chinese words with Lang::zh), theory, measurement, verdict and
/// evidence, then the key rows of the experiment's tables. Results of unknown experiments get
/// the first rows of every table. The report and the Python module call this too.
std::string render_text(const json& result, Lang lang);

/// "en" / "zh" -> Lang, "quick" / "full" -> Mode; throws sdpa::Error naming `what` otherwise.
Lang parse_lang(const std::string& text, const std::string& what = "--lang");
Mode parse_mode(const std::string& text, const std::string& what = "--mode");

}  // namespace sdpa::lab
