// Panel 4: the freezing map. Mean attention entropy, as a fraction of ln N, over a grid of
// d = 1, 2, 4, ..., d_max and N = 2, 4, ..., n_max, for one scale and one input law, with the
// random energy model's boundary s(d)^2 = 2 ln N drawn on it (s^2: the closed-form variance of
// one row's scaled scores, dot_row_variance).
//
// The grid is nested to bound the work: the keys are drawn once at d_max, a smaller d reads the
// first d components of the same vectors (their dot products are running sums recorded at each
// power of two), and a smaller N the first N keys. One request draws n_max d_max key
// components and kRows d_max n_max products, whatever the grid.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "keys.h"
#include "lab/stats.h"
#include "params.h"
#include "serve.h"

namespace sdpa::serve {

namespace {

constexpr int kRows = 8;

int power_of_two(Params& p, const std::string& name, int lo, int hi, int fallback) {
  const int v = p.integer(name, lo, hi, fallback);
  if ((v & (v - 1)) != 0) {
    throw ParamError(name,
                     fmt::format("{} must be a power of two in [{}, {}], got {}", name, lo, hi, v));
  }
  return v;
}

}  // namespace

json compute_freeze(const json& request) {
  const auto t0 = std::chrono::steady_clock::now();
  Params p(request);
  const int d_max = power_of_two(p, "d_max", 1, 4096, 1024);
  const int n_max = power_of_two(p, "n_max", 2, 4096, 4096);
  const InputSpec in = read_inputs(p);
  const ScaleSpec scale = read_scale(p);
  p.finish();

  std::vector<int> ds, ns;
  for (int d = 1; d <= d_max; d *= 2) ds.push_back(d);
  for (int n = 2; n <= n_max; n *= 2) ns.push_back(n);
  const int K = static_cast<int>(ds.size());

  // pass 1: running sums at every d of the grid, from the keys' raw draws (keys.h):
  // q.k = a_j sum(q) + b q.z_j and |k|^2 = d a_j^2 + 2 a_j b sum(z_j) + b^2 |z_j|^2.
  std::vector<double> q(static_cast<std::size_t>(kRows) * d_max), q_sum(kRows * K), qn(kRows * K);
  for (int r = 0; r < kRows; ++r) {
    double* qr = q.data() + std::size_t(r) * d_max;
    draw_query(in, r, d_max, qr);
    double s = 0, s2 = 0;
    for (int k = 0, i = 0; k < K; ++k) {
      for (; i < ds[k]; ++i) {
        s += qr[i];
        s2 += qr[i] * qr[i];
      }
      q_sum[r * K + k] = s;
      qn[r * K + k] = s2;
    }
  }
  const std::shared_ptr<const KeyBlock> keys = key_block(in, n_max, d_max);
  const KeyMap map(in);
  std::vector<double> x(static_cast<std::size_t>(kRows) * n_max * K);
  std::vector<double> kn(static_cast<std::size_t>(n_max) * K);
#pragma omp parallel for schedule(static)
  for (int j = 0; j < n_max; ++j) {
    const float* zj = keys->row(j);
    const double a = map.a(keys->shared[j], in), b = map.b;
    double sz = 0, sz2 = 0;
    for (int k = 0, i = 0; k < K; ++k) {
      for (; i < ds[k]; ++i) {
        sz += zj[i];
        sz2 += double(zj[i]) * zj[i];
      }
      kn[std::size_t(j) * K + k] = std::max(0.0, ds[k] * a * a + 2 * a * b * sz + b * b * sz2);
    }
    for (int r = 0; r < kRows; ++r) {
      const double* qr = q.data() + std::size_t(r) * d_max;
      double s = 0;
      for (int k = 0, from = 0; k < K; ++k) {
        s += dot(qr + from, zj + from, ds[k] - from);
        from = ds[k];
        x[(std::size_t(r) * n_max + j) * K + k] = a * q_sum[r * K + k] + b * s;
      }
    }
  }

  // pass 2: every cell's rows through the library's softmax.
  const int cells = K * static_cast<int>(ns.size());
  std::vector<double> entropy(cells);
#pragma omp parallel
  {
    std::vector<double> z(n_max), pr(n_max);
#pragma omp for schedule(dynamic)
    for (int cell = 0; cell < cells; ++cell) {
      const int di = cell % K, ni = cell / K;
      const int d = ds[di], n = ns[ni];
      const double c = scale.factor(d);
      double h = 0;
      for (int r = 0; r < kRows; ++r) {
        for (int j = 0; j < n; ++j) {
          const double v = x[(std::size_t(r) * n_max + j) * K + di];
          switch (scale.kind) {
            case ScaleSpec::qk_norm: {
              const double denom = std::sqrt(qn[r * K + di] * kn[std::size_t(j) * K + di]);
              z[j] = denom > 0 ? c * v / denom : 0.0;
              break;
            }
            case ScaleSpec::softcap:
              z[j] = scale.cap * std::tanh(c * v / scale.cap);
              break;
            default:
              z[j] = c * v;
          }
        }
        softmax<double>(std::span<const double>(z.data(), n), std::span<double>(pr.data(), n));
        h += lab::entropy(std::span<const double>(pr.data(), n));
      }
      entropy[cell] = h / kRows;
    }
  }

  json grid = json::array();
  for (int cell = 0; cell < cells; ++cell) {
    const int di = cell % K, ni = cell / K;
    const double ln_n = std::log(double(ns[ni]));
    const double s2 = score_moments(in, scale, ds[di]).row_variance;
    grid.push_back({{"d", ds[di]},
                    {"n", ns[ni]},
                    {"entropy", entropy[cell]},
                    {"normalized", entropy[cell] / ln_n},
                    {"theory", s2 < 2 * ln_n ? "liquid" : "frozen"}});
  }

  // The boundary: for N on a quarter-octave grid, the d in [1, d_max] (on a 1/32-octave grid,
  // interpolated in log d) where s(d)^2 crosses 2 ln N.
  json boundary = json::array();
  const int steps = 32 * (K - 1);
  std::vector<double> lds(steps + 1), s2s(steps + 1);
  for (int i = 0; i <= steps; ++i) {
    lds[i] = std::log2(double(d_max)) * i / std::max(1, steps);
    s2s[i] = score_moments(in, scale, std::exp2(lds[i])).row_variance;
  }
  for (double t = 1; t <= std::log2(double(n_max)) + 1e-9; t += 0.25) {
    const double n = std::exp2(t), two_ln_n = 2 * std::log(n);
    double prev_ld = 0, prev_f = 0;
    for (int i = 0; i <= steps; ++i) {
      const double ld = lds[i], f = s2s[i] - two_ln_n;
      if (i > 0 && (prev_f < 0) != (f < 0)) {
        const double at = prev_ld + (ld - prev_ld) * prev_f / (prev_f - f);
        boundary.push_back({{"n", n}, {"d", std::exp2(at)}, {"frozen_above", f >= 0}});
        break;
      }
      prev_ld = ld;
      prev_f = f;
    }
  }

  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return {{"ds", ds},      {"ns", ns},
          {"rows", kRows}, {"scale", scale.name()},
          {"grid", grid},  {"boundary", boundary},
          {"ms", ms}};
}

}  // namespace sdpa::serve
