// Files and processes: outputs all-or-nothing (rollback of a failed rename, signals, full disks),
// outputs that are not regular files, inputs reached by another path, inputs that are FIFOs,
// long names, the umask; and the kinds and arguments of sdpa::Error. The tests that need root
// (bind mounts, chattr +i, a small tmpfs) skip with a note where the environment refuses them.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/test_util.h"
#include "cli_runner.h"
#include "core/options.h"
#include "core/problem.h"
#include "io/npy.h"
#include "io/output.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

namespace fs = std::filesystem;

// The sdpa program these tests run is built with the same flags as this test program.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif
#else
constexpr bool kUnderAddressSanitizer = false;
#endif
using sdpa::Array;
using sdpa::DType;
using sdpa::ErrorKind;
using sdpa::test::CliResult;
using sdpa::test::run_cli;

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sdpa_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    save("q.npy", sdpa::test::random_array(DType::float32, {1, 2, 5, 8}, 1));
    save("k.npy", sdpa::test::random_array(DType::float32, {1, 2, 7, 8}, 2));
    save("v.npy", sdpa::test::random_array(DType::float32, {1, 2, 7, 4}, 3));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void save(const std::string& name, const Array& a) const { sdpa::write_npy(path(name), a); }
  void text(const std::string& name, const std::string& content) const {
    std::ofstream(path(name), std::ios::binary) << content;
  }
  std::string read(const std::string& name) const { return sdpa::test::slurp(path(name)); }
  std::vector<std::string> base(const std::string& out) const {
    return {"attention", "--query",     path("q.npy"), "--key", path("k.npy"),
            "--value",   path("v.npy"), "--out",       out};
  }
  CliResult cli(const std::vector<std::string>& args, double timeout_s = 60) const {
    return run_cli(args, dir_.string(), timeout_s);
  }
  // Every temporary (.sdpa-XXXXXX) left anywhere under the test folder.
  std::vector<std::string> temporaries() const {
    std::vector<std::string> left;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      if (e.path().filename().string().rfind(".sdpa-", 0) == 0) left.push_back(e.path());
    }
    return left;
  }
  fs::path dir_;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}

// A 16-bit mask over float32 inputs is read as float32: --grad-sinks works and gives the same
// gradient as the mask saved as float32.
TEST_F(Files, GradSinksWithA16BitMaskOverFloat32Inputs) {
  const Array mask16 = sdpa::test::random_array(DType::float16, {1, 2, 5, 7}, 4);
  save("mask16.npy", mask16);
  save("mask32.npy", mask16.astype(DType::float32));
  save("sinks.npy", sdpa::test::random_array(DType::float32, {2}, 5));
  save("do.npy", sdpa::test::random_array(DType::float32, {1, 2, 5, 4}, 6));
  for (const std::string m : {"16", "32"}) {
    std::vector<std::string> args = base(path("out" + m + ".npy"));
    args.insert(args.end(), {"--mask", path("mask" + m + ".npy"), "--sinks", path("sinks.npy"),
                             "--grad-output", path("do.npy"), "--grad-query",
                             path("dq" + m + ".npy"), "--grad-sinks", path("ds" + m + ".npy")});
    const CliResult r = cli(args);
    ASSERT_EQ(r.status, 0) << "mask float" << m << ": " << r.err;
  }
  EXPECT_EQ(read("ds16.npy"), read("ds32.npy"));
  EXPECT_EQ(read("dq16.npy"), read("dq32.npy"));
  EXPECT_EQ(read("out16.npy"), read("out32.npy"));
}

// ---- the commit: all or nothing ----------------------------------------------------------------

