// The Python module `sdpa`: NumPy in, NumPy out, with the signature of PyTorch's
// torch.nn.functional.scaled_dot_product_attention. User documentation: docs/python.md.
//
// Every function works the same way:
//   1. with the GIL held, each array argument becomes a C-contiguous, aligned NumPy array of a
//      native dtype: the caller's own array when it already is one (zero-copy), a copy otherwise
//      (non-contiguous views, broadcast views, byte-swapped floats). float16 is taken as it is,
//      uint16 as bfloat16 bit patterns (docs/precision.md). Other dtypes (other integers, bool
//      for query/key/value) raise TypeError: converting them silently would change
//      the dtype of the result, which is always the query's;
//   2. the outputs are allocated as fresh NumPy arrays, so nothing half-written is ever visible;
//   3. the GIL is released for the computation itself (py::gil_scoped_release), so other Python
//      threads run meanwhile;
//   4. sdpa::Error becomes the exception its kind() says (TypeError for bad_type, ValueError for
//      bad_value and bad_shape, OSError for io, MemoryError for resources), with the message the
//      command-line program prints (the CLI's "mask" is called attn_mask here, as the Python
//      argument is). Options are converted here from plain objects, so that a wrong type is a
//      TypeError naming the argument.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bindings.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

#ifdef SDPA_PYTHON_HAS_LAB
#include "lab/lab.h"
#endif

void bind_kvcache(py::module_& m);   // kvcache_binding.cpp
void bind_variants(py::module_& m);  // variants_binding.cpp

