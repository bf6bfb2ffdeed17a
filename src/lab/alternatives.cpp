// Table `alternatives` of the experiment `saturation` ("alternatives that real models
// use"): the normalisers real models use instead of, or on top of, 1/sqrt(d), compared on the
// same measurements as C7 when q and k keep unit variance (sigma = 1) and when their
// activations have grown (sigma = 4, a drift the article's derivation assumes away):
//   "1"          unscaled q.k                      logit std  sigma^2 sqrt(d)
//   "1/sqrt(d)"  the article's                     logit std  sigma^2
//   "1/d"        muP's                             logit std  sigma^2 / sqrt(d)
//   "qk-norm"    q and k RMS-normalised, then 1/sqrt(d): sqrt(d) cos(q, k)   logit std 1
//   "softcap"    1/sqrt(d), then c tanh(y / c) with c = 50 (Gemma 2's attention cap): at most c
// For each: the logits' measured standard deviation, the softmax's entropy against the random
// energy model's ln N - s^2/2 (s the theory's standard deviation), the max probability, and the
// gradient reaching the logits (for softcap, the logits before the cap) from a random upstream
// gradient on P, through the library's softmax_backward: its median norm and the
// fraction of rows below a thousandth of the median of 1/sqrt(d) at sigma = 1 ("dead").
// The logits and P are the float64 reference's (the library's attention); only softcap's cap is
// computed here.
#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/problem.h"
#include "lab/common.h"
#include "lab/experiments.h"
#include "lab/random.h"
#include "lab/rem.h"
#include "lab/scales.h"
#include "lab/stats.h"
#include "lab/streams.h"
#include "reference/reference.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

constexpr int kAltDs[] = {16, 64, 256, 1024};
constexpr double kSigmas[] = {1.0, 4.0};
constexpr int kAltN = 1024;
constexpr double kCap = 50.0;

constexpr Scale kMethods[] = {Scale::one, Scale::inv_sqrt_d, Scale::inv_d, Scale::qk_norm,
                              Scale::softcap};
constexpr int kBaseline = 1;  // 1/sqrt(d) at sigma = 1: the "dead" threshold is relative to it
// softcap transforms the logits of 1/sqrt(d), so that method must come first.
static_assert(kMethods[kBaseline] == Scale::inv_sqrt_d && kMethods[4] == Scale::softcap);

// The standard deviation of the logits that the method's closed form gives (softcap: the
// uncapped value, an upper bound).
double std_theory(Scale m, double sigma, int d) {
  const double s2 = sigma * sigma, rd = std::sqrt(static_cast<double>(d));
  switch (m) {
    case Scale::one:
      return s2 * rd;
    case Scale::inv_sqrt_d:
    case Scale::softcap:
      return s2;
    case Scale::inv_d:
      return s2 / rd;
    case Scale::qk_norm:
      return 1.0;
  }
  return 0.0;
}

struct RowResult {
  double entropy = 0, max_prob = 0, grad_norm = 0, sum_z = 0, sum_z2 = 0;
};

}  // namespace

