// Internals shared by the ring and all-to-all strategies: tensor slicing along one axis, the
// validated global problem, and byte exchanges.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mpi/context_parallel.h"
#include "sdpa/array.h"

namespace sdpa::mpi::detail {

/// A tensor seen as (outer, n, inner) around `axis`.
struct Around {
  std::int64_t outer = 1, n = 1, inner = 1;
};
Around around(const std::vector<std::int64_t>& shape, int axis);

/// `shape` with dimension `axis` set to n.
std::vector<std::int64_t> with_dim(std::vector<std::int64_t> shape, int axis, std::int64_t n);

/// Contiguous copy of positions [lo, hi) of `axis`.
Array slice_axis(const TensorRef& t, int axis, std::int64_t lo, std::int64_t hi);
/// dst[axis positions lo .. lo + src.n) = src (copy) or += src (add); same dtype and other dims.
void copy_into(const MutableTensorRef& dst, int axis, std::int64_t lo, const TensorRef& src);
void add_into(const MutableTensorRef& dst, int axis, std::int64_t lo, const TensorRef& src);

/// The problem every rank agreed on.
struct Layout {
  int rank = 0, ranks = 1;
  DType dtype = DType::float32;
  std::vector<std::int64_t> q_shape, k_shape, v_shape;  // global
  std::int64_t L = 0, S = 0, Hq = 1, Hkv = 1, E = 0, Ev = 0;
  bool zigzag = false;
  std::vector<std::vector<Range>> q_ranges, k_ranges;  // of every rank
  bool has_mask = false;
  bool mask_rows_sharded = false;  // mask dimension -2 is the query axis (else broadcast)
  bool mask_cols_full = false;     // mask dimension -1 is S (else broadcast)
  double scale = 1;
  double timeout = 120;
  int q_axis() const { return static_cast<int>(q_shape.size()) - 2; }
  // lse is (..., Hq, L): its last axis, which has the same index as the query's L axis.
  int lse_axis() const { return static_cast<int>(q_shape.size()) - 2; }
};

/// Checks the shards against each other and the layout (collective); throws the same
/// sdpa::Error on every rank. `extra` are local shape checks ("" when fine) done first.
Layout validate(MPI_Comm comm, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                const TensorRef* mask, const ContextParallelOptions& options,
                const std::string& local_error);

/// The mask shard normalised to at least two dimensions (prepending 1s); a view, no copy.
TensorRef mask_view(const TensorRef& mask);

std::string check_shape(const char* what, const std::vector<std::int64_t>& got,
                        const std::vector<std::int64_t>& expected);

/// Byte count as MPI's int, or sdpa::Error.
int mpi_count(std::size_t bytes, const char* what);

void ring_forward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                  const TensorRef& v, const TensorRef* mask, const AttentionOptions& options,
                  const MutableTensorRef& out, const MutableTensorRef& lse, CommStats& stats);
void ring_backward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                   const TensorRef& v, const TensorRef* mask, const TensorRef& out,
                   const TensorRef& lse, const TensorRef& dout, const AttentionOptions& options,
                   const MutableTensorRef& dq, const MutableTensorRef& dk,
                   const MutableTensorRef& dv, CommStats& stats);
void ulysses_forward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                     const TensorRef& v, const TensorRef* mask, const AttentionOptions& options,
                     const MutableTensorRef& out, const MutableTensorRef& lse, CommStats& stats);
void ulysses_backward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                      const TensorRef& v, const TensorRef* mask, const TensorRef& out,
                      const TensorRef& lse, const TensorRef& dout, const AttentionOptions& options,
                      const MutableTensorRef& dq, const MutableTensorRef& dk,
                      const MutableTensorRef& dv, CommStats& stats);

double now_seconds();

/// A buffer kept from one call to the next, one per `slot` (0..15), at least `bytes` long, not
/// cleared, 2 MiB aligned with MADV_HUGEPAGE. The first touch of a fresh 4 KiB page costs
/// 13-16 us here: the ~50 MB a 4096-token ring forward on one rank allocated afresh took 0.17 s
/// of its 0.41 s.
void* scratch(int slot, std::size_t bytes);

}  // namespace sdpa::mpi::detail