namespace {

// ---- errors ------------------------------------------------------------------------------------

/// Raises the Python exception of `kind`: the kind chooses the type, never the message's text.
[[noreturn]] void raise_kind(sdpa::ErrorKind kind, const std::string& message) {
  PyObject* type = PyExc_ValueError;  // bad_value, bad_shape
  switch (kind) {
    case sdpa::ErrorKind::bad_type:
      type = PyExc_TypeError;
      break;
    case sdpa::ErrorKind::io:
      type = PyExc_OSError;
      break;
    case sdpa::ErrorKind::resources:
      type = PyExc_MemoryError;
      break;
    case sdpa::ErrorKind::bad_value:
    case sdpa::ErrorKind::bad_shape:
      break;
  }
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

[[noreturn]] void raise_error(const sdpa::Error& e) {
  std::string message = e.what();
  // The C++ API's "mask" is the Python argument attn_mask.
  if (e.argument() == "mask") message = "attn_mask" + message.substr(4);
  raise_kind(e.kind(), message);
}

template <class F>
auto translate(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const sdpa::Error& e) {
    raise_error(e);
  }
}

/// str(obj) as Python prints it: "float16", "nan", "0.5".
std::string text_of(const py::handle& obj) { return py::str(obj).cast<std::string>(); }

// ---- arrays ------------------------------------------------------------------------------------

std::optional<sdpa::DType> accepted_dtype(const py::dtype& dt) {
  if (dt.kind() == 'f' && dt.itemsize() == 4) return sdpa::DType::float32;
  if (dt.kind() == 'f' && dt.itemsize() == 8) return sdpa::DType::float64;
  if (dt.kind() == 'f' && dt.itemsize() == 2) return sdpa::DType::float16;
  // NumPy has no bfloat16: uint16 arrays carry its bit patterns (docs/precision.md).
  if (dt.kind() == 'u' && dt.itemsize() == 2) return sdpa::DType::bfloat16;
  if (dt.kind() == 'b') return sdpa::DType::boolean;
  return std::nullopt;
}

py::dtype native_dtype(sdpa::DType d) {
  switch (d) {
    case sdpa::DType::float32:
      return py::dtype::of<float>();
    case sdpa::DType::float64:
      return py::dtype::of<double>();
    case sdpa::DType::boolean:
      return py::dtype::of<bool>();
    case sdpa::DType::float16:
      return py::dtype("float16");
    case sdpa::DType::bfloat16:  // NumPy has no bfloat16: its bit patterns as uint16
      return py::dtype("uint16");
  }
  return py::dtype::of<double>();
}

std::vector<std::int64_t> shape_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

/// An array argument ready for the C++ API. `array` owns (or borrows) the memory `ref` points to.
struct Input {
  py::array array;
  sdpa::TensorRef ref;
};

enum class Role { floating, mask };

/// Whether an argument may reach the C++ API as a strided view (the attention functions, which
/// read any strides with a contiguous last dimension in place) or must be C-contiguous (the
/// row-wise softmax functions, which walk the data row after row).
enum class Layout { strided, c_order };

/// The strides of `a` in elements when the C++ API can read it where it lies: aligned, native
/// byte order, every stride a non-negative multiple of the item size and the last dimension
/// contiguous (or of size <= 1). Empty otherwise.
std::optional<std::vector<std::int64_t>> element_strides(const py::array& a) {
  if (!a.attr("flags").attr("aligned").cast<bool>() || !a.dtype().attr("isnative").cast<bool>()) {
    return std::nullopt;
  }
  const auto item = static_cast<py::ssize_t>(a.itemsize());
  std::vector<std::int64_t> strides(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    const py::ssize_t st = a.strides(i);
    if (a.shape(i) <= 1) {
      strides[static_cast<std::size_t>(i)] = 0;  // never stepped over
      continue;
    }
    if (st < 0 || st % item != 0) return std::nullopt;
    strides[static_cast<std::size_t>(i)] = st / item;
  }
  if (a.ndim() > 0 && a.shape(a.ndim() - 1) > 1 && strides.back() != 1) return std::nullopt;
  return strides;
}

/// Converts `obj` (a NumPy array or anything numpy.asarray accepts) for argument `what`.
Input prepare(const py::handle& obj, const std::string& what, Role role,
              Layout layout = Layout::c_order) {
  const py::module_ np = py::module_::import("numpy");
  py::array a = array_argument(obj, what);
  const py::dtype dt = a.dtype();
  const std::optional<sdpa::DType> d = accepted_dtype(dt);
  if (role == Role::floating && (!d || *d == sdpa::DType::boolean)) {
    throw py::type_error(what +
                         ": expected dtype float32, float64, float16 or uint16 (bfloat16 bits), "
                         "got " +
                         text_of(dt));
  }
  if (role == Role::mask && !d) {
    throw py::type_error(what +
                         ": expected dtype bool, float32, float64, float16 or uint16 (bfloat16 "
                         "bits), got " +
                         text_of(dt));
  }
  // A broadcast view (np.broadcast_to) repeats data with stride 0: it goes to the C++ API as it
  // is, shape and zero strides, read in place (a (L, S) mask broadcast to (B, H, L, S) costs
  // L * S), and its shape checked as the caller gave it.
  // Zero-copy for a strided view the C++ API reads in place (the attention functions), and for
  // a C-contiguous, aligned array of native byte order: np.require returns the very same object
  // then ('E': a plain ndarray, not a subclass).
  if (layout == Layout::strided && py::isinstance(a, np.attr("ndarray")) &&
      a.get_type().is(np.attr("ndarray"))) {
    if (const auto strides = element_strides(a)) {
      Input in;
      in.array = a;
      in.ref = sdpa::TensorRef{a.data(), *d, shape_of(a), *strides};
      return in;
    }
  }
  py::list requirements;
  for (const char* r : {"C", "A", "E"}) requirements.append(r);
  a = np.attr("require")(a, native_dtype(*d), requirements);
  Input in;
  in.array = a;
  in.ref = sdpa::TensorRef{a.data(), *d, shape_of(a)};
  return in;
}

py::array new_array(sdpa::DType d, const std::vector<std::int64_t>& shape) {
  return py::array(native_dtype(d), std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

sdpa::MutableTensorRef mutable_ref(py::array& a, sdpa::DType d) {
  return sdpa::MutableTensorRef{a.mutable_data(), d, shape_of(a)};
}

// ---- options -----------------------------------------------------------------------------------
// Options arrive as plain Python objects and are converted here, so that a wrong type is a
// TypeError naming the argument (pybind11's own conversion would list every overload instead).

/// "'no' (str)" for messages.
std::string given(const py::handle& obj) {
  return py::repr(obj).cast<std::string>() + " (" +
         py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>() + ")";
}

[[noreturn]] void type_error(const std::string& message) {
  raise_kind(sdpa::ErrorKind::bad_type, message);
}

bool is_bool(const py::handle& obj) {
  return py::isinstance<py::bool_>(obj) ||
         py::isinstance(obj, py::module_::import("numpy").attr("bool_"));
}

bool as_bool(const py::handle& obj, const char* name) {
  if (!is_bool(obj)) type_error(std::string(name) + ": expected True or False, got " + given(obj));
  return obj.cast<bool>();
}

bool is_integer(const py::handle& obj) {
  return !is_bool(obj) && (py::isinstance<py::int_>(obj) ||
                           py::isinstance(obj, py::module_::import("numpy").attr("integer")));
}

int as_threads(const py::handle& obj) {
  if (!is_integer(obj)) {
    type_error("threads: expected an int, 0 (one per core) or 1..1024, got " + given(obj));
  }
  const py::int_ value(py::reinterpret_borrow<py::object>(obj));
  if (value < py::int_(0) || value > py::int_(1024)) {
    raise_kind(sdpa::ErrorKind::bad_value,
               "threads: expected 0 (one per core) or 1..1024, got " + text_of(value));
  }
  return value.cast<int>();
}

std::optional<double> as_scale(const py::handle& obj) {
  if (obj.is_none()) return std::nullopt;
  const py::object real = py::module_::import("numbers").attr("Real");
  if (is_bool(obj) || !py::isinstance(obj, real)) {
    type_error("scale: expected None or a real number, got " + given(obj));
  }
  return py::float_(py::reinterpret_borrow<py::object>(obj)).cast<double>();
}

double as_real(const py::handle& obj, const char* name) {
  const py::object real = py::module_::import("numbers").attr("Real");
  if (is_bool(obj) || !py::isinstance(obj, real)) {
    type_error(std::string(name) + ": expected a real number, got " + given(obj));
  }
  return py::float_(py::reinterpret_borrow<py::object>(obj)).cast<double>();
}

int as_axis(const py::handle& obj) {
  if (!is_integer(obj)) type_error("axis: expected an int, got " + given(obj));
  const py::int_ value(py::reinterpret_borrow<py::object>(obj));
  if (value < py::int_(-64) || value > py::int_(64)) {
    raise_kind(sdpa::ErrorKind::bad_value,
               "axis: expected an axis of the array, got " + text_of(value));
  }
  return value.cast<int>();
}

std::string as_string(const py::handle& obj, const char* name) {
  if (!py::isinstance<py::str>(obj)) {
    type_error(std::string(name) + ": expected a str, got " + given(obj));
  }
  return obj.cast<std::string>();
}

std::optional<std::string> as_optional_string(const py::handle& obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return as_string(obj, name);
}

/// A seed: an int in [0, 2^64 - 1], as on the command line.
std::uint64_t as_seed(const py::handle& obj) {
  if (!is_integer(obj)) {
    type_error("seed: expected an int in [0, 2^64-1], got " + given(obj));
  }
  const py::int_ value(py::reinterpret_borrow<py::object>(obj));
  const py::int_ top = py::reinterpret_steal<py::int_>(PyLong_FromUnsignedLongLong(~0ULL));
  if (value < py::int_(0) || value > top) {
    raise_kind(
        sdpa::ErrorKind::bad_value,
        "seed: expected an int in [0, 2^64-1] (0 to 18446744073709551615), got " + text_of(value));
  }
  return value.cast<std::uint64_t>();
}

/// The options as the Python caller gave them; converted and checked by make_options.
struct PyOptions {
  py::object is_causal, scale, enable_gqa, causal, impl, threads;
};

sdpa::AttentionOptions make_options(const PyOptions& py_options) {
  const bool is_causal = as_bool(py_options.is_causal, "is_causal");
  const std::optional<std::string> causal = as_optional_string(py_options.causal, "causal");
  sdpa::AttentionOptions o;
  o.scale = as_scale(py_options.scale);
  o.enable_gqa = as_bool(py_options.enable_gqa, "enable_gqa");
  o.impl = sdpa::parse_impl(as_string(py_options.impl, "impl"));
  o.threads = as_threads(py_options.threads);
  sdpa::resolve_threads(o.threads);  // validate now, with the GIL held
  if (causal.has_value()) {
    o.causal = sdpa::parse_causal(*causal);
    if (is_causal && o.causal != sdpa::Causal::upper_left) {
      throw sdpa::Error("is_causal: expected False when causal='" + *causal +
                        "' is given (is_causal=True means causal='upper-left'), got True");
    }
  } else if (is_causal) {
    o.causal = sdpa::Causal::upper_left;
  }
  return o;
}

// ---- attention ---------------------------------------------------------------------------------

struct AttentionInputs {
  Input query, key, value;
  std::optional<Input> mask;
  const sdpa::TensorRef* mask_ref() const { return mask ? &mask->ref : nullptr; }
};

AttentionInputs prepare_inputs(const py::handle& query, const py::handle& key,
                               const py::handle& value, const py::handle& attn_mask) {
  AttentionInputs in{prepare(query, "query", Role::floating, Layout::strided),
                     prepare(key, "key", Role::floating, Layout::strided),
                     prepare(value, "value", Role::floating, Layout::strided), std::nullopt};
  if (!attn_mask.is_none()) {
    in.mask = prepare(attn_mask, "attn_mask", Role::mask, Layout::strided);
  }
  return in;
}

py::object forward(const py::object& query, const py::object& key, const py::object& value,
                   const py::object& attn_mask, const BoolArg& is_causal_arg,
                   const OptionalFloatArg& scale_arg, const BoolArg& enable_gqa_arg,
                   const OptionalStrArg& causal_arg, const BoolArg& return_lse_arg,
                   const StrArg& impl_arg, const IntArg& threads_arg, const py::kwargs& variants) {
  const py::object &is_causal = is_causal_arg.value, &scale = scale_arg.value,
                   &enable_gqa = enable_gqa_arg.value, &causal = causal_arg.value,
                   &return_lse_obj = return_lse_arg.value, &impl = impl_arg.value,
                   &threads = threads_arg.value;
  return translate([&]() -> py::object {
    sdpa::AttentionOptions options =
        make_options({is_causal, scale, enable_gqa, causal, impl, threads});
    const bool return_lse = as_bool(return_lse_obj, "return_lse");
    const AttentionInputs in = prepare_inputs(query, key, value, attn_mask);
    // After the arrays: alibi_slopes and sinks are shaped by the query.
    apply_variant_keywords(options, variants, attention_dims(in.query.ref.shape));
    const sdpa::DType d = in.query.ref.dtype;
    py::array out =
        new_array(d, sdpa::attention_output_shape(in.query.ref, in.key.ref, in.value.ref, options));
    const sdpa::MutableTensorRef out_ref = mutable_ref(out, d);
    py::array lse;
    sdpa::MutableTensorRef lse_ref;
    if (return_lse) {
      const sdpa::DType ld =  // float32 for a 16-bit query
          d == sdpa::DType::float16 || d == sdpa::DType::bfloat16 ? sdpa::DType::float32 : d;
      lse = new_array(ld, sdpa::attention_lse_shape(in.query.ref));
      lse_ref = mutable_ref(lse, ld);
    }
    {
      py::gil_scoped_release release;
      sdpa::attention_forward(in.query.ref, in.key.ref, in.value.ref, in.mask_ref(), options,
                              out_ref, return_lse ? &lse_ref : nullptr);
    }
    if (return_lse) return py::make_tuple(out, lse);
    return out;
  });
}

py::array scaled_dot_product_attention(const py::object& query, const py::object& key,
                                       const py::object& value, const py::object& attn_mask,
                                       const FloatArg& dropout_p, const BoolArg& is_causal,
                                       const OptionalFloatArg& scale, const BoolArg& enable_gqa,
                                       const OptionalStrArg& causal, const StrArg& impl,
                                       const IntArg& threads, const py::kwargs& variants) {
  py::kwargs with_dropout;
  for (const auto& [k, v] : variants) with_dropout[k] = v;
  with_dropout["dropout_p"] = dropout_p.value;
  return forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal,
                 BoolArg{py::bool_(false)}, impl, threads, with_dropout);
}

py::tuple backward(const py::object& query, const py::object& key, const py::object& value,
                   const py::object& out, const py::object& lse, const py::object& grad_out,
                   const py::object& attn_mask, const BoolArg& is_causal_arg,
                   const OptionalFloatArg& scale_arg, const BoolArg& enable_gqa_arg,
                   const OptionalStrArg& causal_arg, const StrArg& impl_arg,
                   const IntArg& threads_arg, const py::kwargs& variants) {
  const py::object &is_causal = is_causal_arg.value, &scale = scale_arg.value,
                   &enable_gqa = enable_gqa_arg.value, &causal = causal_arg.value,
                   &impl = impl_arg.value, &threads = threads_arg.value;
  return translate([&]() -> py::tuple {
    sdpa::AttentionOptions options =
        make_options({is_causal, scale, enable_gqa, causal, impl, threads});
    const AttentionInputs in = prepare_inputs(query, key, value, attn_mask);
    apply_variant_keywords(options, variants, attention_dims(in.query.ref.shape));
    const Input out_in = prepare(out, "out", Role::floating, Layout::strided);
    const Input lse_in = prepare(lse, "lse", Role::floating, Layout::strided);
    const Input grad_in = prepare(grad_out, "grad_out", Role::floating, Layout::strided);
    const sdpa::DType d = in.query.ref.dtype;
    py::array dq = new_array(d, in.query.ref.shape);
    const sdpa::DType dkv = in.key.ref.dtype;  // a 16-bit KV's gradients have its dtype
    py::array dk = new_array(dkv, in.key.ref.shape);
    py::array dv = new_array(in.value.ref.dtype, in.value.ref.shape);
    const sdpa::MutableTensorRef dq_ref = mutable_ref(dq, d), dk_ref = mutable_ref(dk, dkv),
                                 dv_ref = mutable_ref(dv, in.value.ref.dtype);
    // With sinks, their gradient comes fourth.
    py::array ds = new_array(d, {static_cast<std::int64_t>(options.sinks.size())});
    const sdpa::MutableTensorRef ds_ref = mutable_ref(ds, d);
    {
      py::gil_scoped_release release;
      sdpa::attention_backward(in.query.ref, in.key.ref, in.value.ref, in.mask_ref(), out_in.ref,
                               lse_in.ref, grad_in.ref, options, dq_ref, dk_ref, dv_ref,
                               options.sinks.empty() ? nullptr : &ds_ref);
    }
    if (!options.sinks.empty()) return py::make_tuple(dq, dk, dv, ds);
    return py::make_tuple(dq, dk, dv);
  });
}

// ---- softmax -----------------------------------------------------------------------------------

enum class RowOp { softmax, log_softmax };

void check_scale(double scale) {
  if (!std::isfinite(scale)) {
    throw py::value_error("scale: expected a finite number, got " + text_of(py::float_(scale)));
  }
}

/// `x` with `axis` moved last, made C-contiguous; `axis` checked against x's rank.
Input prepare_rows(const py::object& x, const std::string& what, int axis) {
  const py::module_ np = py::module_::import("numpy");
  py::array a = array_argument(x, what);
  const py::ssize_t rank = a.ndim();
  if (rank == 0) {
    throw py::value_error(what + ": expected rank 1 or more, got shape ()");
  }
  if (axis < -rank || axis >= rank) {
    throw py::value_error("axis: expected " + std::to_string(-rank) + " to " +
                          std::to_string(rank - 1) + " for " + what + " of shape " +
                          sdpa::shape_string(shape_of(a)) + ", got " + std::to_string(axis));
  }
  if (axis != -1 && axis != rank - 1) a = np.attr("moveaxis")(a, axis, -1);
  const std::optional<sdpa::DType> d = accepted_dtype(a.dtype());
  if (d != sdpa::DType::float32 && d != sdpa::DType::float64) {  // no 16-bit softmax
    throw py::type_error(what + ": expected dtype float32 or float64, got " + text_of(a.dtype()));
  }
  return prepare(a, what, Role::floating);
}

/// The result computed with `axis` last, put back in place (C-contiguous).
py::array restore_axis(const py::array& y, int axis) {
  if (axis == -1 || axis == y.ndim() - 1) return y;
  const py::module_ np = py::module_::import("numpy");
  return np.attr("ascontiguousarray")(np.attr("moveaxis")(y, -1, axis));
}

template <class T>
void rows(RowOp op, const Input& in, py::array& y, double scale) {
  const auto& shape = in.ref.shape;
  const std::int64_t n = shape.back();
  const std::int64_t count = n == 0 ? 0 : in.ref.numel() / n;
  const T* x = static_cast<const T*>(in.ref.data);
  T* out = static_cast<T*>(y.mutable_data());
  py::gil_scoped_release release;
  for (std::int64_t r = 0; r < count; ++r) {
    const std::span<const T> row(x + r * n, static_cast<std::size_t>(n));
    const std::span<T> dst(out + r * n, static_cast<std::size_t>(n));
    if (op == RowOp::softmax) {
      sdpa::softmax<T>(row, dst, scale);
    } else {
      sdpa::log_softmax<T>(row, dst, scale);
    }
  }
}

py::array row_op(RowOp op, const py::object& x, int axis, double scale) {
  check_scale(scale);
  const Input in = prepare_rows(x, "x", axis);
  py::array y = new_array(in.ref.dtype, in.ref.shape);
  translate([&] {
    if (in.ref.dtype == sdpa::DType::float32) {
      rows<float>(op, in, y, scale);
    } else {
      rows<double>(op, in, y, scale);
    }
  });
  return restore_axis(y, axis);
}

template <class T>
void backward_rows(const Input& p, const Input& dp, py::array& dx, double scale) {
  const std::int64_t n = p.ref.shape.back();
  const std::int64_t count = n == 0 ? 0 : p.ref.numel() / n;
  const T* pp = static_cast<const T*>(p.ref.data);
  const T* gp = static_cast<const T*>(dp.ref.data);
  T* out = static_cast<T*>(dx.mutable_data());
  py::gil_scoped_release release;
  for (std::int64_t r = 0; r < count; ++r) {
    const auto len = static_cast<std::size_t>(n);
    sdpa::softmax_backward<T>(std::span<const T>(pp + r * n, len),
                              std::span<const T>(gp + r * n, len), std::span<T>(out + r * n, len),
                              scale);
  }
}

py::array softmax_backward(const py::object& probabilities, const py::object& grad_probabilities,
                           int axis, double scale) {
  check_scale(scale);
  const Input p = prepare_rows(probabilities, "probabilities", axis);
  const Input dp = prepare_rows(grad_probabilities, "grad_probabilities", axis);
  if (dp.ref.dtype != p.ref.dtype) {
    throw py::type_error(std::string("grad_probabilities: expected dtype ") +
                         sdpa::dtype_name(p.ref.dtype) + " like probabilities, got " +
                         sdpa::dtype_name(dp.ref.dtype));
  }
  if (dp.ref.shape != p.ref.shape) {
    throw py::value_error("grad_probabilities: expected the shape of probabilities " +
                          sdpa::shape_string(shape_of(py::array(probabilities))) + ", got " +
                          sdpa::shape_string(shape_of(py::array(grad_probabilities))));
  }
  py::array dx = new_array(p.ref.dtype, p.ref.shape);
  translate([&] {
    if (p.ref.dtype == sdpa::DType::float32) {
      backward_rows<float>(p, dp, dx, scale);
    } else {
      backward_rows<double>(p, dp, dx, scale);
    }
  });
  return restore_axis(dx, axis);
}

// ---- lab ---------------------------------------------------------------------------------------

#ifdef SDPA_PYTHON_HAS_LAB
py::list lab_experiments() {
  py::list out;
  for (const auto& e : sdpa::lab::experiments()) {
    py::dict d;
    d["name"] = e.name;
    d["summary"] = e.summary;
    out.append(d);
  }
  return out;
}

py::object lab_run(const StrArg& name_arg, const IntArg& seed_arg, const BoolArg& quick_arg,
                   const IntArg& threads_arg, const StrArg& lang_arg) {
  const py::object &name_obj = name_arg.value, &seed = seed_arg.value, &quick = quick_arg.value,
                   &threads = threads_arg.value, &lang = lang_arg.value;
  std::string text;
  translate([&] {
    const std::string name = as_string(name_obj, "name");
    sdpa::lab::find_experiment(name);  // an unknown name fails before anything runs
    sdpa::lab::LabOptions o;
    o.seed = as_seed(seed);
    o.mode = as_bool(quick, "quick") ? sdpa::lab::Mode::quick : sdpa::lab::Mode::full;
    o.lang = sdpa::lab::parse_lang(as_string(lang, "lang"), "lang");
    o.threads = as_threads(threads);
    sdpa::resolve_threads(o.threads);
    o.progress = false;
    py::gil_scoped_release release;
    // The text `sdpa lab <name> --json` prints (run_experiment, then dump()), parsed by Python's
    // json module: the same dict, "seconds" included.
    text = sdpa::lab::run_experiment(name, o).dump(-1, ' ', false,
                                                   nlohmann::json::error_handler_t::replace);
  });
  return py::module_::import("json").attr("loads")(text);
}

std::string lab_text(const py::object& result, const StrArg& lang_arg) {
  const py::object& lang_obj = lang_arg.value;
  if (!py::isinstance<py::dict>(result)) {
    type_error("result: expected the dict sdpa.lab.run returned, got " + given(result));
  }
  const std::string lang = as_string(lang_obj, "lang");
  std::string text;
  try {
    text = py::module_::import("json")
               .attr("dumps")(result, py::arg("allow_nan") = false)
               .cast<std::string>();
  } catch (const py::error_already_set& e) {
    // A float NaN or inf (sdpa.lab.run writes them as the strings "nan" and "inf"), or a value
    // JSON has no form for.
    if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError)) throw;
    raise_kind(sdpa::ErrorKind::bad_value,
               std::string("result: expected the dict sdpa.lab.run returned, got one it cannot "
                           "have returned (") +
                   py::str(e.value()).cast<std::string>() + ")");
  }
  return translate([&] {
    const sdpa::lab::Lang l = sdpa::lab::parse_lang(lang, "lang");
    const nlohmann::json j = nlohmann::json::parse(text);
    try {
      py::gil_scoped_release release;
      return sdpa::lab::render_text(j, l);
    } catch (const nlohmann::json::exception& e) {
      raise_kind(sdpa::ErrorKind::bad_value,
                 std::string("result: expected the dict sdpa.lab.run returned, got one it cannot "
                             "have returned (") +
                     e.what() + ")");
    }
  });
}
#endif