json alternatives_table(const LabOptions& options) {
  const int rows = options.mode == Mode::full ? 512 : 128;
  const int n = kAltN;
  constexpr auto n_methods = static_cast<int>(std::size(kMethods));
  json table = json::array();
  // Per d, the median gradient norm of 1/sqrt(d) at sigma = 1 (the first sigma).
  std::vector<double> baseline_median(std::size(kAltDs));
  for (std::size_t si = 0; si < std::size(kSigmas); ++si) {
    const double sigma = kSigmas[si];
    for (std::size_t di = 0; di < std::size(kAltDs); ++di) {
      const int d = kAltDs[di];
      // Keys (shared by the rows) and their norms; each query row draws its own q and dP.
      Array q(DType::float64, {rows, d}), k(DType::float64, {n, d});
      Array q_unit(DType::float64, {rows, d}), k_unit(DType::float64, {n, d});
      const Array v(DType::float64, {n, 1});  // never read: the P-only forward skips P V
      std::vector<double> dp(static_cast<std::size_t>(rows) * n);
      const double rd = std::sqrt(static_cast<double>(d));
      // One row of x scaled to RMS 1 (norm sqrt(d)): the inputs of qk-norm.
      const auto rms_normalise = [d, rd](const double* x, double* out) {
        double s = 0;
        for (int e = 0; e < d; ++e) s += x[e] * x[e];
        const double f = rd / std::sqrt(s);
        for (int e = 0; e < d; ++e) out[e] = x[e] * f;
      };
      for (int j = 0; j < n; ++j) {
        Stream st(options.seed,
                  stream_id({streams::kAlternatives, si, static_cast<std::uint64_t>(d), 1,
                             static_cast<std::uint64_t>(j)}));
        double* kj = k.data_as<double>() + static_cast<std::size_t>(j) * d;
        for (int e = 0; e < d; ++e) kj[e] = sigma * st.normal();
        rms_normalise(kj, k_unit.data_as<double>() + static_cast<std::size_t>(j) * d);
      }
      parallel_for(rows, options.threads, [&](std::int64_t r) {
        Stream st(options.seed,
                  stream_id({streams::kAlternatives, si, static_cast<std::uint64_t>(d), 0,
                             static_cast<std::uint64_t>(r)}));
        double* qr = q.data_as<double>() + r * d;
        for (int e = 0; e < d; ++e) qr[e] = sigma * st.normal();
        rms_normalise(qr, q_unit.data_as<double>() + r * d);
        for (int j = 0; j < n; ++j) dp[static_cast<std::size_t>(r) * n + j] = st.normal();
      });
      std::vector<RowResult> res(static_cast<std::size_t>(rows) * n_methods);
      std::vector<double> y(static_cast<std::size_t>(rows) * n), z(y.size()), p(y.size());
      for (int mi = 0; mi < n_methods; ++mi) {
        const Scale m = kMethods[mi];
        // The attention part through the float64 reference (its P-only forward): the logits
        // scale * q.k and their softmax P. qk-norm is attention on RMS-normalised q and k at
        // 1/sqrt(d). Softcap is not attention with a scale: it transforms the 1/sqrt(d) logits
        // (kept from that method, which kMethods lists earlier) with c tanh(y / c), then takes the
        // library's softmax.
        if (m == Scale::softcap) {
          for (std::size_t i = 0; i < y.size(); ++i) z[i] = kCap * std::tanh(y[i] / kCap);
          parallel_for(rows, options.threads, [&](std::int64_t r) {
            const std::size_t at = static_cast<std::size_t>(r) * n;
            softmax<double>(std::span<const double>(z.data() + at, n),
                            std::span<double>(p.data() + at, n));
          });
        } else {
          AttentionOptions opt;
          opt.threads = options.threads;
          opt.scale = m == Scale::one ? 1.0 : m == Scale::inv_d ? 1.0 / d : 1.0 / rd;
          const bool unit = m == Scale::qk_norm;
          const detail::Problem problem =
              detail::resolve_problem(unit ? q_unit : q, unit ? k_unit : k, v, nullptr, opt);
          detail::reference_forward(problem, nullptr, nullptr, {z.data(), p.data(), nullptr});
          if (m == Scale::inv_sqrt_d) y = z;
        }
        // The upstream gradient is drawn on P itself (not dO V^T as in attention), so the
        // gradient reaching the logits is the library's softmax_backward of it.
        parallel_for(rows, options.threads, [&](std::int64_t r) {
          const std::size_t at = static_cast<std::size_t>(r) * n;
          const std::span<const double> pr(p.data() + at, n), zr(z.data() + at, n);
          std::vector<double> ds(n);
          softmax_backward<double>(pr, std::span<const double>(dp.data() + at, n), ds);
          RowResult& out = res[static_cast<std::size_t>(r) * n_methods + mi];
          double g2 = 0;
          for (int j = 0; j < n; ++j) {
            // softcap: back through the cap, to the logits before it.
            const double t = m == Scale::softcap ? 1.0 - (zr[j] / kCap) * (zr[j] / kCap) : 1.0;
            g2 += ds[j] * t * ds[j] * t;
            out.sum_z += zr[j];
            out.sum_z2 += zr[j] * zr[j];
          }
          out.entropy = entropy(pr);
          out.max_prob = *std::max_element(pr.begin(), pr.end());
          out.grad_norm = std::sqrt(g2);
        });
      }
      std::vector<double> g(rows);
      if (si == 0) {
        for (int r = 0; r < rows; ++r) {
          g[r] = res[static_cast<std::size_t>(r) * n_methods + kBaseline].grad_norm;
        }
        baseline_median[di] = quantile(g, 0.5);
      }
      const double dead = kDeadFactor * baseline_median[di];
      const double ln_n = std::log(static_cast<double>(n));
      for (int mi = 0; mi < n_methods; ++mi) {
        std::vector<double> h(rows), mp(rows);
        double sz = 0, sz2 = 0;
        for (int r = 0; r < rows; ++r) {
          const RowResult& rr = res[static_cast<std::size_t>(r) * n_methods + mi];
          h[r] = rr.entropy;
          mp[r] = rr.max_prob;
          g[r] = rr.grad_norm;
          sz += rr.sum_z;
          sz2 += rr.sum_z2;
        }
        const double count = static_cast<double>(rows) * n;
        const double zmean = sz / count;
        const double zstd = std::sqrt(std::max(0.0, sz2 / count - zmean * zmean));
        const double st = std_theory(kMethods[mi], sigma, d);
        const NormStats gs = norm_stats(g, dead);
        table.push_back({{"sigma", sigma},
                         {"d", d},
                         {"n_keys", n},
                         {"rows", rows},
                         {"method", scale_name(kMethods[mi])},
                         {"logit_std_theory", st},
                         {"logit_std", zstd},
                         {"entropy", mean(h)},
                         {"entropy_theory", or_null(rem_entropy(st, n))},
                         {"normalized_entropy", mean(h) / ln_n},
                         {"regime", rem_regime(st, n)},
                         {"max_prob", mean(mp)},
                         {"grad_logits_norm", num(gs.median)},
                         {"grad_logits_dead", num(gs.dead)}});
      }
    }
  }
  return table;
}

}  // namespace sdpa::lab

