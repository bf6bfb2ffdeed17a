#include "core/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/problem.h"
#include "sdpa/array.h"

namespace sdpa::detail {
namespace {

std::string strides_string(const std::vector<std::int64_t>& strides) {
  return shape_string(strides);
}

// Calls row(src_offset, dst_offset) for every row (all dimensions but the last) of `shape`, in C
// order: src_offset through `strides`, dst_offset C-contiguous, both in elements.
template <class F>
void for_each_row(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                  F&& row) {
  const std::size_t rank = shape.size();
  if (rank == 0) {
    row(std::int64_t{0}, std::int64_t{0});
    return;
  }
  for (auto d : shape) {
    if (d == 0) return;
  }
  const std::int64_t n = shape.back();
  std::vector<std::int64_t> index(rank - 1, 0);
  std::int64_t src = 0, dst = 0;
  while (true) {
    row(src, dst);
    dst += n;
    std::size_t i = rank - 1;
    while (i-- > 0) {
      ++index[i];
      src += strides[i];
      if (index[i] < shape[i]) break;
      src -= index[i] * strides[i];
      index[i] = 0;
    }
    if (i == static_cast<std::size_t>(-1)) return;
  }
}

std::atomic<std::int64_t> copies{0};

void* allocate(std::int64_t bytes, const char* what) {
  copies.fetch_add(1, std::memory_order_relaxed);
  check_allocation(bytes, fmt::format("a contiguous copy of {}", what));
  // 64-byte alignment, like sdpa::Array: the kernels load whole cache lines.
  const std::size_t size =
      static_cast<std::size_t>((std::max<std::int64_t>(bytes, 1) + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) throw Error(fmt::format("{}: could not allocate {} bytes", what, bytes));
  return p;
}

}  // namespace

void check_data(const void* data, std::size_t element_size, bool has_elements, const char* what) {
  if (data == nullptr) {
    if (has_elements) throw Error(ErrorKind::bad_value, what, "data pointer is null");
    return;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  if (element_size > 1 && address % element_size != 0) {
    throw Error(ErrorKind::bad_value, what,
                fmt::format("expected a data pointer aligned to its element size ({} bytes), got "
                            "address {:#x} ({} bytes past a multiple)",
                            element_size, address, address % element_size));
  }
}

void check_strides(const TensorRef& t, const char* what, bool output) {
  if (t.strides.empty()) return;
  const std::size_t rank = t.shape.size();
  if (t.strides.size() != rank) {
    throw Error(
        fmt::format("{}: expected {} strides (one per dimension of shape {}) or none, got {}", what,
                    rank, shape_string(t.shape), strides_string(t.strides)));
  }
  for (std::size_t i = 0; i < rank; ++i) {
    if (t.strides[i] < 0) {
      throw Error(fmt::format("{}: expected strides >= 0, got {} for shape {}", what,
                              strides_string(t.strides), shape_string(t.shape)));
    }
  }
  if (rank > 0 && t.shape.back() > 1 && t.strides.back() != 1) {
    throw Error(fmt::format(
        "{}: expected a contiguous last dimension (stride 1), got strides {} for shape {}", what,
        strides_string(t.strides), shape_string(t.shape)));
  }
  // The largest offset, sum (shape[i] - 1) * strides[i], must fit (in bytes too).
  const std::int64_t limit =
      std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(dtype_size(t.dtype));
  std::int64_t last = 0;
  bool empty = false;
  for (std::size_t i = 0; i < rank; ++i) {
    if (t.shape[i] == 0) empty = true;
    if (t.shape[i] <= 1) continue;
    if (t.strides[i] != 0 && (t.shape[i] - 1) > (limit - last) / t.strides[i]) {
      throw Error(fmt::format("{}: strides {} with shape {} address beyond 2^63 bytes", what,
                              strides_string(t.strides), shape_string(t.shape)));
    }
    last += (t.shape[i] - 1) * t.strides[i];
  }
  if (!output || empty) return;
  // No self-overlap: sorted by stride, each dimension of size > 1 must step past everything the
  // smaller-stride dimensions span.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < rank; ++i) {
    if (t.shape[i] > 1) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return t.strides[a] < t.strides[b]; });
  std::int64_t span = 1;  // elements covered by the dimensions so far
  for (std::size_t i : order) {
    if (t.strides[i] < span) {
      throw Error(fmt::format(
          "{}: expected strides whose elements do not overlap (it is written), got strides {} "
          "for shape {}",
          what, strides_string(t.strides), shape_string(t.shape)));
    }
    span = t.strides[i] * (t.shape[i] - 1) + span;
  }
}

bool is_contiguous(const TensorRef& t) {
  if (t.strides.empty()) return true;
  std::int64_t expected = 1;
  for (std::size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::int64_t layout_copies() { return copies.load(std::memory_order_relaxed); }

bool leading_dims_flatten(const TensorRef& t, std::size_t lead) {
  bool flat = true;
  make_view<false>(t, lead, 1, &flat);
  return flat;
}

void ContiguousInput::Free::operator()(void* p) const { std::free(p); }
void ContiguousOutput::Free::operator()(void* p) const { std::free(p); }

ContiguousInput::ContiguousInput(const TensorRef& t, const char* what, Copy when, std::size_t lead)
    : ref_(t) {
  if (when == Copy::unless_flat && leading_dims_flatten(t, lead)) return;
  if (is_contiguous(t)) {
    ref_.strides.clear();
    return;
  }
  if (when == Copy::mask) {
    for (std::size_t i = 0; i < ref_.shape.size(); ++i) {
      if (ref_.strides[i] == 0) ref_.shape[i] = 1;
    }
    if (is_contiguous(ref_)) {
      ref_.strides.clear();
      return;
    }
  }
  const std::size_t size = dtype_size(t.dtype);
  const std::int64_t numel = checked_numel(ref_.shape, size, what);
  buffer_.reset(allocate(numel * static_cast<std::int64_t>(size), what));
  const auto* src = static_cast<const unsigned char*>(t.data);
  auto* dst = static_cast<unsigned char*>(buffer_.get());
  const std::size_t row_bytes =
      ref_.shape.empty() ? size : static_cast<std::size_t>(ref_.shape.back()) * size;
  for_each_row(ref_.shape, ref_.strides, [&](std::int64_t s, std::int64_t d) {
    std::memcpy(dst + d * static_cast<std::int64_t>(size),
                src + s * static_cast<std::int64_t>(size), row_bytes);
  });
  ref_.data = buffer_.get();
  ref_.strides.clear();
}

ContiguousOutput::ContiguousOutput(const MutableTensorRef& t, const char* what, Copy when,
                                   std::size_t lead)
    : target_(t), ref_(t) {
  if (is_contiguous(t) || (when == Copy::unless_flat && leading_dims_flatten(t, lead))) {
    data_ = t.data;
    return;
  }
  const std::size_t size = dtype_size(t.dtype);
  const std::int64_t numel = checked_numel(t.shape, size, what);
  buffer_.reset(allocate(numel * static_cast<std::int64_t>(size), what));
  data_ = buffer_.get();
  ref_.data = data_;
  ref_.strides.clear();
}

void ContiguousOutput::finish() const {
  if (!buffer_) return;
  const std::size_t size = dtype_size(target_.dtype);
  const auto* src = static_cast<const unsigned char*>(buffer_.get());
  auto* dst = static_cast<unsigned char*>(target_.data);
  const std::size_t row_bytes =
      target_.shape.empty() ? size : static_cast<std::size_t>(target_.shape.back()) * size;
  for_each_row(target_.shape, target_.strides, [&](std::int64_t s, std::int64_t d) {
    std::memcpy(dst + s * static_cast<std::int64_t>(size),
                src + d * static_cast<std::int64_t>(size), row_bytes);
  });
}

}  // namespace sdpa::detail
