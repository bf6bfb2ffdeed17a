// sdpa::mpi: context-parallel attention over MPI, for sequences longer than one machine holds.
//
// Every rank holds a shard of the sequence axis (L for query, out, lse and grad_out; S for key
// and value) and all heads. Two strategies:
//
//   ring     (Ring Attention, Liu et al. 2023; zigzag layout as in ring-flash-attention).
//            K/V blocks travel around the ring of ranks; at step t rank r holds the block of rank
//            r - t and runs the fused kernel of its queries against it while the next block is
//            in flight (MPI_Isend/MPI_Irecv posted before the kernel). The partial (out, lse)
//            are merged by the log-sum-exp identity
//                lse = logaddexp(lse1, lse2),  out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2
//            in the input precision, in the same order on every run. The backward passes each
//            block's accumulated dK/dV along with it and brings them home after P steps; it runs
//            attention_backward of the local queries against one block with the GLOBAL out and
//            lse, which is exact because P = exp(score - lse) and D = rowsum(dout * out) are
//            then the global ones.
//   ulysses  (DeepSpeed-Ulysses, Jacobs et al. 2023). One all-to-all turns sequence shards of
//            all heads into full sequences of H/P heads; each rank runs the fused kernel on its
//            heads; a second all-to-all turns the result back. Needs Hkv >= P (key/value heads
//            are divided among ranks whole, with their query-head groups under GQA).
//
// Layouts (shard_ranges): without causal, and always for ulysses, rank r holds the r-th of P
// near-equal contiguous chunks. Ring with causal splits the axis into 2P near-equal chunks and
// gives rank r chunks r and 2P-1-r (the zigzag), so every rank does the same work. A shard
// stores its ranges one after the other along the axis.
//
// Masks are given by global position: causal (either alignment) applies to global indices, and
// an explicit mask shard holds the rank's query rows (dimension -2 is this rank's Lr, or 1 to
// broadcast) and ALL key columns (dimension -1 is S, or 1).
//
// Faults: every wait is bounded by `timeout_seconds`; a rank that waits longer prints which
// rank and which exchange it was waiting for and calls MPI_Abort, so that a failed or stalled
// rank ends the job instead of hanging it. Shards that do not match the layout, shapes that
// differ between ranks and bad options throw the same sdpa::Error on every rank.
//
// Limitation: the fused backward recomputes P = exp(score - lse) from the lse it is given,
// except on rows whose |lse| exceeds 64 in float32 (2^35 in float64), which it renormalises
// over the keys it is called with (docs/kernel.md). For one block of the ring those are not all
// the keys, so the ring backward refuses such rows (huge scores, or a mask that shifts a whole
// row by a huge value such as finfo.min) with an sdpa::Error on every rank; the all-to-all
// strategy, whose calls see every key, has no such limit.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::mpi {

enum class Strategy : std::uint8_t { ring, ulysses };
/// "ring" or "ulysses"; parse_strategy accepts the same and throws sdpa::Error otherwise.
const char* strategy_name(Strategy strategy);
Strategy parse_strategy(const std::string& text);

/// Global positions [begin, end) along a sequence axis.
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

/// The ranges of a length-`length` axis that `rank` of `ranks` holds, in shard order.
std::vector<Range> shard_ranges(std::int64_t length, int ranks, int rank, bool zigzag);
/// Whether a strategy with these options uses the zigzag layout (ring with causal).
bool uses_zigzag(Strategy strategy, const AttentionOptions& options);
/// Why `options` asks for more than plain attention, which is all the ranks compute (a window,
/// ALiBi, sinks, softcap, or dropout that drops something), naming the first such option; empty
/// when it asks for none.
std::string unsupported_variant(const AttentionOptions& options);

struct ContextParallelOptions {
  AttentionOptions attention;  ///< impl must be fast (the only one that takes lse as given)
  Strategy strategy = Strategy::ring;
  double timeout_seconds = 120;  ///< longest wait for any one exchange before MPI_Abort
};

/// Per-rank timing of one call.
struct CommStats {
  double compute_seconds = 0;  ///< kernel calls, merges and packing
  double wait_seconds = 0;     ///< blocked on messages after the local work was done
  double bytes_sent = 0;
  int steps = 0;
};

/// out and lse shards (this rank's query rows of (..., Hq, L, Ev) and (..., Hq, L)) from this
/// rank's shards of query, key, value and mask (nullptr for none). Collective over `comm`.
void context_parallel_forward(MPI_Comm comm, const TensorRef& query, const TensorRef& key,
                              const TensorRef& value, const TensorRef* mask,
                              const ContextParallelOptions& options, const MutableTensorRef& out,
                              const MutableTensorRef& lse, CommStats* stats = nullptr);

/// Gradient shards; `out` and `lse` are this rank's shards of the forward's results.
void context_parallel_backward(MPI_Comm comm, const TensorRef& query, const TensorRef& key,
                               const TensorRef& value, const TensorRef* mask, const TensorRef& out,
                               const TensorRef& lse, const TensorRef& grad_out,
                               const ContextParallelOptions& options,
                               const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                               const MutableTensorRef& grad_value, CommStats* stats = nullptr);

// ---- bounded collective helpers (also used by the CLI) ------------------------------------

/// Every rank passes its own error message ("" when it has none); if any rank has one, every
/// rank throws sdpa::Error with the first failing rank's message. Bounded by timeout_seconds.
void agree(MPI_Comm comm, const std::string& error, double timeout_seconds);

/// Waits for `requests`; after `timeout_seconds` without completion prints
/// "sdpa: error: rank R: <what> ..." on stderr and aborts the job (MPI_Abort, exit code 3).
/// Returns the seconds spent waiting.
double wait_bounded(MPI_Comm comm, std::vector<MPI_Request>& requests, const std::string& what,
                    double timeout_seconds);

/// Gathers each rank's shard along axis `axis` (ranges from shard_ranges) into the full tensor
/// on rank 0, in global order; `full` is written on rank 0 only and must have the global shape.
void gather_shards(MPI_Comm comm, const TensorRef& shard, int axis,
                   const std::vector<std::vector<Range>>& ranges_of_rank,
                   const MutableTensorRef* full, double timeout_seconds);

/// Test hook, read from the environment variable SDPA_MPI_FAULT = "ACTION:RANK:STEP" with
/// ACTION kill (SIGKILL itself), stall (sleep forever) or exit (exit code 9): rank RANK does it
/// at ring or all-to-all step STEP. Used by the fault tests only.
void fault_point(MPI_Comm comm, int step);

}  // namespace sdpa::mpi
