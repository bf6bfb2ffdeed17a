// The accuracy contract for 16-bit inputs (docs/precision.md), FlashAttention's rule:
//   err(fast) <= 2 * err(naive in the same precision) + floor
// for out, lse, dq, dk and dv, where err is the largest absolute difference from the float64
// reference run on the same (exactly converted) inputs, and the naive baseline is the
// three-pass attention with float32 products and every intermediate rounded to the query's
// dtype (core/half_naive.cpp, PyTorch's CPU composite). floor: 4 float32 epsilons of max|result|
// for out and lse, (4 + min(max|lse|, 64)) for the gradients (the floors of the float32
// contract in tests/kernels: whatever the fast path computes in float32 may differ from the
// naive baseline by its order of summation where the baseline's error happens to be tiny).
// Also, so that the rule has teeth: the naive baseline's error on out is that of a 16-bit
// computation (at least a tenth of an epsilon of the format, at most a few), and the fast
// error stays within 4 epsilons of the format (out) and 16 (gradients) of max|result|.
// Cases: odd shapes, every mask kind, both causal alignments with L < S and L > S, GQA, rows
// that see no key, mixed query/KV dtypes, strided inputs; on every compiled SIMD target for
// each dtype; thread counts give identical bits.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../common/test_util.h"
#include "core/half_attention.h"
#include "hwy/targets.h"
#include "kernels/decode.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_bf16.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::test::Case;
using sdpa::test::Inputs;
using sdpa::test::make_case;
using sdpa::test::max_abs;
using sdpa::test::max_abs_diff;
using sdpa::test::Outputs;
using sdpa::test::run;

constexpr Causal kCausals[] = {Causal::none, Causal::upper_left, Causal::lower_right};

double format_eps(DType d) {
  switch (d) {
    case DType::bfloat16:
      return std::ldexp(1.0, -7);
    case DType::float16:
      return std::ldexp(1.0, -10);
    case DType::float64:
      return DBL_EPSILON;
    default:
      return FLT_EPSILON;
  }
}

/// Inputs for case c: query (and dout) of dtype qd, key and value of dtype kvd, mask as
/// make_inputs makes it (bool, or additive float32 with some -inf). Values are drawn once in
/// float64 and rounded to each dtype.
Inputs make_mixed(const Case& c, DType qd, DType kvd, std::uint64_t seed) {
  Inputs in = sdpa::test::make_inputs(c, DType::float64, seed);
  in.q = in.q.astype(qd);
  in.dout = in.dout.astype(qd);
  in.k = in.k.astype(kvd);
  in.v = in.v.astype(kvd);
  if (c.mask_kind == 2) in.mask = in.mask.astype(DType::float32);
  return in;
}

Inputs as_float64(const Inputs& in) {
  Inputs d;
  d.q = in.q.astype(DType::float64);
  d.k = in.k.astype(DType::float64);
  d.v = in.v.astype(DType::float64);
  d.dout = in.dout.astype(DType::float64);
  d.has_mask = in.has_mask;
  if (in.has_mask) d.mask = in.mask.astype(in.mask.dtype());
  return d;
}

struct Errors {
  double fast = 0, naive = 0, scale = 0;
};

Errors errors(const Array& fast, const Array& naive, const Array& truth) {
  return {max_abs_diff(fast, truth), max_abs_diff(naive, truth), max_abs(truth)};
}

void expect_contract(const char* what, const Array& fast, const Array& naive, const Array& truth,
                     DType w, double floor_eps, double cap_eps, const std::string& name) {
  const Errors e = errors(fast, naive, truth);
  const double floor = floor_eps * FLT_EPSILON * e.scale;
  EXPECT_LE(e.fast, 2 * e.naive + floor)
      << name << " " << what << ": fast error " << e.fast << ", naive-" << sdpa::dtype_name(w)
      << " error " << e.naive << ", max|x| " << e.scale;
  EXPECT_LE(e.fast, cap_eps * format_eps(w) * e.scale + floor)
      << name << " " << what << ": fast error " << e.fast << ", max|x| " << e.scale;
}

