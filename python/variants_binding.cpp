// The attention variants for Python: the keywords window_size, softcap, alibi_slopes, sinks,
// dropout_p and seed of sdpa.scaled_dot_product_attention, attention_forward and
// attention_backward (apply_variant_keywords, called by sdpa_python.cpp and torch_bindings.cpp),
// and sdpa.attention_varlen / attention_varlen_backward, with the signature of FlashAttention's
// flash_attn_varlen_func (include/sdpa/varlen.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/variants.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"
#include "sdpa/varlen.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

std::string text_of(const py::handle& obj) { return py::str(obj).cast<std::string>(); }
std::string type_of(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

// An integer, Python's or NumPy's (anything with __index__), not a bool.
bool is_int(const py::handle& obj) {
  return !py::isinstance<py::bool_>(obj) && !py::isinstance<py::array>(obj) &&
         PyIndex_Check(obj.ptr()) != 0;
}

// The Python int of an is_int() object.
py::int_ int_of(const py::handle& obj) {
  return py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
}

// The int64 of an is_int() object, or a bad_value Error naming `what` with `text` when it does
// not fit.
std::int64_t int64_of(const py::handle& obj, const char* what, const std::string& text) {
  const py::int_ i = int_of(obj);
  if (i < py::int_(INT64_MIN) || i > py::int_(INT64_MAX)) {
    throw sdpa::Error(sdpa::ErrorKind::bad_value, what,
                      "expected values that fit int64, got " + text);
  }
  return i.cast<std::int64_t>();
}

// A real number: Python's or NumPy's, or anything float() converts (a one-element tensor), but
// not a bool, nor a complex number (whose imaginary part float() of NumPy's would drop), nor
// an object float() refuses (an array of several values).
double as_number(const py::handle& obj, const char* what) {
  const py::object numbers = py::module_::import("numbers");
  const bool is_complex =
      py::isinstance(obj, numbers.attr("Complex")) && !py::isinstance(obj, numbers.attr("Real"));
  const auto refuse = [&] {
    return sdpa::Error(
        sdpa::ErrorKind::bad_type, what,
        "expected a real number, got " + text_of(py::repr(obj)) + " (" + type_of(obj) + ")");
  };
  if (py::isinstance<py::bool_>(obj) || is_complex ||
      !(py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj) ||
        py::hasattr(obj, "__float__"))) {
    throw refuse();
  }
  PyObject* value = PyNumber_Float(obj.ptr());
  if (value == nullptr) {
    PyErr_Clear();
    throw refuse();
  }
  return py::reinterpret_steal<py::float_>(value).cast<double>();
}

// The values of an array-like of floats (NumPy array, list, torch tensor on the CPU) in C
// order, its shape one of `shapes` (any shape when `shapes` is empty): a (Hq, B) array is
// refused, not read as (B, Hq). `expected` names the shapes for the message.
std::vector<double> as_values(const py::handle& obj, const char* what,
                              const std::vector<std::vector<std::int64_t>>& shapes,
                              const std::string& expected) {
  const py::module_ np = py::module_::import("numpy");
  py::array a;
  try {
    a = np.attr("asarray")(obj);
    // Complex values are refused, not cast (which would drop their imaginary parts).
    if (a.dtype().kind() == 'c') {
      throw sdpa::Error(sdpa::ErrorKind::bad_type, what,
                        "expected an array of floats, got dtype " + text_of(a.dtype()));
    }
    a = np.attr("asarray")(a, "dtype"_a = "float64");
  } catch (const py::error_already_set&) {
    throw sdpa::Error(sdpa::ErrorKind::bad_type, what,
                      "expected an array of floats, got " + type_of(obj));
  }
  const std::vector<std::int64_t> shape(a.shape(), a.shape() + a.ndim());
  if (!shapes.empty() && std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) {
    throw sdpa::Error(sdpa::ErrorKind::bad_shape, what,
                      "expected shape " + expected + ", got " + sdpa::shape_string(shape));
  }
  a = np.attr("ascontiguousarray")(a.attr("reshape")(-1));
  const auto* d = static_cast<const double*>(a.data());
  return std::vector<double>(d, d + a.size());
}

