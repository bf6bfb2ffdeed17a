// Strided tensors in the C++ API: (B, H, L, E) and (B, L, H, E) views, slices of a packed QKV
// projection, an expanded (stride 0) mask and strided outputs give, for every implementation,
// forward and backward, exactly what their contiguous copies give; and the float64 reference on
// the copies is the oracle. Bad strides are rejected with a message naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace {

using sdpa::AttentionOptions;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::MutableTensorRef;
using sdpa::TensorRef;

constexpr std::int64_t B = 2, L = 9, S = 9, H = 3, E = 8;

// A packed projection (B, L, 3, H, E): q, k, v are its slices, viewed as (B, H, L, E).
struct Packed {
  std::vector<double> data;
  Packed() : data(static_cast<std::size_t>(B * L * 3 * H * E)) {
    std::mt19937_64 rng(42);
    std::normal_distribution<double> n;
    for (auto& x : data) x = n(rng);
  }
  TensorRef view(int which) const {
    return TensorRef{data.data() + which * H * E,
                     DType::float64,
                     {B, H, L, E},
                     {L * 3 * H * E, E, 3 * H * E, 1}};
  }
};

std::vector<double> copy_of(const TensorRef& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  const auto* p = static_cast<const double*>(t.data);
  std::size_t i = 0;
  for (std::int64_t a = 0; a < t.shape[0]; ++a)
    for (std::int64_t b = 0; b < t.shape[1]; ++b)
      for (std::int64_t c = 0; c < t.shape[2]; ++c)
        for (std::int64_t d = 0; d < t.shape[3]; ++d)
          out[i++] = p[a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3]];
  return out;
}

TensorRef ref(const std::vector<double>& v, std::vector<std::int64_t> shape) {
  return TensorRef{v.data(), DType::float64, std::move(shape)};
}

class Strided : public ::testing::TestWithParam<Impl> {};

