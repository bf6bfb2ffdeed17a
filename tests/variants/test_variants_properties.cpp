// Properties of the attention variants over sampled combinations (rapidcheck): window + causal +
// GQA + mask + softcap + ALiBi + sinks + dropout + variable-length batches.
//   - the fused kernel agrees with the float64 reference (forward and backward);
//   - a window is the boolean mask that spells it out, and ALiBi the additive mask
//     -slope * |i + d - j| (the fused kernel, on the same inputs);
//   - a variable-length batch is each of its sequences computed on its own.
// ctest sets RC_PARAMS (seed and case count), so runs are reproducible.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "../common/test_util.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"
#include "sdpa/varlen.h"

namespace {

using sdpa::Array;
using sdpa::AttentionOptions;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::MutableTensorRef;
using sdpa::TensorRef;
using sdpa::test::Case;
using sdpa::test::Inputs;

Case gen_case() {
  Case c;
  c.Hkv = *rc::gen::inRange<std::int64_t>(1, 3);
  c.Hq = c.Hkv * *rc::gen::inRange<std::int64_t>(1, 3);
  c.options.enable_gqa = c.Hq != c.Hkv;
  if (*rc::gen::arbitrary<bool>()) c.lead = {*rc::gen::inRange<std::int64_t>(1, 3)};
  c.L = *rc::gen::inRange<std::int64_t>(1, 150);
  c.S = *rc::gen::inRange<std::int64_t>(1, 300);
  c.E = *rc::gen::inRange<std::int64_t>(1, 20);
  c.Ev = *rc::gen::inRange<std::int64_t>(1, 20);
  c.options.causal = static_cast<Causal>(*rc::gen::inRange(0, 3));
  c.mask_kind = *rc::gen::inRange(0, 3);
  c.options.window_left = *rc::gen::inRange<std::int64_t>(-1, 120);
  c.options.window_right = *rc::gen::inRange<std::int64_t>(-1, 120);
  if (*rc::gen::arbitrary<bool>()) c.options.softcap = *rc::gen::inRange(1, 60) / 10.0;
  const std::int64_t B = c.lead.empty() ? 1 : c.lead[0];
  if (*rc::gen::arbitrary<bool>()) {
    const std::int64_t n = *rc::gen::arbitrary<bool>() ? c.Hq : B * c.Hq;
    for (std::int64_t i = 0; i < n; ++i) {
      c.options.alibi_slopes.push_back(*rc::gen::inRange(1, 100) / 100.0);
    }
  }
  if (*rc::gen::arbitrary<bool>()) {
    for (std::int64_t i = 0; i < c.Hq; ++i) {
      c.options.sinks.push_back(*rc::gen::inRange(-30, 30) / 10.0);
    }
  }
  if (*rc::gen::arbitrary<bool>()) {
    c.options.dropout_p = *rc::gen::inRange(1, 60) / 100.0;
    c.options.seed = *rc::gen::inRange<std::uint64_t>(0, 1000);
  }
  return c;
}

struct Result {
  Array out, lse, dq, dk, dv;
};

Result run(const Inputs& in, AttentionOptions o, Impl impl, const TensorRef* mask) {
  o.impl = impl;
  Result r;
  r.out = Array(in.q.dtype(), sdpa::attention_output_shape(in.q, in.k, in.v, o));
  r.lse = Array(in.q.dtype(), sdpa::attention_lse_shape(in.q));
  const MutableTensorRef lse = r.lse.mut();
  sdpa::attention_forward(in.q, in.k, in.v, mask, o, r.out.mut(), &lse);
  r.dq = Array(in.q.dtype(), in.q.shape());
  r.dk = Array(in.k.dtype(), in.k.shape());
  r.dv = Array(in.v.dtype(), in.v.shape());
  sdpa::attention_backward(in.q, in.k, in.v, mask, r.out, r.lse, in.dout, o, r.dq.mut(), r.dk.mut(),
                           r.dv.mut());
  return r;
}

double rel_err(const Array& got, const Array& want) {
  return sdpa::test::max_abs_diff(got.astype(DType::float64), want.astype(DType::float64)) /
         std::max(1.0, sdpa::test::max_abs(want));
}

Inputs to64(const Inputs& in) {
  Inputs d;
  d.q = in.q.astype(DType::float64);
  d.k = in.k.astype(DType::float64);
  d.v = in.v.astype(DType::float64);
  d.dout = in.dout.astype(DType::float64);
  d.has_mask = in.has_mask;
  if (in.has_mask) d.mask = in.mask.astype(in.mask.dtype());
  return d;
}

RC_GTEST_PROP(VariantProperties, FastAgreesWithReference, ()) {
  const Case c = gen_case();
  const auto seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, seed);
  const Inputs in64 = to64(in);
  const Result fast = run(in, c.options, Impl::fast, in.mask_ref());
  const Result ref = run(in64, c.options, Impl::reference, in64.mask_ref());
  const double lse_floor =
      std::min(sdpa::test::max_abs(ref.lse), 64.0) * 1.2e-7;  // see tests/kernels
  RC_ASSERT(rel_err(fast.out, ref.out) <= 2e-5);
  RC_ASSERT(rel_err(fast.lse, ref.lse) <= 2e-5);
  RC_ASSERT(rel_err(fast.dq, ref.dq) <= 2e-5 + lse_floor);
  RC_ASSERT(rel_err(fast.dk, ref.dk) <= 2e-5 + lse_floor);
  RC_ASSERT(rel_err(fast.dv, ref.dv) <= 2e-5 + lse_floor);
}

