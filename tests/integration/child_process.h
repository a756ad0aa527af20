// A real process started by a test (the retry-budget-server binary), its stderr captured to a
// file, and the helpers to find a server that was started on port 0.
#ifndef RETRYBUDGET_TESTS_INTEGRATION_CHILD_PROCESS_H_
#define RETRYBUDGET_TESTS_INTEGRATION_CHILD_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace retrybudget::testing {

// Not thread-safe. The destructor kills (SIGKILL) and reaps a child that is still running.
class ChildProcess {
 public:
  // Starts `binary` with `args` (argv[1..]); stdout and stderr go to `output_path`.
  // Returns nullopt (after ADD_FAILURE) if it cannot be started.
  static std::optional<ChildProcess> Start(const std::string& binary,
                                           const std::vector<std::string>& args,
                                           const std::string& output_path);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();

  void Signal(int signo);

  // Waits until the child exits, at most `timeout`. Returns its exit code, -signal if it was
  // killed by a signal, nullopt if it is still running.
  std::optional<int> Wait(absl::Duration timeout);

  // True while it has not exited (reaps it if it has).
  bool Running();

  // Everything the child wrote so far.
  std::string Output() const;

  // The process id (-1 after a move).
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(pid_t pid, std::string output_path) : pid_(pid), output_path_(output_path) {}
  void KillAndReap();

  pid_t pid_;
  std::string output_path_;
  std::optional<int> exit_code_;
};

// A fresh empty directory under the test's temporary directory, removed with its contents on
// destruction.
class ScopedTempDir {
 public:
  ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  ~ScopedTempDir();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Waits (up to `timeout`) for `path` to hold a port number, as the server's --port_file does.
// Returns nullopt if it does not appear in time or `child` exits first.
std::optional<int> WaitForPortFile(const std::string& path, ChildProcess& child,
                                   absl::Duration timeout);

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_INTEGRATION_CHILD_PROCESS_H_