/// Checks one case; returns the naive baseline's error on out relative to max|out|.
double check_case(const Case& c, DType qd, DType kvd, std::uint64_t seed,
                  bool with_backward = true) {
  const Inputs in = make_mixed(c, qd, kvd, seed);
  const Outputs truth = run(as_float64(in), c.options, Impl::reference, with_backward);
  const Outputs fast = run(in, c.options, Impl::fast, with_backward);
  const Outputs naive = run(in, c.options, Impl::naive, with_backward);
  const std::string name = c.name() + " q " + sdpa::dtype_name(qd) + " kv " +
                           sdpa::dtype_name(kvd) + " on " + sdpa::detail::fast_kernel_target();
  EXPECT_EQ(fast.out.dtype(), qd);
  EXPECT_EQ(fast.lse.dtype(), DType::float32);
  // W, the working precision, is the query's dtype; the rounding of the 16-bit KV inputs
  // is in the inputs themselves, which the reference reads too.
  const DType w = qd;
  expect_contract("out", fast.out, naive.out, truth.out, w, 4, 4, name);
  expect_contract("lse", fast.lse, naive.lse, truth.lse, w, 4, 4, name);
  if (with_backward) {
    const double floor_eps = 4 + std::min(max_abs(truth.lse), 64.0);
    expect_contract("dq", fast.dq, naive.dq, truth.dq, w, floor_eps, 16, name);
    // dk and dv are rounded to the KV dtype, whose epsilon bounds them when it is the coarser.
    const DType wk = format_eps(kvd) > format_eps(w) ? kvd : w;
    expect_contract("dk", fast.dk, naive.dk, truth.dk, wk, floor_eps, 16, name);
    expect_contract("dv", fast.dv, naive.dv, truth.dv, wk, floor_eps, 16, name);
  }
  const Errors e = errors(fast.out, naive.out, truth.out);
  return e.scale > 0 ? e.naive / e.scale : 0.0;
}

class HalfContract : public ::testing::TestWithParam<DType> {};

TEST_P(HalfContract, EveryMaskAndCausalAlignment) {
  const DType d = GetParam();
  std::uint64_t seed = 100;
  for (Causal causal : kCausals) {
    for (int mask_kind : {0, 1, 2}) {
      check_case(make_case(53, 97, 33, 40, causal, mask_kind), d, d, seed++);
      check_case(make_case(97, 53, 24, 24, causal, mask_kind), d, d, seed++);  // L > S
    }
  }
}

TEST_P(HalfContract, GroupedQueriesAndBroadcastMask) {
  const DType d = GetParam();
  Case c = make_case(70, 67, 16, 24, Causal::upper_left, 2);
  c.lead = {2};
  c.Hq = 4;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  c.mask_shape = {1, 70, 67};
  check_case(c, d, d, 200);
  Case g = make_case(40, 130, 64, 64, Causal::lower_right, 0);  // every head of 4 reads one K/V
  g.Hq = 4;
  g.Hkv = 1;
  g.options.enable_gqa = true;
  check_case(g, d, d, 201);
}

TEST_P(HalfContract, RowsThatSeeNoKeyGiveZeros) {
  const DType d = GetParam();
  // L > S with lower-right causal: the first L - S rows see no key; plus whole rows masked.
  Case c = make_case(90, 40, 17, 17, Causal::lower_right, 1);
  Inputs in = make_mixed(c, d, d, 7);
  auto* m = in.mask.data_as<std::uint8_t>();
  for (std::int64_t l = 60; l < 70; ++l) std::memset(m + l * c.S, 0, c.S);
  for (const Impl impl : {Impl::fast, Impl::naive, Impl::reference}) {
    const Outputs r = run(in, c.options, impl);
    for (std::int64_t l = 0; l < 70; ++l) {
      if (!(l < c.L - c.S || l >= 60)) continue;
      EXPECT_EQ(r.lse.data_as<float>()[l], -INFINITY) << sdpa::impl_name(impl) << " row " << l;
      for (std::int64_t e = 0; e < c.Ev; ++e) {
        ASSERT_EQ(sdpa::test::get(r.out, l * c.Ev + e), 0.0) << sdpa::impl_name(impl);
        ASSERT_EQ(sdpa::test::get(r.dq, l * c.E + e), 0.0) << sdpa::impl_name(impl);
      }
    }
    EXPECT_TRUE(sdpa::test::all_finite(r.dk) && sdpa::test::all_finite(r.dv));
  }
  check_case(c, d, d, 7);
}

