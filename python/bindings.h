// What the binding files of the Python module share: the lenient option arguments, the option
// checks defined in sdpa_python.cpp, and the variant keywords of variants_binding.cpp.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace py = pybind11;

// Option arguments that pybind11 passes through unconverted (any Python object), so that the
// option checks below can say which argument has the wrong type; the signature in the
// docstring still shows the type expected ("scale: Optional[float] = None").
#define SDPA_LENIENT_ARG(Type, python_name)                                                      \
  struct Type {                                                                                  \
    py::object value;                                                                            \
  };                                                                                             \
  namespace pybind11::detail {                                                                   \
  template <>                                                                                    \
  struct type_caster<Type> {                                                                     \
    PYBIND11_TYPE_CASTER(Type, const_name(python_name));                                         \
    bool load(handle src, bool) {                                                                \
      value.value = reinterpret_borrow<object>(src);                                             \
      return true;                                                                               \
    }                                                                                            \
    static handle cast(const Type& v, return_value_policy, handle) { return v.value.inc_ref(); } \
  };                                                                                             \
  }

SDPA_LENIENT_ARG(BoolArg, "bool")
SDPA_LENIENT_ARG(IntArg, "int")
SDPA_LENIENT_ARG(FloatArg, "float")
SDPA_LENIENT_ARG(OptionalFloatArg, "Optional[float]")
SDPA_LENIENT_ARG(StrArg, "str")
SDPA_LENIENT_ARG(OptionalStrArg, "Optional[str]")
#undef SDPA_LENIENT_ARG

// ---- sdpa_python.cpp -------------------------------------------------------------------------

/// sdpa::Error as the exception its kind() says (TypeError, ValueError, OSError, MemoryError).
[[noreturn]] void raise_sdpa_error(const sdpa::Error& e);

// The option checks: each raises TypeError or ValueError naming the argument.
/// True or False (a NumPy bool too).
bool bool_option(const py::handle& obj, const char* name);
/// A thread count: 0 (one per core) or 1..1024.
int threads_option(const py::handle& obj);
/// An int (Python's or NumPy's, not a bool) that fits int64.
std::int64_t int_option(const py::handle& obj, const char* name);
/// A str.
std::string string_option(const py::handle& obj, const char* name);
/// None, or a real number (not a bool).
std::optional<double> optional_real_option(const py::handle& obj, const char* name);
/// numpy.asarray(obj) for argument `what`. What numpy.asarray cannot convert (a ragged list, a
/// torch tensor that requires grad, ...) raises ValueError (for NumPy's own ValueError) or
/// TypeError naming the argument, the original exception as its cause.
py::array array_argument(const py::handle& obj, const std::string& what);

// ---- variants_binding.cpp --------------------------------------------------------------------

/// What shapes alibi_slopes and sinks must have in a call: Hq query heads and B batches (the
/// query's leading dimensions `lead`, flattened; the sequences of a variable-length batch).
struct VariantDims {
  std::int64_t B = 1, Hq = 1;
  std::vector<std::int64_t> lead;
};

/// The VariantDims of a query of shape (..., Hq, L, E) (rank 2: one head); nullopt for a rank
/// below 2, which the library refuses itself.
std::optional<VariantDims> attention_dims(const std::vector<std::int64_t>& query_shape);

/// Applies the variant keywords of `kwargs` (window_size, softcap, alibi_slopes, sinks,
/// dropout_p, seed) to `o`; any other keyword raises TypeError (as a Python function given an
/// unexpected keyword does). alibi_slopes must be shaped (Hq,) or (B, Hq) (or (..., Hq) with the
/// query's leading dimensions), sinks (Hq,), by `dims` (unchecked when nullopt). Throws
/// sdpa::Error for bad values.
void apply_variant_keywords(sdpa::AttentionOptions& o, const py::kwargs& kwargs,
                            const std::optional<VariantDims>& dims);
