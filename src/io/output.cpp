// All-or-nothing outputs and the signal handler that removes their temporaries (io/output.h).
#include "io/output.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

#include "sdpa/sdpa.h"

namespace sdpa::io {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int e) { return std::strerror(e); }

// ---- the registry the signal handler reads ---------------------------------------------------
// Fixed storage: the handler may not allocate. 64 slots hold every temporary of the largest
// command (sdpa attention: 5 files, the report: 1 folder) many times over.
constexpr int kSlots = 64;
enum SlotState : int { kFree = 0, kFile = 1, kFolder = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
Slot g_slots[kSlots];
std::atomic<int> g_committing{0};      // > 0 while a commit() renames: signals wait
std::atomic<int> g_pending_signal{0};  // the signal that arrived meanwhile
std::mutex g_registry_mutex;           // between threads registering; never taken by the handler
std::once_flag g_handlers_once;
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
// A crash (a bad pointer, an abort) removes the temporaries too, at once: the faulting
// instruction would fault again if the handler returned to wait for a commit's renames.
constexpr int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

bool is_fault(int sig) {
  for (int f : kFaultSignals) {
    if (f == sig) return true;
  }
  return false;
}

// Removes the folder at `dirfd`'s `name` with its contents, async-signal-safely (open, the raw
// getdents64 system call, unlinkat; no allocation). Depth-limited: the report's folder is 2 deep.
void remove_tree_at(int dirfd, const char* name, int depth) {
  if (::unlinkat(dirfd, name, 0) == 0 || depth > 8) return;
  const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buffer[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
    if (n <= 0) break;
    bool removed_any = false;
    for (long off = 0; off < n;) {
      struct Entry {
        ino64_t d_ino;
        off64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[1];
      };
      const auto* e = reinterpret_cast<const Entry*>(buffer + off);
      off += e->d_reclen;
      const char* child = e->d_name;
      if (std::strcmp(child, ".") == 0 || std::strcmp(child, "..") == 0) continue;
      if (::unlinkat(fd, child, 0) != 0) remove_tree_at(fd, child, depth + 1);
      removed_any = true;
    }
    // Entries were removed while reading: start again from the beginning.
    if (removed_any) ::lseek(fd, 0, SEEK_SET);
  }
  ::close(fd);
  ::unlinkat(dirfd, name, AT_REMOVEDIR);
}

void remove_registered() {
  for (Slot& s : g_slots) {
    const int state = s.state.load();
    if (state == kFile) ::unlink(s.path);
    if (state == kFolder) remove_tree_at(AT_FDCWD, s.path, 0);
  }
}

void on_signal(int sig) {
  const int saved_errno = errno;
  if (g_committing.load() > 0 && !is_fault(sig)) {
    g_pending_signal.store(sig);  // commit() re-raises it when the renames are done
    errno = saved_errno;
    return;
  }
  remove_registered();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  // SA_NODEFER: the signal is not blocked here, so this delivers it now, with its default action.
  ::raise(sig);
  errno = saved_errno;
}

void install_handler(int sig) {
  struct sigaction old {};
  if (::sigaction(sig, nullptr, &old) != 0) return;
  // Leave ignored signals ignored (nohup) and handlers someone else installed (Python's SIGINT)
  // alone: only the default action would leave the temporaries behind.
  if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_NODEFER;
  ::sigaction(sig, &sa, nullptr);
}

void install_handlers() {
  for (int sig : kSignals) install_handler(sig);
  for (int sig : kFaultSignals) install_handler(sig);
}

int register_temporary(const std::string& path, SlotState state) {
  std::call_once(g_handlers_once, install_handlers);
  if (path.size() >= PATH_MAX) return -1;  // such a path cannot have been created
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (g_slots[i].state.load() != kFree) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(state);  // published after the path is complete
    return i;
  }
  return -1;  // all slots taken: still removed on error, only not on a signal
}

void unregister(int slot) {
  if (slot >= 0) g_slots[slot].state.store(kFree);
}