RC_GTEST_PROP(VariantProperties, WindowAndAlibiAreTheirMasks, ()) {
  Case c = gen_case();
  c.mask_kind = 0;
  c.options.softcap = 0.0;  // ALiBi is added after the softcap: a mask only spells it without
  c.options.dropout_p = 0.0;
  const Inputs in = sdpa::test::make_inputs(c, DType::float32, *rc::gen::inRange(0, 1000));
  const std::int64_t B = c.lead.empty() ? 1 : c.lead[0];
  // The additive mask (B, Hq, L, S): -inf outside the window, -slope * |i + d - j| inside.
  Array mask(DType::float32, c.shape(c.Hq, c.L, c.S));
  const std::int64_t d = c.S - c.L;
  const auto& w = c.options;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      const double slope =
          w.alibi_slopes.empty()
              ? 0.0
              : w.alibi_slopes[static_cast<std::size_t>(
                    (static_cast<std::int64_t>(w.alibi_slopes.size()) == c.Hq ? 0 : b * c.Hq) + h)];
      for (std::int64_t i = 0; i < c.L; ++i) {
        for (std::int64_t j = 0; j < c.S; ++j) {
          const bool in_window = (w.window_left < 0 || j >= i + d - w.window_left) &&
                                 (w.window_right < 0 || j <= i + d + w.window_right);
          mask.data_as<float>()[((b * c.Hq + h) * c.L + i) * c.S + j] =
              in_window ? static_cast<float>(-slope * double(std::abs(i + d - j))) : -INFINITY;
        }
      }
    }
  }
  AttentionOptions spelled = c.options;
  spelled.window_left = spelled.window_right = -1;
  spelled.alibi_slopes.clear();
  const TensorRef mask_ref = mask.ref();
  const Result a = run(in, c.options, Impl::fast, nullptr);
  const Result b = run(in, spelled, Impl::fast, &mask_ref);
  RC_ASSERT(rel_err(a.out, b.out) <= 1e-5);
  RC_ASSERT(rel_err(a.lse, b.lse) <= 1e-5);
  RC_ASSERT(rel_err(a.dq, b.dq) <= 1e-4);
  RC_ASSERT(rel_err(a.dk, b.dk) <= 1e-4);
  RC_ASSERT(rel_err(a.dv, b.dv) <= 1e-4);
}

RC_GTEST_PROP(VariantProperties, VarlenIsEachSequenceOnItsOwn, ()) {
  Case c = gen_case();
  c.lead.clear();
  c.mask_kind = 0;
  if (c.options.alibi_slopes.size() != static_cast<std::size_t>(c.Hq))
    c.options.alibi_slopes.clear();
  const auto B = *rc::gen::inRange<std::int64_t>(1, 4);
  std::vector<std::int64_t> cu_q{0}, cu_k{0};
  for (std::int64_t b = 0; b < B; ++b) {
    cu_q.push_back(cu_q.back() + *rc::gen::inRange<std::int64_t>(0, 90));
    cu_k.push_back(cu_k.back() + *rc::gen::inRange<std::int64_t>(1, 150));
  }
  const std::int64_t tq = cu_q.back(), tk = cu_k.back();
  const auto seed = *rc::gen::inRange<std::uint64_t>(0, 1000);
  const Array q = sdpa::test::random_array(DType::float32, {tq, c.Hq, c.E}, seed + 1);
  const Array k = sdpa::test::random_array(DType::float32, {tk, c.Hkv, c.E}, seed + 2);
  const Array v = sdpa::test::random_array(DType::float32, {tk, c.Hkv, c.Ev}, seed + 3);
  AttentionOptions o = c.options;
  o.enable_gqa = true;
  Array out(DType::float32, {tq, c.Hq, c.Ev}), lse(DType::float32, {c.Hq, tq});
  const MutableTensorRef lse_ref = lse.mut();
  sdpa::attention_varlen_forward(q, k, v, cu_q, cu_k, 150, 150, o, out.mut(), &lse_ref);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = cu_q[b + 1] - cu_q[b], S = cu_k[b + 1] - cu_k[b];
    if (L == 0) continue;
    // The sequence transposed to (H, L, E), run alone. Its dropout is counted as batch 0, so
    // the comparison runs without dropout.
    auto slice = [](const Array& a, std::int64_t r0, std::int64_t n) {
      const std::int64_t H = a.shape()[1], D = a.shape()[2];
      Array t(DType::float32, {H, n, D});
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t e = 0; e < D; ++e)
            t.data_as<float>()[(h * n + r) * D + e] =
                a.data_as<float>()[((r0 + r) * H + h) * D + e];
      return t;
    };
    AttentionOptions alone = o;
    alone.dropout_p = 0.0;
    AttentionOptions packed = o;
    packed.dropout_p = 0.0;
    Array o1(DType::float32, {tq, c.Hq, c.Ev});
    sdpa::attention_varlen_forward(q, k, v, cu_q, cu_k, 150, 150, packed, o1.mut());
    const Array sq = slice(q, cu_q[b], L), sk = slice(k, cu_k[b], S), sv = slice(v, cu_k[b], S);
    Array want(DType::float32, {c.Hq, L, c.Ev});
    sdpa::attention_forward(sq, sk, sv, nullptr, alone, want.mut());
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t r = 0; r < L; ++r)
        for (std::int64_t e = 0; e < c.Ev; ++e)
          RC_ASSERT(o1.data_as<float>()[((cu_q[b] + r) * c.Hq + h) * c.Ev + e] ==
                    want.data_as<float>()[(h * L + r) * c.Ev + e]);
  }
}

}  // namespace