// ---- documentation -----------------------------------------------------------------------------

constexpr const char* kModuleDoc =
    R"doc(Exact scaled dot-product attention on the CPU, softmax(Q K^T * scale + mask) V, forward and
backward, with the semantics of PyTorch's torch.nn.functional.scaled_dot_product_attention.

NumPy arrays in, NumPy arrays out. Shapes (any number of leading batch dimensions ``...``):

    query (..., Hq, L, E)   key (..., Hkv, S, E)   value (..., Hkv, S, Ev)
    out   (..., Hq, L, Ev)  lse (..., Hq, L)       attn_mask broadcastable to (..., Hq, L, S)

query is float32, float64, float16, or uint16 arrays holding bfloat16 bit patterns (NumPy has
no bfloat16; sdpa.to_bfloat16 / sdpa.from_bfloat16 convert). key and value have the query's
dtype, or, under a float32 or bfloat16 query, one 16-bit dtype (float16 or bfloat16). out has
the query's dtype; lse too, but float32 for a 16-bit query; each gradient its input's dtype.
Any other dtype or mix raises TypeError (nothing is converted silently). Arrays whose last
dimension is contiguous are read in place through their strides, others are copied first. Bad
shapes or options raise ValueError naming the argument. The GIL is released while the
computation runs. A row whose every key is masked gives zeros (and lse = -inf), where PyTorch
1.13 gives NaN.