// alibi_slopes: one per query head (Hq,), or per batch and head (B, Hq) (or, for a query of
// rank 5 or more, its leading dimensions followed by Hq).
std::vector<double> alibi_values(const py::handle& obj, const std::optional<VariantDims>& dims) {
  if (!dims) return as_values(obj, "alibi_slopes", {}, "");
  std::vector<std::vector<std::int64_t>> shapes = {{dims->Hq}, {dims->B, dims->Hq}};
  std::string expected = "(Hq,) = " + sdpa::shape_string({dims->Hq}) +
                         " or (B, Hq) = " + sdpa::shape_string({dims->B, dims->Hq});
  if (dims->lead.size() > 1) {
    std::vector<std::int64_t> full = dims->lead;
    full.push_back(dims->Hq);
    shapes.push_back(full);
    expected += " or (..., Hq) = " + sdpa::shape_string(full);
  }
  return as_values(obj, "alibi_slopes", shapes, expected);
}

// sinks: one logit per query head, (Hq,).
std::vector<double> sink_values(const py::handle& obj, const std::optional<VariantDims>& dims) {
  if (!dims) return as_values(obj, "sinks", {}, "");
  return as_values(obj, "sinks", {{dims->Hq}}, "(Hq,) = " + sdpa::shape_string({dims->Hq}));
}

}  // namespace

std::optional<VariantDims> attention_dims(const std::vector<std::int64_t>& query_shape) {
  const std::size_t rank = query_shape.size();
  if (rank < 2) return std::nullopt;
  VariantDims d;
  if (rank >= 3) d.Hq = query_shape[rank - 3];
  d.lead.assign(query_shape.begin(),
                query_shape.end() - static_cast<std::ptrdiff_t>(std::min<std::size_t>(rank, 3)));
  for (const std::int64_t n : d.lead) {
    if (__builtin_mul_overflow(d.B, n, &d.B)) return std::nullopt;  // refused by the library
  }
  return d;
}

void apply_variant_keywords(sdpa::AttentionOptions& o, const py::kwargs& kwargs,
                            const std::optional<VariantDims>& dims) {
  for (const auto& [key_obj, value] : kwargs) {
    const std::string key = text_of(key_obj);
    if (key == "window_size") {
      if (value.is_none()) continue;
      py::sequence seq;
      if (!py::isinstance<py::sequence>(value) || py::isinstance<py::str>(value) ||
          py::len(value) != 2) {
        throw sdpa::Error(
            sdpa::ErrorKind::bad_type, "window_size",
            "expected a pair (left, right) of ints (-1 = unbounded), got " + text_of(value));
      }
      seq = py::reinterpret_borrow<py::sequence>(value);
      for (int i = 0; i < 2; ++i) {
        if (!is_int(seq[i])) {
          throw sdpa::Error(sdpa::ErrorKind::bad_type, "window_size",
                            "expected a pair (left, right) of ints, got " + text_of(value));
        }
      }
      o.window_left = int64_of(seq[0], "window_size", text_of(value));
      o.window_right = int64_of(seq[1], "window_size", text_of(value));
      if (o.window_left < -1 || o.window_right < -1) {
        throw sdpa::Error(
            sdpa::ErrorKind::bad_value, "window_size",
            "expected -1 (unbounded) or a number of keys >= 0 on each side, got " + text_of(value));
      }
    } else if (key == "softcap") {
      o.softcap = value.is_none() ? 0.0 : as_number(value, "softcap");
    } else if (key == "alibi_slopes") {
      if (!value.is_none()) o.alibi_slopes = alibi_values(value, dims);
    } else if (key == "sinks") {
      if (!value.is_none()) o.sinks = sink_values(value, dims);
    } else if (key == "dropout_p") {
      o.dropout_p = as_number(value, "dropout_p");
    } else if (key == "seed") {
      if (!is_int(value)) {
        throw sdpa::Error(sdpa::ErrorKind::bad_type, "seed",
                          "expected an int in [0, 2^64-1], got " + text_of(value));
      }
      const py::int_ seed = int_of(value);
      if (seed < py::int_(0) || seed > py::int_(UINT64_MAX)) {
        throw sdpa::Error(sdpa::ErrorKind::bad_value, "seed",
                          "expected an int in [0, 2^64-1], got " + text_of(value));
      }
      o.seed = seed.cast<std::uint64_t>();
    } else {
      throw py::type_error("got an unexpected keyword argument '" + key + "'");
    }
  }
}

