// The authoritative budgets of a server: one token bucket per tenant, the per-instance
// accounting that makes Sync idempotent, and proportional sharing among active instances.
// No gRPC here: the service layer (service.h) translates RPCs into these calls.
//
// The core's parts, one job each: tenant_state.h (a bucket and its active set),
// instance_state.h (an instance's ledger and the tombstones), sync_validation.h (checks of a
// request), grant_math.h (grant sizing, safe share, the ledger: pure functions),
// replay_cache.h (the response kept for a retry, the stable fingerprint),
// cumulative_counters.h (the counters, defined once), state_io.cc (ExportState and Restore);
// budget_core.cc orchestrates Sync and holds the admin operations.
//
//   auto core = BudgetCore::Create({.policy = config, .clock = &clock});
//   absl::StatusOr<v1::SyncResponse> response = (*core)->Sync(request);
//
// The service calls the form that fills a response it owns (on the RPC's arena), which is the
// hot path of the server: no copy of the response is made, and a steady instance allocates
// nothing in the core.
#ifndef RETRYBUDGET_SERVER_BUDGET_CORE_H_
#define RETRYBUDGET_SERVER_BUDGET_CORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "google/protobuf/field_mask.pb.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/budget.pb.h"
#include "retrybudget/v1/state.pb.h"
#include "server/budget_totals.h"
#include "server/durable_store.h"
#include "server/instance_state.h"
#include "server/keyed_set.h"
#include "server/policy.h"
#include "server/tenant_router.h"

namespace retrybudget {

struct CoreOptions {
  // Default policy, explicit tenants, strict mode. Must be valid (see ParsePolicyConfig).
  v1::PolicyConfig policy;
  // Most tenants with a budget; auto-creating one more is refused with RESOURCE_EXHAUSTED.
  size_t max_tenants = 10'000;
  // Most instances tracked; past it the least recently seen are forgotten (they are taken as a
  // baseline when they come back: forgetting never credits anything). Also the most tombstones
  // of finished and evicted instances kept (DESIGN.md "Accounting").
  size_t max_instances = 100'000;
  // How long a tombstone is kept at least (unless more than max_instances are kept).
  absl::Duration tombstone_ttl = absl::Minutes(10);
  // Most tenant entries in one SyncRequest.
  size_t max_tenants_per_request = 256;
  // Largest `want` of one tenant entry; at most UINT32_MAX (a grant, never above the want, is
  // kept in 32 bits: GrantRecord), larger values are taken as UINT32_MAX.
  uint64_t max_want = 1'000'000;
  // Bounds of the next_sync_ms hint (the lease TTL's half bounds it too: at most 300 s).
  absl::Duration min_next_sync = absl::Milliseconds(10);
  absl::Duration max_next_sync = absl::Seconds(1);
  // Time source; Clock::Real() if null. Not owned.
  Clock* clock = nullptr;
  // Where grant reservations are made durable; null for a purely in-memory server. Not owned.
  // With a store, no token is granted beyond a limit the store has on disk, so a crash cannot
  // create tokens (DESIGN.md "Persistence").
  DurableStore* store = nullptr;
  // Cluster mode: which tenants this server may grant from, and where reservations are made
  // durable (in etcd) when `store` is null. Null for a single server. Not owned.
  TenantRouter* router = nullptr;
  // With a store: how long the request that creates a tenant waits for the tenant's first
  // reservation to reach the disk (with no lock held) before it is answered with what is durable.
  absl::Duration first_reservation_wait = absl::Seconds(1);
  // Cluster mode: a busy tenant's reservations in etcd are sized to about this long of its
  // grants. A new owner counts what its dead predecessor reserved and had not granted as spent,
  // so this is about what a failover costs the tenant (in grants), against one etcd write per
  // ~3/4 of this long per busy tenant (DESIGN.md "Many servers (etcd)").
  absl::Duration cluster_reserve_ahead = absl::Seconds(1);
  // Receives one line per significant event (a client reporting fallback spending), never one
  // per ordinary request. Called with no tenant lock held; must be thread-safe. Null: silent.
  std::function<void(absl::string_view)> log = nullptr;
};


// Checks that every path of `mask` names a BudgetPolicy field (INVALID_ARGUMENT naming
// `update_mask` and the first unknown path).
absl::Status ValidatePolicyMask(const google::protobuf::FieldMask& mask);
// `current` with the fields `mask` names taken from `update` (cleared where `update` leaves
// them unset). `mask` must be valid (ValidatePolicyMask).
v1::BudgetPolicy MergePolicy(const v1::BudgetPolicy& current, const v1::BudgetPolicy& update,
                             const google::protobuf::FieldMask& mask);
// ResolvePolicy of a policy MergePolicy made: INVALID_ARGUMENT saying the merge is invalid, and
// why, when it is.
absl::StatusOr<ResolvedPolicy> ResolveMergedPolicy(const v1::BudgetPolicy& merged);
// A resolved policy as the message a masked put merges into: the fields of its shape and its
// mode, except those equal to the value they would take from the others (initial_tokens =
// capacity, lease_ttl_ms's default), which stay unset and so follow a change of the others.
v1::BudgetPolicy PolicyBase(const ResolvedPolicy& policy);

// Thread-safe. Tenants are locked one at a time (never all behind one lock); requests of the same
// instance are serialised by that instance's lock.
class BudgetCore {
 public:
  // INVALID_ARGUMENT if the policy config is invalid.
  static absl::StatusOr<std::unique_ptr<BudgetCore>> Create(CoreOptions options);

