// sdpa.attention_with_kvcache: the KV-cache API (include/sdpa/kvcache.h) for NumPy arrays,
// with the signature of FlashAttention's flash_attn_with_kvcache.
//
// The caches are written in place, so they are taken as they are: C-contiguous, aligned,
// writeable NumPy arrays of float32, float64 or float16 (anything else raises, rather than updating
// a copy the caller never sees). q, k and v may be anything numpy.asarray accepts; they are copied
// only when not already C-contiguous. cache_seqlens and block_table take any integer dtype whose
// values fit int32. Errors as in the rest of the module: TypeError when about a dtype,
// ValueError otherwise; a refused call changes nothing.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "sdpa/kvcache.h"
#include "sdpa/sdpa.h"

namespace {

std::vector<std::int64_t> shape_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

std::string text_of(const py::handle& obj) { return py::str(obj).cast<std::string>(); }

std::optional<sdpa::DType> float_dtype(const py::dtype& dt) {
  if (dt.kind() == 'f' && dt.itemsize() == 4) return sdpa::DType::float32;
  if (dt.kind() == 'f' && dt.itemsize() == 8) return sdpa::DType::float64;
  if (dt.kind() == 'f' && dt.itemsize() == 2) return sdpa::DType::float16;
  return std::nullopt;
}

py::dtype numpy_dtype(sdpa::DType d) {
  if (d == sdpa::DType::float16) return py::dtype("float16");
  return d == sdpa::DType::float64 ? py::dtype::of<double>() : py::dtype::of<float>();
}

struct Floating {
  py::array array;
  sdpa::TensorRef ref;
};

Floating floating(const py::handle& obj, const std::string& what) {
  const py::module_ np = py::module_::import("numpy");
  py::array a = array_argument(obj, what);
  const std::optional<sdpa::DType> d = float_dtype(a.dtype());
  if (!d)
    throw py::type_error(what + ": expected dtype float32, float64 or float16, got " +
                         text_of(a.dtype()));
  py::list requirements;
  for (const char* r : {"C", "A", "E"}) requirements.append(r);
  a = np.attr("require")(a, numpy_dtype(*d), requirements);
  return {a, sdpa::TensorRef{a.data(), *d, shape_of(a)}};
}

struct Cache {
  py::array array;
  sdpa::MutableTensorRef ref;
};

Cache cache(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(what + ": expected a numpy.ndarray (it is updated in place), got " +
                         text_of(py::type::of(obj)));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  const std::optional<sdpa::DType> d = float_dtype(a.dtype());
  if (!d || !a.dtype().is(numpy_dtype(*d))) {
    throw py::type_error(what +
                         ": expected dtype float32, float64 or float16 in native byte order, got " +
                         text_of(a.dtype()));
  }
  const int flags = py::detail::array_proxy(a.ptr())->flags;
  constexpr int kNeeded = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ |
                          py::detail::npy_api::NPY_ARRAY_ALIGNED_ |
                          py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  if ((flags & kNeeded) != kNeeded) {
    throw py::value_error(what +
                          ": expected a C-contiguous, aligned, writeable array (it is updated in "
                          "place), got a view that is not");
  }
  return {a, sdpa::MutableTensorRef{a.mutable_data(), *d, shape_of(a)}};
}

struct Indices {
  py::array_t<std::int32_t> array;
  sdpa::Int32TensorRef ref;
};

Indices indices(const py::handle& obj, const std::string& what) {
  const py::module_ np = py::module_::import("numpy");
  py::array a = array_argument(obj, what);
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw py::type_error(what + ": expected an integer dtype (int32), got " + text_of(a.dtype()));
  }
  if (a.size() > 0) {
    // Compared as Python integers: a uint64 2^64 - 1 cast to int64 would read as -1.
    const py::object lo = np.attr("min")(a).attr("item")();
    const py::object hi = np.attr("max")(a).attr("item")();
    if (lo < py::int_(INT32_MIN) || hi > py::int_(INT32_MAX)) {
      throw py::value_error(what + ": expected values that fit int32, got the range [" +
                            py::str(lo).cast<std::string>() + ", " +
                            py::str(hi).cast<std::string>() + "]");
    }
  }
  py::array_t<std::int32_t> b =
      py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>::ensure(a);
  return {b, sdpa::Int32TensorRef{b.data(), shape_of(b)}};
}

