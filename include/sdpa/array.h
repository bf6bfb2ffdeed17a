// sdpa::Array: an owning, C-contiguous, 64-byte aligned tensor, and NumPy .npy files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa {

class Array {
 public:
  Array() = default;
  /// Zero-filled array of this dtype and shape; throws sdpa::Error if the size overflows.
  Array(DType dtype, std::vector<std::int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return numel_ * dtype_size(dtype_); }

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <class T>
  T* data_as() {
    return static_cast<T*>(data());
  }
  template <class T>
  const T* data_as() const {
    return static_cast<const T*>(data());
  }

  TensorRef ref() const { return TensorRef{data(), dtype_, shape_}; }
  MutableTensorRef mut() { return MutableTensorRef{data(), dtype_, shape_}; }
  operator TensorRef() const { return ref(); }  // NOLINT

  /// A copy converted to another floating dtype (or bool -> float as 0/1).
  Array astype(DType dtype) const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  DType dtype_ = DType::float32;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 0;
  std::unique_ptr<void, Free> data_;
};

/// Number of elements of `shape`, or throws sdpa::Error naming `what` if a dimension is negative
/// or the product overflows 2^62 / element_size bytes.
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, std::size_t element_size,
                           const std::string& what);

/// "(2, 3, 4)" for messages.
std::string shape_string(const std::vector<std::int64_t>& shape);

/// Reads a NumPy .npy file (format versions 1, 2 and 3): little-endian float32 ('<f4'),
/// float64 ('<f8'), float16 ('<f2'), bfloat16 as its bits in uint16 ('<u2') or bool ('|b1'), C
/// order; the native-order spellings NumPy reads alike ('=f4', '|f4', 'f4', '<b1') are these
/// too. Anything else (big-endian '>f4' included) throws sdpa::Error with a message
/// that starts with the path and says what was found. The data must be exactly as long as the
/// header promises: a truncated or padded file is refused, and no allocation larger than the
/// file is ever made.
Array read_npy(const std::string& path);

/// Writes `tensor` as a version-1 .npy file (version 2 if the header needs it), atomically: the
/// bytes go to a temporary file beside `path` which is renamed over it only when complete.
void write_npy(const std::string& path, const TensorRef& tensor);

/// Writes several files all-or-nothing: every temporary file is written first; only when all
/// succeeded are they renamed into place. On error no destination is touched.
void write_npy_all(const std::vector<std::pair<std::string, TensorRef>>& files);

}  // namespace sdpa
