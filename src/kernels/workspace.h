// Reusable, 64-byte aligned scratch memory for the kernels.
//
// Why: on this VM the first touch of a fresh 4 KiB page costs 13-16 us (FACTS.md), so a kernel
// that allocates its tiles per call spends more time in page faults than in arithmetic for
// anything but huge problems. Each thread keeps its buffers between calls (thread_local; the
// OpenMP runtime keeps its worker threads alive), grows them when a bigger problem comes and
// never shrinks them. Buffers of 2 MiB and more are advised to use transparent huge pages,
// which cuts the cost of their first touch ~30x.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sdpa::detail {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();

  /// At least `bytes` bytes, 64-byte aligned; the contents are unspecified. Valid until the next
  /// call of reserve() on this workspace.
  void* reserve(std::size_t bytes);
  std::size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// This thread's scratch for work inside a parallel region (tiles, accumulators).
Workspace& thread_scratch();
/// This thread's buffer for data that one call shares among its threads (packed K/V); used
/// only by the thread that makes the call, outside the parallel region.
Workspace& call_shared();

/// Hands out consecutive 64-byte aligned pieces of one buffer. Used twice: once with a null base
/// to measure the total, then on the reserved memory.
class Carver {
 public:
  // The base is kept as an integer: offsetting a null pointer (the measuring pass) is undefined
  // behaviour, integer arithmetic is not, and the measuring pass never dereferences.
  explicit Carver(void* base = nullptr) : base_(reinterpret_cast<std::uintptr_t>(base)) {}
  template <class T>
  T* take(std::size_t count) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += (count * sizeof(T) + 63) / 64 * 64;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  std::uintptr_t base_;
  std::size_t used_ = 0;
};

}  // namespace sdpa::detail
