// The catalogue of bad input. Every entry is a table row: what is wrong, the exit status the
// `sdpa attention` command must give (2 for every bad input), and a fragment its message must
// contain (`--key @k.npy: ...`: the flag, then the file as the command was given it). Each row runs
// through the CLI; the rows about files and tensors also run through the API (read_npy,
// attention_forward, attention_backward), which must throw sdpa::Error with the same fragment.
// After every failed command: nothing was written (no output, no temporary file) and no input
// changed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "cli_runner.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

namespace fs = std::filesystem;
using sdpa::Array;
using sdpa::DType;

// A .npy file with the given header dict and data bytes (padded like NumPy's writer).
std::string npy_bytes(const std::string& dict, const std::string& data, int version = 1) {
  const std::size_t prefix = version == 1 ? 10 : 12;
  std::string header = dict;
  const std::size_t total = ((prefix + header.size() + 1 + 63) / 64) * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string bytes("\x93NUMPY", 6);
  bytes.push_back(static_cast<char>(version));
  bytes.push_back('\0');
  const auto n = static_cast<std::uint32_t>(header.size());
  for (std::size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) {
    bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  }
  return bytes + header + data;
}

std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// Query (2, 4, 5, 8), key (2, 4, 7, 8), value (2, 4, 7, 6): the valid base every row perturbs.
constexpr std::int64_t kB = 2, kH = 4, kL = 5, kS = 7, kE = 8, kEv = 6;

class BadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ =
        new fs::path(fs::temp_directory_path() / ("sdpa_catalogue_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    using sdpa::test::random_array;
    auto save = [](const std::string& name, const Array& a) { sdpa::write_npy(path(name), a); };
    save("q.npy", random_array(DType::float32, {kB, kH, kL, kE}, 1));
    save("k.npy", random_array(DType::float32, {kB, kH, kS, kE}, 2));
    save("v.npy", random_array(DType::float32, {kB, kH, kS, kEv}, 3));
    save("do.npy", random_array(DType::float32, {kB, kH, kL, kEv}, 4));
    save("q64.npy", random_array(DType::float64, {kB, kH, kL, kE}, 1));
    save("q_rank1.npy", random_array(DType::float32, {kE}, 1));
    save("q_rank3.npy", random_array(DType::float32, {kH, kL, kE}, 1));
    save("q_bool.npy", random_array(DType::boolean, {kB, kH, kL, kE}, 1));
    save("k_E.npy", random_array(DType::float32, {kB, kH, kS, kE + 1}, 2));
    save("k_heads.npy", random_array(DType::float32, {kB, 2, kS, kE}, 2));
    save("k_heads3.npy", random_array(DType::float32, {kB, 3, kS, kE}, 2));
    save("v_heads3.npy", random_array(DType::float32, {kB, 3, kS, kEv}, 2));
    save("k_batch.npy", random_array(DType::float32, {kB + 1, kH, kS, kE}, 2));
    save("v_S.npy", random_array(DType::float32, {kB, kH, kS + 1, kEv}, 3));
    save("v_heads.npy", random_array(DType::float32, {kB, 2, kS, kEv}, 3));
    save("mask_L.npy", random_array(DType::boolean, {kL + 1, kS}, 5));
    save("mask_rank.npy", random_array(DType::boolean, {1, kB, kH, kL, kS}, 5));
    save("mask_S.npy", random_array(DType::float32, {kB, 1, 1, kS - 1}, 5));
    save("do_shape.npy", random_array(DType::float32, {kB, kH, kL, kEv + 1}, 4));
    const std::string d24(24, '\0');
    const std::string ok = dict("<f4", "(2, 3)");
    raw("truncated.npy", npy_bytes(ok, d24.substr(0, 20)));
    raw("trailing.npy", npy_bytes(ok, d24 + "xx"));
    raw("lying.npy", npy_bytes(dict("<f4", "(100, 100)"), d24));
    raw("absurd.npy", npy_bytes(dict("<f4", "(1099511627776, 1024)"), d24));  // 2^52 bytes
    raw("overflow.npy", npy_bytes(dict("<f8", "(4294967296, 4294967296)"), d24));
    raw("overflow64.npy", npy_bytes(dict("<f4", "(99999999999999999999,)"), d24));
    raw("zero_huge.npy", npy_bytes(dict("<f4", "(0, 4611686018427387904, 4)"), ""));
    raw("negative.npy", npy_bytes(dict("<f4", "(-2, 3)"), d24));
    raw("int32.npy", npy_bytes(dict("<i4", "(2, 3)"), d24));
    raw("int16.npy", npy_bytes(dict("<i2", "(2, 6)"), d24));
    raw("complex.npy", npy_bytes(dict("<c8", "(3,)"), d24));
    raw("uint8.npy", npy_bytes(dict("|u1", "(24,)"), d24));
    raw("object.npy", npy_bytes(dict("|O", "(3,)"), d24));
    raw("big_endian.npy", npy_bytes(dict(">f4", "(2, 3)"), d24));
    raw("big_endian64.npy", npy_bytes(dict(">f8", "(3,)"), d24));
    raw("fortran.npy", npy_bytes(dict("<f4", "(2, 3)", true), d24));
    raw("bad_magic.npy", "\x93NUMPX" + npy_bytes(ok, d24).substr(6));
    raw("bad_version.npy", [&] {
      std::string b = npy_bytes(ok, d24);
      b[6] = 9;
      return b;
    }());
    raw("header_cut.npy", npy_bytes(ok, d24).substr(0, 40));
    raw("header_len_lies.npy", std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12));
    raw("garbage_header.npy", npy_bytes("[1, 2, 3]", d24));
    raw("missing_key.npy", npy_bytes("{'descr': '<f4', 'shape': (2, 3), }", d24));
    raw("unknown_key.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, "
                                     "'shape': (2, 3), 'x': 1}",
                                     d24));
    raw("unterminated.npy", npy_bytes("{'descr': '<f4", d24));
    raw("text_after_dict.npy", npy_bytes(dict("<f4", "(2, 3)") + " 'shape': (9,) garbage", d24));
    save("alibi_HB.npy", random_array(DType::float32, {kH, kB}, 6));
    save("alibi_H1.npy", random_array(DType::float32, {kH, 1}, 6));
    save("sinks_H1.npy", random_array(DType::float32, {kH, 1}, 7));
    save("sinks_1H.npy", random_array(DType::float32, {1, kH}, 7));
    save("sinks_3.npy", random_array(DType::float32, {3}, 7));
    raw("bool_byte.npy", npy_bytes(dict("|b1", "(2,)"), std::string("\x01\x07", 2)));
    raw("empty.npy", "");
    raw("text.npy", "this is not a numpy file at all\n");
    fs::create_directories(path("a_directory.npy"));
    fs::create_directories(path("sub"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  static void raw(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }

  static fs::path* dir_;
};
fs::path* BadInput::dir_ = nullptr;

// One row of the catalogue. `args` replace or extend the valid base command line; a value that
// starts with '@' names a file in the test directory. An empty value removes the flag.
struct Row {
  std::string what;
  std::map<std::string, std::string> args;
  std::string fragment;
  int status = 2;
  std::vector<std::string> extra = {};  // appended verbatim (flags without a value)
};

std::vector<Row> catalogue() {
  return {
      // ---- malformed .npy files, as --query (and one as --mask, --key, --grad-output) ----
      {"truncated data", {{"--query", "@truncated.npy"}}, "truncated"},
      {"trailing bytes", {{"--query", "@trailing.npy"}}, "trailing bytes"},
      {"header lies about the shape", {{"--query", "@lying.npy"}}, "header promises"},
      {"absurd shape (2^52 bytes), refused without allocating",
       {{"--query", "@absurd.npy"}},
       "header promises"},
      {"shape overflowing 2^62 bytes", {{"--query", "@overflow.npy"}}, "2^62"},
      {"dimension overflowing 64 bits", {{"--query", "@overflow64.npy"}}, "overflows 64 bits"},
      {"zero-size shape whose other dimensions overflow", {{"--query", "@zero_huge.npy"}}, "2^62"},
      {"negative dimension", {{"--query", "@negative.npy"}}, "malformed"},
      {"int32 dtype", {{"--query", "@int32.npy"}}, "unsupported dtype '<i4'"},
      {"int16 dtype", {{"--query", "@int16.npy"}}, "unsupported dtype '<i2'"},
      {"complex dtype", {{"--query", "@complex.npy"}}, "unsupported dtype '<c8'"},
      {"uint8 dtype", {{"--key", "@uint8.npy"}}, "unsupported dtype '|u1'"},
      {"object dtype", {{"--value", "@object.npy"}}, "unsupported dtype '|O'"},
      {"big-endian float32", {{"--query", "@big_endian.npy"}}, "unsupported dtype '>f4'"},
      {"big-endian float64", {{"--mask", "@big_endian64.npy"}}, "unsupported dtype '>f8'"},
      {"Fortran order", {{"--query", "@fortran.npy"}}, "Fortran"},
      {"bad magic", {{"--query", "@bad_magic.npy"}}, "not a .npy file"},
      {"unknown format version", {{"--query", "@bad_version.npy"}}, "version 9"},
      {"header cut short", {{"--query", "@header_cut.npy"}}, "truncated .npy header"},
      {"header length larger than the file",
       {{"--query", "@header_len_lies.npy"}},
       "truncated .npy header"},
      {"header is not a dict", {{"--query", "@garbage_header.npy"}}, "malformed .npy header"},
      {"header misses a key", {{"--query", "@missing_key.npy"}}, "malformed .npy header"},
      {"header has an unknown key", {{"--query", "@unknown_key.npy"}}, "unexpected key 'x'"},
      {"header string unterminated", {{"--query", "@unterminated.npy"}}, "malformed .npy header"},
      {"text after the header's dict",
       {{"--query", "@text_after_dict.npy"}},
       "malformed .npy header (unexpected text after the dict"},
      {"bool mask holding 7", {{"--mask", "@bool_byte.npy"}}, "bool array holds byte 7"},
      {"empty file", {{"--query", "@empty.npy"}}, "not a .npy file"},
      {"text file",
       {{"--grad-output", "@text.npy"}, {"--grad-query", "@dq.npy"}},
       "not a .npy file"},
      {"missing file", {{"--key", "@no_such_file.npy"}}, "cannot open"},
      {"directory as input", {{"--value", "@a_directory.npy"}}, "regular"},
      // ---- tensors that do not fit together ----
      {"rank-1 query",
       {{"--query", "@q_rank1.npy"}},
       "--query @q_rank1.npy: expected rank 2 or more"},
      {"ranks differ", {{"--query", "@q_rank3.npy"}}, "expected the rank of query"},
      {"bool query",
       {{"--query", "@q_bool.npy"}},
       "--query @q_bool.npy: expected dtype float32 or float64"},
      {"dtypes differ", {{"--query", "@q64.npy"}}, "expected the query's dtype"},
      {"key feature size differs",
       {{"--key", "@k_E.npy"}},
       "--key @k_E.npy: expected last dimension E"},
      {"value length differs", {{"--value", "@v_S.npy"}}, "--value @v_S.npy: expected S = 7"},
      {"value heads differ",
       {{"--value", "@v_heads.npy"}},
       "--value @v_heads.npy: expected 4 heads"},
      {"batch dimensions differ", {{"--key", "@k_batch.npy"}}, "leading batch dimensions"},
      {"heads differ without GQA",
       {{"--key", "@k_heads.npy"}, {"--value", "@v_heads.npy"}},
       "--key @k_heads.npy: expected 4 heads like query (or --enable-gqa"},
      {"GQA, Hq not a multiple of Hkv",
       {{"--key", "@k_heads3.npy"}, {"--value", "@v_heads3.npy"}},
       "multiple of key/value heads",
       2,
       {"--enable-gqa"}},
      {"mask L does not broadcast",
       {{"--mask", "@mask_L.npy"}},
       "--mask @mask_L.npy: expected a shape that broadcasts to (2, 4, 5, 7)"},
      {"mask S does not broadcast", {{"--mask", "@mask_S.npy"}}, "dimension 3 is 6, expected 7"},
      {"mask of higher rank", {{"--mask", "@mask_rank.npy"}}, "rank 5 > 4"},
      {"grad-output of the wrong shape",
       {{"--grad-output", "@do_shape.npy"}, {"--grad-query", "@dq.npy"}},
       "--grad-output"},
      {"ALiBi slopes (Hq, B), not (B, Hq)",
       {{"--alibi-slopes", "@alibi_HB.npy"}},
       "alibi_HB.npy: expected shape (4,) or (2, 4) (..., Hq) for a query of shape (2, 4, 5, 8), "
       "got (4, 2)"},
      {"ALiBi slopes (Hq, 1)", {{"--alibi-slopes", "@alibi_H1.npy"}}, "got (4, 1)"},
      {"sinks (Hq, 1)",
       {{"--sinks", "@sinks_H1.npy"}},
       "sinks_H1.npy: expected shape (4,) (Hq,) for a query of shape (2, 4, 5, 8), got (4, 1)"},
      {"sinks (1, Hq)", {{"--sinks", "@sinks_1H.npy"}}, "--sinks "},
      {"sinks of the wrong length", {{"--sinks", "@sinks_3.npy"}}, "got (3,)"},
      // ---- options ----
      {"dropout probability 1.5",
       {{"--dropout-p", "1.5"}},
       "sdpa: error: --dropout-p: expected a probability in [0, 1), got 1.5"},
      {"softcap negative", {{"--softcap", "-1"}}, "sdpa: error: --softcap: expected 0 (off)"},
      {"scale NaN",
       {{"--scale", "nan"}},
       "sdpa: error: --scale: expected a finite number, got 'nan'"},
      {"scale inf", {{"--scale", "inf"}}, "scale: expected a finite number"},
      {"scale -inf", {{"--scale", "-inf"}}, "scale: expected a finite number"},
      {"scale overflowing double",
       {{"--scale", "1e999"}},
       "--scale: expected a finite number, got '1e999'"},
      {"scale not a number", {{"--scale", "abc"}}, "--scale: expected a finite number, got 'abc'"},
      {"scale with a decimal comma",
       {{"--scale", "1,5"}},
       "--scale: expected a finite number, got '1,5'"},
      // CLI11 reads "--scale=" as a flag that takes the next word for its value.
      {"scale empty", {{"--scale", "="}}, "--scale: expected a finite number, got '--value'"},
      {"scale an empty word", {}, "--scale: expected a finite number, got ''", 2, {"--scale", ""}},
      {"threads negative", {{"--threads", "-1"}}, "threads: expected 0 (one per core) or 1..1024"},
      {"threads too many", {{"--threads", "1025"}}, "threads: expected"},
      {"threads beyond int", {{"--threads", "99999999999"}}, "--threads"},
      {"threads not a number", {{"--threads", "two"}}, "--threads"},
      {"causal misspelled",
       {{"--causal", "upper_left"}},
       "sdpa: error: --causal: expected none, upper-left"},
      {"impl unknown",
       {{"--impl", "gpu"}},
       "sdpa: error: --impl: expected fast, reference or naive"},
      {"naive with a window",
       {{"--impl", "naive"}, {"--window", "1,1"}},
       "sdpa: error: --impl: expected fast or reference"},
      {"unknown flag", {}, "--frobnicate", 2, {"--frobnicate"}},
      {"missing --key", {{"--key", ""}}, "--key"},
      // ---- outputs ----
      {"output equals an input", {{"--out", "@q.npy"}}, "different from every input"},
      {"output equals an input by another spelling",
       {{"--out", "@sub/../k.npy"}},
       "different from every input"},
      {"lse equals the mask",
       {{"--mask", "@mask_ok.npy"}, {"--lse", "@mask_ok.npy"}},
       "--lse: expected an output path different from every input"},
      {"grad-key equals grad-output",
       {{"--grad-output", "@do.npy"}, {"--grad-key", "@do.npy"}},
       "different from every input"},
      {"two outputs share a path", {{"--lse", "@out.npy"}}, "no other output uses"},
      {"output in a missing directory",
       {{"--out", "@no_dir/out.npy"}},
       "expected a path in an existing directory"},
      {"output under a regular file", {{"--out", "@q.npy/out.npy"}}, "existing directory"},
      {"output in an unwritable place",
       {{"--out", "/proc/self/sdpa_out.npy"}},
       "cannot create the output file"},
      {"output is a directory", {{"--lse", "@a_directory.npy"}}, "found a directory"},
      {"grad outputs without --grad-output",
       {{"--grad-value", "@dv.npy"}},
       "--grad-output: expected when"},
      {"--grad-output without grad outputs",
       {{"--grad-output", "@do.npy"}},
       "--grad-output: expected with at least one"},
  };
}

std::string hash_of_inputs(const fs::path& dir) {
  std::string all;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) all += f.filename().string() + ":" + sdpa::test::slurp(f) + "|";
  return std::to_string(std::hash<std::string>{}(all));
}

