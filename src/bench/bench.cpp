// `sdpa bench`: times one attention configuration the way the targets are stated.
// Allocation, random inputs and one warm-up call happen before the timed loop, so the loop
// measures the kernel with its workspaces already faulted in (a fresh page costs ~15 us here).
#include "bench/bench.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/problem.h"
#include "kernels/decode.h"
#include "kernels/dispatch.h"
#include "sdpa/array.h"
#include "sdpa/kvcache.h"

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

// Random inputs drawn in float32 and rounded once to dtype. A float32 draw is returned as it
// is: a copy would free a block the size of an input, and once glibc's mmap threshold has risen
// past that size (it does when the first such block is freed) freed blocks stay resident, which
// put 48 MiB of dead copies into the peak RSS of a backward at (1, 1, 65536, 64).
Array random_input(std::vector<std::int64_t> shape, std::uint64_t seed, DType dtype) {
  Array a = random_normal(std::move(shape), seed);
  if (dtype == DType::float32) return a;
  return a.astype(dtype);
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

// The median of x (0 for none).
double median_of(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n == 0 ? 0.0 : n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// The fields both benchmarks write first: what ran, on which shape, and the timings.
struct Header {
  std::string impl, pass, dtype;
  std::int64_t batch, heads, kv_heads, seq, kv_seq, dim, value_dim;
  std::string causal;
  int threads, repeat;
};

nlohmann::json header_json(const Header& h, const std::vector<double>& seconds) {
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json j;
  j["impl"] = h.impl;
  j["pass"] = h.pass;
  j["dtype"] = h.dtype;
  j["batch"] = h.batch;
  j["heads"] = h.heads;
  j["kv_heads"] = h.kv_heads;
  j["seq"] = h.seq;
  j["kv_seq"] = h.kv_seq;
  j["dim"] = h.dim;
  j["value_dim"] = h.value_dim;
  j["causal"] = h.causal;
  j["threads"] = h.threads;
  j["repeat"] = h.repeat;
  j["seconds"] = seconds;
  j["seconds_median"] = median_of(seconds);
  j["seconds_min"] = sorted.front();
  j["seconds_max"] = sorted.back();
  j["cpu"] = cpu_model();
  return j;
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
  const TargetScope target_scope(config.target);
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
  options.window_left = config.window_left;
  options.window_right = config.window_right;
  options.softcap = config.softcap;
  if (config.alibi) {
    for (std::int64_t h = 0; h < H; ++h) {
      options.alibi_slopes.push_back(std::exp2(-8.0 * double(h + 1) / double(H)));
    }
  }
  if (config.sinks) options.sinks.assign(static_cast<std::size_t>(H), 0.0);
  options.dropout_p = config.dropout_p;
  options.seed = config.seed;

  const DType dt = config.dtype;  // inputs drawn in float32, rounded once to dt
  const Array q = random_input({B, H, L, E}, 1, dt);
  const Array k = random_input({B, Hkv, S, E}, 2, dt);
  const Array v = random_input({B, Hkv, S, Ev}, 3, dt);
  Array out(dt, {B, H, L, Ev}), lse(DType::float32, {B, H, L});  // lse float32 for 16-bit too
  Array dout, dq, dk, dv;
  const MutableTensorRef lse_ref = lse.mut();
  const auto forward = [&] { attention_forward(q, k, v, nullptr, options, out.mut(), &lse_ref); };
  std::function<void()> call = forward;
  if (config.backward) {
    dout = random_input({B, H, L, Ev}, 4, dt);
    dq = Array(dt, q.shape());
    dk = Array(dt, k.shape());
    dv = Array(dt, v.shape());
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
  const double median = median_of(seconds);

  // Forward 2 * B * H * L * S * (E + Ev) (= 4 B H L S E when Ev = E), halved when causal;
  // backward 2.5 times that (the usual convention: 5 products instead of 2).
  double flops = 2.0 * double(B) * double(H) * double(L) * double(S) * double(E + Ev);
  if (config.causal != Causal::none) flops *= 0.5;
  const bool window = config.window_left >= 0 || config.window_right >= 0;
  if (window) {  // the visible pairs, row by row (keys [i + d - left, i + d + right] and causal)
    double pairs = 0.0;
    const std::int64_t d = S - L;
    for (std::int64_t i = 0; i < L; ++i) {
      std::int64_t lo = config.window_left >= 0 ? i + d - config.window_left : 0;
      std::int64_t hi = config.window_right >= 0 ? i + d + config.window_right : S - 1;
      if (config.causal == Causal::upper_left) hi = std::min(hi, i);
      if (config.causal == Causal::lower_right) hi = std::min(hi, i + d);
      lo = std::max<std::int64_t>(lo, 0);
      hi = std::min(hi, S - 1);
      if (hi >= lo) pairs += double(hi - lo + 1);
    }
    flops = 2.0 * double(B) * double(H) * pairs * double(E + Ev);
  }
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

  nlohmann::json j =
      header_json({impl_name(config.impl), config.backward ? "backward" : "forward", dtype_name(dt),
                   B, H, Hkv, L, S, E, Ev, causal_name(config.causal), threads, config.repeat},
                  seconds);
  j["flops"] = flops;
  if (options.window_left >= 0 || options.window_right >= 0 || options.softcap > 0.0 ||
      config.alibi || config.sinks || options.dropout_p > 0.0) {
    j["variants"] = {{"window", {options.window_left, options.window_right}},
                     {"softcap", options.softcap},
                     {"alibi", config.alibi},
                     {"sinks", config.sinks},
                     {"dropout_p", options.dropout_p},
                     {"seed", options.seed}};
  }
  j["gflops_median"] = gflops;
  j["gflops_best"] = flops / sorted.front() * 1e-9;
  j["peak_gflops"] = peak;
  j["peak_target"] = peak_target_name();
  j["percent_of_peak"] = 100.0 * gflops / peak;
  j["cpu_seconds_median"] = cpu_median;
  j["peak_gflops_per_cpu_second"] = peak_result.cpu_gflops;
  j["percent_of_peak_cpu_time"] = 100.0 * flops / cpu_median * 1e-9 / peak_result.cpu_gflops;
  j["target"] = target;
  j["max_rss_mib"] = max_rss_mib();
  return j;
}

}  // namespace sdpa::bench

// ---- the KV-cache (decode) shape -------------------------------------------------------------

namespace sdpa::bench {
namespace {

// A KV cache as a server allocates it once at start-up: 2 MiB aligned, on transparent huge
// pages, like the array of the streaming-read probe it is compared with (4 KiB pages cost
// both of them a TLB miss per page; the probe would otherwise be measured on different terms).
struct CacheBuffer {
  void* data = nullptr;
  DType dtype;
  std::int64_t numel = 1;
  std::vector<std::int64_t> shape;
  CacheBuffer(DType t, std::vector<std::int64_t> s) : dtype(t), shape(std::move(s)) {
    for (const std::int64_t x : shape) numel *= x;
    const std::size_t es = dtype_size(dtype);
    detail::check_allocation(numel * static_cast<std::int64_t>(es),
                             fmt::format("KV cache of shape {}", shape_string(shape)));
    const std::size_t align = std::size_t{2} << 20;
    const std::size_t bytes = (static_cast<std::size_t>(numel) * es + align - 1) / align * align;
    data = std::aligned_alloc(align, std::max(bytes, align));
    if (data == nullptr) throw std::bad_alloc();
    madvise(data, std::max(bytes, align), MADV_HUGEPAGE);  // advice only; failure is harmless
  }
  CacheBuffer(const CacheBuffer&) = delete;
  CacheBuffer& operator=(const CacheBuffer&) = delete;
  ~CacheBuffer() { std::free(data); }
  MutableTensorRef mut() const { return MutableTensorRef{data, dtype, shape}; }
};

// Cheap uniform [-1, 1) entries (xorshift64*): a cache of 10^8 values would take seconds with
// the normal distribution, and the timing does not depend on the values.
void fill_uniform(CacheBuffer& c, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* f = static_cast<float*>(c.data);
  auto* h = static_cast<std::uint16_t*>(c.data);
  for (std::int64_t i = 0; i < c.numel; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const float u =
        static_cast<float>((x * 0x2545F4914F6CDD1Dull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if (c.dtype == DType::float16) {
      h[i] = detail::float_to_float16(u);
    } else if (c.dtype == DType::bfloat16) {
      h[i] = detail::float_to_bfloat16(u);
    } else {
      f[i] = u;
    }
  }
}

}  // namespace

nlohmann::json run_decode_bench(const BenchConfig& config) {
  const TargetScope target_scope(config.target);
  if (config.kv_tiles != "auto" && config.kv_tiles != "copy" && config.kv_tiles != "in-place") {
    throw Error(
        fmt::format("--kv-tiles: expected auto, copy or in-place, got {}", config.kv_tiles));
  }
  struct TileReadScope {
    detail::DecodeTileRead previous;
    ~TileReadScope() { detail::set_decode_tile_read(previous); }
  } const tile_read{detail::set_decode_tile_read(
      config.kv_tiles == "copy"       ? detail::DecodeTileRead::copy
      : config.kv_tiles == "in-place" ? detail::DecodeTileRead::in_place
                                      : detail::DecodeTileRead::automatic)};
  if (config.kv_order != "auto" && config.kv_order != "memory" && config.kv_order != "page") {
    throw Error(fmt::format("--kv-order: expected auto, memory or page, got {}", config.kv_order));
  }
  struct KeyOrderScope {
    detail::DecodeKeyOrder previous;
    ~KeyOrderScope() { detail::set_decode_key_order(previous); }
  } const key_order{detail::set_decode_key_order(
      config.kv_order == "memory" ? detail::DecodeKeyOrder::memory
      : config.kv_order == "page" ? detail::DecodeKeyOrder::page
                                  : detail::DecodeKeyOrder::automatic)};
  const std::int64_t H = config.heads, L = config.seq;
  const std::int64_t Hkv = config.kv_heads == 0 ? H : config.kv_heads;
  const std::int64_t E = config.dim, Ev = config.value_dim == 0 ? E : config.value_dim;
  std::vector<std::int64_t> lens = config.kv_lens;
  if (lens.empty()) {
    require_positive(config.batch, "--batch");
    const std::int64_t S = config.kv_seq == 0 ? config.seq : config.kv_seq;
    require_positive(S, "--kv-seq");
    lens.assign(static_cast<std::size_t>(config.batch), S);
  }
  for (const std::int64_t n : lens) {
    if (n < 0 || n > INT32_MAX) {
      throw Error(fmt::format("--kv-lens: expected lengths in [0, 2^31), got {}", n));
    }
  }
  const auto B = static_cast<std::int64_t>(lens.size());
  require_positive(H, "--heads");
  require_positive(Hkv, "--kv-heads");
  require_positive(L, "--seq");
  require_positive(E, "--dim");
  require_positive(Ev, "--value-dim");
  require_positive(config.repeat, "--repeat");
  if (config.page_size < 0) {
    throw Error(fmt::format("--page-size: expected 0 (contiguous) or a positive integer, got {}",
                            config.page_size));
  }
  if (H % Hkv != 0) {
    throw Error(fmt::format("--kv-heads: expected a divisor of --heads {}, got {}", H, Hkv));
  }
  const int threads = resolve_threads(config.threads);
  const std::int64_t S_max = *std::max_element(lens.begin(), lens.end());
  const std::int64_t page = config.page_size;

  // Paged: every sequence gets ceil(len / page) pages, handed out in a shuffled order, as an
  // allocator that has been running a while would.
  std::vector<std::int32_t> table, seqlens(lens.begin(), lens.end());
  std::int64_t rows = B * S_max, max_blocks = 0;
  if (page > 0) {
    std::int64_t blocks = 0;
    for (const std::int64_t n : lens) {
      blocks += (n + page - 1) / page;
      max_blocks = std::max(max_blocks, (n + page - 1) / page);
    }
    rows = std::max<std::int64_t>(blocks, 1) * page;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1)));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(7));
    table.assign(static_cast<std::size_t>(B * std::max<std::int64_t>(max_blocks, 1)), -1);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < (lens[static_cast<std::size_t>(b)] + page - 1) / page; ++i) {
        table[static_cast<std::size_t>(b * max_blocks + i)] = ids[next++];
      }
    }
    max_blocks = std::max<std::int64_t>(max_blocks, 1);
  }
  const std::vector<std::int64_t> k_shape =
      page > 0 ? std::vector<std::int64_t>{rows / page, page, Hkv, E}
               : std::vector<std::int64_t>{B, S_max, Hkv, E};
  std::vector<std::int64_t> v_shape = k_shape;
  v_shape.back() = Ev;
  // The query (and out) in --dtype; a cache that the library reads only with a float32 query
  // (a float32 cache after a 16-bit query: a float32 model's decode) gets the float32 query.
  const DType q_dtype = config.dtype;
  const Array q32 = random_normal({B, L, H, E}, 1);
  const Array q = q32.astype(q_dtype);
  const auto query_for = [&](DType cache) {
    const bool same = q_dtype == DType::float32 || cache == DType::float16 ||
                      (cache == DType::bfloat16 && q_dtype == DType::bfloat16);
    return same ? q_dtype : DType::float32;
  };
  if (query_for(config.kv_dtype) != q_dtype) {
    throw Error(fmt::format(
        "--dtype: expected float32, or a 16-bit query over a 16-bit --kv-dtype (bfloat16 over "
        "bfloat16 or float16, float16 over float16), got --dtype {} over --kv-dtype {}",
        dtype_name(q_dtype), dtype_name(config.kv_dtype)));
  }
  const auto check_cache_dtype = [](DType t, const char* option) {
    if (t != DType::float32 && t != DType::float16 && t != DType::bfloat16) {
      throw Error(
          fmt::format("{}: expected float32, float16 or bfloat16, got {}", option, dtype_name(t)));
    }
  };
  check_cache_dtype(config.kv_dtype, "--kv-dtype");
  for (std::size_t i = 0; i < config.kv_compare.size(); ++i) {
    const DType t = config.kv_compare[i];
    check_cache_dtype(t, "--kv-compare");
    if (t == config.kv_dtype || std::find(config.kv_compare.begin(), config.kv_compare.begin() + i,
                                          t) != config.kv_compare.begin() + i) {
      throw Error(fmt::format(
          "--kv-compare: expected dtypes other than --kv-dtype {} and each once, got {} twice",
          dtype_name(config.kv_dtype), dtype_name(t)));
    }
  }
  CacheBuffer k_cache(config.kv_dtype, k_shape), v_cache(config.kv_dtype, v_shape);
  fill_uniform(k_cache, 2);
  fill_uniform(v_cache, 3);
  std::vector<std::unique_ptr<CacheBuffer>> k_other, v_other;
  for (const DType t : config.kv_compare) {
    k_other.push_back(std::make_unique<CacheBuffer>(t, k_shape));
    v_other.push_back(std::make_unique<CacheBuffer>(t, v_shape));
    fill_uniform(*k_other.back(), 2);
    fill_uniform(*v_other.back(), 3);
  }
  Array out(q_dtype, {B, L, H, Ev}), out32(DType::float32, {B, L, H, Ev});
  Array lse(DType::float32, {B, H, L});
  const Int32TensorRef seqlens_ref{seqlens.data(), {B}};
  const Int32TensorRef table_ref{table.data(), {B, max_blocks}};
  KVCacheInputs inputs;
  inputs.cache_seqlens = &seqlens_ref;
  if (page > 0) inputs.block_table = &table_ref;
  KVCacheOptions options;
  options.threads = threads;
  options.causal = config.causal != Causal::none;
  const MutableTensorRef lse_ref = lse.mut();
  const auto call = [&] {
    attention_with_kvcache(q, k_cache.mut(), v_cache.mut(), inputs, options, out.mut(), &lse_ref);
  };
  const auto call_other = [&](std::size_t i) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool wide = query_for(config.kv_compare[i]) != q_dtype;
    attention_with_kvcache(wide ? q32 : q, k_other[i]->mut(), v_other[i]->mut(), inputs, options,
                           wide ? out32.mut() : out.mut(), &lse_ref);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  call();  // warm-up: workspaces, threads
  for (std::size_t i = 0; i < k_other.size(); ++i) call_other(i);

  std::vector<double> seconds, cpu_seconds;
  std::vector<std::vector<double>> other_seconds(k_other.size());
  for (int r = 0; r < config.repeat; ++r) {
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu_seconds.push_back(process_cpu_seconds() - c0);
    for (std::size_t i = 0; i < k_other.size(); ++i) other_seconds[i].push_back(call_other(i));
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  std::sort(cpu_seconds.begin(), cpu_seconds.end());
  const double median = median_of(seconds);
  const std::int64_t total_keys = std::accumulate(lens.begin(), lens.end(), std::int64_t{0});
  // Bytes that must come from memory: every cached K and V row once per kv head.
  const double kv_bytes =
      double(total_keys) * double(Hkv) * double(E + Ev) * double(dtype_size(config.kv_dtype));
  const double flops = 2.0 * double(total_keys) * double(H) * double(L) * double(E + Ev);
  // Bandwidth after the timing, in the same process and the same minute: the ratio of the two is
  // what holds on a shared machine whose absolute figures drift with the load.
  const ReadBandwidth bw = measure_read_bandwidth(threads);
  const double gbps = kv_bytes / median * 1e-9;

  nlohmann::json j =
      header_json({"fast", "kv-cache", dtype_name(q_dtype), B, H, Hkv, L, S_max, E, Ev,
                   options.causal ? "lower-right" : "none", threads, config.repeat},
                  seconds);
  j["kv_lens"] = lens;
  j["page_size"] = page;
  j["kv_dtype"] = dtype_name(config.kv_dtype);
  j["cache_pages"] = "huge (MADV_HUGEPAGE, as the streaming-read probe)";
  j["cpu_seconds_median"] = cpu_seconds[cpu_seconds.size() / 2];
  j["flops"] = flops;
  j["gflops_median"] = flops / median * 1e-9;
  j["kv_bytes"] = kv_bytes;
  j["kv_gbps_median"] = gbps;
  j["kv_gbps_best"] = kv_bytes / sorted.front() * 1e-9;
  j["read_gbps"] = bw.median_gbps;
  j["read_gbps_best"] = bw.best_gbps;
  j["percent_of_read_bandwidth"] = 100.0 * gbps / bw.median_gbps;
  const double cpu_gbps = kv_bytes / cpu_seconds[cpu_seconds.size() / 2] * 1e-9;
  j["kv_gbps_per_cpu_second"] = cpu_gbps;
  j["read_gbps_per_cpu_second"] = bw.per_cpu_second_gbps;
  j["percent_of_read_bandwidth_cpu_time"] = 100.0 * cpu_gbps / bw.per_cpu_second_gbps;
  // Each compared dtype: its own median, and the median over rounds of its time divided by
  // kv_dtype's in the same round (a load that drifts between rounds cancels in the ratio).
  nlohmann::json compare = nlohmann::json::array();
  for (std::size_t i = 0; i < k_other.size(); ++i) {
    const DType t = config.kv_compare[i];
    std::vector<double> ratio, s = other_seconds[i];
    for (std::size_t r = 0; r < s.size(); ++r) ratio.push_back(s[r] / seconds[r]);
    const double other_median = median_of(s),
                 bytes = kv_bytes / double(dtype_size(config.kv_dtype)) * double(dtype_size(t));
    compare.push_back({{"kv_dtype", dtype_name(t)},
                       {"dtype", dtype_name(query_for(t))},
                       {"seconds_median", other_median},
                       {"kv_gbps_median", bytes / other_median * 1e-9},
                       {"seconds_ratio_paired_median", median_of(ratio)}});
  }
  if (!compare.empty()) j["compare"] = compare;
  j["target"] = detail::decode_kernel_target();
  // What the rule chose for these caches (position-major; with one kv head nothing is copied).
  j["kv_tiles"] = config.kv_tiles;
  j["kv_tiles_copied"] = Hkv > 1 && detail::decode_copies_tiles();
  // The key order's rule, and what it gives these sizes: P tiles per group (1: memory order).
  j["kv_order"] = config.kv_order;
  j["kv_page_rows"] = detail::decode_page_rows(Hkv, E, Ev);
  j["max_rss_mib"] = max_rss_mib();
  return j;
}

}  // namespace sdpa::bench
