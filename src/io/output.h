// All-or-nothing output for every command that writes files (sdpa attention, the lab's files,
// sdpa report --out), and the one way inputs are opened.
//
// OutputCommit, in the order a command uses it:
//   1. protect_input(): the inputs no output may replace, compared by device and inode (so a
//      hard link, a bind mount or another spelling of an input is caught, not only equal paths);
//   2. add_file() / add_directory(): validates each target at once and creates its temporary
//      beside it, a short hidden name `.sdpa-XXXXXX` in the target's directory (it never passes
//      NAME_MAX, whatever the target's name), so an unwritable place fails before any work;
//   3. append() / directory(): the command writes its outputs into the temporaries;
//   4. commit(): renames every temporary over its target, only when all are complete. The old
//      file of each target is kept aside (a hard link, or a rename where links are refused) until
//      every rename succeeded, so a failing rename puts back the targets already replaced.
// On an error (an exception, or destruction without commit) every temporary is removed. On
// SIGINT, SIGTERM or SIGHUP a handler unlinks the registered temporaries with async-signal-safe
// calls, then re-raises the signal with its default action; a signal that arrives during
// commit() waits until the renames (or their rollback) are done. A crash (SIGSEGV, SIGBUS,
// SIGFPE, SIGILL, SIGABRT) removes them the same way, at once.
//
// Targets that are not regular files: a symbolic link is followed, so the file it points to is
// replaced and the link stays; a directory (for add_file), a FIFO, a socket or a device node
// (/dev/null, /dev/full) is refused with an sdpa::Error, never replaced: replacing /dev/null with
// a regular file is the opposite of what anyone wants, and writing through a device cannot be
// undone when a later output fails.
// New files get mode 0666 minus the umask; a replaced file keeps its mode.
// Every error is an sdpa::Error naming the argument (the flag) given to add_file().
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sdpa::io {

/// A file's identity: two paths name the same file exactly when these agree.
struct FileId {
  dev_t device = 0;
  ino_t inode = 0;
  bool operator==(const FileId&) const = default;
};

/// The identity of the file `path` names (symbolic links followed), or nothing if it does not
/// exist or cannot be examined.
std::optional<FileId> file_id(const std::string& path);

/// Opens `path` for reading: refuses anything but a regular file (a FIFO, a device, a directory)
/// before reading a byte, and never blocks doing so (O_NONBLOCK, then fstat). Returns the
/// descriptor, blocking again; throws sdpa::Error (kind io) naming `argument` otherwise.
int open_regular_for_reading(const std::string& path, const std::string& argument);

class OutputCommit {
 public:
  OutputCommit();
  ~OutputCommit();  // removes every temporary and keeps every target as it was, unless committed
  OutputCommit(const OutputCommit&) = delete;
  OutputCommit& operator=(const OutputCommit&) = delete;

  /// An input of the command, named by `argument` in messages. Inputs that do not exist yet are
  /// ignored here (reading them fails later with its own message).
  void protect_input(const std::string& argument, const std::string& path);

  /// A file output; returns its index for append(). Validates the target (not empty, in an
  /// existing directory, not a directory or device, no input, no other output) and creates its
  /// temporary now.
  std::size_t add_file(const std::string& argument, const std::string& path);
  /// A folder output, replaced as a whole; returns its index for directory().
  std::size_t add_directory(const std::string& argument, const std::string& path);

  /// Appends bytes to file output `index`; a short write (ENOSPC, EFBIG, EIO) is an sdpa::Error.
  void append(std::size_t index, const void* data, std::size_t bytes);
  /// The temporary folder to fill for folder output `index`.
  const std::string& directory(std::size_t index) const;
  /// The argument (flag) output `index` was added with, for the messages of its writers.
  const std::string& argument(std::size_t index) const;

  /// Renames every temporary into place, all or nothing (see the header comment).
  void commit();

 private:
  struct Output;
  void discard() noexcept;
  std::vector<Output> outputs_;
  std::vector<std::pair<std::string, FileId>> inputs_;
  bool committed_ = false;
};

/// Removes every temporary of every OutputCommit of this process now, async-signal-safely, as a
/// fatal signal does: for a caller about to end the process without unwinding (MPI_Abort).
void remove_temporaries_now() noexcept;

namespace testing {
/// Makes commit() fail the rename of output `index` as if the file system refused it (EIO), so
/// the tests can check the rollback; nullopt restores normal behaviour.
void fail_rename_at(std::optional<std::size_t> index);
}  // namespace testing

}  // namespace sdpa::io