TEST_P(Strided, ViewsMatchContiguousCopies) {
  const Packed p;
  const TensorRef q = p.view(0), k = p.view(1), v = p.view(2);
  const std::vector<double> qc = copy_of(q), kc = copy_of(k), vc = copy_of(v);
  // A (L, S) mask expanded over B and H with stride 0.
  std::vector<std::uint8_t> m(static_cast<std::size_t>(L * S));
  for (std::int64_t i = 0; i < L * S; ++i) m[static_cast<std::size_t>(i)] = (i * 7) % 5 != 0;
  const TensorRef mask{m.data(), DType::boolean, {B, H, L, S}, {0, 0, S, 1}};
  const TensorRef mask_c{m.data(), DType::boolean, {L, S}};
  AttentionOptions o;
  o.impl = GetParam();
  o.causal = Causal::upper_left;
  o.threads = 2;

  // Outputs: contiguous for the copies; (B, L, H, E)-strided for the views.
  const std::int64_t n = B * H * L * E;
  std::vector<double> out_c(n), lse_c(B * H * L), out_s(n), lse_s(B * H * L * 2);
  MutableTensorRef oc{out_c.data(), DType::float64, {B, H, L, E}};
  MutableTensorRef lc{lse_c.data(), DType::float64, {B, H, L}};
  MutableTensorRef os{out_s.data(), DType::float64, {B, H, L, E}, {L * H * E, E, H * E, 1}};
  MutableTensorRef ls{
      lse_s.data(), DType::float64, {B, H, L}, {2 * H * L, L, 1}};  // every other block of heads
  sdpa::attention_forward(ref(qc, {B, H, L, E}), ref(kc, {B, H, S, E}), ref(vc, {B, H, S, E}),
                          &mask_c, o, oc, &lc);
  sdpa::attention_forward(q, k, v, &mask, o, os, &ls);
  const std::vector<double> out_s_c = copy_of(os);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(out_s_c[i], out_c[i]) << "out element " << i;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < H * L; ++i) {
      ASSERT_EQ(lse_s[b * 2 * H * L + i], lse_c[b * H * L + i]) << "lse " << b << ", " << i;
    }
  }

  // The oracle: the float64 reference on the contiguous copies.
  AttentionOptions r = o;
  r.impl = Impl::reference;
  std::vector<double> out_r(n);
  sdpa::attention_forward(ref(qc, {B, H, L, E}), ref(kc, {B, H, S, E}), ref(vc, {B, H, S, E}),
                          &mask_c, r, MutableTensorRef{out_r.data(), DType::float64, {B, H, L, E}});
  double worst = 0, scale = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(out_c[i] - out_r[i]));
    scale = std::max(scale, std::fabs(out_r[i]));
  }
  EXPECT_LE(worst, 1e-12 * scale);

  // Backward: grad_out strided too, gradients written into a packed (B, L, 3, H, E) buffer.
  std::vector<double> g(n);
  for (std::int64_t i = 0; i < n; ++i) g[i] = std::sin(0.37 * static_cast<double>(i));
  std::vector<double> dq(n), dk(n), dv(n), packed_grad(static_cast<std::size_t>(3 * n));
  sdpa::attention_backward(ref(qc, {B, H, L, E}), ref(kc, {B, H, S, E}), ref(vc, {B, H, S, E}),
                           &mask_c, oc, lc, ref(g, {B, H, L, E}), o,
                           MutableTensorRef{dq.data(), DType::float64, {B, H, L, E}},
                           MutableTensorRef{dk.data(), DType::float64, {B, H, S, E}},
                           MutableTensorRef{dv.data(), DType::float64, {B, H, S, E}});
  auto grad_view = [&](int which) {
    return MutableTensorRef{packed_grad.data() + which * H * E,
                            DType::float64,
                            {B, H, L, E},
                            {L * 3 * H * E, E, 3 * H * E, 1}};
  };
  // grad_out laid out (B, L, H, E), like out_s: the same values as g.
  std::vector<double> g_s(n);
  const TensorRef g_view{g_s.data(), DType::float64, {B, H, L, E}, {L * H * E, E, H * E, 1}};
  {
    std::size_t i = 0;
    for (std::int64_t a = 0; a < B; ++a)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t l = 0; l < L; ++l)
          for (std::int64_t e = 0; e < E; ++e) g_s[a * L * H * E + h * E + l * H * E + e] = g[i++];
  }
  sdpa::attention_backward(q, k, v, &mask, os, ls, g_view, o, grad_view(0), grad_view(1),
                           grad_view(2));
  const std::vector<double>* expected[3] = {&dq, &dk, &dv};
  for (int w = 0; w < 3; ++w) {
    const MutableTensorRef gv = grad_view(w);
    const std::vector<double> got = copy_of(gv);
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], (*expected[w])[i]) << "gradient " << w << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, Strided,
                         ::testing::Values(Impl::fast, Impl::reference, Impl::naive));

std::string message_of(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                       const MutableTensorRef& out) {
  try {
    sdpa::attention_forward(q, k, v, nullptr, AttentionOptions{}, out);
  } catch (const sdpa::Error& e) {
    return e.what();
  }
  return "";
}

TEST(StridedErrors, NamedArgumentAndNothingWritten) {
  std::vector<double> a(64, 1.0), out(16, -7.0);
  const TensorRef q{a.data(), DType::float64, {4, 4}}, k = q, v = q;
  const MutableTensorRef o{out.data(), DType::float64, {4, 4}};
  TensorRef bad = q;
  bad.strides = {4};
  EXPECT_NE(message_of(bad, k, v, o).find("query: expected 2 strides"), std::string::npos);
  bad.strides = {1, 4};
  EXPECT_NE(message_of(q, bad, v, o).find("key: expected a contiguous last dimension"),
            std::string::npos);
  bad.strides = {-4, 1};
  EXPECT_NE(message_of(q, k, bad, o).find("value: expected strides >= 0"), std::string::npos);
  MutableTensorRef overlapping = o;
  overlapping.strides = {2, 1};
  EXPECT_NE(message_of(q, k, v, overlapping)
                .find("out: expected strides whose elements do not "
                      "overlap"),
            std::string::npos);
  for (double x : out) EXPECT_EQ(x, -7.0);
}

}  // namespace
