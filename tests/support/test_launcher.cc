#include "tests/support/test_launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"

namespace retrybudget::testing {
namespace {

// Waiting here is waiting for real processes: polling, in real time.
constexpr absl::Duration kPoll = absl::Milliseconds(5);
constexpr absl::Duration kJoinPoll = absl::Milliseconds(50);
// retry-budget-server's --etcd_lease_ttl default (server/main.cc).
constexpr absl::Duration kServerDefaultLeaseTtl = absl::Seconds(5);

std::string BaseDir(const std::string& configured) {
  if (!configured.empty()) return configured;
  for (const char* name : {"TEST_TMPDIR", "TMPDIR"}) {
    const char* value = getenv(name);
    if (value != nullptr && value[0] != '\0') return value;
  }
  return "/tmp";
}

// The port in a port file, nullopt while there is none (the server writes it atomically).
std::optional<int> ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int port = 0;
  if (in && std::getline(in, line) && absl::SimpleAtoi(line, &port) && port > 0) return port;
  return std::nullopt;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

bool BinaryHasFlag(const std::string& binary, absl::string_view flag) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child =
      Subprocess::Spawn({binary, "--helpfull"}, {.pipe_stdout = true});
  if (!child.ok()) return false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const std::string wanted = absl::StrCat("--", flag, " ");
  bool found = false;
  for (absl::StatusOr<std::string> line = (*child)->ReadLine(deadline); line.ok();
       line = (*child)->ReadLine(deadline)) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(*line), wanted)) found = true;
  }
  (void)(*child)->Wait(deadline);
  return found;
}

std::string MultiAddressTarget(const std::vector<std::string>& addresses) {
  if (addresses.size() == 1) return addresses[0];
  return absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
}

// TempDir

