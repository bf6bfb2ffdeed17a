// The fused kernel (--impl fast) and the naive baseline against the float64 reference.
//
// Accuracy contract of issue 3, asserted for out, lse, dq, dk and dv over odd shapes, every mask
// kind and broadcast, both causal alignments (L < S and L > S), fully masked rows and GQA:
//   err(fast f32) <= 2 * err(naive f32) + floor   and   err(fast f32) <= 2e-5 * max|result|
// where err is the largest absolute difference from the reference run on the same inputs
// converted to float64, and floor = 4 float32 epsilons of max|result| for out and lse (the
// rounding of the result itself is half an epsilon; a few more cover the different order of
// summation, which matters when the naive error happens to be tiny). The fused backward, like
// FlashAttention's, is handed out and lse rounded to float32 and recomputes P = exp(S - lse):
// the rounding of lse alone perturbs every P by up to |lse| * eps / 2 (relative), which the
// naive backward (it normalises P itself) never sees; rows with |lse| above 64 are renormalised
// by the kernel from the inputs instead (kLseResolvable in flash.cpp). So for dq, dk and dv the
// floor is (4 + min(max|lse|, 64)) * eps * max|result|.
// Also: every compiled Highway target (the scalar one included) is pinned in turn with
// hwy::SetSupportedTargetsForTest and checked; results are bit-identical for 1, 2 and 3
// threads; float64 inputs; NaN and inf at masked-out key/value positions never leak; the exp
// of the kernel meets its stated error bound; a long sequence runs in linear memory.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/problem.h"
#include "hwy/targets.h"
#include "kernels/dispatch.h"
#include "kernels/flash_common.h"
#include "kernels/kernels.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::AttentionOptions;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::test::Case;
using sdpa::test::Inputs;
using sdpa::test::make_case;
using sdpa::test::make_inputs;
using sdpa::test::max_abs;
using sdpa::test::max_abs_diff;
using sdpa::test::Outputs;
using sdpa::test::run;

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

