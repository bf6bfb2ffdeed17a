// Low-level entry points for sdpa.torch (python/sdpa/torch.py): tensors described by their data
// pointer, dtype, shape and strides (in elements), so that a torch tensor goes in without NumPy
// and without a copy. The Python side keeps every tensor alive for the call, allocates the
// outputs, and checks device and dtype first; everything else (shapes, strides, options) is
// validated here by the C++ API, whose sdpa::Error becomes ValueError or TypeError as in the
// NumPy functions. The GIL is released while the library computes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "sdpa/sdpa.h"

namespace {

// (data pointer, dtype name, shape, strides): what sdpa/torch.py's _describe() passes.
using Described =
    std::tuple<std::uintptr_t, std::string, std::vector<std::int64_t>, std::vector<std::int64_t>>;

sdpa::DType dtype_of(const std::string& name, const std::string& what) {
  if (name == "float32") return sdpa::DType::float32;
  if (name == "float64") return sdpa::DType::float64;
  if (name == "float16") return sdpa::DType::float16;
  if (name == "bfloat16") return sdpa::DType::bfloat16;  // torch.bfloat16's bits, as sdpa's
  if (name == "bool") return sdpa::DType::boolean;
  throw py::type_error(what + ": expected dtype float32, float64 or bool, got " + name);
}

sdpa::TensorRef ref(const Described& d, const std::string& what) {
  sdpa::TensorRef r;
  r.data = reinterpret_cast<const void*>(std::get<0>(d));
  r.dtype = dtype_of(std::get<1>(d), what);
  r.shape = std::get<2>(d);
  r.strides = std::get<3>(d);
  return r;
}

sdpa::MutableTensorRef mutable_ref(const Described& d, const std::string& what) {
  sdpa::MutableTensorRef r;
  r.data = reinterpret_cast<void*>(std::get<0>(d));
  r.dtype = dtype_of(std::get<1>(d), what);
  r.shape = std::get<2>(d);
  r.strides = std::get<3>(d);
  return r;
}

sdpa::AttentionOptions options_of(const std::string& causal, std::optional<double> scale,
                                  bool enable_gqa, const std::string& impl, int threads) {
  sdpa::AttentionOptions o;
  o.causal = sdpa::parse_causal(causal);
  o.scale = scale;
  o.enable_gqa = enable_gqa;
  o.impl = sdpa::parse_impl(impl);
  o.threads = threads;
  sdpa::resolve_threads(threads);
  return o;
}

void forward(const Described& query, const Described& key, const Described& value,
             const std::optional<Described>& mask, const Described& out, const Described& lse,
             const std::string& causal, std::optional<double> scale, bool enable_gqa,
             const std::string& impl, int threads, const py::kwargs& variants) {
  try {
    sdpa::AttentionOptions o = options_of(causal, scale, enable_gqa, impl, threads);
    apply_variant_keywords(o, variants, attention_dims(std::get<2>(query)));
    const sdpa::TensorRef q = ref(query, "query"), k = ref(key, "key"), v = ref(value, "value");
    std::optional<sdpa::TensorRef> m;
    if (mask) m = ref(*mask, "attn_mask");
    const sdpa::MutableTensorRef o_ref = mutable_ref(out, "out"), l_ref = mutable_ref(lse, "lse");
    py::gil_scoped_release release;
    sdpa::attention_forward(q, k, v, m ? &*m : nullptr, o, o_ref, &l_ref);
  } catch (const sdpa::Error& e) {
    raise_sdpa_error(e);
  }
}

void backward(const Described& query, const Described& key, const Described& value,
              const std::optional<Described>& mask, const Described& out, const Described& lse,
              const Described& grad_out, const Described& dq, const Described& dk,
              const Described& dv, const std::string& causal, std::optional<double> scale,
              bool enable_gqa, const std::string& impl, int threads,
              const std::optional<Described>& dsinks, const py::kwargs& variants) {
  try {
    sdpa::AttentionOptions o = options_of(causal, scale, enable_gqa, impl, threads);
    apply_variant_keywords(o, variants, attention_dims(std::get<2>(query)));
    const sdpa::TensorRef q = ref(query, "query"), k = ref(key, "key"), v = ref(value, "value");
    std::optional<sdpa::TensorRef> m;
    if (mask) m = ref(*mask, "attn_mask");
    const sdpa::TensorRef o_in = ref(out, "out"), l_in = ref(lse, "lse"),
                          g_in = ref(grad_out, "grad_out");
    const sdpa::MutableTensorRef dq_ref = mutable_ref(dq, "grad_query"),
                                 dk_ref = mutable_ref(dk, "grad_key"),
                                 dv_ref = mutable_ref(dv, "grad_value");
    std::optional<sdpa::MutableTensorRef> ds_ref;
    if (dsinks) ds_ref = mutable_ref(*dsinks, "grad_sinks");
    py::gil_scoped_release release;
    sdpa::attention_backward(q, k, v, m ? &*m : nullptr, o_in, l_in, g_in, o, dq_ref, dk_ref,
                             dv_ref, ds_ref ? &*ds_ref : nullptr);
  } catch (const sdpa::Error& e) {
    raise_sdpa_error(e);
  }
}

}  // namespace

void bind_torch(py::module_& m) {
  m.def("_forward_described", &forward,
        "For sdpa.torch: attention_forward on described tensors (ptr, dtype, shape, strides), "
        "writing out and lse.",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("out"),
        py::arg("lse"), py::arg("causal"), py::arg("scale"), py::arg("enable_gqa"), py::arg("impl"),
        py::arg("threads"));
  m.def(
      "_backward_described", &backward,
      "For sdpa.torch: attention_backward on described tensors, writing dq, dk and dv (and dsinks "
      "when given).",
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("out"),
      py::arg("lse"), py::arg("grad_out"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
      py::arg("causal"), py::arg("scale"), py::arg("enable_gqa"), py::arg("impl"),
      py::arg("threads"), py::arg("dsinks") = py::none());
}
