// The server's cluster mode (--etcd_endpoints): the etcd client, the shard map, the ownership of
// shards and the ClusterRouter the core asks, wired together, and the health status that follows
// whether the server can be sure of its lease. main.cc's only piece of cluster code.
//
//   absl::StatusOr<std::unique_ptr<ClusterMode>> cluster = ClusterMode::Connect(flags, log);
//   core options: .router = (*cluster)->router()
//   ... start the gRPC server ...
//   (*cluster)->Join(core, server, advertise);   // NOT_SERVING until joined
//   ... SIGTERM ...
//   (*cluster)->Leave();  // writes every owned shard's state, hands the shards over
#ifndef RETRYBUDGET_SERVER_CLUSTER_MODE_H_
#define RETRYBUDGET_SERVER_CLUSTER_MODE_H_

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
  bool enabled() const { return !etcd_endpoints.empty(); }
};

// INVALID_ARGUMENT naming the flag for a bad combination (checked without etcd).
absl::Status ValidateClusterFlags(const ClusterFlags& flags);

class ClusterMode {
 public:
  // Connects to etcd and joins the shard map (the number of shards is checked against etcd's).
  // INVALID_ARGUMENT / FAILED_PRECONDITION for a bad configuration; etcd's error otherwise.
  static absl::StatusOr<std::unique_ptr<ClusterMode>> Connect(
      const ClusterFlags& flags, std::function<void(absl::string_view)> log);
  ~ClusterMode();

  TenantRouter* router() { return router_.get(); }
  const ClusterRouter& cluster_router() const { return *router_; }
  // Null before Join.
  const cluster::OwnershipManager* ownership() const { return ownership_.get(); }
  const cluster::ShardMap& map() const { return map_; }
  const ClusterFlags& flags() const { return flags_; }

  // Registers this server at `advertise` and starts owning its share of the shards; keeps
  // `server`'s health SERVING exactly while the server is surely alive. `core` and `server`
  // must outlive Leave().
  absl::Status Join(BudgetCore* core, BudgetServer* server, const std::string& advertise);
  // PutPolicy in cluster mode (ClusterRouter::PutPolicy).
  absl::StatusOr<v1::BudgetStatus> PutPolicy(absl::string_view tenant,
                                             const v1::BudgetPolicy& policy) {
    return router_->PutPolicy(tenant, policy);
  }
  // Every shard and its owner as this server sees them (ListShards).
  v1::ListShardsResponse ListShards() const;
  // Writes the owned shards' state and hands them over, then stops. Idempotent.
  void Leave();

  // Observes etcd call durations in seconds (for the metrics); set before Join.
  void set_latency_observer(std::function<void(double)> f) {
    router_->set_latency_observer(std::move(f));
  }

 private:
  ClusterMode(ClusterFlags flags, std::unique_ptr<etcd::EtcdClient> etcd, cluster::ShardMap map,
              std::function<void(absl::string_view)> log);

  const ClusterFlags flags_;
  const std::function<void(absl::string_view)> log_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  const cluster::ShardMap map_;
  std::unique_ptr<ClusterRouter> router_;
  std::unique_ptr<cluster::OwnershipManager> ownership_;
  std::jthread health_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_CLUSTER_MODE_H_
