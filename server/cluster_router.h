// The TenantRouter of cluster mode: the tenants of the shards this server owns (OwnershipManager),
// their state kept in etcd under P/shards/<NNNN>/t/<tenant> (one v1.TenantState per tenant), and
// every etcd write of it fenced by the shard's token (DESIGN.md "Many servers (etcd)").
//
//   ClusterRouter router(etcd.get(), map, {.prefix = "/retry-budget"});
//   core options: .router = &router
//   ownership options: .before_release = router.BeforeReleaseCallback(),
//                      .on_change = router.OnChangeCallback()
//   router.Start(core.get(), ownership.get());
//   ...
//   ownership->Shutdown();  // before_release writes each shard's final state
//   router.Stop();
//
// - A shard is granted from only once its tenants are loaded (acquired -> the writer thread reads
//   P/shards/<NNNN>/ and BudgetCore::AdoptTenants them: every reserved token counts as granted,
//   refill from the load on) and while the server is SurelyAlive.
// - Reservations (ReserveAhead from the core, in blocks ahead of need) are written by one
//   writer thread: the tenant's whole state with its new grant_limit, one fenced Txn per shard
//   per batch. A refused fence (another owner) drops the shard's tenants at once.
// - A reservation write carries the tenant's whole state; besides, the writer writes (checking
//   every second) the state of every tenant that changed and was not written for
//   `state_interval`. The state write keeps levels and totals fresh for a next owner; the bound
//   does not rest on it (a next owner counts every reserved token as granted).
// - Losing a shard (not owned any more: on_change, synchronously) stops MayServe at once; the
//   writer thread then drops its tenants from the core.
// Thread-safe. Owns the writer thread.
#ifndef RETRYBUDGET_SERVER_CLUSTER_ROUTER_H_
#define RETRYBUDGET_SERVER_CLUSTER_ROUTER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "cluster/ownership_manager.h"
#include "cluster/shard_map.h"
#include "etcd/etcd_client.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"
#include "server/budget_core.h"
#include "server/tenant_router.h"

namespace retrybudget {

struct ClusterRouterOptions {
  std::string prefix;  // as OwnershipOptions::prefix
  Clock* clock = Clock::Real();
  // Most time between two writes of a changed tenant's state (levels, policies, totals) when no
  // reservation carries it. Longer than a busy tenant's time between reservations (about 1.75 s,
  // BudgetCore::ReserveDurably), so that a busy tenant costs only its reservation writes.
  absl::Duration state_interval = absl::Seconds(3);
  // One line per significant event (a shard loaded, lost, a refused write). Null: silent.
  std::function<void(absl::string_view)> log = nullptr;
};

// Counters for the metrics endpoint.
struct ClusterRouterStats {
  int64_t shards_ready = 0;     // owned and loaded
  int64_t etcd_writes = 0;      // fenced transactions sent
  int64_t etcd_errors = 0;      // etcd calls that failed (refused fences included)
  int64_t reservation_writes = 0;
};

class ClusterRouter : public TenantRouter {
 public:
  ClusterRouter(etcd::EtcdClient* etcd, cluster::ShardMap map, ClusterRouterOptions options);
  ~ClusterRouter() override;

  // The callbacks to give OwnershipOptions (they work before Start: they find nothing to do).
  std::function<void()> OnChangeCallback();
  std::function<void(int, int64_t)> BeforeReleaseCallback();
  std::function<void(const std::map<int, int64_t>&)> BeforeReleaseAllCallback();

  // Starts the writer thread. `core` and `ownership` must outlive Stop().
  void Start(BudgetCore* core, cluster::OwnershipManager* ownership);
  // Stops the writer thread (before or after OwnershipManager::Shutdown, which writes the final
  // states through the callbacks). Idempotent.
  void Stop();

  bool MayServe(absl::string_view tenant, absl::Time now) const override;
  TenantRefusal Refusal(absl::string_view tenant, absl::Time now) const override;
  void ReserveAhead(absl::string_view tenant, uint64_t grant_limit,
                    DurableStore::ReservedCallback done) override;
  void WaitIdle() override;
  // Fenced by the shard's token: deletes P/shards/<NNNN>/t/<tenant> and the tenant's admin policy
  // (P/policies/<tenant>) in one transaction, under the lock that orders the state writes.
  absl::Status DeleteDurably(absl::string_view tenant,
                             const std::function<absl::Status()>& forget) override;
  std::optional<v1::BudgetPolicy> AdminPolicy(absl::string_view tenant) const override;

  // Stores `policy` as `tenant`'s admin policy in etcd (P/policies/<tenant>), where every server
  // sees it; applies it at once when this server owns the tenant. INVALID_ARGUMENT for a bad
  // policy, etcd's error when it cannot be stored.
  // A non-empty `mask` (PutPolicyRequest.update_mask) changes only the fields it names: the key
  // is read, merged into (absent: the policy file's policy for the tenant) and written back in
  // a transaction that holds only if the key did not change since the read; ABORTED naming the
  // tenant when it changed under every one of a few attempts. INVALID_ARGUMENT for an unknown
  // path or an invalid merged policy. Nothing changes on an error.
  absl::StatusOr<v1::BudgetStatus> PutPolicy(
      absl::string_view tenant, const v1::BudgetPolicy& policy,
      const google::protobuf::FieldMask& mask = google::protobuf::FieldMask());

  ClusterRouterStats stats() const;
  // Observes one etcd call's duration (seconds), for the latency histogram; may be null.
  void set_latency_observer(std::function<void(double)> observer) {
    latency_observer_ = std::move(observer);
  }

