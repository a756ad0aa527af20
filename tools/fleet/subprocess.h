// A child process started with posix_spawn, with optional pipes to its stdin and from its
// stdout (its stderr is inherited). Used by the fleet tool for its workers (and, later, the
// server it supervises) and by the fleet tests for the server and the tool.
//
//   auto child = Subprocess::Spawn({"/usr/bin/true"}, {.pipe_stdout = true});
//   if (!child.ok()) return child.status();
//   absl::StatusOr<std::string> line = (*child)->ReadLine(absl::Now() + absl::Seconds(5));
//   absl::StatusOr<int> status = (*child)->Wait(absl::Now() + absl::Seconds(5));
#ifndef RETRYBUDGET_TOOLS_FLEET_SUBPROCESS_H_
#define RETRYBUDGET_TOOLS_FLEET_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace retrybudget::fleet {

struct SubprocessOptions {
  bool pipe_stdin = false;   // else inherited
  bool pipe_stdout = false;  // else inherited
};

// Thread-compatible: one thread drives a Subprocess. Deadlines are real (wall) time: these are
// real processes.
class Subprocess {
 public:
  // Starts argv[0] (a path, not searched in PATH) with `argv`. INVALID_ARGUMENT for an empty
  // argv, INTERNAL when the spawn fails (naming the program and errno).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(std::vector<std::string> argv,
                                                           SubprocessOptions options = {});

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Kills (SIGKILL) and reaps the child if it is still running; closes the pipes.
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // Writes all of `data` to the child's stdin (FAILED_PRECONDITION without a stdin pipe,
  // UNAVAILABLE when the child closed it).
  absl::Status WriteStdin(absl::string_view data);
  void CloseStdin();

  // The next line of the child's stdout, without its '\n'. DEADLINE_EXCEEDED when none came in
  // time, OUT_OF_RANGE at end of file (a last line without '\n' is still returned first).
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);

  // Waits for the child to exit and returns its raw wait status (see DescribeWaitStatus()).
  // DEADLINE_EXCEEDED if it is still running at `deadline` (it is left running).
  absl::StatusOr<int> Wait(absl::Time deadline);

  // The raw wait status if the child has exited (reaps it), else nullopt. Never blocks.
  std::optional<int> Poll();

  // Sends `signal` to the child if it has not been reaped.
  void Signal(int signal);

 private:
  Subprocess() = default;

  pid_t pid_ = -1;
  std::optional<int> wait_status_;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  bool stdout_eof_ = false;
  std::string buffer_;  // stdout read but not yet returned
  std::string program_;
};

// "exit code 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

// True when the status is a normal exit with `code`.
bool ExitedWith(int wait_status, int code);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_SUBPROCESS_H_
