// sdpa bench: the benchmark people will quote (see src/bench/bench.h and docs/kernel.md).
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "bench/bench.h"
#include "commands.h"
#include "options.h"
#ifdef SDPA_HAS_MPI
#include "cmd_context_parallel.h"
#endif
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

struct BenchArgs {
  bench::BenchConfig config;
  std::string causal = "none";
  std::string impl = "fast";
  std::string dtype = "float32";
  std::string kv_dtype = "float32";
  std::vector<std::string> kv_compare;
  std::vector<std::int64_t> window;  // --window LEFT,RIGHT
  bool peak = false;
  bool json = false;
#ifdef SDPA_HAS_MPI
  ContextParallelCall context_parallel;
#endif
};

// --dtype, --kv-dtype and --kv-compare, whose values CLI11 has already checked.
DType bench_dtype(const std::string& name) {
  return name == "bfloat16" ? DType::bfloat16 : name == "float16" ? DType::float16 : DType::float32;
}

void print_human(const nlohmann::json& j) {
  std::cout << fmt::format("{} {}: B={} H={} Hkv={} L={} S={} E={} Ev={} causal={}\n",
                           j["impl"].get<std::string>(), j["pass"].get<std::string>(),
                           j["batch"].get<std::int64_t>(), j["heads"].get<std::int64_t>(),
                           j["kv_heads"].get<std::int64_t>(), j["seq"].get<std::int64_t>(),
                           j["kv_seq"].get<std::int64_t>(), j["dim"].get<std::int64_t>(),
                           j["value_dim"].get<std::int64_t>(), j["causal"].get<std::string>());
  if (j.contains("variants")) std::cout << "  variants: " << j["variants"].dump() << "\n";
  std::cout << fmt::format("  seconds: median {:.6f}  min {:.6f}  max {:.6f}  ({} runs)\n",
                           j["seconds_median"].get<double>(), j["seconds_min"].get<double>(),
                           j["seconds_max"].get<double>(), j["repeat"].get<int>());
  std::cout << fmt::format(
      "  {:.1f} GFLOP/s (median) = {:.1f}% of the measured FP32 peak {:.0f} GFLOP/s\n",
      j["gflops_median"].get<double>(), j["percent_of_peak"].get<double>(),
      j["peak_gflops"].get<double>());
  std::cout << fmt::format(
      "  per CPU-second: {:.1f}% of the loop's (CPU time {:.6f} s per call; robust to load)\n",
      j["percent_of_peak_cpu_time"].get<double>(), j["cpu_seconds_median"].get<double>());
  std::cout << fmt::format("  target {}, {} threads, CPU {}, peak RSS {:.0f} MiB\n",
                           j["target"].get<std::string>(), j["threads"].get<int>(),
                           j["cpu"].get<std::string>(), j["max_rss_mib"].get<double>());
}

