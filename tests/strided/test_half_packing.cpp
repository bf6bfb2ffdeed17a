// The fused kernel reads float16 and bfloat16 operands itself (widened exactly while packing,
// float32 arithmetic, P kept in float32) and rounds its outputs to their dtypes to nearest even,
// on every compiled SIMD target: so its results on 16-bit inputs are, bit for bit, the float32
// kernel's results on the widened values, rounded once. Checked forward (out, lse float32) and
// backward (dq, dk, dv in their inputs' dtypes, grad_out and out read in 16 bits), for float16,
// bfloat16 and a float32 query against a bfloat16 key/value, through strided (B, L, H, E) views.
// The kernel is called directly on a Problem whose views say the dtypes (the public API's dtype
// rules are core/problem.cpp's), against the public float32 call as the expectation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/problem.h"
#include "hwy/highway.h"
#include "kernels/gemm_bf16.h"
#include "kernels/kernels.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::DType;
using sdpa::MutableTensorRef;
using sdpa::TensorRef;
using sdpa::detail::InputView;
using sdpa::detail::OutputView;
using std::int64_t;

// One operand (B, H, N, W): its values widened to float (C order), and its storage laid out
// (B, N, H, W) in `dtype` (float32 or a 16-bit type).
struct Operand {
  int64_t B, H, N, W;
  DType dtype;
  std::vector<float> value;        // C order (B, H, N, W): the exact values stored
  std::vector<std::uint16_t> u16;  // storage when 16-bit
  std::vector<float> f32;          // storage when float32

  Operand(int64_t b, int64_t h, int64_t n, int64_t w, DType dt)
      : B(b), H(h), N(n), W(w), dtype(dt), value(static_cast<std::size_t>(b * h * n * w)) {
    if (dt == DType::float32) {
      f32.assign(value.size(), 0.0f);
    } else {
      u16.assign(value.size(), 0);
    }
  }
  std::size_t stored(int64_t b, int64_t h, int64_t n, int64_t w) const {
    return static_cast<std::size_t>(((b * N + n) * H + h) * W + w);
  }
  std::size_t c_order(int64_t b, int64_t h, int64_t n, int64_t w) const {
    return static_cast<std::size_t>(((b * H + h) * N + n) * W + w);
  }
  // Stores x rounded to the dtype; value[] gets the stored number.
  void set(int64_t b, int64_t h, int64_t n, int64_t w, float x) {
    float v = x;
    if (dtype == DType::float16) {
      u16[stored(b, h, n, w)] = sdpa::detail::float_to_float16(x);
      v = sdpa::detail::float16_to_float(u16[stored(b, h, n, w)]);
    } else if (dtype == DType::bfloat16) {
      u16[stored(b, h, n, w)] = sdpa::detail::float_to_bfloat16(x);
      v = sdpa::detail::bfloat16_to_float(u16[stored(b, h, n, w)]);
    } else {
      f32[stored(b, h, n, w)] = x;
    }
    value[c_order(b, h, n, w)] = v;
  }
  void fill(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t w = 0; w < W; ++w) set(b, h, n, w, d(rng));
  }
  void* data() { return dtype == DType::float32 ? static_cast<void*>(f32.data()) : u16.data(); }
  InputView in() {
    InputView v;
    v.data = data();
    v.dtype = dtype;
    v.sb = N * H * W;
    v.sh = W;
    v.sl = H * W;
    return v;
  }
  OutputView out() {
    OutputView v;
    v.data = data();
    v.dtype = dtype;
    v.sb = N * H * W;
    v.sh = W;
    v.sl = H * W;
    return v;
  }
  TensorRef widened() const { return TensorRef{value.data(), DType::float32, {B, H, N, W}}; }
  // The stored bits in C order, as 32-bit words (float32 bits, or the 16-bit pattern).
  std::vector<std::uint32_t> bits() const {
    std::vector<std::uint32_t> r;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t w = 0; w < W; ++w) {
            const std::size_t i = stored(b, h, n, w);
            if (dtype == DType::float32) {
              std::uint32_t u;
              std::memcpy(&u, &f32[i], 4);
              r.push_back(u);
            } else {
              r.push_back(u16[i]);
            }
          }
    return r;
  }
};

