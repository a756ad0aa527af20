// The one launcher of "a server under test" and "a cluster under test", for the tests, the fleet
// tool (tools/fleet) and the benches (bench/). No gtest in here: every call returns a Status that
// names the server and the tail of its log.
//
//   absl::StatusOr<std::unique_ptr<ServerUnderTest>> server =
//       ServerUnderTest::Start({.binary = path, .flags = {"--policy=p.txt"}});
//   if (!server.ok()) return server.status();
//   std::string target = (*server)->address();  // "127.0.0.1:<port the server reported>"
//   (*server)->Kill();  (*server)->Restart();  // kill -9, then the same port and data dir
//
//   absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster =
//       ClusterUnderTest::Start({.servers = 3, .server_binary = path});
//   std::string target = (*cluster)->target();  // "ipv4:127.0.0.1:A,127.0.0.1:B,127.0.0.1:C"
//   absl::StatusOr<int> owner = (*cluster)->OwnerOf("payments");
//   (*cluster)->KillServer(*owner);  (*cluster)->etcd().KillEtcdLeader();
//
// A server under test runs on 127.0.0.1 in a directory of its own (a fresh temporary directory
// unless one is given, removed on destruction): its port file, its log (stdout and stderr), its
// metrics port file and, when asked, its --data_dir. It is serving once it has written its port
// file (the server writes it after it has bound its port). Its metrics endpoint is off unless
// asked for, so that parallel servers never compete for the default metrics port.
//
// A cluster under test is a TestCluster (a real etcd cluster on loopback, tests/support/
// test_cluster.h) and N servers started with --etcd_endpoints and --advertise on ports picked
// before they start (the advertised address must be known in advance). A cluster server has
// joined once its key P/servers/<id> with its advertised address is in etcd.
//
// Real processes, real (wall) time. Thread-compatible: one thread at a time drives a launcher
// object. Destruction kills (SIGKILL) every process still running.
#ifndef RETRYBUDGET_TESTS_SUPPORT_TEST_LAUNCHER_H_
#define RETRYBUDGET_TESTS_SUPPORT_TEST_LAUNCHER_H_

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "etcd/etcd_client.h"
#include "tests/support/test_cluster.h"

namespace retrybudget::testing {

// The exit code of retry-budget-server when it cannot bind its port (server/main.cc).
inline constexpr int kServerExitCannotServe = 1;

// Whether `binary --helpfull` lists `--flag` (false when it cannot be run).
bool BinaryHasFlag(const std::string& binary, absl::string_view flag);

// A fresh directory under `base` (empty: $TEST_TMPDIR, else $TMPDIR, else /tmp), removed with its
// contents on destruction.
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Make(const std::string& base = "");
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

struct ServerUnderTestOptions {
  std::string binary = {};  // path of retry-budget-server
  // Appended after the launcher's own flags (--listen, --port_file, --metrics_listen,
  // --data_dir), so they win.
  std::vector<std::string> flags = {};
  // Where the port files, the log and the data dir go; must exist. Empty: a fresh temporary
  // directory, removed on destruction.
  std::string dir = {};
  // The port to listen on; 0 lets the server pick one (read back from its port file).
  int port = 0;
  // Pass --data_dir=<dir>/data, so that a restart restores the state.
  bool data_dir = false;
  // Serve metrics on 127.0.0.1:0 (see metrics_port()); else --metrics_listen= (off).
  bool metrics = false;
  // The log's file name within `dir`.
  std::string log_name = "server.log";
  // Longest wait for a start (or restart) to serve, and for an exit.
  absl::Duration timeout = absl::Seconds(20);
};

class ServerUnderTest {
 public:
  // Starts the server and waits until it serves. INVALID_ARGUMENT for a binary that is not
  // executable; UNAVAILABLE (with the exit status and the log's tail) when it exits before
  // serving or does not serve within the timeout.
  static absl::StatusOr<std::unique_ptr<ServerUnderTest>> Start(ServerUnderTestOptions options);

  ServerUnderTest(const ServerUnderTest&) = delete;
  ServerUnderTest& operator=(const ServerUnderTest&) = delete;
  ~ServerUnderTest();

