#include "core/problem.h"

#include <fmt/format.h>

#include <cmath>

#include "core/layout.h"
#include "sdpa/array.h"

namespace sdpa::detail {
namespace {

bool is_16bit(DType d) { return d == DType::float16 || d == DType::bfloat16; }

void check_float(const TensorRef& t, const char* what) {
  if (t.dtype != DType::float32 && t.dtype != DType::float64 && !is_16bit(t.dtype)) {
    throw Error(ErrorKind::bad_type, what,
                fmt::format("expected dtype float32 or float64 (or the 16-bit float16 or "
                            "bfloat16), got {}",
                            dtype_name(t.dtype)));
  }
  if (t.shape.size() < 2) {
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("expected rank 2 or more, got shape {} (rank {})",
                            shape_string(t.shape), t.shape.size()));
  }
  checked_numel(t.shape, dtype_size(t.dtype), what);
  check_data(t.data, dtype_size(t.dtype), t.numel() != 0, what);
}

std::int64_t dim(const TensorRef& t, int from_end) {
  return t.shape[t.shape.size() - static_cast<std::size_t>(from_end)];
}

}  // namespace

template <bool kWritable>
OperandView<kWritable> make_view(const TensorRef& t, std::size_t lead, int features, bool* flat) {
  const std::size_t rank = t.shape.size();
  std::vector<std::int64_t> strides = t.strides;
  if (strides.size() != rank) {  // C order
    strides.assign(rank, 1);
    for (std::size_t i = rank; i-- > 1;) strides[i - 1] = strides[i] * t.shape[i];
  }
  OperandView<kWritable> v;
  v.dtype = t.dtype;
  const std::size_t f = static_cast<std::size_t>(features);
  if (rank >= 1 + f) v.sl = strides[rank - 1 - f];
  if (rank >= 2 + f + lead) v.sh = strides[rank - 2 - f];
  // The flattened batch stride: the stride of the last leading dimension of size > 1, each
  // earlier one of size > 1 stepping over exactly the extent of the next.
  bool ok = true;
  std::int64_t prev = -1;  // index of the previous leading dimension of size > 1
  for (std::size_t i = 0; i < lead && i < rank; ++i) {
    if (t.shape[i] <= 1) continue;
    if (prev >= 0) {
      const auto pi = static_cast<std::size_t>(prev);
      ok = ok && strides[pi] == strides[i] * t.shape[i];
    }
    prev = static_cast<std::int64_t>(i);
  }
  v.sb = prev >= 0 ? strides[static_cast<std::size_t>(prev)] : 0;
  if (flat != nullptr) *flat = ok;
  if (ok) v.data = const_cast<typename OperandView<kWritable>::Pointer>(t.data);
  return v;
}
template InputView make_view<false>(const TensorRef&, std::size_t, int, bool*);
template OutputView make_view<true>(const TensorRef&, std::size_t, int, bool*);

namespace {

template <bool kWritable>
OperandView<kWritable> bound_view(const TensorRef& t, std::size_t lead, int features,
                                  const char* what) {
  bool flat = true;
  OperandView<kWritable> v = make_view<kWritable>(t, lead, features, &flat);
  if (!flat) {
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("internal: strides {} of shape {} do not flatten its {} leading "
                            "dimensions (a copy should have been made)",
                            shape_string(t.strides), shape_string(t.shape), lead));
  }
  return v;
}

}  // namespace

void bind_forward(Problem& p, const MutableTensorRef& out, const MutableTensorRef* lse) {
  p.out = bound_view<true>(out, p.lead, 1, "out");
  p.lse = lse != nullptr ? bound_view<true>(*lse, p.lead, 0, "lse") : OutputView{};
}

void bind_backward(Problem& p, const TensorRef& out, const TensorRef& lse,
                   const TensorRef& grad_out, const MutableTensorRef& dq,
                   const MutableTensorRef& dk, const MutableTensorRef& dv) {
  p.fwd_out = bound_view<false>(out, p.lead, 1, "out");
  p.fwd_lse = bound_view<false>(lse, p.lead, 0, "lse");
  p.dout = bound_view<false>(grad_out, p.lead, 1, "grad_out");
  p.dq = bound_view<true>(dq, p.lead, 1, "grad_query");
  p.dk = bound_view<true>(dk, p.lead, 1, "grad_key");
  p.dv = bound_view<true>(dv, p.lead, 1, "grad_value");
}