namespace {

struct Floating {
  py::array array;
  sdpa::TensorRef ref;
};

std::vector<std::int64_t> shape_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

Floating floating(const py::handle& obj, const char* what) {
  const py::module_ np = py::module_::import("numpy");
  py::array a = array_argument(obj, what);
  const py::dtype dt = a.dtype();
  sdpa::DType d;
  if (dt.kind() == 'f' && dt.itemsize() == 4) {
    d = sdpa::DType::float32;
  } else if (dt.kind() == 'f' && dt.itemsize() == 8) {
    d = sdpa::DType::float64;
  } else {
    throw sdpa::Error(sdpa::ErrorKind::bad_type, what,
                      "expected dtype float32 or float64, got " + text_of(dt));
  }
  // C order and the machine's byte order (a '>f8' array is converted, not read as native).
  a = np.attr("ascontiguousarray")(a, py::arg("dtype") = dt.attr("newbyteorder")("="));
  return {a, sdpa::TensorRef{a.data(), d, shape_of(a)}};
}

std::vector<std::int64_t> offsets(const py::handle& obj, const char* what) {
  const py::module_ np = py::module_::import("numpy");
  py::array a = array_argument(obj, what);
  // An empty list has NumPy's default dtype, float64: it holds no offsets, not float ones.
  if (a.size() == 0 && a.ndim() == 1 && !py::isinstance<py::array>(obj)) {
    throw sdpa::Error(sdpa::ErrorKind::bad_shape, what, "expected B + 1 >= 1 offsets, got none");
  }
  if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u') {
    throw sdpa::Error(
        sdpa::ErrorKind::bad_type, what,
        "expected an integer array of B + 1 offsets, got dtype " + text_of(a.dtype()));
  }
  // Unsigned offsets past int64 would wrap to negative numbers.
  if (a.dtype().kind() == 'u' && a.size() > 0 &&
      np.attr("max")(a) > py::int_(std::numeric_limits<std::int64_t>::max())) {
    throw sdpa::Error(
        sdpa::ErrorKind::bad_value, what,
        "expected offsets below 2^63, got " + py::str(np.attr("max")(a)).cast<std::string>());
  }
  if (a.ndim() != 1) {
    throw sdpa::Error(
        sdpa::ErrorKind::bad_shape, what,
        "expected a 1-d array of B + 1 offsets, got " + std::to_string(a.ndim()) + " dimensions");
  }
  a = np.attr("ascontiguousarray")(a, "dtype"_a = "int64");
  const auto* p = static_cast<const std::int64_t*>(a.data());
  return std::vector<std::int64_t>(p, p + a.size());
}

py::array new_array(sdpa::DType d, const std::vector<std::int64_t>& shape) {
  return d == sdpa::DType::float64 ? py::array(py::dtype::of<double>(), shape)
                                   : py::array(py::dtype::of<float>(), shape);
}

sdpa::MutableTensorRef mut(py::array& a, sdpa::DType d) {
  return sdpa::MutableTensorRef{a.mutable_data(), d, shape_of(a)};
}

// The options of a varlen call but its variant keywords (which need the shapes). causal:
// FlashAttention's bool (True = bottom-right aligned) or one of the names of sdpa.h;
// grouped-query attention is implied (Hq a multiple of Hkv).
sdpa::AttentionOptions varlen_options(const py::object& scale, const py::object& causal,
                                      const py::object& impl, const py::object& threads) {
  sdpa::AttentionOptions o;
  o.scale = optional_real_option(scale, "softmax_scale");
  if (o.scale && !std::isfinite(*o.scale)) {
    throw sdpa::Error(sdpa::ErrorKind::bad_value, "softmax_scale",
                      "expected a finite number, got " + text_of(scale));
  }
  if (py::isinstance<py::bool_>(causal)) {
    o.causal = causal.cast<bool>() ? sdpa::Causal::lower_right : sdpa::Causal::none;
  } else if (py::isinstance<py::str>(causal)) {
    o.causal = sdpa::parse_causal(causal.cast<std::string>());
  } else {
    throw sdpa::Error(
        sdpa::ErrorKind::bad_type, "causal",
        "expected a bool or 'none', 'upper-left', 'lower-right', got " + text_of(causal));
  }
  o.enable_gqa = true;
  o.impl = sdpa::parse_impl(string_option(impl, "impl"));
  o.threads = threads_option(threads);
  sdpa::resolve_threads(o.threads);
  return o;
}

// The arrays and options of a varlen call. The options first, so that a wrong one is refused
// before any array is converted; the variant keywords last, as their shapes follow from query
// and cu_seqlens_q.
struct VarlenCall {
  std::int64_t max_q = 0, max_k = 0;
  sdpa::AttentionOptions options;
  Floating q, k, v;
  std::vector<std::int64_t> cu_q, cu_k;
};

