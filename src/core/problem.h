// The resolved form of one attention call, shared by every implementation.
//
// The public API takes shapes as vectors; resolve_problem() validates them once (every error
// message is produced here) and flattens the leading batch dimensions into B, so that an
// implementation only ever sees (B, Hq, L, E) etc.:
//   query  (B, Hq, L, E)     key (B, Hkv, S, E)     value (B, Hkv, S, Ev)
//   out    (B, Hq, L, Ev)    lse (B, Hq, L)
// each operand described by an OperandView: its own strides along the batch, head and row
// dimensions (any values >= 0, 0 along a broadcast input dimension) and a contiguous last
// dimension, so that (B, H, L, E) tensors, (B, L, H, E) views and slices of a packed QKV
// projection are read where they lie. The fused and naive kernels read and write every operand
// through its view; the float64 reference and the decode kernel's adapter read the legacy
// pointers query, key and value (and the pointers they are passed) as C order, so they are only
// handed problems resolved from C-contiguous tensors (core/attention.cpp makes those copies).
// The mask keeps its own broadcast strides (0 along broadcast dimensions).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/variants.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

/// The user's mask, resolved against (B, Hq, L, S). Element (b, h, l, s) lives at
/// data + batch_offset[b] + h * stride_h + l * stride_l + s * stride_s (in elements).
struct MaskView {
  bool present = false;
  DType dtype = DType::boolean;
  const void* data = nullptr;
  std::vector<std::int64_t> batch_offset;  // one per flattened batch index b
  std::int64_t stride_h = 0, stride_l = 0, stride_s = 0;

  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s) const {
    return batch_offset[static_cast<std::size_t>(b)] + h * stride_h + l * stride_l + s * stride_s;
  }
  /// The additive value of the mask at (b, h, l, s): 0 or -inf for a boolean mask.
  double additive(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s) const {
    const std::int64_t i = offset(b, h, l, s);
    switch (dtype) {
      case DType::boolean:
        return static_cast<const std::uint8_t*>(data)[i] ? 0.0
                                                         : -std::numeric_limits<double>::infinity();
      case DType::float32:
        return static_cast<const float*>(data)[i];
      case DType::float64:
        return static_cast<const double*>(data)[i];
      case DType::float16:  // refused for masks by resolve_problem
      case DType::bfloat16:
        break;
    }
    return 0.0;
  }
};

/// Where one operand's elements lie: element (b, h, l, e) of an operand of dimensions
/// (B, H, L, E) (flattened batch, heads, rows, features) is at
///   static_cast<T*>(data) + b * sb + h * sh + l * sl + e        (in elements of dtype)
/// lse has no feature dimension: (b, h, l) is at data + b * sb + h * sh + l * sl.
/// Strides are >= 0; an input may repeat elements (stride 0: a broadcast head or batch), an
/// output never does (core/layout.cpp checks it). kWritable: an output (void*), else const.
template <bool kWritable>
struct OperandView {
  using Pointer = std::conditional_t<kWritable, void*, const void*>;
  Pointer data = nullptr;  // null: absent (lse not asked for), or not viewable (see make_view)
  DType dtype = DType::float32;
  std::int64_t sb = 0, sh = 0, sl = 0;

  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t l) const {
    return b * sb + h * sh + l * sl;
  }
  /// The first element of row (b, h, l), typed.
  template <class T>
  auto row(std::int64_t b, std::int64_t h, std::int64_t l) const {
    using P = std::conditional_t<kWritable, T*, const T*>;
    return static_cast<P>(data) + offset(b, h, l);
  }
  /// True when the operand is C order for (B, H, L, width): its rows follow each other densely.
  bool c_order(std::int64_t B, std::int64_t H, std::int64_t L, std::int64_t width) const {
    return (L <= 1 || sl == width) && (H <= 1 || sh == L * width) &&
           (B <= 1 || sb == H * L * width);
  }
};

/// True when the elements of a (B, H, L, width) view fill one dense block of B H L width
/// elements starting at row (0, 0, 0), in some order of the dimensions: C order, or a permuted
/// one such as a (B, L, H, width) tensor read as (B, H, L, width). Sorted by stride, the
/// dimensions of size > 1 must each step over exactly the extent of those below it.
inline bool dense_block(const OperandView<false>& v, std::int64_t B, std::int64_t H, std::int64_t L,
                        std::int64_t width) {
  std::array<std::pair<std::int64_t, std::int64_t>, 3> dims{{{v.sb, B}, {v.sh, H}, {v.sl, L}}};
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = width;
  for (const auto& [stride, n] : dims) {
    if (n <= 1) continue;
    if (stride != extent) return false;
    extent *= n;
  }
  return true;
}

/// Calls run(pointer, n) over every element of a (B, H, L, width) input view, in runs of n
/// contiguous elements: one run when the view fills a dense block (see dense_block), one per
/// (b, h) when each head is dense, else one per row. The runs' order is not the elements'
/// (b, h, l) order, and a broadcast dimension's elements are visited once per index.
template <class T, class F>
void for_each_run(const OperandView<false>& v, std::int64_t B, std::int64_t H, std::int64_t L,
                  std::int64_t width, F&& run) {
  if (B <= 0 || H <= 0 || L <= 0 || width <= 0) return;
  if (dense_block(v, B, H, L, width)) {
    run(v.template row<T>(0, 0, 0), B * H * L * width);
    return;
  }
  const bool head_dense = L <= 1 || v.sl == width;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      if (head_dense) {
        run(v.template row<T>(b, h, 0), L * width);
        continue;
      }
      for (std::int64_t l = 0; l < L; ++l) run(v.template row<T>(b, h, l), width);
    }
  }
}
using InputView = OperandView<false>;
using OutputView = OperandView<true>;

