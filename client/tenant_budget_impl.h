// One tenant's budget inside a BudgetClient: the hot-path handle workers call, and the
// per-tenant half of the leasing protocol the refresher drives.
#ifndef RETRYBUDGET_CLIENT_TENANT_BUDGET_IMPL_H_
#define RETRYBUDGET_CLIENT_TENANT_BUDGET_IMPL_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "retrybudget/mutex.h"
#include "absl/time/time.h"
#include "client/demand_estimator.h"
#include "client/lease.h"
#include "client/refresh_policy.h"
#include "client/tenant_ledger.h"
#include "retrybudget/client.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget::client_internal {

// Something that syncs when asked: the refresher. Thread-safe.
class SyncWaker {
 public:
  virtual ~SyncWaker() = default;
  // Asks for a sync as soon as the schedule allows. Cheap, never blocks for long, never fails.
  virtual void Wake() = 0;
};

// Where a tenant's tokens come from right now. Only kLeased lets TryAcquire() take tokens; the
// local fallback bucket of a later issue becomes one more mode, consulted on the slow path.
enum class LeaseMode {
  kAwaitingLease,  // no grant received yet: deny
  kLeased,         // a lease is in force until its expiry
  kExpired,        // the lease expired and no Sync renewed it: deny
  kRefused,        // the server refused the tenant (per-tenant error): deny
  kShutdown,       // the client shut down: deny for good
};

// Thread-safe. Worker-facing methods (TryAcquire, Refund, RecordSuccess) are lock-free and touch
// only atomics, each group on its own cache line. Refresher-facing methods take `mu_`; the
// refresher is their only caller, and Stats() may run concurrently with them.
class TenantBudgetImpl final : public TenantBudget {
 public:
  // `waker` (not owned) must outlive this object. `created` starts the demand estimate.
  TenantBudgetImpl(std::string tenant, SyncWaker* waker, absl::Time created);

  TenantBudgetImpl(const TenantBudgetImpl&) = delete;
  TenantBudgetImpl& operator=(const TenantBudgetImpl&) = delete;

  // ---- worker side (hot path) ----

  bool TryAcquire() override {
    switch (lease_.TryTake()) {
      case Lease::Take::kTaken:
        return true;
      case Lease::Take::kTakenLow:
        RequestSync();
        return true;
      case Lease::Take::kEmpty:
        break;
    }
    return AcquireSlow();
  }

  void Refund() override {
    lease_.Refund();
    slow_.refunds.fetch_add(1, std::memory_order_relaxed);
  }

  void RecordSuccess() override { successes_.value.fetch_add(1, std::memory_order_relaxed); }

  const std::string& tenant() const override { return tenant_; }

  TenantStats Stats() const override;

  // ---- refresher side ----

  // When this tenant wants the next Sync: its scheduled time, or sooner when a worker found the
  // lease low or empty (then at once, unless the server said the bucket was dry: then not before
  // the server's retry-after).
  absl::Time SyncDueAt() const;

  // Ends the lease if `now` reached its expiry, and withdraws tokens refunded into a closed
  // lease. Returns the expiry to watch next (InfiniteFuture when no lease is in force).
  absl::Time ExpireLeaseIfDue(absl::Time now);

  // Fills `out` for a NEW request built at `now`: cumulative counters and `want`.
  void FillSync(absl::Time now, const RefreshPolicy& policy, v1::TenantSync* out);

  // Applies the grant answering `sent_entry` of a request first sent at `sent` and answered at
  // `received`: deposits `granted`, renews the lease to `sent` + lease_ttl_ms, schedules the
  // next sync.
  void ApplyGrant(const v1::TenantGrant& grant, const v1::TenantSync& sent_entry, absl::Time sent,
                  absl::Time received, const RefreshPolicy& policy);

  // The server refused this tenant: withdraw the lease (deny from now on), keep the error for
  // Stats(), and ask again only after a refresh period.
  void ApplyRefusal(const v1::TenantError& error, absl::Time received,
                    const RefreshPolicy& policy);

  // Shuts the tenant down for good: withdraws every token and fills `out` with the final
  // counters (want 0).
  void FillFinal(v1::TenantSync* out);

  LeaseMode mode() const;

 private:
  // Lease empty or closed: count the denial and wake the refresher. (A fallback mode would
  // consult its local bucket here.)
  bool AcquireSlow();

  // The first worker to find the lease low or empty since the last applied response wakes the
  // refresher; later ones only see the flag already set.
  void RequestSync() {
    if (!sync_wanted_.value.exchange(true, std::memory_order_acq_rel)) waker_->Wake();
  }

  void FillCounters(uint64_t held, v1::TenantSync* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  template <typename T>
  struct alignas(64) Padded {
    std::atomic<T> value{};
  };
  struct alignas(64) SlowCounters {
    std::atomic<uint64_t> denied{0};
    std::atomic<uint64_t> refunds{0};
  };

  const std::string tenant_;
  SyncWaker* const waker_;

  // Hot-path atomics, one cache line each.
  Lease lease_;
  Padded<uint64_t> successes_;
  Padded<bool> sync_wanted_;
  SlowCounters slow_;

  mutable Mutex mu_;
  LeaseMode mode_ ABSL_GUARDED_BY(mu_) = LeaseMode::kAwaitingLease;
  TenantLedger ledger_ ABSL_GUARDED_BY(mu_);
  DemandEstimator demand_ ABSL_GUARDED_BY(mu_);
  absl::Time expiry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Next scheduled sync; InfinitePast: at once (a new tenant wants its first lease).
  absl::Time next_due_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The server granted less than wanted: a low/empty lease does not sync before this.
  absl::Time dry_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_TENANT_BUDGET_IMPL_H_
