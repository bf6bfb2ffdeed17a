#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "sdpa/array.h"

namespace sdpa {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::int64_t checked_numel(const std::vector<std::int64_t>& shape, std::size_t element_size,
                           const std::string& what) {
  const std::int64_t limit = (std::int64_t{1} << 62) / static_cast<std::int64_t>(element_size);
  std::int64_t n = 1;
  bool zero = false;
  for (std::int64_t d : shape) {
    if (d < 0) {
      throw Error(fmt::format("{}: expected non-negative dimensions, got shape {}", what,
                              shape_string(shape)));
    }
    if (d == 0) zero = true;
  }
  if (zero) return 0;
  for (std::int64_t d : shape) {
    if (n > limit / d) {
      throw Error(fmt::format("{}: shape {} has more than 2^62 bytes of elements", what,
                              shape_string(shape)));
    }
    n *= d;
  }
  return n;
}

void Array::Free::operator()(void* p) const { std::free(p); }

Array::Array(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel(shape_, dtype_size(dtype_), "array");
  // 64-byte aligned, size rounded up to the alignment as aligned_alloc requires.
  const std::size_t bytes = ((nbytes() + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) {
    throw Error(fmt::format("array: could not allocate {} bytes for shape {}", bytes,
                            shape_string(shape_)));
  }
  std::memset(p, 0, bytes == 0 ? 64 : bytes);
  data_.reset(p);
}

Array Array::astype(DType dtype) const {
  Array out(dtype, shape_);
  auto get = [&](std::int64_t i) -> double {
    switch (dtype_) {
      case DType::float32:
        return data_as<float>()[i];
      case DType::float64:
        return data_as<double>()[i];
      case DType::boolean:
        return data_as<std::uint8_t>()[i] ? 1.0 : 0.0;
    }
    return 0.0;
  };
  for (std::int64_t i = 0; i < numel_; ++i) {
    switch (dtype) {
      case DType::float32:
        out.data_as<float>()[i] = static_cast<float>(get(i));
        break;
      case DType::float64:
        out.data_as<double>()[i] = get(i);
        break;
      case DType::boolean:
        out.data_as<std::uint8_t>()[i] = get(i) != 0.0;
        break;
    }
  }
  return out;
}

}  // namespace sdpa
