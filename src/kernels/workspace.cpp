#include "kernels/workspace.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace sdpa::detail {

Workspace::~Workspace() { std::free(data_); }

void* Workspace::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return data_;
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
  // Grow by at least 1/4 so that a series of slightly larger problems does not reallocate
  // (and fault in fresh pages) every time.
  std::size_t want = bytes + bytes / 4;
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t align = want >= kHuge ? kHuge : 64;
  want = (want + align - 1) / align * align;
  data_ = std::aligned_alloc(align, want);
  if (data_ == nullptr) throw std::bad_alloc();
  if (align == kHuge) madvise(data_, want, MADV_HUGEPAGE);  // advice only; failure is harmless
  capacity_ = want;
  return data_;
}

Workspace& thread_scratch() {
  thread_local Workspace w;
  return w;
}

Workspace& call_shared() {
  thread_local Workspace w;
  return w;
}

}  // namespace sdpa::detail
