// The real retry-budget-server as a child of the fleet tool (--spawn-server), for the chaos
// runs of issue 4, on the launcher the tests share (tests/support/test_launcher.h): start it on a
// port picked once, kill it with SIGKILL, restart it on the SAME port with the SAME data directory
// (so clients reconnect to the address they know and the server restores its snapshot and journal),
// hang it with SIGSTOP and resume it with SIGCONT.
//
//   auto server = ServerSupervisor::Start({.binary = path, .data_dir = dir, .work_dir = tmp});
//   if (!server.ok()) return server.status();
//   std::string target = (*server)->address();      // "127.0.0.1:<port>"
//   (*server)->Kill();  ...  (*server)->Restart();
//   (*server)->Shutdown(absl::Seconds(10));
#ifndef RETRYBUDGET_TOOLS_FLEET_SERVER_SUPERVISOR_H_
#define RETRYBUDGET_TOOLS_FLEET_SERVER_SUPERVISOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::fleet {

struct ServerSupervisorOptions {
  std::string binary = {};  // path of retry-budget-server
  // Passed as --data_dir=DIR when non-empty and the binary knows the flag (its --helpfull lists
  // it); a server without it restarts from an empty state (see persistent()).
  std::string data_dir = {};
  std::string policy_file = {};  // passed as --policy=FILE when non-empty
  // Appended as given (e.g. --snapshot_interval=1s), after the supervisor's own flags, so they
  // win. The metrics endpoint is off unless one of them sets --metrics_listen.
  std::vector<std::string> extra_args = {};
  std::string work_dir = {};  // where the port file and the server's log go; must exist
  // How long one start (or restart) may take until the server has written its port file.
  absl::Duration start_timeout = absl::Seconds(20);
};

// Thread-compatible: one thread at a time drives it (the fleet's chaos thread during the run,
// the main thread before and after). The destructor kills a server still running.
class ServerSupervisor {
 public:
  // Starts the server on 127.0.0.1:0 and waits for its port file. INVALID_ARGUMENT for a missing
  // binary or work_dir; UNAVAILABLE (with the exit status) when the server exits or writes no
  // port in time.
  static absl::StatusOr<std::unique_ptr<ServerSupervisor>> Start(ServerSupervisorOptions options);

  ServerSupervisor(const ServerSupervisor&) = delete;
  ServerSupervisor& operator=(const ServerSupervisor&) = delete;
  ~ServerSupervisor() = default;

  int port() const { return server_->port(); }
  std::string address() const;

  // SIGKILL and reap. FAILED_PRECONDITION when no server is running.
  absl::Status Kill();
  // Starts the server again on the same port (--listen=127.0.0.1:PORT) and waits until it
  // serves; while the old socket is still held (the server exits "cannot serve"), tries again
  // until start_timeout. FAILED_PRECONDITION when one is running.
  absl::Status Restart();
  // SIGSTOP / SIGCONT: the process keeps its socket, so clients connect and then hang.
  void Stop();
  void Resume();
  // The server's output so far (its log in work_dir), for failure messages.
  std::string LogTail() const { return server_->LogTail(); }
  // SIGCONT, SIGTERM, then waits up to `grace` (SIGKILL after it). OK when it exited 0 (or none
  // was running); otherwise the exit status.
  absl::Status Shutdown(absl::Duration grace);

  bool running() const { return server_->process() != nullptr; }
  // The server was given --data_dir: a restart restores its state.
  bool persistent() const { return persistent_; }

 private:
  ServerSupervisor() = default;

  bool persistent_ = false;
  std::unique_ptr<testing::ServerUnderTest> server_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_SERVER_SUPERVISOR_H_