std::string index_string(const Array& a, std::int64_t flat) {
  std::string s = "(";
  std::vector<std::int64_t> idx(a.shape().size());
  for (std::size_t d = a.shape().size(); d-- > 0;) {
    idx[d] = flat % a.shape()[d];
    flat /= a.shape()[d];
  }
  for (std::size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + ")";
}

// The contract for one tensor; reports the worst element on failure.
// floor_eps: the floor in epsilons of max|result| (see the top of this file).
void expect_within_contract(const char* what, const Array& fast, const Array& naive,
                            const Array& truth, double eps, double floor_eps,
                            const std::string& name) {
  std::int64_t worst = 0, worst_naive = 0;
  const double err = max_abs_diff(fast, truth, &worst);
  const double err_naive = max_abs_diff(naive, truth, &worst_naive);
  const double scale = max_abs(truth);
  const double floor = floor_eps * eps * scale;
  const double relative_cap = (eps == DBL_EPSILON ? 1e-12 : 2e-5) * scale;
  EXPECT_LE(err, 2 * err_naive + floor)
      << name << " " << what << ": fast error " << err << " at " << index_string(truth, worst)
      << " (fast " << sdpa::test::get(fast, worst) << ", reference "
      << sdpa::test::get(truth, worst) << "), naive error " << err_naive << ", max|x| " << scale;
  EXPECT_LE(err, relative_cap) << name << " " << what << ": fast error " << err << " at "
                               << index_string(truth, worst) << ", max|x| " << scale;
}

void check_case(const Case& c, std::uint64_t seed, DType dtype = DType::float32,
                bool with_backward = true) {
  const Inputs in = make_inputs(c, dtype, seed);
  const Outputs truth = run(as_float64(in), c.options, Impl::reference, with_backward);
  const Outputs fast = run(in, c.options, Impl::fast, with_backward);
  const Outputs naive = run(in, c.options, Impl::naive, with_backward);
  const double eps = dtype == DType::float32 ? FLT_EPSILON : DBL_EPSILON;
  const std::string name = c.name() + " on " + sdpa::detail::fast_kernel_target();
  expect_within_contract("out", fast.out, naive.out, truth.out, eps, 4, name);
  expect_within_contract("lse", fast.lse, naive.lse, truth.lse, eps, 4, name);
  if (with_backward) {
    const double floor_eps = 4 + std::min(max_abs(truth.lse), 64.0);
    expect_within_contract("dq", fast.dq, naive.dq, truth.dq, eps, floor_eps, name);
    expect_within_contract("dk", fast.dk, naive.dk, truth.dk, eps, floor_eps, name);
    expect_within_contract("dv", fast.dv, naive.dv, truth.dv, eps, floor_eps, name);
  }
}

constexpr Causal kCausals[] = {Causal::none, Causal::upper_left, Causal::lower_right};

// ---- accuracy on the best target -------------------------------------------------------------

TEST(FastKernel, HeadDimsOddShapes) {
  std::uint64_t seed = 1;
  for (std::int64_t E : {1, 3, 17, 33, 64, 80, 128, 256}) {
    check_case(make_case(113, 203, E, E, Causal::none, 0), seed++);
  }
}

// Head sizes past 128: the products over E sum in blocks (gemm-inl.h, kGemmDepth), as BLAS
// does; one chain of 256 to 2048 rounding errors put out up to 7 times as far from the
// reference as the naive baseline. Every compiled target, since each runs its own micro-kernel.
TEST(FastKernel, LongHeadDimsSumInBlocks) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    check_case(make_case(33, 65, 256, 255, Causal::lower_right, 1), 34);
    check_case(make_case(33, 65, 384, 255, Causal::lower_right, 0), 2);
    check_case(make_case(33, 65, 1024, 255, Causal::lower_right, 1), 5);
    check_case(make_case(33, 65, 2048, 255, Causal::lower_right, 0), 6);
    check_case(make_case(40, 24, 64, 1024, Causal::upper_left, 2), 7);  // dP = dO V^T over Ev
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(FastKernel, EveryMaskAndCausal) {
  std::uint64_t seed = 100;
  for (std::int64_t E : {33, 64}) {
    for (Causal causal : kCausals) {
      for (int mask_kind : {0, 1, 2}) {
        check_case(make_case(113, 203, E, E + 16, causal, mask_kind), seed++);
        check_case(make_case(203, 113, E, E, causal, mask_kind), seed++);  // L > S
      }
    }
  }
}

TEST(FastKernel, BroadcastMasksAndGroupedQueries) {
  std::uint64_t seed = 200;
  const std::vector<std::vector<std::int64_t>> mask_shapes = {
      {130, 77}, {1, 77}, {3, 1, 1, 77}, {4, 130, 1}, {3, 4, 130, 77}};
  for (const auto& shape : mask_shapes) {
    for (int mask_kind : {1, 2}) {
      Case c = make_case(130, 77, 17, 33, kCausals[seed % 3], mask_kind);
      c.lead = {3};
      c.Hq = 4;
      c.Hkv = 2;
      c.options.enable_gqa = true;
      c.mask_shape = shape;
      check_case(c, seed++);
    }
  }
  Case c = make_case(97, 150, 64, 64, Causal::lower_right, 0);  // every head of 8 reads one K/V
  c.Hq = 8;
  c.Hkv = 1;
  c.options.enable_gqa = true;
  check_case(c, seed++);
}

TEST(FastKernel, FullyMaskedRowsGiveZeros) {
  // L > S with lower-right causal: the first L - S rows see no key at all; plus a boolean mask
  // with whole rows false.
  Case c = make_case(150, 70, 17, 17, Causal::lower_right, 1);
  Inputs in = make_inputs(c, DType::float32, 7);
  auto* m = in.mask.data_as<std::uint8_t>();
  for (std::int64_t l = 90; l < 100; ++l) std::memset(m + l * c.S, 0, c.S);
  const Outputs fast = run(in, c.options, Impl::fast);
  for (std::int64_t l = 0; l < 100; ++l) {
    const bool masked = l < c.L - c.S || l >= 90;
    if (!masked) continue;
    EXPECT_EQ(fast.lse.data_as<float>()[l], -INFINITY) << "row " << l;
    for (std::int64_t e = 0; e < c.Ev; ++e) {
      EXPECT_EQ(fast.out.data_as<float>()[l * c.Ev + e], 0.0f) << "row " << l;
    }
    for (std::int64_t e = 0; e < c.E; ++e) {
      EXPECT_EQ(fast.dq.data_as<float>()[l * c.E + e], 0.0f) << "row " << l;
    }
  }
  check_case(c, 7);
}

TEST(FastKernel, Float64Inputs) {
  std::uint64_t seed = 300;
  for (Causal causal : kCausals) {
    check_case(make_case(113, 203, 33, 17, causal, static_cast<int>(seed % 3)), seed,
               DType::float64);
    ++seed;
  }
}

// ---- every compiled SIMD target ---------------------------------------------------------------

float ulp_distance(float a, double exact) {
  const float e = static_cast<float>(exact);
  if (a == e) return 0;
  return static_cast<float>(std::fabs(double(a) - exact) /
                            (std::nextafter(std::fabs(e), INFINITY) - std::fabs(e)));
}

// The kernel's exp (gemm-inl.h's ExpShiftRow, the softmax's loop): within 1 ULP of exp on
// [-87.33, 88] (random arguments and every 4096th float32 of the range), exactly 1 at 0 and -0,
// exactly 0 at -inf, at NaN and below -87.34 (where exp leaves float32's normal range).
// non_positive: the variant without the clamp at 88, on the same arguments up to 0. The length
// is 16 past a multiple of 64, so that both the blocks of vectors and the single-vector tail run
// on every target.
void check_exp(bool non_positive) {
  const std::vector<float> special = {0.0f, -0.0f, -INFINITY, NAN, -1000.0f, -87.34f, -100.0f};
  std::vector<float> x = special;
  while (x.size() % 64 != 0) x.push_back(0.0f);  // whole vectors on every target
  const std::size_t first_random = x.size();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-87.0f, 0.0f);
  for (int i = 0; i < 4096; ++i) x.push_back(dist(rng));
  for (const float end : {-87.33f, 88.0f}) {
    if (non_positive && end > 0) continue;
    std::uint32_t last;
    std::memcpy(&last, &end, sizeof last);
    for (std::uint32_t b = last & 0x80000000u; b <= last; b += 4096) {
      float v;
      std::memcpy(&v, &b, sizeof v);
      x.push_back(v);
    }
  }
  while (x.size() % 64 != 16) x.push_back(dist(rng));
  std::vector<float> y(x.size());
  sdpa::detail::fast_exp_for_test(x.data(), y.data(), x.size(), non_positive);
  const std::string where =
      std::string(sdpa::detail::fast_kernel_target()) + (non_positive ? " (non-positive)" : "");
  EXPECT_EQ(y[0], 1.0f) << where;
  EXPECT_EQ(y[1], 1.0f) << where;
  for (std::size_t i = 2; i < special.size(); ++i)
    EXPECT_EQ(y[i], 0.0f) << "exp(" << x[i] << ") on " << where;
  float worst = 0;
  std::size_t worst_i = first_random;
  for (std::size_t i = first_random; i < x.size(); ++i) {
    const float u = ulp_distance(y[i], std::exp(double(x[i])));
    if (u > worst) {
      worst = u;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, 1.0f) << "exp(" << x[worst_i] << ") = " << y[worst_i] << " on " << where;
}

TEST(FastKernel, EveryCompiledTarget) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  bool saw_portable = false;  // SCALAR with GCC, EMU128 with clang (Highway's choice)
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    std::printf("target %s\n", hwy::TargetName(target));
    ASSERT_STREQ(sdpa::detail::fast_kernel_target(), hwy::TargetName(target));
    saw_portable = saw_portable || target == HWY_SCALAR || target == HWY_EMU128;
    check_exp(false);
    check_exp(true);
    std::uint64_t seed = 400;
    for (std::int64_t E : {1, 17, 64, 80}) {  // 80: one full 4-vector block + a single vector
      check_case(
          make_case(45, 71, E, E == 17 ? 5 : E, kCausals[seed % 3], static_cast<int>(seed % 3)),
          seed);
      ++seed;
    }
    Case c = make_case(70, 67, 16, 24, Causal::upper_left, 1);
    c.Hq = 4;
    c.Hkv = 2;
    c.options.enable_gqa = true;
    check_case(c, seed++);
    check_case(make_case(67, 70, 9, 9, Causal::lower_right, 2), seed++, DType::float64);
    // Every plan of the backward (two passes; one chunk per kv head; three chunks) on this
    // target, with GQA, causal and a mask across several key tiles.
    for (int chunks : {0, 1, 3}) {
      sdpa::detail::set_backward_chunks_for_test(chunks);
      Case g = make_case(150, 300, 24, 40, kCausals[chunks % 3], chunks == 3 ? 2 : 1);
      g.Hq = 4;
      g.Hkv = 2;
      g.options.enable_gqa = true;
      check_case(g, seed++);
    }
    sdpa::detail::set_backward_chunks_for_test(-1);
    // Several query tiles per work item of the forward (five tiles: the last block partial),
    // with GQA, both causal alignments and masks.
    for (int block : {2, 4}) {
      sdpa::detail::set_forward_block_for_test(block);
      Case f = make_case(300, 200, 24, 40, kCausals[block / 2], block == 4 ? 2 : 1);
      f.Hq = 4;
      f.Hkv = 2;
      f.options.enable_gqa = true;
      check_case(f, seed++);
      check_case(make_case(300, 270, 16, 16, kCausals[3 - block / 2], 0), seed++, DType::float64);
    }
    sdpa::detail::set_forward_block_for_test(-1);
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_TRUE(saw_portable)
      << "the portable target (SCALAR or EMU128) should be compiled and tested";
}

