// `sdpa bench`: times one attention configuration the way the targets are stated.
// Allocation, random inputs and one warm-up call happen before the timed loop, so the loop
// measures the kernel with its workspaces already faulted in (a fresh page costs ~15 us here).
#include "bench/bench.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "sdpa/array.h"

namespace sdpa::bench {

const char* peak_target_name();  // peak.cpp

namespace {

Array random_normal(std::vector<std::int64_t> shape, std::uint64_t seed) {
  Array a(DType::float32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float* x = a.data_as<float>();
  for (std::int64_t i = 0; i < a.numel(); ++i) x[i] = normal(rng);
  return a;
}

void require_positive(std::int64_t value, const char* option) {
  if (value < 1) throw Error(fmt::format("{}: expected a positive integer, got {}", option, value));
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double max_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

}  // namespace

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  int cpus = 0;
  while (std::getline(in, line)) cpus += line.rfind("processor", 0) == 0;
  const std::string model = cpu_model();
  return cpus > 0 ? fmt::format("{} ({} logical CPUs)", model, cpus) : model;
}

nlohmann::json run_bench(const BenchConfig& config) {
  const std::int64_t B = config.batch, H = config.heads;
  const std::int64_t Hkv = config.kv_heads == 0 ? H : config.kv_heads;
  const std::int64_t L = config.seq, S = config.kv_seq == 0 ? L : config.kv_seq;
  const std::int64_t E = config.dim, Ev = config.value_dim == 0 ? E : config.value_dim;
  require_positive(B, "--batch");
  require_positive(H, "--heads");
  require_positive(Hkv, "--kv-heads");
  require_positive(L, "--seq");
  require_positive(S, "--kv-seq");
  require_positive(E, "--dim");
  require_positive(Ev, "--value-dim");
  require_positive(config.repeat, "--repeat");
  if (H % Hkv != 0) {
    throw Error(fmt::format("--kv-heads: expected a divisor of --heads {}, got {}", H, Hkv));
  }
  const int threads = resolve_threads(config.threads);

  AttentionOptions options;
  options.causal = config.causal;
  options.enable_gqa = Hkv != H;
  options.impl = config.impl;
  options.threads = threads;

  const Array q = random_normal({B, H, L, E}, 1);
  const Array k = random_normal({B, Hkv, S, E}, 2);
  const Array v = random_normal({B, Hkv, S, Ev}, 3);
  Array out(DType::float32, {B, H, L, Ev}), lse(DType::float32, {B, H, L});
  Array dout, dq, dk, dv;
  const MutableTensorRef lse_ref = lse.mut();
  const auto forward = [&] { attention_forward(q, k, v, nullptr, options, out.mut(), &lse_ref); };
  std::function<void()> call = forward;
  if (config.backward) {
    dout = random_normal({B, H, L, Ev}, 4);
    dq = Array(DType::float32, q.shape());
    dk = Array(DType::float32, k.shape());
    dv = Array(DType::float32, v.shape());
    forward();  // out and lse for the backward, outside the timing
    call = [&] {
      attention_backward(q, k, v, nullptr, out, lse, dout, options, dq.mut(), dk.mut(), dv.mut());
    };
  }
  call();  // warm-up: faults in the workspaces, spins up the threads

  std::vector<double> seconds, cpu_seconds;
  for (int r = 0; r < config.repeat; ++r) {
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu_seconds.push_back(process_cpu_seconds() - c0);
  }
  std::sort(cpu_seconds.begin(), cpu_seconds.end());
  const double cpu_median = cpu_seconds[cpu_seconds.size() / 2];
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);

  // Forward 2 * B * H * L * S * (E + Ev) (= 4 B H L S E when Ev = E), halved when causal;
  // backward 2.5 times that (the usual convention: 5 products instead of 2).
  double flops = 2.0 * double(B) * double(H) * double(L) * double(S) * double(E + Ev);
  if (config.causal != Causal::none) flops *= 0.5;
  if (config.backward) flops *= 2.5;
  const PeakResult peak_result = measure_peak(threads);
  const double peak = peak_result.wall_gflops;
  const double gflops = flops / median * 1e-9;

  std::string target;
  switch (config.impl) {
    case Impl::fast:
      target = detail::fast_kernel_target();
      break;
    case Impl::naive:
      target = "OpenBLAS sgemm";
      break;
    case Impl::reference:
      target = "scalar float64";
      break;
  }

  nlohmann::json j;
  j["impl"] = impl_name(config.impl);
  j["pass"] = config.backward ? "backward" : "forward";
  j["dtype"] = "float32";
  j["batch"] = B;
  j["heads"] = H;
  j["kv_heads"] = Hkv;
  j["seq"] = L;
  j["kv_seq"] = S;
  j["dim"] = E;
  j["value_dim"] = Ev;
  j["causal"] = causal_name(config.causal);
  j["threads"] = threads;
  j["repeat"] = config.repeat;
  j["seconds"] = seconds;
  j["seconds_median"] = median;
  j["seconds_min"] = sorted.front();
  j["seconds_max"] = sorted.back();
  j["flops"] = flops;
  j["gflops_median"] = gflops;
  j["gflops_best"] = flops / sorted.front() * 1e-9;
  j["peak_gflops"] = peak;
  j["peak_target"] = peak_target_name();
  j["percent_of_peak"] = 100.0 * gflops / peak;
  j["cpu_seconds_median"] = cpu_median;
  j["peak_gflops_per_cpu_second"] = peak_result.cpu_gflops;
  j["percent_of_peak_cpu_time"] = 100.0 * flops / cpu_median * 1e-9 / peak_result.cpu_gflops;
  j["target"] = target;
  j["cpu"] = cpu_model();
  j["max_rss_mib"] = max_rss_mib();
  return j;
}

}  // namespace sdpa::bench
