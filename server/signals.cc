#include "server/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace retrybudget {
namespace {

// The write end of the self-pipe, read by the handler. A lock-free atomic is async-signal-safe.
std::atomic<int> g_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Async-signal-safe: only write() (non-blocking; a full pipe already holds a wake-up) and errno
// is preserved for the interrupted code.
void OnSignal(int signo) {
  const int saved_errno = errno;
  const int fd = g_write_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);
  }
  errno = saved_errno;
}

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShutdownSignals>> ShutdownSignals::Install() {
  if (g_write_fd.load() >= 0) {
    return absl::FailedPreconditionError("ShutdownSignals is already installed");
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  // Only the write end is non-blocking: the handler must never block, Wait() should.
  if (fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0) {
    const absl::Status s = ErrnoError("fcntl(O_NONBLOCK)");
    close(fds[0]);
    close(fds[1]);
    return s;
  }
  g_write_fd.store(fds[1]);
  std::unique_ptr<ShutdownSignals> signals(new ShutdownSignals(fds[0], fds[1]));
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : kSignals) {
    if (sigaction(signo, &action, nullptr) != 0) return ErrnoError("sigaction");
  }
  return signals;
}

ShutdownSignals::~ShutdownSignals() {
  for (int signo : kSignals) signal(signo, SIG_DFL);
  g_write_fd.store(-1);
  close(write_fd_);
  close(read_fd_);
}

int ShutdownSignals::Wait() {
  unsigned char byte = 0;
  for (;;) {
    const ssize_t n = read(read_fd_, &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    // The pipe cannot be closed while we own both ends; treat anything else as a termination
    // request rather than spinning.
    return SIGTERM;
  }
}

}  // namespace retrybudget
