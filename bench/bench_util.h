// Small helpers the benchmarks share: latency percentiles, free loopback ports, child processes
// (redis-server, worker processes), the budget server through the tests' launcher, memory
// readings.
#ifndef RETRYBUDGET_BENCH_BENCH_UTIL_H_
#define RETRYBUDGET_BENCH_BENCH_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::bench {

// p-th percentile (p in [0, 100]) of `values`, by nearest rank. Sorts `values`. 0 when empty.
double Percentile(std::vector<double>& values, double p);

// The median of `values` (the mean of the middle two when their number is even), or `if_empty`
// when there are none: each bench says what stands for "not measured" in its own output.
double Median(std::vector<double> values, double if_empty);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed). For
// programs that cannot listen on port 0 themselves (redis-server). UNAVAILABLE on failure.
absl::StatusOr<int> PickFreeLoopbackPort();

// True once something accepts TCP connections on 127.0.0.1:`port`, false after `timeout`.
bool WaitForTcpPort(int port, absl::Duration timeout);

// A child process with its stdin and stdout as pipes (its stderr inherited): the benches' handle
// on the shared retrybudget::Subprocess (common/subprocess.h). Kills (SIGKILL) and reaps the
// child on destruction if it is still running. Movable. Thread-compatible.
class Child {
 public:
  // Starts `argv[0]` (a path) with `argv`. On failure the status names the program and why
  // (NOT_FOUND for a missing one).
  static absl::StatusOr<Child> Spawn(const std::vector<std::string>& argv);

  Child(Child&& other) noexcept = default;
  Child& operator=(Child&& other) noexcept = default;

  // -1 after a move.
  pid_t pid() const { return process_ != nullptr ? process_->pid() : -1; }

  // The next line of the child's stdout without its '\n'. DEADLINE_EXCEEDED after `timeout`,
  // OUT_OF_RANGE at end of file.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // Writes `line` and a '\n' to the child's stdin. UNAVAILABLE when the child closed it.
  absl::Status WriteLine(const std::string& line);
  // Sends `signo` and waits up to `timeout` for the child to exit (then SIGKILL). Returns the
  // wait status (0 after a move).
  int Stop(int signo, absl::Duration timeout);
  // How the child ended ("exited with status 2", ...) if it has exited (reaping it), else
  // nullopt. Never blocks.
  std::optional<std::string> Exited();

 private:
  explicit Child(std::unique_ptr<Subprocess> process) : process_(std::move(process)) {}

  std::unique_ptr<Subprocess> process_;
};

// A policy file line that never runs dry: grants are the common case, for load benchmarks.
inline constexpr char kUnlimitedPolicy[] =
    "default_policy { capacity: 1e9 refill_per_second: 1e9 success_credit: 0.1 "
    "lease_ttl_ms: 5000 }\n";

// Starts the retry-budget-server binary `server_bin` through the one launcher of servers under
// test (tests/support/test_launcher.h) on 127.0.0.1:0, with its port file and log in `dir` (which
// must exist) and, when `policy` is not empty, a policy file with that content there; waits until
// it serves. `extra_args` are passed on as they are (after the launcher's own flags). The
// launcher's status (naming the server and its log's tail) when it does not come up.
absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> StartBudgetServer(
    const std::string& server_bin, const std::string& dir, const std::string& policy,
    const std::vector<std::string>& extra_args = {});

// Resident set size of process `pid` (0: this process) in bytes, from /proc/PID/statm; -1 on
// error.
int64_t RssBytes(pid_t pid = 0);

// CPU time (user + system) process `pid` has used so far, in seconds; -1 on error.
double ProcessCpuSeconds(pid_t pid);

// Bytes currently allocated by malloc in this process (glibc mallinfo2().uordblks + hblkhd).
int64_t MallocInUseBytes();

// `s` with JSON string escaping, without the quotes.
std::string JsonEscape(const std::string& s);

// The path of this executable (/proc/self/exe resolved).
std::string SelfExe();

}  // namespace retrybudget::bench

#endif  // RETRYBUDGET_BENCH_BENCH_UTIL_H_