// The baseline is a 16-bit computation: its error on out is of the order of the format's
// epsilon (so the rule above compares with a half-precision baseline, not a float32 one).
TEST_P(HalfContract, NaiveBaselineHasTheFormatsPrecision) {
  const DType d = GetParam();
  const double rel = check_case(make_case(64, 256, 64, 64, Causal::none, 0), d, d, 300, false);
  EXPECT_GE(rel, 0.1 * format_eps(d));
  EXPECT_LE(rel, 4 * format_eps(d));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfContract, ::testing::Values(DType::bfloat16, DType::float16),
                         [](const auto& info) {
                           return std::string(sdpa::dtype_name(info.param));
                         });

// A float32 or bfloat16 query reading a 16-bit KV cache.
TEST(HalfContractMixed, Float32OrBFloat16QueryWith16BitKeyValue) {
  std::uint64_t seed = 500;
  const std::pair<DType, DType> mixes[] = {{DType::float32, DType::bfloat16},
                                           {DType::float32, DType::float16},
                                           {DType::bfloat16, DType::float16}};
  for (const auto& [qd, kvd] : mixes) {
    Case c = make_case(37, 81, 20, 12, kCausals[seed % 3], static_cast<int>(seed % 3));
    c.Hq = 2;
    c.Hkv = 1;
    c.options.enable_gqa = true;
    check_case(c, qd, kvd, seed++);
    check_case(make_case(1, 200, 64, 64, Causal::none, 0), qd, kvd, seed++);  // decoding
  }
}

TEST(HalfContractTargets, EveryCompiledTarget) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    ASSERT_STREQ(sdpa::detail::fast_kernel_target(), hwy::TargetName(target));
    std::uint64_t seed = 600;
    for (const DType d : {DType::bfloat16, DType::float16}) {
      for (std::int64_t E : {1, 17, 80}) {
        check_case(
            make_case(45, 71, E, E == 17 ? 5 : E, kCausals[seed % 3], static_cast<int>(seed % 3)),
            d, d, seed);
        ++seed;
      }
      Case c = make_case(70, 67, 16, 24, Causal::lower_right, 1);
      c.Hq = 4;
      c.Hkv = 2;
      c.options.enable_gqa = true;
      check_case(c, d, d, seed++);
    }
    check_case(make_case(33, 50, 16, 16, Causal::upper_left, 2), DType::float32, DType::bfloat16,
               seed++);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// float16 inf and NaN are read as inf and NaN on every target: targets without F16C widen in
