// Helpers shared by the test suites: seeded random tensors and error measures.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../src/core/half.h"  // header-only; tests linking only the public library use it too
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::test {

/// Standard-normal entries (times `stddev`), reproducible from `seed`.
inline Array random_array(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed,
                          double stddev = 1.0) {
  Array a(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (dtype == DType::float32) {
      a.data_as<float>()[i] = static_cast<float>(normal(rng));
    } else if (dtype == DType::float16) {
      a.data_as<std::uint16_t>()[i] = detail::float64_to_float16(normal(rng));
    } else if (dtype == DType::bfloat16) {
      a.data_as<std::uint16_t>()[i] = detail::float64_to_bfloat16(normal(rng));
    } else if (dtype == DType::float64) {
      a.data_as<double>()[i] = normal(rng);
    } else {
      a.data_as<std::uint8_t>()[i] = (rng() % 4) != 0;  // 75% true
    }
  }
  return a;
}

inline double get(const Array& a, std::int64_t i) {
  switch (a.dtype()) {
    case DType::float32:
      return a.data_as<float>()[i];
    case DType::float64:
      return a.data_as<double>()[i];
    case DType::boolean:
      return a.data_as<std::uint8_t>()[i];
    case DType::float16:
      return detail::float16_to_float(a.data_as<std::uint16_t>()[i]);
    case DType::bfloat16:
      return detail::bfloat16_to_float(a.data_as<std::uint16_t>()[i]);
  }
  return 0;
}

inline void set(Array& a, std::int64_t i, double v) {
  if (a.dtype() == DType::float32) {
    a.data_as<float>()[i] = static_cast<float>(v);
  } else if (a.dtype() == DType::float64) {
    a.data_as<double>()[i] = v;
  } else if (a.dtype() == DType::float16) {
    a.data_as<std::uint16_t>()[i] = detail::float64_to_float16(v);
  } else if (a.dtype() == DType::bfloat16) {
    a.data_as<std::uint16_t>()[i] = detail::float64_to_bfloat16(v);
  } else {
    a.data_as<std::uint8_t>()[i] = v != 0.0;
  }
}

/// The largest |a - b|; NaN in either counts as infinite unless both are NaN at the same place.
/// `worst` receives the index of the worst element.
inline double max_abs_diff(const Array& a, const Array& b, std::int64_t* worst = nullptr) {
  double m = 0;
  if (worst != nullptr) *worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = get(a, i), y = get(b, i);
    double d;
    if (std::isnan(x) || std::isnan(y)) {
      d = (std::isnan(x) && std::isnan(y)) ? 0.0 : INFINITY;
    } else if (x == y) {
      d = 0.0;  // covers equal infinities
    } else {
      d = std::fabs(x - y);
    }
    if (d > m) {
      m = d;
      if (worst != nullptr) *worst = i;
    }
  }
  return m;
}

inline double max_abs(const Array& a) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = std::fabs(get(a, i));
    if (std::isfinite(x) && x > m) m = x;
  }
  return m;
}

inline bool all_finite(const Array& a) {
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(get(a, i))) return false;
  }
  return true;
}

/// Shape and options of one attention case, for test matrices.
struct Case {
  std::vector<std::int64_t> lead;  // leading batch dims
  std::int64_t Hq = 1, Hkv = 1, L = 1, S = 1, E = 1, Ev = 1;
  AttentionOptions options;
  int mask_kind = 0;                     // 0 none, 1 bool, 2 additive float
  std::vector<std::int64_t> mask_shape;  // empty: full (..., Hq, L, S)

  std::vector<std::int64_t> shape(std::int64_t h, std::int64_t n, std::int64_t e) const {
    std::vector<std::int64_t> s = lead;
    s.insert(s.end(), {h, n, e});
    return s;
  }
  std::string name() const {
    std::string s;
    for (auto d : lead) s += std::to_string(d) + "x";
    s += "Hq" + std::to_string(Hq) + "_Hkv" + std::to_string(Hkv) + "_L" + std::to_string(L) +
         "_S" + std::to_string(S) + "_E" + std::to_string(E) + "_Ev" + std::to_string(Ev) + "_" +
         causal_name(options.causal) + "_mask" + std::to_string(mask_kind);
    return s;
  }
};