// Blocks SIGINT, SIGTERM and SIGHUP in this thread while a temporary is created and registered,
// so that no signal falls between the two (a file the handler does not know of yet).
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kSignals) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  BlockSignals(const BlockSignals&) = delete;
  BlockSignals& operator=(const BlockSignals&) = delete;

 private:
  sigset_t old_;
};

std::optional<std::size_t> g_fail_rename_at;

// A fresh name `.sdpa-XXXXXX` in `dir` (6 random letters and digits: 62^6 names).
std::string random_name(const std::string& dir) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          static_cast<std::uint64_t>(::getpid())};
  std::string name = ".sdpa-";
  for (int i = 0; i < 6; ++i) name.push_back(kChars[rng() % (sizeof kChars - 1)]);
  return dir.empty() ? name : dir + "/" + name;
}

mode_t process_umask() {
  static const mode_t mask = [] {
    const mode_t m = ::umask(022);
    ::umask(m);
    return m;
  }();
  return mask;
}

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? path : p.string();
}

}  // namespace

struct OutputCommit::Output {
  std::string argument, target;  // target: symbolic links resolved
  std::string temporary;         // file or folder beside the target
  std::string backup;            // the old target while commit() runs
  bool folder = false;
  bool existed = false;
  std::optional<FileId> id;
  int fd = -1;
  int slot = -1;
};

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

