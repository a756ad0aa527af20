#include "tools/fleet/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace retrybudget::fleet {
namespace {

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(std::vector<std::string> argv,
                                                              SubprocessOptions options) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess::Spawn: empty argv");
  // O_CLOEXEC everywhere: only the dup2'ed copies reach the child, and concurrent spawns from
  // other threads do not inherit our pipe ends (which would hide end of file).
  int in_pipe[2] = {-1, -1};
  int out_pipe[2] = {-1, -1};
  if (options.pipe_stdin && pipe2(in_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  if (options.pipe_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    CloseFd(&in_pipe[0]);
    CloseFd(&in_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(e)));
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options.pipe_stdin) posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  if (options.pipe_stdout) posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);

  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  CloseFd(&in_pipe[0]);
  CloseFd(&out_pipe[1]);
  if (rc != 0) {
    CloseFd(&in_pipe[1]);
    CloseFd(&out_pipe[0]);
    return absl::InternalError(
        absl::StrCat("cannot start '", argv[0], "': ", std::strerror(rc)));
  }
  // The parent must not die of SIGPIPE when a child exits before reading its stdin.
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Subprocess> child(new Subprocess());
  child->pid_ = pid;
  child->stdin_fd_ = in_pipe[1];
  child->stdout_fd_ = out_pipe[0];
  child->program_ = argv[0];
  return child;
}

Subprocess::~Subprocess() {
  CloseFd(&stdin_fd_);
  CloseFd(&stdout_fd_);
  if (pid_ > 0 && !wait_status_.has_value()) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

absl::Status Subprocess::WriteStdin(absl::string_view data) {
  if (stdin_fd_ < 0) return absl::FailedPreconditionError("child stdin is not a pipe");
  while (!data.empty()) {
    ssize_t n = write(stdin_fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("write to stdin of pid ", pid_, ": ", std::strerror(errno)));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void Subprocess::CloseStdin() { CloseFd(&stdin_fd_); }

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Time deadline) {
  if (stdout_fd_ < 0 && buffer_.empty()) {
    return absl::FailedPreconditionError("child stdout is not a pipe");
  }
  while (true) {
    if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_eof_) {
      if (!buffer_.empty()) return std::exchange(buffer_, std::string());
      return absl::OutOfRangeError(absl::StrCat("end of output of pid ", pid_));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line from pid ", pid_, " (", program_, ") in time"));
    }
    pollfd pfd{.fd = stdout_fd_, .events = POLLIN, .revents = 0};
    int timeout_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1'000'000));
    int rc = poll(&pfd, 1, timeout_ms);
    if (rc < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (rc <= 0) continue;
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    }
    if (n == 0) {
      stdout_eof_ = true;
    } else {
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
}

std::optional<int> Subprocess::Poll() {
  if (wait_status_.has_value()) return wait_status_;
  if (pid_ <= 0) return std::nullopt;
  int status = 0;
  pid_t rc = waitpid(pid_, &status, WNOHANG);
  if (rc == pid_) wait_status_ = status;
  return wait_status_;
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  // Polling keeps this free of SIGCHLD handlers (which would belong to the whole process);
  // 1 ms of latency is far below what the fleet measures.
  while (true) {
    if (std::optional<int> status = Poll(); status.has_value()) return *status;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " (", program_, ") still running"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !wait_status_.has_value()) kill(pid_, signal);
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("wait status ", wait_status);
}

bool ExitedWith(int wait_status, int code) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code;
}

}  // namespace retrybudget::fleet
