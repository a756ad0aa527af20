// One tenant's budget inside a BudgetClient: the hot-path handle workers call, and the
// per-tenant half of the leasing protocol the refresher drives.
#ifndef RETRYBUDGET_CLIENT_TENANT_BUDGET_IMPL_H_
#define RETRYBUDGET_CLIENT_TENANT_BUDGET_IMPL_H_

#include <atomic>
#include <cstdint>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "retrybudget/mutex.h"
#include "retrybudget/recent_extreme.h"
#include "absl/time/time.h"
#include <optional>

#include "client/cpp/demand_estimator.h"
#include "client/cpp/fallback_bucket.h"
#include "client/cpp/lease.h"
#include "client/cpp/refresh_policy.h"
#include "client/cpp/tenant_ledger.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget::client_internal {

// The longest lease a policy allows (budget.proto BudgetPolicy.lease_ttl_ms); a grant naming a
// longer one is read as this.
inline constexpr int64_t kMaxLeaseTtlMs = 600'000;

// Something that syncs when asked: the refresher. Thread-safe.
class SyncWaker {
 public:
  virtual ~SyncWaker() = default;
  // Asks for a sync as soon as the schedule allows. Cheap, never blocks for long, never fails.
  virtual void Wake() = 0;
};

// Where a tenant's tokens come from right now. kLeased and kFallback let TryAcquire() take
// tokens (both from the same lease word); every other mode keeps the word closed.
enum class LeaseMode {
  kAwaitingLease,  // no grant received yet and the server not known unreachable: deny
  kLeased,         // a lease is in force until its expiry
  kExpired,        // the lease expired and no Sync renewed it (server answering): deny
  kRefused,        // the server refused the tenant (per-tenant error): deny
  kFallback,       // server unreachable, no lease: tokens from the local fallback bucket
  kDenyFallback,   // server unreachable, no lease, fallback = deny: deny
  kShutdown,       // the client shut down: deny for good
};

// What the refresher knows of the server from its last Sync attempt.
enum class ServerState {
  kAnswering,    // no attempt yet, or the last one got a response
  kUnreachable,  // the last attempt failed (unavailable, deadline, ...): fall back once the
                 // lease has expired
  kDown,         // unreachable for at least a refresh period (or, in a cluster, the tenant's
                 // shard has no owner that can grant): an empty lease falls back at once
  kRefusing,     // the last attempt was refused (UNAUTHENTICATED, PERMISSION_DENIED): deny
};

// How a tenant falls back (from ClientOptions).
struct FallbackConfig {
  FallbackMode mode = FallbackMode::kLocalBucket;
  // The bucket of a tenant the server never sent a SafeShare for.
  BucketShape never_reached{.capacity = 1, .refill_per_second = 0.1};
};

// Thread-safe. Worker-facing methods (TryAcquire, Refund, RecordRequest, RecordSuccess) are
// lock-free and touch only atomics, each group on its own cache line: a TryAcquire of cost 1 that
// finds its tokens is one CAS on the lease word; a cost above 1 adds one atomic (the `extra`
// count, see TenantLedger); a denial, and a shadow-mode would-be denial, a few more.
// Refresher-facing methods take `mu_`; the refresher is their only caller, and Stats() may run
// concurrently with them.
class TenantBudgetImpl final : public TenantBudget {
 public:
  // `waker` and `clock` (not owned) must outlive this object. `created` starts the demand
  // estimate. WaitReady() waits through `clock`.
  TenantBudgetImpl(std::string tenant, SyncWaker* waker, Clock* clock, absl::Time created,
                   FallbackConfig fallback = {});

  TenantBudgetImpl(const TenantBudgetImpl&) = delete;
  TenantBudgetImpl& operator=(const TenantBudgetImpl&) = delete;

  // ---- worker side (hot path) ----

  using TenantBudget::Refund;
  using TenantBudget::TryAcquire;

  bool TryAcquire(uint32_t cost) override {
    if (cost != 1) [[unlikely]] return TryAcquireCost(cost);
    return Took(lease_.TryTake()) || AcquireSlow(1);
  }

  // Whether a take from the lease succeeded; one that left the lease low wakes the refresher.
  bool Took(Lease::Take take) {
    switch (take) {
      case Lease::Take::kTaken:
        return true;
      case Lease::Take::kTakenLow:
        RequestSync();
        return true;
      case Lease::Take::kEmpty:
        break;
    }
    return false;
  }

