// Helpers of the operations tests: a plain HTTP GET over a socket, the server binary started on
// port 0 with its metrics endpoint, and small file/process utilities.
#ifndef RETRYBUDGET_TESTS_OPS_OPS_TEST_UTIL_H_
#define RETRYBUDGET_TESTS_OPS_OPS_TEST_UTIL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/child_process.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::testing {

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET http://127.0.0.1:`port``path` (HTTP/1.0, Connection: close). UNAVAILABLE when nothing
// answers, INTERNAL for a malformed response.
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path,
                                     absl::Duration timeout = absl::Seconds(10));

// "a b" -> "a%20b" for a query parameter.
std::string UrlEncode(const std::string& s);

// The file's contents; fails the test (and returns "") when it cannot be read.
std::string ReadFileOrDie(const std::string& path);

// Runs a shell command, returning its exit code and combined output.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);

// A free TCP port on 127.0.0.1 (bound and released; racy only against other processes).
int FreePort();

// The retry-budget-server binary on 127.0.0.1:0 with --metrics_listen=127.0.0.1:0, both ports
// read from port files, launched by the one launcher of servers under test.
struct OpsServer {
  ScopedTempDir dir;  // the server's directory (its log is `output`); outlives the process
  std::unique_ptr<ServerUnderTest> process;
  int port = 0;
  int metrics_port = 0;

  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  // nullptr (after ADD_FAILURE with the server's output) if it does not come up.
  static std::unique_ptr<OpsServer> Start(const std::string& binary,
                                          const std::vector<std::string>& extra_args = {});
};

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_OPS_OPS_TEST_UTIL_H_
