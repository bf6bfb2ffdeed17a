// The benchmark behind `sdpa bench`, callable in-process (the report runs it too).
// Owned by the fused-kernel work; this header is the contract between the CLI, the report and it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
  DType dtype = DType::float32;  // of query, key, value (run_bench): float32, float16, bfloat16
  int threads = 0;               // 0: one per core
  int repeat = 5;
  // The KV-cache shape (run_decode_bench): q (batch, seq, heads, dim) over caches of kv_seq rows
  // per sequence (or kv_lens, one length per sequence), paged when page_size > 0.
  bool kv_cache = false;
  std::int64_t page_size = 0;
  std::vector<std::int64_t> kv_lens;
  DType kv_dtype = DType::float32;  // of the caches: float32, float16 or bfloat16
  // Caches of these other dtypes, holding the same values rounded to theirs, timed in the same
  // rounds as kv_dtype's (one call of each per round, kv_dtype's first), so that their ratios
  // are measured under the same load: run_decode_bench adds "compare" to its JSON.
  std::vector<DType> kv_compare;
  // How the decode kernel reads a position-major cache's tiles: "auto" (its rule), "copy" or
  // "in-place" (detail::DecodeTileRead), set for the run and restored after it.
  std::string kv_tiles = "auto";
  std::string kv_order = "auto";
  // Attention variants (docs/variants.md), run_bench only: a sliding window (-1: unbounded
  // side), a logit softcap (0: off), ALiBi with BLOOM's slopes 2^(-8 (h + 1) / H), one sink
  // logit of 0 per head, dropout with its seed. With a window, the FLOP count is that of the
  // (query, key) pairs the window and the causal rule leave visible.
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  bool alibi = false, sinks = false;
  double dropout_p = 0.0;
  std::uint64_t seed = 0;
  // The Highway target to run on (e.g. "AVX2", any case; empty: the best this CPU supports);
  // the FMA peak of the same run is measured on it too (TargetScope).
  std::string target;
};

/// While alive, every dispatched kernel (and the FMA peak loop) runs on the compiled Highway
/// target `name` (case-insensitive, e.g. "avx2"; empty: no change); below AVX3_DL bfloat16
/// products also take the converting path (no vdpbf16ps). Throws sdpa::Error naming --target
/// and the available targets when `name` is not compiled or not supported by this CPU.
class TargetScope {
 public:
  explicit TargetScope(const std::string& name);
  ~TargetScope();
  TargetScope(const TargetScope&) = delete;
  TargetScope& operator=(const TargetScope&) = delete;

 private:
  bool active_ = false;
};

/// The Highway target the FMA peak loop runs on now (follows TargetScope).
const char* peak_target_name();

/// The names TargetScope accepts on this machine, best first.
std::vector<std::string> selectable_targets();

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

/// Times attention_with_kvcache on the decode shape of `config` (kv_cache set): the object
/// `sdpa bench --kv-cache --json` prints, with the fields of run_bench plus "kv_bytes" (K and V
/// bytes one call reads), "kv_gbps_median" (those bytes per second of the median call),
/// "read_gbps" (the streaming-read bandwidth measured in the same run, after the timing) and
/// "percent_of_read_bandwidth"; and the same per second of CPU time ("kv_gbps_per_cpu_second",
/// "read_gbps_per_cpu_second", "percent_of_read_bandwidth_cpu_time"), which stay comparable
/// when other processes share the cores.
nlohmann::json run_decode_bench(const BenchConfig& config);

/// The streaming-read bandwidth: the sum of a 512 MiB float32 array on `threads` threads (0: one
/// per core), each summing its own share; median and best of `trials` sums.
struct ReadBandwidth {
  double median_gbps = 0, best_gbps = 0;  // 1e9 bytes per second
  // Bytes per second of process CPU time (median): on a shared machine the wall-clock rates
  // drop with the load, this one much less; compare it with a kernel's bytes per CPU-second.
  double per_cpu_second_gbps = 0;
  double bytes = 0;  // bytes read per trial
  int threads = 0;
  float check = 0;  // the sum, so that the reads cannot be optimised away
};
ReadBandwidth measure_read_bandwidth(int threads, int trials = 5);

}  // namespace sdpa::bench
