// All-to-all (DeepSpeed-Ulysses) attention: trade sequence shards of all heads for full
// sequences of a share of the heads, attend locally, trade back.
//
// Heads are divided by key/value head: rank r takes kv heads [a_r, b_r) (near-equal shares of
// Hkv) and, under GQA, the query heads that read them, [a_r G, b_r G) with G = Hq / Hkv. Every
// tensor is seen as (B, H, N, X): B the leading batch dimensions, H the heads, N the sequence,
// X the features (1 for lse).
#include <fmt/format.h>

#include <cstring>

#include "mpi/detail.h"

namespace sdpa::mpi::detail {
namespace {

struct View4 {
  std::int64_t B = 1, H = 1, N = 1, X = 1;
};

// seq_axis is the axis of N; the heads are the axis before it (or 1 when there is none).
View4 view4(const std::vector<std::int64_t>& shape, int seq_axis) {
  View4 v;
  v.N = shape[seq_axis];
  for (std::size_t i = seq_axis + 1; i < shape.size(); ++i) v.X *= shape[i];
  if (seq_axis >= 1) v.H = shape[seq_axis - 1];
  for (int i = 0; i < seq_axis - 1; ++i) v.B *= shape[i];
  return v;
}

std::vector<Range> head_shares(std::int64_t heads, int ranks, std::int64_t group) {
  std::vector<Range> out;
  for (int r = 0; r < ranks; ++r) {
    out.push_back({r * heads / ranks * group, (r + 1) * heads / ranks * group});
  }
  return out;
}

struct Plan {
  std::vector<Range> heads;  // of every rank
  std::vector<Range> rows;   // sequence rows of every rank (one contiguous range each)
};

Plan plan_for(const Layout& lay, bool kv, bool key_rows) {
  Plan p;
  const std::int64_t group = kv ? 1 : lay.Hq / lay.Hkv;
  p.heads = head_shares(lay.Hkv, lay.ranks, group);
  for (int r = 0; r < lay.ranks; ++r) {
    p.rows.push_back((key_rows ? lay.k_ranges : lay.q_ranges)[r][0]);
  }
  return p;
}

// Sequence shard (..., H, Nr, X) -> this rank's heads over the whole sequence (..., h, N, X)
// (to_heads), or back (!to_heads). `t` has the source layout; the result the other one.
Array exchange(MPI_Comm comm, const Layout& lay, const TensorRef& t, int seq_axis, const Plan& plan,
               bool to_heads, const char* what) {
  const int P = lay.ranks, me = lay.rank;
  const std::size_t elem = dtype_size(t.dtype);
  const View4 v = view4(t.shape, seq_axis);
  std::vector<std::int64_t> result_shape = t.shape;
  if (to_heads) {
    result_shape[seq_axis] = plan.rows.back().end;
    if (seq_axis >= 1) result_shape[seq_axis - 1] = plan.heads[me].size();
  } else {
    result_shape[seq_axis] = plan.rows[me].size();
    if (seq_axis >= 1) result_shape[seq_axis - 1] = plan.heads.back().end;
  }
  Array result(t.dtype, result_shape);
  const View4 w = view4(result_shape, seq_axis);
  // Block exchanged with rank j: to_heads sends (B, heads_j, my rows, X) and receives
  // (B, my heads, rows_j, X); back sends (B, my heads, rows_j, X), receives (B, heads_j, my rows).
  std::vector<int> scount(P), sdispl(P), rcount(P), rdispl(P);
  std::size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < P; ++j) {
    const std::int64_t send_elems =
        to_heads ? v.B * plan.heads[j].size() * v.N * v.X : v.B * v.H * plan.rows[j].size() * v.X;
    const std::int64_t recv_elems =
        to_heads ? w.B * w.H * plan.rows[j].size() * w.X : w.B * plan.heads[j].size() * w.N * w.X;
    scount[j] = mpi_count(send_elems * elem, what);
    rcount[j] = mpi_count(recv_elems * elem, what);
    sdispl[j] = mpi_count(stotal, what);
    rdispl[j] = mpi_count(rtotal, what);
    stotal += scount[j];
    rtotal += rcount[j];
  }
  std::vector<unsigned char> sbuf(stotal), rbuf(rtotal);
  const auto* src = static_cast<const unsigned char*>(t.data);
  const std::size_t row = static_cast<std::size_t>(v.X) * elem;
  for (int j = 0; j < P; ++j) {
    unsigned char* dst = sbuf.data() + sdispl[j];
    for (std::int64_t b = 0; b < v.B; ++b) {
      if (to_heads) {
        for (std::int64_t h = plan.heads[j].begin; h < plan.heads[j].end; ++h) {
          const std::size_t n = v.N * row;
          std::memcpy(dst, src + ((b * v.H + h) * v.N) * row, n);
          dst += n;
        }
      } else {
        for (std::int64_t h = 0; h < v.H; ++h) {
          const std::size_t n = plan.rows[j].size() * row;
          std::memcpy(dst, src + ((b * v.H + h) * v.N + plan.rows[j].begin) * row, n);
          dst += n;
        }
      }
    }
  }
  std::vector<MPI_Request> req(1);
  MPI_Ialltoallv(sbuf.data(), scount.data(), sdispl.data(), MPI_BYTE, rbuf.data(), rcount.data(),
                 rdispl.data(), MPI_BYTE, comm, &req[0]);
  wait_bounded(comm, req, fmt::format("the all-to-all of {}", what), lay.timeout);
  auto* out = static_cast<unsigned char*>(result.data());
  for (int j = 0; j < P; ++j) {
    const unsigned char* from = rbuf.data() + rdispl[j];
    for (std::int64_t b = 0; b < w.B; ++b) {
      if (to_heads) {
        for (std::int64_t h = 0; h < w.H; ++h) {
          const std::size_t n = plan.rows[j].size() * row;
          std::memcpy(out + ((b * w.H + h) * w.N + plan.rows[j].begin) * row, from, n);
          from += n;
        }
      } else {
        for (std::int64_t h = plan.heads[j].begin; h < plan.heads[j].end; ++h) {
          const std::size_t n = w.N * row;
          std::memcpy(out + ((b * w.H + h) * w.N) * row, from, n);
          from += n;
        }
      }
    }
  }
  return result;
}

// The mask for this rank's heads over all query rows: gather the row shards, then keep this
// rank's query heads when the mask has a head dimension.
Array local_mask(MPI_Comm comm, const Layout& lay, const TensorRef& mask) {
  const int nd = static_cast<int>(mask.shape.size());
  Array rows;
  if (lay.mask_rows_sharded) {
    std::vector<std::vector<Range>> ranges;
    for (int r = 0; r < lay.ranks; ++r) ranges.push_back(lay.q_ranges[r]);
    const std::vector<std::int64_t> full = with_dim(mask.shape, nd - 2, lay.L);
    // Every rank needs every row: gather on rank 0 and broadcast, both bounded.
    rows = Array(mask.dtype, full);
    const MutableTensorRef ref = rows.mut();
    gather_shards(comm, mask, nd - 2, ranges, &ref, lay.timeout);
    std::vector<MPI_Request> req(1);
    MPI_Ibcast(rows.data(), mpi_count(rows.nbytes(), "mask"), MPI_BYTE, 0, comm, &req[0]);
    wait_bounded(comm, req, "broadcasting the mask", lay.timeout);
  } else {
    rows = slice_axis(mask, nd - 2, 0, mask.shape[nd - 2]);
  }
  const std::int64_t offset = static_cast<std::int64_t>(lay.q_shape.size()) - nd;
  if (nd >= 3 && mask.shape[nd - 3] == lay.Hq && lay.Hq > 1 && offset >= 0) {
    const Range h = plan_for(lay, false, false).heads[lay.rank];
    return slice_axis(rows.ref(), nd - 3, h.begin, h.end);
  }
  return rows;
}

}  // namespace

