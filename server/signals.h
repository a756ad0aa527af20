// Waiting for SIGINT / SIGTERM (shut down) and SIGHUP (reload the policy) without doing anything
// unsafe in a signal handler: the handler only write()s the signal number to a self-pipe; the
// main thread reads it and acts.
//
//   auto signals = ShutdownSignals::Install();
//   if (!signals.ok()) return signals.status();
//   int signo;
//   while ((signo = (*signals)->Wait()) == SIGHUP) Reload();
//   Shutdown();  // SIGINT or SIGTERM
#ifndef RETRYBUDGET_SERVER_SIGNALS_H_
#define RETRYBUDGET_SERVER_SIGNALS_H_

#include <memory>

#include "absl/status/statusor.h"

namespace retrybudget {

// At most one instance per process. Wait() must be called from one thread at a time.
class ShutdownSignals {
 public:
  // Installs handlers for SIGINT, SIGTERM and SIGHUP. FAILED_PRECONDITION if an instance exists
  // already, INTERNAL if the pipe or the handlers cannot be set up.
  static absl::StatusOr<std::unique_ptr<ShutdownSignals>> Install();

  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;
  // Restores the default dispositions and closes the pipe.
  ~ShutdownSignals();

  // Blocks until SIGINT, SIGTERM or SIGHUP arrives (or has arrived since Install()) and returns
  // its number. Signals are returned one per call, in arrival order (a burst beyond the pipe's
  // capacity, 64 KiB of signals, is coalesced).
  int Wait();

 private:
  ShutdownSignals(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}

  const int read_fd_;
  const int write_fd_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_SIGNALS_H_
