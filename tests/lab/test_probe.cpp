// The saturation and temperature probe against an independent float64 computation written
// here from the definitions: scores, softmax, its entropy, max and Jacobian norm, and the
// gradient reaching the logits dS = P (dP - sum P dP) with dP = dO V^T.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lab/probe.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

double rel(double a, double b) { return std::fabs(a - b) / std::max(1e-300, std::fabs(b)); }

TEST(Probe, MatchesTheDefinitionsComputedHere) {
  const int d = 11, n = 13, rows = 5;
  const ProbeInputs in = make_probe_inputs(3, 0x7e57, d, n, rows, 2);
  for (double scale : {0.05, 1.0 / std::sqrt(11.0), 4.0}) {
    const ProbeResult r = probe(in, scale, 2, /*keep_logits=*/true);
    const float* q = in.q.data_as<float>();
    const float* k = in.k.data_as<float>();
    const float* v = in.v.data_as<float>();
    const float* g = in.dout.data_as<float>();
    double z1 = 0, z2 = 0;
    for (int i = 0; i < rows; ++i) {
      std::vector<double> z(n), p(n), dp(n);
      double mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        double s = 0, t = 0;
        for (int e = 0; e < d; ++e) {
          s += double(q[i * d + e]) * k[j * d + e];
          t += double(g[i * d + e]) * v[j * d + e];
        }
        z[j] = scale * s;
        dp[j] = t;
        mx = std::max(mx, z[j]);
        z1 += z[j];
        z2 += z[j] * z[j];
        EXPECT_LT(rel(r.logits[i * n + j], z[j]), 1e-12) << "row " << i << " key " << j;
      }
      double sum = 0;
      for (int j = 0; j < n; ++j) sum += p[j] = std::exp(z[j] - mx);
      double h = 0, pmax = 0, D = 0, s2 = 0, s3 = 0;
      for (int j = 0; j < n; ++j) {
        p[j] /= sum;
        if (p[j] > 0) h -= p[j] * std::log(p[j]);
        pmax = std::max(pmax, p[j]);
        D += p[j] * dp[j];
        s2 += p[j] * p[j];
        s3 += p[j] * p[j] * p[j];
      }
      // dS cancels dP against D when P is saturated: the tolerance is relative to the terms.
      double gn = 0, terms = 0;
      for (int j = 0; j < n; ++j) {
        gn += (p[j] * (dp[j] - D)) * (p[j] * (dp[j] - D));
        terms +=
            (p[j] * (std::fabs(dp[j]) + std::fabs(D))) * (p[j] * (std::fabs(dp[j]) + std::fabs(D)));
      }
      EXPECT_LT(std::fabs(r.entropy[i] - h), 1e-12) << "scale " << scale << " row " << i;
      EXPECT_LT(rel(r.max_prob[i], pmax), 1e-12) << "scale " << scale << " row " << i;
      EXPECT_LT(std::fabs(r.jacobian_norm[i] - std::sqrt(std::max(0.0, s2 - 2 * s3 + s2 * s2))),
                1e-12);
      EXPECT_LT(std::fabs(r.grad_logits[i] - std::sqrt(gn)), 1e-12 * std::sqrt(terms))
          << "scale " << scale << " row " << i;
    }
    const double count = double(rows) * n;
    EXPECT_LT(rel(r.logit_std, std::sqrt((z2 - z1 * z1 / count) / (count - 1))), 1e-10);

    // dQ and dK are the library's fused kernel in float32: close to the reference's, relative
    // to the largest row (a saturated row's small gradient is all cancellation).
    AttentionOptions o;
    o.scale = scale;
    o.impl = Impl::reference;
    Array out(DType::float32, {1, rows, d}), lse(DType::float32, {1, rows});
    Array dq(DType::float32, {1, rows, d}), dk(DType::float32, {1, n, d}),
        dv(DType::float32, {1, n, d});
    MutableTensorRef lse_ref = lse.mut();
    attention_forward(in.q, in.k, in.v, nullptr, o, out.mut(), &lse_ref);
    attention_backward(in.q, in.k, in.v, nullptr, out, lse, in.dout, o, dq.mut(), dk.mut(),
                       dv.mut());
    const auto top = [](const std::vector<double>& x) {
      return *std::max_element(x.begin(), x.end());
    };
    for (int i = 0; i < rows; ++i) {
      double s = 0;
      for (int e = 0; e < d; ++e)
        s += double(dq.data_as<float>()[i * d + e]) * dq.data_as<float>()[i * d + e];
      EXPECT_LT(std::fabs(r.grad_q[i] - std::sqrt(s)), 1e-4 * top(r.grad_q))
          << "scale " << scale << " row " << i;
    }
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int e = 0; e < d; ++e)
        s += double(dk.data_as<float>()[j * d + e]) * dk.data_as<float>()[j * d + e];
      EXPECT_LT(std::fabs(r.grad_k[j] - std::sqrt(s)), 1e-4 * top(r.grad_k))
          << "scale " << scale << " key " << j;
    }
    // The same numbers for any thread count.
    const ProbeResult one = probe(in, scale, 1, true);
    EXPECT_EQ(one.entropy, r.entropy);
    EXPECT_EQ(one.grad_logits, r.grad_logits);
    EXPECT_EQ(one.logits, r.logits);
  }
}

}  // namespace
}  // namespace sdpa::lab
