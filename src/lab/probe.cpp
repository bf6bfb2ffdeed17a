#include "lab/probe.h"

#include <cassert>
#include <cmath>
#include <span>

#include "core/problem.h"
#include "lab/common.h"
#include "lab/random.h"
#include "lab/stats.h"
#include "reference/reference.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

// Norms of float32 rows in float64. Eight partial sums: a fixed order (so the result is the
// same on every run) that the compiler can keep in vector registers.
double dot(const float* a, const float* b, int n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += double(a[i + j]) * double(b[i + j]);
  }
  for (; i < n; ++i) acc[i & 7] += double(a[i]) * double(b[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double row_norm(const float* x, int n) { return std::sqrt(dot(x, x, n)); }

}  // namespace

ProbeInputs make_probe_inputs(std::uint64_t seed, std::uint64_t tag, int d, int n_keys, int rows,
                              int threads) {
  ProbeInputs in;
  in.d = d;
  in.n_keys = n_keys;
  in.rows = rows;
  in.q = Array(DType::float32, {1, rows, d});
  in.k = Array(DType::float32, {1, n_keys, d});
  in.v = Array(DType::float32, {1, n_keys, d});
  in.dout = Array(DType::float32, {1, rows, d});
  Array* tensors[] = {&in.q, &in.k, &in.v, &in.dout};
  const std::int64_t counts[] = {rows, n_keys, n_keys, rows};
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  parallel_for(total, threads, [&](std::int64_t item) {
    int t = 0;
    while (item >= counts[t]) item -= counts[t++];
    Stream s(seed,
             stream_id({tag, static_cast<std::uint64_t>(d), static_cast<std::uint64_t>(n_keys),
                        static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(item)}));
    float* row = tensors[t]->data_as<float>() + item * d;
    for (int e = 0; e < d; ++e) row[e] = static_cast<float>(s.normal());
  });
  return in;
}

ProbeResult probe(const ProbeInputs& in, double scale, int threads, bool keep_logits) {
  const int d = in.d, n = in.n_keys, rows = in.rows;
  // The layout make_probe_inputs() gives: one batch of rows x d queries, n_keys x d keys.
  assert(in.q.numel() == std::int64_t{rows} * d && in.dout.numel() == std::int64_t{rows} * d);
  assert(in.k.numel() == std::int64_t{n} * d && in.v.numel() == std::int64_t{n} * d);
  ProbeResult r;
  r.entropy.resize(rows);
  r.max_prob.resize(rows);
  r.jacobian_norm.resize(rows);
  r.grad_logits.resize(rows);
  std::vector<double> sum_z(rows), sum_z2(rows);
  const float* v = in.v.data_as<float>();
  AttentionOptions opt;
  opt.scale = scale;
  opt.threads = threads;

  // pass 1: the float64 reference's logits scale * q.k, P and dS (the gradient reaching the
  // logits from dO), all rows x n_keys; its dS-only backward skips dQ, dK and dV.
  const std::size_t cells = static_cast<std::size_t>(rows) * n;
  std::vector<double> logits(cells), probs(cells), dlogits(cells);
  const detail::Problem problem = detail::resolve_problem(in.q, in.k, in.v, nullptr, opt);
  detail::reference_backward(problem, in.dout.data(), nullptr, nullptr, nullptr,
                             {logits.data(), probs.data(), dlogits.data()});
  parallel_for(rows, threads, [&](std::int64_t i) {
    const std::size_t at = static_cast<std::size_t>(i) * n;
    const std::span<const double> p(probs.data() + at, n);
    double mx = 0, z1 = 0, z2 = 0, g = 0;
    for (int j = 0; j < n; ++j) {
      mx = std::max(mx, p[j]);
      const double z = logits[at + j];
      z1 += z;
      z2 += z * z;
      g += dlogits[at + j] * dlogits[at + j];
    }
    r.entropy[i] = entropy(p);
    r.max_prob[i] = mx;
    r.jacobian_norm[i] = jacobian_frobenius(p);
    r.grad_logits[i] = std::sqrt(g);
    sum_z[i] = z1;
    sum_z2[i] = z2;
  });
  if (keep_logits) r.logits = std::move(logits);
  double z1 = 0, z2 = 0;
  for (int i = 0; i < rows; ++i) {
    z1 += sum_z[i];
    z2 += sum_z2[i];
  }
  const double count = static_cast<double>(rows) * n;
  r.logit_std = std::sqrt(std::max(0.0, (z2 - z1 * z1 / count) / (count - 1)));

  // pass 2: the library's fused kernel, forward and backward: out, dQ and dK as a model gets them.
  Array out(DType::float32, {1, rows, d}), lse(DType::float32, {1, rows});
  Array dq(DType::float32, {1, rows, d}), dk(DType::float32, {1, n, d}),
      dv(DType::float32, {1, n, d});
  MutableTensorRef lse_ref = lse.mut();
  attention_forward(in.q, in.k, in.v, nullptr, opt, out.mut(), &lse_ref);
  attention_backward(in.q, in.k, in.v, nullptr, out, lse, in.dout, opt, dq.mut(), dk.mut(),
                     dv.mut());
  r.grad_q.resize(rows);
  r.grad_k.resize(n);
  for (int i = 0; i < rows; ++i) r.grad_q[i] = row_norm(dq.data_as<float>() + i * d, d);
  for (int j = 0; j < n; ++j) {
    r.grad_k[j] = row_norm(dk.data_as<float>() + static_cast<std::int64_t>(j) * d, d);
  }

  // How much the output depends on the query: per feature, the variance of out over queries,
  // against the variance of v over keys (both averaged over features).
  double var_out = 0, var_v = 0;
  const float* o = out.data_as<float>();
  for (int e = 0; e < d; ++e) {
    double a1 = 0, a2 = 0, b1 = 0, b2 = 0;
    for (int i = 0; i < rows; ++i) {
      a1 += o[static_cast<std::int64_t>(i) * d + e];
      a2 +=
          double(o[static_cast<std::int64_t>(i) * d + e]) * o[static_cast<std::int64_t>(i) * d + e];
    }
    for (int j = 0; j < n; ++j) {
      b1 += v[static_cast<std::int64_t>(j) * d + e];
      b2 +=
          double(v[static_cast<std::int64_t>(j) * d + e]) * v[static_cast<std::int64_t>(j) * d + e];
    }
    var_out += std::max(0.0, a2 / rows - (a1 / rows) * (a1 / rows));
    var_v += std::max(0.0, b2 / n - (b1 / n) * (b1 / n));
  }
  r.output_diversity = var_v > 0 ? var_out / var_v : 0.0;
  return r;
}

}  // namespace sdpa::lab