// ---- threads -----------------------------------------------------------------------------------

bool bit_identical(const Array& a, const Array& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(FastKernel, BitIdenticalForAnyThreadCount) {
  Case c = make_case(300, 260, 40, 24, Causal::lower_right, 2);
  c.lead = {2};
  c.Hq = 4;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  const Inputs in = make_inputs(c, DType::float32, 11);
  for (int chunks : {-1, 0, 1, 2}) {  // the shape's own plan, then each plan in turn
    sdpa::detail::set_backward_chunks_for_test(chunks);
    c.options.threads = 1;
    const Outputs one = run(in, c.options, Impl::fast);
    for (int threads : {2, 3}) {
      c.options.threads = threads;
      const Outputs many = run(in, c.options, Impl::fast);
      const std::string at = std::to_string(threads) + " threads, plan " + std::to_string(chunks);
      EXPECT_TRUE(bit_identical(one.out, many.out)) << at;
      EXPECT_TRUE(bit_identical(one.lse, many.lse)) << at;
      EXPECT_TRUE(bit_identical(one.dq, many.dq)) << at;
      EXPECT_TRUE(bit_identical(one.dk, many.dk)) << at;
      EXPECT_TRUE(bit_identical(one.dv, many.dv)) << at;
    }
  }
  sdpa::detail::set_backward_chunks_for_test(-1);
  // The forward's query tiles per work item (the shape's own choice, then 1, 2 and 4 forced)
  // change no bit either, for any thread count.
  sdpa::detail::set_forward_block_for_test(1);
  c.options.threads = 1;
  const Outputs base = run(in, c.options, Impl::fast);
  for (int block : {-1, 2, 4}) {
    sdpa::detail::set_forward_block_for_test(block);
    for (int threads : {1, 2, 3}) {
      c.options.threads = threads;
      const Outputs other = run(in, c.options, Impl::fast);
      const std::string at = std::to_string(threads) + " threads, block " + std::to_string(block);
      EXPECT_TRUE(bit_identical(base.out, other.out)) << at;
      EXPECT_TRUE(bit_identical(base.lse, other.lse)) << at;
    }
  }
  sdpa::detail::set_forward_block_for_test(-1);
}

// The backward's memory choices (row strides off 512 bytes, the next query tile prefetched;
// flash::BackwardMemory) differ between CPUs, so each CPU runs only its own unless a test
// forces the other; both must give the same bits, on every compiled target. E = Ev = 128 and
// a float64 key tile (1 KiB rows) make every spread stride differ from the plain one; three
// key tiles, GQA, a mask and causal reach every product and the prefetch's next-tile step;
// bfloat16 reaches the pairs packed from the spread tiles where the CPU multiplies pairs.
TEST(FastKernel, BackwardMemoryChoicesGiveTheSameBits) {
  Case c = make_case(150, 300, 128, 128, Causal::lower_right, 2);
  c.Hq = 4;
  c.Hkv = 2;
  c.options.enable_gqa = true;
  c.options.threads = 2;
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16}) {
    const Inputs in = make_inputs(c, dtype, 23);
    for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      sdpa::detail::set_backward_memory_for_test(0);
      const Outputs plain = run(in, c.options, Impl::fast);
      sdpa::detail::set_backward_memory_for_test(1);
      const Outputs spread = run(in, c.options, Impl::fast);
      const std::string at = std::string(hwy::TargetName(target)) + ", " + sdpa::dtype_name(dtype);
      EXPECT_TRUE(bit_identical(plain.dq, spread.dq)) << at;
      EXPECT_TRUE(bit_identical(plain.dk, spread.dk)) << at;
      EXPECT_TRUE(bit_identical(plain.dv, spread.dv)) << at;
    }
  }
  sdpa::detail::set_backward_memory_for_test(-1);
  hwy::SetSupportedTargetsForTest(0);
}

