// NumPy .npy reading and writing.
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//   "\x93NUMPY" major minor, header length (uint16 LE in v1, uint32 LE in v2/v3), then an ASCII
//   (v3: UTF-8) Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...), }
//   padded with spaces and a final '\n', then the raw data.
#include "io/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "io/npy_header.h"
#include "io/output.h"
#include "sdpa/array.h"

namespace sdpa {
namespace {

class File {
 public:
  explicit File(FILE* f) : f_(f) {}
  ~File() {
    if (f_ != nullptr) std::fclose(f_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  FILE* get() const { return f_; }

 private:
  FILE* f_;
};

// A tiny parser for the header dict, strict about what NumPy writes.
class HeaderParser {
 public:
  HeaderParser(std::string text, std::string path) : s_(std::move(text)), path_(std::move(path)) {}

  void parse(std::string& descr, bool& fortran, std::vector<std::int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip();
    expect('{');
    for (;;) {
      skip();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::string key = string_literal();
      skip();
      expect(':');
      skip();
      if (key == "descr") {
        descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        fail(fmt::format("unexpected key '{}'", key));
      }
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip();
      expect('}');
      break;
    }
    // NumPy evaluates the whole header as one literal: only the padding may follow the dict.
    skip();
    if (i_ != s_.size()) fail(fmt::format("unexpected text after the dict at offset {}", i_));
    if (!have_descr || !have_fortran || !have_shape) {
      fail("expected the keys 'descr', 'fortran_order' and 'shape'");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorKind::io, path_,
                fmt::format("malformed .npy header ({}): {}", what, s_.substr(0, 200)));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}' at offset {}", c, i_));
    ++i_;
  }
  std::string string_literal() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(fmt::format("expected a string at offset {}", i_));
    ++i_;
    const std::size_t end = s_.find(quote, i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    fail("expected True or False for 'fortran_order'");
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> out;
    expect('(');
    for (;;) {
      skip();
      if (peek() == ')') {
        ++i_;
        return out;
      }
      if (peek() < '0' || peek() > '9') fail(fmt::format("expected a dimension at offset {}", i_));
      std::int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = peek() - '0';
        if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
          throw Error(ErrorKind::bad_shape, path_,
                      ".npy shape has a dimension that overflows 64 bits");
        }
        v = v * 10 + digit;
        ++i_;
      }
      if (peek() == 'L') ++i_;  // Python 2 long suffix
      out.push_back(v);
      if (out.size() > 32) fail("more than 32 dimensions");
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip();
      expect(')');
      return out;
    }
  }

  std::string s_;
  std::string path_;
  std::size_t i_ = 0;
};

// A dtype as NumPy spells it in '<' or '|' form: '=f4' (native order), '|f4' and 'f4' (no
// order given) are the native order, and a one-byte type has none ('<b1' is '|b1').
std::string canonical_descr(const std::string& descr) {
  if (descr.empty()) return descr;
  const bool has_order = std::strchr("<>=|", descr[0]) != nullptr;
  const std::string type = has_order ? descr.substr(1) : descr;
  char order = has_order ? descr[0] : '=';
  if (type.size() == 2 && type[1] == '1') return "|" + type;
  if (order == '=' || order == '|') order = std::endian::native == std::endian::little ? '<' : '>';
  return order + type;
}

std::string descr_for(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "<f4";
    case DType::float64:
      return "<f8";
    case DType::boolean:
      return "|b1";
    case DType::float16:
      return "<f2";
    case DType::bfloat16:  // NumPy has no bfloat16: its bit patterns as uint16 (docs/precision.md)
      return "<u2";
  }
  return "";
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void io::write_npy(io::OutputCommit& commit, std::size_t index, const TensorRef& tensor) {
  const std::int64_t n =
      checked_numel(tensor.shape, dtype_size(tensor.dtype), commit.argument(index));
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 descr_for(tensor.dtype), shape_string(tensor.shape));
  // Pad so that the data starts at a multiple of 64 bytes; the header ends with '\n'.
  int version = 1;
  std::size_t prefix = 10;
  if (dict.size() + 1 + prefix > 65535) {
    version = 2;
    prefix = 12;
  }
  const std::size_t total = ((prefix + dict.size() + 1 + 63) / 64) * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string magic("\x93NUMPY", 6);
  magic.push_back(static_cast<char>(version));
  magic.push_back('\0');
  const std::uint32_t len = static_cast<std::uint32_t>(dict.size());
  if (version == 1) {
    magic.push_back(static_cast<char>(len & 0xff));
    magic.push_back(static_cast<char>(len >> 8));
  } else {
    for (int i = 0; i < 4; ++i) magic.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  }
  commit.append(index, magic.data(), magic.size());
  commit.append(index, dict.data(), dict.size());
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(tensor.dtype);
  if (bytes > 0) commit.append(index, tensor.data, bytes);
}