VarlenCall varlen_call(const py::object& q, const py::object& k, const py::object& v,
                       const py::object& cu_q, const py::object& cu_k, const py::object& max_q,
                       const py::object& max_k, const py::object& scale, const py::object& causal,
                       const py::object& impl, const py::object& threads,
                       const py::kwargs& kwargs) {
  VarlenCall c;
  c.max_q = int_option(max_q, "max_seqlen_q");
  c.max_k = int_option(max_k, "max_seqlen_k");
  c.options = varlen_options(scale, causal, impl, threads);
  c.q = floating(q, "query");
  c.k = floating(k, "key");
  c.v = floating(v, "value");
  const sdpa::DType d = c.q.ref.dtype;
  if (c.k.ref.dtype != d || c.v.ref.dtype != d) {
    throw sdpa::Error(sdpa::ErrorKind::bad_type, "key/value",
                      std::string("expected the query's dtype ") + sdpa::dtype_name(d) +
                          ", got key " + sdpa::dtype_name(c.k.ref.dtype) + " and value " +
                          sdpa::dtype_name(c.v.ref.dtype));
  }
  c.cu_q = offsets(cu_q, "cu_seqlens_q");
  c.cu_k = offsets(cu_k, "cu_seqlens_k");
  std::optional<VariantDims> dims;
  if (c.q.ref.shape.size() == 3 && !c.cu_q.empty()) {
    dims = VariantDims{static_cast<std::int64_t>(c.cu_q.size()) - 1, c.q.ref.shape[1], {}};
  }
  apply_variant_keywords(c.options, kwargs, dims);
  return c;
}

template <class F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const sdpa::Error& e) {
    raise_sdpa_error(e);
  }
}

py::object varlen_forward(const py::object& q, const py::object& k, const py::object& v,
                          const py::object& cu_q, const py::object& cu_k, const IntArg& max_q,
                          const IntArg& max_k, const OptionalFloatArg& scale,
                          const py::object& causal, const BoolArg& return_lse_arg,
                          const StrArg& impl, const IntArg& threads, const py::kwargs& kwargs) {
  return translated([&]() -> py::object {
    const VarlenCall c = varlen_call(q, k, v, cu_q, cu_k, max_q.value, max_k.value, scale.value,
                                     causal, impl.value, threads.value, kwargs);
    const bool return_lse = bool_option(return_lse_arg.value, "return_lse");
    const sdpa::DType d = c.q.ref.dtype;
    if (c.q.ref.shape.size() != 3 || c.v.ref.shape.size() != 3) {
      throw sdpa::Error(sdpa::ErrorKind::bad_shape, c.q.ref.shape.size() != 3 ? "query" : "value",
                        "expected a packed (total, heads, dim) array of rank 3");
    }
    py::array out = new_array(d, {c.q.ref.shape[0], c.q.ref.shape[1], c.v.ref.shape[2]});
    py::array lse = new_array(d, {c.q.ref.shape[1], c.q.ref.shape[0]});
    const sdpa::MutableTensorRef out_ref = mut(out, d), lse_ref = mut(lse, d);
    {
      py::gil_scoped_release release;
      sdpa::attention_varlen_forward(c.q.ref, c.k.ref, c.v.ref, c.cu_q, c.cu_k, c.max_q, c.max_k,
                                     c.options, out_ref, &lse_ref);
    }
    if (return_lse) return py::make_tuple(out, lse);
    return out;
  });
}

py::tuple varlen_backward(const py::object& q, const py::object& k, const py::object& v,
                          const py::object& cu_q, const py::object& cu_k, const IntArg& max_q,
                          const IntArg& max_k, const py::object& out, const py::object& lse,
                          const py::object& grad_out, const OptionalFloatArg& scale,
                          const py::object& causal, const StrArg& impl, const IntArg& threads,
                          const py::kwargs& kwargs) {
  return translated([&]() -> py::tuple {
    const VarlenCall c = varlen_call(q, k, v, cu_q, cu_k, max_q.value, max_k.value, scale.value,
                                     causal, impl.value, threads.value, kwargs);
    const Floating fo = floating(out, "out"), fl = floating(lse, "lse"),
                   fg = floating(grad_out, "grad_out");
    const sdpa::DType d = c.q.ref.dtype;
    py::array dq = new_array(d, c.q.ref.shape), dk = new_array(d, c.k.ref.shape),
              dv = new_array(d, c.v.ref.shape);
    const bool sinks = !c.options.sinks.empty();
    py::array ds = new_array(d, {static_cast<std::int64_t>(c.options.sinks.size())});
    const sdpa::MutableTensorRef dq_ref = mut(dq, d), dk_ref = mut(dk, d), dv_ref = mut(dv, d),
                                 ds_ref = mut(ds, d);
    {
      py::gil_scoped_release release;
      sdpa::attention_varlen_backward(c.q.ref, c.k.ref, c.v.ref, c.cu_q, c.cu_k, c.max_q, c.max_k,
                                      fo.ref, fl.ref, fg.ref, c.options, dq_ref, dk_ref, dv_ref,
                                      sinks ? &ds_ref : nullptr);
    }
    if (sinks) return py::make_tuple(dq, dk, dv, ds);
    return py::make_tuple(dq, dk, dv);
  });
}

