// The fused backward taking S = scale * (Q K^T) and dP = dO V^T from bfloat16 pairs on
// vdpbf16ps (flash.cpp's BackwardPairs), which it does for bfloat16 q, k, v and grad_out views,
// against the float64 reference on the same values and against the float32 products (float32
// views of the same values, which the kernel computes exactly as it does widened bfloat16). Both
// products' operands are exact in bfloat16, so the path must be as accurate as the float32 one:
// asserted, for dq, dk and dv on odd shapes, GQA, both causal alignments, masks, rows that see no
// key and every backward plan,
//   err(pairs) <= 2 err(float32 path) + (4 + min(max|lse|, 64)) eps max|ref|
// (the floor of tests/kernels/: lse is rounded to float32); and the results are bit-identical
// for 1 and 3 threads.
// On AMX (where the CPU has it, and again with the tiles turned off) all five products take
// pairs, P and dS as hi + lo bfloat16 (a relative 2^-16 each): there the bound gains
// 2^-14 max|ref|, which the split meets with an order of magnitude to spare (its errors measured
// 1e-6 to 2e-5 on these cases, max|ref| ~ 1) and one rounding of P and dS (2^-8) misses by one
// to two (1e-3 to 1e-2 measured). Inputs holding inf keep the products that skip zeros.
// Skipped on CPUs without AVX512_BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/test_util.h"
#include "core/problem.h"
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
using sdpa::test::max_abs;
using sdpa::test::max_abs_diff;

void round_to_bf16(Array& x) {
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data_as<float>()[i] = bf16::to_float(bf16::from_float(x.data_as<float>()[i]));
  }
}

bool same_bits(const Array& a, const Array& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * 4) == 0;
}

// The fused backward on a problem resolved from the float32 arrays; with bf16_views, q, k, v and
// grad_out are then read from bfloat16 copies of the same values (views of dtype bfloat16, as a
// bfloat16 call hands them over), which on this CPU takes the pairs.
sdpa::test::Outputs backward(const sdpa::test::Inputs& in, const sdpa::test::Outputs& fwd,
                             sdpa::AttentionOptions o, bool bf16_views) {
  o.impl = Impl::fast;
  sdpa::detail::Problem p =
      sdpa::detail::resolve_problem(in.q.ref(), in.k.ref(), in.v.ref(), in.mask_ref(), o);
  sdpa::test::Outputs r;
  r.dq = Array(DType::float32, in.q.shape());
  r.dk = Array(DType::float32, in.k.shape());
  r.dv = Array(DType::float32, in.v.shape());
  sdpa::detail::bind_backward(p, fwd.out.ref(), fwd.lse.ref(), in.dout.ref(), r.dq.mut(),
                              r.dk.mut(), r.dv.mut());
  std::vector<std::vector<std::uint16_t>> bits;
  if (bf16_views) {
    for (auto [view, a] : {std::pair{&p.q, &in.q}, std::pair{&p.k, &in.k}, std::pair{&p.v, &in.v},
                           std::pair{&p.dout, &in.dout}}) {
      std::vector<std::uint16_t>& h = bits.emplace_back(static_cast<std::size_t>(a->numel()));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = bf16::from_float(a->data_as<float>()[i]);
      view->data = h.data();  // C order: the strides, in elements, stay valid
      view->dtype = DType::bfloat16;
    }
  }
  sdpa::detail::fast_backward(p);
  return r;
}

void check_case(Case c, std::uint64_t seed, bool amx) {
  SCOPED_TRACE(c.name());
  sdpa::test::Inputs in = sdpa::test::make_inputs(c, DType::float32, seed);
  for (Array* a : {&in.q, &in.k, &in.v, &in.dout}) round_to_bf16(*a);
  sdpa::test::Inputs in64;
  in64.q = in.q.astype(DType::float64);
  in64.k = in.k.astype(DType::float64);
  in64.v = in.v.astype(DType::float64);
  in64.dout = in.dout.astype(DType::float64);
  in64.has_mask = in.has_mask;
  if (in.has_mask) in64.mask = in.mask.astype(in.mask.dtype());
  const sdpa::test::Outputs ref = sdpa::test::run(in64, c.options, Impl::reference);
  const sdpa::test::Outputs fwd = sdpa::test::run(in, c.options, Impl::fast, false);
  const sdpa::test::Outputs f32 = backward(in, fwd, c.options, false);
  const sdpa::test::Outputs bf = backward(in, fwd, c.options, true);
  c.options.threads = c.options.threads == 1 ? 3 : 1;
  const sdpa::test::Outputs other = backward(in, fwd, c.options, true);
  EXPECT_TRUE(same_bits(bf.dq, other.dq) && same_bits(bf.dk, other.dk) &&
              same_bits(bf.dv, other.dv))
      << "results depend on the thread count";
  const double max_lse = max_abs(ref.lse);
  const double eps = FLT_EPSILON;
  bool differs = false;
  for (const auto& [name, got, base, want] :
       {std::tuple{"dq", &bf.dq, &f32.dq, &ref.dq}, std::tuple{"dk", &bf.dk, &f32.dk, &ref.dk},
        std::tuple{"dv", &bf.dv, &f32.dv, &ref.dv}}) {
    const double err = max_abs_diff(*got, *want), err32 = max_abs_diff(*base, *want);
    const double floor = (4 + std::min(max_lse, 64.0)) * eps * max_abs(*want) +
                         (amx ? 0x1p-14 * max_abs(*want) : 0.0);
    EXPECT_LE(err, 2 * err32 + floor) << name << ": float32 path " << err32;
    differs = differs || !same_bits(*got, *base);
  }
  // The pairs were taken: a different order of summation changes some bits.
  if (c.L * c.S * c.E > 10000) {
    EXPECT_TRUE(differs) << "the bfloat16 path was not taken";
  }
}

