#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace retrybudget {
namespace {

// How often Wait() polls waitpid(). Far below anything a test, a bench or the fleet measures,
// and polling needs no SIGCHLD handler (which would belong to the whole process).
constexpr absl::Duration kWaitPoll = absl::Milliseconds(1);

// A descriptor closed on destruction unless released.
class OwnedFd {
 public:
  OwnedFd() = default;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { reset(); }

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// "cannot start '<program>': <what>: <strerror>", with the status code of `err`.
absl::Status StartError(const std::string& program, int err, absl::string_view what = "") {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat("cannot start '", program, "': ", what, what.empty() ? "" : ": ",
                                   strerror(err)));
}

// Moves `fd` above the standard streams. A descriptor that is already 0, 1 or 2 (the parent
// runs with a standard stream closed) would survive, or be clobbered by, the dup2() onto the
// child's standard streams. Returns an errno, 0 on success.
int MoveAboveStdio(OwnedFd& fd) {
  if (fd.get() > STDERR_FILENO) return 0;
  const int moved = fcntl(fd.get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  if (moved < 0) return errno;
  fd.reset(moved);
  return 0;
}

// A pipe with O_CLOEXEC on both ends: only the dup2()ed copy reaches the child, and children
// spawned meanwhile by other threads do not inherit an end (which would hide end of file).
// Returns an errno, 0 on success.
int MakePipe(OwnedFd& read_end, OwnedFd& write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return errno;
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
  if (int err = MoveAboveStdio(read_end); err != 0) return err;
  return MoveAboveStdio(write_end);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(std::vector<std::string> argv,
                                                              SubprocessOptions options) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess::Spawn: empty argv");
  const std::string& program = argv[0];
  if (options.pipe_stdout && !options.output_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot start '", program,
                                                   "': both a stdout pipe and output file '",
                                                   options.output_file, "' asked for"));
  }

  OwnedFd stdin_read, stdin_write, stdout_read, stdout_write, output;
  if (options.pipe_stdin) {
    if (int err = MakePipe(stdin_read, stdin_write); err != 0) {
      return StartError(program, err, "stdin pipe");
    }
  }
  if (options.pipe_stdout) {
    if (int err = MakePipe(stdout_read, stdout_write); err != 0) {
      return StartError(program, err, "stdout pipe");
    }
  }
  if (!options.output_file.empty()) {
    const int fd =
        open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return StartError(program, errno, absl::StrCat("output file '", options.output_file, "'"));
    }
    output.reset(fd);
    if (int err = MoveAboveStdio(output); err != 0) {
      return StartError(program, err, "output file");
    }
  }

  // The child's standard streams. Everything else we hold is O_CLOEXEC and stays behind.
  posix_spawn_file_actions_t actions;
  int rc = posix_spawn_file_actions_init(&actions);
  if (rc != 0) return StartError(program, rc, "posix_spawn_file_actions_init");
  if (options.pipe_stdin) {
    rc = posix_spawn_file_actions_adddup2(&actions, stdin_read.get(), STDIN_FILENO);
  }
  if (rc == 0 && options.pipe_stdout) {
    rc = posix_spawn_file_actions_adddup2(&actions, stdout_write.get(), STDOUT_FILENO);
  }
  if (rc == 0 && output.get() >= 0) {
    rc = posix_spawn_file_actions_adddup2(&actions, output.get(), STDOUT_FILENO);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, output.get(), STDERR_FILENO);
  }

  // No signal blocked and none ignored in the child, whatever this thread blocks (a sigwait()
  // thread) or this process ignores (SIGPIPE; SIGINT and SIGQUIT in a background job): the
  // signals a caller sends must reach the child as they would from a shell.
  posix_spawnattr_t attr;
  const int attr_rc = posix_spawnattr_init(&attr);
  if (rc == 0) rc = attr_rc;
  if (rc == 0) {
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    rc = posix_spawnattr_setsigmask(&attr, &none);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
    if (rc == 0) {
      rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    }
  }

  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  pid_t pid = -1;
  // glibc's posix_spawn reports a failed exec (missing program, not executable) here, not as
  // a child that exits 127.
  if (rc == 0) rc = posix_spawn(&pid, cargv[0], &actions, &attr, cargv.data(), environ);
  if (attr_rc == 0) posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return StartError(program, rc);

  std::unique_ptr<Subprocess> child(new Subprocess());
  child->pid_ = pid;
  child->program_ = program;
  child->stdin_fd_ = stdin_write.release();
  child->stdout_fd_ = stdout_read.release();
  return child;  // the child's ends of the pipes and the output file close here
}

