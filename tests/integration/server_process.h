// The retry-budget-server binary run by a test, launched by the one launcher of servers under test
// (tests/support/test_launcher.h): started on 127.0.0.1:0 with a port file, its output captured, stubs connected (plaintext or TLS, with or without a bearer token), and the
// restart / signal helpers the persistence, security and reload tests share.
#ifndef RETRYBUDGET_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define RETRYBUDGET_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/integration/child_process.h"
#include "tests/support/server_connection.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::testing {

// Not thread-safe. The process is killed (SIGKILL) on destruction if still running.
class ServerProcess {
 public:
  // Starts the binary with --listen=127.0.0.1:0, a port file in `dir`, metrics off, and `args`.
  // Returns null (after ADD_FAILURE with the output) if it does not serve within 20 s.
  static std::unique_ptr<ServerProcess> Start(const std::string& dir,
                                              std::vector<std::string> args);

  int port() const { return server_->port(); }
  std::string target() const;
  ServerUnderTest& process() { return *server_; }
  pid_t pid() const;
  std::string Output() const { return server_->Log(); }

  // A plaintext connection (optionally with a bearer token).
  ServerConnection Connect(std::string bearer_token = "") const;

  // Sends `signo` and waits for the exit code (nullopt if it did not exit within 20 s).
  std::optional<int> Stop(int signo);

  // VmRSS of the process, in bytes (from /proc/<pid>/status); 0 if unreadable.
  int64_t ResidentBytes() const;

 private:
  ServerProcess() = default;
  std::unique_ptr<ServerUnderTest> server_;
};

// Runs `binary` with `args` until it exits (20 s at most); returns its exit code and output.
struct ExitResult {
  std::optional<int> code;
  std::string output;
};
ExitResult RunToExit(const std::string& dir, std::vector<std::string> args);

// A one-tenant Sync request.
v1::SyncRequest SyncOf(absl::string_view instance, uint64_t seq, absl::string_view tenant,
                       uint64_t want, uint64_t received = 0, uint64_t returned = 0,
                       uint64_t spent = 0);

// Writes `contents` to `path` (replacing it). Fails the test on error.
void WriteFile(const std::string& path, absl::string_view contents);

// The path of the server binary under test.
const std::string& ServerBinary();

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_INTEGRATION_SERVER_PROCESS_H_
