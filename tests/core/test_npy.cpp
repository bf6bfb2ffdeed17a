// .npy reading and writing: round trips, every supported version, and every malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "../common/test_util.h"
#include "sdpa/array.h"

namespace {

namespace fs = std::filesystem;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sdpa_npy_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with the given version, header dict and data bytes.
  std::string craft(const std::string& name, int version, std::string dict, std::string data,
                    bool pad = true) {
    const std::size_t prefix = version == 1 ? 10 : 12;
    if (pad) {
      const std::size_t total = ((prefix + dict.size() + 1 + 63) / 64) * 64;
      dict.append(total - prefix - dict.size() - 1, ' ');
      dict.push_back('\n');
    }
    std::string bytes("\x93NUMPY", 6);
    bytes.push_back(char(version));
    bytes.push_back(0);
    const std::uint32_t n = dict.size();
    bytes.push_back(char(n & 0xff));
    bytes.push_back(char((n >> 8) & 0xff));
    if (version != 1) {
      bytes.push_back(char((n >> 16) & 0xff));
      bytes.push_back(char((n >> 24) & 0xff));
    }
    bytes += dict + data;
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  std::string error_of(const std::string& file) {
    try {
      sdpa::read_npy(file);
    } catch (const sdpa::Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(NpyTest, RoundTripEveryDtype) {
  for (auto dt : {sdpa::DType::float32, sdpa::DType::float64, sdpa::DType::boolean}) {
    const sdpa::Array a = sdpa::test::random_array(dt, {2, 3, 5}, 42);
    sdpa::write_npy(path("a.npy"), a);
    const sdpa::Array b = sdpa::read_npy(path("a.npy"));
    EXPECT_EQ(b.dtype(), dt);
    EXPECT_EQ(b.shape(), a.shape());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  }
  // scalar and empty shapes
  const sdpa::Array s(sdpa::DType::float64, {});
  sdpa::write_npy(path("s.npy"), s);
  EXPECT_EQ(sdpa::read_npy(path("s.npy")).numel(), 1);
  const sdpa::Array e(sdpa::DType::float32, {0, 4});
  sdpa::write_npy(path("e.npy"), e);
  EXPECT_EQ(sdpa::read_npy(path("e.npy")).shape(), (std::vector<std::int64_t>{0, 4}));
}

TEST_F(NpyTest, ReadsVersionsTwoAndThree) {
  std::string data(8, '\0');
  const double one = 1.0;
  std::memcpy(data.data(), &one, 8);
  for (int version : {1, 2, 3}) {
    const auto f =
        craft("v.npy", version, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", data);
    const sdpa::Array a = sdpa::read_npy(f);
    EXPECT_EQ(a.data_as<double>()[0], 1.0) << version;
  }
}

TEST_F(NpyTest, ReadsTheNativeOrderSpellingsNumPyReads) {
  std::string data(8, '\0');
  const float two[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), two, 8);
  for (const char* descr : {"<f4", "=f4", "|f4", "f4"}) {
    const auto f = craft(
        "n.npy", 1,
        std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }", data);
    const sdpa::Array a = sdpa::read_npy(f);
    ASSERT_EQ(a.dtype(), sdpa::DType::float32) << descr;
    EXPECT_EQ(a.data_as<float>()[1], -2.0f) << descr;
  }
  for (const char* descr : {"|b1", "<b1", "=b1", "b1"}) {
    const auto f =
        craft("b.npy", 1,
              std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }",
              std::string("\x01\x00", 2));
    const sdpa::Array a = sdpa::read_npy(f);
    ASSERT_EQ(a.dtype(), sdpa::DType::boolean) << descr;
  }
  // Big-endian stays refused, with the spelling the file used.
  const auto big =
      craft("g.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", data);
  EXPECT_NE(error_of(big).find("unsupported dtype '>f4'"), std::string::npos) << error_of(big);
  const auto odd =
      craft("o.npy", 1, "{'descr': '=i4', 'fortran_order': False, 'shape': (2,), }", data);
  EXPECT_NE(error_of(odd).find("unsupported dtype '=i4'"), std::string::npos) << error_of(odd);
}

TEST_F(NpyTest, RefusesEveryMalformedFile) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data24(24, '\0');
  struct Bad {
    std::string name, expect;
    std::string file;
  };
  std::vector<Bad> cases = {
      {"truncated data", "truncated", craft("t.npy", 1, ok, data24.substr(0, 20))},
      {"trailing data", "trailing", craft("tr.npy", 1, ok, data24 + "xx")},
      {"header lies about shape", "header promises",
       craft("lie.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (100, 100), }",
             data24)},
      {"big-endian", "unsupported dtype",
       craft("be.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data24)},
      {"int dtype", "unsupported dtype",
       craft("i.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", data24)},
      {"int16", "unsupported dtype",
       craft("h.npy", 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }",
             data24.substr(0, 12))},
      {"fortran", "Fortran",
       craft("f.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data24)},
      {"overflowing shape", "2^62",
       craft("o.npy", 1,
             "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
             data24)},
      {"64-bit overflow", "overflows",
       craft("o2.npy", 1,
             "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
             data24)},
      {"absurd but representable", "header promises",
       craft("a.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }",
             data24)},
      {"missing key", "malformed",
       craft("mk.npy", 1, "{'descr': '<f4', 'shape': (2, 3), }", data24)},
      {"garbage header", "malformed", craft("g.npy", 1, "not a dict at all", data24)},
      {"unknown key", "malformed",
       craft("uk.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}",
             data24)},
      {"negative dimension", "malformed",
       craft("n.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", data24)},
      {"bad version", "version", craft("bv.npy", 7, ok, data24)},
      {"header longer than file", "truncated",
       [&] {
         std::string b("\x93NUMPY\x01\x00\xff\xff", 10);
         std::ofstream(path("hl.npy"), std::ios::binary) << b;
         return path("hl.npy");
       }()},
      {"not npy", "not a .npy",
       [&] {
         std::ofstream(path("x.npy"), std::ios::binary) << "hello world, not numpy";
         return path("x.npy");
       }()},
      {"empty file", "not a .npy",
       [&] {
         std::ofstream(path("empty.npy"), std::ios::binary) << "";
         return path("empty.npy");
       }()},
      {"bool byte 2", "bool array holds",
       craft("b.npy", 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
             std::string("\x01\x02", 2))},
      {"missing file", "cannot open", path("does-not-exist.npy")},
      {"directory", "regular", dir_.string()},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of(c.file);
    EXPECT_NE(msg.find(c.expect), std::string::npos)
        << c.name << ": expected a message with '" << c.expect << "', got '" << msg << "'";
    EXPECT_NE(msg.find(c.file), std::string::npos) << c.name << ": message should name the file";
  }
}

TEST_F(NpyTest, FailedWriteLeavesNothingBehind) {
  const sdpa::Array a = sdpa::test::random_array(sdpa::DType::float32, {4}, 1);
  EXPECT_THROW(sdpa::write_npy(path("no-such-dir/x.npy"), a), sdpa::Error);
  // all-or-nothing: the second destination cannot be written, so the first must not appear
  EXPECT_THROW(sdpa::write_npy_all({{path("first.npy"), a}, {path("missing/second.npy"), a}}),
               sdpa::Error);
  EXPECT_FALSE(fs::exists(path("first.npy")));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 0u) << "a temporary file was left behind";
}

}  // namespace