absl::StatusOr<std::unique_ptr<TempDir>> TempDir::Make(const std::string& base) {
  std::string dir = absl::StrCat(BaseDir(base), "/retry-budget-test-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir, ": ", strerror(errno)));
  }
  return std::unique_ptr<TempDir>(new TempDir(std::move(dir)));
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

// ServerUnderTest

absl::StatusOr<std::unique_ptr<ServerUnderTest>> ServerUnderTest::Start(
    ServerUnderTestOptions options) {
  if (options.binary.empty() || access(options.binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("retry-budget-server '", options.binary, "' is not an executable file"));
  }
  std::unique_ptr<ServerUnderTest> s(new ServerUnderTest(std::move(options)));
  if (s->options_.dir.empty()) {
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Make();
    if (!dir.ok()) return dir.status();
    s->owned_dir_ = *std::move(dir);
    s->dir_ = s->owned_dir_->path();
  } else {
    if (access(s->options_.dir.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("server dir '", s->options_.dir, "' is not a writable directory"));
    }
    s->dir_ = s->options_.dir;
  }
  if (absl::Status st = s->SpawnAndWait(s->options_.port); !st.ok()) return st;
  return s;
}

ServerUnderTest::~ServerUnderTest() {
  child_.reset();  // SIGKILL and reap, before the directory goes
  owned_dir_.reset();
}

std::string ServerUnderTest::address() const { return absl::StrCat("127.0.0.1:", port_); }
std::string ServerUnderTest::data_dir() const { return absl::StrCat(dir_, "/data"); }
std::string ServerUnderTest::log_path() const { return absl::StrCat(dir_, "/", options_.log_name); }
std::string ServerUnderTest::port_file() const { return absl::StrCat(dir_, "/server.port"); }
std::string ServerUnderTest::metrics_port_file() const {
  return absl::StrCat(dir_, "/metrics.port");
}

pid_t ServerUnderTest::pid() const { return child_ != nullptr ? child_->pid() : -1; }

bool ServerUnderTest::running() { return child_ != nullptr && !child_->Poll().has_value(); }

std::optional<int> ServerUnderTest::exit_status() {
  if (child_ == nullptr) return std::nullopt;
  return child_->Poll();
}

std::string ServerUnderTest::Log() const { return ReadWholeFile(log_path()); }

std::string ServerUnderTest::LogTail(int lines) const {
  std::istringstream in(Log());
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(std::move(line));
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

absl::Status ServerUnderTest::SpawnAndWait(int port) {
  std::remove(port_file().c_str());
  std::remove(metrics_port_file().c_str());
  std::vector<std::string> argv = {options_.binary, absl::StrCat("--listen=127.0.0.1:", port),
                                   absl::StrCat("--port_file=", port_file())};
  if (options_.metrics) {
    // On a restart the metrics endpoint takes any free port again (read back below).
    argv.push_back("--metrics_listen=127.0.0.1:0");
    argv.push_back(absl::StrCat("--metrics_port_file=", metrics_port_file()));
  } else {
    argv.push_back("--metrics_listen=");
  }
  if (options_.data_dir) argv.push_back(absl::StrCat("--data_dir=", data_dir()));
  argv.insert(argv.end(), options_.flags.begin(), options_.flags.end());
  // Through `sh -c exec` so that the log is appended to (a restarted server's log follows its
  // earlier life); the child is the server itself, so its pid is the server's.
  std::vector<std::string> sh = {"/bin/sh", "-c", "exec \"$@\" >>\"$0\" 2>&1", log_path()};
  sh.insert(sh.end(), argv.begin(), argv.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Spawn(std::move(sh));
  if (!child.ok()) return child.status();
  child_ = *std::move(child);
  absl::Status serving = WaitUntilServing(options_.timeout);
  if (!serving.ok()) {
    child_.reset();
    return absl::Status(serving.code(),
                        absl::StrCat("retry-budget-server on 127.0.0.1:", port, ": ",
                                     serving.message(), "; its log:\n", LogTail()));
  }
  return absl::OkStatus();
}

absl::Status ServerUnderTest::WaitUntilServing(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (child_ == nullptr) return absl::FailedPreconditionError("no server running");
    const std::optional<int> port = ReadPortFile(port_file());
    const std::optional<int> metrics =
        options_.metrics ? ReadPortFile(metrics_port_file()) : std::optional<int>(0);
    if (port.has_value() && metrics.has_value()) {
      port_ = *port;
      metrics_port_ = *metrics;
      return absl::OkStatus();
    }
    if (std::optional<int> exited = child_->Poll(); exited.has_value()) {
      return absl::UnavailableError(
          absl::StrCat("exited before serving: ", DescribeWaitStatus(*exited)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("wrote no port file within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(kPoll);
  }
}

absl::Status ServerUnderTest::Kill() {
  if (!running()) return absl::FailedPreconditionError("no server running to kill");
  child_->Signal(SIGKILL);
  absl::StatusOr<int> status = child_->Wait(absl::Now() + options_.timeout);
  if (!status.ok()) return status.status();
  child_.reset();
  return absl::OkStatus();
}

absl::Status ServerUnderTest::Pause() {
  if (!running()) return absl::FailedPreconditionError("no server running to pause");
  child_->Signal(SIGSTOP);
  return absl::OkStatus();
}

absl::Status ServerUnderTest::Resume() {
  if (!running()) return absl::FailedPreconditionError("no server running to resume");
  child_->Signal(SIGCONT);
  return absl::OkStatus();
}

void ServerUnderTest::Signal(int signal) {
  if (child_ != nullptr) child_->Signal(signal);
}

std::optional<int> ServerUnderTest::WaitForExit(absl::Duration timeout) {
  if (child_ == nullptr) return std::nullopt;
  absl::StatusOr<int> status = child_->Wait(absl::Now() + timeout);
  if (!status.ok()) return std::nullopt;
  if (WIFEXITED(*status)) return WEXITSTATUS(*status);
  if (WIFSIGNALED(*status)) return -WTERMSIG(*status);
  return std::nullopt;
}

absl::StatusOr<int> ServerUnderTest::Stop(int signal, absl::Duration grace) {
  if (child_ == nullptr) return absl::FailedPreconditionError("no server running to stop");
  absl::StatusOr<int> status = child_->Stop(signal, grace);
  child_.reset();
  return status;
}

absl::Status ServerUnderTest::Restart() {
  if (running()) return absl::FailedPreconditionError("the server is still running");
  const absl::Time deadline = absl::Now() + options_.timeout;
  const int port = port_;
  while (true) {
    absl::Status st = SpawnAndWait(port);
    if (st.ok()) return st;
    // "cannot serve" is the port still held by the killed server's socket: try again.
    const bool retry =
        absl::StrContains(st.message(), absl::StrCat("exit code ", kServerExitCannotServe));
    if (!retry || absl::Now() >= deadline) return st;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// ClusterUnderTest

ClusterUnderTestOptions TimeBoundClusterOptions(const TimeBoundCluster& cluster) {
  return {.etcd = {.etcd_binary = cluster.etcd_binary},
          .servers = cluster.servers,
          .server_binary = cluster.server_binary,
          .server_flags = cluster.server_flags,
          .policy = absl::StrCat("default_policy { capacity: ", cluster.capacity,
                                 " refill_per_second: ", cluster.refill_per_second,
                                 " success_credit: 0 lease_ttl_ms: 2000 }"),
          .shards = cluster.shards,
          .lease_ttl = cluster.lease_ttl};
}

absl::StatusOr<std::unique_ptr<ClusterUnderTest>> ClusterUnderTest::Start(
    ClusterUnderTestOptions options) {
  if (options.servers > 0 && access(options.server_binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("retry-budget-server '", options.server_binary,
                                                   "' is not an executable file"));
  }
  if (options.servers > 0 && !BinaryHasFlag(options.server_binary, "etcd_endpoints")) {
    return absl::FailedPreconditionError(
        "the server has no cluster mode: --etcd_endpoints unknown");
  }
  std::unique_ptr<ClusterUnderTest> c(new ClusterUnderTest());
  c->options_ = std::move(options);
  absl::StatusOr<std::unique_ptr<TestCluster>> etcd = TestCluster::Start(c->options_.etcd);
  if (!etcd.ok()) return etcd.status();
  c->etcd_ = *std::move(etcd);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
      etcd::EtcdClient::Create({.endpoints = c->etcd_->etcd_endpoints()});
  if (!client.ok()) return client.status();
  c->etcd_client_ = *std::move(client);
  std::string policy_flag;
  if (!c->options_.policy.empty()) {
    const std::string path = c->etcd_->dir() + "/policy.textproto";
    std::ofstream out(path);
    out << c->options_.policy;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write the policy file ", path));
    policy_flag = "--policy=" + path;
  }

  for (int i = 0; i < c->options_.servers; ++i) {
    // The advertised address must be known before the server starts: pick the port first.
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    std::vector<std::string> flags = {absl::StrCat("--etcd_endpoints=", c->etcd_->etcd_endpoints()),
                                      absl::StrCat("--advertise=127.0.0.1:", *port),
                                      absl::StrCat("--etcd_prefix=", c->options_.etcd_prefix)};
    if (c->options_.shards > 0) flags.push_back(absl::StrCat("--shards=", c->options_.shards));
    if (c->options_.lease_ttl > absl::ZeroDuration()) {
      flags.push_back(
          absl::StrCat("--etcd_lease_ttl=", absl::FormatDuration(c->options_.lease_ttl)));
    }
    if (!policy_flag.empty()) flags.push_back(policy_flag);
    flags.insert(flags.end(), c->options_.server_flags.begin(), c->options_.server_flags.end());
    absl::StatusOr<std::unique_ptr<ServerUnderTest>> server =
        ServerUnderTest::Start({.binary = c->options_.server_binary,
                                .flags = std::move(flags),
                                .port = *port,
                                .data_dir = c->options_.data_dir,
                                .metrics = c->options_.metrics,
                                .log_name = absl::StrCat("server", i, ".log"),
                                .timeout = c->options_.timeout});
    if (!server.ok()) return server.status();
    c->servers_.push_back(*std::move(server));
  }
  for (int i = 0; i < c->server_count(); ++i) {
    if (absl::Status st = c->WaitUntilJoined(i, c->options_.timeout); !st.ok()) return st;
  }
  return c;
}

ClusterUnderTest::~ClusterUnderTest() {
  servers_.clear();  // before etcd, so that no server is left waiting for it
  etcd_client_.reset();
  etcd_.reset();
}

std::string ClusterUnderTest::target() const {
  std::vector<std::string> addresses;
  for (const auto& server : servers_) addresses.push_back(server->address());
  return MultiAddressTarget(addresses);
}

absl::Status ClusterUnderTest::WaitUntilJoined(int i, absl::Duration timeout) {
  const std::string address = servers_[i]->address();
  const absl::Time deadline = absl::Now() + timeout;
  std::string last_error = "no key under " + cluster::ServersPrefix(options_.etcd_prefix);
  while (absl::Now() < deadline) {
    if (!servers_[i]->running()) {
      return absl::UnavailableError(absl::StrCat("server ", i, " (", address,
                                                 ") exited before joining; its log:\n",
                                                 servers_[i]->LogTail()));
    }
    absl::StatusOr<etcd::RangeResult> keys =
        etcd_client_->GetPrefix(cluster::ServersPrefix(options_.etcd_prefix));
    if (keys.ok()) {
      for (const etcd::KeyValue& kv : keys->kvs) {
        if (kv.value == address) return absl::OkStatus();
      }
    } else {
      last_error = std::string(keys.status().message());
    }
    absl::SleepFor(kJoinPoll);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "server ", i, " (", address, ") did not join within ", absl::FormatDuration(timeout), " (",
      last_error, "); its log:\n", servers_[i]->LogTail()));
}

absl::StatusOr<int> ClusterUnderTest::OwnerOf(absl::string_view tenant) {
  absl::StatusOr<etcd::RangeResult> count =
      etcd_client_->Get(cluster::ShardCountKey(options_.etcd_prefix));
  if (!count.ok()) return count.status();
  int shards = 0;
  if (count->kvs.empty() || !absl::SimpleAtoi(count->kvs[0].value, &shards) || shards < 1) {
    return absl::NotFoundError(
        absl::StrCat("no shard count at ", cluster::ShardCountKey(options_.etcd_prefix)));
  }
  const int shard = cluster::ShardMap(shards).ShardOf(tenant);
  const std::string owner_key = cluster::ShardOwnerKey(options_.etcd_prefix, shard);
  absl::StatusOr<etcd::RangeResult> owner = etcd_client_->Get(owner_key);
  if (!owner.ok()) return owner.status();
  if (owner->kvs.empty()) {
    return absl::NotFoundError(absl::StrCat("shard ", shard, " of '", tenant, "' has no owner"));
  }
  const std::string server_key = cluster::ServerKey(options_.etcd_prefix, owner->kvs[0].value);
  absl::StatusOr<etcd::RangeResult> server = etcd_client_->Get(server_key);
  if (!server.ok()) return server.status();
  if (server->kvs.empty()) {
    return absl::NotFoundError(absl::StrCat("shard ", shard, "'s owner '", owner->kvs[0].value,
                                            "' has no key ", server_key));
  }
  for (int i = 0; i < server_count(); ++i) {
    if (servers_[i]->address() == server->kvs[0].value) return i;
  }
  return absl::NotFoundError(absl::StrCat("shard ", shard, "'s owner advertises ",
                                          server->kvs[0].value, ", none of this cluster's"));
}

absl::Status ClusterUnderTest::WaitUntilBalanced(absl::Duration timeout) {
  // Servers reconcile every lease TTL / 4 when nothing wakes them: two of those without a change.
  const absl::Duration ttl =
      options_.lease_ttl > absl::ZeroDuration() ? options_.lease_ttl : kServerDefaultLeaseTtl;
  const absl::Duration settled_for = std::max(absl::Seconds(1), ttl / 2);
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no shard count in etcd yet";
  std::string assignment;  // the owner keys and values last read
  absl::Time assigned_since = absl::InfiniteFuture();
  while (true) {
    absl::StatusOr<etcd::RangeResult> count =
        etcd_client_->Get(cluster::ShardCountKey(options_.etcd_prefix));
    absl::StatusOr<etcd::RangeResult> owners =
        etcd_client_->GetPrefix(cluster::OwnersPrefix(options_.etcd_prefix));
    int shards = 0;
    if (count.ok() && owners.ok() && !count->kvs.empty() &&
        absl::SimpleAtoi(count->kvs[0].value, &shards) && shards > 0) {
      // Owner keys hold server ids; a server's id is its advertised address.
      std::vector<int> owned(servers_.size(), 0);
      int owned_shards = 0;
      std::string now_assigned;
      for (const etcd::KeyValue& kv : owners->kvs) {
        if (!cluster::ShardOfOwnerKey(options_.etcd_prefix, kv.key).has_value()) continue;
        ++owned_shards;
        absl::StrAppend(&now_assigned, kv.key, "=", kv.value, ";");
        for (size_t i = 0; i < servers_.size(); ++i) {
          if (servers_[i]->address() == kv.value) ++owned[i];
        }
      }
      if (now_assigned != assignment) {
        assignment = now_assigned;
        assigned_since = absl::Now();
      }
      bool settled = owned_shards == shards && absl::Now() - assigned_since >= settled_for;
      for (size_t i = 0; settled && i < servers_.size(); ++i) {
        if (servers_[i]->running() && owned[i] == 0) settled = false;
      }
      if (settled) return absl::OkStatus();
      last = absl::StrCat(owned_shards, " of ", shards, " shards owned; per server: ",
                          absl::StrJoin(owned, ", "));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shards not settled: ", last));
    }
    absl::SleepFor(kJoinPoll);
  }
}

absl::StatusOr<int> ClusterUnderTest::WaitForOwner(absl::string_view tenant,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<int> owner = OwnerOf(tenant);
    if (owner.ok() || absl::Now() >= deadline) return owner;
    absl::SleepFor(kJoinPoll);
  }
}

absl::StatusOr<int64_t> ClusterUnderTest::EtcdRevision() {
  absl::StatusOr<etcd::RangeResult> any =
      etcd_client_->Get(cluster::ShardCountKey(options_.etcd_prefix));
  if (!any.ok()) return any.status();
  return any->revision;
}

}  // namespace retrybudget::testing