Functions: scaled_dot_product_attention, attention_forward, attention_backward, softmax,
log_softmax, softmax_backward; the lab's experiments in sdpa.lab (when built with the lab).
See docs/python.md.
)doc";

constexpr const char* kSdpaDoc =
    R"doc(softmax(query @ key^T * scale + attn_mask) @ value, like PyTorch's function of this name.

Arguments:
  query: (..., Hq, L, E): float32, float64, float16, or uint16 (bfloat16 bit patterns).
  key: (..., Hkv, S, E), the query's dtype; under a float32 or bfloat16 query also float16 or
    bfloat16 (key and value the same).
  value: (..., Hkv, S, Ev), key's dtype.
  attn_mask: None, or an array broadcastable to (..., Hq, L, S): bool (True = the key takes
    part) or float32/float64/float16/uint16-as-bfloat16 (added to the scaled scores; -inf
    allowed), whatever the query's dtype. Broadcast views are not expanded.
  dropout_p: dropout on the attention weights, in [0, 1), with the keyword seed.
  is_causal: True is causal='upper-left' (PyTorch's tril(ones(L, S))).
  scale: the score scale; None means 1/sqrt(E). Must be finite.
  enable_gqa: grouped-query attention: Hq a multiple of Hkv; query head h reads key/value head
    h // (Hq // Hkv), as repeat_interleave does.
  causal (keyword): None, 'none', 'upper-left' or 'lower-right' (FlashAttention's
    tril(ones(L, S), S - L)). Combines with attn_mask: a key must be allowed by both.
  impl (keyword): 'fast' (the fused kernel), 'reference' (float64 accumulation) or 'naive'.
  threads (keyword): 0 = one per core, else 1..1024.
  Variants (keywords, FlashAttention's semantics, docs/variants.md): window_size=(left, right),
    softcap, alibi_slopes ((Hq,) or (B, Hq), B the leading dimensions flattened), sinks ((Hq,)),
    seed (of the dropout mask).

Returns out, (..., Hq, L, Ev), the query's dtype. Rows that see no key are zeros.
Raises TypeError for dtypes, ValueError for shapes and options.
)doc";

constexpr const char* kForwardDoc =
    R"doc(The forward pass: (out, lse) when return_lse (the default), else out.

Same arguments as scaled_dot_product_attention (dropout_p as a keyword). out has the query's
dtype. lse has shape (..., Hq, L) and the query's dtype, but float32 for a float16 or bfloat16
query: lse = log(sum_s exp(score[l, s])), the natural log-sum-exp of each row of scaled, masked
scores (the sinks included); -inf for a row whose every key is masked. Pass out and lse on to
attention_backward.
)doc";

