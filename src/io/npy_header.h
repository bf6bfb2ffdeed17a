// The header of a .npy file, for readers that take only part of the data (src/io/npy_slice.cpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "sdpa/array.h"

namespace sdpa {

struct NpyHeader {
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::int64_t data_offset = 0;  ///< bytes from the start of the file to the first element
  std::int64_t numel = 0;
};

/// Reads and checks the header of the open .npy file `file` (named `path` in messages) with the
/// rules of read_npy, including that the file holds exactly the promised number of bytes. Leaves
/// the file positioned at the first element.
NpyHeader read_npy_header(std::FILE* file, const std::string& path);

/// Rows [begin, end) of axis `axis` of a .npy file, for each range in `ranges`, concatenated
/// along that axis in the order given: the shard of a sequence a rank reads without reading the
/// rest of the file. Ranges must lie inside the axis (sdpa::Error otherwise); bool data are
/// checked to be 0 or 1 like read_npy does.
struct RowRange {
  std::int64_t begin = 0, end = 0;
};
Array read_npy_rows(const std::string& path, int axis, const std::vector<RowRange>& ranges);

/// The header only (shape and dtype), without reading the data.
NpyHeader peek_npy(const std::string& path);

}  // namespace sdpa
