#include "lab/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <thread>

#include "sdpa/sdpa.h"

namespace sdpa::lab {

json num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

const char* mode_name(Mode mode) { return mode == Mode::full ? "full" : "quick"; }
const char* lang_name(Lang lang) { return lang == Lang::zh ? "zh" : "en"; }

namespace {

struct ClaimWords {
  std::string en, zh;
};

// The Chinese is the article's own wording (shared/seed/article-zh.txt), trimmed to the claim.
const std::map<std::string, ClaimWords>& claim_words() {
  static const std::map<std::string, ClaimWords> words = {
      {"C1",
       {"Softmax is very sensitive to the absolute size of its input: too large, and the output "
        "becomes extremely sharp (one value near 1, the others near 0); too small, and it becomes "
        "uniform and attention loses its power to discriminate.",
        "Softmax 对输入的绝对大小极其敏感。输入过大：输出概率分布会变得极度尖锐（即某个值无限逼近 "
        "1，其他值逼近 0）；输入过小：输出分布会趋于均匀，注意力机制就失去了“区分度”和重点。"}},
      {"C2",
       {"softmax([1000, 10, 5]) ~ [1, 0, 0]; then the gradient can hardly propagate to the "
        "non-maximal positions.",
        "Softmax([1000, 10, 5]) ≈ [1, 0, 0]。此时，梯度几乎无法传播到非最大值的位置。"}},
      {"C3",
       {"If the components of q and k are independent with mean 0 and variance 1, the expectation "
        "of their dot product is still 0.",
        "假设 Q 和 K 的每个元素都是独立随机抽取的，服从均值为 0、方差为 1 "
        "的分布：点积结果的期望值依然为 0。"}},
      {"C4",
       {"... but the variance of the dot product becomes d: each of the d square terms "
        "contributes 1, and the cross terms have expectation 0.",
        "但结果的方差变成了 d：平方项每一项都是 1 × 1 = 1，求和后为 d；交叉项的期望均为 0。"}},
      {"C5",
       {"With vectors of dimension d = 512, the variance of the dot product soars to 512.",
        "如果你的词向量维度 d = 512，那么点积结果的方差直接飙升到了 512！"}},
      {"C6",
       {"Since Var(cX) = c^2 Var(X), multiplying by 1/sqrt(d) pulls the variance of the dot "
        "product back to 1.",
        "根据方差的性质 Var(cX) = c² Var(X)，需要给原本的变量乘以 1/√d，将点积结果的方差强行拉回 "
        "1。"}},
      {"C7",
       {"Without scaling, values that are too large push softmax into its saturated region and "
        "the gradient vanishes; dividing by sqrt(d) keeps the softmax input in a reasonable range "
        "and the gradient stable in back-propagation.",
        "如果不进行缩放，数值过大会导致 Softmax 陷入饱和区，引发梯度消失。除以 √d 是为了保证 "
        "Softmax 输入处于合理区间，从而保障反向传播时梯度的稳定。"}},
      {"C8",
       {"Without the scaling, the network is 'stuck' at that point and can hardly learn.",
        "梯度消失，在反向传播时梯度趋近于 0，模型几乎无法学习；整个网络在这个节点上就“卡死”了。"}},
  };
  return words;
}

}  // namespace

const std::string& claim_text(const std::string& id, Lang lang) {
  const auto& words = claim_words();
  const auto it = words.find(id);
  if (it == words.end()) {
    throw Error(fmt::format("lab claim: expected an id C1..C8, got '{}'", id));
  }
  return lang == Lang::zh ? it->second.zh : it->second.en;
}

json make_claim(const std::string& id, Lang lang, const std::string& theory,
                const std::string& measurement, const Verdict& verdict,
                const std::string& evidence) {
  return json{{"id", id},
              {"claim", claim_text(id, lang)},
              {"claim_en", claim_text(id, Lang::en)},
              {"claim_zh", claim_text(id, Lang::zh)},
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
