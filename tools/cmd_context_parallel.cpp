// `sdpa attention|bench --context-parallel ring|ulysses`, run under mpirun.
#include "cmd_context_parallel.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <utility>

#include "io/npy.h"
#include "io/npy_header.h"
#include "io/output.h"
#include "mpi/context_parallel.h"
#include "options.h"
#include "sdpa/array.h"

namespace sdpa::cli {
namespace {

// MPI_Init on first use (a plain `sdpa` never initialises MPI), MPI_Finalize on the way out,
// also when an error propagates: every rank then throws the same agreed error.
class MpiSession {
 public:
  MpiSession() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owned_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
  }
  ~MpiSession() {
    if (owned_) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

 private:
  bool owned_ = false;
  int rank_ = 0, ranks_ = 1;
};

std::vector<RowRange> row_ranges(const std::vector<mpi::Range>& ranges) {
  std::vector<RowRange> out;
  for (const mpi::Range& r : ranges) out.push_back({r.begin, r.end});
  return out;
}

int seq_axis_of(const NpyHeader& h, const std::string& flag, const std::string& path) {
  if (h.shape.size() < 2) {
    throw Error(
        fmt::format("{} {}: expected at least 2 dimensions (..., sequence, features), "
                    "got shape {}",
                    flag, path, shape_string(h.shape)));
  }
  return static_cast<int>(h.shape.size()) - 2;
}

std::vector<std::vector<mpi::Range>> all_ranges(std::int64_t n, int ranks, bool zigzag) {
  std::vector<std::vector<mpi::Range>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(mpi::shard_ranges(n, ranks, r, zigzag));
  return out;
}

}  // namespace

void add_context_parallel_options(CLI::App* cmd, ContextParallelCall& call) {
  cmd->add_option("--context-parallel", call.strategy,
                  "split the sequence over the ranks of mpirun: ring (K/V blocks pass around "
                  "the ranks) or ulysses (all-to-all of heads; needs kv heads >= ranks)")
      ->check(CLI::IsMember({"ring", "ulysses"}));
  cmd->add_option("--cp-timeout", call.timeout,
                  "with --context-parallel: seconds any rank waits for another before it aborts "
                  "the job")
      ->capture_default_str()
      ->check(positive_seconds_validator());
}

void run_context_parallel_attention(const AttentionFiles& f, const AttentionOptions& options,
                                    const ContextParallelCall& call) {
  MpiSession mpi;
  MPI_Comm comm = MPI_COMM_WORLD;
  mpi::ContextParallelOptions cp;
  cp.attention = options;
  cp.strategy = mpi::parse_strategy(call.strategy);
  cp.timeout_seconds = call.timeout;
  const bool zigzag = mpi::uses_zigzag(cp.strategy, options);

  // Rank 0 writes every output. As in one process, each output is validated (no input, no
  // other output, a writable place, its temporary created) before any input is read, and every
  // rank learns of a refusal before anyone computes. The temporaries of that check are removed
  // at once and made again only after the last exchange: while the ranks compute, a peer that
  // dies makes mpirun end rank 0 (SIGTERM, then SIGKILL a second later), and a SIGKILL leaves
  // whatever temporaries exist behind.
  std::optional<io::OutputCommit> commit;
  std::vector<std::pair<std::size_t, int>> slots;  // (commit index, which result) on rank 0
  enum Result { kOut, kLse, kDq, kDk, kDv };
  auto prepare_outputs = [&] {
    slots.clear();
    commit.emplace();
    commit->protect_input("--query", f.query);
    commit->protect_input("--key", f.key);
    commit->protect_input("--value", f.value);
    if (!f.mask.empty()) commit->protect_input("--mask", f.mask);
    if (!f.grad_output.empty()) commit->protect_input("--grad-output", f.grad_output);
    slots.emplace_back(commit->add_file("--out", f.out), kOut);
    if (!f.lse.empty()) slots.emplace_back(commit->add_file("--lse", f.lse), kLse);
    if (!f.grad_query.empty()) {
      slots.emplace_back(commit->add_file("--grad-query", f.grad_query), kDq);
    }
    if (!f.grad_key.empty()) slots.emplace_back(commit->add_file("--grad-key", f.grad_key), kDk);
    if (!f.grad_value.empty()) {
      slots.emplace_back(commit->add_file("--grad-value", f.grad_value), kDv);
    }
  };
  std::string error;
  if (mpi.rank() == 0) {
    try {
      prepare_outputs();
    } catch (const Error& e) {
      error = e.what();
    }
    commit.reset();  // removes the temporaries; the targets stay as they were
  }
  mpi::agree(comm, error, cp.timeout_seconds);

  // Every rank reads its own rows; any failure is agreed on before anyone computes.
  Array q, k, v, mask, dout;
  std::vector<std::vector<mpi::Range>> q_ranges, k_ranges;
  try {
    const NpyHeader hq = peek_npy(f.query), hk = peek_npy(f.key), hv = peek_npy(f.value);
    const int qa = seq_axis_of(hq, "--query", f.query);
    const int ka = seq_axis_of(hk, "--key", f.key);
    const int va = seq_axis_of(hv, "--value", f.value);
    const std::int64_t L = hq.shape[qa], S = hk.shape[ka];
    if (hv.shape[va] != S) {
      throw Error(fmt::format("--value {}: expected {} rows like --key, got shape {}", f.value, S,
                              shape_string(hv.shape)));
    }
    q_ranges = all_ranges(L, mpi.ranks(), zigzag);
    k_ranges = all_ranges(S, mpi.ranks(), zigzag);
    q = read_npy_rows(f.query, qa, row_ranges(q_ranges[mpi.rank()]));
    k = read_npy_rows(f.key, ka, row_ranges(k_ranges[mpi.rank()]));
    v = read_npy_rows(f.value, va, row_ranges(k_ranges[mpi.rank()]));
    if (!f.mask.empty()) {
      const NpyHeader hm = peek_npy(f.mask);
      const int nd = static_cast<int>(hm.shape.size());
      if (nd >= 2 && hm.shape[nd - 2] == L && L > 1) {
        mask = read_npy_rows(f.mask, nd - 2, row_ranges(q_ranges[mpi.rank()]));
      } else {
        mask = read_npy(f.mask);
      }
    }
    if (!f.grad_output.empty()) {
      const NpyHeader hd = peek_npy(f.grad_output);
      dout = read_npy_rows(f.grad_output, seq_axis_of(hd, "--grad-output", f.grad_output),
                           row_ranges(q_ranges[mpi.rank()]));
    }
  } catch (const Error& e) {
    error = e.what();
  }
  mpi::agree(comm, error, cp.timeout_seconds);

  const int qa = static_cast<int>(q.shape().size()) - 2;
  std::vector<std::int64_t> out_shape = q.shape();
  out_shape.back() = v.shape().back();
  Array out(q.dtype(), out_shape);
  Array lse(q.dtype(), std::vector<std::int64_t>(q.shape().begin(), q.shape().end() - 1));
  const TensorRef mask_ref = mask.ref();
  const TensorRef* mask_ptr = f.mask.empty() ? nullptr : &mask_ref;
  mpi::context_parallel_forward(comm, q, k, v, mask_ptr, cp, out.mut(), lse.mut());
  Array dq, dk, dv;
  if (!f.grad_output.empty()) {
    dq = Array(q.dtype(), q.shape());
    dk = Array(k.dtype(), k.shape());
    dv = Array(v.dtype(), v.shape());
    try {
      mpi::context_parallel_backward(comm, q, k, v, mask_ptr, out, lse, dout, cp, dq.mut(),
                                     dk.mut(), dv.mut());
    } catch (const Error& e) {
      const std::string what = e.what();
      const std::size_t at = what.find("grad_out:");
      if (at != std::string::npos) {
        throw Error(what.substr(0, at) + "--grad-output " + f.grad_output +
                    what.substr(at + std::string("grad_out").size()));
      }
      throw;
    }
  }

  // Rank 0 gathers every result and writes them all-or-nothing, as one process does.
  auto global = [&](const Array& shard, int axis, const std::vector<std::vector<mpi::Range>>& r) {
    std::vector<std::int64_t> shape = shard.shape();
    shape[axis] = 0;
    for (const auto& rs : r) {
      for (const mpi::Range& x : rs) shape[axis] = std::max(shape[axis], x.end);
    }
    Array full(shard.dtype(), mpi.rank() == 0 ? shape : std::vector<std::int64_t>{0});
    const MutableTensorRef ref = full.mut();
    mpi::gather_shards(comm, shard, axis, r, mpi.rank() == 0 ? &ref : nullptr, cp.timeout_seconds);
    return full;
  };
  Array results[5];
  results[kOut] = global(out, qa, q_ranges);
  if (!f.lse.empty()) results[kLse] = global(lse, qa, q_ranges);
  if (!f.grad_output.empty()) {
    results[kDq] = global(dq, qa, q_ranges);
    results[kDk] = global(dk, qa, k_ranges);
    results[kDv] = global(dv, qa, k_ranges);
  }
  error.clear();
  if (mpi.rank() == 0) {
    try {
      prepare_outputs();
      for (const auto& [index, which] : slots) io::write_npy(*commit, index, results[which].ref());
      commit->commit();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  mpi::agree(comm, error, cp.timeout_seconds);
}

void run_context_parallel_bench(const bench::BenchConfig& c, const ContextParallelCall& call,
                                bool json) {
  MpiSession mpi;
  MPI_Comm comm = MPI_COMM_WORLD;
  mpi::ContextParallelOptions cp;
  cp.attention.causal = c.causal;
  cp.attention.threads = c.threads;
  cp.attention.enable_gqa = c.kv_heads != 0 && c.kv_heads != c.heads;
  cp.strategy = mpi::parse_strategy(call.strategy);
  cp.timeout_seconds = call.timeout;
  if (c.impl != Impl::fast) {
    throw Error("--impl: expected fast with --context-parallel");
  }
  const std::int64_t Hkv = c.kv_heads != 0 ? c.kv_heads : c.heads;
  const std::int64_t S = c.kv_seq != 0 ? c.kv_seq : c.seq;
  const std::int64_t Ev = c.value_dim != 0 ? c.value_dim : c.dim;
  const bool zigzag = mpi::uses_zigzag(cp.strategy, cp.attention);
  std::int64_t Lr = 0, Sr = 0;
  for (const mpi::Range& r : mpi::shard_ranges(c.seq, mpi.ranks(), mpi.rank(), zigzag)) {
    Lr += r.size();
  }
  for (const mpi::Range& r : mpi::shard_ranges(S, mpi.ranks(), mpi.rank(), zigzag)) {
    Sr += r.size();
  }
  // Random shards: a fixed seed per rank, so runs repeat.
  std::mt19937_64 rng(1234 + mpi.rank());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](std::vector<std::int64_t> shape) {
    Array a(DType::float32, std::move(shape));
    for (std::int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = normal(rng);
    return a;
  };
  const Array q = random({c.batch, c.heads, Lr, c.dim});
  const Array k = random({c.batch, Hkv, Sr, c.dim});
  const Array v = random({c.batch, Hkv, Sr, Ev});
  const Array dout = random({c.batch, c.heads, Lr, Ev});
  Array out(DType::float32, {c.batch, c.heads, Lr, Ev}),
      lse(DType::float32, {c.batch, c.heads, Lr});
  Array dq(DType::float32, q.shape()), dk(DType::float32, k.shape()), dv(DType::float32, v.shape());

  std::vector<double> wall, compute, wait;
  mpi::CommStats stats;
  for (int run = 0; run <= c.repeat; ++run) {
    std::vector<MPI_Request> barrier(1);
    MPI_Ibarrier(comm, &barrier[0]);
    mpi::wait_bounded(comm, barrier, "the barrier before a timed run", cp.timeout_seconds);
    const double t0 = MPI_Wtime();
    if (!c.backward) {
      mpi::context_parallel_forward(comm, q, k, v, nullptr, cp, out.mut(), lse.mut(), &stats);
    } else {
      if (run == 0) mpi::context_parallel_forward(comm, q, k, v, nullptr, cp, out.mut(), lse.mut());
      mpi::context_parallel_backward(comm, q, k, v, nullptr, out, lse, dout, cp, dq.mut(), dk.mut(),
                                     dv.mut(), &stats);
    }
    const double t = MPI_Wtime() - t0;
    if (run == 0) continue;  // warm-up
    wall.push_back(t);
    compute.push_back(stats.compute_seconds);
    wait.push_back(stats.wait_seconds);
  }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x.empty() ? 0.0 : x[x.size() / 2];
  };
  // The same bytes moved with nothing to hide behind: the ring's steps one after the other, or
  // one all-to-all.
  const int P = mpi.ranks();
  // The fastest of five probes: a shared machine's noise only ever adds time. The buffers are
  // written before the clock starts (a fresh page's first touch costs more than its transfer).
  double alone = 0;
  const bool ring = cp.strategy == mpi::Strategy::ring;
  const int probe_steps = !ring ? 1 : c.backward ? 2 * (P - 1) : P - 1;
  // Every rank moves the same message size, the largest rank's (shards differ by a row, or a
  // rank holds none): a receive must match its sender's size, and every rank must take part.
  double my_bytes = P > 1 ? stats.bytes_sent / (ring ? probe_steps : P - 1) : 0.0, max_bytes = 0;
  {
    std::vector<MPI_Request> r(1);
    MPI_Iallreduce(&my_bytes, &max_bytes, 1, MPI_DOUBLE, MPI_MAX, comm, &r[0]);
    mpi::wait_bounded(comm, r, "agreeing on the probe's size", cp.timeout_seconds);
  }
  const auto probe_bytes = static_cast<std::size_t>(max_bytes);
  std::vector<char> send(probe_bytes * (ring ? 1 : P), 1), recv(send.size(), 1);
  for (int probe = 0; probe < 5 && P > 1 && probe_bytes > 0; ++probe) {
    const double t0 = MPI_Wtime();
    if (ring) {
      for (int s = 0; s < probe_steps; ++s) {
        std::vector<MPI_Request> r(2);
        MPI_Irecv(recv.data(), static_cast<int>(probe_bytes), MPI_BYTE, (mpi.rank() + P - 1) % P, 7,
                  comm, &r[0]);
        MPI_Isend(send.data(), static_cast<int>(probe_bytes), MPI_BYTE, (mpi.rank() + 1) % P, 7,
                  comm, &r[1]);
        mpi::wait_bounded(comm, r, "the bandwidth probe", cp.timeout_seconds);
      }
    } else {
      std::vector<MPI_Request> r(1);
      MPI_Ialltoall(send.data(), static_cast<int>(probe_bytes), MPI_BYTE, recv.data(),
                    static_cast<int>(probe_bytes), MPI_BYTE, comm, &r[0]);
      mpi::wait_bounded(comm, r, "the bandwidth probe", cp.timeout_seconds);
    }
    const double t = MPI_Wtime() - t0;
    alone = probe == 0 ? t : std::min(alone, t);
  }
  const double mine[6] = {median(wall), median(compute),  median(wait),
                          alone,        stats.bytes_sent, static_cast<double>(Lr)};
  std::vector<double> all(6 * static_cast<std::size_t>(P));
  std::vector<MPI_Request> r(1);
  MPI_Igather(mine, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, comm, &r[0]);
  mpi::wait_bounded(comm, r, "gathering the timings", cp.timeout_seconds);
  if (mpi.rank() != 0) return;

  double flops = 4.0 * c.batch * c.heads * c.seq * S * c.dim;
  if (c.causal != Causal::none) flops /= 2;
  if (c.backward) flops *= 2.5;
  nlohmann::json ranks = nlohmann::json::array();
  double slowest = 0;
  for (int i = 0; i < P; ++i) {
    const double* x = all.data() + 6 * i;
    // Only the ring overlaps: its exposed communication is the time waited after the kernel
    // calls (an upper bound: it includes waiting for a slower neighbour). The all-to-all has
    // nothing to hide behind.
    const double hidden = !ring ? 0.0 : x[3] > 0 ? std::clamp((x[3] - x[2]) / x[3], 0.0, 1.0) : 1.0;
    slowest = std::max(slowest, x[0]);
    ranks.push_back({{"rank", i},
                     {"query_rows", static_cast<std::int64_t>(x[5])},
                     {"seconds", x[0]},
                     {"compute_seconds", x[1]},
                     {"wait_seconds", x[2]},
                     {"comm_alone_seconds", x[3]},
                     {"bytes_sent", x[4]},
                     {"link_gb_per_s", x[3] > 0 ? x[4] / x[3] / 1e9 : 0.0},
                     {"hidden_fraction", hidden},
                     {"compute_gflops", x[1] > 0 ? flops / P / x[1] / 1e9 : 0.0}});
  }
  const nlohmann::json j = {{"strategy", call.strategy},
                            {"pass", c.backward ? "backward" : "forward"},
                            {"ranks", P},
                            {"batch", c.batch},
                            {"heads", c.heads},
                            {"kv_heads", Hkv},
                            {"seq", c.seq},
                            {"kv_seq", S},
                            {"dim", c.dim},
                            {"value_dim", Ev},
                            {"causal", causal_name(c.causal)},
                            {"threads_per_rank", resolve_threads(c.threads)},
                            {"repeat", c.repeat},
                            {"seconds_median", slowest},
                            {"gflops", flops / slowest / 1e9},
                            {"per_rank", ranks}};
  if (json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << fmt::format(
      "context-parallel {} {} on {} ranks: B={} H={} Hkv={} L={} S={} E={} Ev={} causal={}\n",
      call.strategy, j["pass"].get<std::string>(), P, c.batch, c.heads, Hkv, c.seq, S, c.dim, Ev,
      causal_name(c.causal));
  std::cout << fmt::format("  slowest rank {:.6f} s (median of {}), {:.1f} GFLOP/s in all\n",
                           slowest, c.repeat, flops / slowest / 1e9);
  std::cout << "  rank  rows   seconds   compute    waited  comm-alone    MB sent  hidden\n";
  for (const auto& x : ranks) {
    std::cout << fmt::format("  {:4d} {:5d} {:9.6f} {:9.6f} {:9.6f} {:11.6f} {:10.2f} {:6.1f}%\n",
                             x["rank"].get<int>(), x["query_rows"].get<std::int64_t>(),
                             x["seconds"].get<double>(), x["compute_seconds"].get<double>(),
                             x["wait_seconds"].get<double>(), x["comm_alone_seconds"].get<double>(),
                             x["bytes_sent"].get<double>() / 1e6,
                             100 * x["hidden_fraction"].get<double>());
  }
}

}  // namespace sdpa::cli
