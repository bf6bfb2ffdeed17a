// The fused forward on bfloat16 operands (flash.cpp's ForwardBf16Native, which fast_forward
// takes for bfloat16 views, on AMX tiles where the CPU has them and on vdpbf16ps) against the
// float64 reference run on the same bfloat16 values, on odd shapes (E and key tiles odd, so the
// zero pad pairs are used), GQA, both causal alignments, boolean and additive masks, fully
// masked rows, and NaN stored in masked-out values. Asserted:
//   the accuracy contract for 16-bit inputs, FlashAttention's rule, on out and lse:
//     err(bfloat16 forward) <= 2 * err(naive three-pass bfloat16) + floor
//   err being the largest absolute difference from the float64 reference, the naive baseline
//   the public Impl::naive on the same bfloat16 values (float32 products, every intermediate
//   rounded to bfloat16: core/half_naive.cpp), floor 4 float32 epsilons of max|result| (as in
//   tests/half/test_half_contract.cpp, which asserts the rule through the public API);
//   and, so that the rule has teeth, |out - ref| <= 2^-7 max|v| (P rounded to bfloat16: 2^-9
//   relative per probability; out rounded: 2^-9 relative; a wrong pair or pad gives errors of
//   order max|v|) and |lse - ref| <= 1e-5 (1 + |ref|) (lse comes from float32 sums of exact
//   bfloat16 products); rows that see no key give out = 0 and lse = -inf.
// Skipped on CPUs without AVX512_BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../common/test_util.h"
#include "core/problem.h"
#include "hwy/targets.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_bf16.h"
#include "kernels/kernels.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

namespace bf16 = sdpa::detail::bf16;
using sdpa::Array;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::test::Case;
using sdpa::test::make_case;

// x rounded to bfloat16 in place (float32 array); returns the bits.
std::vector<std::uint16_t> round_to_bf16(Array& x) {
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(x.numel()));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    bits[i] = bf16::from_float(x.data_as<float>()[i]);
    x.data_as<float>()[i] = bf16::to_float(bits[i]);
  }
  return bits;
}

void check_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name());
  sdpa::test::Inputs in = sdpa::test::make_inputs(c, DType::float32, seed);
  const std::vector<std::uint16_t> qh = round_to_bf16(in.q), kh = round_to_bf16(in.k);
  std::vector<std::uint16_t> vh = round_to_bf16(in.v);
  if (c.mask_kind == 1 && c.S > 3) {
    // NaN in a value that the boolean mask hides from every query must not leak (the tile then
    // takes the product that skips zero probabilities).
    bool hidden = true;
    for (std::int64_t i = 0; i < in.mask.numel() && hidden; i += c.S) {
      hidden = in.mask.data_as<std::uint8_t>()[i + 2] == 0;
    }
    if (hidden) vh[2 * c.Ev] = 0x7fc0;
  }
  const Array q64 = in.q.astype(DType::float64), k64 = in.k.astype(DType::float64);
  Array v64 = in.v.astype(DType::float64);
  const sdpa::test::Outputs ref =
      sdpa::test::run_forward(q64, k64, v64, in.mask_ref(), c.options, Impl::reference);

  sdpa::AttentionOptions o = c.options;
  o.impl = Impl::fast;
  const sdpa::detail::Problem p0 =
      sdpa::detail::resolve_problem(in.q.ref(), in.k.ref(), in.v.ref(), in.mask_ref(), o);
  sdpa::detail::Problem p = p0;
  // Shapes and strides from float32 stand-ins; the data pointers then point at the bfloat16
  // arrays of the same shapes (C order: the strides, in elements, are the same).
  Array out_f(DType::float32, ref.out.shape()), lse_f(DType::float32, ref.lse.shape());
  const sdpa::MutableTensorRef lse_ref = lse_f.mut();
  sdpa::detail::bind_forward(p, out_f.mut(), &lse_ref);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(ref.out.numel()), 0xffff);
  p.q.data = qh.data();
  p.k.data = kh.data();
  p.v.data = vh.data();
  p.out.data = out.data();
  p.q.dtype = p.k.dtype = p.v.dtype = p.out.dtype = DType::bfloat16;
  p.dtype = DType::bfloat16;
  ASSERT_TRUE(sdpa::detail::fast_forward_reads_bfloat16(p));
  std::fill_n(lse_f.data_as<float>(), lse_f.numel(), 12345.f);
  sdpa::detail::fast_forward(p);
  const float* lse = lse_f.data_as<float>();

  // The naive bfloat16 baseline on the same values (without the NaN hidden above: its BLAS
  // products do not skip masked keys, and the exact result does not depend on that value).
  const sdpa::test::Outputs naive =
      sdpa::test::run_forward(in.q.astype(DType::bfloat16), in.k.astype(DType::bfloat16),
                              in.v.astype(DType::bfloat16), in.mask_ref(), c.options, Impl::naive);
  const Array naive_out = naive.out.astype(DType::float64);
  double err_fast = 0, err_naive = 0, out_scale = 0, lse_fast = 0, lse_naive = 0, lse_scale = 0;
  for (std::int64_t i = 0; i < ref.out.numel(); ++i) {
    const double r = ref.out.data_as<double>()[i];
    err_fast = std::max(err_fast, std::fabs(bf16::to_float(out[static_cast<std::size_t>(i)]) - r));
    err_naive = std::max(err_naive, std::fabs(naive_out.data_as<double>()[i] - r));
    out_scale = std::max(out_scale, std::fabs(r));
  }
  for (std::int64_t i = 0; i < ref.lse.numel(); ++i) {
    const double r = ref.lse.data_as<double>()[i];
    if (std::isinf(r)) continue;  // asserted exactly below
    lse_fast = std::max(lse_fast, std::fabs(double(lse_f.data_as<float>()[i]) - r));
    lse_naive = std::max(lse_naive, std::fabs(double(naive.lse.data_as<float>()[i]) - r));
    lse_scale = std::max(lse_scale, std::fabs(r));
  }
  EXPECT_LE(err_fast, 2 * err_naive + 4 * FLT_EPSILON * out_scale)
      << "out: vdpbf16ps error " << err_fast << ", naive-bfloat16 error " << err_naive;
  EXPECT_LE(lse_fast, 2 * lse_naive + 4 * FLT_EPSILON * lse_scale)
      << "lse: vdpbf16ps error " << lse_fast << ", naive-bfloat16 error " << lse_naive;

  const double vmax = sdpa::test::max_abs(in.v);
  for (std::int64_t i = 0; i < ref.out.numel(); ++i) {
    const double r = ref.out.data_as<double>()[i];
    const double got = bf16::to_float(out[static_cast<std::size_t>(i)]);
    ASSERT_LE(std::fabs(got - r), 0x1p-7 * vmax) << "out[" << i << "] = " << got << " vs " << r;
  }
  for (std::int64_t i = 0; i < ref.lse.numel(); ++i) {
    const double r = ref.lse.data_as<double>()[i];
    const double got = lse[static_cast<std::size_t>(i)];
    if (std::isinf(r)) {
      ASSERT_EQ(got, r) << "lse[" << i << "]";
      continue;
    }
    ASSERT_LE(std::fabs(got - r), 1e-5 * (1 + std::fabs(r))) << "lse[" << i << "]";
  }
}

