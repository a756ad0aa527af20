#include "tests/support/test_cluster.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace retrybudget::testing {
namespace {

// Waiting here is waiting for real processes: polling, in real time.
constexpr absl::Duration kPoll = absl::Milliseconds(50);
constexpr int kLogTailLines = 15;

// Where the cluster's directory (etcd's data and the logs) goes: the configured base, else
// TEST_TMPDIR, else /dev/shm when it is a writable directory, else TMPDIR, else /tmp. etcd
// fsyncs its log on every write; on tmpfs that costs nothing, so a busy disk (a build beside the
// tests) cannot stall a test's etcd past its election timeout or a test's deadline. A kill -9
// of a member keeps what it wrote (the page cache survives the process), as on a disk.
std::string BaseDir(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* test_tmpdir = getenv("TEST_TMPDIR");
  if (test_tmpdir != nullptr && test_tmpdir[0] != '\0') return test_tmpdir;
  struct stat shm {};
  if (stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) && access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  const char* tmpdir = getenv("TMPDIR");
  if (tmpdir != nullptr && tmpdir[0] != '\0') return tmpdir;
  return "/tmp";
}

std::string Url(int port) { return absl::StrCat("http://127.0.0.1:", port); }

}  // namespace

absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", strerror(error)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

TestCluster::TestCluster(TestClusterOptions options, std::string dir)
    : options_(std::move(options)), dir_(std::move(dir)) {}

TestCluster::~TestCluster() {
  for (EtcdNode& node : nodes_) node.process.reset();  // SIGKILL and reap
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(TestClusterOptions options) {
  if (options.etcd_nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a cluster needs at least one etcd node, not ", options.etcd_nodes));
  }
  if (access(options.etcd_binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("no etcd binary at ", options.etcd_binary, " (Debian package etcd-server)"));
  }
  std::string dir = absl::StrCat(BaseDir(options.base_dir), "/retry-budget-cluster-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir, ": ", strerror(errno)));
  }
  std::unique_ptr<TestCluster> cluster(new TestCluster(options, dir));
  std::vector<std::string> members;
  // A port is free when picked and released at once, so the kernel may hand the same number out
  // twice in a row: every port of the cluster is distinct, or etcd refuses the member list.
  absl::flat_hash_set<int> taken;
  auto pick_distinct = [&taken]() -> absl::StatusOr<int> {
    for (int attempt = 0; attempt < 100; ++attempt) {
      absl::StatusOr<int> port = PickFreePort();
      if (!port.ok() || taken.insert(*port).second) return port;
    }
    return absl::ResourceExhaustedError("no distinct free port in 100 picks");
  };
  for (int i = 0; i < options.etcd_nodes; ++i) {
    EtcdNode node;
    node.name = absl::StrCat("etcd", i);
    absl::StatusOr<int> client_port = pick_distinct();
    if (!client_port.ok()) return client_port.status();
    absl::StatusOr<int> peer_port = pick_distinct();
    if (!peer_port.ok()) return peer_port.status();
    node.client_port = *client_port;
    node.peer_port = *peer_port;
    node.data_dir = absl::StrCat(dir, "/", node.name, ".data");
    node.log_path = absl::StrCat(dir, "/", node.name, ".log");
    members.push_back(absl::StrCat(node.name, "=", Url(node.peer_port)));
    cluster->nodes_.push_back(std::move(node));
  }
  cluster->initial_cluster_ = absl::StrJoin(members, ",");
  for (int i = 0; i < options.etcd_nodes; ++i) {
    if (absl::Status status = cluster->StartNode(i); !status.ok()) return status;
  }
  if (absl::StatusOr<int> leader = cluster->WaitForEtcdLeader(options.timeout); !leader.ok()) {
    return leader.status();
  }
  return cluster;
}

absl::Status TestCluster::StartNode(int index) {
  EtcdNode& node = nodes_[index];
  std::vector<std::string> argv = {
      options_.etcd_binary,
      absl::StrCat("--name=", node.name),
      absl::StrCat("--data-dir=", node.data_dir),
      absl::StrCat("--listen-client-urls=", Url(node.client_port)),
      absl::StrCat("--advertise-client-urls=", Url(node.client_port)),
      absl::StrCat("--listen-peer-urls=", Url(node.peer_port)),
      absl::StrCat("--initial-advertise-peer-urls=", Url(node.peer_port)),
      absl::StrCat("--initial-cluster=", initial_cluster_),
      "--initial-cluster-state=new",
      absl::StrCat("--initial-cluster-token=", dir_),
      absl::StrCat("--heartbeat-interval=", absl::ToInt64Milliseconds(options_.heartbeat_interval)),
      absl::StrCat("--election-timeout=", absl::ToInt64Milliseconds(options_.election_timeout)),
      "--logger=zap",
      "--log-level=warn",
  };
  // Through `sh -c exec` so that the log is appended to (a restarted node's log follows its
  // earlier life); the child is etcd itself, so its pid is etcd's.
  std::vector<std::string> sh = {"/bin/sh", "-c", "exec \"$@\" >>\"$0\" 2>&1", node.log_path};
  sh.insert(sh.end(), argv.begin(), argv.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(std::move(sh));
  if (!process.ok()) return process.status();
  node.process = *std::move(process);
  return absl::OkStatus();
}

std::string TestCluster::etcd_endpoints() const {
  std::vector<std::string> endpoints;
  for (int i = 0; i < etcd_node_count(); ++i) endpoints.push_back(etcd_endpoint(i));
  return absl::StrJoin(endpoints, ",");
}

std::string TestCluster::etcd_endpoint(int node) const {
  return absl::StrCat("127.0.0.1:", nodes_[node].client_port);
}

bool TestCluster::etcd_running(int node) const {
  const std::unique_ptr<Subprocess>& process = nodes_[node].process;
  return process != nullptr && !process->Poll().has_value();
}

std::string TestCluster::EtcdLogTail(int node) const {
  std::ifstream in(nodes_[node].log_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (lines.size() > kLogTailLines) lines.erase(lines.begin());
  }
  return absl::StrCat(nodes_[node].name, " (", nodes_[node].log_path, "):\n",
                      absl::StrJoin(lines, "\n"));
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> TestCluster::NodeStatus(int node) {
  auto channel = grpc::CreateChannel(etcd_endpoint(node), grpc::InsecureChannelCredentials());
  auto stub = etcdserverpb::Maintenance::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  etcdserverpb::StatusResponse response;
  const grpc::Status status = stub->Status(&context, etcdserverpb::StatusRequest(), &response);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("etcd Status at ", etcd_endpoint(node), ": ", status.error_message()));
  }
  return std::make_pair(response.leader(), response.header().member_id());
}

absl::StatusOr<int> TestCluster::WaitForEtcdLeader(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last_error = "no node running";
  while (absl::Now() < deadline) {
    // Member ids of the running nodes, and the leader one of them names.
    std::vector<uint64_t> ids(nodes_.size(), 0);
    uint64_t leader = 0;
    for (int i = 0; i < etcd_node_count(); ++i) {
      if (!etcd_running(i)) continue;
      absl::StatusOr<std::pair<uint64_t, uint64_t>> status = NodeStatus(i);
      if (!status.ok()) {
        last_error = std::string(status.status().message());
        continue;
      }
      ids[i] = status->second;
      if (status->first != 0) leader = status->first;
    }
    for (int i = 0; i < etcd_node_count() && leader != 0; ++i) {
      if (ids[i] == leader) return i;
    }
    if (leader == 0) last_error = "no leader elected yet";
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(kPoll));
  }
  std::vector<std::string> logs;
  for (int i = 0; i < etcd_node_count(); ++i) logs.push_back(EtcdLogTail(i));
  return absl::DeadlineExceededError(absl::StrCat("etcd cluster has no leader after ",
                                                  absl::FormatDuration(timeout), " (", last_error,
                                                  ")\n", absl::StrJoin(logs, "\n")));
}