int open_regular_for_reading(const std::string& path, const std::string& argument) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw Error(ErrorKind::io, argument,
                fmt::format("cannot open {} for reading: {}", path, errno_text(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    // read_npy names the file as the argument; other callers name a flag and need the path.
    throw Error(ErrorKind::io, argument,
                argument == path
                    ? fmt::format("expected a regular file, got {}", file_type(st.st_mode))
                    : fmt::format("expected a regular file, got {} which is {}", path,
                                  file_type(st.st_mode)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void remove_temporaries_now() noexcept { remove_registered(); }

OutputCommit::OutputCommit() = default;

OutputCommit::~OutputCommit() {
  if (!committed_) discard();
}

void OutputCommit::protect_input(const std::string& argument, const std::string& path) {
  if (const auto id = file_id(path)) inputs_.emplace_back(argument, *id);
}

std::size_t OutputCommit::add_file(const std::string& argument, const std::string& path) {
  if (path.empty()) {
    throw Error(ErrorKind::bad_value, argument, "expected a file path, got an empty string");
  }
  Output o;
  o.argument = argument;
  o.target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // Replace the file the link points to, and keep the link.
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) {
      throw Error(ErrorKind::io, argument,
                  fmt::format("expected a file or a new path, got {}, a symbolic link to a "
                              "missing file",
                              path));
    }
    o.target = resolved;
  }
  if (::stat(o.target.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      if (S_ISDIR(st.st_mode)) {
        throw Error(ErrorKind::io, argument,
                    fmt::format("expected a file to write, found a directory at {}", path));
      }
      throw Error(ErrorKind::io, argument,
                  fmt::format("expected a regular file or a new path, got {} which is {}; "
                              "refusing to replace it",
                              path, file_type(st.st_mode)));
    }
    o.existed = true;
    o.id = FileId{st.st_dev, st.st_ino};
    for (const auto& [in_argument, in_id] : inputs_) {
      if (*o.id == in_id) {
        throw Error(ErrorKind::bad_value, argument,
                    fmt::format("expected an output path different from every input, got {} "
                                "which is also {}",
                                path, in_argument));
      }
    }
  } else if (errno != ENOENT) {
    const int e = errno;
    if (e == ENOTDIR) {
      throw Error(ErrorKind::io, argument,
                  fmt::format("expected a path in an existing directory, got {}", path));
    }
    throw Error(ErrorKind::io, argument, fmt::format("cannot examine {}: {}", path, errno_text(e)));
  } else {
    struct stat dir {};
    if (::stat(parent_of(o.target).c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode)) {
      throw Error(ErrorKind::io, argument,
                  fmt::format("expected a path in an existing directory, got {}", path));
    }
  }
  const std::string absolute = absolute_path(o.target);
  for (const Output& other : outputs_) {
    if (absolute_path(other.target) == absolute || (o.id && other.id && *o.id == *other.id)) {
      throw Error(ErrorKind::bad_value, argument,
                  fmt::format("expected a path no other output uses, got {} which is also {}", path,
                              other.argument));
    }
  }

  // The temporary: mkstemp gives 0600; an output is an ordinary file, so it gets the mode a new
  // file would get (0666 minus the umask), or the mode of the file it replaces.
  const std::string dir = parent_of(o.target);
  std::call_once(g_handlers_once, install_handlers);
  const BlockSignals block;
  for (int attempt = 0; attempt < 100 && o.fd < 0; ++attempt) {
    o.temporary = random_name(dir);
    o.fd = ::open(o.temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (o.fd < 0 && errno != EEXIST) break;
  }
  if (o.fd < 0) {
    const int e = errno;
    throw Error(ErrorKind::io, argument,
                fmt::format("cannot create the output file beside {}: {}", path, errno_text(e)));
  }
  o.slot = register_temporary(o.temporary, kFile);
  const mode_t mode = o.existed ? (st.st_mode & 07777) : (0666 & ~process_umask());
  ::fchmod(o.fd, mode);
  outputs_.push_back(std::move(o));
  return outputs_.size() - 1;
}

std::size_t OutputCommit::add_directory(const std::string& argument, const std::string& path) {
  if (path.empty()) {
    throw Error(ErrorKind::bad_value, argument, "expected a folder path, got an empty string");
  }
  Output o;
  o.argument = argument;
  o.folder = true;
  o.target = fs::path(absolute_path(path)).lexically_normal().string();
  while (o.target.size() > 1 && o.target.back() == '/') o.target.pop_back();
  struct stat st {};
  if (::stat(o.target.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      throw Error(ErrorKind::io, argument,
                  fmt::format("expected a folder (new, or one to replace), got {} which is {}",
                              path, S_ISREG(st.st_mode) ? "a file" : file_type(st.st_mode)));
    }
    o.existed = true;
  }
  std::error_code ec;
  fs::create_directories(parent_of(o.target), ec);
  const std::string dir = parent_of(o.target);
  std::call_once(g_handlers_once, install_handlers);
  const BlockSignals block;
  int e = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    o.temporary = random_name(dir);
    if (::mkdir(o.temporary.c_str(), 0777) == 0) {
      e = 0;
      break;
    }
    e = errno;
    if (e != EEXIST) break;
  }
  if (e != 0) {
    throw Error(ErrorKind::io, argument,
                fmt::format("cannot create a folder beside {}: {}", path, errno_text(e)));
  }
  o.slot = register_temporary(o.temporary, kFolder);
  outputs_.push_back(std::move(o));
  return outputs_.size() - 1;
}

void OutputCommit::append(std::size_t index, const void* data, std::size_t bytes) {
  Output& o = outputs_.at(index);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(o.fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : ENOSPC;
      throw Error(ErrorKind::io, o.argument,
                  fmt::format("cannot write the output file {}: {}", o.target, errno_text(e)));
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

const std::string& OutputCommit::directory(std::size_t index) const {
  return outputs_.at(index).temporary;
}

const std::string& OutputCommit::argument(std::size_t index) const {
  return outputs_.at(index).argument;
}

void OutputCommit::discard() noexcept {
  for (Output& o : outputs_) {
    if (o.fd >= 0) ::close(o.fd);
    o.fd = -1;
    std::error_code ec;
    if (o.folder) {
      fs::remove_all(o.temporary, ec);
    } else {
      ::unlink(o.temporary.c_str());
    }
    unregister(o.slot);
    o.slot = -1;
  }
}

void OutputCommit::commit() {
  for (Output& o : outputs_) {
    if (o.fd < 0) continue;
    const int rc = ::close(o.fd);
    o.fd = -1;
    if (rc != 0) {
      const int e = errno;
      throw Error(ErrorKind::io, o.argument,
                  fmt::format("cannot write the output file {}: {}", o.target, errno_text(e)));
    }
  }
  // From here the renames run to their end (or their rollback) before a signal acts.
  g_committing.fetch_add(1);
  std::size_t done = 0;  // outputs 0..done-1 are in place
  std::string failure;
  std::size_t failed = 0;
  for (Output& o : outputs_) {
    // The old target steps aside: a hard link keeps it reachable while the rename replaces the
    // name atomically; where links are refused (folders, some file systems) it is renamed aside.
    bool aside = false;
    if (o.existed) {
      for (int attempt = 0; attempt < 100; ++attempt) {
        o.backup = random_name(parent_of(o.target));
        if (!o.folder && ::link(o.target.c_str(), o.backup.c_str()) == 0) break;
        if (!o.folder && errno == EEXIST) continue;
        if (::rename(o.target.c_str(), o.backup.c_str()) == 0) {
          aside = true;
          break;
        }
        if (errno != EEXIST && errno != ENOTEMPTY) {
          failure = fmt::format("cannot move the old {} aside: {}", o.target, errno_text(errno));
          o.backup.clear();
          break;
        }
      }
    }
    if (failure.empty()) {
      const bool injected = g_fail_rename_at && *g_fail_rename_at == done;
      if (injected || ::rename(o.temporary.c_str(), o.target.c_str()) != 0) {
        const int e = injected ? EIO : errno;
        failure = fmt::format("cannot move the finished file into place at {}: {}", o.target,
                              errno_text(e));
        if (aside) ::rename(o.backup.c_str(), o.target.c_str());
        if (!aside && !o.backup.empty()) ::unlink(o.backup.c_str());
        o.backup.clear();
      }
    }
    if (!failure.empty()) {
      failed = done;
      break;
    }
    unregister(o.slot);
    o.slot = -1;
    ++done;
  }
  if (!failure.empty()) {
    // Put back every target already replaced: its old file, or nothing where there was none.
    for (std::size_t j = 0; j < done; ++j) {
      Output& o = outputs_[j];
      if (!o.backup.empty()) {
        if (o.folder) {
          std::error_code ec;
          const std::string trash = random_name(parent_of(o.target));
          if (::rename(o.target.c_str(), trash.c_str()) == 0) fs::remove_all(trash, ec);
        }
        ::rename(o.backup.c_str(), o.target.c_str());
      } else if (o.folder) {
        std::error_code ec;
        fs::remove_all(o.target, ec);
      } else {
        ::unlink(o.target.c_str());
      }
      o.backup.clear();
    }
    // The temporaries of the outputs not yet renamed go too.
    for (std::size_t j = failed; j < outputs_.size(); ++j) {
      std::error_code ec;
      if (outputs_[j].folder) {
        fs::remove_all(outputs_[j].temporary, ec);
      } else {
        ::unlink(outputs_[j].temporary.c_str());
      }
      unregister(outputs_[j].slot);
      outputs_[j].slot = -1;
    }
    committed_ = true;  // nothing left to discard
  } else {
    for (Output& o : outputs_) {
      if (o.backup.empty()) continue;
      std::error_code ec;
      if (o.folder) {
        fs::remove_all(o.backup, ec);
      } else {
        ::unlink(o.backup.c_str());
      }
    }
    committed_ = true;
  }
  g_committing.fetch_sub(1);
  if (const int sig = g_pending_signal.exchange(0); sig != 0) {
    // The signal that arrived during the renames: now its default action.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    remove_registered();
    ::raise(sig);
  }
  if (!failure.empty()) {
    throw Error(ErrorKind::io, outputs_[failed].argument,
                failure + (failed > 0 ? "; the outputs already replaced were put back" : ""));
  }
}

namespace testing {
void fail_rename_at(std::optional<std::size_t> index) { g_fail_rename_at = index; }
}  // namespace testing

}  // namespace sdpa::io
