// Strided tensors (TensorRef::strides): validation, and the contiguous copies that the kernels
// read when a call's tensors are not C-contiguous. The public calls (core/attention.cpp) check
// every tensor's strides, then hand the implementations C-contiguous data: a strided input is
// gathered into a buffer owned by the call, a strided output is computed into one and scattered
// into place afterwards. Contiguous tensors (empty strides, or strides equal to C order) are used
// where they lie.
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

/// True when `t` can be read as C-contiguous: empty strides, or strides equal to C order except
/// along dimensions of size 1 (whose stride never matters).
bool is_contiguous(const TensorRef& t);

/// A C-contiguous view of a tensor: the tensor itself when it already is one, else a copy.
class ContiguousInput {
 public:
  /// `broadcast_ok`: dimensions of stride 0 (a broadcast view) become size 1 instead of being
  /// copied; for a mask, which the API broadcasts itself.
  ContiguousInput(const TensorRef& t, const char* what, bool broadcast_ok = false);
  const TensorRef& ref() const { return ref_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  TensorRef ref_;
  std::unique_ptr<void, Free> buffer_;
};

/// Where a kernel writes an output: the output itself when C-contiguous, else a buffer that
/// finish() scatters into the caller's strided tensor.
class ContiguousOutput {
 public:
  ContiguousOutput(const MutableTensorRef& t, const char* what);
  void* data() const { return data_; }
  /// Copies the buffer into the caller's tensor (nothing to do when it was written in place).
  void finish() const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  MutableTensorRef target_;
  void* data_ = nullptr;
  std::unique_ptr<void, Free> buffer_;
};

}  // namespace sdpa::detail
