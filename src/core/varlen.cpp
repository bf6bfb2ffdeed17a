// Variable-length batches (sdpa/varlen.h): every sequence is a strided view of the packed
// tensors, (H, L_b, E) with strides (E, H * E, 1), run as one attention call of its own.
// Scheduling (run_sequences): the sequences are taken in order of decreasing work (L_q * L_k); a
// sequence holding at least 1 / threads of the work still to do runs alone with every thread,
// and the rest run side by side, one thread each, each taken by the next free thread. Run one
// after another with all threads, the calls of short sequences left threads idle at each call's
// end and paid each call's start: a batch of 8 sequences of 100 .. 4000 tokens ran at 0.81-0.90
// of the GFLOP/s of one sequence of the same work (bench/variants.py). A call's result does not
// depend on its thread count (the kernels' guarantee) and no two calls write the same element,
// so the output is the same bits for any thread count and any order. Everything is validated
// (every sequence's problem resolved) before the first output is written.
#include "sdpa/varlen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <vector>

#include "core/half_attention.h"
#include "core/problem.h"
#include "core/variants.h"
#include "sdpa/array.h"

namespace sdpa {
namespace {

using detail::check_tensor;

// The strides, in elements, of a packed (total, H, D) tensor.
std::vector<std::int64_t> packed_strides(const TensorRef& t) {
  if (!t.strides.empty()) return t.strides;
  return {t.shape[1] * t.shape[2], t.shape[2], 1};
}

void check_packed(const TensorRef& t, const char* what) {
  if (t.shape.size() != 3) {
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("expected a packed (total, heads, dim) tensor of rank 3, got shape {}",
                            shape_string(t.shape)));
  }
}

void check_cu_seqlens(std::span<const std::int64_t> cu, std::int64_t total, std::int64_t max_len,
                      const char* what, const char* max_what) {
  if (cu.empty()) {
    throw Error(ErrorKind::bad_shape, what, "expected B + 1 >= 1 offsets, got none");
  }
  if (cu.front() != 0) {
    throw Error(ErrorKind::bad_value, what,
                fmt::format("expected the first offset to be 0, got {}", cu.front()));
  }
  // The offsets themselves first, then the lengths against max_len: a length read from
  // offsets that go down is no length at all.
  for (std::size_t b = 1; b < cu.size(); ++b) {
    if (cu[b] < cu[b - 1]) {
      throw Error(ErrorKind::bad_value, what,
                  fmt::format("expected non-decreasing offsets, got {} after {} at index {}", cu[b],
                              cu[b - 1], b));
    }
  }
  if (cu.back() != total) {
    throw Error(ErrorKind::bad_value, what,
                fmt::format("expected the last offset to be the packed total {}, got {}", total,
                            cu.back()));
  }
  for (std::size_t b = 1; b < cu.size(); ++b) {
    if (cu[b] - cu[b - 1] > max_len) {
      throw Error(ErrorKind::bad_value, max_what,
                  fmt::format("expected at least the longest sequence, got {} < {} (sequence {})",
                              max_len, cu[b] - cu[b - 1], b - 1));
    }
  }
}

// Rows [begin, end) of a packed (total, H, D) tensor as (H, end - begin, D).
template <class Ref>
Ref rows_view(const Ref& t, std::int64_t begin, std::int64_t end) {
  const std::vector<std::int64_t> st = packed_strides(t);
  Ref v = t;
  using Byte = std::conditional_t<std::is_same_v<Ref, TensorRef>, const char, char>;
  v.data =
      static_cast<Byte*>(t.data) + begin * st[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
  v.shape = {t.shape[1], end - begin, t.shape[2]};
  v.strides = {st[1], st[0], st[2]};
  return v;
}

// Columns [begin, end) of an lse (H, total) as (H, end - begin).
template <class Ref>
Ref lse_view(const Ref& t, std::int64_t begin, std::int64_t end) {
  const std::vector<std::int64_t> st =
      t.strides.empty() ? std::vector<std::int64_t>{t.shape[1], 1} : t.strides;
  Ref v = t;
  using Byte = std::conditional_t<std::is_same_v<Ref, TensorRef>, const char, char>;
  v.data =
      static_cast<Byte*>(t.data) + begin * st[1] * static_cast<std::int64_t>(dtype_size(t.dtype));
  v.shape = {t.shape[0], end - begin};
  v.strides = {st[0], st[1]};
  return v;
}

// Zeros every element of a strided view (an output no sequence writes).
void zero(const MutableTensorRef& t) {
  const std::size_t size = dtype_size(t.dtype);
  const std::vector<std::int64_t>& st = t.strides;
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rest = i, off = 0;
    for (std::size_t d = t.shape.size(); d-- > 0;) {
      off += (rest % t.shape[d]) * st[d];
      rest /= t.shape[d];
    }
    std::memset(static_cast<char*>(t.data) + off * static_cast<std::int64_t>(size), 0, size);
  }
}

struct Sequences {
  std::int64_t B = 0, Hq = 0;
  std::vector<AttentionOptions> options;  // per sequence: its ALiBi slopes
};

// Validates everything and gives each sequence's options (a (B, Hq) slope table is sliced).
Sequences plan(const TensorRef& query, const TensorRef& key, const TensorRef& value,
               std::span<const std::int64_t> cu_q, std::span<const std::int64_t> cu_k,
               std::int64_t max_q, std::int64_t max_k, const AttentionOptions& options) {
  check_packed(query, "query");
  check_packed(key, "key");
  check_packed(value, "value");
  if (value.shape[0] != key.shape[0]) {
    throw Error(ErrorKind::bad_shape, "value",
                fmt::format("expected {} packed rows like key {}, got value {}", key.shape[0],
                            shape_string(key.shape), shape_string(value.shape)));
  }
  if (cu_q.size() != cu_k.size()) {
    throw Error(ErrorKind::bad_shape, "cu_seqlens_k",
                fmt::format("expected B + 1 = {} offsets like cu_seqlens_q, got {}", cu_q.size(),
                            cu_k.size()));
  }
  check_cu_seqlens(cu_q, query.shape[0], max_q, "cu_seqlens_q", "max_seqlen_q");
  check_cu_seqlens(cu_k, key.shape[0], max_k, "cu_seqlens_k", "max_seqlen_k");
  Sequences s;
  s.B = static_cast<std::int64_t>(cu_q.size()) - 1;
  s.Hq = query.shape[1];
  const auto slopes = static_cast<std::int64_t>(options.alibi_slopes.size());
  if (slopes != 0 && slopes != s.Hq && slopes != s.B * s.Hq) {
    throw Error(ErrorKind::bad_shape, "alibi_slopes",
                fmt::format("expected Hq = {} slopes or B * Hq = {} (per sequence and head), "
                            "got {}",
                            s.Hq, s.B * s.Hq, slopes));
  }
  for (std::int64_t b = 0; b < s.B; ++b) {
    AttentionOptions o = options;
    if (slopes == s.B * s.Hq && s.B != 1) {
      o.alibi_slopes.assign(options.alibi_slopes.begin() + b * s.Hq,
                            options.alibi_slopes.begin() + (b + 1) * s.Hq);
    }
    const std::size_t i = static_cast<std::size_t>(b);
    detail::resolve_problem(rows_view(query, cu_q[i], cu_q[i + 1]),
                            rows_view(key, cu_k[i], cu_k[i + 1]),
                            rows_view(value, cu_k[i], cu_k[i + 1]), nullptr, o);
    s.options.push_back(std::move(o));
  }
  if (s.B == 0) {  // validate the options against the shapes anyway
    detail::resolve_problem(rows_view(query, 0, 0), rows_view(key, 0, 0), rows_view(value, 0, 0),
                            nullptr, options);
  }
  return s;
}

// Runs run(b, threads) for every sequence b with work[b] > 0, as the comment at the top says.
template <class Run>
void run_sequences(const std::vector<std::int64_t>& work, int threads, const Run& run) {
  std::vector<std::int64_t> order;
  std::int64_t left = 0;
  for (std::size_t b = 0; b < work.size(); ++b) {
    if (work[b] > 0) order.push_back(static_cast<std::int64_t>(b));
    left += work[b];
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return work[static_cast<std::size_t>(a)] > work[static_cast<std::size_t>(b)];
  });
  std::size_t k = 0;
  for (; k < order.size() && threads > 1; ++k) {
    const std::int64_t w = work[static_cast<std::size_t>(order[k])];
    if (w * threads < left) break;
    run(order[k], threads);
    left -= w;
  }
  const auto rest = static_cast<std::int64_t>(order.size() - k);
  if (rest == 0) return;
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min <std::int64_t>(threads, rest))
  for (std::int64_t i = 0; i < rest; ++i) {
    try {
      run(order[k + static_cast<std::size_t>(i)], 1);
    } catch (...) {
#pragma omp critical(sdpa_varlen_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void attention_varlen_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                              std::span<const std::int64_t> cu_q,
                              std::span<const std::int64_t> cu_k, std::int64_t max_q,
                              std::int64_t max_k, const AttentionOptions& options,
                              const MutableTensorRef& out, const MutableTensorRef* lse) {
  const Sequences s = plan(query, key, value, cu_q, cu_k, max_q, max_k, options);
  check_tensor(out, query.dtype, {query.shape[0], query.shape[1], value.shape[2]}, "out");
  if (lse != nullptr) {
    check_tensor(*lse, detail::lse_dtype(query.dtype), {query.shape[1], query.shape[0]}, "lse");
  }
  std::vector<std::int64_t> work(static_cast<std::size_t>(s.B));
  for (std::size_t i = 0; i < work.size(); ++i) {
    // No query rows: nothing to write. No keys: the rows are zeros (or the sinks' lse).
    work[i] = cu_q[i + 1] == cu_q[i]
                  ? 0
                  : (cu_q[i + 1] - cu_q[i]) * std::max<std::int64_t>(1, cu_k[i + 1] - cu_k[i]);
  }
  run_sequences(work, resolve_threads(options.threads), [&](std::int64_t b, int threads) {
    const std::size_t i = static_cast<std::size_t>(b);
    const detail::RngBatchIndex batch(b);
    AttentionOptions o = s.options[i];
    o.threads = threads;
    const MutableTensorRef out_b = rows_view(out, cu_q[i], cu_q[i + 1]);
    std::optional<MutableTensorRef> l;
    if (lse != nullptr) l = lse_view(*lse, cu_q[i], cu_q[i + 1]);
    attention_forward(rows_view(query, cu_q[i], cu_q[i + 1]), rows_view(key, cu_k[i], cu_k[i + 1]),
                      rows_view(value, cu_k[i], cu_k[i + 1]), nullptr, o, out_b, l ? &*l : nullptr);
  });
}

void attention_varlen_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                               std::span<const std::int64_t> cu_q,
                               std::span<const std::int64_t> cu_k, std::int64_t max_q,
                               std::int64_t max_k, const TensorRef& out, const TensorRef& lse,
                               const TensorRef& grad_out, const AttentionOptions& options,
                               const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                               const MutableTensorRef& grad_value,
                               const MutableTensorRef* grad_sinks) {
  const Sequences s = plan(query, key, value, cu_q, cu_k, max_q, max_k, options);
  const std::vector<std::int64_t> out_shape = {query.shape[0], query.shape[1], value.shape[2]};
  check_tensor(out, query.dtype, out_shape, "out");
  // The dtypes of attention_backward's: lse float32 for a 16-bit query, each gradient its
  // input's dtype (a 16-bit KV under a float32 query gets 16-bit dK and dV).
  check_tensor(lse, detail::lse_dtype(query.dtype), {query.shape[1], query.shape[0]}, "lse");
  check_tensor(grad_out, query.dtype, out_shape, "grad_out");
  check_tensor(grad_query, query.dtype, query.shape, "grad_query");
  check_tensor(grad_key, key.dtype, key.shape, "grad_key");
  check_tensor(grad_value, value.dtype, value.shape, "grad_value");
  if (grad_sinks != nullptr) {
    if (options.sinks.empty()) {
      throw Error(ErrorKind::bad_value, "grad_sinks",
                  "expected only with sinks in the options, got no sinks");
    }
    check_tensor(*grad_sinks, query.dtype, {s.Hq}, "grad_sinks");
  }
  std::vector<std::int64_t> work(static_cast<std::size_t>(s.B));
  for (std::size_t i = 0; i < work.size(); ++i) {
    const std::int64_t q0 = cu_q[i], q1 = cu_q[i + 1], k0 = cu_k[i], k1 = cu_k[i + 1];
    if (q1 == q0) {  // no query: its keys get no gradient
      zero(rows_view(grad_key, k0, k1));
      zero(rows_view(grad_value, k0, k1));
      continue;
    }
    work[i] = (q1 - q0) * std::max<std::int64_t>(1, k1 - k0);
  }
  // Each sequence's sink gradient apart, summed in sequence order below.
  std::vector<Array> parts;
  if (grad_sinks != nullptr) {
    for (std::int64_t b = 0; b < s.B; ++b) parts.emplace_back(query.dtype, std::vector{s.Hq});
  }
  run_sequences(work, resolve_threads(options.threads), [&](std::int64_t b, int threads) {
    const std::size_t i = static_cast<std::size_t>(b);
    const std::int64_t q0 = cu_q[i], q1 = cu_q[i + 1], k0 = cu_k[i], k1 = cu_k[i + 1];
    const detail::RngBatchIndex batch(b);
    AttentionOptions o = s.options[i];
    o.threads = threads;
    std::optional<MutableTensorRef> part;
    if (grad_sinks != nullptr) part = parts[i].mut();
    attention_backward(rows_view(query, q0, q1), rows_view(key, k0, k1), rows_view(value, k0, k1),
                       nullptr, rows_view(out, q0, q1), lse_view(lse, q0, q1),
                       rows_view(grad_out, q0, q1), o, rows_view(grad_query, q0, q1),
                       rows_view(grad_key, k0, k1), rows_view(grad_value, k0, k1),
                       part ? &*part : nullptr);
  });
  std::vector<double> dsinks(static_cast<std::size_t>(s.Hq), 0.0);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (work[i] == 0) continue;
    const Array p64 = parts[i].astype(DType::float64);
    for (std::int64_t h = 0; h < s.Hq; ++h)
      dsinks[static_cast<std::size_t>(h)] += p64.data_as<double>()[h];
  }
  if (grad_sinks != nullptr) {
    Array sum(DType::float64, {s.Hq});
    std::memcpy(sum.data(), dsinks.data(), dsinks.size() * sizeof(double));
    const Array cast = sum.astype(query.dtype);
    const std::vector<std::int64_t> st =
        grad_sinks->strides.empty() ? std::vector<std::int64_t>{1} : grad_sinks->strides;
    const std::size_t size = dtype_size(query.dtype);
    for (std::int64_t h = 0; h < s.Hq; ++h) {
      std::memcpy(
          static_cast<char*>(grad_sinks->data) + h * st[0] * static_cast<std::int64_t>(size),
          static_cast<const char*>(cast.data()) + h * static_cast<std::int64_t>(size), size);
    }
  }
}

}  // namespace sdpa