  BudgetCore(const BudgetCore&) = delete;
  BudgetCore& operator=(const BudgetCore&) = delete;
  ~BudgetCore();

  // Applies one Sync (DESIGN.md "Accounting") from the caller `principal` (the credential's
  // identity; "" for every caller of a server without credentials). Whole-request errors
  // (INVALID_ARGUMENT naming the field and value; PERMISSION_DENIED for an instance id first
  // used by another principal) change no state. A tenant refused on its own (NOT_FOUND on a
  // strict server, RESOURCE_EXHAUSTED at the tenant limit) gets an error entry; the other
  // tenants are applied. A request repeating the last applied seq with identical content gets
  // the same response again; an older seq (also of an instance that finished or was evicted
  // lately) gets `stale = true` and changes nothing.
  absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request,
                                        absl::string_view principal = "");
  // The same, writing into `response`, which must be empty. On error `response` is left in an
  // unspecified state and must not be sent.
  absl::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response,
                    absl::string_view principal = "");

  // NOT_FOUND if the tenant has no budget.
  absl::StatusOr<v1::BudgetStatus> GetBudget(absl::string_view tenant);
  absl::StatusOr<v1::ListBudgetsResponse> ListBudgets(const v1::ListBudgetsRequest& request);
  // Creates the budget or changes its policy, keeping the level (capped at the new capacity).
  // A budget created here (with a store or a router) has its first block reserved at once.
  // A non-empty `mask` changes only the fields it names (PutPolicyRequest.update_mask): they
  // are merged into the tenant's current policy under the tenant's lock, so a concurrent put is
  // never half overwritten. INVALID_ARGUMENT (nothing changed) for an unknown path or an
  // invalid merged policy.
  absl::StatusOr<v1::BudgetStatus> PutPolicy(
      absl::string_view tenant, const v1::BudgetPolicy& policy,
      const google::protobuf::FieldMask& mask = google::protobuf::FieldMask());
  // NOT_FOUND if the tenant has no budget. Cluster mode: also deletes its state and its admin
  // policy in etcd (TenantRouter::DeleteDurably); UNAVAILABLE, with the budget gone from this
  // server, when etcd refused or failed (a next owner may bring it back).
  absl::Status DeleteBudget(absl::string_view tenant);
  // PutPolicy without the owner check (cluster mode: a policy from etcd, on the owner).
  absl::StatusOr<v1::BudgetStatus> ApplyAdminPolicy(absl::string_view tenant,
                                                    const ResolvedPolicy& policy);
  // The policy `tenant` has from the policy file: its listed policy, else the default policy
  // (as written there, not resolved). Cluster mode merges a masked put into it when etcd holds
  // no admin policy for the tenant.
  v1::BudgetPolicy ConfiguredPolicy(absl::string_view tenant);

  // Replaces the default policy, strict flag and explicit tenants (a policy reload). Existing
  // buckets keep their level; a tenant no longer listed falls back to the default policy.
  // INVALID_ARGUMENT (and nothing changes) if `config` is invalid.
  absl::Status ReplacePolicy(const v1::PolicyConfig& config);

  // Every budget's status, in name order (for metrics and snapshots).
  std::vector<v1::BudgetStatus> Snapshot();

  // The whole state, for a snapshot. `clean` (a shutdown: no Sync may run after it) gives
  // back every unused reservation, so the snapshot is exact.
  v1::ServerState ExportState(bool clean);

  // Loads what a data directory held; call before serving. A clean snapshot restores exact
  // levels and instances. Otherwise (a crash) every reserved token is taken as granted and
  // instances are forgotten (they come back as a baseline). Levels refill for the downtime.
  absl::Status Restore(const RecoveredState& recovered);

  // Counts of store errors (reservations that could not be made durable; grants were cut).
  uint64_t store_errors() const { return store_errors_.load(std::memory_order_relaxed); }

  // Cluster mode (cluster_state_io.cc). The state of every tenant `pick` selects by name, as a
  // snapshot records it (levels brought up to now).
  std::vector<v1::TenantState> ExportTenants(const std::function<bool(absl::string_view)>& pick);
  // Takes over tenants another server owned: each replaces any budget of its name here. Every
  // reserved token (grant_limit) counts as granted; the level refills from `now` on (the time
  // since the state was written earns nothing). Instances are all unknown: baselines.
  void AdoptTenants(const std::vector<v1::TenantState>& states, absl::Time now);
  // Forgets every budget `pick` selects (a shard lost): no grant is made from them afterwards.
  void DropTenants(const std::function<bool(absl::string_view)>& pick);

  size_t tenant_count();
  size_t instance_count();
  size_t tombstone_count();

 private:
  using Tenant = core_internal::Tenant;
  using Instance = core_internal::Instance;

  explicit BudgetCore(CoreOptions options);

  // Finds the budget, creating it with the default policy unless strict or full. Sets *error.
  RefPtr<Tenant> FindOrCreateTenant(absl::string_view name, v1::TenantError* error);
  // The part of FindOrCreateTenant under the locks; sets *created when it made the budget.
  RefPtr<Tenant> CreateTenant(absl::string_view name, v1::TenantError* error,
                                       bool* created);
  RefPtr<Tenant> FindTenant(absl::string_view name);
  // The instance `id` for a request with `seq` from `principal`, created if unknown. Null with
  // OK status: the id has a tombstone with a seq >= `seq` (the request is stale). Null with
  // PERMISSION_DENIED: the id (or its tombstone) belongs to another principal.
  absl::Status FindOrCreateInstance(absl::string_view id, uint64_t seq, uint64_t principal,
                                    RefPtr<Instance>* instance, bool* created);
  // Removes `id` from the map if it still holds `instance` (never another object that holds
  // the id by now), leaving a tombstone at `last_seq` when that is non-zero.
  void ForgetInstance(absl::string_view id, const Instance* instance, uint64_t last_seq);
  void EvictInstancesIfFull() ABSL_EXCLUSIVE_LOCKS_REQUIRED(instances_mu_);
  // Sync once `instance` is found and locked. `created`: this request created it.
  absl::Status SyncLocked(const v1::SyncRequest& request, uint64_t principal, absl::Time now,
                          Instance& instance, bool created, v1::SyncResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(instance.mu);
  // Applies entry `index` of `request` to its budget and grants, writing the outcome to `out`.
  // `existing`: the instance's record of the entry's tenant (instance.tenants.Find), or null.
  // True when it added a record (and maybe erased it again): records found before may have
  // moved.
  // Times in the Sync's path are Unix nanoseconds, converted from the clock's absl::Time once
  // per Sync (absl's conversion is a library call, and it ran ~6 times per entry).
  // `previous_seen_ns`: when the instance's previous request arrived (a windowed policy credits
  // tokens back only from an instance seen within its ttl).
  bool ApplyEntry(const v1::SyncRequest& request, int index, int64_t now_ns,
                  int64_t previous_seen_ns, Instance& instance,
                  core_internal::InstanceTenant* existing, GrantRecord& out,
                  std::vector<std::string>* fallback_reports)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(instance.mu);
  // The budget of `sent`: the one its record (`rec`, null if none) names unless deleted since,
  // else found or created by name (then held in `*found`). Null, with `out`'s error set, when
  // refused.
  Tenant* BudgetOf(const core_internal::InstanceTenant* rec, const v1::TenantSync& sent,
                   RefPtr<Tenant>* found, GrantRecord& out);
  // Deposits what a known record's report credits and adds it to the totals.
  void Credit(Tenant& tenant, const ReportEffect& effect, int64_t now_ns,
              absl::string_view tenant_name, absl::string_view instance_id,
              std::vector<std::string>* fallback_reports) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tenant.mu);
  // Sizes and takes the grant of an entry (none when `entry` is null: a final request), and
  // fills the rest of `out`.
  void Grant(Tenant& tenant, core_internal::ActiveEntry* entry, LedgerEntry& ledger, uint64_t want,
             uint64_t held, uint64_t spent_since, int64_t now_ns, GrantRecord& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tenant.mu);
  v1::BudgetStatus StatusOf(Tenant& tenant, absl::Time now);
  // The same with the tenant's lock held: the state an admin put just produced, not a later one.
  v1::BudgetStatus StatusOfLocked(Tenant& tenant, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tenant.mu);
  // The admin policy a put computes from the tenant's current one (`current()` gives it as a
  // message: PolicyBase, or the configured policy of a tenant with no budget yet), or fails
  // (nothing changes).
  using PolicyUpdate = absl::FunctionRef<absl::StatusOr<ResolvedPolicy>(
      absl::FunctionRef<v1::BudgetPolicy()> current)>;
  // Sets the tenant's admin policy to `update`'s (creating the budget if it has none): the
  // current policy is read and replaced under the tenant's lock (under tenants_mu_ when it is
  // created), so concurrent puts are serialised.
  absl::StatusOr<v1::BudgetStatus> UpdateAdminPolicy(absl::string_view tenant,
                                                     PolicyUpdate update);
  // ConfiguredPolicy with policy_mu_ held.
  v1::BudgetPolicy ConfiguredPolicyLocked(absl::string_view tenant)
      ABSL_SHARED_LOCKS_REQUIRED(policy_mu_);
  // Admin calls in cluster mode: OK on the tenant's owner; FAILED_PRECONDITION naming the
  // owner's address on another server; UNAVAILABLE while the shard has no owner that can serve.
  absl::Status CheckOwned(absl::string_view tenant);
  // Fills `out`'s error with the router's refusal of `tenant`.
  void Refuse(absl::string_view tenant, absl::Time now, GrantRecord& out);
  // Cuts `granted` to what the tenant's durable limit allows, and asks the store thread to
  // extend the limit when it is near. Never blocks on I/O. Returns the grant that may be taken.
  // `level`: what the tenant may grant now (Tenant::GrantableLevel).
  uint64_t ReserveDurably(Tenant& tenant, uint64_t granted, double level, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tenant.mu);
  // Asks the store thread to make `limit` durable for the tenant named `tenant`; when it is, the
  // limit of whichever tenant holds that name then is raised, and `done` (if any) runs.
  // `credited_total`: the tenant's, journaled with the reservation (cluster mode writes the
  // whole state instead).
  void ReserveAhead(const std::string& tenant, uint64_t limit, double credited_total = 0,
                    std::function<void()> done = {});
  // Reserves a first block for a tenant that has none (just created), so that its first grant
  // does not come back empty: waits for the store thread at most `first_reservation_wait`, with
  // no lock held. A slow disk delays only the request that creates the tenant.
  void PrimeReservation(const std::string& tenant, uint64_t limit);

  const CoreOptions options_;
  Clock* const clock_;

  Mutex policy_mu_;
  v1::PolicyConfig policy_ ABSL_GUARDED_BY(policy_mu_);
  ResolvedPolicy default_policy_ ABSL_GUARDED_BY(policy_mu_);

  // The policies budgets hold (a leaf lock: taken under any other, never the other way).
  Mutex policy_table_mu_;
  PolicyTable policy_table_ ABSL_GUARDED_BY(policy_table_mu_);
  PolicyRef Intern(const ResolvedPolicy& policy) {
    MutexLock lock(&policy_table_mu_);
    return policy_table_.Intern(policy);
  }

  Mutex tenants_mu_ ABSL_ACQUIRED_AFTER(policy_mu_);
  using TenantTable = SharedByName<Tenant, &Tenant::name>;
  using InstanceTable = SharedByName<Instance, &Instance::id>;
  TenantTable tenants_ ABSL_GUARDED_BY(tenants_mu_);

  std::atomic<uint64_t> store_errors_{0};

  Mutex instances_mu_;
  InstanceTable instances_ ABSL_GUARDED_BY(instances_mu_);
  const std::unique_ptr<core_internal::Tombstones> tombstones_ ABSL_PT_GUARDED_BY(instances_mu_);
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_BUDGET_CORE_H_
