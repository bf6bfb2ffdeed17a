#include "core/half_attention.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "core/half.h"
#include "sdpa/array.h"

namespace sdpa::detail {
namespace {

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

/// Calls f(i, offset) for every element in C order: i its index in a C-contiguous copy, offset
/// its position (in elements) under `strides` (empty: C order, offset == i).
template <class F>
void for_each_element(const std::vector<std::int64_t>& shape,
                      const std::vector<std::int64_t>& strides, F&& f) {
  const std::int64_t n = product(shape);
  if (n <= 0) return;
  if (strides.size() != shape.size()) {
    for (std::int64_t i = 0; i < n; ++i) f(i, i);
    return;
  }
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> idx(rank, 0);
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (std::size_t d = rank; d-- > 0;) {  // odometer: the last dimension moves fastest
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

double load(const void* data, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::float32:
      return static_cast<const float*>(data)[i];
    case DType::float64:
      return static_cast<const double*>(data)[i];
    case DType::boolean:
      return static_cast<const std::uint8_t*>(data)[i];
    case DType::float16:
      return float16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bfloat16:
      return bfloat16_to_float(static_cast<const std::uint16_t*>(data)[i]);
  }
  return 0.0;
}

void put(void* data, DType dtype, std::int64_t i, double x) {
  switch (dtype) {
    case DType::float32:
      static_cast<float*>(data)[i] = static_cast<float>(x);
      break;
    case DType::float64:
      static_cast<double*>(data)[i] = x;
      break;
    case DType::boolean:
      static_cast<std::uint8_t*>(data)[i] = x != 0.0;
      break;
    case DType::float16:
      static_cast<std::uint16_t*>(data)[i] = float64_to_float16(x);
      break;
    case DType::bfloat16:
      static_cast<std::uint16_t*>(data)[i] = float64_to_bfloat16(x);
      break;
  }
}

/// `t` as an implementation working in `dtype` reads it: itself when it already has that dtype,
/// else a converted copy (exact: every 16-bit value is a float32 and a float64).
class Staged {
 public:
  Staged(const TensorRef& t, DType dtype) : ref_(t) {
    if (t.dtype != dtype) {
      copy_.emplace(converted_copy(t, dtype));
      ref_ = copy_->ref();
    }
  }
  const TensorRef& ref() const { return ref_; }

 private:
  std::optional<Array> copy_;
  TensorRef ref_;
};

}  // namespace

Array converted_copy(const TensorRef& t, DType dtype) {
  Array out(dtype, t.shape);
  void* dst = out.data();
  for_each_element(t.shape, t.strides, [&](std::int64_t i, std::int64_t off) {
    put(dst, dtype, i, load(t.data, t.dtype, off));
  });
  return out;
}

void store_converted(const Array& a, const MutableTensorRef& t) {
  const void* src = a.data();
  for_each_element(t.shape, t.strides, [&](std::int64_t i, std::int64_t off) {
    put(t.data, t.dtype, off, load(src, a.dtype(), i));
  });
}

bool needs_half_path(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                     const TensorRef* mask, bool native) {
  if (mask != nullptr && is_16bit(mask->dtype)) return true;
  return any_16bit(query, key, value) && !native;
}

void half_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                  const TensorRef* mask, const AttentionOptions& options,
                  const MutableTensorRef& out, const MutableTensorRef* lse, bool native) {
  std::optional<Staged> m;
  if (mask != nullptr) m.emplace(*mask, is_16bit(mask->dtype) ? DType::float32 : mask->dtype);
  const TensorRef* mref = m ? &m->ref() : nullptr;
  if (!any_16bit(query, key, value) || native) {  // only the mask needed converting
    attention_forward(query, key, value, mref, options, out, lse);
    return;
  }
  // The naive baseline's working precision is the query's. A float32 query over a 16-bit key
  // and value is the float32 baseline on their exact float32 values (below), whose range guard
  // then applies as to any float32 call (docs/guarantees.md).
  if (options.impl == Impl::naive && query.dtype != DType::float32) {
    naive_half_forward(query, key, value, mref, options, out, lse);
    return;
  }
  const DType work = options.impl == Impl::reference ? DType::float64 : DType::float32;
  const Staged q(query, work), k(key, work), v(value, work);
  Array o(work, out.shape);
  std::optional<Array> l;
  std::optional<MutableTensorRef> lref;
  if (lse != nullptr) {
    l.emplace(work, lse->shape);
    lref = l->mut();
  }
  attention_forward(q.ref(), k.ref(), v.ref(), mref, options, o.mut(), lref ? &*lref : nullptr);
  store_converted(o, out);
  if (lse != nullptr) store_converted(*l, *lse);
}

void half_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                   const TensorRef* mask, const TensorRef& out, const TensorRef& lse,
                   const TensorRef& grad_out, const AttentionOptions& options,
                   const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                   const MutableTensorRef& grad_value) {
  std::optional<Staged> m;
  if (mask != nullptr) m.emplace(*mask, is_16bit(mask->dtype) ? DType::float32 : mask->dtype);
  const TensorRef* mref = m ? &m->ref() : nullptr;
  if (!any_16bit(query, key, value)) {
    attention_backward(query, key, value, mref, out, lse, grad_out, options, grad_query, grad_key,
                       grad_value);
    return;
  }
  if (options.impl == Impl::naive && query.dtype != DType::float32) {  // as in half_forward
    naive_half_backward(query, key, value, mref, grad_out, options, grad_query, grad_key,
                        grad_value);
    return;
  }
  const DType work = options.impl == Impl::reference ? DType::float64 : DType::float32;
  const Staged q(query, work), k(key, work), v(value, work), o(out, work), l(lse, work),
      g(grad_out, work);
  Array dq(work, grad_query.shape), dk(work, grad_key.shape), dv(work, grad_value.shape);
  attention_backward(q.ref(), k.ref(), v.ref(), mref, o.ref(), l.ref(), g.ref(), options, dq.mut(),
                     dk.mut(), dv.mut());
  store_converted(dq, grad_query);
  store_converted(dk, grad_key);
  store_converted(dv, grad_value);
}

}  // namespace sdpa::detail