// A rename that fails after others succeeded puts every replaced target back (the old file where
// there was one, nothing where there was none), and leaves no temporary or backup behind.
TEST_F(Files, FailedRenameRollsBackTheOutputsAlreadyReplaced) {
  const Array a = sdpa::test::random_array(DType::float32, {3}, 4);
  for (std::size_t fail_at : {0u, 1u, 2u}) {
    text("a.npy", "old a");
    fs::remove(path("b.npy"));
    text("c.npy", "old c");
    sdpa::io::testing::fail_rename_at(fail_at);
    try {
      sdpa::write_npy_all({{path("a.npy"), a}, {path("b.npy"), a}, {path("c.npy"), a}});
      ADD_FAILURE() << "the injected failure at " << fail_at << " did not throw";
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::io) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot move the finished file into place"),
                std::string::npos)
          << e.what();
    }
    sdpa::io::testing::fail_rename_at(std::nullopt);
    EXPECT_EQ(read("a.npy"), "old a") << "failure at " << fail_at;
    EXPECT_FALSE(fs::exists(path("b.npy"))) << "failure at " << fail_at;
    EXPECT_EQ(read("c.npy"), "old c") << "failure at " << fail_at;
    EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
  }
  // Without the injection the same call replaces all three.
  sdpa::write_npy_all({{path("a.npy"), a}, {path("b.npy"), a}, {path("c.npy"), a}});
  EXPECT_EQ(sdpa::read_npy(path("c.npy")).shape(), a.shape());
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// The same through the program and a real refusal of the file system: the second output is
// immutable (chattr +i), so its rename fails after --out was replaced; --out must be put back.
TEST_F(Files, ImmutableSecondOutputLeavesTheFirstUntouched) {
  text("out.npy", "old out");
  text("lse.npy", "old lse");
  if (std::system(("chattr +i " + path("lse.npy") + " 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "chattr +i is not permitted here (needs root and ext2/3/4, XFS or btrfs)";
  }
  std::vector<std::string> args = base(path("out.npy"));
  args.insert(args.end(), {"--lse", path("lse.npy")});
  const CliResult r = cli(args);
  std::system(("chattr -i " + path("lse.npy")).c_str());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("sdpa: error: --lse:"), std::string::npos) << r.err;
  EXPECT_EQ(read("out.npy"), "old out");
  EXPECT_EQ(read("lse.npy"), "old lse");
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// A target that is a mount point (a file bind-mounted over it) refuses the rename with EBUSY.
TEST_F(Files, BusySecondOutputLeavesTheFirstUntouched) {
  text("out.npy", "old out");
  text("lse.npy", "old lse");
  text("cover", "cover");
  if (::mount(path("cover").c_str(), path("lse.npy").c_str(), nullptr, MS_BIND, nullptr) != 0) {
    GTEST_SKIP() << "mount --bind is not permitted here (needs root): " << std::strerror(errno);
  }
  std::vector<std::string> args = base(path("out.npy"));
  args.insert(args.end(), {"--lse", path("lse.npy")});
  const CliResult r = cli(args);
  ::umount(path("lse.npy").c_str());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--lse"), std::string::npos) << r.err;
  EXPECT_EQ(read("out.npy"), "old out");
  EXPECT_EQ(read("lse.npy"), "old lse");
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// ---- signals -----------------------------------------------------------------------------------

// SIGINT, SIGTERM or SIGHUP during a run: the program dies of that signal, its temporaries are
// gone and the previous output is intact. Inputs of (1, 4, 1536, 64) under the float64 reference
// on one thread take about a second, so the signal lands while it reads or computes.
TEST_F(Files, SignalsRemoveTheTemporariesAndKeepTheOldOutput) {
  save("big_q.npy", sdpa::test::random_array(DType::float32, {1, 4, 1536, 64}, 1));
  save("big_k.npy", sdpa::test::random_array(DType::float32, {1, 4, 1536, 64}, 2));
  save("big_v.npy", sdpa::test::random_array(DType::float32, {1, 4, 1536, 64}, 3));
  // SIGSEGV and SIGABRT stand for a crash: the temporaries go with the process. Under
  // AddressSanitizer SIGSEGV belongs to the sanitizer's handler, which the program leaves in
  // place (it reports the fault and exits 1), so only SIGABRT stands for a crash there.
  std::vector<int> signals = {SIGINT, SIGTERM, SIGHUP, SIGABRT};
  if (!kUnderAddressSanitizer) signals.push_back(SIGSEGV);
  for (int sig : signals) {
    text("out.npy", "old out");
    fs::remove(path("lse.npy"));
    const pid_t pid = sdpa::test::start_cli(
        {"attention", "--query", path("big_q.npy"), "--key", path("big_k.npy"), "--value",
         path("big_v.npy"), "--out", path("out.npy"), "--lse", path("lse.npy"), "--impl",
         "reference", "--threads", "1"},
        dir_.string());
    // Wait until both temporaries exist (the program creates them before reading), then a
    // little longer, so that the signal interrupts the work.
    const auto t0 = std::chrono::steady_clock::now();
    while (temporaries().size() < 2 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(temporaries().size(), 2u) << "signal " << sig << ": the temporaries never appeared";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::kill(pid, sig);
    const CliResult r = sdpa::test::finish_cli(pid, dir_.string());
    EXPECT_EQ(r.status, 128 + sig)
        << "signal " << sig << ": " << r.err << " (0 means the run finished before the signal)";
    EXPECT_TRUE(temporaries().empty()) << "signal " << sig << ": " << joined(temporaries());
    EXPECT_EQ(read("out.npy"), "old out") << "signal " << sig;
    EXPECT_FALSE(fs::exists(path("lse.npy"))) << "signal " << sig;
  }
}

// ---- full disks
// ----------------------------------------------------------------------------------

// A write that fails (EFBIG under RLIMIT_FSIZE, which works everywhere; ENOSPC on a 64 KiB tmpfs
// where mounting is permitted) is exit 2 naming --out, with nothing left behind.
TEST_F(Files, FullDiskIsExitTwoNamingTheOutput) {
  save("big_q.npy", sdpa::test::random_array(DType::float32, {1, 1, 4096, 16}, 1));
  save("big_k.npy", sdpa::test::random_array(DType::float32, {1, 1, 64, 16}, 2));
  save("big_v.npy", sdpa::test::random_array(DType::float32, {1, 1, 64, 16}, 3));
  text("out.npy", "old out");
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"attention",       "--query",         path("big_q.npy"),
                                    "--key",           path("big_k.npy"), "--value",
                                    path("big_v.npy"), "--out",           out};
  };
  {
    // The child inherits the limit and SIGXFSZ ignored (so write() fails with EFBIG instead of
    // killing it); this process gets its own settings back at once.
    rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit small = old;
    small.rlim_cur = 64 * 1024;  // the output holds 256 KiB
    struct sigaction ignore {
    }, previous{};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ignore, &previous);
    setrlimit(RLIMIT_FSIZE, &small);
    const pid_t pid = sdpa::test::start_cli(args(path("out.npy")), dir_.string());
    setrlimit(RLIMIT_FSIZE, &old);
    sigaction(SIGXFSZ, &previous, nullptr);
    const CliResult r = sdpa::test::finish_cli(pid, dir_.string());
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("sdpa: error: --out: cannot write the output file"), std::string::npos)
        << r.err;
    EXPECT_EQ(read("out.npy"), "old out");
    EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
  }
  fs::create_directories(path("small"));
  if (::mount("tmpfs", path("small").c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "mounting a tmpfs is not permitted here (needs root); the RLIMIT_FSIZE case "
                    "ran";
  }
  const CliResult r = cli(args(path("small/out.npy")));
  const bool left = fs::exists(path("small/out.npy")) || !fs::is_empty(path("small"));
  ::umount(path("small").c_str());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  EXPECT_FALSE(left) << "a file was left on the full file system";
}

// ---- targets that are not regular files
// ----------------------------------------------------------

// As root, a program without this guarantee would replace the machine's own /dev/null, so the
// device nodes the test offers are private copies (mknod, root only); without root it uses
// /dev/null and /dev/full themselves, which it then has no right to replace anyway.
TEST_F(Files, NonRegularOutputsAreRefusedNeverReplaced) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  std::vector<std::string> targets = {path("fifo")};
  if (::geteuid() == 0) {
    ASSERT_EQ(::mknod(path("null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    ASSERT_EQ(::mknod(path("full").c_str(), S_IFCHR | 0666, makedev(1, 7)), 0);
    targets.insert(targets.end(), {path("null"), path("full")});
  } else {
    targets.insert(targets.end(), {"/dev/null", "/dev/full"});
  }
  for (const std::string& target : targets) {
    struct stat before {};
    ASSERT_EQ(::lstat(target.c_str(), &before), 0);
    const CliResult r = cli(base(target), 20);
    EXPECT_FALSE(r.timed_out) << target;
    EXPECT_EQ(r.status, 2) << target << ": " << r.err;
    EXPECT_NE(r.err.find("--out: expected a regular file or a new path"), std::string::npos)
        << r.err;
    struct stat after {};
    ASSERT_EQ(::lstat(target.c_str(), &after), 0);
    EXPECT_EQ(after.st_ino, before.st_ino) << target << " was replaced";
    EXPECT_EQ(after.st_mode, before.st_mode) << target << " changed type or mode";
  }
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// A symbolic link is followed: the file it points to is replaced, the link stays a link. A link
// to a missing file is refused.
TEST_F(Files, SymlinkOutputReplacesItsTargetAndStays) {
  text("real.npy", "old");
  fs::create_symlink(path("real.npy"), path("link.npy"));
  const CliResult r = cli(base(path("link.npy")));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(path("link.npy")));
  EXPECT_EQ(sdpa::read_npy(path("real.npy")).shape(), (std::vector<std::int64_t>{1, 2, 5, 4}));
  fs::create_symlink(path("missing.npy"), path("dangling.npy"));
  const CliResult d = cli(base(path("dangling.npy")));
  EXPECT_EQ(d.status, 2) << d.err;
  EXPECT_NE(d.err.find("symbolic link to a missing file"), std::string::npos) << d.err;
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// New outputs get 0666 minus the umask; a replaced file keeps its mode.
TEST_F(Files, OutputsHonourTheUmask) {
  const mode_t old = ::umask(077);  // inherited by the child
  const CliResult r = cli(base(path("new.npy")));
  ::umask(027);
  text("kept.npy", "old");
  ::chmod(path("kept.npy").c_str(), 0604);
  const CliResult k = cli(base(path("kept.npy")));
  ::umask(old);
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(k.status, 0) << k.err;
  struct stat st {};
  ASSERT_EQ(::stat(path("new.npy").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(path("kept.npy").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0604u);
}

// A valid 255-byte name (NAME_MAX) is written: the temporary's name is short, not name + suffix.
TEST_F(Files, LongestValidNameIsWritten) {
  for (std::size_t length : {254u, 255u}) {
    const std::string name = std::string(length - 4, 'n') + ".npy";
    const CliResult r = cli(base(path(name)));
    EXPECT_EQ(r.status, 0) << length << ": " << r.err;
    EXPECT_TRUE(fs::exists(path(name))) << length;
  }
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// ---- inputs ------------------------------------------------------------------------------------

// An output that is an input under another path (a hard link; a bind mount where permitted) is
// refused: files are compared by device and inode, not by path.
TEST_F(Files, InputReachedThroughAnotherPathIsNeverOverwritten) {
  const std::string q = read("q.npy");
  fs::create_hard_link(path("q.npy"), path("q_link.npy"));
  const CliResult r = cli(base(path("q_link.npy")));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--out: expected an output path different from every input"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read("q.npy"), q);
  fs::create_directories(path("a"));
  fs::create_directories(path("b"));
  fs::copy_file(path("k.npy"), path("a/k.npy"));
  if (::mount(path("a").c_str(), path("b").c_str(), nullptr, MS_BIND, nullptr) != 0) {
    GTEST_SKIP() << "mount --bind is not permitted here (needs root); the hard link case ran";
  }
  std::vector<std::string> args = base(path("out.npy"));
  args[4] = path("a/k.npy");
  args.insert(args.end(), {"--lse", path("b/k.npy")});
  const CliResult m = cli(args);
  ::umount(path("b").c_str());
  EXPECT_EQ(m.status, 2) << m.err;
  EXPECT_NE(m.err.find("--lse: expected an output path different from every input"),
            std::string::npos)
      << m.err;
  EXPECT_EQ(read("a/k.npy"), read("k.npy"));
}

// A FIFO (or a device) as input is refused at once; opening it for reading used to wait forever.
TEST_F(Files, FifoInputIsRefusedWithoutHanging) {
  ASSERT_EQ(::mkfifo(path("fifo.npy").c_str(), 0644), 0);
  std::vector<std::string> args = base(path("out.npy"));
  args[2] = path("fifo.npy");
  const CliResult r = cli(args, 20);
  EXPECT_FALSE(r.timed_out) << "sdpa attention hung on a FIFO";
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("expected a regular file, got a FIFO"), std::string::npos) << r.err;
  EXPECT_THROW(sdpa::read_npy("/dev/zero"), sdpa::Error);
  EXPECT_FALSE(fs::exists(path("out.npy")));
}

// ---- messages that name their argument
// -----------------------------------------------------------

TEST_F(Files, MessagesNameTheirArgument) {
  struct Case {
    std::vector<std::string> args;
    std::string fragment;
  };
  std::vector<std::string> threads = base(path("out.npy"));
  threads.insert(threads.end(), {"--threads", "1e9"});
  const std::vector<Case> cases = {
      {base(""), "sdpa: error: --out: expected a file path, got an empty string"},
      {threads, "sdpa: error: --threads: expected 0 (one per core) or 1..1024, got 1e9"},
      {{"lab", "softmax", "--threads", "2000"}, "sdpa: error: --threads: expected 0"},
      {{"bench", "--threads", "x"}, "sdpa: error: --threads: expected 0"},
  };
  for (const auto& c : cases) {
    const CliResult r = cli(c.args);
    EXPECT_EQ(r.status, 2) << joined(c.args) << ": " << r.err;
    EXPECT_NE(r.err.find(c.fragment), std::string::npos) << joined(c.args) << ": " << r.err;
  }
}

// Seeds: decimal integers in [0, 2^64 - 1] only, for every command that takes one.
TEST_F(Files, SeedsAreValidatedEverywhere) {
  for (const std::string bad :
       {"-1", "", "18446744073709551616", "1e23", "-1e23", "0x10", " 1", "1.5"}) {
    EXPECT_THROW(sdpa::detail::parse_seed(bad, "--seed"), sdpa::Error) << "'" << bad << "'";
    for (const std::string command : {"lab", "report", "bench"}) {
      std::vector<std::string> args =
          command == "lab" ? std::vector<std::string>{"lab", "softmax"}
          : command == "report"
              ? std::vector<std::string>{"report", "--out", path("report")}
              : std::vector<std::string>{"bench", "--seq", "4", "--dropout", "0.5"};
      args.insert(args.end(), {"--seed", bad});
      const CliResult r = cli(args);
      EXPECT_EQ(r.status, 2) << command << " '" << bad << "': " << r.err;
      EXPECT_NE(r.err.find("sdpa: error: --seed: expected an integer in [0, 2^64-1]"),
                std::string::npos)
          << command << " '" << bad << "': " << r.err;
    }
  }
  EXPECT_EQ(sdpa::detail::parse_seed("18446744073709551615", "--seed"), ~std::uint64_t{0});
  EXPECT_EQ(sdpa::detail::parse_seed("0", "--seed"), 0u);
  EXPECT_FALSE(fs::exists(path("report")));
}

// bench refuses what it would not time: a size of 0 (BenchConfig's "default"), decode options
// it would ignore; the API's parameters are named as its flags.
TEST_F(Files, BenchRefusesWhatItWouldNotTime) {
  struct Case {
    std::vector<std::string> args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      // 0 is a size here, not "the default".
      {{"bench", "--kv-seq", "0"}, "sdpa: error: --kv-seq: expected a positive integer, got 0"},
      {{"bench", "--value-dim", "0"}, "sdpa: error: --value-dim: expected a positive integer"},
      {{"bench", "--kv-heads", "0"}, "sdpa: error: --kv-heads: expected a positive integer"},
      // The decode benchmark times the fast forward only.
      {{"bench", "--kv-cache", "--backward"},
       "sdpa: error: --kv-cache: expected without --backward and with --impl fast"},
      {{"bench", "--kv-cache", "--impl", "naive"}, "(the decode benchmark times the fast "},
      {{"bench", "--kv-cache", "--impl", "reference"}, "got --impl reference"},
      {{"bench", "--kv-lens", "5,7"}, "sdpa: error: --kv-lens: expected only with --kv-cache"},
      {{"bench", "--kv-dtype", "float16"}, "sdpa: error: --kv-dtype: expected only with"},
      // The API's parameters, named as the flags.
      {{"bench", "--seq", "4", "--window", "2,-2"}, "sdpa: error: --window: "},
      {{"bench", "--seq", "4", "--dropout", "1"}, "sdpa: error: --dropout: expected a probability"},
      {{"bench", "--seq", "4", "--softcap", "-1"}, "sdpa: error: --softcap: expected 0 (off)"},
  };
  for (const auto& c : cases) {
    const CliResult r = cli(c.args);
    EXPECT_EQ(r.status, 2) << joined(c.args) << ": " << r.err;
    EXPECT_NE(r.err.find(c.fragment), std::string::npos) << joined(c.args) << ": " << r.err;
  }
}

// ---- the report --------------------------------------------------------------------------------

// --out in a read-only place fails before the lab runs (seconds, not minutes), exit 2.
TEST_F(Files, ReportIntoAReadOnlyPlaceFailsFirst) {
  fs::create_directories(path("ro"));
  const bool bound =
      ::mount(path("ro").c_str(), path("ro").c_str(), nullptr, MS_BIND, nullptr) == 0 &&
      ::mount(nullptr, path("ro").c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
  if (!bound) ::chmod(path("ro").c_str(), 0555);  // enough where this is not root
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = cli({"report", "--out", path("ro/report")}, 120);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bound) ::umount(path("ro").c_str());
  ::chmod(path("ro").c_str(), 0755);
  if (!bound && ::geteuid() == 0) GTEST_SKIP() << "root ignores 0555 and mounting is refused";
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("sdpa: error: --out: cannot create a folder beside"), std::string::npos)
      << r.err;
  EXPECT_LT(seconds, 30) << "the lab ran before the check";
}

// A report interrupted while its lab runs leaves no temporary folder and keeps the old report.
TEST_F(Files, InterruptedReportLeavesNoTemporaryFolder) {
  fs::create_directories(path("report"));
  text("report/index.html", "old report");
  const pid_t pid =
      sdpa::test::start_cli({"report", "--out", path("report"), "--threads", "1"}, dir_.string());
  const auto t0 = std::chrono::steady_clock::now();
  while (temporaries().empty() &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(temporaries().size(), 1u) << "the report's temporary folder never appeared";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(pid, SIGTERM);
  const CliResult r = sdpa::test::finish_cli(pid, dir_.string());
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
  EXPECT_EQ(read("report/index.html"), "old report");
}

// --from with invalid or absurdly nested JSON: exit 2 naming --from, no crash.
TEST_F(Files, ReportFromBadJsonIsExitTwo) {
  fs::create_directories(path("from"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(200000, '[') + std::string(200000, ']'), "nested more than 64 levels"},
      {"{\"experiment\": ", "is not valid JSON"},
  };
  for (const auto& [content, fragment] : cases) {
    text("from/softmax.json", content);
    const CliResult r = cli({"report", "--from", path("from"), "--out", path("report")});
    EXPECT_EQ(r.status, 2) << fragment << ": " << r.err;
    EXPECT_NE(r.err.find("sdpa: error: --from: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(path("report")));
    EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
  }
  fs::remove(path("from/softmax.json"));
  ASSERT_EQ(::mkfifo(path("from/softmax.json").c_str(), 0644), 0);
  const CliResult r = cli({"report", "--from", path("from"), "--out", path("report")}, 20);
  EXPECT_FALSE(r.timed_out) << "report --from hung on a FIFO";
  EXPECT_EQ(r.status, 2) << r.err;
}

// --from '' names no folder: exit 2 at once, not a whole lab run.
TEST_F(Files, ReportFromEmptyIsExitTwo) {
  const CliResult r = cli({"report", "--from", "", "--out", path("report")}, 20);
  EXPECT_FALSE(r.timed_out) << "report --from '' ran the lab";
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("sdpa: error: --from: expected a folder"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("report")));
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// --from with valid JSON of another shape than the lab's and the benchmark's: exit 2 naming
// --from and the file, nothing written.
TEST_F(Files, ReportFromJsonOfTheWrongShapeIsExitTwo) {
  fs::create_directories(path("from"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench.json", "{\"rows\": [1]}"},
      {"bench.json", "{\"rows\": {}}"},
      {"bench.json", "{\"rows\": \"x\"}"},
      {"bench.json", "{\"accuracy\": {\"impls\": {\"fast\": {\"dq\": null}}}, \"rows\": []}"},
      {"bench.json", "[]"},
      {"softmax.json", "[1, 2]"},
      {"softmax.json", "{\"tables\": {\"sweep\": [1, 2]}}"},
      {"saturation.json", "{\"tables\": {\"alternatives\": [[]]}}"},
  };
  for (const auto& [file, content] : cases) {
    fs::remove_all(path("from"));
    fs::create_directories(path("from"));
    text("from/" + file, content);
    const CliResult r = cli({"report", "--from", path("from"), "--out", path("report")});
    EXPECT_EQ(r.status, 2) << content << ": " << r.err;
    EXPECT_NE(r.err.find("sdpa: error: --from: " + path("from/" + file) + ": expected "),
              std::string::npos)
        << content << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("report"))) << content;
    EXPECT_TRUE(temporaries().empty()) << content << ": " << joined(temporaries());
  }
}

// A saturation table whose rows hold no numeric d: the section says so, the rest is written.
TEST_F(Files, ReportFromTableWithoutItsColumnsIsShownAsMissing) {
  fs::create_directories(path("from"));
  text("from/saturation.json", "{\"tables\": {\"alternatives\": [{}]}}");
  const CliResult r = cli({"report", "--from", path("from"), "--out", path("report")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("has no row with a numeric `d`"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(path("report/index.html")));
  EXPECT_TRUE(temporaries().empty()) << joined(temporaries());
}

// ---- sdpa::Error's kind and argument
// -------------------------------------------------------------

TEST(ErrorKinds, EachThrowSiteSaysItsKindAndArgument) {
  using sdpa::test::random_array;
  const Array q = random_array(DType::float32, {1, 2, 5, 8}, 1);
  const Array k = random_array(DType::float32, {1, 2, 7, 8}, 2);
  const Array v = random_array(DType::float32, {1, 2, 7, 4}, 3);
  auto forward = [&](const Array& q_, const Array& k_, const Array* mask,
                     sdpa::AttentionOptions o) {
    Array out(DType::float32, {1, 2, q_.shape()[2], 4});
    const sdpa::TensorRef m = mask != nullptr ? mask->ref() : sdpa::TensorRef{};
    sdpa::attention_forward(q_, k_, v, mask != nullptr ? &m : nullptr, o, out.mut());
  };
  auto caught = [](auto f) -> std::pair<ErrorKind, std::string> {
    try {
      f();
    } catch (const sdpa::Error& e) {
      return {e.kind(), e.argument()};
    }
    return {ErrorKind::bad_value, "<nothing thrown>"};
  };
  const Array q64 = random_array(DType::float64, {1, 2, 5, 8}, 1);
  const Array k_bad = random_array(DType::float32, {1, 2, 7, 9}, 2);
  const Array mask_int = random_array(DType::boolean, {3, 7}, 2);
  sdpa::AttentionOptions nan_scale;
  nan_scale.scale = std::nan("");
  using P = std::pair<ErrorKind, std::string>;
  EXPECT_EQ(caught([&] { forward(q64, k, nullptr, {}); }), P(ErrorKind::bad_type, "key/value"));
  EXPECT_EQ(caught([&] { forward(q, k_bad, nullptr, {}); }), P(ErrorKind::bad_shape, "key"));
  EXPECT_EQ(caught([&] { forward(q, k, &mask_int, {}); }), P(ErrorKind::bad_shape, "mask"));
  EXPECT_EQ(caught([&] { forward(q, k, nullptr, nan_scale); }), P(ErrorKind::bad_value, "scale"));
  EXPECT_EQ(caught([] { sdpa::read_npy("/nonexistent/q.npy"); }),
            P(ErrorKind::io, "/nonexistent/q.npy"));
  EXPECT_EQ(caught([] { sdpa::detail::check_allocation(std::int64_t{1} << 62, "x"); }),
            P(ErrorKind::resources, "x"));
  // Still a std::invalid_argument for older catches.
  EXPECT_THROW(forward(q, k_bad, nullptr, {}), std::invalid_argument);
}

// A mask dimension that must be 1 says "expected 1", never "expected 1 or 1".
TEST(ErrorKinds, MaskBroadcastMessageNeverSaysOneOrOne) {
  using sdpa::test::random_array;
  const Array q = random_array(DType::float32, {1, 8}, 1);  // L = 1
  const Array k = random_array(DType::float32, {7, 8}, 2);
  const Array v = random_array(DType::float32, {7, 4}, 3);
  const Array mask = random_array(DType::boolean, {2, 7}, 4);
  Array out(DType::float32, {1, 4});
  const sdpa::TensorRef m = mask.ref();
  std::string message;
  try {
    sdpa::attention_forward(q, k, v, &m, {}, out.mut());
  } catch (const sdpa::Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("(dimension 0 is 2, expected 1)"), std::string::npos) << message;
  EXPECT_EQ(message.find("1 or 1"), std::string::npos) << message;
}

// naive's L x S scratch goes through the memory check: a clear error of kind resources, never a
// bare std::bad_alloc. L = S = 2^20 with E = Ev = 1: 4 MiB inputs, 4 TiB of scores.
TEST(ErrorKinds, NaiveScratchIsCheckedAgainstMemory) {
  const std::int64_t n = std::int64_t{1} << 20;
  const Array q(DType::float32, {1, 1, n, 1}), k(DType::float32, {1, 1, n, 1});
  const Array v(DType::float32, {1, 1, n, 1});
  Array out(DType::float32, {1, 1, n, 1});
  sdpa::AttentionOptions o;
  o.impl = sdpa::Impl::naive;
  o.threads = 1;
  try {
    sdpa::attention_forward(q, k, v, nullptr, o, out.mut());
    ADD_FAILURE() << "a 4 TiB scratch was accepted";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::resources) << e.what();
    EXPECT_NE(std::string(e.what()).find("L x S scratch"), std::string::npos) << e.what();
  }
  Array lse(DType::float32, {1, 1, n}), dout(DType::float32, {1, 1, n, 1});
  Array dq(DType::float32, {1, 1, n, 1}), dk(DType::float32, {1, 1, n, 1}),
      dv(DType::float32, {1, 1, n, 1});
  try {
    sdpa::attention_backward(q, k, v, nullptr, out, lse, dout, o, dq.mut(), dk.mut(), dv.mut());
    ADD_FAILURE() << "an 8 TiB scratch was accepted";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::resources) << e.what();
  }
}

// A misspelt or missing subcommand is named, with the subcommands there are.
TEST_F(Files, UnknownSubcommandIsNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{"atention", "--query", "q.npy"},
       "sdpa: error: expected a subcommand (attention, softmax, bench, lab, report"},
      {{"atention"}, "), got 'atention'"},
      {{}, "), got none"},
  };
  for (const auto& c : cases) {
    const CliResult r = cli(c.args);
    EXPECT_EQ(r.status, 2) << joined(c.args) << ": " << r.err;
    EXPECT_NE(r.err.find(c.fragment), std::string::npos) << joined(c.args) << ": " << r.err;
  }
}

}  // namespace