NpyHeader read_npy_header(std::FILE* file, const std::string& path) {
  struct stat st {};
  if (fstat(fileno(file), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(ErrorKind::io, path, "expected a regular .npy file");
  }
  const std::int64_t file_size = st.st_size;
  unsigned char magic[8];
  if (std::fread(magic, 1, 8, file) != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    throw Error(ErrorKind::io, path, "not a .npy file (expected the magic string \\x93NUMPY)");
  }
  const int major = magic[6];
  if (major < 1 || major > 3) {
    throw Error(ErrorKind::io, path,
                fmt::format("unsupported .npy format version {}.{} (expected 1, 2 or 3)", major,
                            int(magic[7])));
  }
  std::uint32_t header_len = 0;
  unsigned char len_bytes[4] = {0, 0, 0, 0};
  const std::size_t len_size = major == 1 ? 2 : 4;
  if (std::fread(len_bytes, 1, len_size, file) != len_size) {
    throw Error(ErrorKind::io, path, "truncated .npy header");
  }
  for (std::size_t i = 0; i < len_size; ++i) header_len |= std::uint32_t(len_bytes[i]) << (8 * i);
  const std::int64_t data_offset = 8 + static_cast<std::int64_t>(len_size) + header_len;
  if (data_offset > file_size) {
    throw Error(ErrorKind::io, path,
                fmt::format("truncated .npy header (header length {} but the file has {} bytes)",
                            header_len, file_size));
  }
  std::string header(header_len, '\0');
  if (header_len > 0 && std::fread(header.data(), 1, header_len, file) != header_len) {
    throw Error(ErrorKind::io, path, "truncated .npy header");
  }
  std::string descr;
  bool fortran = false;
  std::vector<std::int64_t> shape;
  HeaderParser(header, path).parse(descr, fortran, shape);
  const std::string spelled = descr;
  descr = canonical_descr(descr);
  DType dtype;
  if (descr == "<f4") {
    dtype = DType::float32;
  } else if (descr == "<f8") {
    dtype = DType::float64;
  } else if (descr == "|b1") {
    dtype = DType::boolean;
  } else if (descr == "<f2") {
    dtype = DType::float16;
  } else if (descr == "<u2") {
    // sdpa has no integer tensors: a uint16 array holds bfloat16 bit patterns (the convention
    // of docs/precision.md, NumPy having no bfloat16).
    dtype = DType::bfloat16;
  } else {
    throw Error(
        ErrorKind::bad_type, path,
        fmt::format("unsupported dtype '{}' (expected little-endian float32 '<f4', float64 '<f8', "
                    "float16 '<f2', bfloat16 bits as uint16 '<u2' or bool '|b1')",
                    spelled));
  }
  if (fortran) {
    throw Error(ErrorKind::bad_type, path,
                "Fortran-order arrays are not supported (expected C order); save with "
                "numpy.ascontiguousarray");
  }
  const std::int64_t n = checked_numel(shape, dtype_size(dtype), path);
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t available = file_size - data_offset;
  if (available != bytes) {
    throw Error(
        ErrorKind::io, path,
        fmt::format(
            "the header promises shape {} of {} ({} bytes of data) but the file holds {} bytes "
            "after the header ({})",
            shape_string(shape), dtype_name(dtype), bytes, available,
            available < bytes ? "truncated" : "trailing bytes"));
  }
  return NpyHeader{dtype, shape, data_offset, n};
}

Array read_npy(const std::string& path) {
  // Refuses a FIFO, a device or a directory before reading, without blocking on it.
  const int fd = io::open_regular_for_reading(path, path);
  File f(fdopen(fd, "rb"));
  if (f.get() == nullptr) {
    ::close(fd);
    throw Error(ErrorKind::io, path, fmt::format("cannot open for reading: {}", errno_text()));
  }
  const NpyHeader h = read_npy_header(f.get(), path);
  const DType dtype = h.dtype;
  const std::int64_t n = h.numel;
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(dtype));
  Array out(dtype, h.shape);
  if (bytes > 0 && std::fread(out.data(), 1, static_cast<std::size_t>(bytes), f.get()) !=
                       static_cast<std::size_t>(bytes)) {
    throw Error(ErrorKind::io, path, fmt::format("could not read {} bytes of data", bytes));
  }
  if (dtype == DType::boolean) {
    auto* b = out.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      if (b[i] > 1) {
        throw Error(
            ErrorKind::io, path,
            fmt::format("bool array holds byte {} at index {} (expected 0 or 1)", int(b[i]), i));
      }
    }
  }
  return out;
}

void write_npy_all(const std::vector<std::pair<std::string, TensorRef>>& files) {
  io::OutputCommit commit;
  std::vector<std::size_t> index;
  for (const auto& [path, tensor] : files) index.push_back(commit.add_file(path, path));
  for (std::size_t i = 0; i < files.size(); ++i) io::write_npy(commit, index[i], files[i].second);
  commit.commit();
}

void write_npy(const std::string& path, const TensorRef& tensor) {
  write_npy_all({{path, tensor}});
}

}  // namespace sdpa