Subprocess::~Subprocess() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (!Reap(/*block=*/false)) {
    Signal(SIGKILL);
    Reap(/*block=*/true);
  }
}

bool Subprocess::Reap(bool block) {
  if (pid_ <= 0 || wait_status_.has_value() || status_lost_) return true;
  int status = 0;
  pid_t rc;
  do {
    rc = waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (rc < 0 && errno == EINTR);
  if (rc == pid_) {
    wait_status_ = status;
  } else if (rc < 0 && errno == ECHILD) {
    status_lost_ = true;
  }
  return wait_status_.has_value() || status_lost_;
}

absl::Status Subprocess::WriteStdin(absl::string_view data) {
  if (stdin_fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("stdin of pid ", pid_, " (", program_, ") is not an open pipe"));
  }
  // Writing to a pipe whose reader is gone raises SIGPIPE, which would end this whole process.
  // SIGPIPE from write() goes to the writing thread: block it in this thread for the write and
  // take the one it raised before unblocking. No process-wide disposition changes.
  sigset_t sigpipe, old_mask, pending;
  sigemptyset(&sigpipe);
  sigaddset(&sigpipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigpipe, &old_mask);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  absl::Status status = absl::OkStatus();
  while (!data.empty()) {
    const ssize_t n = write(stdin_fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (err == EPIPE && !was_pending) {
        const timespec zero{};
        while (sigtimedwait(&sigpipe, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
      status = absl::UnavailableError(
          absl::StrCat("write to stdin of pid ", pid_, " (", program_, "): ", strerror(err)));
      break;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return status;
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Time deadline) {
  if (stdout_fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("stdout of pid ", pid_, " (", program_, ") is not a pipe"));
  }
  while (true) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_eof_) {
      if (!buffer_.empty()) return std::exchange(buffer_, std::string());
      return absl::OutOfRangeError(
          absl::StrCat("end of output of pid ", pid_, " (", program_, ")"));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line from pid ", pid_, " (", program_, ") in time"));
    }
    pollfd pfd{.fd = stdout_fd_, .events = POLLIN, .revents = 0};
    // Rounded up, so that a wake-up is never before the deadline (and so never a busy loop).
    const int timeout_ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1'000'000));
    const int ready = poll(&pfd, 1, timeout_ms);
    if (ready < 0 && errno != EINTR) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("poll on stdout of pid ", pid_, " (", program_, ")"));
    }
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::ErrnoToStatus(
          errno, absl::StrCat("read from stdout of pid ", pid_, " (", program_, ")"));
    }
    if (n == 0) {
      stdout_eof_ = true;
    } else {
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
}

std::optional<int> Subprocess::Poll() {
  Reap(/*block=*/false);
  return wait_status_;
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  while (!Reap(/*block=*/false)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " (", program_, ") still running"));
    }
    absl::SleepFor(std::min(left, kWaitPoll));
  }
  if (!wait_status_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the exit status of pid ", pid_, " (", program_,
                     ") was taken by someone else (SIGCHLD ignored, or waitpid(-1) elsewhere)"));
  }
  return *wait_status_;
}

void Subprocess::Signal(int signal) {
  // Once reaped, the pid is free for the system to reuse: never signal it.
  if (pid_ > 0 && !wait_status_.has_value() && !status_lost_) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Stop(int signal, absl::Duration grace) {
  Signal(signal);
  if (signal != SIGCONT) Signal(SIGCONT);
  absl::StatusOr<int> status = Wait(absl::Now() + grace);
  if (!absl::IsDeadlineExceeded(status.status())) return status;
  Signal(SIGKILL);
  Reap(/*block=*/true);  // SIGKILL cannot be caught or ignored: this ends
  return Wait(absl::InfinitePast());  // reaped: only reads the status
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("wait status ", wait_status);
}

bool ExitedWith(int wait_status, int code) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code;
}

}  // namespace retrybudget