constexpr const char* kBackwardDoc =
    R"doc(The backward pass: (dq, dk, dv), the gradients of sum(out * grad_out) with respect to query, key
and value, shaped like them: dq in the query's dtype, dk and dv in the key's and value's (float16
or bfloat16 for a 16-bit key and value under a float32 query).

out and lse are attention_forward's results for the same inputs and options (lse float32 for a
16-bit query); grad_out has out's shape and dtype. The options (attn_mask, is_causal, scale,
enable_gqa, causal) must be the forward's. Computes dS = P * (dP - rowsum(grad_out * out)); the
softmax Jacobian is never formed. Rows whose every key is masked contribute zero gradients. With
the keyword sinks, returns (dq, dk, dv, dsinks), dsinks in the query's dtype; the sinks'
gradient needs float32 or float64 query, key and value (TypeError otherwise). The variant
keywords (and dropout_p, seed) must be the forward's.
)doc";

constexpr const char* kSoftmaxDoc =
    R"doc(Numerically stable softmax(scale * x) along `axis`, accumulated in float64 whatever the dtype.

x: float32 or float64, rank >= 1. The maximum is subtracted before exp, so nothing overflows for
finite logits (e.g. [1000, 10, 5]). -inf entries get 0; an all -inf row gives zeros; +inf
entries share the probability equally; NaN in, NaN out. Returns an array of x's shape and dtype.
)doc";