TEST(BackwardBf16Pairs, AsAccurateAsTheFloat32Path) {
  if (!bf16::native()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const bf16::ScopedPairsInKernel pairs(1);  // on any AVX512_BF16 CPU, not only where chosen
  std::uint64_t seed = 50;
  const std::vector<std::array<std::int64_t, 4>> shapes{
      {113, 203, 33, 17}, {150, 90, 17, 33}, {64, 256, 64, 64}, {1, 1, 1, 1}};
  // The AMX tiles where the CPU has them, and vdpbf16ps.
  const std::vector<bool> amx_off_modes =
      bf16::amx() ? std::vector<bool>{false, true} : std::vector<bool>{true};
  for (const bool amx_off : amx_off_modes) {
    SCOPED_TRACE(amx_off ? "vdpbf16ps" : "amx");
    bf16::force_amx_off_for_test(amx_off);
    for (int chunks : {-1, 0, 1, 3}) {
      sdpa::detail::set_backward_chunks_for_test(chunks);
      for (const auto& [L, S, E, Ev] : shapes) {
        Case c;
        c.lead = {2};
        c.Hq = 4;
        c.Hkv = 2;
        c.L = L;
        c.S = S;
        c.E = E;
        c.Ev = Ev;
        c.options.enable_gqa = true;
        c.options.threads = 2;
        c.options.causal = seed % 3 == 0   ? Causal::none
                           : seed % 3 == 1 ? Causal::upper_left
                                           : Causal::lower_right;
        c.mask_kind = static_cast<int>(seed % 3);
        check_case(c, seed++, !amx_off);
      }
    }
    sdpa::detail::set_backward_chunks_for_test(-1);
    bf16::force_amx_off_for_test(false);
  }
}

// A key that every query is masked from, holding inf: its P and dS are exactly 0, and no
// product may turn 0 * inf into NaN (dQ = dS K would on whole tiles). On AMX the call keeps the
// products that skip zeros; the gradients stay finite and match the float32 path's bound.
TEST(BackwardBf16Pairs, InfInAMaskedKeyStaysOutOfTheGradients) {
  if (!bf16::native()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const bf16::ScopedPairsInKernel pairs(1);
  for (int chunks : {-1, 0}) {
    sdpa::detail::set_backward_chunks_for_test(chunks);
    Case c;
    c.L = 70;
    c.S = 150;
    c.E = 32;
    c.Ev = 32;
    c.mask_kind = 1;
    c.options.threads = 2;
    sdpa::test::Inputs in = sdpa::test::make_inputs(c, DType::float32, 900);
    for (Array* a : {&in.q, &in.k, &in.v, &in.dout}) round_to_bf16(*a);
    auto* m = in.mask.data_as<std::uint8_t>();
    const std::int64_t masked_key = 77;
    for (std::int64_t l = 0; l < c.L; ++l) m[l * c.S + masked_key] = 0;
    for (std::int64_t e = 0; e < c.E; ++e) {
      in.k.data_as<float>()[masked_key * c.E + e] = std::numeric_limits<float>::infinity();
    }
    const sdpa::test::Outputs fwd = sdpa::test::run(in, c.options, Impl::fast, false);
    const sdpa::test::Outputs bf = backward(in, fwd, c.options, true);
    EXPECT_TRUE(sdpa::test::all_finite(bf.dq) && sdpa::test::all_finite(bf.dk) &&
                sdpa::test::all_finite(bf.dv))
        << "chunks " << chunks;
  }
  sdpa::detail::set_backward_chunks_for_test(-1);
}

}  // namespace