void check_tensor(const TensorRef& t, DType dtype, const std::vector<std::int64_t>& shape,
                  const char* what) {
  if (t.dtype != dtype) {
    throw Error(ErrorKind::bad_type, what,
                fmt::format("expected dtype {}, got {}", dtype_name(dtype), dtype_name(t.dtype)));
  }
  if (t.shape != shape) {
    throw Error(
        ErrorKind::bad_shape, what,
        fmt::format("expected shape {}, got {}", shape_string(shape), shape_string(t.shape)));
  }
  // Checked: an output's shape is derived from several inputs and may overflow where none did.
  const std::int64_t n = checked_numel(t.shape, dtype_size(t.dtype), what);
  check_data(t.data, dtype_size(t.dtype), n != 0, what);
}

Problem resolve_problem(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const AttentionOptions& options) {
  check_float(query, "query");
  check_float(key, "key");
  check_float(value, "value");
  // One dtype for all three, or (a 16-bit KV cache read by a float32 or bfloat16 query, as in
  // decoding) key and value of one 16-bit dtype under a float32 or bfloat16 query.
  const bool mixed_ok = key.dtype == value.dtype && is_16bit(key.dtype) &&
                        (query.dtype == DType::float32 || query.dtype == DType::bfloat16);
  if ((key.dtype != query.dtype || value.dtype != query.dtype) && !mixed_ok) {
    throw Error(
        ErrorKind::bad_type, "key/value",
        fmt::format("expected the query's dtype {} for key and value, got key {} and value {} "
                    "(only a float32 or bfloat16 query may read key and value of one other "
                    "dtype, float16 or bfloat16)",
                    dtype_name(query.dtype), dtype_name(key.dtype), dtype_name(value.dtype)));
  }
  if (key.shape.size() != query.shape.size() || value.shape.size() != query.shape.size()) {
    throw Error(
        ErrorKind::bad_shape, "key/value",
        fmt::format("expected the rank of query ({}), got key {} and value {} "
                    "(query {}, key {}, value {})",
                    query.shape.size(), key.shape.size(), value.shape.size(),
                    shape_string(query.shape), shape_string(key.shape), shape_string(value.shape)));
  }
  const std::size_t rank = query.shape.size();
  Problem p;
  p.dtype = query.dtype;
  p.L = dim(query, 2);
  p.E = dim(query, 1);
  p.S = dim(key, 2);
  p.Ev = dim(value, 1);
  if (dim(key, 1) != p.E) {
    throw Error(ErrorKind::bad_shape, "key",
                fmt::format("expected last dimension E = {} (from query {}), got key {}", p.E,
                            shape_string(query.shape), shape_string(key.shape)));
  }
  if (dim(value, 2) != p.S) {
    throw Error(ErrorKind::bad_shape, "value",
                fmt::format("expected S = {} rows (from key {}), got value {}", p.S,
                            shape_string(key.shape), shape_string(value.shape)));
  }
  if (rank >= 3) {
    p.Hq = dim(query, 3);
    p.Hkv = dim(key, 3);
    if (dim(value, 3) != p.Hkv) {
      throw Error(ErrorKind::bad_shape, "value",
                  fmt::format("expected {} heads like key {}, got value {}", p.Hkv,
                              shape_string(key.shape), shape_string(value.shape)));
    }
  }
  for (std::size_t i = 0; i + 3 < rank; ++i) {
    if (key.shape[i] != query.shape[i] || value.shape[i] != query.shape[i]) {
      throw Error(
          ErrorKind::bad_shape, "key/value",
          fmt::format("expected the same leading batch dimensions as query {}, got key {} and "
                      "value {}",
                      shape_string(query.shape), shape_string(key.shape),
                      shape_string(value.shape)));
    }
    p.B *= query.shape[i];
  }
  if (options.enable_gqa) {
    if (p.Hkv == 0 || p.Hq % p.Hkv != 0) {
      throw Error(
          ErrorKind::bad_shape, "enable_gqa",
          fmt::format("expected query heads Hq to be a multiple of key/value heads Hkv, got Hq = "
                      "{} and Hkv = {}",
                      p.Hq, p.Hkv));
    }
    p.group = p.Hkv == 0 ? 1 : p.Hq / p.Hkv;
  } else if (p.Hq != p.Hkv) {
    throw Error(
        ErrorKind::bad_shape, "key",
        fmt::format("expected {} heads like query (or enable_gqa for grouped-query attention), got "
                    "query {} and key {}",
                    p.Hq, shape_string(query.shape), shape_string(key.shape)));
  }

  if (options.scale.has_value()) {
    if (!std::isfinite(*options.scale)) {
      throw Error(ErrorKind::bad_value, "scale",
                  fmt::format("expected a finite number, got {}", *options.scale));
    }
    p.scale = *options.scale;
  } else {
    p.scale = p.E > 0 ? 1.0 / std::sqrt(static_cast<double>(p.E)) : 1.0;
  }
  // The enumerations are checked too: a binding may cast any integer to them.
  if (options.causal != Causal::none && options.causal != Causal::upper_left &&
      options.causal != Causal::lower_right) {
    throw Error(ErrorKind::bad_value, "causal",
                fmt::format("expected none, upper-left or lower-right, got the value {}",
                            static_cast<int>(options.causal)));
  }
  if (options.impl != Impl::fast && options.impl != Impl::reference &&
      options.impl != Impl::naive) {
    throw Error(ErrorKind::bad_value, "impl",
                fmt::format("expected fast, reference or naive, got the value {}",
                            static_cast<int>(options.impl)));
  }
  p.causal = options.causal;
  p.threads = resolve_threads(options.threads);
  p.query = query.data;
  p.key = key.data;
  p.value = value.data;
  p.lead = rank >= 3 ? rank - 3 : 0;
  p.q = make_view<false>(query, p.lead, 1);
  p.k = make_view<false>(key, p.lead, 1);
  p.v = make_view<false>(value, p.lead, 1);

  if (mask != nullptr) {
    const TensorRef& m = *mask;
    // A 16-bit mask is converted to float32 before any kernel sees it (core/half_attention.h).
    if (m.dtype != DType::boolean && m.dtype != DType::float32 && m.dtype != DType::float64 &&
        !is_16bit(m.dtype)) {
      throw Error(ErrorKind::bad_type, "mask",
                  fmt::format("expected dtype bool, float32 or float64 (or float16, bfloat16), "
                              "got {}",
                              dtype_name(m.dtype)));
    }
    checked_numel(m.shape, dtype_size(m.dtype), "mask");
    // Target shape: (..., Hq, L, S) with query's leading dimensions.
    std::vector<std::int64_t> target(query.shape.begin(), query.shape.end() - 1);
    target.push_back(p.S);
    if (m.shape.size() > target.size()) {
      throw Error(
          ErrorKind::bad_shape, "mask",
          fmt::format("expected a shape that broadcasts to {}, got {} (rank {} > {})",
                      shape_string(target), shape_string(m.shape), m.shape.size(), target.size()));
    }
    // Strides of the mask aligned to target's dimensions (0 where broadcast or missing): its own
    // strides when it has them (a view, stride-0 dimensions included), else C order.
    std::vector<std::int64_t> stride(target.size(), 0);
    std::int64_t running = 1;
    const std::size_t lead = target.size() - m.shape.size();
    for (std::size_t i = m.shape.size(); i-- > 0;) {
      const std::int64_t md = m.shape[i];
      const std::int64_t td = target[lead + i];
      if (md != td && md != 1) {
        // "expected 1" alone when the target dimension is itself 1 (never "1 or 1").
        const std::string allowed = td == 1 ? "1" : fmt::format("{} or 1", td);
        throw Error(ErrorKind::bad_shape, "mask",
                    fmt::format("expected a shape that broadcasts to {}, got {} (dimension "
                                "{} is {}, expected {})",
                                shape_string(target), shape_string(m.shape), i, md, allowed));
      }
      // (A stride count that differs from the rank is refused by check_strides.)
      const std::int64_t own = m.strides.size() == m.shape.size() ? m.strides[i] : running;
      stride[lead + i] = (md == 1) ? 0 : own;
      running *= md;
    }
    check_data(m.data, dtype_size(m.dtype), m.numel() != 0, "mask");
    p.mask.present = true;
    p.mask.dtype = m.dtype;
    p.mask.data = m.data;
    const std::size_t t = target.size();
    p.mask.stride_s = stride[t - 1];
    p.mask.stride_l = stride[t - 2];
    p.mask.stride_h = (t >= 3) ? stride[t - 3] : 0;
    // Offsets of each flattened batch index b over the leading dimensions (row-major order).
    const std::size_t nlead = (t >= 3) ? t - 3 : 0;
    p.mask.batch_offset.assign(static_cast<std::size_t>(p.B), 0);
    for (std::int64_t b = 0; b < p.B; ++b) {
      std::int64_t rest = b, off = 0;
      for (std::size_t i = nlead; i-- > 0;) {
        const std::int64_t idx = rest % target[i];
        rest /= target[i];
        off += idx * stride[i];
      }
      p.mask.batch_offset[static_cast<std::size_t>(b)] = off;
    }
  }
  resolve_variants(p, options);
  p.lse_over_more_keys = lse_over_more_keys_in_scope();
  return p;
}

}  // namespace sdpa::detail
