// libFuzzer target: sdpa::read_npy on arbitrary bytes.
//
// The bytes go to an in-memory file (memfd) that read_npy opens through /proc/self/fd, so the
// parser is exercised exactly as the CLI uses it (fopen, fstat, fread) without touching the
// disk on every input. Contract checked:
//   - read_npy either returns an array or throws sdpa::Error; any other exception, a crash, a
//     sanitizer report or an allocation larger than the input (libFuzzer's -rss_limit_mb and
//     -malloc_limit_mb catch those) is a bug;
//   - what it returns is consistent: dtype and shape account for exactly the data bytes of the
//     file, and bool arrays hold only 0 and 1;
//   - it survives a round trip: write_npy of the result reads back bit for bit.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "sdpa/array.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_npy: contract violated: %s\n", what.c_str());
  std::abort();
}

int memory_file() {
  static const int fd = [] {
    const int f = memfd_create("fuzz_npy", 0);
    if (f < 0) fail("memfd_create failed");
    return f;
  }();
  return fd;
}

// A private directory for round-trip files, removed at exit. Never destroyed: the exit handler
// that removes it runs after the destructors of function-local statics.
const std::string& scratch_dir() {
  static const std::string* dir = [] {
    auto* d =
        new std::string((std::filesystem::temp_directory_path() / "sdpa_fuzz_npy_XXXXXX").string());
    if (mkdtemp(d->data()) == nullptr) fail("mkdtemp failed");
    std::atexit([] { std::filesystem::remove_all(*dir); });
    return d;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memory_file();
  if (ftruncate(fd, 0) != 0 ||
      (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))) {
    fail("could not fill the memory file");
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  sdpa::Array a;
  try {
    a = sdpa::read_npy(path);
  } catch (const sdpa::Error& e) {
    // The message must name the file it is about.
    if (std::string(e.what()).find(path) == std::string::npos) {
      fail(std::string("message does not name the file: ") + e.what());
    }
    return 0;
  }
  // Accepted: the header is at most the whole file and the data is exactly the rest.
  const std::size_t element = sdpa::dtype_size(a.dtype());
  if (a.numel() != sdpa::checked_numel(a.shape(), element, "shape")) fail("numel disagrees");
  if (a.nbytes() > size) fail("accepted an array larger than the file");
  if (size < 10 || std::memcmp(data, "\x93NUMPY", 6) != 0) fail("accepted without the magic");
  if (std::memcmp(static_cast<const char*>(a.data()), data + (size - a.nbytes()), a.nbytes()) !=
      0) {
    fail("the data is not the last nbytes of the file");
  }
  if (a.dtype() == sdpa::DType::boolean) {
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      if (a.data_as<std::uint8_t>()[i] > 1) fail("bool array holds a byte other than 0 or 1");
    }
  }
  // Round trip through the writer.
  const std::string copy = scratch_dir() + "/copy.npy";
  sdpa::write_npy(copy, a);
  const sdpa::Array b = sdpa::read_npy(copy);
  if (b.dtype() != a.dtype() || b.shape() != a.shape() ||
      std::memcmp(a.data(), b.data(), a.nbytes()) != 0) {
    fail("round trip through write_npy changed the array");
  }
  return 0;
}
