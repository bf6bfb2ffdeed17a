// Helpers shared by the lab's experiments: the result skeleton, claims in two languages,
// JSON numbers, deterministic parallel loops, stream ids, and the progress bar.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "lab/claims.h"
#include "lab/lab.h"
#include "lab/verdicts.h"

namespace sdpa::lab {

/// A JSON number, or the strings "inf", "-inf", "nan" (JSON has no such numbers).
json num(double v);
/// v, or null where v is NaN: a closed form with no value there (lab/rem.h's rem_entropy).
json or_null(double v);

/// "quick" / "full", "en" / "zh".
const char* mode_name(Mode mode);
const char* lang_name(Lang lang);

/// One entry of "claims": the claim in both languages, `claim` in `lang`.
json make_claim(const std::string& id, Lang lang, const std::string& theory,
                const std::string& measurement, const Verdict& verdict,
                const std::string& evidence);

/// {"experiment", "seed", "mode", "lang", "claims": [], "tables": {}}; "seconds" is added by
/// the registry's wrapper.
json make_result(const std::string& experiment, const LabOptions& options);

/// The gradient-distribution columns of `saturation` and `temperature`: for each of dQ, dK and
/// the gradient reaching the logits, `*_norm` (median), `*_mean`, `*_p99` and `*_dead`, the
/// fraction of rows below kDeadFactor times the uniform-attention norm (lab/rem.h); `reference`
/// names where (d, N) come from.
std::vector<Column> gradient_columns(const std::string& reference);

/// A row is "dead" when its gradient norm is below this fraction of the norm uniform attention
/// at scale 1/sqrt(d) gives it (uniform_grad_* in lab/rem.h), a closed form of (d, N): a
/// thousandth, three decades below a typical unit-variance row. Not relative to a measured
/// median, so that no scale passes the test by construction.
inline constexpr double kDeadFactor = 1e-3;

/// A 64-bit stream id from a few small fields (experiment tag, cell, tensor, row, ...): each
/// field is mixed in with SplitMix64's finaliser, so distinct tuples give distinct streams
/// (with probability 1 - 2^-64 per pair).
std::uint64_t stream_id(std::initializer_list<std::uint64_t> fields);

/// Runs body(i) for i in [0, n) on `threads` threads (resolved like AttentionOptions::threads).
/// Items are claimed dynamically, so the schedule varies but each i runs exactly once: results
/// written to slot i are identical for any thread count. The first exception is rethrown.
void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& body);

/// A progress bar on stderr, drawn only when enabled (the CLI enables it for --full on a tty).
class Progress {
 public:
  Progress(bool enabled, std::string label, std::int64_t total);
  ~Progress();
  void advance(std::int64_t steps = 1);

 private:
  void draw(std::int64_t done);
  bool enabled_;
  std::string label_;
  std::int64_t total_;
  std::atomic<std::int64_t> done_{0};
  std::mutex mutex_;
  int last_percent_ = -1;
};

}  // namespace sdpa::lab
