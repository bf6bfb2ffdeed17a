// Runs the `sdpa` program for the catalogue tests and captures its exit status and output.
// The binary comes from $SDPA_CLI, which CMake sets to $<TARGET_FILE:sdpa_cli> in the tests'
// environment.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace sdpa::test {

struct CliResult {
  int status = -1;  // exit status, or 128 + signal number when killed by a signal
  std::string out, err;
  bool timed_out = false;
};

inline std::string cli_path() {
  const char* p = std::getenv("SDPA_CLI");
  if (p == nullptr || *p == '\0') {
    throw std::runtime_error("SDPA_CLI is not set (ctest sets it to the sdpa program)");
  }
  return p;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Starts `sdpa args...` with stdout and stderr sent to files in `scratch_dir`, with SIGINT,
/// SIGTERM and SIGHUP at their default actions (whatever this process does with them); returns
/// its process id. finish_cli() collects it.
inline pid_t start_cli(const std::vector<std::string>& args, const std::string& scratch_dir) {
  const std::string out_path = scratch_dir + "/.stdout", err_path = scratch_dir + "/.stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const std::string program = cli_path();
  std::vector<std::string> argv_storage = {program};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("cannot start " + program);
  return pid;
}

/// Waits for `pid` (started by start_cli in `scratch_dir`) at most `timeout_s` seconds, then
/// kills it (status 128 + 9, and `timed_out`).
inline CliResult finish_cli(pid_t pid, const std::string& scratch_dir, double timeout_s = 120) {
  int wstatus = 0;
  CliResult r;
  for (double waited = 0;; waited += 0.01) {
    if (waitpid(pid, &wstatus, WNOHANG) == pid) break;
    if (waited > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      r.timed_out = true;
      break;
    }
    usleep(10000);
  }
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  const std::string out_path = scratch_dir + "/.stdout", err_path = scratch_dir + "/.stderr";
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

/// Runs `sdpa args...` with stdout and stderr sent to files in `scratch_dir`.
inline CliResult run_cli(const std::vector<std::string>& args, const std::string& scratch_dir,
                         double timeout_s = 120) {
  return finish_cli(start_cli(args, scratch_dir), scratch_dir, timeout_s);
}

}  // namespace sdpa::test