  void Refund(uint32_t cost) override;

  void RecordRequest() override { requests_.value.fetch_add(1, std::memory_order_relaxed); }

  void RecordSuccess() override { successes_.value.fetch_add(1, std::memory_order_relaxed); }

  const std::string& tenant() const override { return tenant_; }

  TenantStats Stats() const override;

  // See TenantBudget. Ready once mode() has left kAwaitingLease.
  absl::Status WaitReady(absl::Time deadline, std::stop_token stop) override;

  // ---- refresher side ----

  // When this tenant wants the next Sync: its scheduled time, or sooner when a worker found the
  // lease low or empty (then at once, unless the server said the bucket was dry: then not before
  // the server's retry-after). `*first` (when not null) is set to whether no request has
  // carried this tenant yet: its first Sync, which goes out at once.
  absl::Time SyncDueAt(bool* first = nullptr) const;

  // One refresher step for this tenant at `now`, given what the last Sync attempt said of the
  // server: ends the lease if `now` reached its expiry; with no lease in force and the server
  // unreachable, or with the lease spent (no token held) and the server down, enters fallback
  // (the local bucket, or deny); in fallback, refills the word from
  // the local bucket; with the server refusing the client, leaves fallback (deny); withdraws
  // tokens refunded into a closed word. Returns when this tenant next needs a step (lease
  // expiry, next fallback token; InfiniteFuture when nothing is due).
  absl::Time Step(absl::Time now, ServerState server);

  // When the lease in force ends (send time + TTL); InfiniteFuture when none is in force. The
  // refresher cuts a Sync short at this time so that Step() ends the lease on time.
  absl::Time LeaseEndsAt() const;

  // Fills `out` for a NEW request built at `now`: cumulative counters and `want`.
  void FillSync(absl::Time now, const RefreshPolicy& policy, v1::TenantSync* out);

  // Applies the grant answering `sent_entry` of a request first sent at `sent` and answered at
  // `received`: leaves fallback (its tokens are withdrawn, never returned to the server),
  // deposits `granted`, renews the lease to `sent` + lease_ttl_ms, keeps the SafeShare for a
  // later fallback, takes the tenant's mode (shadow or enforce), schedules the next sync.
  void ApplyGrant(const v1::TenantGrant& grant, const v1::TenantSync& sent_entry, absl::Time sent,
                  absl::Time received, const RefreshPolicy& policy);

  // The server refused this tenant: withdraw the lease (deny from now on), keep the error for
  // Stats(), and ask again only after a refresh period.
  void ApplyRefusal(const v1::TenantError& error, absl::Time received,
                    const RefreshPolicy& policy);

  // The server did not apply this tenant's entry (it named another owner, or none can grant
  // now): the lease stays as it is; the next sync is due at `due` (InfinitePast: at once), and
  // a worker finding the lease low does not bring it forward.
  void SyncAgainAt(absl::Time due);
  // Shuts the tenant down for good: withdraws every token and fills `out` with the final
  // counters (want 0).
  void FillFinal(v1::TenantSync* out);

  LeaseMode mode() const;

  // True while the tenant is in shadow mode (the last applied grant said MODE_SHADOW).
  bool shadow() const { return shadow_.load(std::memory_order_relaxed); }

 private:
  // TryAcquire() of a cost other than 1: the range check, then the same take with the `extra`
  // tokens counted (see TenantLedger).
  bool TryAcquireCost(uint32_t cost);
  // Fewer than `cost` tokens in the word, or the word closed: count the denial (in shadow mode
  // the would-be denial, and allow) and wake the refresher. (In fallback the refresher refills
  // the word itself; the hot path never reads a clock.)
  bool AcquireSlow(uint32_t cost);
  // Shadow mode's permits given without a token: takes `cost` of them if that many are out.
  bool TakeUnbacked(uint32_t cost);
  // The lease word and the workers' counts of it, read in the order TenantLedger needs.
  WordSnapshot Snapshot() const;