/// One head, L queries and S keys of widths E and Ev, with the given causal rule and mask kind.
inline Case make_case(std::int64_t L, std::int64_t S, std::int64_t E, std::int64_t Ev,
                      Causal causal, int mask_kind) {
  Case c;
  c.L = L;
  c.S = S;
  c.E = E;
  c.Ev = Ev;
  c.options.causal = causal;
  c.mask_kind = mask_kind;
  return c;
}

/// Random inputs for a case: q, k, v, and a mask (bool or additive with some -inf) when asked.
struct Inputs {
  Array q, k, v, mask, dout;
  bool has_mask = false;
  const TensorRef* mask_ref() const {
    ref_ = mask.ref();
    return has_mask ? &ref_ : nullptr;
  }

 private:
  mutable TensorRef ref_;
};

inline Inputs make_inputs(const Case& c, DType dtype, std::uint64_t seed) {
  Inputs in;
  in.q = random_array(dtype, c.shape(c.Hq, c.L, c.E), seed * 7 + 1);
  in.k = random_array(dtype, c.shape(c.Hkv, c.S, c.E), seed * 7 + 2);
  in.v = random_array(dtype, c.shape(c.Hkv, c.S, c.Ev), seed * 7 + 3);
  in.dout = random_array(dtype, c.shape(c.Hq, c.L, c.Ev), seed * 7 + 4);
  if (c.mask_kind != 0) {
    std::vector<std::int64_t> ms = c.mask_shape.empty() ? c.shape(c.Hq, c.L, c.S) : c.mask_shape;
    in.has_mask = true;
    if (c.mask_kind == 1) {
      in.mask = random_array(DType::boolean, ms, seed * 7 + 5);
    } else {
      in.mask = random_array(dtype, ms, seed * 7 + 5);
      std::mt19937_64 rng(seed * 7 + 6);
      for (std::int64_t i = 0; i < in.mask.numel(); ++i) {
        if (rng() % 5 == 0) set(in.mask, i, -INFINITY);
      }
    }
  }
  return in;
}

/// What one implementation gives for one problem: the forward's out and lse, and (when the
/// backward ran) the gradients; arrays that were not computed stay empty.
struct Outputs {
  Array out, lse, dq, dk, dv;
};

/// The forward with `impl`, writing out and lse.
inline Outputs run_forward(const Array& q, const Array& k, const Array& v, const TensorRef* mask,
                           AttentionOptions o, Impl impl) {
  o.impl = impl;
  Outputs r;
  r.out = Array(q.dtype(), attention_output_shape(q, k, v, o));
  const bool half = q.dtype() == DType::float16 || q.dtype() == DType::bfloat16;
  r.lse = Array(half ? DType::float32 : q.dtype(), attention_lse_shape(q));  // float32 for 16-bit
  const MutableTensorRef lse = r.lse.mut();
  attention_forward(q, k, v, mask, o, r.out.mut(), &lse);
  return r;
}

/// The forward, then (with_backward) the backward from that forward's out and lse and the
/// inputs' dout, all with `impl`.
inline Outputs run(const Inputs& in, AttentionOptions o, Impl impl, bool with_backward = true) {
  Outputs r = run_forward(in.q, in.k, in.v, in.mask_ref(), o, impl);
  if (with_backward) {
    o.impl = impl;
    r.dq = Array(in.q.dtype(), in.q.shape());
    r.dk = Array(in.k.dtype(), in.k.shape());
    r.dv = Array(in.v.dtype(), in.v.shape());
    attention_backward(in.q, in.k, in.v, in.mask_ref(), r.out, r.lse, in.dout, o, r.dq.mut(),
                       r.dk.mut(), r.dv.mut());
  }
  return r;
}

}  // namespace sdpa::test
