// The public attention calls: validate once, then hand the resolved problem to one
// implementation.
#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include "core/half_attention.h"
#include "core/layout.h"
#include "core/problem.h"
#include "kernels/decode.h"
#include "kernels/kernels.h"
#include "reference/reference.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa {

const char* version() { return SDPA_VERSION; }

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::bad_value:
      return "bad value";
    case ErrorKind::bad_type:
      return "bad type";
    case ErrorKind::bad_shape:
      return "bad shape";
    case ErrorKind::io:
      return "I/O";
    case ErrorKind::resources:
      return "resources";
  }
  return "?";
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::boolean:
      return "bool";
    case DType::float16:
      return "float16";
    case DType::bfloat16:
      return "bfloat16";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return 4;
    case DType::float64:
      return 8;
    case DType::boolean:
      return 1;
    case DType::float16:
    case DType::bfloat16:
      return 2;
  }
  return 1;
}

namespace {
std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
}  // namespace

std::int64_t TensorRef::numel() const { return product(shape); }
std::int64_t MutableTensorRef::numel() const { return product(shape); }

namespace detail {
namespace {
thread_local bool t_lse_over_more_keys = false;
}  // namespace

ScopedLseOverMoreKeys::ScopedLseOverMoreKeys() : previous_(t_lse_over_more_keys) {
  t_lse_over_more_keys = true;
}
ScopedLseOverMoreKeys::~ScopedLseOverMoreKeys() { t_lse_over_more_keys = previous_; }
bool lse_over_more_keys_in_scope() { return t_lse_over_more_keys; }
}  // namespace detail

const char* causal_name(Causal causal) {
  switch (causal) {
    case Causal::none:
      return "none";
    case Causal::upper_left:
      return "upper-left";
    case Causal::lower_right:
      return "lower-right";
  }
  return "?";
}

Causal parse_causal(const std::string& text) {
  if (text == "none") return Causal::none;
  if (text == "upper-left") return Causal::upper_left;
  if (text == "lower-right") return Causal::lower_right;
  throw Error(ErrorKind::bad_value, "causal",
              fmt::format("expected none, upper-left or lower-right, got '{}'", text));
}

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::fast:
      return "fast";
    case Impl::reference:
      return "reference";
    case Impl::naive:
      return "naive";
  }
  return "?";
}

Impl parse_impl(const std::string& text) {
  if (text == "fast") return Impl::fast;
  if (text == "reference") return Impl::reference;
  if (text == "naive") return Impl::naive;
  throw Error(ErrorKind::bad_value, "impl",
              fmt::format("expected fast, reference or naive, got '{}'", text));
}

int resolve_threads(int threads) {
  constexpr int kMaxThreads = 1024;
  if (threads < 0 || threads > kMaxThreads) {
    throw Error(ErrorKind::bad_value, "threads",
                fmt::format("expected 0 (one per core) or 1..{}, got {}", kMaxThreads, threads));
  }
  if (threads > 0) return threads;
  const int cores = omp_get_num_procs();
  return cores > 0 ? cores : 1;
}

std::vector<std::int64_t> attention_output_shape(const TensorRef& query, const TensorRef& key,
                                                 const TensorRef& value,
                                                 const AttentionOptions& options) {
  const detail::Problem p = detail::resolve_problem(query, key, value, nullptr, options);
  std::vector<std::int64_t> shape = query.shape;
  shape.back() = p.Ev;
  return shape;
}

std::vector<std::int64_t> attention_lse_shape(const TensorRef& query) {
  return std::vector<std::int64_t>(query.shape.begin(), query.shape.end() - 1);
}