// software, where Highway's conversion read inf as 65536 and NaN as a finite number, so that
// rows the reference makes NaN or inf came out finite. An inf in a query row makes that row NaN,
// a NaN in a visible key the rows that see it, an inf in a value its column of the rows that see
// it; the fused kernel (L = 40) and the decode kernel (L = 5), float16 and float32 queries.
TEST(HalfNonFinite, InfAndNanReachTheirRowsOnEveryTarget) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const std::int64_t L : {40, 5}) {
      for (const DType qd : {DType::float16, DType::float32}) {
        const Case c = make_case(L, 29, 16, 16, Causal::lower_right, 0);
        Inputs in = make_mixed(c, qd, DType::float16, 77);
        sdpa::test::set(in.q, (L - 1) * 16 + 3, INFINITY);  // the last query row
        sdpa::test::set(in.k, 20 * 16, NAN);                // key 20
        sdpa::test::set(in.v, 15 * 16 + 5, -INFINITY);      // value 15, column 5
        const Outputs truth = run(in, c.options, Impl::reference, false);
        const Outputs fast = run(in, c.options, Impl::fast, false);
        const std::string name =
            c.name() + " q " + sdpa::dtype_name(qd) + " on " + sdpa::detail::fast_kernel_target();
        ASSERT_FALSE(sdpa::test::all_finite(truth.out)) << name;
        // max_abs_diff counts a NaN or inf in one and not the other as an infinite error.
        EXPECT_LE(max_abs_diff(fast.out, truth.out), 8 * format_eps(qd) * max_abs(truth.out))
            << name;
        EXPECT_LE(max_abs_diff(fast.lse, truth.lse), 8 * FLT_EPSILON * max_abs(truth.lse)) << name;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A row whose softmax is one-hot (one visible key, or a scale so large that one score
// dominates) has exactly zero dq and dk in the maths and in the reference: dP - D is 0 when out
// equals the one value row. The fast backward gives exact zeros for every dtype mix, on every
// compiled target, with the bfloat16 pairs on and off: D takes the arithmetic of dP's product,
// and a bfloat16 out coarser than its float16 values is recomputed.
TEST(HalfOneHotRows, GiveExactlyZeroQueryAndKeyGradients) {
  const std::pair<DType, DType> mixes[] = {{DType::bfloat16, DType::bfloat16},
                                           {DType::float16, DType::float16},
                                           {DType::float32, DType::bfloat16},
                                           {DType::float32, DType::float16},
                                           {DType::bfloat16, DType::float16}};
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  for (const int pairs : {0, 1}) {
    sdpa::detail::bf16::force_pairs_in_kernel_for_test(pairs);
    for (std::int64_t target : targets) {
      hwy::SetSupportedTargetsForTest(target);
      std::uint64_t seed = 900;
      for (const auto& [qd, kvd] : mixes) {
        for (const bool huge_scale : {false, true}) {
          // One key per row; or 40 keys and a scale of 1e8 (P one-hot to the last bit).
          Case c = make_case(37, huge_scale ? 40 : 1, 24, 17, Causal::none, 0);
          if (huge_scale) c.options.scale = 1e8;
          const Inputs in = make_mixed(c, qd, kvd, seed++);
          const Outputs fast = run(in, c.options, Impl::fast, true);
          const std::string name = std::string("q ") + sdpa::dtype_name(qd) + " kv " +
                                   sdpa::dtype_name(kvd) + (huge_scale ? " scale 1e8" : " S 1") +
                                   " pairs " + std::to_string(pairs) + " on " +
                                   sdpa::detail::fast_kernel_target();
          EXPECT_EQ(max_abs(fast.dq), 0.0) << name;
          EXPECT_EQ(max_abs(fast.dk), 0.0) << name;
          EXPECT_TRUE(sdpa::test::all_finite(fast.dv) && max_abs(fast.dv) > 0) << name;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  sdpa::detail::bf16::force_pairs_in_kernel_for_test(-1);
}

bool bit_identical(const Array& a, const Array& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(HalfContractThreads, IdenticalForEveryThreadCount) {
  Case c = make_case(150, 130, 32, 32, Causal::upper_left, 2);
  c.Hq = 3;
  c.Hkv = 3;
  for (const DType d : {DType::bfloat16, DType::float16}) {
    const Inputs in = make_mixed(c, d, d, 42);
    for (const Impl impl : {Impl::fast, Impl::naive}) {
      c.options.threads = 1;
      const Outputs one = run(in, c.options, impl);
      for (int t : {2, 3}) {
        c.options.threads = t;
        const Outputs r = run(in, c.options, impl);
        EXPECT_TRUE(bit_identical(one.out, r.out) && bit_identical(one.lse, r.lse) &&
                    bit_identical(one.dq, r.dq) && bit_identical(one.dk, r.dk) &&
                    bit_identical(one.dv, r.dv))
            << sdpa::impl_name(impl) << " " << sdpa::dtype_name(d) << " threads " << t;
      }
    }
  }
}

// Decode-sized calls (L <= 16) read their 16-bit K and V where they lie (the decode kernel
// widens them in registers): out is the float32 call on the widened values rounded once, lse
// that call's lse, bit for bit, on every compiled target: uniform and mixed dtypes (a float32
// or bfloat16 query), GQA, both causal alignments, a bool
// and a float32 mask, (B, L, H, E) views, and the page order of the decode's keys
// (docs/kernel.md) forced both ways.
TEST(HalfDecode, DecodeSizedCallsEqualTheirWidenedFloat32) {
  const std::int64_t B = 2, Hq = 8, Hkv = 2, S = 300, E = 64;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (auto order : {sdpa::detail::DecodeKeyOrder::memory, sdpa::detail::DecodeKeyOrder::page}) {
      sdpa::detail::set_decode_key_order(order);
      std::uint64_t seed = 900;
      // (query, key and value): uniform, and the mixed pairs the dtype rule takes.
      const std::pair<DType, DType> pairs[] = {{DType::bfloat16, DType::bfloat16},
                                               {DType::float16, DType::float16},
                                               {DType::float32, DType::bfloat16},
                                               {DType::float32, DType::float16},
                                               {DType::bfloat16, DType::float16}};
      for (const auto& [qd, d] : pairs) {
        for (const std::int64_t L : {1, 5, 16}) {
          for (int variant = 0; variant < 4; ++variant) {
            SCOPED_TRACE(testing::Message()
                         << sdpa::dtype_name(qd) << "/" << sdpa::dtype_name(d) << " L " << L
                         << " variant " << variant << " target " << hwy::TargetName(target)
                         << " order " << static_cast<int>(order));
            // variant 0: (B, L, H, E) views, causal lower-right; 1: a bool mask; 2: a float32
            // mask, causal upper-left; 3: C order, no mask.
            const bool views = variant == 0;
            const Array q = sdpa::test::random_array(qd, {B, L, Hq, E}, seed++);
            const Array k = sdpa::test::random_array(d, {B, S, Hkv, E}, seed++);
            const Array v = sdpa::test::random_array(d, {B, S, Hkv, E}, seed++);
            const auto ref = [&](const Array& a, std::int64_t H, std::int64_t n) {
              if (views) {
                return sdpa::TensorRef{a.data(), a.dtype(), {B, H, n, E}, {n * H * E, E, H * E, 1}};
              }
              return sdpa::TensorRef{a.data(), a.dtype(), {B, H, n, E}};
            };
            std::optional<Array> mask;
            if (variant == 1) mask = sdpa::test::random_array(DType::boolean, {B, 1, L, S}, seed++);
            if (variant == 2) mask = sdpa::test::random_array(DType::float32, {L, S}, seed++);
            const sdpa::TensorRef mref = mask ? mask->ref() : sdpa::TensorRef{};
            sdpa::AttentionOptions o;
            o.enable_gqa = true;
            o.causal = variant == 0   ? Causal::lower_right
                       : variant == 2 ? Causal::upper_left
                                      : Causal::none;
            Array out(qd, {B, Hq, L, E}), lse(DType::float32, {B, Hq, L});
            const sdpa::MutableTensorRef lse_m = lse.mut();
            sdpa::attention_forward(ref(q, Hq, L), ref(k, Hkv, S), ref(v, Hkv, S),
                                    mask ? &mref : nullptr, o, out.mut(), &lse_m);
            const Array q32 = q.astype(DType::float32), k32 = k.astype(DType::float32),
                        v32 = v.astype(DType::float32);
            Array out32(DType::float32, {B, Hq, L, E}), lse32(DType::float32, {B, Hq, L});
            const sdpa::MutableTensorRef lse32_m = lse32.mut();
            sdpa::attention_forward(ref(q32, Hq, L), ref(k32, Hkv, S), ref(v32, Hkv, S),
                                    mask ? &mref : nullptr, o, out32.mut(), &lse32_m);
            EXPECT_TRUE(bit_identical(out, out32.astype(qd))) << "out";
            EXPECT_TRUE(bit_identical(lse, lse32)) << "lse";
          }
        }
      }
    }
  }
  sdpa::detail::set_decode_key_order(sdpa::detail::DecodeKeyOrder::automatic);
  hwy::SetSupportedTargetsForTest(0);
}

// A (B, L, H, E) view of 16-bit data gives the bits of the same data in C order.
TEST(HalfContractStrided, TransposedViewsGiveTheSameBits) {
  const std::int64_t B = 2, H = 3, L = 19, S = 23, E = 8;
  for (const DType d : {DType::bfloat16, DType::float16}) {
    const Array q = sdpa::test::random_array(d, {B, L, H, E}, 1);
    const Array k = sdpa::test::random_array(d, {B, S, H, E}, 2);
    const Array v = sdpa::test::random_array(d, {B, S, H, E}, 3);
    auto view = [&](const Array& a, std::int64_t n) {
      return sdpa::TensorRef{a.data(), d, {B, H, n, E}, {n * H * E, E, H * E, 1}};
    };
    auto copy = [&](const Array& a, std::int64_t n) {
      return sdpa::detail::converted_copy(view(a, n), d);
    };
    for (const Impl impl : {Impl::fast, Impl::naive, Impl::reference}) {
      sdpa::AttentionOptions o;
      o.impl = impl;
      Array out_view(d, {B, H, L, E}), out_copy(d, {B, H, L, E});
      sdpa::attention_forward(view(q, L), view(k, S), view(v, S), nullptr, o, out_view.mut());
      const Array qc = copy(q, L), kc = copy(k, S), vc = copy(v, S);
      sdpa::attention_forward(qc, kc, vc, nullptr, o, out_copy.mut());
      EXPECT_TRUE(bit_identical(out_view, out_copy)) << sdpa::impl_name(impl);
    }
  }
}

}  // namespace