namespace sdpa::lab {

Table alternatives_table_schema() {
  return {"alternatives",
          "one per (sigma, d, method), d ∈ {16, 64, 256, 1024}, N = 1024, 128 query rows "
          "(full: 512): the normalisers compared when q and k keep unit variance (`sigma` 1) and "
          "when their activations have grown (`sigma` 4)",
          {{"sigma", Kind::number, "", "standard deviation of the entries of q and k"},
           {"d", Kind::integer, "", "dimension of q and k"},
           {"n_keys", Kind::integer, "", "N"},
           {"rows", Kind::integer, "", "query rows measured"},
           {"method", Kind::text, "",
            "`\"1\"`: unscaled; `\"1/sqrt(d)\"`; `\"1/d\"`: the scale μP uses (μP itself also "
            "zero-initialises the query and scales rates with width); `\"qk-norm\"`: q and k "
            "RMS-normalised, then `1/sqrt(d)`, i.e. `sqrt(d)·cos(q, k)`; `\"softcap\"`: "
            "`1/sqrt(d)`, then `50·tanh(y/50)`, Gemma 2's attention cap"},
           {"logit_std_theory", Kind::number, "",
            "`sigma²·sqrt(d)`, `sigma²`, `sigma²/sqrt(d)`, 1, and for softcap the uncapped "
            "`sigma²`, an upper bound"},
           {"logit_std", Kind::number, "", "measured standard deviation of the logits"},
           {"entropy", Kind::number, "nats", "mean over rows"},
           {"entropy_theory", Kind::number, "nats",
            "the random-energy-model entropy at the theory's s, as in `saturation` (null "
            "between `s_c` and `1.5 s_c`)",
            true},
           {"normalized_entropy", Kind::number, "", "`entropy/ln N`"},
           {"regime", Kind::text, "",
            "`\"liquid\"`, `\"crossover\"` or `\"frozen\"` at the theory's s (as in "
            "`saturation`)"},
           {"max_prob", Kind::number, "", "largest probability, mean over rows"},
           {"grad_logits_norm", Kind::number, "",
            "median over rows of the gradient reaching the logits (softcap: before the cap) "
            "from an upstream gradient of independent standard normals"},
           {"grad_logits_dead", Kind::number, "",
            "fraction of rows below a thousandth of the median of `\"1/sqrt(d)\"` at sigma 1, "
            "same d"}}};
}

}  // namespace sdpa::lab
