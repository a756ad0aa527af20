// A real process started by a test (the retry-budget-server binary), its stderr captured to a
// file, and the helpers to find a server that was started on port 0.
#ifndef RETRYBUDGET_TESTS_INTEGRATION_CHILD_PROCESS_H_
#define RETRYBUDGET_TESTS_INTEGRATION_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/subprocess.h"

namespace retrybudget::testing {

// The tests' handle on the shared retrybudget::Subprocess (common/subprocess.h), its stdout and
// stderr in one file. Not thread-safe. The destructor kills (SIGKILL) and reaps a child that is
// still running.
class ChildProcess {
 public:
  // Starts `binary` with `args` (argv[1..]); stdout and stderr go to `output_path`.
  // Returns nullopt (after ADD_FAILURE naming the binary and why) if it cannot be started.
  static std::optional<ChildProcess> Start(const std::string& binary,
                                           const std::vector<std::string>& args,
                                           const std::string& output_path);

  ChildProcess(ChildProcess&& other) noexcept = default;
  ChildProcess& operator=(ChildProcess&& other) noexcept = default;
  ~ChildProcess() = default;

  void Signal(int signo);

  // Waits until the child exits, at most `timeout`. Returns its exit code, -signal if it was
  // killed by a signal, nullopt if it is still running.
  std::optional<int> Wait(absl::Duration timeout);

  // True while it has not exited (reaps it if it has).
  bool Running();

  // Everything the child wrote so far.
  std::string Output() const;

  // The process id (-1 after a move).
  pid_t pid() const { return process_ != nullptr ? process_->pid() : -1; }

 private:
  ChildProcess(std::unique_ptr<Subprocess> process, std::string output_path)
      : process_(std::move(process)), output_path_(std::move(output_path)) {}

  std::unique_ptr<Subprocess> process_;
  std::string output_path_;
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
