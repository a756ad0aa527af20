// The faults of a cluster run (--cluster=N): a schedule of actions against a ClusterUnderTest
// (tests/support/test_launcher.h), played on a thread of its own while the fleet runs.
//
//   --cluster-chaos=ACTION@SECONDS[+SECONDS],...   e.g. kill:owner@3+2,stop-etcd@8+3
//
//   kill:S@T[+D]      kill -9 of server S at T; with +D, restarted (same port) D seconds later
//   stop:S@T+D        SIGSTOP of server S at T, SIGCONT D seconds later
//   term:S@T[+D]      SIGTERM of server S at T (its bounded stop: it hands its shards over),
//                     waited for (SIGKILL after 10 s); with +D, started again D seconds later
//   restart:S@T       start server S again (it must not be running)
//   kill-etcd-leader@T   kill -9 of the etcd leader (the others elect anew)
//   stop-etcd@T[+D]   kill -9 of every etcd member; with +D, all started again D seconds later
//   restart-etcd:M@T  kill -9 of etcd member M, started again at once with its data
//   stop-etcd:M@T+D   kill -9 of etcd member M, started again with its data D seconds later
//   lose-quorum@T+D   kill -9 of a majority of the etcd members (members 0..n/2), so that etcd
//                     has no quorum; started again with their data D seconds later, and the
//                     action waits (up to 20 s) for a leader
//   rolling-restart@T[+GAP]   from T, each server in turn: SIGTERM (it hands its shards over),
//                     started again on the same port, joined; GAP seconds (default 2) before
//                     the next
//
// S is a server index (0-based) or `owner`: the owner of the run's tenant (with several
// tenants, tenant 0) when the action is due (read from etcd). Each action is recorded with its
// time and what it hit; every kill -9, SIGSTOP and SIGTERM of a server is also a ServerHit.
// Every SIGTERM (term, rolling-restart) is timed until the server exited (a ServerStop), and
// every start of a server (restart, the +D of kill and term, rolling-restart) until its health
// (grpc.health.v1, whole server) answered SERVING (a ServerRestart): a watch polls each server's
// health every 50 ms while the chaos runs.
//
//   absl::StatusOr<std::vector<ClusterAction>> plan = ParseClusterChaos(flag);
//   ClusterChaos chaos(*cluster, *plan, tenant, run_start);
//   ... the fleet runs ...
//   std::vector<std::string> events = chaos.Finish();  // "3.002 kill -9 server 1 (owner)", ...
#ifndef RETRYBUDGET_TOOLS_FLEET_CLUSTER_CHAOS_H_
#define RETRYBUDGET_TOOLS_FLEET_CLUSTER_CHAOS_H_

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/support/test_launcher.h"
#include "tools/fleet/owner_watch.h"

namespace retrybudget::fleet {

struct ClusterAction {
  enum class Kind {
    kKill,
    kStop,
    kRestart,
    kKillEtcdLeader,
    kStopEtcd,
    kRollingRestart,
    kRestartEtcdMember,
    kStopEtcdMember,
    kLoseQuorum,
    kTerm
  };
  Kind kind = Kind::kKill;
  // The server's index (-1: the owner of the run's tenant); for restart-etcd:M and
  // stop-etcd:M, the etcd member's.
  int server = -1;
  double at = 0;                           // seconds from the run's start
  std::optional<double> for_seconds = {};  // the +D: undone that much later

  bool operator==(const ClusterAction&) const = default;
};

// The actions of --cluster-chaos, in the order given. INVALID_ARGUMENT naming the action for an
// unknown one, a bad server or time, a stop of a server or an etcd member (or a lost quorum)
// without +D, a server index not below `servers` or a member index not below `etcd_nodes`.
absl::StatusOr<std::vector<ClusterAction>> ParseClusterChaos(absl::string_view spec, int servers,
                                                             int etcd_nodes = 3);

// Not copyable. Finish() from the thread that created it; `cluster` must outlive it and must not
// be used by anyone else until Finish() returned.
class ClusterChaos {
 public:
  ClusterChaos(testing::ClusterUnderTest& cluster, std::vector<ClusterAction> plan,
               std::string tenant, std::chrono::steady_clock::time_point start);
  ~ClusterChaos();  // Finish()

  // Stops the actions not yet due, undoes a pause still in force (SIGCONT, etcd started again:
  // the final Syncs need a cluster), joins the thread and returns what happened, one line per
  // action: "<seconds> <what>". Idempotent.
  std::vector<std::string> Finish();
  // The servers hit (kill -9, SIGSTOP, SIGTERM), in order. After Finish().
  const std::vector<ServerHit>& hits() const { return hits_; }
  // Each SIGTERM and how long the server took to exit, in order. After Finish().
  const std::vector<ServerStop>& stops() const { return stops_; }
  // Each start of a server and how long until its health answered SERVING. After Finish().
  const std::vector<ServerRestart>& restarts() const { return restarts_; }

 private:
  void Play(std::stop_token stop);
  double Now() const;
  void Record(const std::string& what);
  // SIGTERM of server `server` (`who` names it), waited for; recorded as a stop.
  std::string Terminate(int server, const std::string& who);
  // Starts server `server` again; recorded as a restart.
  absl::Status Restart(int server);
  void WatchHealth(std::stop_token stop);

  testing::ClusterUnderTest& cluster_;
  const std::vector<ClusterAction> plan_;
  const std::string tenant_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<std::string> events_;  // written by thread_ until it is joined
  std::vector<ServerHit> hits_;      // written by thread_ until it is joined
  std::vector<ServerStop> stops_;    // written by thread_ until it is joined
  std::vector<ServerRestart> restarts_;  // written by thread_; serving_after by Finish()
  // Health polls: per server, (seconds the poll was sent, answered SERVING). Written by
  // health_thread_ until it is joined.
  std::vector<std::string> addresses_;
  std::vector<std::vector<std::pair<double, bool>>> health_;
  std::jthread health_thread_;
  std::jthread thread_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_CLUSTER_CHAOS_H_