  int port() const { return port_; }
  std::string address() const;                        // "127.0.0.1:<port>"
  int metrics_port() const { return metrics_port_; }  // 0 without metrics
  const std::string& dir() const { return dir_; }
  std::string data_dir() const;  // <dir>/data (used only with options.data_dir)
  std::string log_path() const;
  const ServerUnderTestOptions& options() const { return options_; }
  // -1 when not running.
  pid_t pid() const;
  // True while the process has not exited (reaps it if it has).
  bool running();
  // The raw wait status of a server that exited by itself (or was stopped), nullopt while it runs
  // or after Kill().
  std::optional<int> exit_status();

  // Everything the server wrote to its log (across restarts: the log is appended to), and its
  // last `lines` lines.
  std::string Log() const;
  std::string LogTail(int lines = 20) const;

  // kill -9, and waits until it is dead. FAILED_PRECONDITION when none is running.
  absl::Status Kill();
  // SIGSTOP / SIGCONT: the process keeps its socket, so clients connect and then hang.
  absl::Status Pause();
  absl::Status Resume();
  // Sends `signal` to the running server (a no-op when none runs), e.g. SIGHUP to reload.
  void Signal(int signal);
  // Waits up to `timeout` for the server to exit by itself (after a Signal()): its exit code,
  // -N when signal N killed it, nullopt while it still runs (or when none was started).
  std::optional<int> WaitForExit(absl::Duration timeout);
  // Sends `signal` (then SIGCONT), waits up to `grace`, then SIGKILL. Returns the raw wait
  // status (see DescribeWaitStatus()). FAILED_PRECONDITION when none is running.
  absl::StatusOr<int> Stop(int signal = SIGTERM, absl::Duration grace = absl::Seconds(10));
  // Starts it again on the same port with the same directory and flags, and waits until it
  // serves; while the old socket is still held (the server exits "cannot serve") it tries again
  // until the timeout. FAILED_PRECONDITION when one is running.
  absl::Status Restart();
  // Waits until the running server has written its port file (it does once serving).
  // UNAVAILABLE when it exits first, DEADLINE_EXCEEDED after `timeout`.
  absl::Status WaitUntilServing(absl::Duration timeout);

  // The process, for what the above does not cover; null before the first start and after
  // Kill() or Stop().
  Subprocess* process() { return child_.get(); }

 private:
  explicit ServerUnderTest(ServerUnderTestOptions options) : options_(std::move(options)) {}
  // Spawns the server on `port` (0: any) and waits until it serves.
  absl::Status SpawnAndWait(int port);
  std::string port_file() const;
  std::string metrics_port_file() const;

  ServerUnderTestOptions options_;
  std::unique_ptr<TempDir> owned_dir_;
  std::string dir_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::unique_ptr<Subprocess> child_;
};

struct ClusterUnderTestOptions {
  TestClusterOptions etcd = {};
  // 0: the etcd nodes alone (the server binary is then not needed).
  int servers = 3;
  std::string server_binary = {};
  // Appended to every server's flags (after --etcd_endpoints, --advertise, --etcd_prefix,
  // --shards, --etcd_lease_ttl, --policy).
  std::vector<std::string> server_flags = {};
  // When not empty: a policy file's text (e.g. "default_policy { capacity: 50 }"), written to
  // <the etcd cluster's directory>/policy.textproto and given to every server as --policy.
  std::string policy = {};
  std::string etcd_prefix = "/retry-budget";
  int shards = 0;                                   // 0: the server's default (no flag)
  absl::Duration lease_ttl = absl::ZeroDuration();  // 0: the server's default (no flag)
  bool metrics = false;                             // as ServerUnderTestOptions::metrics
  bool data_dir = false;                            // as ServerUnderTestOptions::data_dir
  // Longest wait for a server to start and to join.
  absl::Duration timeout = absl::Seconds(20);
};

// A cluster whose every tenant has a budget bounded by time alone: `capacity` tokens refilled at
// `refill_per_second`, no success credit (clients' leases 2 s). What its servers grant together
// then stays within capacity + refill_per_second * elapsed, whoever owns the tenant: the bound the
// cluster tests check takeovers and etcd outages against.
struct TimeBoundCluster {
  std::string etcd_binary;
  std::string server_binary;
  int servers = 3;
  int shards = 8;
  absl::Duration lease_ttl = absl::Seconds(2);  // the servers' etcd leases
  double capacity = 50;
  double refill_per_second = 20;
  std::vector<std::string> server_flags = {};
};
ClusterUnderTestOptions TimeBoundClusterOptions(const TimeBoundCluster& cluster);

class ClusterUnderTest {
 public:
  // Starts the etcd nodes, then the servers, and waits until every server has joined.
  // FAILED_PRECONDITION "the server has no cluster mode: --etcd_endpoints unknown" when the
  // binary does not know the flag; otherwise the failing node's or server's status.
  static absl::StatusOr<std::unique_ptr<ClusterUnderTest>> Start(ClusterUnderTestOptions options);

