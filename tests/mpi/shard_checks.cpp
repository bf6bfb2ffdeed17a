// Run under mpirun with 3 ranks: shards that do not fit the layout, or differ between ranks,
// give every rank the same sdpa::Error (no rank hangs, none computes), and a call with good
// shards still works afterwards. Exits non-zero on any failure.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "mpi/context_parallel.h"
#include "sdpa/array.h"

namespace {

int failures = 0;
int rank = 0, ranks = 1;

void expect_error(const std::string& what, const std::string& needle,
                  const std::function<void()>& call) {
  std::string got = "(no error)";
  try {
    call();
  } catch (const sdpa::Error& e) {
    got = e.what();
  }
  const bool ok = got.find(needle) != std::string::npos;
  if (!ok) ++failures;
  std::printf("%s rank %d: %s: %s\n", ok ? "ok  " : "FAIL", rank, what.c_str(), got.c_str());
}

sdpa::Array filled(std::vector<std::int64_t> shape, float base) {
  sdpa::Array a(sdpa::DType::float32, std::move(shape));
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = base + 0.001f * (i % 97);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  using sdpa::mpi::shard_ranges;
  sdpa::mpi::ContextParallelOptions o;
  o.attention.threads = 1;
  o.timeout_seconds = 20;
  const std::int64_t L = 31, H = 2, E = 8;
  const std::int64_t rows = shard_ranges(L, ranks, rank, false)[0].size();
  const sdpa::Array q = filled({H, rows, E}, 0.1f * rank), k = filled({H, rows, E}, 0.2f),
                    v = filled({H, rows, E}, 0.3f);
  sdpa::Array out(sdpa::DType::float32, {H, rows, E}), lse(sdpa::DType::float32, {H, rows});

  // Rank 0 holds one row too many (31 rows over 3 ranks are 10, 10, 11; with the extra row the
  // 32 rows are 10, 11, 11): everyone is told which rank and what the layout expects.
  const sdpa::Array q_bad = filled({H, rank == 0 ? rows + 1 : rows, E}, 0.1f);
  sdpa::Array out_bad(sdpa::DType::float32, q_bad.shape()),
      lse_bad(sdpa::DType::float32, {H, q_bad.shape()[1]});
  expect_error("rank 0 holds an extra query row", "query: rank 0 holds 11 rows", [&] {
    sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q_bad, k, v, nullptr, o, out_bad.mut(),
                                        lse_bad.mut());
  });
  // The last rank's key has another feature size.
  const sdpa::Array k_bad = filled({H, rows, rank == ranks - 1 ? E + 1 : E}, 0.2f);
  expect_error("the last rank's key has another feature size",
               "key: rank " + std::to_string(ranks - 1) + "'s shard has shape", [&] {
                 sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k_bad, v, nullptr, o,
                                                     out.mut(), lse.mut());
               });
  // Rank 0 alone asks for causal.
  sdpa::mpi::ContextParallelOptions o_bad = o;
  if (rank == 0) o_bad.attention.causal = sdpa::Causal::upper_left;
  expect_error("rank 0 alone asks for causal", "options or mask presence differ", [&] {
    sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k, v, nullptr, o_bad, out.mut(),
                                        lse.mut());
  });
  // Variants the ranks cannot compute block by block are refused on every rank, not ignored.
  const std::pair<const char*, std::function<void(sdpa::AttentionOptions&)>> variants[] = {
      {"window_left, window_right: expected -1, -1", [](auto& a) { a.window_left = 4; }},
      {"sinks: expected none",
       [](auto& a) {
         a.sinks = {0.5, 0.5};
       }},
      {"dropout_p: expected 0", [](auto& a) { a.dropout_p = 0.1; }},
  };
  for (const auto& [needle, set] : variants) {
    sdpa::mpi::ContextParallelOptions o_variant = o;
    set(o_variant.attention);
    expect_error(needle, needle, [&] {
      sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k, v, nullptr, o_variant, out.mut(),
                                          lse.mut());
    });
  }
  // A wrongly shaped output on one rank is a local error every rank hears of.
  sdpa::Array lse_short(sdpa::DType::float32, {H, rank == 2 ? rows - 1 : rows});
  expect_error("rank 2's lse has a row too few", "rank 2: lse: expected the shard shape", [&] {
    sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k, v, nullptr, o, out.mut(),
                                        lse_short.mut());
  });
  // And the good call still runs, twice with identical bits.
  sdpa::Array out2(sdpa::DType::float32, out.shape()), lse2(sdpa::DType::float32, lse.shape());
  sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k, v, nullptr, o, out.mut(), lse.mut());
  sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k, v, nullptr, o, out2.mut(), lse2.mut());
  const bool same = std::memcmp(out.data(), out2.data(), out.nbytes()) == 0 &&
                    std::memcmp(lse.data(), lse2.data(), lse.nbytes()) == 0;
  // A dropout probability below 2^-17 drops nothing (as in one process): the same bits.
  sdpa::mpi::ContextParallelOptions o_tiny = o;
  o_tiny.attention.dropout_p = 1e-6;
  sdpa::Array out3(sdpa::DType::float32, out.shape()), lse3(sdpa::DType::float32, lse.shape());
  sdpa::mpi::context_parallel_forward(MPI_COMM_WORLD, q, k, v, nullptr, o_tiny, out3.mut(),
                                      lse3.mut());
  const bool tiny = std::memcmp(out.data(), out3.data(), out.nbytes()) == 0;
  if (!tiny) ++failures;
  std::printf("%s rank %d: dropout_p 1e-6 is no dropout, the same bits\n", tiny ? "ok  " : "FAIL",
              rank);
  if (!same) ++failures;
  std::printf("%s rank %d: good shards after the errors, identical bits twice\n",
              same ? "ok  " : "FAIL", rank);
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
