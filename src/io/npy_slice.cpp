// Reading part of a .npy file: the rows of one axis a rank of a context-parallel run holds.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "io/npy_header.h"

namespace sdpa {
namespace {

struct Close {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, Close>;

FilePtr open_for_reading(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    throw Error(fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
  }
  return f;
}

}  // namespace

NpyHeader peek_npy(const std::string& path) {
  const FilePtr f = open_for_reading(path);
  return read_npy_header(f.get(), path);
}

Array read_npy_rows(const std::string& path, int axis, const std::vector<RowRange>& ranges) {
  const FilePtr f = open_for_reading(path);
  const NpyHeader h = read_npy_header(f.get(), path);
  const int rank = static_cast<int>(h.shape.size());
  if (axis < 0 || axis >= rank) {
    throw Error(fmt::format("{}: expected an array with an axis {}, got shape {}", path, axis,
                            shape_string(h.shape)));
  }
  const std::int64_t n = h.shape[axis];
  std::int64_t rows = 0;
  for (const RowRange& r : ranges) {
    if (r.begin < 0 || r.end < r.begin || r.end > n) {
      throw Error(fmt::format("{}: expected rows [{}, {}) inside axis {} of length {} (shape {})",
                              path, r.begin, r.end, axis, n, shape_string(h.shape)));
    }
    rows += r.end - r.begin;
  }
  std::vector<std::int64_t> shape = h.shape;
  shape[axis] = rows;
  Array out(h.dtype, shape);
  const std::size_t elem = dtype_size(h.dtype);
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= h.shape[i];
  for (int i = axis + 1; i < rank; ++i) inner *= h.shape[i];
  const std::size_t row_bytes = static_cast<std::size_t>(inner) * elem;
  auto* dst = static_cast<unsigned char*>(out.data());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const RowRange& r : ranges) {
      const std::size_t bytes = static_cast<std::size_t>(r.end - r.begin) * row_bytes;
      if (bytes == 0) continue;
      const std::int64_t offset =
          h.data_offset + (o * n + r.begin) * static_cast<std::int64_t>(row_bytes);
      if (std::fseek(f.get(), static_cast<long>(offset), SEEK_SET) != 0 ||
          std::fread(dst, 1, bytes, f.get()) != bytes) {
        throw Error(fmt::format("{}: could not read {} bytes at offset {}", path, bytes, offset));
      }
      dst += bytes;
    }
  }
  if (h.dtype == DType::boolean) {
    const auto* b = out.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      if (b[i] > 1) {
        throw Error(fmt::format("{}: bool array holds byte {} (expected 0 or 1)", path, int(b[i])));
      }
    }
  }
  return out;
}

}  // namespace sdpa
