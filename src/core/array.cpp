#include "sdpa/array.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "core/problem.h"

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
  for (std::int64_t d : shape) {
    if (d < 0) {
      throw Error(
          ErrorKind::bad_shape, what,
          fmt::format("expected non-negative dimensions, got shape {}", shape_string(shape)));
    }
  }
  // Like NumPy ("array is too big"), the product of the non-zero dimensions must fit even when
  // a zero makes the array empty: otherwise (0, 2^62, 2^62) passes, and products of its other
  // dimensions (batch sizes, row counts, derived output shapes) overflow int64.
  std::int64_t n = 1;
  bool zero = false;
  for (std::int64_t d : shape) {
    if (d == 0) {
      zero = true;
      continue;
    }
    if (n > limit / d) {
      throw Error(
          ErrorKind::bad_shape, what,
          fmt::format("shape {} has more than 2^62 bytes of elements", shape_string(shape)));
    }
    n *= d;
  }
  return zero ? 0 : n;
}

namespace detail {

namespace {
// The first number in `path` (a /proc or /sys file), or -1 if it cannot be read.
std::int64_t read_number(const char* path, const char* key = nullptr) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  char line[256];
  std::int64_t value = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    const char* p = line;
    if (key != nullptr) {
      const std::size_t n = std::strlen(key);
      if (std::strncmp(line, key, n) != 0) continue;
      p += n;
    }
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end != p) value = v;
    break;
  }
  std::fclose(f);
  return value;
}
}  // namespace

std::int64_t available_memory_bytes() {
  std::int64_t available = std::numeric_limits<std::int64_t>::max();
  const std::int64_t mem = read_number("/proc/meminfo", "MemAvailable:");
  const std::int64_t swap = read_number("/proc/meminfo", "SwapFree:");
  if (mem >= 0) available = (mem + std::max<std::int64_t>(swap, 0)) * 1024;  // kB
  // A container's own limit, cgroup v2 then v1 ("max" or a huge number when unlimited).
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
       "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_path, usage_path] : cgroups) {
    const std::int64_t limit = read_number(limit_path), usage = read_number(usage_path);
    if (limit > 0 && usage >= 0 && limit > usage) available = std::min(available, limit - usage);
  }
  return available;
}

void check_allocation(std::int64_t bytes, const std::string& what) {
  // Asking the kernel costs ~20 us; below 64 MiB an allocation cannot be the absurd kind.
  constexpr std::int64_t kAlwaysFine = std::int64_t{64} << 20;
  if (bytes < kAlwaysFine) return;
  const std::int64_t available = available_memory_bytes();
  if (bytes > available) {
    throw Error(ErrorKind::resources, what,
                fmt::format("needs {} bytes ({:.1f} GiB), more than the {} bytes ({:.1f} GiB) "
                            "of memory available",
                            bytes, bytes / 1073741824.0, available, available / 1073741824.0));
  }
}

}  // namespace detail

void Array::Free::operator()(void* p) const { std::free(p); }

Array::Array(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel(shape_, dtype_size(dtype_), "array");
  // Refuse what cannot fit rather than let the zero fill below summon the OOM killer.
  detail::check_allocation(
      static_cast<std::int64_t>(nbytes()),
      fmt::format("array of shape {} ({})", shape_string(shape_), dtype_name(dtype_)));
  // 64-byte aligned, size rounded up to the alignment as aligned_alloc requires.
  const std::size_t bytes = ((nbytes() + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) {
    throw Error(
        ErrorKind::resources, "array",
        fmt::format("could not allocate {} bytes for shape {}", bytes, shape_string(shape_)));
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
      case DType::float16:
        return detail::float16_to_float(data_as<std::uint16_t>()[i]);
      case DType::bfloat16:
        return detail::bfloat16_to_float(data_as<std::uint16_t>()[i]);
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
      case DType::float16:  // one rounding from the exact value (no double rounding)
        out.data_as<std::uint16_t>()[i] = detail::float64_to_float16(get(i));
        break;
      case DType::bfloat16:
        out.data_as<std::uint16_t>()[i] = detail::float64_to_bfloat16(get(i));
        break;
    }
  }
  return out;
}

}  // namespace sdpa