namespace {

// The naive baseline implements plain attention only; the variants (window, softcap, ALiBi,
// sinks, dropout) are served by the reference and the fused kernel.
void check_variants_supported(const detail::Problem& p, Impl requested) {
  if (requested == Impl::naive && p.variants.any()) {
    throw Error(ErrorKind::bad_value, "impl",
                "expected fast or reference with window, softcap, alibi_slopes, sinks or "
                "dropout_p, got naive (it computes plain attention only)");
  }
}

// The fast and naive kernels compute float32 problems in float32; the few whose float32
// intermediates could pass float32's range (absurd scales, magnitudes or mask values; see
// kernels/range.cpp) are computed by the float64 reference instead, which never overflows there.
Impl effective_impl(const detail::Problem& p, Impl requested, const void* grad_out) {
  check_variants_supported(p, requested);
  if (requested == Impl::fast && p.dtype == DType::float32) {
    // A softcap or a sink past float32's range is finite as given and infinite in the float32
    // kernel (inf * tanh(x / inf) = inf * 0, exp(inf - inf)): the float64 reference takes them.
    const double most = std::numeric_limits<float>::max();
    if (p.variants.softcap > most) return Impl::reference;
    if (p.variants.sinks != nullptr) {
      for (std::int64_t h = 0; h < p.Hq; ++h) {
        if (std::fabs(p.variants.sinks[h]) > most) return Impl::reference;
      }
    }
  }
  if (requested == Impl::fast && p.dtype == DType::float32 && p.variants.alibi != nullptr) {
    // ALiBi's bias reaches slope * (L + S): past 1e30 the float32 scores could overflow.
    const std::int64_t n = p.variants.alibi_stride_b == 0 ? p.Hq : p.B * p.Hq;
    for (std::int64_t i = 0; i < n; ++i) {
      if (std::fabs(p.variants.alibi[i]) * static_cast<double>(p.L + p.S) > 1e30) {
        return Impl::reference;
      }
    }
  }
  // The decode kernel verifies its float32 results itself and recomputes the rows that
  // overflowed (kernels/decode.cpp): the bound below would read all of K and V, as much memory
  // as such a call's whole work.
  const bool decode = requested == Impl::fast && grad_out == nullptr && detail::decode_applies(p);
  if (requested != Impl::reference && p.dtype == DType::float32 && !decode &&
      detail::float32_may_overflow(p, grad_out)) {
    return Impl::reference;
  }
  return requested;
}

// True when the fused or the decode kernel serves this call on its 16-bit operands where they
// lie (the fused kernel widens them exactly while packing, core/problem.h's views; the decode
// kernel widens K and V in registers and its few query rows into float32): plain attention (the
// variants run on float32 copies), every view flattenable, and no intermediate that could pass
// float32's range (bfloat16 holds 3e38; such a call goes through float32 copies, whose own guard
// hands it to the reference). grad_out: as for float32_may_overflow (the backward's check), or
// null for the forward.
bool fast_reads_16bit(const detail::Problem& p, const AttentionOptions& options,
                      const void* grad_out = nullptr) {
  if (options.impl != Impl::fast || p.variants.any()) return false;
  // The decode kernel (K and V of one dtype, as its caches) verifies its results itself and
  // recomputes the rows that overflowed (effective_impl): the bound below would read all of K
  // and V once more.
  if (grad_out == nullptr && detail::decode_applies(p)) return p.k.dtype == p.v.dtype;
  if (p.q.data == nullptr || p.k.data == nullptr || p.v.data == nullptr) return false;
  return !detail::float32_may_overflow(p, grad_out);
}

// naive materialises the L x S scores of one head (forward) or P and dS (backward, twice that):
// check that scratch against the memory available like any other large allocation, so that an
// absurd L x S is a clear sdpa::Error (kind resources), never a bare std::bad_alloc.
void check_naive_scratch(const detail::Problem& p, int matrices) {
  const double bytes = static_cast<double>(p.L) * static_cast<double>(p.S) * matrices *
                       static_cast<double>(dtype_size(p.dtype));
  const std::string what = fmt::format("impl naive: its L x S scratch (L = {}, S = {}, {} matri{})",
                                       p.L, p.S, matrices, matrices == 1 ? "x" : "ces");
  if (bytes >= 9.2e18) {  // beyond int64: certainly more than any machine has
    throw Error(ErrorKind::resources, what,
                fmt::format("needs {:.3g} bytes, more than any memory", bytes));
  }
  detail::check_allocation(static_cast<std::int64_t>(bytes), what);
}

using detail::Copy;

// The inputs as the fused and naive kernels read them: where they lie, unless their leading
// batch dimensions do not flatten into one stride (core/layout.h), and the mask once its layout
// is C order (stride-0 dimensions become size-1 broadcasts, never copied).
struct KernelInputs {
  detail::ContiguousInput q, k, v;
  std::optional<detail::ContiguousInput> m;
  KernelInputs(const TensorRef& query, const TensorRef& key, const TensorRef& value,
               const TensorRef* mask, std::size_t lead)
      : q(query, "query", Copy::unless_flat, lead),
        k(key, "key", Copy::unless_flat, lead),
        v(value, "value", Copy::unless_flat, lead) {
    if (mask != nullptr) m.emplace(*mask, "mask", Copy::mask);
  }
  const TensorRef* mask() const { return m ? &m->ref() : nullptr; }
};

}  // namespace

