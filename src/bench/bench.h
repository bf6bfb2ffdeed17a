// The benchmark behind `sdpa bench`, callable in-process (the report runs it too).
// Owned by the fused-kernel work; this header is the contract between the CLI, the report and it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "sdpa/sdpa.h"

namespace sdpa::bench {

struct BenchConfig {
  std::int64_t batch = 1, heads = 8;
  std::int64_t kv_heads = 0;   // 0: = heads
  std::int64_t seq = 4096;     // L
  std::int64_t kv_seq = 0;     // S; 0: = seq
  std::int64_t dim = 64;       // E
  std::int64_t value_dim = 0;  // Ev; 0: = dim
  Causal causal = Causal::none;
  bool backward = false;
  Impl impl = Impl::fast;
  int threads = 0;  // 0: one per core
  int repeat = 5;
};

/// Times the configuration (allocation and a warm-up outside the timed loop) and returns the
/// object `sdpa bench --json` prints; it includes at least "seconds_median", "seconds_min",
/// "seconds_max", "gflops_median", "percent_of_peak", "peak_gflops", "target", "threads", "cpu",
/// "impl" and the shape; also "cpu_seconds_median" (process CPU time of one call) and
/// "percent_of_peak_cpu_time" (the kernel's GFLOP per CPU-second over the loop's), which
/// stay meaningful when other processes share the cores. FLOP count: forward 4*B*H*L*S*E (halved
/// when causal), backward 2.5x.
nlohmann::json run_bench(const BenchConfig& config);

/// The CPU's model name from /proc/cpuinfo ("unknown" without one), and the same followed by
/// the number of logical CPUs, "AMD EPYC ... (2 logical CPUs)": the machine the report names.
std::string cpu_model();
std::string cpu_description();

/// The FP32 FMA peak in GFLOP/s of this machine with `threads` threads (0: one per core),
/// measured with a register-only FMA loop on the best compiled SIMD target.
double measure_peak_gflops(int threads);

/// The same loop, reporting both the wall-clock rate of all threads together and the rate per
/// second of CPU time consumed (one core's peak). On a shared, busy machine the wall-clock peak
/// drops with the load, while the per-CPU-second figures of the peak and of a kernel stay
/// comparable: their ratio is the efficiency of the kernel's own instructions.
struct PeakResult {
  double wall_gflops = 0;  // all threads, per wall-clock second
  double cpu_gflops = 0;   // per second of CPU time (one core)
};
PeakResult measure_peak(int threads);

}  // namespace sdpa::bench
