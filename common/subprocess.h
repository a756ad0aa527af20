// A child process started with posix_spawn: optional pipes to its stdin and from its stdout,
// or its stdout and stderr in a file; lines read with a deadline; a stop that escalates from a
// chosen signal to SIGKILL. The one implementation behind the fleet tool's workers
// (tools/fleet/subprocess.h), the benches' children (bench/bench_util.h) and the test servers
// (tests/integration/child_process.h).
//
//   absl::StatusOr<std::unique_ptr<Subprocess>> child =
//       Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
//   if (!child.ok()) return child.status();  // e.g. NOT_FOUND "cannot start '/bin/cat': ..."
//   if (absl::Status s = (*child)->WriteStdin("hello\n"); !s.ok()) return s;
//   absl::StatusOr<std::string> line = (*child)->ReadLine(absl::Now() + absl::Seconds(5));
//   absl::StatusOr<int> status = (*child)->Stop(SIGTERM, absl::Seconds(5));
//
// Guarantees: every descriptor this opens is O_CLOEXEC, so a child gets only its own stdin,
// stdout and stderr and never another child's pipe ends (which would hide end of file); the
// child starts with no signal blocked and every signal at its default action, whatever the
// parent blocks or ignores; a child still running when its Subprocess is destroyed is killed
// (SIGKILL) and reaped, so none is left behind as a zombie. Waiting polls waitpid(): no SIGCHLD
// handler is installed, and no process-wide signal disposition is changed.
//
// Deadlines are real (wall) time: these are real processes, not budget time.
#ifndef RETRYBUDGET_COMMON_SUBPROCESS_H_
#define RETRYBUDGET_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace retrybudget {

struct SubprocessOptions {
  bool pipe_stdin = false;   // else inherited
  bool pipe_stdout = false;  // else inherited (or `output_file`)
  // When not empty, the child's stdout and stderr both go to this file, created or truncated
  // (mode 0644). Not together with `pipe_stdout`. (The `= {}` keeps GCC's
  // -Wmissing-field-initializers quiet about designated initializers that leave it out.)
  std::string output_file = {};
};

// Thread-compatible: one thread at a time drives a Subprocess.
class Subprocess {
 public:
  // Starts argv[0] (a path, not searched in PATH) with `argv`. INVALID_ARGUMENT for an empty
  // argv or conflicting options; otherwise on failure the status of the errno (NOT_FOUND for a
  // missing program, PERMISSION_DENIED for one that is not executable, ...) with a message
  // "cannot start '<argv[0]>': <reason>".
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(std::vector<std::string> argv,
                                                           SubprocessOptions options = {});

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Closes the pipes; kills (SIGKILL) and reaps the child if it has not been reaped.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // argv[0] as given to Spawn().
  const std::string& program() const { return program_; }

  // Writes all of `data` to the child's stdin. FAILED_PRECONDITION without a stdin pipe (or
  // after CloseStdin()), UNAVAILABLE when the child closed its end; never raises SIGPIPE.
  absl::Status WriteStdin(absl::string_view data);
  // Closes our end of the child's stdin: the child reads end of file.
  void CloseStdin();

  // The next line of the child's stdout, without its '\n'. DEADLINE_EXCEEDED when none came
  // by `deadline` (nothing is lost: a partial line stays buffered for the next call),
  // OUT_OF_RANGE at end of file (a last line without '\n' is still returned first),
  // FAILED_PRECONDITION without a stdout pipe.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);

  // Waits for the child to exit and returns its raw wait status (see DescribeWaitStatus()).
  // DEADLINE_EXCEEDED if it is still running at `deadline` (it is left running).
  // FAILED_PRECONDITION if its status was taken by someone else (SIGCHLD ignored, or a
  // waitpid(-1) elsewhere in the process).
  absl::StatusOr<int> Wait(absl::Time deadline);

  // The raw wait status if the child has exited (reaps it), else nullopt. Never blocks.
  std::optional<int> Poll();

  // Sends `signal` to the child if it has not been reaped. A reaped pid is never signalled (it
  // may belong to another process by now).
  void Signal(int signal);

  // Ends the child: sends `signal` (then SIGCONT, so a stopped child can act on it), waits up
  // to `grace` for it to exit, then sends SIGKILL and waits for it to die. Returns the raw wait
  // status (the stored one if it had already been reaped); FAILED_PRECONDITION as for Wait().
  absl::StatusOr<int> Stop(int signal, absl::Duration grace);

 private:
  Subprocess() = default;
  // Reaps the child if it has exited (or, with `block`, once it has). Returns whether it has
  // been reaped.
  bool Reap(bool block);

  pid_t pid_ = -1;
  std::string program_;
  std::optional<int> wait_status_;
  bool status_lost_ = false;  // waitpid() said ECHILD: someone else reaped it
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  bool stdout_eof_ = false;
  std::string buffer_;  // stdout read but not yet returned
};

// "exit code 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

// True when the status is a normal exit with `code`.
bool ExitedWith(int wait_status, int code);

}  // namespace retrybudget

#endif  // RETRYBUDGET_COMMON_SUBPROCESS_H_