// float32 results rounded to `dtype` once, as bits (as Operand::bits gives them).
std::vector<std::uint32_t> rounded_bits(const std::vector<float>& x, DType dtype) {
  std::vector<std::uint32_t> r;
  for (float v : x) {
    if (dtype == DType::float16) {
      r.push_back(sdpa::detail::float_to_float16(v));
    } else if (dtype == DType::bfloat16) {
      r.push_back(sdpa::detail::float_to_bfloat16(v));
    } else {
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      r.push_back(u);
    }
  }
  return r;
}

void check(DType qdt, DType kvdt, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E,
           int64_t Ev, sdpa::Causal causal) {
  SCOPED_TRACE(std::string("query ") + sdpa::dtype_name(qdt) + ", key/value " +
               sdpa::dtype_name(kvdt) + ", E " + std::to_string(E));
  constexpr int64_t B = 2;
  Operand q(B, Hq, L, E, qdt), k(B, Hkv, S, E, kvdt), v(B, Hkv, S, Ev, kvdt);
  q.fill(1);
  k.fill(2);
  v.fill(3);
  sdpa::AttentionOptions o;
  o.causal = causal;
  o.enable_gqa = Hq != Hkv;
  o.threads = 2;

  // Expected: the float32 kernel on the widened values.
  std::vector<float> out_f(static_cast<std::size_t>(B * Hq * L * Ev)), lse_f(B * Hq * L);
  const MutableTensorRef lse_fm{lse_f.data(), DType::float32, {B, Hq, L}};
  sdpa::attention_forward(q.widened(), k.widened(), v.widened(), nullptr, o,
                          MutableTensorRef{out_f.data(), DType::float32, {B, Hq, L, Ev}}, &lse_fm);

  // The kernel on the stored operands.
  sdpa::detail::Problem p =
      sdpa::detail::resolve_problem(q.widened(), k.widened(), v.widened(), nullptr, o);
  p.q = q.in();
  p.k = k.in();
  p.v = v.in();
  Operand out(B, Hq, L, Ev, qdt);
  std::vector<float> lse(static_cast<std::size_t>(B * Hq * L), -7.0f);
  p.out = out.out();
  p.lse = OutputView{lse.data(), DType::float32, Hq * L, L, 1};
  sdpa::detail::fast_forward(p);
  if (sdpa::detail::fast_forward_reads_bfloat16(p)) {
    // The vdpbf16ps forward (kernels/gemm_bf16.h) rounds P to bfloat16 before P V: not the
    // converting path's bits; within bfloat16's precision of them (2^-8 relative, a few ulps).
    std::vector<float> got(out_f.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      got[i] = sdpa::detail::bfloat16_to_float(static_cast<std::uint16_t>(out.bits()[i]));
    }
    float worst = 0, largest = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(got[i] - out_f[i]));
      largest = std::max(largest, std::fabs(out_f[i]));
    }
    EXPECT_LE(worst, 0x1p-6f * largest) << "the native bfloat16 forward";
  } else {
    EXPECT_EQ(out.bits(), rounded_bits(out_f, qdt)) << "out is not the float32 out rounded once";
    EXPECT_EQ(rounded_bits(lse, DType::float32), rounded_bits(lse_f, DType::float32)) << "lse";
  }

  // Backward: grad_out in the query's dtype, out as the kernel wrote it.
  Operand g(B, Hq, L, Ev, qdt);
  g.fill(4);
  for (std::size_t i = 0; i < out.value.size(); ++i) {
    out.value[i] = qdt == DType::float16    ? sdpa::detail::float16_to_float(out.bits()[i])
                   : qdt == DType::bfloat16 ? sdpa::detail::bfloat16_to_float(out.bits()[i])
                                            : out_f[i];
  }
  std::vector<float> dq_f(q.value.size()), dk_f(k.value.size()), dv_f(v.value.size());
  sdpa::attention_backward(q.widened(), k.widened(), v.widened(), nullptr, out.widened(),
                           TensorRef{lse.data(), DType::float32, {B, Hq, L}}, g.widened(), o,
                           MutableTensorRef{dq_f.data(), DType::float32, {B, Hq, L, E}},
                           MutableTensorRef{dk_f.data(), DType::float32, {B, Hkv, S, E}},
                           MutableTensorRef{dv_f.data(), DType::float32, {B, Hkv, S, Ev}});
  Operand dq(B, Hq, L, E, qdt), dk(B, Hkv, S, E, kvdt), dv(B, Hkv, S, Ev, kvdt);
  p.fwd_out = out.in();
  p.fwd_lse = InputView{lse.data(), DType::float32, Hq * L, L, 1};
  p.dout = g.in();
  p.dq = dq.out();
  p.dk = dk.out();
  p.dv = dv.out();
  sdpa::detail::fast_backward(p);
  if (qdt == DType::bfloat16 && kvdt == DType::bfloat16 && sdpa::detail::bf16::pairs_in_kernel()) {
    // All-bfloat16 on vdpbf16ps: S and dP from bfloat16 pairs (flash.cpp's BackwardPairs), the
    // same exact products summed in another order, so within a bfloat16 ulp of the converting
    // path's bits rather than equal to them.
    const auto close = [](const Operand& got, const std::vector<float>& want, const char* name) {
      float worst = 0, largest = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        const float x = sdpa::detail::bfloat16_to_float(static_cast<std::uint16_t>(got.bits()[i]));
        worst = std::max(worst, std::fabs(x - want[i]));
        largest = std::max(largest, std::fabs(want[i]));
      }
      EXPECT_LE(worst, 0x1p-7f * largest) << name << " of the vdpbf16ps backward";
    };
    close(dq, dq_f, "dq");
    close(dk, dk_f, "dk");
    close(dv, dv_f, "dv");
    return;
  }
  EXPECT_EQ(dq.bits(), rounded_bits(dq_f, qdt)) << "dq";
  EXPECT_EQ(dk.bits(), rounded_bits(dk_f, kvdt)) << "dk";
  EXPECT_EQ(dv.bits(), rounded_bits(dv_f, kvdt)) << "dv";
}