void attention_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                       const TensorRef* mask, const AttentionOptions& options,
                       const MutableTensorRef& out, const MutableTensorRef* lse) {
  const detail::Problem checked = detail::resolve_problem(query, key, value, mask, options);
  std::vector<std::int64_t> out_shape = query.shape;
  out_shape.back() = checked.Ev;
  detail::check_tensor(out, checked.dtype, out_shape, "out");
  if (lse != nullptr) {
    detail::check_tensor(*lse, detail::lse_dtype(checked.dtype), attention_lse_shape(query), "lse");
  }
  detail::check_strides(query, "query", false);
  detail::check_strides(key, "key", false);
  detail::check_strides(value, "value", false);
  if (mask != nullptr) detail::check_strides(*mask, "mask", false);
  detail::check_strides(out, "out", true);
  if (lse != nullptr) detail::check_strides(*lse, "lse", true);
  // Nothing to write: return before an implementation loops over B * Hq * L rows, which an empty
  // tensor may declare in the billions (query (2^40, 0) is valid and holds no data).
  if (out.numel() == 0 && (lse == nullptr || lse->numel() == 0)) return;
  // 16-bit inputs that the kernel serving the call does not read itself (core/half_attention.h).
  const bool native = detail::any_16bit(query, key, value) && fast_reads_16bit(checked, options);
  if (detail::needs_half_path(query, key, value, mask, native)) {
    detail::half_forward(query, key, value, mask, options, out, lse, native);
    return;
  }
  const std::size_t lead = checked.lead;
  const KernelInputs in(query, key, value, mask, lead);
  detail::Problem p =
      detail::resolve_problem(in.q.ref(), in.k.ref(), in.v.ref(), in.mask(), options);
  const Impl impl = effective_impl(p, options.impl, nullptr);
  // The fused, decode and naive kernels read and write every operand through its strides.
  // Decode-sized queries go to the decode kernel, which serves plain attention only.
  if (impl == Impl::fast || (impl == Impl::naive && detail::naive_reads_in_place(p))) {
    const detail::ContiguousOutput o(out, "out", Copy::unless_flat, lead);
    std::optional<detail::ContiguousOutput> l;
    if (lse != nullptr) l.emplace(*lse, "lse", Copy::unless_flat, lead);
    detail::bind_forward(p, o.ref(), l ? &l->ref() : nullptr);
    if (impl == Impl::fast) {
      if (detail::decode_applies(p)) {
        detail::decode_forward(p);
      } else {
        detail::fast_forward(p);
      }
    } else {
      check_naive_scratch(p, 1);
      detail::naive_forward(p);
    }
    o.finish();
    if (l) l->finish();
    return;
  }
  // The float64 reference (the oracle) and naive on overlapping rows read C order: copies of
  // every tensor that is not.
  const detail::ContiguousInput q(in.q.ref(), "query"), k(in.k.ref(), "key"),
      v(in.v.ref(), "value");
  detail::Problem pc = detail::resolve_problem(q.ref(), k.ref(), v.ref(), in.mask(), options);
  const detail::ContiguousOutput o(out, "out");
  std::optional<detail::ContiguousOutput> l;
  if (lse != nullptr) l.emplace(*lse, "lse");
  if (impl == Impl::reference) {
    detail::reference_forward(pc, o.data(), l ? l->data() : nullptr);
  } else {
    detail::bind_forward(pc, o.ref(), l ? &l->ref() : nullptr);
    check_naive_scratch(pc, 1);
    detail::naive_forward(pc);
  }
  o.finish();
  if (l) l->finish();
}