void print_decode(const nlohmann::json& j) {
  std::cout << fmt::format(
      "kv-cache: B={} Hq={} Hkv={} L={} S_max={} E={} Ev={} page={} causal={} cache {} "
      "query {}\n",
      j["batch"].get<std::int64_t>(), j["heads"].get<std::int64_t>(),
      j["kv_heads"].get<std::int64_t>(), j["seq"].get<std::int64_t>(),
      j["kv_seq"].get<std::int64_t>(), j["dim"].get<std::int64_t>(),
      j["value_dim"].get<std::int64_t>(), j["page_size"].get<std::int64_t>(),
      j["causal"].get<std::string>(), j["kv_dtype"].get<std::string>(),
      j["dtype"].get<std::string>());
  std::cout << fmt::format("  seconds: median {:.6f}  min {:.6f}  max {:.6f}  ({} runs)\n",
                           j["seconds_median"].get<double>(), j["seconds_min"].get<double>(),
                           j["seconds_max"].get<double>(), j["repeat"].get<int>());
  std::cout << fmt::format(
      "  K/V read: {:.1f} GB/s (median; {:.0f} MB per call) = {:.1f}% of the streaming-read "
      "bandwidth {:.1f} GB/s measured in this run\n",
      j["kv_gbps_median"].get<double>(), j["kv_bytes"].get<double>() * 1e-6,
      j["percent_of_read_bandwidth"].get<double>(), j["read_gbps"].get<double>());
  std::cout << fmt::format(
      "  per CPU-second: {:.1f} GB/s = {:.1f}% of the streaming read's {:.1f} (robust to load)\n",
      j["kv_gbps_per_cpu_second"].get<double>(),
      j["percent_of_read_bandwidth_cpu_time"].get<double>(),
      j["read_gbps_per_cpu_second"].get<double>());
  if (j.contains("compare")) {
    for (const nlohmann::json& c : j["compare"]) {
      std::cout << fmt::format(
          "  {} cache, same rounds: median {:.6f} s, {:.1f} GB/s; its time / {}'s: {:.3f} "
          "(median over the rounds)\n",
          c["kv_dtype"].get<std::string>(), c["seconds_median"].get<double>(),
          c["kv_gbps_median"].get<double>(), j["kv_dtype"].get<std::string>(),
          c["seconds_ratio_paired_median"].get<double>());
    }
  }
  std::cout << fmt::format(
      "  target {}, tiles {} (--kv-tiles {}), keys in {} (--kv-order {}), {} threads, CPU {}, "
      "peak RSS {:.0f} MiB\n",
      j["target"].get<std::string>(), j["kv_tiles_copied"].get<bool>() ? "copied" : "read in place",
      j["kv_tiles"].get<std::string>(),
      j["kv_page_rows"].get<std::int64_t>() > 1
          ? fmt::format("page order ({} tiles a group)", j["kv_page_rows"].get<std::int64_t>())
          : std::string("memory order"),
      j["kv_order"].get<std::string>(), j["threads"].get<int>(), j["cpu"].get<std::string>(),
      j["max_rss_mib"].get<double>());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time attention on random inputs (float32, or --dtype): median/min/max seconds, GFLOP/s "
      "(forward "
      "4*B*H*L*S*E, halved when causal; backward 2.5x), % of the measured FP32 peak");
  bench::BenchConfig& c = a->config;
  cmd->add_option("--batch", c.batch, "B")->capture_default_str();
  cmd->add_option("--heads", c.heads, "query heads H")->capture_default_str();
  cmd->add_option("--kv-heads", c.kv_heads, "key/value heads (default: --heads; fewer: GQA)");
  cmd->add_option("--seq", c.seq, "query length L")->capture_default_str();
  cmd->add_option("--kv-seq", c.kv_seq, "key/value length S (default: --seq)");
  cmd->add_option("--dim", c.dim, "query/key feature size E")->capture_default_str();
  cmd->add_option("--value-dim", c.value_dim, "value feature size Ev (default: --dim)");
  cmd->add_option("--causal", a->causal, "none, upper-left or lower-right")
      ->check(CLI::IsMember({"none", "upper-left", "lower-right"}))
      ->capture_default_str();
  cmd->add_flag("--backward", c.backward, "time the backward pass (forward done beforehand)");
  cmd->add_option("--impl", a->impl, "fast, reference or naive")
      ->check(CLI::IsMember({"fast", "reference", "naive"}))
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "query/key/value dtype: float32, or float16 / bfloat16 (float32 arithmetic; "
                  "docs/precision.md); with --kv-cache the query's (and out's)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}))
      ->capture_default_str();
  cmd->add_option("--threads", c.threads, "threads (0: one per core)")
      ->check(threads_validator())
      ->capture_default_str();
  cmd->add_option("--repeat", c.repeat, "timed runs after one warm-up")->capture_default_str();
  cmd->add_option("--window", a->window,
                  "LEFT,RIGHT: sliding window (keys i + S - L - LEFT .. i + S - L + RIGHT; -1 "
                  "unbounded); GFLOP/s count the visible pairs")
      ->delimiter(',')
      ->expected(2);
  cmd->add_option("--softcap", c.softcap, "logit softcap c (0: off)");
  cmd->add_flag("--alibi", c.alibi, "ALiBi with BLOOM's slopes 2^(-8 (h + 1) / H)");
  cmd->add_flag("--sinks", c.sinks, "one sink logit (0) per head");
  cmd->add_option("--dropout", c.dropout_p, "dropout probability p in [0, 1)");
  cmd->add_option("--seed", c.seed, "the dropout's seed")
      ->check(seed_validator())
      ->capture_default_str();
  cmd->add_flag("--kv-cache", c.kv_cache,
                "time attention_with_kvcache (decode): q (batch, seq, heads, dim) over a cache "
                "of --kv-seq rows per sequence (or --kv-lens); --seq defaults to 1 here; prints "
                "K/V bytes read per second and % of the streaming-read bandwidth");
  cmd->add_option("--page-size", c.page_size, "with --kv-cache: rows per page (0: contiguous)")
      ->capture_default_str();
  cmd->add_option("--kv-lens", c.kv_lens,
                  "with --kv-cache: one cache length per sequence (sets the batch), e.g. "
                  "--kv-lens 500 4000 32768")
      ->delimiter(',');
  cmd->add_option("--kv-dtype", a->kv_dtype,
                  "with --kv-cache: dtype of the caches (float32, float16 or bfloat16; the "
                  "queries stay float32)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}))
      ->capture_default_str();
  cmd->add_option("--kv-compare", a->kv_compare,
                  "with --kv-cache: also time caches of these dtypes (e.g. float32), one call of "
                  "each after every call of --kv-dtype's, and print each one's time over "
                  "--kv-dtype's, the median over the rounds (a ratio measured under one load)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}))
      ->delimiter(',');
  cmd->add_option("--kv-tiles", c.kv_tiles,
                  "with --kv-cache: how the decode kernel reads a position-major cache: auto (copy "
                  "each tile in memory order where L1d is at most 32 KiB, else in place), copy "
                  "or in-place; the results are bit-identical")
      ->check(CLI::IsMember({"auto", "copy", "in-place"}))
      ->capture_default_str();
  cmd->add_option("--kv-order", c.kv_order,
                  "with --kv-cache: the order in which the decode kernel takes the keys of cache "
                  "rows shorter than a page: auto (page on Intel CPUs, memory elsewhere), memory "
                  "(each tile's keys consecutive) or page (tiles interleaved so that each page "
                  "is read front to back); the orders agree to rounding")
      ->check(CLI::IsMember({"auto", "memory", "page"}))
      ->capture_default_str();
  cmd->add_flag("--peak", a->peak,
                "only measure the FP32 FMA peak (register-only loop, best SIMD target) and the "
                "streaming-read bandwidth (sum of a 512 MiB array, median of 5)");
  cmd->add_option("--target", c.target,
                  "SIMD target to run the kernels and the peak loop on (e.g. avx2; default: the "
                  "best this CPU supports), to time another machine's code here");
  cmd->add_flag("--json", a->json,
                "print one JSON object (\"seconds_median\", \"gflops_median\", ...)");
#ifdef SDPA_HAS_MPI
  add_context_parallel_options(cmd, a->context_parallel);
#endif
  cmd->callback([a, cmd] {
    if (a->peak) {
      const int threads = resolve_threads(a->config.threads);
      const bench::TargetScope target_scope(a->config.target);
      const bench::PeakResult peak = bench::measure_peak(threads);
      const bench::ReadBandwidth bw = bench::measure_read_bandwidth(threads);
      if (a->json) {
        std::cout << nlohmann::json{{"peak_gflops", peak.wall_gflops},
                                    {"peak_gflops_per_cpu_second", peak.cpu_gflops},
                                    {"read_gbps", bw.median_gbps},
                                    {"read_gbps_best", bw.best_gbps},
                                    {"read_gbps_per_cpu_second", bw.per_cpu_second_gbps},
                                    {"threads", threads},
                                    {"target", bench::peak_target_name()}}
                         .dump()
                  << "\n";
      } else {
        std::cout << fmt::format(
            "FP32 FMA peak: {:.1f} GFLOP/s on {} threads ({:.1f} per CPU-second), target {}\n",
            peak.wall_gflops, threads, peak.cpu_gflops, bench::peak_target_name());
        std::cout << fmt::format(
            "streaming read: {:.1f} GB/s on {} threads (sum of a 512 MiB array, median of 5; "
            "best {:.1f})\n",
            bw.median_gbps, threads, bw.best_gbps);
      }
      return;
    }
    // 0 stands for "the default" inside BenchConfig; given on the command line it is a size,
    // and a benchmark of an empty dimension times nothing.
    for (const auto& [flag, value] :
         {std::pair{"--kv-heads", a->config.kv_heads}, std::pair{"--kv-seq", a->config.kv_seq},
          std::pair{"--value-dim", a->config.value_dim}}) {
      if (cmd->count(flag) > 0 && value < 1) {
        throw Error(ErrorKind::bad_value, flag,
                    fmt::format("expected a positive integer, got {}", value));
      }
    }
    if (a->config.kv_cache && (a->config.backward || a->impl != "fast")) {
      throw Error(ErrorKind::bad_value, "--kv-cache",
                  fmt::format("expected without --backward and with --impl fast (the decode "
                              "benchmark times the fast forward), got {}",
                              a->config.backward ? "--backward" : "--impl " + a->impl));
    }
    if (!a->config.kv_cache) {
      for (const char* flag :
           {"--page-size", "--kv-lens", "--kv-dtype", "--kv-compare", "--kv-tiles", "--kv-order"}) {
        if (cmd->count(flag) > 0) {
          throw Error(ErrorKind::bad_value, flag,
                      "expected only with --kv-cache (it sets up the decode benchmark), got no "
                      "--kv-cache");
        }
      }
    }
    if (a->window.size() == 2) {
      a->config.window_left = a->window[0];
      a->config.window_right = a->window[1];
    }
    // The API's parameters, as this command spells them.
    const std::map<std::string, std::string> flags = {{"window_left", "--window"},
                                                      {"window_right", "--window"},
                                                      {"softcap", "--softcap"},
                                                      {"dropout_p", "--dropout"}};
    a->config.causal = parse_causal(a->causal);
    a->config.impl = parse_impl(a->impl);
    a->config.dtype = bench_dtype(a->dtype);
#ifdef SDPA_HAS_MPI
    if (!a->context_parallel.strategy.empty()) {
      return run_context_parallel_bench(a->config, a->context_parallel, a->json);
    }
#endif
    if (a->config.kv_cache && (!a->window.empty() || a->config.softcap != 0.0 || a->config.alibi ||
                               a->config.sinks || a->config.dropout_p != 0.0)) {
      throw Error(
          "--kv-cache: expected without --window, --softcap, --alibi, --sinks or "
          "--dropout (the decode path serves plain attention)");
    }
    if (a->config.kv_cache) {
      if (cmd->count("--seq") == 0) a->config.seq = 1;
      a->config.kv_dtype = bench_dtype(a->kv_dtype);
      a->config.kv_compare.clear();
      for (const std::string& name : a->kv_compare) {
        a->config.kv_compare.push_back(bench_dtype(name));
      }
      const nlohmann::json j =
          naming_flags(flags, [&] { return bench::run_decode_bench(a->config); });
      if (a->json) {
        std::cout << j.dump() << "\n";
      } else {
        print_decode(j);
      }
      return;
    }
    const nlohmann::json j = naming_flags(flags, [&] { return bench::run_bench(a->config); });
    if (a->json) {
      std::cout << j.dump() << "\n";
    } else {
      print_human(j);
    }
  });
}

}  // namespace sdpa::cli
