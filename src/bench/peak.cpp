// The FP32 FMA peak of this machine: a register-only loop of independent fused multiply-adds on
// the best compiled Highway target, on every thread at once. Zen 5 retires 2 FMAs per cycle
// with a latency of 4 cycles, so at least 8 must be in flight; 12 independent accumulators keep
// both pipes busy with margin (FACTS.md: ~205 GFLOP/s on one thread, 330-410 on two).
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "bench/bench.h"
#include "sdpa/sdpa.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/peak.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iterations` x 12 vector FMAs; returns the flop count (2 per lane per FMA).
double FmaLoop(std::int64_t iterations, float seed, float* sink) {
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  auto x0 = hn::Set(d, seed), x1 = hn::Set(d, seed + 1), x2 = hn::Set(d, seed + 2);
  auto x3 = hn::Set(d, seed + 3), x4 = hn::Set(d, seed + 4), x5 = hn::Set(d, seed + 5);
  auto x6 = hn::Set(d, seed + 6), x7 = hn::Set(d, seed + 7), x8 = hn::Set(d, seed + 8);
  auto x9 = hn::Set(d, seed + 9), x10 = hn::Set(d, seed + 10), x11 = hn::Set(d, seed + 11);
  for (std::int64_t i = 0; i < iterations; ++i) {
    x0 = hn::MulAdd(x0, a, b);
    x1 = hn::MulAdd(x1, a, b);
    x2 = hn::MulAdd(x2, a, b);
    x3 = hn::MulAdd(x3, a, b);
    x4 = hn::MulAdd(x4, a, b);
    x5 = hn::MulAdd(x5, a, b);
    x6 = hn::MulAdd(x6, a, b);
    x7 = hn::MulAdd(x7, a, b);
    x8 = hn::MulAdd(x8, a, b);
    x9 = hn::MulAdd(x9, a, b);
    x10 = hn::MulAdd(x10, a, b);
    x11 = hn::MulAdd(x11, a, b);
  }
  const auto sum = hn::Add(hn::Add(hn::Add(x0, x1), hn::Add(x2, x3)),
                           hn::Add(hn::Add(hn::Add(x4, x5), hn::Add(x6, x7)),
                                   hn::Add(hn::Add(x8, x9), hn::Add(x10, x11))));
  *sink = hn::GetLane(hn::SumOfLanes(d, sum));  // keeps the loop alive
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iterations);
}

const char* PeakTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sdpa::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::bench {

HWY_EXPORT(FmaLoop);
HWY_EXPORT(PeakTargetName);

namespace {
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
}  // namespace

double measure_peak_gflops(int threads) { return measure_peak(threads).wall_gflops; }

PeakResult measure_peak(int threads) {
  const int n = resolve_threads(threads);
  PeakResult result;
  // ~0.1 s per trial at 200 GFLOP/s per thread with 16 lanes; the best of 3 trials (the machine
  // is shared, so the best is the least disturbed).
  constexpr std::int64_t kIterations = 40'000'000;
  for (int trial = 0; trial < 3; ++trial) {
    double flops = 0;
    float sink = 0;
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(n) reduction(+ : flops, sink)
    {
      float s = 0;
      flops += HWY_DYNAMIC_DISPATCH(FmaLoop)(kIterations, float(omp_get_thread_num()), &s);
      sink += s;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = process_cpu_seconds() - c0;
    if (sink == 12345.0f) flops += 1;  // never true; uses sink
    result.wall_gflops = std::max(result.wall_gflops, flops / seconds * 1e-9);
    result.cpu_gflops = std::max(result.cpu_gflops, flops / cpu * 1e-9);
  }
  return result;
}

const char* peak_target_name() { return HWY_DYNAMIC_DISPATCH(PeakTargetName)(); }

}  // namespace sdpa::bench
#endif  // HWY_ONCE