 private:
  struct Pending {
    uint64_t grant_limit = 0;
    std::vector<DurableStore::ReservedCallback> done;
  };

  // A tenant's admin policy as etcd holds it, and the compare that holds while it is unchanged.
  struct CurrentPolicy {
    v1::BudgetPolicy policy;
    etcd::Compare unchanged;
  };

  // PutPolicy with a non-empty mask.
  absl::StatusOr<v1::BudgetStatus> PutMaskedPolicy(absl::string_view tenant,
                                                   const v1::BudgetPolicy& policy,
                                                   const google::protobuf::FieldMask& mask);
  // The current policy from `read` (a Get of the tenant's policy key); DATA_LOSS if unparsable.
  absl::StatusOr<CurrentPolicy> CurrentPolicyOf(absl::string_view tenant,
                                                const etcd::RangeResult& read) const;
  // After `policy` was written to etcd: records it, applies it here when this server owns the
  // tenant, and returns the tenant's status (its policy only, on another server).
  // `revision`: etcd's revision of the write. A policy older than the one known here (a watch
  // event or another put overtook this one) is not applied.
  absl::StatusOr<v1::BudgetStatus> PolicyStored(absl::string_view tenant,
                                                const v1::BudgetPolicy& policy,
                                                const ResolvedPolicy& resolved, int64_t revision);
  // Records `tenant`'s admin policy as of etcd `revision` (nullopt: deleted) unless a newer one
  // is known. True when recorded.
  bool Record(absl::string_view tenant, std::optional<v1::BudgetPolicy> policy, int64_t revision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  void OnChange();
  void BeforeRelease(int shard, int64_t token);
  void Run(std::stop_token stop);
  // Loads acquired shards, drops lost ones.
  void Reconcile();
  void Load(int shard, int64_t token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  void Lose(int shard, absl::string_view why);
  // The last state of a shard that stopped being served here (under `token`): exported once no
  // grant can be made from it, so with the exact granted totals and no reservation left ahead,
  // written fenced by `token` (refused, harmlessly, when the shard is not ours in etcd any more),
  // then its budgets dropped. Whatever comes first, the release's own call or the writer's next
  // pass, writes it; the other finds nothing left.
  void WriteFinalStateAndDrop(int shard, int64_t token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Shutdown's release: the final states of every shard in `shards` (shard -> token), exported
  // as WriteFinalStateAndDrop does, written concurrently (each shard's transactions in order),
  // then their budgets dropped.
  void ReleaseTogether(const std::map<int, int64_t>& shards);
  // Writes `states` of `shard` under `token` (chunks of at most kMaxOps). False when a fence was
  // refused (the shard is lost) or etcd failed.
  absl::Status WriteStates(int shard, int64_t token, const std::vector<v1::TenantState>& states)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  void FlushReservations();
  void WriteChangedStates();
  std::string TenantKey(int shard, absl::string_view tenant) const;
  std::string PolicyKey(absl::string_view tenant) const;
  void Log(absl::string_view line) const {
    if (options_.log) options_.log(line);
  }

  etcd::EtcdClient* const etcd_;
  const cluster::ShardMap map_;
  const ClusterRouterOptions options_;
  std::function<void(double)> latency_observer_;

  std::atomic<BudgetCore*> core_{nullptr};
  std::atomic<cluster::OwnershipManager*> ownership_{nullptr};
  // Per shard: the fencing token its tenants were loaded under; 0 when not served here.
  std::unique_ptr<std::atomic<int64_t>[]> ready_;
  // Per shard: the token it was served under until OnChange saw it go, until its final state is
  // written (WriteFinalStateAndDrop); 0 otherwise.
  std::unique_ptr<std::atomic<int64_t>[]> unserved_;

  std::atomic<int64_t> etcd_writes_{0};
  std::atomic<int64_t> etcd_errors_{0};
  std::atomic<int64_t> reservation_writes_{0};

  Mutex queue_mu_;  // a leaf: taken under the core's tenant locks
  std::condition_variable_any queue_cv_;
  absl::flat_hash_map<std::string, Pending> pending_ ABSL_GUARDED_BY(queue_mu_);
  bool wake_ ABSL_GUARDED_BY(queue_mu_) = false;
  int64_t flushes_started_ ABSL_GUARDED_BY(queue_mu_) = 0;
  int64_t flushes_done_ ABSL_GUARDED_BY(queue_mu_) = 0;

  // Serialises the writes of the tenants' state (a later export never lands before an earlier
  // one) and the loads and drops.
  Mutex write_mu_;
  // The last value written per key (its level time cleared), to skip unchanged tenants.
  struct Written {
    std::string value;
    absl::Time at;
  };
  absl::flat_hash_map<std::string, Written> written_ ABSL_GUARDED_BY(write_mu_);

  // Serialises recording an admin policy with applying it to the core, so that policies reach
  // the core in etcd's revision order (a put's own apply and the watch's race otherwise).
  Mutex apply_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  // The admin policies in etcd (P/policies/), kept by a watch and by this server's puts, each
  // with the etcd revision of its write; a deleted one stays as its revision (policy nullopt).
  struct KnownPolicy {
    std::optional<v1::BudgetPolicy> policy;
    int64_t revision = 0;
  };
  mutable Mutex policies_mu_;
  absl::flat_hash_map<std::string, KnownPolicy> policies_ ABSL_GUARDED_BY(policies_mu_);
  std::unique_ptr<etcd::Watch> policy_watch_;
  void OnPolicies(const etcd::WatchBatch& batch);

  std::jthread writer_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_CLUSTER_ROUTER_H_