void attention_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const TensorRef& out, const TensorRef& lse,
                        const TensorRef& grad_out, const AttentionOptions& options,
                        const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                        const MutableTensorRef& grad_value, const MutableTensorRef* grad_sinks) {
  const detail::Problem checked = detail::resolve_problem(query, key, value, mask, options);
  std::vector<std::int64_t> out_shape = query.shape;
  out_shape.back() = checked.Ev;
  detail::check_tensor(out, checked.dtype, out_shape, "out");
  detail::check_tensor(lse, detail::lse_dtype(checked.dtype), attention_lse_shape(query), "lse");
  detail::check_tensor(grad_out, checked.dtype, out_shape, "grad_out");
  detail::check_tensor(grad_query, checked.dtype, query.shape, "grad_query");
  detail::check_tensor(grad_key, key.dtype, key.shape, "grad_key");  // a 16-bit KV's dtype
  detail::check_tensor(grad_value, value.dtype, value.shape, "grad_value");
  detail::check_strides(query, "query", false);
  detail::check_strides(key, "key", false);
  detail::check_strides(value, "value", false);
  if (mask != nullptr) detail::check_strides(*mask, "mask", false);
  detail::check_strides(out, "out", false);
  detail::check_strides(lse, "lse", false);
  detail::check_strides(grad_out, "grad_out", false);
  detail::check_strides(grad_query, "grad_query", true);
  detail::check_strides(grad_key, "grad_key", true);
  detail::check_strides(grad_value, "grad_value", true);
  if (grad_sinks != nullptr) {
    if (checked.variants.sinks == nullptr) {
      throw Error(ErrorKind::bad_value, "grad_sinks",
                  "expected only with sinks in the options, got no sinks");
    }
    detail::check_tensor(*grad_sinks, checked.dtype, {checked.Hq}, "grad_sinks");
    detail::check_strides(*grad_sinks, "grad_sinks", true);
  }
  // Nothing to write (see attention_forward).
  if (grad_query.numel() == 0 && grad_key.numel() == 0 && grad_value.numel() == 0 &&
      (grad_sinks == nullptr || grad_sinks->numel() == 0)) {
    return;
  }
  // A bfloat16 query over a float16 key and value: out, rounded to bfloat16, is coarser than the
  // values it averages, so D = rowsum(dO * out) would leave dP - D = dO . (v - out) != 0 on a
  // row that sees one key, whose exact dq and dk are 0 (and a scale then multiplies it). The
  // fast backward reads out recomputed in float32 instead: the forward of the query's exact
  // float32 values over the same key and value, one more forward pass for this mix only.
  TensorRef fwd_out = out;
  std::optional<Array> recomputed;
  // (Not with grad_sinks, which 16-bit inputs do not take: the call is refused below.)
  if (options.impl == Impl::fast && query.dtype == DType::bfloat16 &&
      value.dtype == DType::float16 && grad_sinks == nullptr) {
    const Array q32 = detail::converted_copy(query, DType::float32);
    recomputed.emplace(DType::float32, out.shape);
    attention_forward(q32.ref(), key, value, mask, options, recomputed->mut());
    fwd_out = recomputed->ref();
  }
  bool native = false;
  if (grad_sinks == nullptr) {
    detail::Problem bound = checked;
    bound.dout = detail::make_view<false>(grad_out, checked.lead, 1);
    native = bound.dout.data != nullptr && fast_reads_16bit(bound, options, bound.dout.data);
  }
  if (detail::needs_half_path(query, key, value, mask, native)) {
    if (grad_sinks != nullptr) {
      if (detail::any_16bit(query, key, value)) {
        throw Error(ErrorKind::bad_type, "grad_sinks",
                    "expected float32 or float64 inputs, got a half-precision query, key or "
                    "value");
      }
      // Only the mask is 16-bit: the call on its exact float32 values.
      const Array m = detail::converted_copy(*mask, DType::float32);
      const TensorRef mref = m.ref();
      attention_backward(query, key, value, &mref, out, lse, grad_out, options, grad_query,
                         grad_key, grad_value, grad_sinks);
      return;
    }
    detail::half_backward(query, key, value, mask, fwd_out, lse, grad_out, options, grad_query,
                          grad_key, grad_value);
    return;
  }
  // The sinks' gradient (Hq values), written by every implementation into a C-order buffer.
  std::optional<detail::ContiguousOutput> ds;
  if (grad_sinks != nullptr) ds.emplace(*grad_sinks, "grad_sinks");
  void* ds_data = ds ? ds->data() : nullptr;
  const std::size_t lead = checked.lead;
  const KernelInputs in(query, key, value, mask, lead);
  const detail::ContiguousInput o(fwd_out, "out", Copy::unless_flat, lead),
      l(lse, "lse", Copy::unless_flat, lead), g(grad_out, "grad_out", Copy::unless_flat, lead);
  detail::Problem p =
      detail::resolve_problem(in.q.ref(), in.k.ref(), in.v.ref(), in.mask(), options);
  {
    // Bound before the range guard, which reads grad_out through p.dout. The gradients are
    // bound to the caller's tensors only when written in place (below).
    p.dout = detail::make_view<false>(g.ref(), lead, 1);
    const Impl impl = effective_impl(p, options.impl, p.dout.data);
    if (impl == Impl::fast || (impl == Impl::naive && detail::naive_reads_in_place(p))) {
      const detail::ContiguousOutput dq(grad_query, "grad_query", Copy::unless_flat, lead),
          dk(grad_key, "grad_key", Copy::unless_flat, lead),
          dv(grad_value, "grad_value", Copy::unless_flat, lead);
      detail::bind_backward(p, o.ref(), l.ref(), g.ref(), dq.ref(), dk.ref(), dv.ref());
      if (impl == Impl::fast) {
        detail::fast_backward(p, ds_data);
      } else {
        check_naive_scratch(p, 2);
        detail::naive_backward(p);
      }
      dq.finish();
      dk.finish();
      dv.finish();
      if (ds) ds->finish();
      return;
    }
    // The float64 reference and naive on overlapping rows read C order.
    const detail::ContiguousInput q(in.q.ref(), "query"), k(in.k.ref(), "key"),
        v(in.v.ref(), "value"), oc(o.ref(), "out"), lc(l.ref(), "lse"), gc(g.ref(), "grad_out");
    detail::Problem pc = detail::resolve_problem(q.ref(), k.ref(), v.ref(), in.mask(), options);
    const detail::ContiguousOutput dq(grad_query, "grad_query"), dk(grad_key, "grad_key"),
        dv(grad_value, "grad_value");
    if (impl == Impl::reference) {
      detail::reference_backward(pc, gc.ref().data, dq.data(), dk.data(), dv.data(), {}, ds_data);
    } else {
      detail::bind_backward(pc, oc.ref(), lc.ref(), gc.ref(), dq.ref(), dk.ref(), dv.ref());
      check_naive_scratch(pc, 2);
      detail::naive_backward(pc);
    }
    dq.finish();
    dk.finish();
    dv.finish();
    if (ds) ds->finish();
  }
}

}  // namespace sdpa
