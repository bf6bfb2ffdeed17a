// Strided tensors (TensorRef::strides): validation, and the copies made for the few cases the
// kernels do not read in place. The public calls (core/attention.cpp) check every tensor's
// strides. The fused, decode and naive kernels read and write every operand through its
// strides (core/problem.h, OperandView), so a tensor is copied for them only when its leading
// batch dimensions do not flatten into one stride (Copy::unless_flat: a transposed pair of batch
// dimensions, say). The float64 reference reads C order, so its calls copy every tensor that is
// not (Copy::unless_c_order). A copied input is gathered into a buffer
// owned by the call; a copied output is computed into one and scattered into place afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::detail {

/// Throws sdpa::Error naming `what` unless t.strides is empty or holds one stride >= 0 per
/// dimension with the last dimension contiguous, and every element's offset fits in int64.
/// `output`: the tensor is written, so no two elements may share memory (checked: the
/// dimensions, sorted by stride, must each step past the whole extent of the smaller ones).
void check_strides(const TensorRef& t, const char* what, bool output);

/// Throws sdpa::Error (bad_value) naming `what` when `data` is null while the tensor has elements,
/// or not a multiple of `element_size` bytes: the kernels read and write whole elements of the
/// tensor's type there, which a misaligned address makes undefined behaviour in C++.
void check_data(const void* data, std::size_t element_size, bool has_elements, const char* what);

/// True when `t` can be read as C-contiguous: empty strides, or strides equal to C order except
/// along dimensions of size 1 (whose stride never matters).
bool is_contiguous(const TensorRef& t);

/// True when the first `lead` dimensions of `t` flatten into one stride (see make_view in
/// core/problem.h); always true for empty strides.
bool leading_dims_flatten(const TensorRef& t, std::size_t lead);

/// When a tensor is copied:
///   unless_c_order: unless it is C-contiguous (is_contiguous);
///   unless_flat: unless its first `lead` dimensions flatten (leading_dims_flatten): the
///     kernels read any other strides in place;
///   mask: unless it is C-contiguous once its stride-0 dimensions become size 1 (a broadcast
///     view), which the API broadcasts itself.
enum class Copy : std::uint8_t { unless_c_order, unless_flat, mask };

/// Number of copies ContiguousInput and ContiguousOutput have made in this process (input
/// gathers and output buffers), for tests that assert a call copies nothing.
std::int64_t layout_copies();

/// The tensor itself when `when` allows, else a C-contiguous copy.
class ContiguousInput {
 public:
  ContiguousInput(const TensorRef& t, const char* what, Copy when = Copy::unless_c_order,
                  std::size_t lead = 0);
  const TensorRef& ref() const { return ref_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  TensorRef ref_;
  std::unique_ptr<void, Free> buffer_;
};

/// Where a kernel writes an output: the output itself when `when` allows (unless_c_order or
/// unless_flat, as for ContiguousInput), else a C-contiguous buffer that finish() scatters into
/// the caller's tensor.
class ContiguousOutput {
 public:
  ContiguousOutput(const MutableTensorRef& t, const char* what, Copy when = Copy::unless_c_order,
                   std::size_t lead = 0);
  void* data() const { return data_; }
  /// What the kernel writes: the caller's tensor, or the buffer (C-contiguous).
  const MutableTensorRef& ref() const { return ref_; }
  /// Copies the buffer into the caller's tensor (nothing to do when it was written in place).
  void finish() const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  MutableTensorRef target_;
  MutableTensorRef ref_;
  void* data_ = nullptr;
  std::unique_ptr<void, Free> buffer_;
};

}  // namespace sdpa::detail