constexpr const char* kLogSoftmaxDoc =
    R"doc(log(softmax(scale * x)) along `axis`, computed without forming softmax (no log(0) for finite
logits). x: float32 or float64, rank >= 1. An all -inf row gives -inf everywhere.
)doc";

constexpr const char* kSoftmaxBackwardDoc =
    R"doc(The vector-Jacobian product of p = softmax(scale * x) along `axis`:
grad_x = scale * p * (grad_p - sum(p * grad_p)). probabilities and grad_probabilities share
shape and dtype (float32 or float64).
)doc";

}  // namespace

// sdpa::Error as the exception its kind() says, for the other binding files.
[[noreturn]] void raise_sdpa_error(const sdpa::Error& e) { raise_error(e); }

// The option checks, for the other binding files (bindings.h).
bool bool_option(const py::handle& obj, const char* name) { return as_bool(obj, name); }
int threads_option(const py::handle& obj) { return as_threads(obj); }
std::int64_t int_option(const py::handle& obj, const char* name) {
  if (!is_integer(obj)) type_error(std::string(name) + ": expected an int, got " + given(obj));
  const py::int_ value(py::reinterpret_borrow<py::object>(obj));
  if (value < py::int_(INT64_MIN) || value > py::int_(INT64_MAX)) {
    raise_kind(sdpa::ErrorKind::bad_value,
               std::string(name) + ": expected an int that fits int64, got " + text_of(value));
  }
  return value.cast<std::int64_t>();
}
std::string string_option(const py::handle& obj, const char* name) { return as_string(obj, name); }
std::optional<double> optional_real_option(const py::handle& obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  const py::object real = py::module_::import("numbers").attr("Real");
  if (is_bool(obj) || !py::isinstance(obj, real)) {
    type_error(std::string(name) + ": expected None or a real number, got " + given(obj));
  }
  return py::float_(py::reinterpret_borrow<py::object>(obj)).cast<double>();
}