  ClusterUnderTest(const ClusterUnderTest&) = delete;
  ClusterUnderTest& operator=(const ClusterUnderTest&) = delete;
  ~ClusterUnderTest();

  TestCluster& etcd() { return *etcd_; }
  etcd::EtcdClient& etcd_client() { return *etcd_client_; }
  const std::string& etcd_prefix() const { return options_.etcd_prefix; }
  int server_count() const { return static_cast<int>(servers_.size()); }
  ServerUnderTest& server(int i) { return *servers_[i]; }
  // "ipv4:127.0.0.1:A,127.0.0.1:B,...": every server, running or not, for ClientOptions::target.
  std::string target() const;

  absl::Status KillServer(int i) { return servers_[i]->Kill(); }
  absl::Status PauseServer(int i) { return servers_[i]->Pause(); }
  absl::Status ResumeServer(int i) { return servers_[i]->Resume(); }
  // Restarts a server that is not running (same port, same directory) and waits until it serves.
  absl::Status RestartServer(int i) { return servers_[i]->Restart(); }
  // Waits until server i's P/servers/<id> key holds its advertised address.
  absl::Status WaitUntilJoined(int i, absl::Duration timeout);

  // The index of the server that owns `tenant`'s shard now, read from etcd: the shard count from
  // P/config/shards, shard = ShardMap's hash, the owner's id from P/owners/<NNNN>, its address
  // from P/servers/<id>. NOT_FOUND when the shard has no owner (or an owner that is not one of
  // these servers).
  absl::StatusOr<int> OwnerOf(absl::string_view tenant);
  // Waits up to `timeout` until the shards have settled: every shard owned, each running server
  // owning some, and no owner changed for two reconcile periods (half the lease TTL, at least a
  // second; ownership then stays put until a server comes or goes). DEADLINE_EXCEEDED with the owners counted last.
  absl::Status WaitUntilBalanced(absl::Duration timeout);
  // OwnerOf, waiting up to `timeout` for the shard to have an owner.
  absl::StatusOr<int> WaitForOwner(absl::string_view tenant, absl::Duration timeout);
  // etcd's current revision: every write bumps it by one.
  absl::StatusOr<int64_t> EtcdRevision();

  absl::StatusOr<int> KillEtcdLeader() { return etcd_->KillEtcdLeader(); }
  absl::Status StopAllEtcd() { return etcd_->StopAllEtcd(); }
  absl::Status StartAllEtcd() { return etcd_->StartAllEtcd(); }

 private:
  ClusterUnderTest() = default;

  ClusterUnderTestOptions options_;
  std::unique_ptr<TestCluster> etcd_;
  std::unique_ptr<etcd::EtcdClient> etcd_client_;
  std::vector<std::unique_ptr<ServerUnderTest>> servers_;
};

// "ipv4:127.0.0.1:A,127.0.0.1:B" from {"127.0.0.1:A", "127.0.0.1:B"}; a single address as is.
std::string MultiAddressTarget(const std::vector<std::string>& addresses);

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_SUPPORT_TEST_LAUNCHER_H_
