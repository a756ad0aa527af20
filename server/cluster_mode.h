// The server's cluster mode (--etcd_endpoints): the etcd client, the shard map, the ownership of
// shards and the ClusterRouter the core asks, wired together, and the health status that follows
// whether the server can be sure of its lease. main.cc's only piece of cluster code.
//
//   absl::StatusOr<std::unique_ptr<ClusterMode>> cluster = ClusterMode::Create(flags, log);
//   core options: .router = (*cluster)->router()
//   ... start the gRPC server ...
//   (*cluster)->Join(core, server, advertise, refused);  // NOT_SERVING until joined
//   ... SIGTERM ...
//   (*cluster)->Leave(deadline);  // writes every owned shard's state, hands the shards over
//
// Until it has joined (etcd unreachable or without quorum at start), the server is up but
// NOT_SERVING, and refuses every tenant's Sync entry with UNAVAILABLE and no owner (the router
// has no ownership yet); it retries etcd with backoff and serves as soon as it has joined.
#ifndef RETRYBUDGET_SERVER_CLUSTER_MODE_H_
#define RETRYBUDGET_SERVER_CLUSTER_MODE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/ownership_manager.h"
#include "etcd/etcd_client.h"
#include "server/budget_core.h"
#include "server/budget_server.h"
#include "server/cluster_router.h"

namespace retrybudget {

struct ClusterFlags {
  std::string etcd_endpoints;  // empty: a single server, none of this
  std::string advertise;       // empty: the listen host with the bound port
  std::string etcd_prefix = "/retry-budget";
  int shards = 64;
  absl::Duration lease_ttl = absl::Seconds(5);
  std::string etcd_ca, etcd_cert, etcd_key;  // PEM files; etcd_ca alone: server-only TLS
  // Join() fails at once when etcd cannot be reached, instead of waiting for it.
  bool exit_if_etcd_unavailable = false;
  bool enabled() const { return !etcd_endpoints.empty(); }
};

// INVALID_ARGUMENT naming the flag for a bad combination (checked without etcd).
absl::Status ValidateClusterFlags(const ClusterFlags& flags);

class ClusterMode {
 public:
  // Checks the flags and makes the etcd client (no etcd call: it connects on first use).
  // INVALID_ARGUMENT for a bad configuration (a PEM file that cannot be read included).
  static absl::StatusOr<std::unique_ptr<ClusterMode>> Create(
      const ClusterFlags& flags, std::function<void(absl::string_view)> log);
  ~ClusterMode();

  TenantRouter* router() { return router_.get(); }
  const ClusterRouter& cluster_router() const { return *router_; }
  // Null until joined.
  const cluster::OwnershipManager* ownership() const {
    return joined_.load(std::memory_order_acquire);
  }
  const cluster::ShardMap& map() const { return map_; }
  const ClusterFlags& flags() const { return flags_; }

  // Joins the cluster: checks the number of shards against etcd's (ShardMap::Join), registers
  // this server at `advertise` and starts owning its share of the shards; keeps `server`'s health
  // SERVING exactly while the server is surely alive (NOT_SERVING until joined). `core` and
  // `server` must outlive Leave().
  // With flags.exit_if_etcd_unavailable: one attempt, and its error (FAILED_PRECONDITION when
  // etcd holds another number of shards, etcd's error otherwise). Without: returns OK at once
  // and joins in the background, trying etcd again with backoff (200 ms doubling to 2 s; a log
  // line at most every 10 s) until it has joined or Leave(); when etcd holds another number of
  // shards, `refused` is called with that error (from the joining thread) and joining stops.
  absl::Status Join(BudgetCore* core, BudgetServer* server, const std::string& advertise,
                    std::function<void(const absl::Status&)> refused);
  // PutPolicy in cluster mode (ClusterRouter::PutPolicy).
  absl::StatusOr<v1::BudgetStatus> PutPolicy(absl::string_view tenant,
                                             const v1::BudgetPolicy& policy,
                                             const google::protobuf::FieldMask& mask) {
    return router_->PutPolicy(tenant, policy, mask);
  }
  // Every shard and its owner as this server sees them (ListShards).
  v1::ListShardsResponse ListShards() const;
  // Writes the owned shards' final state, all together, and hands them over (revokes the
  // lease), then stops; by `deadline` whatever etcd does (the etcd calls end by then: a shard
  // whose state is not written by then is taken over as after a crash). Idempotent.
  void Leave(absl::Time deadline = absl::InfiniteFuture());

  // Observes etcd call durations in seconds (for the metrics); set before Join.
  void set_latency_observer(std::function<void(double)> f) {
    router_->set_latency_observer(std::move(f));
  }

 private:
  ClusterMode(ClusterFlags flags, std::unique_ptr<etcd::EtcdClient> etcd, cluster::ShardMap map,
              std::function<void(absl::string_view)> log);
  // One attempt at joining (see Join).
  absl::Status TryJoin(BudgetCore* core, BudgetServer* server, const std::string& advertise);
  // Join's background loop.
  void JoinUntilDone(std::stop_token stop, BudgetCore* core, BudgetServer* server,
                     const std::string& advertise,
                     const std::function<void(const absl::Status&)>& refused);

  const ClusterFlags flags_;
  const std::function<void(absl::string_view)> log_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  const cluster::ShardMap map_;
  std::unique_ptr<ClusterRouter> router_;
  std::unique_ptr<cluster::OwnershipManager> ownership_;  // set by the joining thread
  std::atomic<cluster::OwnershipManager*> joined_{nullptr};  // ownership_ once joined
  std::jthread health_;
  std::jthread joiner_;  // stopped (and joined) first
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_CLUSTER_MODE_H_