void ulysses_forward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                     const TensorRef& v, const TensorRef* mask, const AttentionOptions& options,
                     const MutableTensorRef& out, const MutableTensorRef& lse, CommStats& stats) {
  const int qa = lay.q_axis(), la = lay.lse_axis();
  const Plan pq = plan_for(lay, false, false), pk = plan_for(lay, true, true);
  fault_point(comm, 0);
  double t0 = now_seconds();
  const Array qh = exchange(comm, lay, q, qa, pq, true, "query");
  const Array kh = exchange(comm, lay, k, qa, pk, true, "key");
  const Array vh = exchange(comm, lay, v, qa, pk, true, "value");
  Array mh;
  if (mask != nullptr) mh = local_mask(comm, lay, *mask);
  stats.wait_seconds += now_seconds() - t0;
  t0 = now_seconds();
  std::vector<std::int64_t> out_shape = qh.shape();
  out_shape.back() = lay.Ev;
  Array oh(lay.dtype, out_shape);
  Array lh(lay.dtype, std::vector<std::int64_t>(qh.shape().begin(), qh.shape().end() - 1));
  const TensorRef mref = mh.ref();
  const MutableTensorRef lref = lh.mut();
  attention_forward(qh, kh, vh, mask != nullptr ? &mref : nullptr, options, oh.mut(), &lref);
  stats.compute_seconds += now_seconds() - t0;
  fault_point(comm, 1);
  t0 = now_seconds();
  const Array o = exchange(comm, lay, oh, qa, pq, false, "out");
  const Array l = exchange(comm, lay, lh, la, pq, false, "lse");
  stats.wait_seconds += now_seconds() - t0;
  copy_into(out, qa, 0, o);
  copy_into(lse, la, 0, l);
  stats.bytes_sent =
      static_cast<double>(q.numel() + k.numel() + v.numel() + out.numel() + lse.numel()) *
      dtype_size(lay.dtype) * (lay.ranks - 1) / lay.ranks;
  stats.steps = 2;
}