// ---- non-finite numbers at masked-out positions -------------------------------------------------

void expect_finite_and_close(const Outputs& fast, const Outputs& truth, const std::string& name) {
  const std::pair<const Array*, const Array*> pairs[] = {
      {&fast.out, &truth.out}, {&fast.dq, &truth.dq}, {&fast.dk, &truth.dk}, {&fast.dv, &truth.dv}};
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(sdpa::test::all_finite(*pairs[i].first)) << name << " " << names[i];
    std::int64_t worst = 0;
    const double err = max_abs_diff(*pairs[i].first, *pairs[i].second, &worst);
    EXPECT_LE(err, 2e-5 * max_abs(*pairs[i].second))
        << name << " " << names[i] << " at " << index_string(*pairs[i].second, worst);
  }
}

TEST(FastKernel, NonFiniteAtMaskedPositionsDoesNotLeak) {
  // Upper-left causal with L < S: keys s >= L are seen by no row. Fill them with NaN and inf.
  {
    Case c = make_case(50, 130, 20, 20, Causal::upper_left, 0);
    Inputs in = make_inputs(c, DType::float32, 21);
    for (std::int64_t s = c.L; s < c.S; ++s) {
      for (std::int64_t e = 0; e < c.E; ++e) {
        in.k.data_as<float>()[s * c.E + e] = (s % 2) ? NAN : INFINITY;
        in.v.data_as<float>()[s * c.Ev + e] = (s % 2) ? -INFINITY : NAN;
      }
    }
    expect_finite_and_close(run(in, c.options, Impl::fast),
                            run(as_float64(in), c.options, Impl::reference), "causal");
  }
  // A boolean and an additive mask that hide key 7 from every row and key 70 from every row.
  for (int mask_kind : {1, 2}) {
    Case c = make_case(90, 100, 20, 36, Causal::none, mask_kind);
    Inputs in = make_inputs(c, DType::float32, 22);
    for (std::int64_t l = 0; l < c.L; ++l) {
      for (std::int64_t s : {7, 70}) {
        sdpa::test::set(in.mask, l * c.S + s, mask_kind == 1 ? 0.0 : -INFINITY);
      }
    }
    for (std::int64_t s : {7, 70}) {
      for (std::int64_t e = 0; e < c.E; ++e) in.k.data_as<float>()[s * c.E + e] = NAN;
      for (std::int64_t e = 0; e < c.Ev; ++e) in.v.data_as<float>()[s * c.Ev + e] = INFINITY;
    }
    expect_finite_and_close(run(in, c.options, Impl::fast),
                            run(as_float64(in), c.options, Impl::reference),
                            "mask kind " + std::to_string(mask_kind));
  }
}