TEST_F(BadInput, EveryRowThroughTheCli) {
  sdpa::write_npy(path("mask_ok.npy"),
                  sdpa::test::random_array(DType::boolean, {kB, kH, kL, kS}, 9));
  const auto rows = catalogue();
  ASSERT_GE(rows.size(), 60u);
  const std::string before = hash_of_inputs(*dir_);
  for (const Row& row : rows) {
    std::map<std::string, std::string> args = {
        {"--query", "@q.npy"}, {"--key", "@k.npy"}, {"--value", "@v.npy"}, {"--out", "@out.npy"}};
    for (const auto& [flag, value] : row.args) args[flag] = value;
    std::vector<std::string> argv = {"attention"};
    for (const auto& [flag, value] : args) {
      if (value.empty()) continue;
      if (value == "=") {
        argv.push_back(flag + "=");
        continue;
      }
      argv.push_back(flag);
      argv.push_back(value[0] == '@' ? path(value.substr(1)) : value);
    }
    argv.insert(argv.end(), row.extra.begin(), row.extra.end());
    const sdpa::test::CliResult r = sdpa::test::run_cli(argv, dir_->string());
    EXPECT_EQ(r.status, row.status) << row.what << "\nstderr: " << r.err;
    // "--key @k.npy: ..." names the file as the command was given it.
    std::string fragment = row.fragment;
    if (const std::size_t at = fragment.find(" @"); at != std::string::npos) {
      const std::size_t end = fragment.find(':', at);
      fragment.replace(at + 1, end - at - 1, path(fragment.substr(at + 2, end - at - 2)));
    }
    EXPECT_NE(r.err.find(fragment), std::string::npos)
        << row.what << ": expected '" << fragment << "' in stderr, got: " << r.err;
    EXPECT_TRUE(r.out.empty()) << row.what << ": stdout should be empty, got: " << r.out;
    for (const char* name : {"out.npy", "dq.npy", "dv.npy", "sub/out.npy"}) {
      EXPECT_FALSE(fs::exists(path(name))) << row.what << ": wrote " << name;
    }
    for (const auto& e : fs::recursive_directory_iterator(*dir_)) {
      EXPECT_EQ(e.path().filename().string().find(".sdpa-"), std::string::npos)
          << row.what << ": left a temporary file " << e.path();
    }
    EXPECT_EQ(hash_of_inputs(*dir_), before) << row.what << ": an input file changed";
  }
  // The valid base itself succeeds, so every row failed for its own reason.
  const auto ok =
      sdpa::test::run_cli({"attention", "--query", path("q.npy"), "--key", path("k.npy"), "--value",
                           path("v.npy"), "--out", path("out.npy")},
                          dir_->string());
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(fs::exists(path("out.npy")));
  fs::remove(path("out.npy"));
  fs::remove(path("mask_ok.npy"));
}