absl::Status TestCluster::KillEtcdNode(int node) {
  if (node < 0 || node >= etcd_node_count()) {
    return absl::InvalidArgumentError(absl::StrCat("no etcd node ", node));
  }
  std::unique_ptr<Subprocess>& process = nodes_[node].process;
  if (process == nullptr) return absl::OkStatus();
  process->Signal(SIGKILL);
  absl::StatusOr<int> status = process->Wait(absl::Now() + options_.timeout);
  if (!status.ok()) return status.status();
  process.reset();
  return absl::OkStatus();
}

absl::StatusOr<int> TestCluster::KillEtcdLeader() {
  absl::StatusOr<int> leader = WaitForEtcdLeader(options_.timeout);
  if (!leader.ok()) return leader.status();
  if (absl::Status status = KillEtcdNode(*leader); !status.ok()) return status;
  return *leader;
}

absl::Status TestCluster::RestartEtcdNode(int node) {
  if (node < 0 || node >= etcd_node_count()) {
    return absl::InvalidArgumentError(absl::StrCat("no etcd node ", node));
  }
  if (etcd_running(node)) {
    return absl::FailedPreconditionError(absl::StrCat(nodes_[node].name, " is running"));
  }
  return StartNode(node);
}

absl::Status TestCluster::PauseEtcdNode(int node) {
  if (node < 0 || node >= etcd_node_count() || !etcd_running(node)) {
    return absl::FailedPreconditionError(absl::StrCat("etcd node ", node, " is not running"));
  }
  nodes_[node].process->Signal(SIGSTOP);
  return absl::OkStatus();
}

absl::Status TestCluster::ResumeEtcdNode(int node) {
  if (node < 0 || node >= etcd_node_count() || !etcd_running(node)) {
    return absl::FailedPreconditionError(absl::StrCat("etcd node ", node, " is not running"));
  }
  nodes_[node].process->Signal(SIGCONT);
  return absl::OkStatus();
}

absl::Status TestCluster::StopAllEtcd() {
  for (int i = 0; i < etcd_node_count(); ++i) {
    if (absl::Status status = KillEtcdNode(i); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status TestCluster::StartAllEtcd() {
  for (int i = 0; i < etcd_node_count(); ++i) {
    if (etcd_running(i)) continue;
    if (absl::Status status = StartNode(i); !status.ok()) return status;
  }
  return WaitForEtcdLeader(options_.timeout).status();
}

}  // namespace retrybudget::testing
