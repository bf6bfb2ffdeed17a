// The streaming-read bandwidth of this machine: the sum of a 512 MiB float32 array, each thread
// summing its own contiguous share, on the best compiled Highway target. 512 MiB is 16 x the
// largest L3 seen here (32 MiB), so the read comes from DRAM. This is the bound a decode step
// can reach: it reads every cached K/V byte once and does little arithmetic on it.
#include <omp.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "bench/bench.h"
#include "sdpa/sdpa.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/bandwidth.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of x[0..n) (n a multiple of 4 vectors): four independent accumulators, so the adds never
// wait on each other and only the loads set the pace.
float StreamSum(const float* x, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (std::int64_t i = 0; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, x + i));
    a1 = hn::Add(a1, hn::LoadU(d, x + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, x + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, x + i + 3 * N));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

}  // namespace sdpa::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::bench {

HWY_EXPORT(StreamSum);

namespace {
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
}  // namespace

ReadBandwidth measure_read_bandwidth(int threads, int trials) {
  const int n = resolve_threads(threads);
  constexpr std::size_t kBytes = std::size_t{512} << 20;
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const auto count = static_cast<std::int64_t>(kBytes / sizeof(float));
  float* x = static_cast<float*>(std::aligned_alloc(kHuge, kBytes));
  if (x == nullptr) throw std::bad_alloc();
  madvise(x, kBytes,
          MADV_HUGEPAGE);  // a fresh 4 KiB page costs ~15 us to touch; huge pages ~30x less
  // Each thread touches (and later reads) its own share, so the pages sit near that thread.
  const std::int64_t share = count / n / 64 * 64;
#pragma omp parallel num_threads(n)
  {
    const std::int64_t t = omp_get_thread_num();
    std::fill_n(x + t * share, share, 1.0f);
  }
  std::vector<double> rates, cpu_rates;
  float sink = 0;
  for (int trial = 0; trial < std::max(1, trials); ++trial) {
    float sum = 0;
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(n) reduction(+ : sum)
    {
      const std::int64_t t = omp_get_thread_num();
      sum += HWY_DYNAMIC_DISPATCH(StreamSum)(x + t * share, share);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = double(share) * double(n) * sizeof(float);
    rates.push_back(bytes / s * 1e-9);
    cpu_rates.push_back(bytes / (cpu_seconds() - c0) * 1e-9);
    sink += sum;
  }
  std::free(x);
  std::sort(rates.begin(), rates.end());
  ReadBandwidth r;
  std::sort(cpu_rates.begin(), cpu_rates.end());
  r.median_gbps = rates[rates.size() / 2];
  r.per_cpu_second_gbps = cpu_rates[cpu_rates.size() / 2];
  r.best_gbps = rates.back();
  r.threads = n;
  r.bytes = double(share) * double(n) * sizeof(float);
  r.check = sink;
  return r;
}

}  // namespace sdpa::bench
#endif  // HWY_ONCE