py::object attention_with_kvcache(const py::object& q, const py::object& k_cache,
                                  const py::object& v_cache, const py::object& k,
                                  const py::object& v, const py::object& cache_seqlens,
                                  const py::object& block_table, const py::object& scale,
                                  const py::object& causal_arg, const py::object& return_lse_arg,
                                  const py::object& threads_arg) {
  // The options first: a wrong one is refused before any array is converted.
  const bool causal = bool_option(causal_arg, "causal");
  const bool return_lse = bool_option(return_lse_arg, "return_lse");
  const int threads = threads_option(threads_arg);
  const Floating qa = floating(q, "q");
  const Cache kc = cache(k_cache, "k_cache"), vc = cache(v_cache, "v_cache");
  std::optional<Floating> ka, va;
  std::optional<Indices> sl, bt;
  if (!k.is_none()) ka = floating(k, "k");
  if (!v.is_none()) va = floating(v, "v");
  if (!cache_seqlens.is_none()) sl = indices(cache_seqlens, "cache_seqlens");
  if (!block_table.is_none()) bt = indices(block_table, "block_table");
  sdpa::KVCacheInputs inputs;
  if (ka) inputs.k = &ka->ref;
  if (va) inputs.v = &va->ref;
  if (sl) inputs.cache_seqlens = &sl->ref;
  if (bt) inputs.block_table = &bt->ref;
  sdpa::KVCacheOptions options;
  // None or a real number (Python's or NumPy's), as the scale of the other functions: not a
  // bool, a string, a complex number or an array.
  options.scale = optional_real_option(scale, "scale");
  options.causal = causal;
  options.threads = threads;
  try {
    const std::vector<std::int64_t> shape =
        sdpa::kvcache_output_shape(qa.ref, kc.ref, vc.ref, inputs);
    const sdpa::DType d = qa.ref.dtype;
    py::array out(numpy_dtype(d), std::vector<py::ssize_t>(shape.begin(), shape.end()));
    // lse is float32 for a 16-bit query (include/sdpa/kvcache.h), else the query's dtype.
    const sdpa::DType ld =
        d == sdpa::DType::float16 || d == sdpa::DType::bfloat16 ? sdpa::DType::float32 : d;
    py::array lse(numpy_dtype(ld), std::vector<py::ssize_t>{static_cast<py::ssize_t>(shape[0]),
                                                            static_cast<py::ssize_t>(shape[2]),
                                                            static_cast<py::ssize_t>(shape[1])});
    const sdpa::MutableTensorRef out_ref{out.mutable_data(), d, shape_of(out)};
    const sdpa::MutableTensorRef lse_ref{lse.mutable_data(), ld, shape_of(lse)};
    {
      py::gil_scoped_release release;
      sdpa::attention_with_kvcache(qa.ref, kc.ref, vc.ref, inputs, options, out_ref,
                                   return_lse ? &lse_ref : nullptr);
    }
    if (return_lse) return py::make_tuple(out, lse);
    return out;
  } catch (const sdpa::Error& e) {
    raise_sdpa_error(e);
  }
}

constexpr const char* kDoc =
    R"doc(Attention of new queries over a key/value cache, appending new keys/values in place;
the signature of FlashAttention's flash_attn_with_kvcache (NumPy arrays).

q (batch, L, Hq, E); k_cache / v_cache (batch, S_max, Hkv, E | Ev), or paged
(num_blocks, page_size, Hkv, E | Ev) with block_table (batch, max_blocks) int32;
cache_seqlens (batch,) int32: rows already cached per sequence (default: all S_max).
k / v (batch, L_new, Hkv, .): written into the caches at cache_seqlens[b] (in place) and
attended to; cache_seqlens itself is not advanced. causal: lower-right aligned (query l sees
rows s <= l + S_b - L with S_b = cache_seqlens[b] + L_new). Hq a multiple of Hkv (GQA).
Returns out (batch, L, Hq, Ev), or (out, lse) with lse (batch, Hq, L) when return_lse.
The caches (k / v too) must be C-contiguous, writeable arrays of one dtype: float64 under a
float64 q; float32 or float16 under a float32 or float16 q. out has q's dtype; lse is float32
for a float16 q, else q's dtype. Everything is
checked before anything is written: a refused call leaves the caches unchanged. The GIL is
released during the computation.
)doc";

}  // namespace

void bind_kvcache(py::module_& m) {
  m.def("attention_with_kvcache", &attention_with_kvcache, kDoc, py::arg("q"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("k") = py::none(), py::arg("v") = py::none(),
        py::arg("cache_seqlens") = py::none(), py::arg("block_table") = py::none(), py::kw_only(),
        py::arg("scale") = py::none(), py::arg("causal") = false, py::arg("return_lse") = false,
        py::arg("threads") = 0);
}
