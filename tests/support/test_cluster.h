// "A cluster under test": a real etcd cluster of a few nodes on loopback (free ports, a temporary
// directory per node, the Debian `etcd` binary), which tests can kill -9, stop and restart node by
// node, leader first, or all at once. It will also hold the N retry-budget servers that share the
// budgets through that etcd, so that tests, the fleet tool and the bench start a cluster one way;
// for now it runs the etcd nodes only.
//
//   absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start({});
//   if (!cluster.ok()) return cluster.status();
//   auto etcd = etcd::EtcdClient::Create({.endpoints = (*cluster)->etcd_endpoints()});
//   absl::StatusOr<int> killed = (*cluster)->KillEtcdLeader();  // kill -9; the rest elect anew
//   (*cluster)->PauseEtcdNode(0);  // SIGSTOP: a hung member
//   (*cluster)->StopAllEtcd();
//   (*cluster)->StartAllEtcd();  // same data, same ports
//
// No gtest in here: every call returns a Status naming the node and its log, so a tool can use
// it as well as a test. Real processes, real (wall) time.
//
// Thread-compatible: one thread drives a TestCluster. The destructor kills every process it
// started and removes its directory.
#ifndef RETRYBUDGET_TESTS_SUPPORT_TEST_CLUSTER_H_
#define RETRYBUDGET_TESTS_SUPPORT_TEST_CLUSTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace retrybudget::testing {

struct TestClusterOptions {
  int etcd_nodes = 3;
  // The etcd server binary.
  std::string etcd_binary = "/usr/bin/etcd";
  // Where the cluster's temporary directory is made: empty for $TEST_TMPDIR, else /dev/shm
  // (tmpfs: etcd's fsyncs cost nothing), else $TMPDIR, else /tmp.
  std::string base_dir = {};
  // Longest wait for a node to start, for a leader, for a node to die.
  absl::Duration timeout = absl::Seconds(20);
  // Raft timing of the nodes: shorter than etcd's defaults (100 ms, 1 s), so that a new leader
  // is elected within about a second of the old one's death.
  absl::Duration heartbeat_interval = absl::Milliseconds(50);
  absl::Duration election_timeout = absl::Milliseconds(500);
};

class TestCluster {
 public:
  // Starts the etcd nodes and waits until they have elected a leader. On failure, the status
  // names the node and the tail of its log; nothing is left running.
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(TestClusterOptions options);

  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;
  ~TestCluster();

  int etcd_node_count() const { return static_cast<int>(nodes_.size()); }
  // "127.0.0.1:P1,127.0.0.1:P2,...": every node's client address, running or not.
  std::string etcd_endpoints() const;
  // One node's client address.
  std::string etcd_endpoint(int node) const;
  bool etcd_running(int node) const;
  // The cluster's temporary directory (each node's data and log are under it).
  const std::string& dir() const { return dir_; }

  // Waits until a running node reports a leader that is itself running, and returns that
  // leader's index. DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<int> WaitForEtcdLeader(absl::Duration timeout);
  // kill -9 of one node (a no-op for a node not running); waits until it is dead.
  absl::Status KillEtcdNode(int node);
  // Finds the leader (waiting for one as WaitForEtcdLeader does), kills it with kill -9 and
  // returns its index.
  absl::StatusOr<int> KillEtcdLeader();
  // Starts a node that is not running again, with its data and ports. Does not wait for a leader.
  absl::Status RestartEtcdNode(int node);
  // SIGSTOP of one running node: it keeps its connections open but answers nothing (a hung
  // member). ResumeEtcdNode (SIGCONT) undoes it; the destructor kills it either way.
  absl::Status PauseEtcdNode(int node);
  absl::Status ResumeEtcdNode(int node);
  // kill -9 of every node.
  absl::Status StopAllEtcd();
  // Starts every node that is not running and waits for a leader.
  absl::Status StartAllEtcd();

  // The last lines of a node's log, for failure messages.
  std::string EtcdLogTail(int node) const;

 private:
  struct EtcdNode {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log_path;
    std::unique_ptr<Subprocess> process;
  };

  TestCluster(TestClusterOptions options, std::string dir);
  absl::Status StartNode(int node);
  // The leader's member id as `node` reports it, and `node`'s own member id.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> NodeStatus(int node);

  const TestClusterOptions options_;
  const std::string dir_;
  std::vector<EtcdNode> nodes_;
  std::string initial_cluster_;  // "n0=http://127.0.0.1:P,..."
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed).
absl::StatusOr<int> PickFreePort();

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_SUPPORT_TEST_CLUSTER_H_