// The same files through the API: read_npy refuses each malformed one with the same message.
TEST_F(BadInput, MalformedFilesThroughTheApi) {
  int checked = 0;
  for (const Row& row : catalogue()) {
    for (const auto& [flag, value] : row.args) {
      if (value.empty() || value[0] != '@') continue;
      const std::string file = path(value.substr(1));
      if (!fs::exists(file) || fs::is_directory(file)) continue;
      bool malformed = false;
      std::string message;
      try {
        sdpa::read_npy(file);
      } catch (const sdpa::Error& e) {
        malformed = true;
        message = e.what();
      }
      if (!malformed) continue;  // a valid file that is wrong only in context
      ++checked;
      EXPECT_NE(message.find(row.fragment), std::string::npos)
          << row.what << ": expected '" << row.fragment << "', got: " << message;
      EXPECT_EQ(message.rfind(file, 0), 0u) << row.what << ": message should start with the path";
    }
  }
  EXPECT_GE(checked, 25);
  for (const char* name : {"no_such_file.npy", "a_directory.npy"}) {
    EXPECT_THROW(sdpa::read_npy(path(name)), sdpa::Error) << name;
  }
}

// Tensors that do not fit together, and bad options, through attention_forward/backward.
TEST(BadInputApi, ShapesAndOptions) {
  using sdpa::test::random_array;
  const Array q = random_array(DType::float32, {kB, kH, kL, kE}, 1);
  const Array k = random_array(DType::float32, {kB, kH, kS, kE}, 2);
  const Array v = random_array(DType::float32, {kB, kH, kS, kEv}, 3);
  struct Case {
    std::string what;
    std::function<void()> call;
    std::string fragment;
  };
  auto forward = [](const Array& q_, const Array& k_, const Array& v_, const Array* m,
                    sdpa::AttentionOptions o) {
    std::vector<std::int64_t> os = q_.shape();
    os.back() = v_.shape().back();
    Array out(q_.dtype() == DType::boolean ? DType::float32 : q_.dtype(), os);
    const sdpa::TensorRef mr = m != nullptr ? m->ref() : sdpa::TensorRef{};
    sdpa::attention_forward(q_, k_, v_, m != nullptr ? &mr : nullptr, o, out.mut());
  };
  const sdpa::AttentionOptions base;
  auto with = [&](auto edit) {
    sdpa::AttentionOptions o = base;
    edit(o);
    return o;
  };
  const Array k3 = random_array(DType::float32, {kB, 3, kS, kE}, 2);
  const Array v3 = random_array(DType::float32, {kB, 3, kS, kEv}, 2);
  const Array mask_L = random_array(DType::boolean, {kL + 1, kS}, 5);
  const Array mask_int_like = random_array(DType::float32, {kB, kH, kL, kS, 1}, 5);
  std::vector<Case> cases = {
      {"rank 1", [&] { forward(random_array(DType::float32, {kE}, 1), k, v, nullptr, base); },
       "query: expected rank 2 or more"},
      {"dtypes differ",
       [&] {
         forward(random_array(DType::float64, {kB, kH, kL, kE}, 1), k, v, nullptr, base);
       },
       "expected the query's dtype"},
      {"E differs",
       [&] {
         forward(q, random_array(DType::float32, {kB, kH, kS, kE + 1}, 2), v, nullptr, base);
       },
       "key: expected last dimension E"},
      {"S differs",
       [&] {
         forward(q, k, random_array(DType::float32, {kB, kH, kS + 1, kEv}, 2), nullptr, base);
       },
       "value: expected S"},
      {"batch differs",
       [&] {
         forward(q, random_array(DType::float32, {kB + 1, kH, kS, kE}, 2),
                 random_array(DType::float32, {kB + 1, kH, kS, kEv}, 2), nullptr, base);
       },
       "leading batch dimensions"},
      {"heads differ without GQA", [&] { forward(q, k3, v3, nullptr, base); }, "or enable_gqa"},
      {"GQA not divisible",
       [&] { forward(q, k3, v3, nullptr, with([](auto& o) { o.enable_gqa = true; })); },
       "multiple of key/value heads"},
      {"mask does not broadcast", [&] { forward(q, k, v, &mask_L, base); },
       "mask: expected a shape that broadcasts"},
      {"mask of higher rank", [&] { forward(q, k, v, &mask_int_like, base); }, "rank 5 > 4"},
      {"scale NaN",
       [&] {
         forward(q, k, v, nullptr,
                 with([](auto& o) { o.scale = std::numeric_limits<double>::quiet_NaN(); }));
       },
       "scale: expected a finite number"},
      {"scale -inf",
       [&] {
         forward(q, k, v, nullptr,
                 with([](auto& o) { o.scale = -std::numeric_limits<double>::infinity(); }));
       },
       "scale: expected a finite number"},
      {"causal out of its enumeration",
       [&] {
         forward(q, k, v, nullptr, with([](auto& o) { o.causal = static_cast<sdpa::Causal>(7); }));
       },
       "causal: expected none, upper-left or lower-right, got the value 7"},
      {"impl out of its enumeration",
       [&] {
         forward(q, k, v, nullptr, with([](auto& o) { o.impl = static_cast<sdpa::Impl>(9); }));
       },
       "impl: expected fast, reference or naive, got the value 9"},
      {"threads -1", [&] { forward(q, k, v, nullptr, with([](auto& o) { o.threads = -1; })); },
       "threads: expected"},
      {"threads 1025", [&] { forward(q, k, v, nullptr, with([](auto& o) { o.threads = 1025; })); },
       "threads: expected"},
      {"threads INT_MIN",
       [&] {
         forward(q, k, v, nullptr,
                 with([](auto& o) { o.threads = std::numeric_limits<int>::min(); }));
       },
       "threads: expected"},
      {"null data",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv});
         sdpa::attention_forward(sdpa::TensorRef{nullptr, DType::float32, q.shape()}, k, v, nullptr,
                                 base, out.mut());
       },
       "query: data pointer is null"},
      {"misaligned data",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv});
         const Array storage = random_array(DType::float32, {q.numel() + 1}, 4);
         const sdpa::TensorRef shifted{static_cast<const char*>(storage.data()) + 2, DType::float32,
                                       q.shape()};
         sdpa::attention_forward(shifted, k, v, nullptr, base, out.mut());
       },
       "query: expected a data pointer aligned to its element size (4 bytes)"},
      {"misaligned out",
       [&] {
         Array storage(DType::float64, {kB * kH * kL * kEv + 1});
         const sdpa::MutableTensorRef out{
             static_cast<char*>(storage.data()) + 4, DType::float64, {kB, kH, kL, kEv}};
         sdpa::attention_forward(random_array(DType::float64, q.shape(), 1),
                                 random_array(DType::float64, k.shape(), 2),
                                 random_array(DType::float64, v.shape(), 3), nullptr, base, out);
       },
       "out: expected a data pointer aligned to its element size (8 bytes)"},
      {"misaligned grad_out",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv}), lse(DType::float32, {kB, kH, kL});
         const Array storage = random_array(DType::float32, {kB * kH * kL * kEv + 1}, 4);
         const sdpa::TensorRef dout{
             static_cast<const char*>(storage.data()) + 1, DType::float32, {kB, kH, kL, kEv}};
         Array dq(DType::float32, q.shape()), dk(DType::float32, k.shape()),
             dv(DType::float32, v.shape());
         sdpa::attention_backward(q, k, v, nullptr, out, lse, dout, base, dq.mut(), dk.mut(),
                                  dv.mut());
       },
       "grad_out: expected a data pointer aligned"},
      {"out of the wrong shape",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv + 1});
         sdpa::attention_forward(q, k, v, nullptr, base, out.mut());
       },
       "out: expected shape (2, 4, 5, 6)"},
      {"out of the wrong dtype",
       [&] {
         Array out(DType::float64, {kB, kH, kL, kEv});
         sdpa::attention_forward(q, k, v, nullptr, base, out.mut());
       },
       "out: expected dtype float32"},
      {"lse of the wrong shape",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv}), lse(DType::float32, {kB, kH, kL + 1});
         const sdpa::MutableTensorRef l = lse.mut();
         sdpa::attention_forward(q, k, v, nullptr, base, out.mut(), &l);
       },
       "lse: expected shape"},
      {"grad_out of the wrong shape",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv}), lse(DType::float32, {kB, kH, kL});
         Array dout(DType::float32, {kB, kH, kL, kEv + 1});
         Array dq(DType::float32, q.shape()), dk(DType::float32, k.shape()),
             dv(DType::float32, v.shape());
         sdpa::attention_backward(q, k, v, nullptr, out, lse, dout, base, dq.mut(), dk.mut(),
                                  dv.mut());
       },
       "grad_out: expected shape"},
      {"grad_key of the wrong shape",
       [&] {
         Array out(DType::float32, {kB, kH, kL, kEv}), lse(DType::float32, {kB, kH, kL});
         Array dout(DType::float32, {kB, kH, kL, kEv});
         Array dq(DType::float32, q.shape()), dk(DType::float32, q.shape()),
             dv(DType::float32, v.shape());
         sdpa::attention_backward(q, k, v, nullptr, out, lse, dout, base, dq.mut(), dk.mut(),
                                  dv.mut());
       },
       "grad_key: expected shape"},
      {"negative dimension",
       [&] {
         Array out(DType::float32, {1, 1});
         sdpa::attention_forward(sdpa::TensorRef{nullptr, DType::float32, {-1, 1}},
                                 sdpa::TensorRef{nullptr, DType::float32, {-1, 1}},
                                 sdpa::TensorRef{nullptr, DType::float32, {-1, 1}}, nullptr, base,
                                 out.mut());
       },
       "expected non-negative dimensions"},
      {"parse_causal", [] { sdpa::parse_causal("causal"); }, "causal: expected"},
      {"parse_impl", [] { sdpa::parse_impl(""); }, "impl: expected"},
  };
  for (const auto& c : cases) {
    std::string message;
    try {
      c.call();
    } catch (const sdpa::Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(c.fragment), std::string::npos)
        << c.what << ": expected sdpa::Error with '" << c.fragment << "', got '" << message << "'";
  }
}

}  // namespace
