#include "lab/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <thread>

#include "sdpa/sdpa.h"

namespace sdpa::lab {

json num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

json or_null(double v) { return std::isnan(v) ? json() : num(v); }

const char* mode_name(Mode mode) { return mode == Mode::full ? "full" : "quick"; }
const char* lang_name(Lang lang) { return lang == Lang::zh ? "zh" : "en"; }

json make_claim(const std::string& id, Lang lang, const std::string& theory,
                const std::string& measurement, const Verdict& verdict,
                const std::string& evidence) {
  const ClaimText& c = find_claim(id);
  return json{{"id", id},
              {"claim", lang == Lang::zh ? c.claim_zh : c.claim_en},
              {"claim_en", c.claim_en},
              {"claim_zh", c.claim_zh},
              {"theory", theory},
              {"measurement", measurement},
              {"verdict", verdict.verdict},
              {"condition", verdict.condition},
              {"evidence", evidence}};
}

json make_result(const std::string& experiment, const LabOptions& options) {
  return json{{"experiment", experiment},        {"seed", options.seed},
              {"mode", mode_name(options.mode)}, {"lang", lang_name(options.lang)},
              {"claims", json::array()},         {"tables", json::object()}};
}

std::vector<Column> gradient_columns(const std::string& reference) {
  std::vector<Column> c;
  const std::pair<const char*, const char*> grads[] = {
      {"grad_q", "dQ (one row per query)"},
      {"grad_k", "dK (one row per key)"},
      {"grad_logits",
       "the gradient reaching the logits, `dS = P∘(dP − rowsum(dO∘O))` (one row "
       "per query)"}};
  for (const auto& [name, what] : grads) {
    const std::string n = name;
    c.push_back({n + "_norm", Kind::number, "", fmt::format("median row norm of {}", what)});
    c.push_back({n + "_mean", Kind::number, "", "mean row norm"});
    c.push_back({n + "_p99", Kind::number, "", "99th percentile of the row norms"});
    c.push_back(
        {n + "_dead", Kind::number, "",
         fmt::format("fraction of rows with norm below 1e-3 × the norm uniform attention "
                     "at scale `1/sqrt(d)` gives ({}): `sqrt(d(N−1))/N` for dQ and the logits, "
                     "`sqrt(rows·d(N−1)/N³)` for dK, a closed form fixed before measuring",
                     reference)});
  }
  return c;
}

std::uint64_t stream_id(std::initializer_list<std::uint64_t> fields) {
  std::uint64_t h = 0x243f6a8885a308d3ULL;  // digits of pi: any fixed non-zero start
  for (std::uint64_t f : fields) {
    h += f + 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& body) {
  if (n <= 0) return;
  const int t = static_cast<int>(std::min<std::int64_t>(resolve_threads(threads), n));
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (;;) {
      const std::int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        body(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);  // stop handing out work
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(t - 1));
  for (int k = 1; k < t; ++k) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

Progress::Progress(bool enabled, std::string label, std::int64_t total)
    : enabled_(enabled && total > 0), label_(std::move(label)), total_(total) {
  if (enabled_) draw(0);
}

Progress::~Progress() {
  if (enabled_) std::fprintf(stderr, "\r%*s\r", static_cast<int>(label_.size()) + 60, "");
}

void Progress::advance(std::int64_t steps) {
  if (!enabled_) return;
  draw(done_.fetch_add(steps) + steps);
}

void Progress::draw(std::int64_t done) {
  std::lock_guard lock(mutex_);
  const int percent = static_cast<int>(100 * std::min(done, total_) / total_);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  const int width = 40, filled = percent * width / 100;
  std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(), std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), percent);
  std::fflush(stderr);
}

}  // namespace sdpa::lab