// The kernels of the bfloat16 products this CPU has, by the value to give
// force_amx_off_for_test: the AMX tiles (false) where it has them, vdpbf16ps (true).
std::vector<bool> AmxOffModes() {
  return bf16::amx() ? std::vector<bool>{false, true} : std::vector<bool>{true};
}

TEST(ForwardBf16, MatchesReferenceOnOddShapes) {
  if (!bf16::native()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const bf16::ScopedPairsInKernel pairs(1);  // on any AVX512_BF16 CPU, not only where chosen
  for (const bool amx_off : AmxOffModes()) {
    SCOPED_TRACE(amx_off ? "vdpbf16ps" : "amx");
    bf16::force_amx_off_for_test(amx_off);
    std::uint64_t seed = 1;
    for (const auto& [L, S, E, Ev] : std::vector<std::array<std::int64_t, 4>>{{113, 203, 33, 17},
                                                                              {1, 1, 1, 1},
                                                                              {64, 128, 64, 64},
                                                                              {70, 300, 128, 80},
                                                                              {150, 90, 17, 33}}) {
      for (Causal causal : {Causal::none, Causal::upper_left, Causal::lower_right}) {
        for (int mask_kind : {0, 1, 2}) {
          Case c = make_case(L, S, E, Ev, causal, mask_kind);
          c.lead = {2};
          c.Hq = 4;
          c.Hkv = 2;
          c.options.threads = 2;
          c.options.enable_gqa = true;
          check_case(c, seed++);
          if (HasFatalFailure()) break;
        }
      }
    }
    bf16::force_amx_off_for_test(false);
    if (HasFatalFailure()) return;
  }
}

// The softmax and masking around the bfloat16 products run on the dispatched Highway target:
// every compiled one (the scalar one included), on one GQA case with a mask and a short tile.
TEST(ForwardBf16, EveryCompiledTarget) {
  if (!bf16::native()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const bf16::ScopedPairsInKernel pairs(1);  // on any AVX512_BF16 CPU, not only where chosen
  std::uint64_t seed = 100;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const bool amx_off : AmxOffModes()) {
      SCOPED_TRACE(amx_off ? "vdpbf16ps" : "amx");
      bf16::force_amx_off_for_test(amx_off);
      Case c = make_case(70, 150, 19, 24, Causal::lower_right, 2);
      c.Hq = 4;
      c.Hkv = 2;
      c.options.enable_gqa = true;
      check_case(c, seed++);
      if (HasFatalFailure()) break;
    }
    bf16::force_amx_off_for_test(false);
    if (HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