// The float32 range guard (kernels/range.cpp) reads 16-bit operands too: bfloat16 holds
// float32's range, so a key of 3e38 must send the call to the reference; float16's 65504 here
// does not.
TEST(HalfPacking, RangeGuardReadsSixteenBitOperands) {
  Operand q(1, 2, 9, 8, DType::float32), k(1, 2, 9, 8, DType::bfloat16),
      v(1, 2, 9, 8, DType::float16);
  q.fill(5);
  k.fill(6);
  v.fill(7);
  sdpa::AttentionOptions o;
  sdpa::detail::Problem p =
      sdpa::detail::resolve_problem(q.widened(), k.widened(), v.widened(), nullptr, o);
  p.q = q.in();
  p.k = k.in();
  p.v = v.in();
  EXPECT_FALSE(sdpa::detail::float32_may_overflow(p));
  v.set(0, 1, 3, 2, 65504.0f);
  EXPECT_FALSE(sdpa::detail::float32_may_overflow(p));
  k.set(0, 1, 4, 5, 3e38f);
  EXPECT_TRUE(sdpa::detail::float32_may_overflow(p)) << "a bfloat16 key of 3e38 was not seen";
}

TEST(HalfPacking, EveryCompiledTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    // E = 32, Ev = 16: rows a whole number of vectors; E = 20, Ev = 24: vector tails.
    check(DType::float16, DType::float16, 4, 2, 70, 135, 32, 16, sdpa::Causal::upper_left);
    // All-bfloat16 every way the CPU has: through the pairs on AMX tiles and on vdpbf16ps, and
    // widened to float32 (the CPU's vendor and features pick one for ordinary calls).
    for (int pairs : {0, 1}) {
      const sdpa::detail::bf16::ScopedPairsInKernel mode(pairs);
      check(DType::bfloat16, DType::bfloat16, 2, 2, 70, 135, 20, 24, sdpa::Causal::lower_right);
    }
    if (sdpa::detail::bf16::amx()) {
      const sdpa::detail::bf16::ScopedPairsInKernel mode(1);
      const sdpa::detail::bf16::ScopedAmxOff off;
      check(DType::bfloat16, DType::bfloat16, 2, 2, 70, 135, 20, 24, sdpa::Causal::lower_right);
    }
    check(DType::float32, DType::bfloat16, 2, 1, 67, 130, 32, 32, sdpa::Causal::none);
    check(DType::float32, DType::float16, 2, 2, 40, 50, 20, 24, sdpa::Causal::upper_left);
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