/// The view of tensor `t` with `lead` leading batch dimensions, then (when it has them) a head
/// dimension, a row dimension and `features` (1, or 0 for lse) last dimensions, by t.strides (C
/// order when empty). The leading dimensions must flatten into one stride (each dimension of
/// size > 1 steps over exactly the extent of the next one, or all have stride 0); when they do
/// not, the view's data is null and *flat is false: the caller hands over a copy instead.
template <bool kWritable>
OperandView<kWritable> make_view(const TensorRef& t, std::size_t lead, int features,
                                 bool* flat = nullptr);

struct Problem {
  std::int64_t B = 1, Hq = 1, Hkv = 1, L = 0, S = 0, E = 0, Ev = 0;
  std::int64_t group = 1;  // Hq / Hkv: query head h reads key/value head h / group
  double scale = 1.0;
  Causal causal = Causal::none;
  DType dtype = DType::float32;  // of query, key, value and every output
  int threads = 1;               // resolved, >= 1
  std::size_t lead = 0;          // leading batch dimensions of every operand (flattened into B)
  MaskView mask;
  Variants variants;  // window, softcap, ALiBi, sinks, dropout (core/variants.h)

  // The inputs' data pointers, read as C order by the float64 reference and the decode
  // adapter (see the top of this file). = q.data, k.data, v.data.
  const void* query = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;

  // The inputs, set by resolve_problem (data null for a tensor whose leading dimensions do not
  // flatten: see make_view). In the fused and naive kernels these are what is read.
  InputView q, k, v;
  // Forward outputs (lse.data null when not asked for), set by bind_forward.
  OutputView out, lse;
  // Backward operands, set by bind_backward: the forward's out and lse, grad_out, and the
  // gradients written.
  InputView fwd_out, fwd_lse, dout;
  OutputView dq, dk, dv;
  // This problem is one block of a softmax over more keys (a context-parallel ring:
  // ScopedLseOverMoreKeys, read by resolve_problem). Its forward never takes the decode kernel,
  // so that its scores, and the lse merged from them, are the ones the fused backward
  // recomputes; and its backward, whose lse sums over more keys than the call's, renormalises
  // no row over the call's own keys (kernels/flash.cpp).
  bool lse_over_more_keys = false;

  /// Keys s with s <= last_causal_key(l) are allowed by the causal rule (all keys when
  /// causal is none). The result may be negative (no key) or >= S (every key).
  std::int64_t last_causal_key(std::int64_t l) const {
    switch (causal) {
      case Causal::upper_left:
        return l;
      case Causal::lower_right:
        return l + (S - L);
      case Causal::none:
        break;
    }
    return S - 1;
  }

  /// The keys that the causal rule and the window let query l see, clamped to first in
  /// [0, S] and last in [-1, S - 1] (first > last: none). Mask values come on top.
  KeyRange key_range(std::int64_t l) const {
    const std::int64_t d = S - L;
    std::int64_t first = 0, last = std::min(S - 1, last_causal_key(l));
    if (variants.window_left >= 0) first = std::max<std::int64_t>(0, l + d - variants.window_left);
    if (variants.window_right >= 0) last = std::min(last, l + d + variants.window_right);
    return {std::min(first, S), std::max<std::int64_t>(last, -1)};
  }
};

/// While alive, attention_forward and attention_backward calls made on this thread are blocks
/// of a softmax over more keys than the call's own (Problem::lse_over_more_keys): the ring's.
class ScopedLseOverMoreKeys {
 public:
  ScopedLseOverMoreKeys();
  ~ScopedLseOverMoreKeys();
  ScopedLseOverMoreKeys(const ScopedLseOverMoreKeys&) = delete;
  ScopedLseOverMoreKeys& operator=(const ScopedLseOverMoreKeys&) = delete;

 private:
  bool previous_;
};
bool lse_over_more_keys_in_scope();

/// Validates query/key/value/mask and the options, and fills a Problem (data pointers included).
Problem resolve_problem(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const AttentionOptions& options);

/// Validates the options' variants (window, softcap, ALiBi slopes, sinks, dropout) against the
/// resolved shape and fills p.variants (pointing into `options`). Called by resolve_problem.
void resolve_variants(Problem& p, const AttentionOptions& options);

/// Sets p.out and p.lse (lse may be null) from the caller's output tensors, whose leading
/// dimensions must flatten (make_view); throws sdpa::Error naming the tensor otherwise.
void bind_forward(Problem& p, const MutableTensorRef& out, const MutableTensorRef* lse);
/// Sets the backward operands of p likewise.
void bind_backward(Problem& p, const TensorRef& out, const TensorRef& lse,
                   const TensorRef& grad_out, const MutableTensorRef& dq,
                   const MutableTensorRef& dk, const MutableTensorRef& dv);

/// Bytes of memory this process can still get: MemAvailable + SwapFree, or less when its cgroup
/// limits it; INT64_MAX when unknown.
std::int64_t available_memory_bytes();

/// Throws sdpa::Error naming `what` when `bytes` exceed available_memory_bytes(). Called before
/// large allocations, so that an absurd request is a clear error instead of the OOM killer.
void check_allocation(std::int64_t bytes, const std::string& what);

/// Throws unless `t` has exactly `dtype` and `shape`; `what` names the argument.
void check_tensor(const TensorRef& t, DType dtype, const std::vector<std::int64_t>& shape,
                  const char* what);

}  // namespace sdpa::detail