// NaN scores at visible positions make exactly their rows NaN (out and lse), on every compiled
// target: the online softmax's maximum may drop a NaN, so the NaN has to reach the row's sum
// through P. Rows (of three lane groups on AVX-512, the last one partial) see: key 0 (NaN) as
// the only visible key of the first tile, then finite keys; key 0 among finite keys of the
// first tile; a NaN key in the last tile only, after the running max is set; or no NaN key.
TEST(FastKernel, NanScoresMakeTheirRowsNan) {
  Case c = make_case(40, 300, 20, 12, Causal::none, 1);
  const std::int64_t nan_keys[] = {0, 290};
  enum Sees { kOnlyNanThenFinite, kNanAmongFinite, kNanInLastTile, kNoNan };
  const auto sees = [](std::int64_t l) { return static_cast<Sees>((l * 7 + l / 5) % 4); };
  Inputs in = make_inputs(c, DType::float32, 31);
  for (std::int64_t l = 0; l < c.L; ++l) {
    for (std::int64_t s = 0; s < c.S; ++s) {
      bool visible = s % 3 != 1;  // a third of the keys hidden from every row
      if (s == 0) visible = sees(l) == kOnlyNanThenFinite || sees(l) == kNanAmongFinite;
      if (s == 290) visible = sees(l) == kNanInLastTile;
      if (sees(l) == kOnlyNanThenFinite && s > 0 && s < sdpa::detail::flash::kKeyTile) {
        visible = false;
      }
      sdpa::test::set(in.mask, l * c.S + s, visible ? 1.0 : 0.0);
    }
  }
  for (std::int64_t s : nan_keys) in.k.data_as<float>()[s * c.E + 3] = NAN;
  const Outputs truth = run(as_float64(in), c.options, Impl::reference, false);
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = sdpa::detail::fast_kernel_target();
    const Outputs fast = run(in, c.options, Impl::fast, false);
    for (std::int64_t l = 0; l < c.L; ++l) {
      const bool nan_row = sees(l) != kNoNan;
      const float lse = fast.lse.data_as<float>()[l];
      EXPECT_EQ(std::isnan(lse), nan_row) << name << " row " << l << " lse " << lse;
      for (std::int64_t e = 0; e < c.Ev; ++e) {
        const float got = fast.out.data_as<float>()[l * c.Ev + e];
        if (nan_row) {
          EXPECT_TRUE(std::isnan(got)) << name << " row " << l << " col " << e;
        } else {
          EXPECT_NEAR(got, truth.out.data_as<double>()[l * c.Ev + e], 2e-5)
              << name << " row " << l << " col " << e;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(FastKernel, IntermediatesPastFloat32RangeStayFinite) {
  // float32 problems whose float32 intermediates might pass float32's range take the float64
  // path in both fast implementations (src/kernels/range.cpp): results finite and equal to the
  // reference's. Found by fuzz_attention (fuzz/regressions/attention/nonfinite-*).
  constexpr std::int64_t L = 20, S = 37;
  const Case c = make_case(L, S, 8, 5, Causal::none, 0);
  struct Variant {
    const char* name;
    bool backward;  // false where the exact gradients themselves pass float32's range
    void (*apply)(Inputs&, AttentionOptions&);
  };
  const Variant variants[] = {
      {"scale 1e200", true, [](Inputs&, AttentionOptions& o) { o.scale = 1e200; }},
      {"a query of 3e38", true,
       [](Inputs& in, AttentionOptions&) { in.q.data_as<float>()[3] = 3e38f; }},
      {"a query of 3e38 at scale 1e-30", true,
       [](Inputs& in, AttentionOptions& o) {
         in.q.data_as<float>()[3] = 3e38f;
         o.scale = 1e-30;
       }},
      {"a float64 mask of +1e300", true,
       [](Inputs& in, AttentionOptions&) {
         in.mask = Array(DType::float64, {L, S});
         for (std::int64_t i = 0; i < in.mask.numel(); ++i) sdpa::test::set(in.mask, i, 0.0);
         sdpa::test::set(in.mask, 5, 1e300);
         in.has_mask = true;
       }},
      {"a float32 mask of FLT_MAX", true,
       [](Inputs& in, AttentionOptions&) {
         in.mask = Array(DType::float32, {S});
         for (std::int64_t i = 0; i < in.mask.numel(); ++i) sdpa::test::set(in.mask, i, 0.0);
         sdpa::test::set(in.mask, 11, FLT_MAX);
         in.has_mask = true;
       }},
      {"values of 3e38", false,
       [](Inputs& in, AttentionOptions&) {
         for (std::int64_t i = 0; i < in.v.numel(); ++i) in.v.data_as<float>()[i] = 3e38f;
       }},
      {"an output gradient of 1e35", true,
       [](Inputs& in, AttentionOptions&) {
         for (std::int64_t i = 0; i < in.dout.numel(); ++i) in.dout.data_as<float>()[i] *= 1e35f;
       }},
  };
  for (const Variant& variant : variants) {
    Inputs in = make_inputs(c, DType::float32, 41);
    AttentionOptions o = c.options;
    variant.apply(in, o);
    const Outputs truth = run(as_float64(in), o, Impl::reference, variant.backward);
    for (Impl impl : {Impl::fast, Impl::naive}) {
      expect_finite_and_close(run(in, o, impl, variant.backward), truth,
                              std::string(variant.name) + " on " + sdpa::impl_name(impl));
    }
  }
}

TEST(RangeGuard, FlagsExactlyTheInputsThatCanOverflow) {
  // The guard itself: an always-true guard would pass every accuracy test (the reference is
  // right) while making every call slow, so assert that ordinary inputs are not flagged.
  // S * E = 185 entries per head is not a multiple of any vector width, so the scalar tail of
  // the vectorised maxima is exercised too.
  constexpr std::int64_t L = 20, S = 37;
  const Case c = make_case(L, S, 5, 5, Causal::none, 0);
  auto flagged = [&](const Inputs& in, bool backward) {
    const sdpa::TensorRef q = in.q.ref(), k = in.k.ref(), v = in.v.ref();
    const sdpa::detail::Problem p =
        sdpa::detail::resolve_problem(q, k, v, in.mask_ref(), c.options);
    return sdpa::detail::float32_may_overflow(p, backward ? in.dout.data() : nullptr);
  };
  auto fresh = [&] { return make_inputs(c, DType::float32, 51); };
  EXPECT_FALSE(flagged(fresh(), false));
  EXPECT_FALSE(flagged(fresh(), true));
  {  // non-finite entries do not count (they follow the masking and NaN rules)
    Inputs in = fresh();
    in.q.data_as<float>()[0] = NAN;
    in.k.data_as<float>()[1] = INFINITY;
    in.v.data_as<float>()[2] = -INFINITY;
    EXPECT_FALSE(flagged(in, true));
  }
  {  // finfo(float32).min as "masked" does not count; +FLT_MAX does
    Inputs in = fresh();
    in.mask = Array(DType::float32, {S});
    for (std::int64_t i = 0; i < S; ++i) sdpa::test::set(in.mask, i, -FLT_MAX);
    in.has_mask = true;
    EXPECT_FALSE(flagged(in, false));
    sdpa::test::set(in.mask, S - 1, FLT_MAX);
    EXPECT_TRUE(flagged(in, false));
  }
  // One large entry, last of its tensor (the scalar tail), in each input in turn.
  for (const char* which : {"q", "k", "v"}) {
    Inputs in = fresh();
    Array& a = which[0] == 'q' ? in.q : which[0] == 'k' ? in.k : in.v;
    a.data_as<float>()[a.numel() - 1] = which[0] == 'v' ? 1e35f : 1e36f;
    EXPECT_TRUE(flagged(in, false)) << which;
  }
  {  // a large output gradient only matters to the backward
    Inputs in = fresh();
    in.dout.data_as<float>()[in.dout.numel() - 1] = 1e35f;
    EXPECT_FALSE(flagged(in, false));
    EXPECT_TRUE(flagged(in, true));
  }
}

// ---- memory -----------------------------------------------------------------------------------

TEST(FastKernel, LongSequenceRunsInLinearMemory) {
  // L = S = 16384: the score matrix alone would be 1 GiB; inputs and output are 4 MiB.
  // gtest_discover_tests runs each test in its own process, so the peak RSS is this test's.
  Case c = make_case(16384, 16384, 8, 8, Causal::lower_right, 0);
  const Inputs in = make_inputs(c, DType::float32, 31);
  const Outputs r = run(in, c.options, Impl::fast, /*with_backward=*/false);
  EXPECT_TRUE(sdpa::test::all_finite(r.out));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  EXPECT_LT(peak_mib, 96.0) << "peak resident memory " << peak_mib << " MiB";
}

}  // namespace
