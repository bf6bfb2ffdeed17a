// Ring attention: K/V blocks travel around the ring of ranks while each rank runs the fused
// kernel of its queries against the block it holds.
//
// A rank's shard has one or two global ranges (contiguous or zigzag). For a query range
// [q0, q1) against a key range [k0, k1), causal by global position keeps key s for query l when
// s <= l + shift (shift = 0 upper-left, S - L lower-right). In local indices that is
// s' <= l' + d with d = q0 + shift - k0, which the kernel serves as:
//   d >= Sb - 1 : every key visible         -> no causal flag
//   d < -(Lb-1) : no key visible            -> no call
//   d == 0      : the local upper-left rule -> Causal::upper_left
//   d == Sb-Lb  : the local lower-right rule -> Causal::lower_right
//   otherwise   : split into keys [k0, q0+shift+1) visible to every row (no flag) and the
//                 rest, which rows l >= k - shift see with the local upper-left rule.
// With equal zigzag chunks every block is a full or an empty one except the diagonal, which is
// the upper-left rule, so no call ever wastes work on masked tiles.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/half_attention.h"
#include "core/problem.h"
#include "mpi/detail.h"

namespace sdpa::mpi::detail {
namespace {

struct Task {
  std::size_t qi = 0, kj = 0;    // which query range, which key range of the block
  std::int64_t qa = 0, qb = 0;   // global query rows
  std::int64_t ka = 0, kb = 0;   // global key rows
  Causal causal = Causal::none;  // the local rule for this call
};

void add_tasks(std::size_t qi, Range q, std::size_t kj, Range k, Causal causal, std::int64_t shift,
               std::vector<Task>& tasks) {
  if (q.size() == 0 || k.size() == 0) return;
  if (causal == Causal::none) {
    tasks.push_back({qi, kj, q.begin, q.end, k.begin, k.end, Causal::none});
    return;
  }
  const std::int64_t Lb = q.size(), Sb = k.size();
  const std::int64_t d = q.begin + shift - k.begin;
  if (d >= Sb - 1) {
    tasks.push_back({qi, kj, q.begin, q.end, k.begin, k.end, Causal::none});
  } else if (d + Lb - 1 < 0) {
    return;
  } else if (d == 0) {
    tasks.push_back({qi, kj, q.begin, q.end, k.begin, k.end, Causal::upper_left});
  } else if (d == Sb - Lb) {
    tasks.push_back({qi, kj, q.begin, q.end, k.begin, k.end, Causal::lower_right});
  } else {
    const std::int64_t ks = std::max(k.begin, q.begin + shift + 1);
    if (ks > k.begin) tasks.push_back({qi, kj, q.begin, q.end, k.begin, ks, Causal::none});
    const std::int64_t lr = ks - shift;
    if (ks < k.end && lr < q.end) {
      tasks.push_back({qi, kj, lr, q.end, ks, k.end, Causal::upper_left});
    }
  }
}

std::vector<Task> tasks_for(const Layout& lay, const std::vector<Range>& q_ranges,
                            const std::vector<Range>& k_ranges, Causal causal) {
  const std::int64_t shift = causal == Causal::lower_right ? lay.S - lay.L : 0;
  std::vector<Task> tasks;
  for (std::size_t i = 0; i < q_ranges.size(); ++i) {
    for (std::size_t j = 0; j < k_ranges.size(); ++j) {
      add_tasks(i, q_ranges[i], j, k_ranges[j], causal, shift, tasks);
    }
  }
  return tasks;
}

// The packed block of one owner: K of each range, then V of each range, each (..., Hkv, n, X).
struct BlockLayout {
  std::vector<std::size_t> k_offset, v_offset;  // in elements
  std::vector<std::int64_t> rows;
  std::size_t elements = 0;
};

BlockLayout block_layout(const Layout& lay, int owner) {
  BlockLayout b;
  const Around ak = around(lay.k_shape, lay.q_axis());
  std::size_t at = 0;
  for (const Range& r : lay.k_ranges[owner]) {
    b.rows.push_back(r.size());
    b.k_offset.push_back(at);
    at += static_cast<std::size_t>(ak.outer * r.size() * lay.E);
  }
  for (const Range& r : lay.k_ranges[owner]) {
    b.v_offset.push_back(at);
    at += static_cast<std::size_t>(ak.outer * r.size() * lay.Ev);
  }
  b.elements = at;
  return b;
}

// Views into a packed block.
struct BlockView {
  std::vector<MutableTensorRef> k, v;
};

BlockView view_block(const Layout& lay, const BlockLayout& b, void* base) {
  BlockView view;
  const std::size_t elem = dtype_size(lay.dtype);
  auto* bytes = static_cast<unsigned char*>(base);
  for (std::size_t j = 0; j < b.rows.size(); ++j) {
    view.k.push_back(
        {bytes + b.k_offset[j] * elem, lay.dtype, with_dim(lay.k_shape, lay.q_axis(), b.rows[j])});
    view.v.push_back(
        {bytes + b.v_offset[j] * elem, lay.dtype, with_dim(lay.v_shape, lay.q_axis(), b.rows[j])});
  }
  return view;
}

// Rows [lo, hi) of a tensor, by reference when that is the whole tensor.
struct Rows {
  Array copy;
  TensorRef ref;
};
Rows rows_of(const TensorRef& t, int axis, std::int64_t lo, std::int64_t hi) {
  Rows r;
  if (lo == 0 && hi == t.shape[axis]) {
    r.ref = t;
  } else {
    r.copy = slice_axis(t, axis, lo, hi);
    r.ref = r.copy.ref();
  }
  return r;
}

// Splits a shard (ranges stored one after the other along `axis`) into one tensor per range;
// a shard of one range is used as it is.
std::vector<Rows> split_shard(const TensorRef& t, int axis, const std::vector<Range>& ranges) {
  std::vector<Rows> parts;
  std::int64_t at = 0;
  for (const Range& r : ranges) {
    parts.push_back(rows_of(t, axis, at, at + r.size()));
    at += r.size();
  }
  return parts;
}

// Accumulators per range: the output shard itself when it has one range, else arrays that
// join_shard copies back.
struct Accumulators {
  std::vector<Array> owned;
  std::vector<MutableTensorRef> parts;
};
Accumulators accumulators(const MutableTensorRef& t, int axis, const std::vector<Range>& ranges) {
  Accumulators a;
  if (ranges.size() == 1) {
    a.parts.push_back(t);
    return a;
  }
  for (const Range& r : ranges) {
    a.owned.emplace_back(t.dtype, with_dim(t.shape, axis, r.size()));
    a.parts.push_back(a.owned.back().mut());
  }
  return a;
}

void join_shard(const Accumulators& a, int axis, const MutableTensorRef& t) {
  if (a.owned.empty()) return;
  std::int64_t at = 0;
  for (const Array& p : a.owned) {
    copy_into(t, axis, at, p);
    at += p.shape()[axis];
  }
}

// A tensor of this shape over scratch slot `slot`.
MutableTensorRef scratch_tensor(int slot, DType dtype, std::vector<std::int64_t> shape) {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return MutableTensorRef{scratch(slot, n * dtype_size(dtype)), dtype, std::move(shape)};
}

// The mask of one task: the shard's query rows [la, lb) and global key columns [ka, kb).
Array task_mask(const Layout& lay, const TensorRef& mask, std::int64_t la, std::int64_t lb,
                std::int64_t ka, std::int64_t kb) {
  const int nd = static_cast<int>(mask.shape.size());
  Array rows = lay.mask_rows_sharded ? slice_axis(mask, nd - 2, la, lb)
                                     : slice_axis(mask, nd - 2, 0, mask.shape[nd - 2]);
  if (!lay.mask_cols_full) return rows;
  return slice_axis(rows, nd - 1, ka, kb);
}

// out_acc, lse_acc rows [row0, row0 + n) (float64) <- merge with the block's (o, l) (type T),
// by the log-sum-exp identity in float64; rows that have seen no key so far keep out = 0,
// lse = -inf. The sums of P blocks are rounded once, at the end (forward_typed), as one fused
// call rounds its out and lse once: merging in float32 rounded the lse at every block, an
// error of a few units in the last place of |lse| that every P = exp(s - lse) of the backward
// then carries.
template <class T>
void merge(const MutableTensorRef& out_acc, const MutableTensorRef& lse_acc, std::int64_t row0,
           const TensorRef& o, const TensorRef& l, std::int64_t Ev) {
  const Around a = around(lse_acc.shape, static_cast<int>(lse_acc.shape.size()) - 1);
  const std::int64_t n = l.shape.back();
  auto* acc_o = static_cast<double*>(out_acc.data);
  auto* acc_l = static_cast<double*>(lse_acc.data);
  const T* po = static_cast<const T*>(o.data);
  const T* pl = static_cast<const T*>(l.data);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (std::int64_t h = 0; h < a.outer; ++h) {
    for (std::int64_t r = 0; r < n; ++r) {
      double& L1 = acc_l[h * a.n + row0 + r];
      const double L2 = pl[h * n + r];
      if (L2 == neg_inf) continue;
      double* O1 = acc_o + (h * a.n + row0 + r) * Ev;
      const T* O2 = po + (h * n + r) * Ev;
      if (L1 == neg_inf) {
        L1 = L2;
        std::copy(O2, O2 + Ev, O1);
        continue;
      }
      const double m = std::max(L1, L2);
      const double lse = m + std::log1p(std::exp(-std::abs(L1 - L2)));
      const double w1 = std::exp(L1 - lse), w2 = std::exp(L2 - lse);
      for (std::int64_t e = 0; e < Ev; ++e) O1[e] = w1 * O1[e] + w2 * double(O2[e]);
      L1 = lse;
    }
  }
}

// Packs this rank's own K and V shards into a block.
void pack_own(const Layout& lay, const BlockLayout& b, const TensorRef& k, const TensorRef& v,
              void* base) {
  const BlockView view = view_block(lay, b, base);
  const std::vector<Rows> kp = split_shard(k, lay.q_axis(), lay.k_ranges[lay.rank]);
  const std::vector<Rows> vp = split_shard(v, lay.q_axis(), lay.k_ranges[lay.rank]);
  for (std::size_t j = 0; j < kp.size(); ++j) {
    copy_into(view.k[j], lay.q_axis(), 0, kp[j].ref);
    copy_into(view.v[j], lay.q_axis(), 0, vp[j].ref);
  }
}

void test_progress(std::vector<MPI_Request>& reqs) {
  int flag = 0;
  if (!reqs.empty()) {
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE);
  }
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::float64 ? MPI_DOUBLE : MPI_FLOAT; }

int count_of(std::size_t elements, DType dtype, const char* what) {
  mpi_count(elements * dtype_size(dtype), what);
  return static_cast<int>(elements);
}

constexpr int kTagKv = 100;
constexpr int kTagDkv = 16384;  // below 32767, the smallest MPI_TAG_UB MPI allows

template <class T>
void forward_typed(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                   const TensorRef& v, const TensorRef* mask, const AttentionOptions& options,
                   const MutableTensorRef& out, const MutableTensorRef& lse, CommStats& stats) {
  const int P = lay.ranks, me = lay.rank, next = (me + 1) % P, prev = (me + P - 1) % P;
  const int qa = lay.q_axis(), la = lay.lse_axis();
  const std::vector<Range>& my_q = lay.q_ranges[me];
  double t0 = now_seconds();
  const std::vector<Rows> q_parts = split_shard(q, qa, my_q);
  // The blocks' results merge in float64 (see merge) and are rounded to T once, at the end.
  Array out64(DType::float64, out.shape), lse64(DType::float64, lse.shape);
  const Accumulators out_acc = accumulators(out64.mut(), qa, my_q);
  const Accumulators lse_acc = accumulators(lse64.mut(), la, my_q);
  for (std::size_t i = 0; i < my_q.size(); ++i) {
    std::fill_n(static_cast<double*>(out_acc.parts[i].data), out_acc.parts[i].numel(), 0.0);
    std::fill_n(static_cast<double*>(lse_acc.parts[i].data), lse_acc.parts[i].numel(),
                -std::numeric_limits<double>::infinity());
  }
  std::size_t capacity = 0;
  for (int r = 0; r < P; ++r) capacity = std::max(capacity, block_layout(lay, r).elements);
  T* cur = static_cast<T*>(scratch(0, capacity * sizeof(T)));
  T* nxt = static_cast<T*>(scratch(1, capacity * sizeof(T)));
  pack_own(lay, block_layout(lay, me), k, v, cur);
  std::vector<std::int64_t> q_offset;  // where each range starts in the shard
  {
    std::int64_t at = 0;
    for (const Range& r : my_q) {
      q_offset.push_back(at);
      at += r.size();
    }
  }
  stats.compute_seconds += now_seconds() - t0;

  for (int t = 0; t < P; ++t) {
    const int owner = (me - t + P) % P;
    const BlockLayout b = block_layout(lay, owner);
    std::vector<MPI_Request> reqs;
    if (t < P - 1) {
      const BlockLayout incoming = block_layout(lay, (owner + P - 1) % P);
      reqs.resize(2);
      MPI_Irecv(nxt, count_of(incoming.elements, lay.dtype, "K/V block"), mpi_type(lay.dtype), prev,
                kTagKv + t, comm, &reqs[0]);
      MPI_Isend(cur, count_of(b.elements, lay.dtype, "K/V block"), mpi_type(lay.dtype), next,
                kTagKv + t, comm, &reqs[1]);
      stats.bytes_sent += static_cast<double>(b.elements * sizeof(T));
    }
    fault_point(comm, t);
    t0 = now_seconds();
    const BlockView view = view_block(lay, b, cur);
    for (const Task& task : tasks_for(lay, my_q, lay.k_ranges[owner], options.causal)) {
      const Range qr = my_q[task.qi], kr = lay.k_ranges[owner][task.kj];
      const Rows qt = rows_of(q_parts[task.qi].ref, qa, task.qa - qr.begin, task.qb - qr.begin);
      const Rows kt = rows_of(view.k[task.kj], qa, task.ka - kr.begin, task.kb - kr.begin);
      const Rows vt = rows_of(view.v[task.kj], qa, task.ka - kr.begin, task.kb - kr.begin);
      Array mt;
      if (mask != nullptr) {
        const std::int64_t local = q_offset[task.qi] + task.qa - qr.begin;
        mt = task_mask(lay, *mask, local, local + task.qb - task.qa, task.ka, task.kb);
      }
      const TensorRef mref = mt.ref();
      AttentionOptions o = options;
      o.causal = task.causal;
      const MutableTensorRef ot =
          scratch_tensor(4, lay.dtype, with_dim(out.shape, qa, task.qb - task.qa));
      const MutableTensorRef lt =
          scratch_tensor(5, lay.dtype, with_dim(lse.shape, la, task.qb - task.qa));
      {
        // A block of the global softmax: scored as the ring backward's blocks score it.
        const sdpa::detail::ScopedLseOverMoreKeys block;
        attention_forward(qt.ref, kt.ref, vt.ref, mask != nullptr ? &mref : nullptr, o, ot, &lt);
      }
      merge<T>(out_acc.parts[task.qi], lse_acc.parts[task.qi], task.qa - qr.begin, ot, lt, lay.Ev);
      test_progress(reqs);  // lets the transfer advance between kernel calls
    }
    stats.compute_seconds += now_seconds() - t0;
    stats.wait_seconds += wait_bounded(
        comm, reqs, fmt::format("ring step {}: the K/V block from rank {}", t, prev), lay.timeout);
    std::swap(cur, nxt);
    ++stats.steps;
  }
  join_shard(out_acc, qa, out64.mut());
  join_shard(lse_acc, la, lse64.mut());
  sdpa::detail::store_converted(out64, out);
  sdpa::detail::store_converted(lse64, lse);
}

// The fused backward recomputes P = exp(score - lse) from the lse it is given, except on rows
// whose |lse| exceeds 64 (docs/kernel.md): those it renormalises over the keys of the call,
// which for one block of the ring is not the global softmax. Such rows (huge scores, or a mask
// that shifts a whole row by a huge value) are refused.
template <class T>
std::string check_lse_range(const TensorRef& lse) {
  const double limit = 64.0;
  const T* l = static_cast<const T*>(lse.data);
  for (std::int64_t i = 0; i < lse.numel(); ++i) {
    const double x = static_cast<double>(l[i]);
    if (x == -std::numeric_limits<double>::infinity()) continue;  // a row that sees no key
    if (!(std::abs(x) <= limit)) {
      return fmt::format(
          "lse: expected |lse| <= {} on every row for the ring backward, got {} at flat index {} "
          "of this rank's shard (the fused backward renormalises such rows over the keys of "
          "each block); use --context-parallel ulysses or one process",
          limit, x, i);
    }
  }
  return "";
}

template <class T>
void backward_typed(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                    const TensorRef& v, const TensorRef* mask, const TensorRef& out,
                    const TensorRef& lse, const TensorRef& dout, const AttentionOptions& options,
                    const MutableTensorRef& dq, const MutableTensorRef& dk,
                    const MutableTensorRef& dv, CommStats& stats) {
  const int P = lay.ranks, me = lay.rank, next = (me + 1) % P, prev = (me + P - 1) % P;
  const int qa = lay.q_axis(), la = lay.lse_axis();
  const std::vector<Range>& my_q = lay.q_ranges[me];
  agree(comm, check_lse_range<T>(lse), lay.timeout);
  double t0 = now_seconds();
  const std::vector<Rows> q_parts = split_shard(q, qa, my_q);
  const std::vector<Rows> o_parts = split_shard(out, qa, my_q);
  const std::vector<Rows> do_parts = split_shard(dout, qa, my_q);
  const std::vector<Rows> l_parts = split_shard(lse, la, my_q);
  const Accumulators dq_acc = accumulators(dq, qa, my_q);
  for (const MutableTensorRef& p : dq_acc.parts) {
    std::fill_n(static_cast<T*>(p.data), p.numel(), T(0));
  }
  std::vector<std::int64_t> q_offset;
  {
    std::int64_t at = 0;
    for (const Range& r : my_q) {
      q_offset.push_back(at);
      at += r.size();
    }
  }
  std::size_t capacity = 0;
  for (int r = 0; r < P; ++r) capacity = std::max(capacity, block_layout(lay, r).elements);
  T* cur = static_cast<T*>(scratch(0, capacity * sizeof(T)));
  T* nxt = static_cast<T*>(scratch(1, capacity * sizeof(T)));
  // dK/dV of a block travel in the block's own packed layout.
  T* part = static_cast<T*>(scratch(2, capacity * sizeof(T)));
  T* incoming = static_cast<T*>(scratch(3, capacity * sizeof(T)));
  T* outgoing = static_cast<T*>(scratch(9, capacity * sizeof(T)));
  T* home = static_cast<T*>(scratch(10, capacity * sizeof(T)));
  pack_own(lay, block_layout(lay, me), k, v, cur);
  stats.compute_seconds += now_seconds() - t0;
  std::vector<MPI_Request> send_dkv;  // the previous step's outgoing dK/dV

  for (int t = 0; t < P; ++t) {
    const int owner = (me - t + P) % P;
    const BlockLayout b = block_layout(lay, owner);
    std::vector<MPI_Request> reqs, recv_dkv;
    if (t < P - 1) {
      const BlockLayout in = block_layout(lay, (owner + P - 1) % P);
      reqs.resize(2);
      MPI_Irecv(nxt, count_of(in.elements, lay.dtype, "K/V block"), mpi_type(lay.dtype), prev,
                kTagKv + t, comm, &reqs[0]);
      MPI_Isend(cur, count_of(b.elements, lay.dtype, "K/V block"), mpi_type(lay.dtype), next,
                kTagKv + t, comm, &reqs[1]);
      stats.bytes_sent += static_cast<double>(b.elements * sizeof(T));
    }
    if (t > 0) {
      // The previous rank processed this block at its step t - 1 and sends its sum so far.
      recv_dkv.resize(1);
      MPI_Irecv(incoming, count_of(b.elements, lay.dtype, "dK/dV block"), mpi_type(lay.dtype), prev,
                kTagDkv + t - 1, comm, &recv_dkv[0]);
    }
    fault_point(comm, t);
    t0 = now_seconds();
    std::fill_n(part, b.elements, T(0));
    const BlockView view = view_block(lay, b, cur);
    const BlockView dview = view_block(lay, b, part);
    for (const Task& task : tasks_for(lay, my_q, lay.k_ranges[owner], options.causal)) {
      const Range qr = my_q[task.qi], kr = lay.k_ranges[owner][task.kj];
      const std::int64_t r0 = task.qa - qr.begin, r1 = task.qb - qr.begin;
      const std::int64_t c0 = task.ka - kr.begin, c1 = task.kb - kr.begin;
      const Rows qt = rows_of(q_parts[task.qi].ref, qa, r0, r1);
      const Rows ot = rows_of(o_parts[task.qi].ref, qa, r0, r1);
      const Rows dot = rows_of(do_parts[task.qi].ref, qa, r0, r1);
      const Rows lt = rows_of(l_parts[task.qi].ref, la, r0, r1);
      const Rows kt = rows_of(view.k[task.kj], qa, c0, c1);
      const Rows vt = rows_of(view.v[task.kj], qa, c0, c1);
      Array mt;
      if (mask != nullptr) {
        const std::int64_t local = q_offset[task.qi] + r0;
        mt = task_mask(lay, *mask, local, local + r1 - r0, task.ka, task.kb);
      }
      const TensorRef mref = mt.ref();
      AttentionOptions o = options;
      o.causal = task.causal;
      const MutableTensorRef dqt = scratch_tensor(4, lay.dtype, qt.ref.shape);
      const MutableTensorRef dkt = scratch_tensor(5, lay.dtype, kt.ref.shape);
      const MutableTensorRef dvt = scratch_tensor(6, lay.dtype, vt.ref.shape);
      {
        const sdpa::detail::ScopedLseOverMoreKeys global_lse;  // lt sums over every rank's keys
        attention_backward(qt.ref, kt.ref, vt.ref, mask != nullptr ? &mref : nullptr, ot.ref,
                           lt.ref, dot.ref, o, dqt, dkt, dvt);
      }
      add_into(dq_acc.parts[task.qi], qa, r0, dqt);
      add_into(dview.k[task.kj], qa, c0, dkt);
      add_into(dview.v[task.kj], qa, c0, dvt);
      test_progress(reqs);
      test_progress(send_dkv);
    }
    stats.compute_seconds += now_seconds() - t0;
    stats.wait_seconds += wait_bounded(
        comm, recv_dkv, fmt::format("ring step {}: the dK/dV block from rank {}", t, prev),
        lay.timeout);
    stats.wait_seconds +=
        wait_bounded(comm, send_dkv, fmt::format("ring step {}: sending dK/dV to rank {}", t, next),
                     lay.timeout);
    // Sum in a fixed order (what came + this rank's part), so runs are bit-identical.
    t0 = now_seconds();
    if (t > 0) {
      for (std::size_t i = 0; i < b.elements; ++i) outgoing[i] = incoming[i] + part[i];
    } else {
      std::copy_n(part, b.elements, outgoing);
    }
    stats.compute_seconds += now_seconds() - t0;
    if (P == 1) {
      std::copy_n(outgoing, b.elements, home);
    } else {
      send_dkv.resize(1);
      MPI_Isend(outgoing, count_of(b.elements, lay.dtype, "dK/dV block"), mpi_type(lay.dtype), next,
                kTagDkv + t, comm, &send_dkv[0]);
      stats.bytes_sent += static_cast<double>(b.elements * sizeof(T));
    }
    stats.wait_seconds += wait_bounded(
        comm, reqs, fmt::format("ring step {}: the K/V block from rank {}", t, prev), lay.timeout);
    std::swap(cur, nxt);
    ++stats.steps;
  }
  const BlockLayout own = block_layout(lay, me);
  if (P > 1) {
    // The last rank to see this rank's block sends the finished sum home.
    std::vector<MPI_Request> last(1);
    MPI_Irecv(home, count_of(own.elements, lay.dtype, "dK/dV block"), mpi_type(lay.dtype), prev,
              kTagDkv + P - 1, comm, &last[0]);
    stats.wait_seconds += wait_bounded(
        comm, last, fmt::format("the finished dK/dV of this rank's block from rank {}", prev),
        lay.timeout);
    stats.wait_seconds += wait_bounded(
        comm, send_dkv, fmt::format("sending the last dK/dV to rank {}", next), lay.timeout);
  }
  const BlockView hv = view_block(lay, own, home);
  std::int64_t at = 0;
  for (std::size_t j = 0; j < hv.k.size(); ++j) {
    copy_into(dk, qa, at, hv.k[j]);
    copy_into(dv, qa, at, hv.v[j]);
    at += own.rows[j];
  }
  join_shard(dq_acc, qa, dq);
}

}  // namespace

void ring_forward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                  const TensorRef& v, const TensorRef* mask, const AttentionOptions& options,
                  const MutableTensorRef& out, const MutableTensorRef& lse, CommStats& stats) {
  if (lay.dtype == DType::float64) {
    forward_typed<double>(comm, lay, q, k, v, mask, options, out, lse, stats);
  } else {
    forward_typed<float>(comm, lay, q, k, v, mask, options, out, lse, stats);
  }
}

void ring_backward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                   const TensorRef& v, const TensorRef* mask, const TensorRef& out,
                   const TensorRef& lse, const TensorRef& dout, const AttentionOptions& options,
                   const MutableTensorRef& dq, const MutableTensorRef& dk,
                   const MutableTensorRef& dv, CommStats& stats) {
  if (lay.dtype == DType::float64) {
    backward_typed<double>(comm, lay, q, k, v, mask, out, lse, dout, options, dq, dk, dv, stats);
  } else {
    backward_typed<float>(comm, lay, q, k, v, mask, out, lse, dout, options, dq, dk, dv, stats);
  }
}

}  // namespace sdpa::mpi::detail