  // Empties the word (attributing its tokens to the current source) and closes it.
  void WithdrawAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once mode_ has left kAwaitingLease: marks the tenant answered and wakes every WaitReady().
  void NoteAnsweredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enters fallback at `now` (kFallback or kDenyFallback as configured). In one exchange, takes
  // out whatever the word holds (leased tokens: returned) and puts the local bucket's first
  // tokens in, so workers never see a closed word in between.
  // `start_full`: the bucket starts at its capacity (a lease that expired), or empty (a spent
  // lease falling back early, FallbackBucket). Returns the tenant's next step (the bucket's
  // next token; InfiniteFuture in deny mode).
  absl::Time EnterFallbackLocked(absl::Time now, bool start_full = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The low-water mark for the fallback tokens in the word (see the .cc).
  uint64_t FallbackMarkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the tokens the fallback bucket owes into the word, with the credit of the successes
  // and requests that may be credited locally (RefillLocked); returns the next token's time.
  absl::Time RefillFallbackLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // fallback_->Refill() at `now` with the word holding `held`, offering the successes and
  // requests recorded since the last fallback step that no request built so far carries (the
  // server may have applied any request built, so only later ones may be credited by the
  // fallback bucket), and counting those it credited. Returns the tokens to put in the word.
  uint64_t RefillLocked(absl::Time now, uint64_t held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool InFallback(LeaseMode mode) {
    return mode == LeaseMode::kFallback || mode == LeaseMode::kDenyFallback;
  }

  // The first worker to find the lease low or empty since the last applied response wakes the
  // refresher; later ones only see the flag already set.
  void RequestSync() {
    if (!sync_wanted_.value.exchange(true, std::memory_order_acq_rel)) waker_->Wake();
  }

  void FillCounters(const WordSnapshot& word, v1::TenantSync* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  template <typename T>
  struct alignas(64) Padded {
    std::atomic<T> value{};
  };
  struct alignas(64) SlowCounters {
    std::atomic<uint64_t> denied{0};          // retries denied (enforce mode)
    std::atomic<uint64_t> shadow_denied{0};   // would-be denials (shadow mode)
    std::atomic<uint64_t> denied_tokens{0};   // the cost of both: demand the word could not meet
    std::atomic<uint64_t> unbacked{0};        // shadow permits' tokens out (Refund cancels them)
    std::atomic<uint64_t> refunds{0};         // Refund() calls that put tokens back
    std::atomic<uint64_t> refunded_tokens{0};  // the tokens they put back
    std::atomic<uint64_t> extra{0};           // sum of cost - 1 over takes of cost > 1
  };

  const std::string tenant_;
  SyncWaker* const waker_;
  Clock* const clock_;
  const FallbackConfig fallback_config_;

  // Hot-path atomics, one cache line each.
  Lease lease_;
  Padded<uint64_t> successes_;
  Padded<uint64_t> requests_;
  Padded<bool> sync_wanted_;
  SlowCounters slow_;
  // Set from every applied grant (TenantGrant.mode); read by the slow path only.
  std::atomic<bool> shadow_{false};

  mutable Mutex mu_;
  LeaseMode mode_ ABSL_GUARDED_BY(mu_) = LeaseMode::kAwaitingLease;
  // Set (under mu_, once, never cleared) when mode_ leaves kAwaitingLease; read without the
  // lock by WaitReady()'s fast path.
  std::atomic<bool> answered_{false};
  // The WaitReady() calls in progress: each sleeps on its own stop source, stopped on answer.
  std::vector<std::stop_source*> ready_waiters_ ABSL_GUARDED_BY(mu_);
  // A request has carried this tenant (FillSync ran).
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  TenantLedger ledger_ ABSL_GUARDED_BY(mu_);
  DemandEstimator demand_ ABSL_GUARDED_BY(mu_);
  absl::Time expiry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Next scheduled sync; InfinitePast: at once (a new tenant wants its first lease).
  absl::Time next_due_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The server granted less than wanted: a low/empty lease does not sync before this.
  absl::Time dry_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // The SafeShares the server sent for this tenant, and when the last one came (InfinitePast:
  // never answered for it). Fallback uses the smallest of the minute before that answer.
  RecentExtreme<BucketShape, SmallerShape, kSafeShareMemoryMillis> safe_shares_
      ABSL_GUARDED_BY(mu_);
  absl::Time last_safe_share_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The local bucket while mode_ == kFallback.
  std::optional<FallbackBucket> fallback_ ABSL_GUARDED_BY(mu_);
  // Success- and request-funded fallback (TenantSync.successes_credited_locally,
  // requests_credited_locally).
  LocalCredit successes_credit_ ABSL_GUARDED_BY(mu_);
  LocalCredit requests_credit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_TENANT_BUDGET_IMPL_H_