py::array array_argument(const py::handle& obj, const std::string& what) {
  try {
    return py::module_::import("numpy").attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    // NumPy's ValueError is about the object's shape (a ragged list); anything else (a torch
    // tensor that requires grad, an object whose __array__ fails) is about its type.
    PyObject* type = e.matches(PyExc_ValueError) ? PyExc_ValueError : PyExc_TypeError;
    const std::string message =
        what + ": expected an array (anything numpy.asarray takes), got a " +
        py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>() +
        " that numpy.asarray refused (" + py::str(e.value()).cast<std::string>() + ")";
    py::raise_from(e, type, message.c_str());
    throw py::error_already_set();
  }
}

void bind_torch(py::module_& m);  // torch_bindings.cpp

PYBIND11_MODULE(_sdpa, m) {
  m.doc() = kModuleDoc;
  m.attr("__version__") = sdpa::version();

  m.def("scaled_dot_product_attention", &scaled_dot_product_attention, kSdpaDoc, py::arg("query"),
        py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
        py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::arg("scale") = py::none(),
        py::arg("enable_gqa") = false, py::kw_only(), py::arg("causal") = py::none(),
        py::arg("impl") = "fast", py::arg("threads") = 0);

  m.def("attention_forward", &forward, kForwardDoc, py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("attn_mask") = py::none(), py::arg("is_causal") = false,
        py::arg("scale") = py::none(), py::arg("enable_gqa") = false, py::kw_only(),
        py::arg("causal") = py::none(), py::arg("return_lse") = true, py::arg("impl") = "fast",
        py::arg("threads") = 0);

  m.def("attention_backward", &backward, kBackwardDoc, py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("out"), py::arg("lse"), py::arg("grad_out"),
        py::arg("attn_mask") = py::none(), py::arg("is_causal") = false,
        py::arg("scale") = py::none(), py::arg("enable_gqa") = false, py::kw_only(),
        py::arg("causal") = py::none(), py::arg("impl") = "fast", py::arg("threads") = 0);

  m.def(
      "softmax",
      [](const py::object& x, const IntArg& axis, const FloatArg& scale) {
        return row_op(RowOp::softmax, x, as_axis(axis.value), as_real(scale.value, "scale"));
      },
      kSoftmaxDoc, py::arg("x"), py::arg("axis") = -1, py::arg("scale") = 1.0);
  m.def(
      "log_softmax",
      [](const py::object& x, const IntArg& axis, const FloatArg& scale) {
        return row_op(RowOp::log_softmax, x, as_axis(axis.value), as_real(scale.value, "scale"));
      },
      kLogSoftmaxDoc, py::arg("x"), py::arg("axis") = -1, py::arg("scale") = 1.0);
  m.def(
      "softmax_backward",
      [](const py::object& p, const py::object& dp, const IntArg& axis, const FloatArg& scale) {
        return softmax_backward(p, dp, as_axis(axis.value), as_real(scale.value, "scale"));
      },
      kSoftmaxBackwardDoc, py::arg("probabilities"), py::arg("grad_probabilities"),
      py::arg("axis") = -1, py::arg("scale") = 1.0);

  bind_kvcache(m);
  bind_variants(m);

  // For the tests of the zero-copy rule: the array the C++ code would read for this argument.
  m.def(
      "_prepared",
      [](const py::object& x, bool mask) {
        return prepare(x, mask ? "attn_mask" : "query", mask ? Role::mask : Role::floating,
                       Layout::strided)
            .array;
      },
      py::arg("x"), py::arg("mask") = false);

#ifdef SDPA_PYTHON_HAS_LAB
  py::module_ lab = m.def_submodule(
      "lab",
      "The lab: experiments that measure the article's claims (why attention divides by "
      "sqrt(d)).\nEach returns the dict `sdpa lab <name> --json` prints.");
  lab.def("experiments", &lab_experiments,
          "Every experiment as {'name': ..., 'summary': ...}, in the order `sdpa lab list` "
          "shows them.");
  lab.def("run", &lab_run,
          "Runs experiment `name` and returns its result dict, the same object `sdpa lab <name> "
          "--json` prints: {'experiment', 'seed', 'mode', 'seconds', 'claims', 'tables'}.\n"
          "seed: the experiment's seed (same seed, same result except 'seconds'); quick: the "
          "quick mode (False: full); threads: 0 = one per core; lang: 'en' or 'zh'.\n"
          "Unknown names raise ValueError listing the valid ones. The GIL is released while it "
          "runs.",
          py::arg("name"), py::kw_only(), py::arg("seed") = 1, py::arg("quick") = true,
          py::arg("threads") = 0, py::arg("lang") = "en");
  lab.def("text", &lab_text,
          "The readable text `sdpa lab <name>` prints (without --json) for a result dict of run(): "
          "each claim with its theory, measurement, verdict and evidence, then the key rows of "
          "the tables. lang: 'en' or 'zh' (the article's own words).",
          py::arg("result"), py::kw_only(), py::arg("lang") = "en");
  // `import sdpa.lab` works too, not only `sdpa.lab` as an attribute.
  py::module_::import("sys").attr("modules")["sdpa.lab"] = lab;
#endif
  bind_torch(m);
}