void ulysses_backward(MPI_Comm comm, const Layout& lay, const TensorRef& q, const TensorRef& k,
                      const TensorRef& v, const TensorRef* mask, const TensorRef& out,
                      const TensorRef& lse, const TensorRef& dout, const AttentionOptions& options,
                      const MutableTensorRef& dq, const MutableTensorRef& dk,
                      const MutableTensorRef& dv, CommStats& stats) {
  const int qa = lay.q_axis(), la = lay.lse_axis();
  const Plan pq = plan_for(lay, false, false), pk = plan_for(lay, true, true);
  fault_point(comm, 0);
  double t0 = now_seconds();
  const Array qh = exchange(comm, lay, q, qa, pq, true, "query");
  const Array kh = exchange(comm, lay, k, qa, pk, true, "key");
  const Array vh = exchange(comm, lay, v, qa, pk, true, "value");
  const Array oh = exchange(comm, lay, out, qa, pq, true, "out");
  const Array lh = exchange(comm, lay, lse, la, pq, true, "lse");
  const Array doh = exchange(comm, lay, dout, qa, pq, true, "grad_out");
  Array mh;
  if (mask != nullptr) mh = local_mask(comm, lay, *mask);
  stats.wait_seconds += now_seconds() - t0;
  t0 = now_seconds();
  Array dqh(lay.dtype, qh.shape()), dkh(lay.dtype, kh.shape()), dvh(lay.dtype, vh.shape());
  const TensorRef mref = mh.ref();
  attention_backward(qh, kh, vh, mask != nullptr ? &mref : nullptr, oh, lh, doh, options, dqh.mut(),
                     dkh.mut(), dvh.mut());
  stats.compute_seconds += now_seconds() - t0;
  fault_point(comm, 1);
  t0 = now_seconds();
  copy_into(dq, qa, 0, exchange(comm, lay, dqh, qa, pq, false, "grad_query"));
  copy_into(dk, qa, 0, exchange(comm, lay, dkh, qa, pk, false, "grad_key"));
  copy_into(dv, qa, 0, exchange(comm, lay, dvh, qa, pk, false, "grad_value"));
  stats.wait_seconds += now_seconds() - t0;
  stats.bytes_sent = static_cast<double>(2 * (q.numel() + k.numel() + v.numel()) + out.numel() +
                                         lse.numel() + dout.numel()) *
                     dtype_size(lay.dtype) * (lay.ranks - 1) / lay.ranks;
  stats.steps = 2;
}

}  // namespace sdpa::mpi::detail
