// `--context-parallel ring|ulysses` for `sdpa attention` and `sdpa bench`: the same command run
// under mpirun, each rank holding a shard of the sequence (see src/mpi/context_parallel.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "bench/bench.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {

struct ContextParallelCall {
  std::string strategy;  // "" when not asked for
  double timeout = 120;
};

/// Adds --context-parallel and --cp-timeout to a command.
void add_context_parallel_options(CLI::App* cmd, ContextParallelCall& call);

struct AttentionFiles {
  std::string query, key, value, mask, out, lse, grad_output, grad_query, grad_key, grad_value;
};

/// `sdpa attention --context-parallel ...`: every rank reads its shard of each input, the ranks
/// compute together, rank 0 gathers and writes the same files a single process writes.
void run_context_parallel_attention(const AttentionFiles& files, const AttentionOptions& options,
                                    const ContextParallelCall& call);

/// `sdpa bench --context-parallel ...`: per-rank compute, communication and overlap.
void run_context_parallel_bench(const bench::BenchConfig& config, const ContextParallelCall& call,
                                bool json);

}  // namespace sdpa::cli