constexpr const char* kVarlenDoc =
    R"doc(Attention over a packed batch of sequences of different lengths, as FlashAttention's
flash_attn_varlen_func: out (total_q, Hq, Ev), or (out, lse) with return_lse, lse (Hq, total_q).

query (total_q, Hq, E), key (total_k, Hkv, E), value (total_k, Hkv, Ev), float32 or float64;
Hq a multiple of Hkv. cu_seqlens_q / cu_seqlens_k: B + 1 int offsets (start at 0,
non-decreasing, end at the totals): sequence b is query rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
and key rows cu_seqlens_k[b]:cu_seqlens_k[b+1]; it attends only within itself. max_seqlen_q /
max_seqlen_k: at least the longest sequence. softmax_scale: None = 1/sqrt(E). causal: True is
FlashAttention's (bottom-right aligned per sequence), or 'none', 'upper-left', 'lower-right'.
Keywords: window_size=(left, right), softcap, alibi_slopes (Hq,) or (B, Hq), sinks (Hq,),
dropout_p, seed (docs/variants.md), impl, threads.
)doc";

constexpr const char* kVarlenBackwardDoc =
    R"doc(The backward of attention_varlen: (dq, dk, dv), and dsinks (Hq,) last when sinks are given.
out and lse are attention_varlen's (return_lse=True) for the same inputs and options.
)doc";

// The dropout factors (0 or 1 / (1 - p'), p' = p rounded to a multiple of 2^-16; see
// core/variants.h) that every implementation draws for batch b (flattened
// leading dimensions), head h, query i and key j: (B, H, L, S) float64. sdpa.torch forms the
// gradient of an attention mask with them.
py::array_t<double> dropout_factors(std::int64_t B, std::int64_t H, std::int64_t L, std::int64_t S,
                                    double p, std::uint64_t seed) {
  for (auto [n, what] : {std::pair{B, "B"}, {H, "H"}, {L, "L"}, {S, "S"}}) {
    if (n < 0) {
      throw sdpa::Error(sdpa::ErrorKind::bad_value, what,
                        "expected a size >= 0, got " + std::to_string(n));
    }
  }
  if (!(p >= 0.0 && p < 1.0)) {
    throw sdpa::Error(sdpa::ErrorKind::bad_value, "dropout_p",
                      "expected a probability in [0, 1), got " + std::to_string(p));
  }
  py::array_t<double> out({B, H, L, S});
  sdpa::detail::Variants v;
  v.dropout_p = p;
  v.seed = seed;
  double* f = out.mutable_data();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < L; ++i, f += S) sdpa::detail::dropout_row(v, b, h, i, 0, S, f);
  return out;
}

}  // namespace

void bind_variants(py::module_& m) {
  m.def("_dropout_factors", &dropout_factors, py::arg("B"), py::arg("H"), py::arg("L"),
        py::arg("S"), py::arg("dropout_p"), py::arg("seed"));
  m.def("attention_varlen", &varlen_forward, kVarlenDoc, py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"),
        py::arg("max_seqlen_k"), py::kw_only(), py::arg("softmax_scale") = py::none(),
        py::arg("causal") = false, py::arg("return_lse") = false, py::arg("impl") = "fast",
        py::arg("threads") = 0);
  m.def("attention_varlen_backward", &varlen_backward, kVarlenBackwardDoc, py::arg("query"),
        py::arg("key"), py::arg("value"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
        py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::arg("out"), py::arg("lse"),
        py::arg("grad_out"), py::kw_only(), py::arg("softmax_scale") = py::none(),
        py::arg("causal") = false, py::arg("impl") = "fast", py::arg("threads") = 0);
}
